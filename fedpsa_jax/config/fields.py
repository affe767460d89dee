"""What a user types into a config: a config file (`load_file`), dotted fields set by name (`set_fields`) and a
config file's `:arg` (`parse_arg`). The notebook API, the command line's `--config.<field>=` flags and sweep
axes all come here, so an unknown field, or one that has moved, gets the same one-line error everywhere.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import os
import sys
import traceback
import warnings
from typing import Any, Iterator, Mapping

import ml_collections
from ml_collections.config_flags import config_flags  # (its ConfigFileFlagParser: what --config uses)

from fedpsa_jax import errors
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.validation import Validator, boolean, integer, number

# Fields that moved, {old dotted path: new}: naming an old one is an error that names the new one. Result-
# neutral knobs went to `runtime`; FedPSA's settings to FedPSA's own section. (Fields that went, with why.)
MOVED_FIELDS = {
    "local.execution": "runtime.execution", "local.loop": "runtime.loop", "local.vmap_width": "runtime.vmap_width",
    "local.jobs_ahead": "runtime.jobs_ahead", "output.phase_timing": "runtime.phase_timing",
    "output.progress": "runtime.progress", "memory.trim_heap": "runtime.trim_heap",
    "sensitivity.fisher": "runtime.fisher", "sensitivity.chunk_size": "runtime.fisher_chunk_size",
    "sensitivity.calibration": "fedpsa.calibration", "sensitivity.calibration_size": "fedpsa.calibration_size",
    "sensitivity.sketch_dim": "fedpsa.sketch_dim", "eval.alignment_batch_size": "fedpsa.alignment_batch_size",
}
REMOVED_FIELDS = {
    "local.max_unroll": "client updates always take one SGD step per compiled call on the unrolled loop",
    "memory.trim_after_compiles": "the run always gives the heap back to the OS after XLA compiles",
}
# Fields added after runs were recorded without them, {dotted path: the value those runs had}: a saved config that
# lacks one is the run at that value (each default is bit-identical to the code before the field, and tested so),
# so records written before a field was added still count as done, and their runs still resume.
ADDED_FIELDS = {"fedbuff.weighting": "staleness", "fedbuff.step": "staleness", "fedpsa.step": "unit",
                "fedpsa.server_lr": 1.0}

# Short names accepted beside any dotted field path in a config file's `:arg` and in the notebook API.
OVERRIDE_ALIASES = {"dataset": "data.name", "alpha": "partition.alpha", "model": "model.name",
                    "num_clients": "partition.num_clients", "virtual_days": "sim.virtual_days",
                    "concurrency": "sim.concurrency"}


def load_file(spec: str) -> ml_collections.ConfigDict:
  """'path/to/file.py[:arg]' -> that file's `get_config(arg)`, read by the parser behind launch.py's `--config`
  (ml_collections' `ConfigFileFlagParser`), so a file means the same in a notebook as on the command line;
  unlocked, for the caller to change. FileNotFoundError for a missing file; ConfigError naming the file when it
  is not a Python config file (not `.py`, unreadable, no `get_config`, a result that is no ConfigDict); an error
  the file itself raises comes through as it was raised."""
  path = spec.partition(":")[0]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} not found")
  allowed = "allowed: a Python config file (.py) that defines get_config(arg) returning a ConfigDict"
  if not path.endswith(".py") or not os.access(path, os.R_OK):
    raise ConfigError(f"config file {path!r}: {'unreadable' if path.endswith('.py') else 'not a .py file'}; {allowed}")
  # ml_collections loads the file as the module `<name>_config`, reloading over one already there, whose names
  # (a get_config of the file loaded before) would survive: each load starts from a new module.
  sys.modules.pop("fedpsa_config_file_config", None)
  try:
    with quiet_loader():
      config = config_flags.ConfigFileFlagParser("fedpsa_config_file", lock_config=False).parse(spec)
  except SystemExit as err:
    if not exited_in(err, path):
      raise
    raise ConfigError(f"config file {path!r} exited (sys.exit({err.code!r})) while it was loaded; {allowed}") from None
  except AttributeError as err:
    if "get_config" not in str(err):
      raise
    raise ConfigError(f"config file {path!r}: no get_config(arg) function; {allowed}") from None
  except (TypeError, ValueError) as err:  # re-raised by ml_collections with a traceback as text: the file's own
    raise (err.__context__ or err) from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"config file {path!r}: get_config() returned {type(config).__name__}; {allowed}")
  return config


@contextlib.contextmanager
def quiet_loader() -> Iterator[None]:
  """While a config file loads: without ml_collections' loader deprecation (under Python 3.11) and its absl log
  lines (a get_config that returns None is also logged as a warning), which the one-line error says better."""
  with errors.absl_warnings_held(), warnings.catch_warnings():
    warnings.filterwarnings("ignore", "the load_module", DeprecationWarning)
    yield


def exited_in(err: SystemExit, path: str) -> bool:
  """Whether `err` was raised by the code of the file `path` (a config file that calls sys.exit)."""
  target = os.path.realpath(path)
  return any(os.path.realpath(frame.f_code.co_filename) == target
             for frame, _ in traceback.walk_tb(err.__traceback__))


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
  """The error for a dotted `path` that names no field of `c`: where it moved, why it went, or the nearest
  field name as a hint."""
  if path in MOVED_FIELDS:
    return ConfigError(f"config field {path!r} has moved; use {MOVED_FIELDS[path]!r}")
  if path in REMOVED_FIELDS:
    return ConfigError(f"config field {path!r} no longer exists: {REMOVED_FIELDS[path]}")
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
  data_path_replaces_name(c, fields)
  return c


def data_path_replaces_name(c: ml_collections.ConfigDict, fields_set: Mapping[str, Any] | set[str]) -> None:
  """The data named by path wins over the config's own data.name: when `fields_set` (the fields a user set
  over a config: `set_fields`' fields, launch.py's `--config.<field>` flags) holds data.path, with a value, and
  not data.name, data.name becomes None (`config.validate` wants exactly one of them). Both set by the user
  stay an error, naming the two."""
  if "data.path" in fields_set and "data.name" not in fields_set and c.data.get("path") is not None:
    c.data.name = None


# --- the `:arg` grammar ---


def split_items(arg: str, separators: str = ",") -> list[str]:
  """Splits at the commas (or other `separators`) that are not inside brackets or quotes
  (`partition.group_proportions=(0.5,0.5)` is one item); empty items are left out."""
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
    elif ch in separators and depth == 0:
      items.append("".join(current))
      current = []
      continue
    current.append(ch)
  items.append("".join(current))
  return [item.strip() for item in items if item.strip()]


def literal_value(raw: str) -> Any:
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
  for item in split_items(arg or ""):
    key, eq, raw = (s.strip() for s in item.partition("="))
    if key in rules:
      default, rule = rules[key]
      value = literal_value(raw) if eq else (True if rule is boolean else None)
      if not rule(value):
        raise ConfigError(f"config argument {item!r} is invalid; allowed: {_option_words(key, rule)}")
      options[key] = value
    elif eq:
      overrides[OVERRIDE_ALIASES.get(key, key)] = literal_value(raw)
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


