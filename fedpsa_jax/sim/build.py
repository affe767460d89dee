"""Building a run from its config: data, model, strategy, local trainer, executor, clock and evaluators.

`prepare(config, workdir)` comes first: every check that needs no building (the config's rules, the
workdir's config.json) and the run's one claim on its workdir (the lock), so that bad input or a busy
workdir is refused before the many seconds of building. Then `build_run(config)` does every piece of work
a run needs before its first event and returns it as a `Run` (after the flax examples'
`create_train_state`): nothing in it changes while the run goes on except the objects that keep their own
state (the executor's queues, the scheduler's clock). The host loop
(`sim/runner.py`) carries what does change in `LoopState` and the strategy state.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, local, metrics, seeding, strategies
from fedpsa_jax.compiles import CompileCounter
from fedpsa_jax.data import fingerprint
from fedpsa_jax.data.federated import FederatedData, build_federated_data, split_client_test
from fedpsa_jax.data.partition import partition_labels
from fedpsa_jax.data.sources import Dataset, load_dataset
from fedpsa_jax.models import check_fits, get_model, has_convolution
from fedpsa_jax.sim.executor import ClientExecutor, make_executor, resolve_execution
from fedpsa_jax.sim.latency import LatencyModel
from fedpsa_jax.sim.scheduler import Scheduler

Params = Any


@dataclasses.dataclass(frozen=True)
class Claim:
  """A run directory claimed by `prepare`: its lock is held until `rundir.close()`."""

  rundir: io.RunDir
  created: bool  # `prepare` made the directory

  def abandon(self) -> None:
    """Releases the directory of a run that could not be built. One `prepare` made and that holds nothing
    but its lock file is removed: bad input leaves no empty run directory behind."""
    self.rundir.close()
    lock = self.rundir.file(".lock")
    if self.created and os.listdir(self.rundir.path) == [os.path.basename(lock)]:
      os.remove(lock)
    if self.created and not os.listdir(self.rundir.path):
      os.rmdir(self.rundir.path)


def prepare(config: ml_collections.ConfigDict, workdir: str | None) -> tuple[ml_collections.ConfigDict, Claim | None]:
  """The validated config and, with a workdir, the claim on it: ConfigError (before any building) for a bad
  config, a workdir that cannot be written or holds another config's run (`io.check_workdir`), or one that
  another run holds (its lock, taken here and nowhere else, before anything in it is read or written). A config
  with `data.path` comes back with its content's `data.fingerprint` (part of the run's identity)."""
  config = fingerprint.pinned(config_lib.validate(config))
  if not workdir:
    return config, None
  created = io.check_workdir(workdir, config)
  rundir = io.RunDir(workdir)
  rundir.lock()  # (the lock file, with the other run's pid, is the other run's: nothing is removed)
  return config, Claim(rundir, created)


def build_data(config: ml_collections.ConfigDict) -> tuple[Dataset, FederatedData]:
  """The dataset and its federation: load, check the config against the data's sizes
  (`config.validate_data`: ConfigError), partition among the clients, optional local test splits."""
  def check_sample(shape: tuple[int, ...]) -> None:  # (from the file's header: before the images are read)
    config_lib.validate_data(config, config_lib.DataSizes(0, 0, sample_bytes=4 * int(np.prod(shape))),
                             sample_only=True)

  dataset = load_dataset(config.data.name, path=config.data.path, test_split=config.data.test_split,
                         holdout_fraction=config.data.holdout_fraction,
                         rng=seeding.host_rng(config.seed, "data"), data_dir=config.data.data_dir,
                         on_image_shape=check_sample)
  # What only the data can tell (more clients than samples, ...): bad input, found before any other work.
  sizes = config_lib.DataSizes(
      train=len(dataset.y_train), test=len(dataset.y_test),
      train_per_class=tuple(int(n) for n in np.bincount(dataset.y_train, minlength=dataset.num_classes)),
      sample_bytes=4 * int(np.prod(dataset.input_shape)))  # (the model's float32 inputs)
  config_lib.validate_data(config, sizes)
  parts = partition_labels(dataset.y_train, config.partition.num_clients, config.partition.method,
                           config.partition.alpha, seeding.host_rng(config.seed, "partition"),
                           group_proportions=tuple(config.partition.group_proportions),
                           min_labels=config.partition.min_labels, max_labels=config.partition.max_labels)
  test_parts = None
  if config.data.client_test_fraction > 0:  # (no draw when off: existing runs are unchanged)
    parts, test_parts = split_client_test(parts, config.data.client_test_fraction,
                                          seeding.host_rng(config.seed, "client_test"))
  # What only the partition tells (the work of the largest client's update): before the data goes to the device.
  config_lib.validate_data(config, sizes, largest_client=max(len(p) for p in parts))
  return dataset, build_federated_data(dataset, parts, test_parts)


def sample_split(dataset: Dataset, seed: int, split: str, size: int, purpose: str) -> tuple[jax.Array, jax.Array]:
  """`size` samples of the dataset's 'train' or 'test' split, drawn without replacement with the host stream
  `purpose` and kept in the split's order (`StrategyContext.sample`)."""
  x, y = (dataset.x_train, dataset.y_train) if split == "train" else (dataset.x_test, dataset.y_test)
  idx = np.sort(seeding.host_rng(seed, purpose).choice(len(y), size=size, replace=False))
  return jnp.asarray(x[idx]), jnp.asarray(y[idx])


