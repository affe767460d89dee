"""The run config: every field with its meaning, and validation before any work starts.

`base_config()` is the single place where fields are defined; config files under `configs/` start
from it and change values. Each strategy adds its own section (`config.<method>`) through its
`default_config()`, so a new algorithm brings its hyperparameters with it.
"""

from __future__ import annotations

import math
import os

import ml_collections

from fedpsa_jax import strategies
from fedpsa_jax.data.calibration import CALIBRATION_KINDS
from fedpsa_jax.data.partition import PARTITIONERS
from fedpsa_jax.data.sources import DATASETS, TEST_SPLITS
from fedpsa_jax.models import INITS, MODELS
from fedpsa_jax.sensitivity import FISHER_METHODS
from fedpsa_jax.sim.executor import EXECUTIONS

UNITS_PER_DAY = 86_400  # FLGo's virtual day, in atomic time units
LATENCY_DISTRIBUTIONS = ("uniform", "long_tail")
LATENCY_RESAMPLING = ("fixed", "per_dispatch")
LOCAL_LOOPS = ("auto", "unrolled", "rolled")
# Fields that may differ between a run directory's config.json and the config that resumes it: they
# change neither the run's trajectory nor its outputs up to the checkpoint. `sim.virtual_days` may grow
# (to extend a finished run) but not fall below the time of the checkpoint resumed from;
# `data.data_dir` only says where the same prepared data now lives.
RESUMABLE_FIELDS = ("sim.virtual_days", "output.progress", "checkpoint.every_days", "checkpoint.keep",
                    "data.data_dir")


class ConfigError(ValueError):
  """Bad input found before any training: a config value, the workdir, or a resume that cannot be."""


def base_config() -> ml_collections.ConfigDict:
  """All fields with their defaults (the paper's Sec. 6.1 values where the paper gives one)."""
  strategies.load_all()
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
  c.local.loop = "auto"  # unrolled: a host loop over compiled calls of a few steps (CPU); rolled: one fori_loop (GPU)
  # unrolled loop: at most this many SGD steps per compiled call (also the t-indexed chunks of vmap/sharded).
  # 1 on CPU: one-step calls run as fast as longer unrolled ones and compile far less
  # (benchmarks/unroll.py; MNIST CNN: 1.8 s for one step against 11 s for 16)
  c.local.max_unroll = 1
  # How client updates run (fedpsa_jax/sim/executor.py): loop (one jitted update per job, issued when it
  # is dispatched, on the client device with the least work), vmap (pending jobs, buckets of similar step
  # counts in one vmapped call), sharded (vmap split over all local devices), auto (the fastest measured
  # for the platform: loop on CPU, vmap/sharded on GPU).
  c.local.execution = "auto"

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

  c.checkpoint = ml_collections.ConfigDict()
  # Save a checkpoint (WORKDIR/checkpoints) at the first evaluation at least this many virtual days
  # after the previous one, and always at the end; 0: only at the end. Needs a workdir.
  c.checkpoint.every_days = 0.5
  c.checkpoint.keep = 3  # most recent checkpoints kept; >= 2 leaves a fallback if the newest is corrupt

  for name, cls in sorted(strategies.registered().items()):
    c[name] = cls.default_config()
  return c


def eval_every_units(config: ml_collections.ConfigDict) -> int:
  return max(1, int(round(config.eval.every_days * UNITS_PER_DAY)))


def budget_units(config: ml_collections.ConfigDict) -> int:
  return int(round(config.sim.virtual_days * UNITS_PER_DAY))


