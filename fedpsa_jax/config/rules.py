"""Validation of the run config: what each shared field allows, the checks that relate two fields, and the
checks only the loaded dataset can make. Every message names the field, the value and what is allowed, in
one shape (`fedpsa_jax/validation.py`); the active method's own section is checked by its strategy's
`validate_config`, and bounds that depend on the model or the data by the strategy that has them, when it is
built (before any training).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Sequence

import ml_collections

from fedpsa_jax import choices
from fedpsa_jax.config.schema import MAX_DAYS, UNITS_PER_DAY, registered_strategies
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.validation import (INT64_MAX, MISSING, Validator, boolean, error, field_errors, get_field, integer,
                                   is_integer, number, one_of, sequence_of)

_DATASET_NAME = Validator(lambda v: v is None or choices.is_dataset_name(v),
                          f"one of {', '.join(choices.DATASETS)}, any tfds dataset name (name[/config][:version], "
                          "e.g. kmnist, emnist/digits, svhn_cropped), or None with data.path")
_OPTIONAL_TEXT = Validator(lambda v: v is None or (isinstance(v, str) and v != ""), "a non-empty string, or None")
_FINGERPRINT = Validator(lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16}", v) is not None),
                         "16 hex digits (what a run with data.path records), or None")

# Bounds on the work of one client update, known before any training. A client update visits local.epochs x
# the largest client's samples (the shuffled orders of every epoch are drawn at its start, padded to the
# largest client, int32 each) and takes local.epochs x ceil(samples / local.batch_size) SGD steps, one
# compiled call that no signal interrupts; each step holds a batch of batch_size float32 samples (the batched
# executor's steps are full-size, masked past a client's samples; evaluation batches alike). The paper's
# setups (Sec. 6.1: 5 epochs, at most 60,000 samples in one client) visit at most 300,000; the bound leaves 14
# times that, and refuses 100,000 epochs of the default config's largest client (94 samples: 200,000 SGD steps
# in one update).
MAX_SAMPLE_VISITS = 2**22
MAX_BATCH_BYTES = 2**30

# Every shared field with what it allows, but those whose values registries extend (`registered_rows`). Fields
# that relate to another one are checked in `_cross_field_errors`; the method's own section by its strategy's
# `validate_config`.
FIELD_RULES: tuple[tuple[str, Validator], ...] = (
    ("seed", integer(ge=0, le=INT64_MAX, note="it seeds jax.random.key, an int64")),
    ("stop_on_nan", boolean),
    ("data.name", _DATASET_NAME),
    ("data.path", _OPTIONAL_TEXT),
    ("data.fingerprint", _FINGERPRINT),
    ("data.test_split", one_of(choices.TEST_SPLITS)),
    ("data.holdout_fraction", number(gt=0, lt=1)),
    ("data.client_test_fraction", number(ge=0, lt=1, note="0: no local test splits")),
    ("partition.method", one_of(choices.PARTITIONERS)),
    ("partition.group_proportions", sequence_of(number(gt=0), min_len=1)),
    ("partition.alpha", number(gt=0)),
    ("partition.num_clients", integer(ge=1)),
    ("partition.min_labels", integer(ge=1)),
    ("partition.max_labels", integer(ge=1)),
    ("model.init", one_of(choices.INITS)),
    ("local.epochs", integer(ge=1, le=MAX_SAMPLE_VISITS, note="every epoch visits at least one sample, and a "
                            f"client update at most {MAX_SAMPLE_VISITS:,}")),
    ("local.batch_size", integer(ge=1)),
    ("local.lr", number(gt=0)),
    ("local.lr_decay", number(gt=0, le=1)),
    ("sim.virtual_days", number(gt=0, le=MAX_DAYS, note="times 86,400 units, it must fit in int64")),
    ("sim.concurrency", number(gt=0, le=1)),
    ("sim.latency.distribution", one_of(choices.LATENCY_DISTRIBUTIONS)),
    ("sim.latency.resample", one_of(choices.LATENCY_RESAMPLING)),
    ("sim.latency.low", integer(ge=1, le=INT64_MAX)),
    ("sim.latency.high", integer(ge=1, le=INT64_MAX)),
    ("sim.latency.shape", number(gt=0)),
    ("sim.latency.slow_fraction", number(ge=0, le=1, note="0: no slow devices")),
    ("sim.latency.slow_factor", number(ge=1)),
    ("eval.every_days", number(gt=0, le=MAX_DAYS, note="times 86,400 units, it must fit in int64")),
    ("eval.batch_size", integer(ge=1)),
    ("eval.every_round", boolean),
    ("eval.target_accuracy", number(ge=0, le=1, note="0: off")),
    ("output.events", boolean),
    ("checkpoint.every_days", Validator(
        lambda v: number(ge=0, le=MAX_DAYS)(v) and (v == 0 or v * UNITS_PER_DAY >= 1),
        f"0 (checkpoint only at the end) or a number in [1/{UNITS_PER_DAY:,}, {MAX_DAYS}] (at least one time "
        "unit: a shorter interval would round to 0 units, i.e. only at the end)")),
    ("checkpoint.keep", integer(ge=1)),
    ("runtime.loop", one_of(choices.LOCAL_LOOPS)),
    ("runtime.vmap_width", integer(ge=0, note="0: the in-flight count rounded up to a power of two")),
    ("runtime.jobs_ahead", integer(ge=0, note="0: each client update at its dispatch")),
    ("runtime.fisher", one_of(choices.FISHER_METHODS)),
    ("runtime.fisher_chunk_size", integer(ge=1)),
    ("runtime.phase_timing", boolean),
    ("runtime.progress", boolean),
    ("runtime.tensorboard", boolean),
    ("runtime.trim_heap", boolean),
)


def _cross_field_errors(c: ml_collections.ConfigDict) -> list[str]:
  """The checks that relate two fields (each reported once the fields themselves are valid)."""
  errors = _data_source_errors(c)
  if c.data.test_split == "official" and c.data.name in choices.EMBEDDED_DATASETS:
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


def _data_source_errors(c: ml_collections.ConfigDict) -> list[str]:
  """Exactly one of data.name and data.path; a path that is an .npz file or a prepared tfds version folder."""
  name, path = c.data.name, get_field(c, "data.path")
  path = None if path is MISSING else path  # (a config of an older schema: data.name alone)
  if (name is None) == (path is None):
    both = "both set" if name is not None else "both None"
    return [f"data.name={name!r} and data.path={path!r} are {both}; allowed: exactly one of them (with data.path, "
            "set data.name=None)"]
  errors = []
  pinned = get_field(c, "data.fingerprint")
  if pinned not in (None, MISSING) and path is None:
    errors.append(error("data.fingerprint", pinned, "None without data.path (it fingerprints that file)"))
  if not isinstance(path, str) or not path:
    return errors  # (None, or reported by its row)
  folder_files = ("dataset_info.json", "features.json")
  if os.path.isdir(path):
    if not all(os.path.isfile(os.path.join(path, f)) for f in folder_files):
      errors.append(error("data.path", path, "the version folder of a prepared tfds dataset (holding "
                          "dataset_info.json and features.json, e.g. .../my_dataset/1.0.0), or an .npz file"))
  elif not os.path.isfile(path) or not path.endswith(".npz"):
    what = "a file, but not an .npz" if os.path.isfile(path) else "not an existing file or folder"
    errors.append(error("data.path", path, f"an existing .npz file or prepared tfds folder ({what})"))
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
  sample_bytes: int = 0  # bytes of one float32 input sample (0: not known, not checked)


def data_errors(c: ml_collections.ConfigDict, sizes: DataSizes) -> list[str]:
  """The problems of a valid config that only the loaded dataset shows (each naming the field, the value
  and the range this dataset allows): more clients than training samples, a holdout that leaves no
  training or no test samples, a `label_groups` group with more clients than samples. Checked right after
  the data is loaded, before any other work."""
  errors = []
  fraction, n = c.data.holdout_fraction, c.partition.num_clients
  field = "data.name" if c.data.name is not None else "data.path"
  value = get_field(c, field)
  holdout = c.data.test_split == "holdout"
  where = (f"{field}={value!r} has {sizes.train} training and {sizes.test} test samples"
           + (f" with data.holdout_fraction={fraction!r}" if holdout else ""))
  if sizes.train == 0 or sizes.test == 0:
    empty = "training" if sizes.train == 0 else "test"
    if holdout:
      errors.append(error("data.holdout_fraction", fraction, f"a number in (0, 1) that leaves {empty} samples "
                          f"({where})"))
    else:
      errors.append(error(field, value, f"a dataset with {empty} samples ({where})"))
    return errors
  if n > sizes.train:
    errors.append(error("partition.num_clients", n, f"an integer in [1, {sizes.train}] (at most one client "
                        f"per training sample: {where})"))
  elif c.partition.method == "label_groups" and sizes.train_per_class:
    errors += _label_group_errors(c, sizes, where)
  return errors + sample_errors(c, sizes.sample_bytes)


def sample_errors(c: ml_collections.ConfigDict, sample_bytes: int) -> list[str]:
  """The batch sizes that samples of `sample_bytes` bytes (one float32 input; 0: not known) rule out: a batch must
  fit in MAX_BATCH_BYTES. Known from a data file's header, before the data is read."""
  if not sample_bytes:
    return []
  field = "data.name" if c.data.name is not None else "data.path"
  value = get_field(c, field)
  limit = max(1, MAX_BATCH_BYTES // sample_bytes)
  return [error(batch_field, get_field(c, batch_field), f"an integer in [1, {limit:,}] with {field}={value!r} (a "
                f"batch of that many samples of {sample_bytes:,} bytes each must fit in {MAX_BATCH_BYTES // 2**30} GiB)")
          for batch_field in ("local.batch_size", "eval.batch_size") if get_field(c, batch_field) > limit]


def federation_errors(c: ml_collections.ConfigDict, largest_client: int) -> list[str]:
  """The bound that only the partition shows: a client update visits local.epochs x the largest client's
  samples, at most MAX_SAMPLE_VISITS (see there)."""
  limit = max(1, MAX_SAMPLE_VISITS // max(1, largest_client))
  if c.local.epochs <= limit:
    return []
  return [error("local.epochs", c.local.epochs,
                f"an integer in [1, {limit:,}] with the largest client's {largest_client:,} samples (its update "
                f"visits local.epochs x {largest_client:,} samples, at most {MAX_SAMPLE_VISITS:,})")]


def _label_group_errors(c: ml_collections.ConfigDict, sizes: DataSizes, where: str) -> list[str]:
  """Each `label_groups` group must have at least as many samples (of its labels) as clients."""
  from fedpsa_jax.apportion import split_counts  # (NumPy, imported only for this partition)

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


def validate_data(c: ml_collections.ConfigDict, sizes: DataSizes, largest_client: int | None = None,
                  sample_only: bool = False) -> None:
  """Raises one ConfigError listing `data_errors` and, once the data is partitioned (`largest_client`: the
  largest client's training samples), `federation_errors` (the config itself is valid: `validate` ran). With
  `sample_only`, only `sample_errors` (`sizes.sample_bytes`, from a file's header before the data is read)."""
  errors = (sample_errors(c, sizes.sample_bytes) if sample_only else data_errors(c, sizes) if largest_client is None
            else federation_errors(c, largest_client))
  if errors:
    raise ConfigError("invalid config for this dataset:\n  " + "\n  ".join(errors))


def registered_rows() -> tuple[tuple[str, Validator], ...]:
  """The rows of the fields whose values registries add to at run time, built when a config is checked: `method`
  (the strategies), `model.name` and `runtime.execution` (the names registered in `choices`)."""
  return (("method", one_of(registered_strategies())), ("model.name", one_of(choices.allowed("model.name"))),
          ("runtime.execution", one_of(choices.allowed("runtime.execution"))))


def config_errors(c: ml_collections.ConfigDict) -> list[str]:
  """Every problem of a config, each naming the field, the value and what is allowed: the rows of
  `registered_rows` and `FIELD_RULES`, the cross-field checks, and the active method's own `validate_config`."""
  methods = registered_strategies()
  errors = field_errors(c, registered_rows() + FIELD_RULES)
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


