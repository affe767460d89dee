"""The recipes of docs/architecture.md, "Where to add", each tried once: a dataset, a model and an execution
backend registered here, outside the package, each run end to end through a short simulation by name alone; and
the README's "Add an algorithm" example, run as it is printed.

Each registration lives only as long as its test: the registries are private copies for the test's duration.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

import fedpsa_jax as fj
from fedpsa_jax import choices, models
from fedpsa_jax.data import sources
from fedpsa_jax.sim import executor, runner
from fedpsa_jax.strategies import base as strategies_base
from helpers import ROOT, small_config

TOY_CLASSES, TOY_SHAPE, TOY_PER_CLASS = 4, (6, 6, 1), 150


@pytest.fixture(autouse=True)
def private_registries(monkeypatch):
  """What a test registers disappears with it (as tests/test_api.py does for a strategy)."""
  monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
  monkeypatch.setattr(sources, "_SOURCES", dict(sources._SOURCES))
  monkeypatch.setattr(executor, "_BACKENDS", dict(executor._BACKENDS))
  monkeypatch.setattr(choices, "_REGISTERED", {field: list(names) for field, names in choices._REGISTERED.items()})
  monkeypatch.setattr(strategies_base, "_REGISTRY", dict(strategies_base._REGISTRY))


def _toy_blobs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
  """Four classes of 6x6 black-and-white images: each a fixed random pattern with a few pixels flipped."""
  patterns = rng.integers(0, 2, size=(TOY_CLASSES, *TOY_SHAPE))
  y = rng.permutation(np.repeat(np.arange(TOY_CLASSES), TOY_PER_CLASS)).astype(np.int32)
  flips = rng.random((len(y), *TOY_SHAPE)) < 0.1
  return (255 * (patterns[y] ^ flips)).astype(np.uint8), y, TOY_CLASSES


class ToyNet(nn.Module):
  """One hidden layer of 8: the recipe's model (a run builds it with `num_classes` and `param_init`)."""

  num_classes: int = 10
  param_init: str = "torch"

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = nn.relu(nn.Dense(8, name="hidden")(x.reshape((x.shape[0], -1))))
    return nn.Dense(self.num_classes, name="out")(x)


def test_a_registered_dataset_and_model_run_by_name():
  fj.register_dataset("toy_blobs", _toy_blobs, mean=(0.5,), std=(0.25,))
  fj.register_model("toy_net")(ToyNet)
  config = small_config("fedbuff", model="toy_net", days=0.02, data__name="toy_blobs", local__lr=0.2)
  sim = runner.Simulation(config, None)
  summary = sim.run()
  assert summary["status"] == "completed" and summary["client_updates"] > 20
  # The dataset: the loader's images, held out per class (10%) and normalised with the registered constants
  # (pixels 0 and 1 -> -2 and 2; the training split's own statistics would give other values).
  data = sim.parts.dataset
  assert data.name == "toy_blobs" and data.num_classes == TOY_CLASSES and data.input_shape == TOY_SHAPE
  assert len(data.y_test) == TOY_CLASSES * TOY_PER_CLASS // 10 and np.bincount(data.y_test).tolist() == [15] * 4
  assert set(np.unique(data.x_train).tolist()) == {-2.0, 2.0}
  # The model: the registered module, trained (chance is 0.25).
  assert isinstance(sim.parts.model, ToyNet) and sim.parts.model.num_classes == TOY_CLASSES
  assert set(sim.state.params["params"]) == {"hidden", "out"}
  assert summary["final_test_accuracy"] > 0.6


def test_a_registered_dataset_refuses_an_official_test_split_and_a_bad_name():
  fj.register_dataset("toy_blobs", _toy_blobs)
  with pytest.raises(ValueError, match="data.test_split must be 'holdout' for data.name='toy_blobs'"):
    sources.load_dataset("toy_blobs", test_split="official", rng=np.random.default_rng(0))
  with pytest.raises(ValueError, match="dataset name 'Toy' is invalid"):
    fj.register_dataset("Toy", _toy_blobs)


class OnDemand(executor.ClientExecutor):
  """The recipe's backend: trains a job only when its result is asked for, on the server's device, and waits."""

  execution = "on_demand"

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.waiting: dict[int, executor.Job] = {}

  def submit(self, job: executor.Job) -> None:
    self.waiting[job.dispatch.job_id] = job

  def result(self, job_id: int):
    job = self.waiting.pop(job_id)
    end = self.trainer.train_job(job.params_start, self.training_data[job.dispatch.client], lr=job.lr,
                                 clients_key=self.clients_key, job_id=job_id, aux=job.aux)
    self.finish([job], [end])
    self.stats.jobs += 1
    return self.results.pop(job_id)


def test_a_registered_backend_runs_by_name_with_the_results_of_loop():
  """A job's result depends only on its dispatch, so a backend that trains it elsewhere and at another time
  gives the loop backend's bits."""
  built = []

  @fj.register_backend("on_demand")
  def build(trainer, fed, strategy, clients_key, *, compiles, phase_timing, **_):
    built.append(OnDemand(trainer, fed, strategy, clients_key, compiles, phase_timing))
    return built[-1]

  histories = {}
  for execution in ("loop", "on_demand"):
    sim = runner.Simulation(small_config("fedpsa", days=0.01, runtime__execution=execution), None)
    summary = sim.run()
    assert summary["status"] == "completed" and summary["execution"] == execution
    histories[execution] = [(line["day"], line["test_accuracy"], line["test_loss"]) for line in sim.history]
  assert len(built) == 1 and built[0].stats.jobs > 10  # (its jobs trained: the run asked for their results)
  assert histories["on_demand"] == histories["loop"]
  with pytest.raises(ValueError, match="runtime.execution='nowhere' is invalid; allowed: loop, vmap, sharded, on_demand"):
    executor.make_executor("nowhere", None, None, None, None)


def test_the_readmes_algorithm_example_runs_as_printed():
  text = open(os.path.join(ROOT, "README.md")).read()
  code = text.split("## Add an algorithm", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
  assert "virtual_days=0.01" in code, "the README's example no longer runs 0.01 virtual days"
  namespace: dict = {}
  exec(compile(code.replace("virtual_days=0.01", "virtual_days=0.004"), "README.md", "exec"), namespace)
  result = namespace["result"]
  assert result.summary["status"] == "completed" and result.summary["method"] == "mybuff"
  assert result.summary["rounds"] >= 1  # (its receive flushed a buffer of 5 at least once)