def concurrency(config: ml_collections.ConfigDict) -> int:
  """C = max(1, int(N * concurrency)), the number of clients in flight."""
  return max(1, int(config.partition.num_clients * config.sim.concurrency))


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def config_errors(c: ml_collections.ConfigDict) -> list[str]:
  """Every problem of a config, each naming the field, the value and what is allowed."""
  strategies.load_all()
  errors: list[str] = []

  def check(ok: bool, field: str, allowed: str) -> None:
    if not ok:
      value = c
      for part in field.split("."):
        value = value.get(part) if isinstance(value, ml_collections.ConfigDict) else None
      errors.append(f"{field}={value!r} is invalid; allowed: {allowed}")

  def one_of(field: str, options) -> None:
    value = c
    for part in field.split("."):
      value = value.get(part)
    check(value in options, field, ", ".join(map(str, sorted(options))))

  methods = strategies.registered()
  one_of("method", methods)
  check(_is_int(c.seed) and c.seed >= 0, "seed", "an integer >= 0")
  check(isinstance(c.stop_on_nan, bool), "stop_on_nan", "True, False")
  one_of("data.name", DATASETS)
  one_of("data.test_split", TEST_SPLITS)
  check(
      c.data.test_split != "official" or c.data.name not in ("mnist_5k", "synthetic"),
      "data.test_split",
      "holdout for the embedded datasets (they have no official test split)",
  )
  check(_is_number(c.data.holdout_fraction) and 0 < c.data.holdout_fraction < 1,
        "data.holdout_fraction", "a number in (0, 1)")
  check(_is_number(c.data.client_test_fraction) and 0 <= c.data.client_test_fraction < 1,
        "data.client_test_fraction", "a number in [0, 1) (0: no local test splits)")
  one_of("partition.method", PARTITIONERS)
  props = c.partition.group_proportions
  check(isinstance(props, (tuple, list)) and len(props) >= 1 and all(_is_number(p) and p > 0 for p in props)
        and (c.partition.method != "label_groups" or not _is_int(c.partition.num_clients)
             or len(props) <= c.partition.num_clients),
        "partition.group_proportions", "a non-empty tuple of numbers > 0 (label_groups: at most "
        "partition.num_clients groups, and at most the number of labels)")
  check(_is_number(c.partition.alpha) and c.partition.alpha > 0, "partition.alpha", "a number > 0")
  check(_is_int(c.partition.num_clients) and c.partition.num_clients >= 1,
        "partition.num_clients", "an integer >= 1")
  check(_is_int(c.partition.min_labels) and c.partition.min_labels >= 1, "partition.min_labels",
        "an integer >= 1")
  check(_is_int(c.partition.max_labels) and c.partition.max_labels >= 1
        and (not _is_int(c.partition.min_labels) or c.partition.max_labels >= c.partition.min_labels),
        "partition.max_labels", f"an integer >= partition.min_labels ({c.partition.min_labels!r})")
  one_of("model.name", MODELS)
  one_of("model.init", INITS)
  check(_is_int(c.local.epochs) and c.local.epochs >= 1, "local.epochs", "an integer >= 1")
  check(_is_int(c.local.batch_size) and c.local.batch_size >= 1, "local.batch_size", "an integer >= 1")
  check(_is_number(c.local.lr) and c.local.lr > 0, "local.lr", "a number > 0")
  check(_is_number(c.local.lr_decay) and 0 < c.local.lr_decay <= 1, "local.lr_decay", "a number in (0, 1]")
  one_of("local.loop", LOCAL_LOOPS)
  one_of("local.execution", EXECUTIONS)
  check(_is_int(c.local.max_unroll) and c.local.max_unroll >= 1, "local.max_unroll", "an integer >= 1")
  check(_is_number(c.sim.virtual_days) and c.sim.virtual_days > 0, "sim.virtual_days", "a number > 0")
  check(_is_number(c.sim.concurrency) and 0 < c.sim.concurrency <= 1, "sim.concurrency",
        "a number in (0, 1]")
  lat = c.sim.latency
  one_of("sim.latency.distribution", LATENCY_DISTRIBUTIONS)
  one_of("sim.latency.resample", LATENCY_RESAMPLING)
  check(_is_int(lat.low) and lat.low >= 1, "sim.latency.low", "an integer >= 1")
  check(_is_int(lat.high) and _is_int(lat.low) and lat.high >= lat.low, "sim.latency.high",
        f"an integer >= sim.latency.low ({lat.low!r})")
  check(_is_number(lat.shape) and lat.shape > 0, "sim.latency.shape", "a number > 0")
  check(_is_number(lat.slow_fraction) and 0 <= lat.slow_fraction <= 1, "sim.latency.slow_fraction",
        "a number in [0, 1] (0: no slow devices)")
  check(_is_number(lat.slow_factor) and lat.slow_factor >= 1, "sim.latency.slow_factor", "a number >= 1")
  s = c.sensitivity
  one_of("sensitivity.calibration", CALIBRATION_KINDS)
  one_of("sensitivity.fisher", FISHER_METHODS)
  check(_is_int(s.calibration_size) and s.calibration_size >= 1, "sensitivity.calibration_size",
        "an integer >= 1")
  check(_is_int(s.sketch_dim) and s.sketch_dim >= 1, "sensitivity.sketch_dim", "an integer >= 1")
  check(_is_int(s.chunk_size) and s.chunk_size >= 1, "sensitivity.chunk_size", "an integer >= 1")
  check(_is_number(c.eval.every_days) and c.eval.every_days > 0, "eval.every_days", "a number > 0")
  check(_is_int(c.eval.batch_size) and c.eval.batch_size >= 1, "eval.batch_size", "an integer >= 1")
  check(isinstance(c.eval.every_round, bool), "eval.every_round", "True, False")
  check(_is_int(c.eval.alignment_batch_size) and c.eval.alignment_batch_size >= 1, "eval.alignment_batch_size",
        "an integer >= 1")
  check(_is_number(c.eval.target_accuracy) and 0 <= c.eval.target_accuracy <= 1, "eval.target_accuracy",
        "a number in [0, 1] (0: off)")
  check(isinstance(c.output.events, bool), "output.events", "True, False")
  check(isinstance(c.output.progress, bool), "output.progress", "True, False")
  check(_is_number(c.checkpoint.every_days) and c.checkpoint.every_days >= 0, "checkpoint.every_days",
        "a number >= 0 (0: checkpoint only at the end)")
  check(_is_int(c.checkpoint.keep) and c.checkpoint.keep >= 1, "checkpoint.keep", "an integer >= 1")
  if c.method in methods:
    errors += methods[c.method].validate_config(c)
  if c.data.data_dir is not None and not os.path.isdir(c.data.data_dir):
    errors.append(f"data.data_dir={c.data.data_dir!r} is not a directory; allowed: an existing "
                  "directory holding prepared tfds datasets, or None for tfds' default")
  return errors


