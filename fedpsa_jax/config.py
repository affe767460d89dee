"""The run config: every field with its meaning, validation, the `:arg` grammar, and a run's identity.

- `base_config()` is the single place where fields are defined; config files under `configs/` start from
  it and change values. Each strategy adds its own section (`config.<method>`) through its
  `default_config()`, so a new algorithm brings its hyperparameters with it.
- `config_errors` / `validate`: a table of `(field, validator)` rows (`fedpsa_jax.validation`) and the
  few checks that relate two fields; every message names the field, the value and what is allowed.
- `set_fields(c, {dotted: value})`: the one way to set fields (command-line args, the notebook API,
  sweep axes); an unknown field is an error naming it.
- `parse_arg(arg, **spec)`: the one grammar of a config file's `:arg` (`configs/paper/table1.py:smoke,seeds=3`,
  `configs/default.py:method=fedbuff,local.lr=0.05`).
- `run_identity` / `identity_differences`: what must be equal for a run directory, a checkpoint or a
  finished sweep member to belong to a config: the shared sections and the run's own method section,
  never the other methods' sections, and not `RESUMABLE_FIELDS`.

Imports point one way: this module needs only the standard library, ml_collections and the leaf modules
`errors`, `validation` and `choices`. The strategy registry (which imports JAX) is looked up when a config
is built or validated, not when this module is imported, so that `io`, `sweep` and `report` import without
JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import os
from typing import Any, Mapping, Sequence

import ml_collections

from fedpsa_jax import choices
from fedpsa_jax.errors import ConfigError  # (re-exported: `config.ConfigError` is the same class)
from fedpsa_jax.validation import (Validator, boolean, error, field_errors, integer, is_integer, number, one_of,
                                   sequence_of)

UNITS_PER_DAY = 86_400  # FLGo's virtual day, in atomic time units
# Virtual times, seeds and response times are int64 on the way through NumPy and JAX (response-time draws,
# `jax.random.key(seed)`); a value beyond it crashes the build or wraps around (a run that never ends).
INT64_MAX = 2**63 - 1
# Day counts (`sim.virtual_days`, `*.every_days`) times 86,400 units must stay below INT64_MAX (~1.07e14
# days); a round bound in the messages.
MAX_DAYS = 10**14
# Memory bounds of FedPSA's sensitivity pieces, known before any work (an out-of-memory error would come
# only once the strategy is built or the first client returns). The calibration batch D_b is held whole and
# every client's sensitivity is computed on all of it (Table 5 tries 16-512); the projection R is a
# sketch_dim x d float32 matrix (d: the model's parameters), bounded by MAX_SKETCH_DIM alone and, once the
# model is known (`model_errors`), by MAX_PROJECTION_BYTES.
MAX_CALIBRATION_SIZE = 65_536
MAX_SKETCH_DIM = 4096
MAX_PROJECTION_BYTES = 2**30  # 1 GiB: k = 161 rows of the MNIST CNN's 1.66M parameters, 16 by default
# (kept here for existing imports; the vocabularies live in fedpsa_jax/choices.py)
LATENCY_DISTRIBUTIONS = choices.LATENCY_DISTRIBUTIONS
LATENCY_RESAMPLING = choices.LATENCY_RESAMPLING
LOCAL_LOOPS = choices.LOCAL_LOOPS
# Fields that may differ between a run directory's config and the config that continues it, or that
# counts it as a finished sweep member: they change neither the run's trajectory nor its outputs up to the
# checkpoint. `sim.virtual_days` may grow (to extend a finished run) but not fall below the time of the
# checkpoint resumed from, and a sweep member is only done at its own budget (`sweep.is_done`);
# `data.data_dir` only says where the same prepared data now lives; `output.phase_timing` changes only the
# wall-clock accounting (a resumed run times its phases from where it continued); `memory.trim_*` only
# how much freed memory the process keeps; `local.jobs_ahead` only when client updates are computed.
RESUMABLE_FIELDS = ("sim.virtual_days", "output.progress", "output.phase_timing", "checkpoint.every_days",
                    "checkpoint.keep", "data.data_dir", "memory.trim_after_compiles",
                    "memory.trim_heap", "local.jobs_ahead")


def _strategies() -> dict[str, Any]:
  """{name: Strategy class} of every registered strategy.

  Imported when called, not with this module: the strategies import JAX, and the config sits below them
  (a plug-in registry, looked up at the moment a config is built, validated or compared)."""
  from fedpsa_jax import strategies

  strategies.load_all()
  return strategies.registered()


def base_config() -> ml_collections.ConfigDict:
  """All fields with their defaults (the paper's Sec. 6.1 values where the paper gives one), and one
  section per registered strategy (`config.<method>`, from its `default_config()`)."""
  strategies = _strategies()
  c = ml_collections.ConfigDict()
  c.method = "fedpsa"  # the strategy: one of fedpsa_jax.strategies.registered()
  c.seed = 0  # the run seed; every random stream is derived from it by purpose (seeding.py)
  c.stop_on_nan = True  # stop the run with status 'diverged' when the model or loss becomes NaN/Inf

  c.data = ml_collections.ConfigDict()
  c.data.name = "mnist_5k"  # mnist | fashion_mnist | cifar10 | cifar100 (tfds) | mnist_5k | synthetic
  c.data.test_split = "holdout"  # holdout: stratified share of the pooled data (the paper); official
  c.data.holdout_fraction = 0.1  # share of each class held out as the test set when test_split=holdout
  c.data.data_dir = ml_collections.FieldReference(None, field_type=str)  # tfds data_dir (None: default)
  # Share of each client's own samples held out as its local test split (personalised evaluation:
  # metrics then carry `personalized_accuracy`); a simple random split per client. 0.0: off.
  c.data.client_test_fraction = 0.0

  c.partition = ml_collections.ConfigDict()
  # dirichlet_flgo (the paper's, via FLGo) | dirichlet | iid | label_groups (CASA's grouped label skew) |
  # labels_per_client (AiFed's k labels per client)
  c.partition.method = "dirichlet_flgo"
  c.partition.alpha = 0.1  # Dirichlet concentration α (smaller: more heterogeneous)
  c.partition.num_clients = 50  # N
  # label_groups only: client share of each group (labels are split in the same shares, disjoint);
  # Dirichlet partition.alpha inside each group. CASA's Appendix A.2.4 default.
  c.partition.group_proportions = (0.2, 0.2, 0.3, 0.3)
  c.partition.min_labels = 2  # labels_per_client: each client holds k labels, k uniform in [min, max]
  c.partition.max_labels = 6  # labels_per_client: the upper bound of k (AiFed: 2-6 on MNIST/FMNIST/CIFAR-10)

  c.model = ml_collections.ConfigDict()
  c.model.name = "mnist_cnn"  # mnist_cnn | linear | cifar_cnn | tiny_mlp | aifed_cnn
  # torch: PyTorch's default layer init, as in the FLGo harness the paper ran (kernels and biases
  # U(±1/√fan_in); the linear model's bias 0) | flax: Flax's defaults (LeCun normal, zero biases)
  c.model.init = "torch"

  c.local = ml_collections.ConfigDict()
  c.local.epochs = 5  # E local epochs, each of ceil(n_i / batch_size) SGD steps
  c.local.batch_size = 64  # B; the last partial batch of an epoch is kept (masked), not dropped
  c.local.lr = 0.01  # initial client learning rate
  c.local.lr_decay = 0.999  # lr_r = lr * lr_decay**r, r the global round at dispatch
  # unrolled: a host loop over compiled calls of a few steps (CPU, conv models); rolled: a whole client update
  # in one compiled call (GPU; CPU without convolutions); auto: whichever of the two local.resolve_loop names.
  c.local.loop = "auto"
  # unrolled loop: at most this many SGD steps per compiled call (also the t-indexed chunks of vmap/sharded).
  # 1 on CPU: one-step calls run as fast as longer unrolled ones and compile far less
  # (benchmarks/unroll.py; MNIST CNN: 1.8 s for one step against 11 s for 16)
  c.local.max_unroll = 1
  # How client updates run (fedpsa_jax/sim/executor.py): loop (one jitted update per job, issued ahead of
  # its arrival, on the client device with the least work), vmap (pending jobs, buckets of similar step
  # counts in one vmapped call), sharded (vmap split over all local devices), auto (the fastest measured
  # for the platform: loop on CPU, vmap/sharded on GPU).
  c.local.execution = "auto"
  # vmap/sharded: clients in every vmapped call, padded with inert jobs when fewer are pending. One width for
  # all calls, because XLA's results change with a batch's size: a client's result then never depends on
  # which clients share its call, and a resumed run repeats an uninterrupted one bit for bit.
  # 0: the in-flight count (C) rounded up to a power of two. Sharded: rounded up to a multiple of the devices.
  c.local.vmap_width = 0
  # loop: client updates issued ahead of their arrival, per client device, the next to arrive first; 0: each
  # at its dispatch. An issued update holds its trained parameters until it arrives, so issuing all at once
  # holds one model per in-flight client; 2 keep the devices as busy (FedBuff's default job: a median peak
  # RSS of 742 MB against 839, no slower; docs/performance.md). Never changes results.
  c.local.jobs_ahead = 2

  c.sim = ml_collections.ConfigDict()
  c.sim.virtual_days = 10.0  # the virtual-time budget in days (86,400 units each)
  c.sim.concurrency = 0.2  # share of clients in flight at once: C = max(1, int(N * concurrency))
  c.sim.latency = ml_collections.ConfigDict()
  c.sim.latency.distribution = "uniform"  # uniform: integers on [low, high]; long_tail: bounded Pareto
  c.sim.latency.low = 10  # shortest response time (units)
  c.sim.latency.high = 500  # longest response time (units)
  c.sim.latency.shape = 1.0  # long_tail only: Pareto shape a (larger: more mass near `low`)
  c.sim.latency.resample = "fixed"  # fixed: one time per client for the run; per_dispatch: redrawn
  # Slow devices (CASA's setting: 0.3 at 5x): a fixed set of round(slow_fraction * N) clients, drawn with
  # the latency generator, has its response times multiplied by slow_factor. 0.0: none (no extra draw).
  c.sim.latency.slow_fraction = 0.0
  c.sim.latency.slow_factor = 5.0

  c.sensitivity = ml_collections.ConfigDict()
  c.sensitivity.calibration = "gaussian"  # the shared batch D_b: gaussian (synthetic) | real (train data)
  c.sensitivity.calibration_size = 32  # |D_b|
  c.sensitivity.sketch_dim = 16  # k, rows of the random projection R (Eq. 11)
  c.sensitivity.fisher = "auto"  # Fisher path: factored (exact, no per-sample dense/conv grads) | per_sample | auto
  c.sensitivity.chunk_size = 8  # per_sample path: samples per vmap(grad) chunk (8 was fastest on CPU)

  c.eval = ml_collections.ConfigDict()
  c.eval.every_days = 0.01  # evaluate the global model every this many virtual days (and at 0, end)
  c.eval.every_round = False  # also evaluate after every round (costly; for fine-grained curves)
  c.eval.batch_size = 1000  # test-set batch size of evaluation
  # Size of the fixed held-out test batch on which diagnostics take the test loss's gradient
  # (fedpsa.log_alignment: the paper's Eqs. 21-22); drawn once per run from the test set, seeded.
  c.eval.alignment_batch_size = 256
  # Time-to-accuracy: the summary reports the day/time/round/client updates/bytes uploaded of the first
  # evaluation whose test accuracy reaches this value (None if never). 0 disables it.
  c.eval.target_accuracy = 0.0

  c.output = ml_collections.ConfigDict()
  c.output.events = False  # write events.jsonl: one line per received update
  c.output.progress = True  # show a progress bar over virtual days
  # Time client training, client payloads and server steps apart (the summary's *_compute_seconds,
  # client_payload_seconds and train_seconds; the paper's Fig. 5): the host then waits for the devices at
  # every event, losing the overlap of its work with theirs. Off, those fields are null and the host never
  # waits between evaluations.
  c.output.phase_timing = False

  c.memory = ml_collections.ConfigDict()
  # Give the heap's freed pages back to the OS (glibc's malloc_trim) after every XLA compile. A compile (LLVM)
  # frees ~100 MB that glibc's malloc would otherwise keep; compiles come at a run's start, so the trims cost
  # no measurable speed (default job, 2-core CPU: ~100-150 MB less peak RSS; docs/performance.md, "Memory").
  # Elsewhere than glibc it does nothing.
  c.memory.trim_after_compiles = True
  # Also at every evaluation and at most once a second of rounds, so that peak RSS follows what the run
  # holds rather than what malloc kept. Off by default: the pages come back as page faults (FedPSA's default
  # job ~15% slower). Turn it on where memory is short (many runs side by side).
  c.memory.trim_heap = False

  c.checkpoint = ml_collections.ConfigDict()
  # Save a checkpoint (WORKDIR/checkpoints) at the first evaluation at least this many virtual days
  # after the previous one, and always at the end; 0: only at the end. Needs a workdir.
  c.checkpoint.every_days = 0.5
  c.checkpoint.keep = 3  # most recent checkpoints kept; >= 2 leaves a fallback if the newest is corrupt

  for name, cls in sorted(strategies.items()):
    c[name] = cls.default_config()
  return c


def eval_every_units(config: ml_collections.ConfigDict) -> int:
  return max(1, int(round(config.eval.every_days * UNITS_PER_DAY)))


def budget_units(config: ml_collections.ConfigDict) -> int:
  return int(round(config.sim.virtual_days * UNITS_PER_DAY))


def concurrency(config: ml_collections.ConfigDict) -> int:
  """C = max(1, int(N * concurrency)), the number of clients in flight."""
  return max(1, int(config.partition.num_clients * config.sim.concurrency))


# --- validation --------------------------------------------------------------------------------------

# Every shared field with what it allows. Fields that relate to another one are checked in
# `_cross_field_errors`; the method's own section by its strategy's `validate_config`.
FIELD_RULES: tuple[tuple[str, Validator], ...] = (
    ("seed", integer(ge=0, le=INT64_MAX, note="it seeds jax.random.key, an int64")),
    ("stop_on_nan", boolean),
    ("data.name", one_of(choices.DATASETS)),
    ("data.test_split", one_of(choices.TEST_SPLITS)),
    ("data.holdout_fraction", number(gt=0, lt=1)),
    ("data.client_test_fraction", number(ge=0, lt=1, note="0: no local test splits")),
    ("partition.method", one_of(choices.PARTITIONERS)),
    ("partition.group_proportions", sequence_of(number(gt=0), min_len=1)),
    ("partition.alpha", number(gt=0)),
    ("partition.num_clients", integer(ge=1)),
    ("partition.min_labels", integer(ge=1)),
    ("partition.max_labels", integer(ge=1)),
    ("model.name", one_of(choices.MODELS)),
    ("model.init", one_of(choices.INITS)),
    ("local.epochs", integer(ge=1)),
    ("local.batch_size", integer(ge=1)),
    ("local.lr", number(gt=0)),
    ("local.lr_decay", number(gt=0, le=1)),
    ("local.loop", one_of(choices.LOCAL_LOOPS)),
    ("local.execution", one_of(choices.EXECUTIONS)),
    ("local.max_unroll", integer(ge=1)),
    ("local.vmap_width", integer(ge=0, note="0: the in-flight count rounded up to a power of two")),
    ("local.jobs_ahead", integer(ge=0, note="0: each client update at its dispatch")),
    ("sim.virtual_days", number(gt=0, le=MAX_DAYS, note="times 86,400 units, it must fit in int64")),
    ("sim.concurrency", number(gt=0, le=1)),
    ("sim.latency.distribution", one_of(choices.LATENCY_DISTRIBUTIONS)),
    ("sim.latency.resample", one_of(choices.LATENCY_RESAMPLING)),
    ("sim.latency.low", integer(ge=1, le=INT64_MAX)),
    ("sim.latency.high", integer(ge=1, le=INT64_MAX)),
    ("sim.latency.shape", number(gt=0)),
    ("sim.latency.slow_fraction", number(ge=0, le=1, note="0: no slow devices")),
    ("sim.latency.slow_factor", number(ge=1)),
    ("sensitivity.calibration", one_of(choices.CALIBRATION_KINDS)),
    ("sensitivity.fisher", one_of(choices.FISHER_METHODS)),
    ("sensitivity.calibration_size", integer(ge=1, le=MAX_CALIBRATION_SIZE, note="the batch is held whole and "
                                            "every client's sensitivity is computed on all of it; Table 5: 16-512")),
    ("sensitivity.sketch_dim", integer(ge=1, le=MAX_SKETCH_DIM, note="the rows of the sketch_dim x parameters "
                                      "float32 projection held in memory; default 16")),
    ("sensitivity.chunk_size", integer(ge=1)),
    ("eval.every_days", number(gt=0, le=MAX_DAYS, note="times 86,400 units, it must fit in int64")),
    ("eval.batch_size", integer(ge=1)),
    ("eval.every_round", boolean),
    ("eval.alignment_batch_size", integer(ge=1)),
    ("eval.target_accuracy", number(ge=0, le=1, note="0: off")),
    ("output.events", boolean),
    ("output.progress", boolean),
    ("output.phase_timing", boolean),
    ("memory.trim_after_compiles", boolean),
    ("memory.trim_heap", boolean),
    ("checkpoint.every_days", number(ge=0, le=MAX_DAYS, note="0: checkpoint only at the end")),
    ("checkpoint.keep", integer(ge=1)),
)


def _cross_field_errors(c: ml_collections.ConfigDict) -> list[str]:
  """The checks that relate two fields (each reported once the fields themselves are valid)."""
  errors = []
  if c.data.test_split == "official" and c.data.name in ("mnist_5k", "synthetic"):
    errors.append(error("data.test_split", c.data.test_split,
                        "holdout for the embedded datasets (they have no official test split)"))
  props, n = c.partition.group_proportions, c.partition.num_clients
  if (c.partition.method == "label_groups" and isinstance(props, (tuple, list)) and is_integer(n)
      and len(props) > n):
    errors.append(error("partition.group_proportions", props,
                        f"at most partition.num_clients ({n}) groups with partition.method='label_groups' "
                        "(and at most the number of labels)"))
  low, high = c.partition.min_labels, c.partition.max_labels
  if is_integer(low) and is_integer(high) and high < low:
    errors.append(error("partition.max_labels", high, f"an integer >= partition.min_labels ({low!r})"))
  low, high = c.sim.latency.low, c.sim.latency.high
  if is_integer(low) and is_integer(high) and high < low:
    errors.append(error("sim.latency.high", high, f"an integer >= sim.latency.low ({low!r})"))
  errors += _arrival_time_errors(c)
  if c.data.data_dir is not None and not os.path.isdir(c.data.data_dir):
    errors.append(f"data.data_dir={c.data.data_dir!r} is not a directory; allowed: an existing "
                  "directory holding prepared tfds datasets, or None for tfds' default")
  return errors


def _arrival_time_errors(c: ml_collections.ConfigDict) -> list[str]:
  """The latest arrival time (the budget plus the slowest response time) must fit in int64: a response
  time of `high` units, times `slow_factor` for slow devices, drawn as int64 (beyond it the draw fails, or
  the product wraps around to a negative time and the run never ends). A `high` too large by itself is
  reported on `sim.latency.high`; one that only the slow factor pushes beyond, on `sim.latency.slow_factor`."""
  lat, days = c.sim.latency, c.sim.virtual_days
  if not (is_integer(lat.high) and 1 <= lat.high <= INT64_MAX and number(gt=0, le=MAX_DAYS)(days)):
    return []  # (each reported by its own row)
  budget = int(round(days * UNITS_PER_DAY))
  room = INT64_MAX - budget - 1  # room for the draw's exclusive upper end (high + 1) and the budget
  if lat.high > room:
    return [error("sim.latency.high", lat.high,
                  f"an integer <= {room} (sim.virtual_days x 86,400 + sim.latency.high must fit in int64)")]
  slow = lat.slow_factor
  if not (number(ge=0, le=1)(lat.slow_fraction) and lat.slow_fraction > 0 and number(ge=1)(slow) and slow > 1):
    return []
  if lat.high <= int(room // slow):
    return []
  return [error("sim.latency.slow_factor", slow,
                f"a number in [1, {_floor_3(room / lat.high)}] with sim.latency.high={lat.high} (sim.latency.high "
                "x sim.latency.slow_factor + sim.virtual_days x 86,400 must fit in int64)")]


def _floor_3(x: float) -> str:
  """`x` (>= 1) rounded down to 3 significant digits, as text: a bound a message can show and a user can copy."""
  scale = 10.0 ** (math.floor(math.log10(x)) - 2)
  return f"{math.floor(x / scale) * scale:.3g}"


@dataclasses.dataclass(frozen=True)
class DataSizes:
  """What the data-dependent checks need to know of a loaded dataset (`data_errors`)."""

  train: int  # training samples (after the holdout)
  test: int  # test samples
  train_per_class: Sequence[int] = ()  # training samples of each label, in label order


def data_errors(c: ml_collections.ConfigDict, sizes: DataSizes) -> list[str]:
  """The problems of a valid config that only the loaded dataset shows (each naming the field, the value
  and the range this dataset allows): more clients than training samples, a holdout that leaves no
  training or no test samples, a `label_groups` group with more clients than samples, a real calibration
  batch larger than the training set. Checked right after the data is loaded, before any other work."""
  errors = []
  name, fraction, n = c.data.name, c.data.holdout_fraction, c.partition.num_clients
  holdout = c.data.test_split == "holdout"
  where = (f"data.name={name!r} has {sizes.train} training and {sizes.test} test samples"
           + (f" with data.holdout_fraction={fraction!r}" if holdout else ""))
  if sizes.train == 0 or sizes.test == 0:
    empty = "training" if sizes.train == 0 else "test"
    if holdout:
      errors.append(error("data.holdout_fraction", fraction, f"a number in (0, 1) that leaves {empty} samples "
                          f"({where})"))
    else:
      errors.append(error("data.name", name, f"a dataset with {empty} samples ({where})"))
    return errors
  if n > sizes.train:
    errors.append(error("partition.num_clients", n, f"an integer in [1, {sizes.train}] (at most one client "
                        f"per training sample: {where})"))
  elif c.partition.method == "label_groups" and sizes.train_per_class:
    errors += _label_group_errors(c, sizes, where)
  calibration = c.sensitivity.calibration_size
  if c.sensitivity.calibration == "real" and calibration > sizes.train:
    errors.append(error("sensitivity.calibration_size", calibration,
                        f"an integer in [1, {sizes.train}] with sensitivity.calibration='real' (a batch drawn "
                        f"from the training samples: {where})"))
  return errors


def _label_group_errors(c: ml_collections.ConfigDict, sizes: DataSizes, where: str) -> list[str]:
  """Each `label_groups` group must have at least as many samples (of its labels) as clients."""
  from fedpsa_jax.data.partition import split_counts  # (NumPy; only for this partition)

  present = [count for count in sizes.train_per_class if count > 0]
  props = tuple(c.partition.group_proportions)[:min(c.partition.num_clients, len(present))]
  clients = split_counts(c.partition.num_clients, props)
  labels = split_counts(len(present), props)
  start, errors = 0, []
  for g, (members, count) in enumerate(zip(clients, labels)):
    samples = sum(present[start:start + int(count)])
    start += int(count)
    if members > samples:
      errors.append(error("partition.num_clients", c.partition.num_clients,
                          f"fewer clients: with partition.method='label_groups' group {g} gets {int(members)} "
                          f"clients but its labels have {samples} training samples ({where})"))
      break
  return errors


def validate_data(c: ml_collections.ConfigDict, sizes: DataSizes) -> None:
  """Raises one ConfigError listing `data_errors` (the config itself is valid: `validate` ran)."""
  errors = data_errors(c, sizes)
  if errors:
    raise ConfigError("invalid config for this dataset:\n  " + "\n  ".join(errors))


def model_errors(c: ml_collections.ConfigDict, num_params: int) -> list[str]:
  """The problems of a valid config that only the model's size shows: FedPSA's projection R, a
  `sensitivity.sketch_dim` x `num_params` float32 matrix, must fit in MAX_PROJECTION_BYTES."""
  k, limit = c.sensitivity.sketch_dim, max(1, MAX_PROJECTION_BYTES // (4 * num_params))
  if k <= limit:
    return []
  return [error("sensitivity.sketch_dim", k,
                f"an integer in [1, {limit}] with model.name={c.model.name!r} ({num_params:,} parameters on "
                f"data.name={c.data.name!r}): the projection R of sketch_dim x parameters float32 must fit in "
                f"{MAX_PROJECTION_BYTES // 2**30} GiB")]


def validate_model(c: ml_collections.ConfigDict, num_params: int) -> None:
  """Raises one ConfigError listing `model_errors` (checked once the data is loaded, before the build)."""
  errors = model_errors(c, num_params)
  if errors:
    raise ConfigError("invalid config for this model:\n  " + "\n  ".join(errors))


def config_errors(c: ml_collections.ConfigDict) -> list[str]:
  """Every problem of a config, each naming the field, the value and what is allowed: the rows of
  `FIELD_RULES`, the cross-field checks, and the active method's own `validate_config`."""
  methods = _strategies()
  errors = field_errors(c, (("method", one_of(methods)),) + FIELD_RULES)
  errors += _cross_field_errors(c)
  if c.method in methods:
    errors += methods[c.method].validate_config(c)
  return errors


def validate(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raises one ConfigError (a ValueError) listing every bad field (field, value, allowed values);
  returns `c`."""
  errors = config_errors(c)
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
  return c


# --- setting fields ----------------------------------------------------------------------------------

# Short names accepted beside any dotted field path in a config file's `:arg` and in the notebook API.
OVERRIDE_ALIASES = {"dataset": "data.name", "alpha": "partition.alpha", "model": "model.name",
                    "num_clients": "partition.num_clients", "virtual_days": "sim.virtual_days",
                    "concurrency": "sim.concurrency"}


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
  out = []
  for key in node.keys():
    value = node[key]
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out += _leaf_paths(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key}")
  return out


def unknown_field(c: ml_collections.ConfigDict, path: str) -> ConfigError:
  """The error for a dotted `path` that names no field of `c`, with the nearest field name as a hint."""
  near = difflib.get_close_matches(path, _leaf_paths(c) + list(OVERRIDE_ALIASES), n=1, cutoff=0.75)
  hint = f"; did you mean {near[0]!r}?" if near else "; allowed: a field of fedpsa_jax.config.base_config()"
  return ConfigError(f"config field {path!r} does not exist{hint}")


def set_fields(c: ml_collections.ConfigDict, fields: Mapping[str, Any], *,
               typed: bool = True) -> ml_collections.ConfigDict:
  """Sets each dotted field of `fields` (`{'sim.virtual_days': 0.1}`) on `c`, in place; returns `c`.

  Only existing fields can be set (a locked config stays locked): an unknown one raises ConfigError
  naming it, with the nearest field name when there is one. An int given for a float field becomes a
  float (`virtual_days=1`); a value of another type raises ConfigError unless `typed=False` (tests that
  feed validation a wrong type on purpose).
  """
  for path, value in fields.items():
    node = c
    *parents, leaf = path.split(".")
    for part in parents:
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise unknown_field(c, path)
      node = node[part]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      raise unknown_field(c, path)
    if not typed:
      with node.unlocked():  # replaced, not assigned: ConfigDict would store True as 1.0 in a float field
        del node[leaf]
        node[leaf] = value
      continue
    old = node[leaf]
    try:
      if isinstance(value, bool) and not isinstance(old, bool) and isinstance(old, (int, float)):
        raise TypeError  # (ConfigDict would take True as 1 or 1.0)
      node[leaf] = value  # (ConfigDict itself turns an int into a float for a float field)
    except TypeError:
      kind = f"type {type(old).__name__}" if old is not None else "the field's type"
      raise ConfigError(f"config field {path}={value!r} is invalid; allowed: a value of {kind}, like its "
                        f"default {old!r}") from None
  return c


# --- the `:arg` grammar --------------------------------------------------------------------------------


def _split_items(arg: str) -> list[str]:
  """Splits at the commas that are not inside brackets or quotes (`partition.group_proportions=(0.5,0.5)`
  is one item)."""
  items, depth, quote, current = [], 0, "", []
  for ch in arg:
    if quote:
      quote = "" if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      items.append("".join(current))
      current = []
      continue
    current.append(ch)
  items.append("".join(current))
  return [item.strip() for item in items if item.strip()]


def _literal(raw: str) -> Any:
  """A Python literal (`0.5`, `True`, `(1, 2)`, `'x'`), else the text itself (`fedbuff`)."""
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def _option_rule(default: Any) -> Validator:
  if isinstance(default, bool):
    return boolean
  if isinstance(default, int):
    return integer()
  if isinstance(default, float):
    return number()
  return Validator(lambda v: isinstance(v, str), "text")


def parse_arg(arg: str | None, **spec: Any) -> tuple[ml_collections.ConfigDict, dict[str, Any]]:
  """The one grammar of a config file's `:arg` (after big_vision's `configs/common.py parse_arg`).

  `arg` holds comma-separated items in any order:
  - the named options of `spec`: `name=default` declares one (`smoke=False` a switch that a bare `smoke`
    turns on, `seeds=1` an integer given as `seeds=3`); `name=(default, validator)` checks its value with a
    `fedpsa_jax.validation` validator;
  - `field=value` for any dotted run-config field (`local.lr=0.05`, `fedpsa.gamma=2.0`) or a short name of
    `OVERRIDE_ALIASES` (`alpha=0.5`, `dataset=cifar10`); values are Python literals, else text.

  Returns (the options as a ConfigDict: `spec`'s defaults with the given values, the overrides
  `{dotted field: value}` to apply with `set_fields`, which rejects unknown fields). Any other item raises
  ConfigError naming the allowed ones.
  """
  rules = {name: (value if isinstance(value, tuple) else (value, _option_rule(value))) for name, value in spec.items()}
  options = ml_collections.ConfigDict({name: default for name, (default, _) in rules.items()})
  overrides: dict[str, Any] = {}
  for item in _split_items(arg or ""):
    key, eq, raw = (s.strip() for s in item.partition("="))
    if key in rules:
      default, rule = rules[key]
      value = _literal(raw) if eq else (True if rule is boolean else None)
      if not rule(value):
        raise ConfigError(f"config argument {item!r} is invalid; allowed: {_option_words(key, rule)}")
      options[key] = value
    elif eq:
      overrides[OVERRIDE_ALIASES.get(key, key)] = _literal(raw)
    else:
      near = difflib.get_close_matches(key, list(rules), n=1)
      allowed = ", ".join([*(_option_words(k, r) for k, (_, r) in rules.items()),
                           "field=value (a dotted config field, e.g. local.lr=0.05, or one of "
                           f"{', '.join(sorted(OVERRIDE_ALIASES))})"])
      hint = f" (did you mean {near[0]!r}?)" if near else ""
      raise ConfigError(f"config argument {item!r} is invalid{hint}; allowed: {allowed}; comma-separated, "
                        "in any order")
  return options, overrides


def _option_words(name: str, rule: Validator) -> str:
  return name if rule is boolean else f"{name}=<{rule.allowed}>"


# --- a run's identity ----------------------------------------------------------------------------------


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in d.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
  """`'field: a -> b'` for every key of two flat dicts whose values differ (absent: <absent>), sorted."""
  out = []
  for key in sorted(set(a) | set(b)):
    va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
    if va != vb:
      out.append(f"{key}: {va!r} -> {vb!r}")
  return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                       ignore: tuple[str, ...] = ()) -> list[str]:
  """`'field: saved -> current'` for every field (dotted path, sorted) whose value differs between two
  configs given as JSON-like dicts, leaving out `ignore`; a field only one of them has counts as
  different (shown as <absent>). The whole config: for "is this the same run?" use
  `identity_differences`."""
  a, b = _flatten(saved), _flatten(current)
  return _differences({k: v for k, v in a.items() if k not in ignore}, {k: v for k, v in b.items() if k not in ignore})


def method_sections() -> frozenset[str]:
  """The names of the per-method sections: one per registered strategy."""
  return frozenset(_strategies())


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
  """What makes a run this run, as a flat {dotted field: value}: every field of the config (JSON form,
  `io.config_json`) except the other methods' sections and `RESUMABLE_FIELDS`.

  A section counts as shared unless it is another registered method's, so a section this code does not
  know stays part of the identity. Adding a field to CASA's section thus changes no FedPSA run."""
  others = method_sections() - {config.get("method")}
  return {k: v for k, v in _flatten(config).items() if k.split(".", 1)[0] not in others and k not in RESUMABLE_FIELDS}


def identity_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
  """`'field: saved -> current'` for every field of `run_identity` that differs: empty when `current`
  may continue (or skip) the run `saved` describes. Two runs of different methods show only the
  `method` line and the shared fields (their sections are not comparable)."""
  a, b = run_identity(saved), run_identity(current)
  if saved.get("method") != current.get("method"):
    own = {saved.get("method"), current.get("method")}
    a, b = ({k: v for k, v in d.items() if k.split(".", 1)[0] not in own} for d in (a, b))
  return _differences(a, b)