@dataclasses.dataclass
class Run:
  """Everything built from one config before its first event."""

  config: ml_collections.ConfigDict
  dataset: Dataset
  fed: FederatedData
  model: Any  # the Flax module (`model.apply(params, x)`)
  strategy: strategies.Strategy
  initial_state: Any  # the strategy's `init` of the initial global model, on the server's device
  executor: ClientExecutor
  scheduler: Scheduler
  evaluate: Callable[[Params], dict]  # test-set metrics of a parameter tree
  personal_evaluate: Callable | None  # personalised accuracy on the clients' local test splits (or None)
  execution: str  # the resolved runtime.execution backend


def strategy_context(config: ml_collections.ConfigDict, dataset: Dataset, fed: FederatedData, model: Any,
                     params: Params) -> strategies.StrategyContext:
  """What the strategy may know of the run (it never sees the dataset itself)."""
  return strategies.StrategyContext(
      apply_fn=model.apply, params_shape=jax.eval_shape(lambda: params), num_clients=fed.num_clients,
      client_sizes=fed.client_sizes, concurrency=config_lib.concurrency(config), num_classes=dataset.num_classes,
      input_shape=tuple(dataset.input_shape), seed=config.seed,
      sample=functools.partial(sample_split, dataset, config.seed),
      split_sizes={"train": len(dataset.y_train), "test": len(dataset.y_test)}, model_name=config.model.name,
      runtime=config.runtime)


# Jitted: one compile for the whole init instead of one per initializer and shape (same values). The module
# is static (Linen modules compare by value): every run of a process initialises one model through one program.
@functools.partial(jax.jit, static_argnums=0)
def _init(model: Any, key: jax.Array, x: jax.Array) -> Params:
  return model.init(key, x)


def build_run(config: ml_collections.ConfigDict, compiles: CompileCounter | None = None,
              data: tuple[Dataset, FederatedData] | None = None) -> Run:
  """Builds the run of a validated `config` (`data`: its `build_data`, if already loaded)."""
  dataset, fed = data if data is not None else build_data(config)
  source = f"data.name={config.data.name!r}" if config.data.name is not None else f"data.path={config.data.path!r}"
  check_fits(config.model.name, dataset.input_shape, dataset.num_classes, source)  # (ConfigError: before any work)
  model = get_model(config.model.name, dataset.num_classes, config.model.init)
  init_x = jnp.zeros((1, *dataset.input_shape), jnp.float32)
  params = _init(model, seeding.device_key(config.seed, "init"), init_x)
  strategy = strategies.get_strategy(config.method)(config.get(config.method, ml_collections.ConfigDict()),
                                                    strategy_context(config, dataset, fed, model, params))
  # Committed to the server's device from the start: jit caches a program per committed/uncommitted
  # input, and every later state (outputs of jitted steps on committed inputs) is committed, so an
  # uncommitted initial state would compile each server function twice.
  home = fed.home
  state = jax.tree.map(lambda x: jax.device_put(x, home) if isinstance(x, jax.Array) else x,
                       strategy.init(jax.device_put(params, home)))
  trainer = local.LocalTrainer(
      apply_fn=model.apply, batch_size=config.local.batch_size, epochs=config.local.epochs,
      regularizer=strategy.client.regularizer,
      loop=local.resolve_loop(config.runtime.loop, convolutional=has_convolution(model.apply, params, init_x)),
      loss=strategy.client.loss)
  execution = resolve_execution(config.runtime.execution)
  executor = make_executor(execution, trainer, fed, strategy, seeding.device_key(config.seed, "clients"), compiles,
                           phase_timing=config.runtime.phase_timing, width=config.runtime.vmap_width,
                           concurrency=config_lib.concurrency(config), jobs_ahead=config.runtime.jobs_ahead)
  lat = config.sim.latency
  latency = LatencyModel(fed.num_clients, lat.distribution, lat.low, lat.high, lat.shape, lat.resample,
                         seeding.host_rng(config.seed, "latency"), slow_fraction=lat.slow_fraction,
                         slow_factor=lat.slow_factor)
  scheduler = Scheduler(fed.num_clients, config_lib.concurrency(config), latency,
                        seeding.host_rng(config.seed, "selection"), mode=strategy.dispatch_mode)
  evaluate = metrics.make_evaluator(model.apply, fed.x_test, fed.y_test, config.eval.batch_size)
  personal_evaluate = (metrics.make_personal_evaluator(model.apply, fed.x_train, fed.y_train, fed.client_test_indices,
                                                       config.eval.batch_size) if fed.client_test_indices else None)
  return Run(config=config, dataset=dataset, fed=fed, model=model, strategy=strategy, initial_state=state,
             executor=executor, scheduler=scheduler, evaluate=evaluate, personal_evaluate=personal_evaluate,
             execution=execution)