def validate(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raises one ConfigError (a ValueError) listing every bad field (field, value, allowed values);
  returns `c`."""
  errors = config_errors(c)
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
  return c


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
  out: dict[str, object] = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def config_differences(saved: dict, current: dict, ignore: tuple[str, ...] = RESUMABLE_FIELDS) -> list[str]:
  """`'field: saved -> current'` for every field (dotted path, sorted) whose value differs between two
  configs given as JSON-like dicts, leaving out `ignore`. A field only one of them has counts as
  different (shown as <absent>)."""
  a, b = _flatten(saved), _flatten(current)
  out = []
  for key in sorted(set(a) | set(b)):
    if key in ignore:
      continue
    va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
    if va != vb:
      out.append(f"{key}: {va!r} -> {vb!r}")
  return out


# Short names accepted in a config file's `:arg` string, beside any dotted field path.
OVERRIDE_ALIASES = {"dataset": "data.name", "alpha": "partition.alpha", "model": "model.name",
                    "num_clients": "partition.num_clients", "virtual_days": "sim.virtual_days",
                    "concurrency": "sim.concurrency"}


def parse_overrides(arg: str | None) -> dict[str, object]:
  """`'method=fedbuff,alpha=0.5'` -> {'method': 'fedbuff', 'partition.alpha': 0.5} (Python literals
  are parsed, anything else stays a string)."""
  import ast

  out: dict[str, object] = {}
  for item in filter(None, (arg or "").split(",")):
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is invalid; allowed: key=value pairs separated by commas")
    key, raw = (s.strip() for s in item.split("=", 1))
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      value = raw
    out[OVERRIDE_ALIASES.get(key, key)] = value
  return out


def apply_overrides(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
  """Sets each `key=value` of `arg` on `c`; an unknown field is an error naming it."""
  for path, value in parse_overrides(arg).items():
    node = c
    *parents, leaf = path.split(".")
    for part in parents:
      if part not in node:
        raise ValueError(f"config field {path!r} does not exist")
      node = node[part]
    if leaf not in node:
      raise ValueError(f"config field {path!r} does not exist")
    if isinstance(node[leaf], float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    node[leaf] = value
  return c
