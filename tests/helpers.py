"""Configs shared by the end-to-end tests: short runs on the embedded MNIST subset."""

from __future__ import annotations

import ml_collections

from fedpsa_jax import config as config_lib


def set_fields(c: ml_collections.ConfigDict, fields: dict[str, object]) -> ml_collections.ConfigDict:
  """Sets dotted fields (`'sim.virtual_days': 0.1`) on `c`."""
  for path, value in fields.items():
    node = c
    *parents, leaf = path.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


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
  c.output.progress = False
  return set_fields(c, {k.replace("__", "."): v for k, v in fields.items()})
