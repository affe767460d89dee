"""What several test files share: the repository's root, the short run configs of the end-to-end tests (runs
of a few seconds on the embedded MNIST subset) and a tiny sweep of them, and the model, arrivals and configs of
the strategies' unit tests (tests/strategies/)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_jax.models import TinyMLP
from fedpsa_jax.strategies import Arrival
from fedpsa_lab import paper
from numerics import assert_close, f32_tolerance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


set_fields = config_lib.set_fields  # dotted fields (`'sim.virtual_days': 0.1`) set on `c`


def once_per_session(tmp_path_factory, name: str, produce: Callable[[], Any]) -> Any:
  """`produce()`, a JSON value, computed once in a test session however many xdist workers ask for it.

  A module-scoped fixture runs once in each worker that runs one of its tests; for a whole reference run that
  is the same run twice on a 2-core machine. The first worker to ask computes it under a lock in the folder
  its workers share (pytest's `pytest-N/`, pytest-xdist's recipe); the others wait and read it. Every worker
  gets the value as JSON gave it back, so all compare against the same thing."""
  if os.environ.get("PYTEST_XDIST_WORKER") is None:  # (one process: nothing to share)
    return json.loads(json.dumps(produce()))
  shared = tmp_path_factory.getbasetemp().parent
  path = shared / f"{name}.json"
  with open(shared / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes, also if produce() raises)
    if not path.exists():
      partial = shared / f"{name}.json.partial"
      partial.write_text(json.dumps(produce()))
      os.replace(partial, path)
    return json.loads(path.read_text())


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


def fake_members(config: ml_collections.ConfigDict, workdir: str) -> list[tuple[Any, str]]:
  """The members of sweep `config`, its sweep.json written into `workdir` and each member's run directory made
  (empty): [(member, its run directory)], for a report test to fill with made-up records (no training)."""
  members = sweep.expand(config)
  sweep.write_sweep_json(config, members, workdir)
  for m in members:
    os.makedirs(sweep.member_dir(workdir, m))
  return [(m, sweep.member_dir(workdir, m)) for m in members]


def process_of(run_dir: str) -> int | None:
  """The pid of the process that holds (or last held) a run directory (`io.RunDir.lock`): a sweep member's worker."""
  with contextlib.suppress(OSError, ValueError, IndexError):
    return int(open(os.path.join(run_dir, io.LOCK_FILE)).read().split()[1])
  return None


# A sweep of three short members (one per method) on the embedded MNIST subset.
def _tiny_sweep(methods=("fedbuff", "fedasync", "fedpsa")):
  base = paper.paper_base(smoke=True)
  base.model.name = "linear"
  base.partition.num_clients = 10
  base.sim.virtual_days = 0.005
  base.eval.every_days = 0.0025
  return paper.sweep_config("tiny", "tiny", base, [paper.method_axis(methods)], [0], {"rows": ["method"], "cols": []})


def strategy_context(model, params, *, num_clients: int = 6, sizes=None, concurrency: int = 3, num_classes: int = 3,
                     seed: int = 0, train_batch=None, input_shape=None, model_name: str = "tiny_mlp", runtime=None):
  """A `StrategyContext` for unit tests of a strategy without a run: `model` (a Flax module) and its
  `params`, client sizes 10, 20, ... by default, and as the 'train' split `train_batch` (x, y) — the batch
  `ctx.sample('train', ...)` returns whole (FedPSA's real calibration batch; set
  `fedpsa.calibration='real'` and `calibration_size=len(y)`). `model_name`: the model's config name (the
  tests' TinyMLP by default); `runtime`: a run config's `runtime` section (its defaults by default)."""
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
                         split_sizes={"train": 0 if train_batch is None else len(train_batch[1])},
                         model_name=model_name, runtime=config_lib.runtime_config() if runtime is None else runtime)


# --- the strategies' unit tests: a TinyMLP, its context and hand-made arrivals ------------------------------

NUM_CLASSES = 3
HIDDEN = 5


def _calibration():
  rng = np.random.default_rng(11)
  x = rng.normal(size=(8, 4)).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, size=8).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(y)


MODEL = TinyMLP(num_classes=NUM_CLASSES, hidden=HIDDEN)
PARAMS0 = MODEL.init(jax.random.key(3), jnp.zeros((1, 4), jnp.float32))


def _ctx(num_clients=6, sizes=None, concurrency=3, seed=0, runtime=None):
  return strategy_context(MODEL, PARAMS0, num_clients=num_clients, sizes=sizes, concurrency=concurrency,
                          num_classes=NUM_CLASSES, seed=seed, train_batch=_calibration(), runtime=runtime)


def _np_tree(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _flat(tree) -> np.ndarray:
  """Hand ravel of a TinyMLP-shaped (or any nested-dict) tree: keys sorted, each leaf row-major."""
  if isinstance(tree, dict) or hasattr(tree, "keys"):
    return np.concatenate([_flat(tree[k]) for k in sorted(tree.keys())])
  return np.asarray(tree, np.float64).ravel()


def _random_like(tree, rng, scale=1.0):
  return jax.tree.map(lambda x: jnp.asarray(scale * rng.normal(size=np.shape(x)), jnp.float32), tree)


def _arrival(client, delta, payload=(), staleness=0, num_samples=10, start=None):
  start = jax.tree.map(jnp.zeros_like, delta) if start is None else start
  return Arrival(client=client, num_samples=num_samples, staleness=staleness, dispatch_round=0,
                 params_start=start, delta=delta, payload=payload)


# Server updates in float32 against float64 hands: a server update mixes a few arrivals per flush, and up to 25 flushes chain in a test.
AGGREGATION_TOL = f32_tolerance(4, depth=25)


def _close(actual, expected, rel=AGGREGATION_TOL):
  assert_close(actual, expected, rel)


TINY = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array([[0.25, 3.0]])}


def _tiny_delta(rng):
  return jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), TINY)


def _cfg(method):
  cfg = config_lib.base_config()
  cfg.method = method
  return cfg


# A second draw of the same model's parameters (the FedAsync hinge's and FedPSA's w/o-T readings' tests).
PARAMS_KEY0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 4), jnp.float32))
K_SKETCH = 6  # sketch_dim k of the FedPSA tests
GAMMA, DELTA = 5.0, 0.5  # the paper's: γ + δ = 5.5


def _readings_ctx():
  rng = np.random.default_rng(1)
  calibration = (jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), jnp.asarray(rng.integers(0, 3, 8), jnp.int32))
  return strategy_context(MODEL, PARAMS_KEY0, train_batch=calibration)


# The baselines' (CA2FL, FedFa, FedPAC) context and config: four clients, no calibration batch.
def baseline_ctx(num_clients=4, sizes=None, model_name="tiny_mlp"):
  return strategy_context(MODEL, PARAMS0, num_clients=num_clients, sizes=sizes, concurrency=2,
                          num_classes=NUM_CLASSES, model_name=model_name)


def baseline_cfg(method, num_clients=4, **section):
  cfg = config_lib.base_config()
  cfg.method = method
  cfg.model.name = "tiny_mlp"
  cfg.partition.num_clients = num_clients
  for key, value in section.items():
    cfg[method][key] = value
  return cfg


def _add(*trees, scales=None):
  scales = [1.0] * len(trees) if scales is None else scales
  return jax.tree.map(lambda *xs: sum(s * x for s, x in zip(scales, xs)), *trees)
