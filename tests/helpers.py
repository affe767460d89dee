"""Configs shared by the end-to-end tests: short runs on the embedded MNIST subset."""

from __future__ import annotations

import ml_collections

from fedpsa_jax import config as config_lib


set_fields = config_lib.set_fields  # dotted fields (`'sim.virtual_days': 0.1`) set on `c`


def small_config(method: str, model: str = "linear", days: float = 0.03, **fields) -> ml_collections.ConfigDict:
  """A run of a few seconds: 20 clients, mild heterogeneity, half of them in flight, one local epoch.
  Extra keyword fields use `__` for the dots (`sim__latency__high=100`)."""
  c = config_lib.base_config()
  c.method = method
  c.data.name = "mnist_5k"
  c.model.name = model
  c.partition.num_clients = 20
  c.partition.alpha = 1.0  # mild heterogeneity: these tests check the pipeline, not robustness
  c.sim.concurrency = 0.5
  c.local.epochs = 1
  c.local.lr = 0.05
  c.sim.virtual_days = days
  c.eval.every_days = 0.005
  c.runtime.progress = False
  return set_fields(c, {k.replace("__", "."): v for k, v in fields.items()})


def strategy_context(model, params, *, num_clients: int = 6, sizes=None, concurrency: int = 3, num_classes: int = 3,
                     seed: int = 0, train_batch=None, input_shape=None):
  """A `StrategyContext` for unit tests of a strategy without a run: `model` (a Flax module) and its
  `params`, client sizes 10, 20, ... by default, and as the 'train' split `train_batch` (x, y) — the batch
  `ctx.sample('train', ...)` returns whole (FedPSA's real calibration batch; set
  `fedpsa.calibration='real'` and `calibration_size=len(y)`)."""
  import jax
  import numpy as np

  from fedpsa_jax.strategies import StrategyContext

  sizes = np.arange(1, num_clients + 1) * 10 if sizes is None else np.asarray(sizes)

  def sample(split, size, purpose):
    del purpose
    if split != "train" or train_batch is None or size != len(train_batch[1]):
      raise ValueError(f"this test context holds only a 'train' batch of {0 if train_batch is None else len(train_batch[1])}")
    return train_batch

  return StrategyContext(apply_fn=model.apply, params_shape=jax.eval_shape(lambda: params), num_clients=num_clients,
                         client_sizes=sizes, concurrency=concurrency, num_classes=num_classes,
                         input_shape=input_shape or (), seed=seed, sample=sample,
                         split_sizes={"train": 0 if train_batch is None else len(train_batch[1])})
