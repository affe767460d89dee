"""`--sweep`: a grid sweep from the command line over any run config, built as a sweep config file builds one.

  launch.py --mode=sweep --config=configs/default.py --sweep="method=fedbuff,fedpsa seed=0:3 alpha=0.1,1.0"

The grammar (docs/runs.md, "Sweeps from the command line"): axes separated by spaces (in one `--sweep` or over
several), each `field=values`. `field` is a dotted config field or a short name (`alpha`, `dataset`, `model`,
`num_clients`, `virtual_days`, `concurrency`). `values` are separated by commas, each read as after a config
file's colon (`config.parse_arg`: a Python literal, else text; brackets and quotes keep a comma or a space inside
one value), or `a:b` (`a:b:step`): the integers of Python's `range(a, b[, step])`, `b` left out. Each value
becomes the field's type (an int for a float field becomes a float) or is refused.

The axis named `seed` gives the sweep's seeds (every member once per seed, the seed named last, as in every
sweep); without one, the run config's own seed. The other axes are the sweep's axes in the order given (the last
varying fastest), each named as typed and labelled by its values: `method=fedbuff,alpha=0.1,seed=0`, the
member names of a sweep config file with the same axes (`sweep.axis`). `grid_sweep` returns that sweep config
(name, base, axes, seeds, report) for the sweep mode to run like any other, after `sweep.expand` has validated
every member: a bad grid (an unknown field, an empty axis, a value of the wrong type or one the config's
validation refuses) is one ConfigError line naming the axis, before any member runs.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any, Sequence

import ml_collections

from fedpsa_jax import cli, sweep
from fedpsa_jax import config as config_lib
from fedpsa_jax.cli import run_name
from fedpsa_jax.validation import MISSING, get_field

SEED = "seed"  # the axis that gives the sweep's seeds
SUFFIX = "-sweep"  # a grid's name and default workdir: runs/<config>[-<arg>]-sweep
ALLOWED = ("allowed: space-separated axes field=v1,v2,... or field=a:b (the integers a to b-1), field a dotted "
           "config field or a short name, e.g. --sweep='method=fedbuff,fedpsa seed=0:3 alpha=0.1,1.0'")
_RANGE = re.compile(r"([+-]?\d+):([+-]?\d+)(?::([+-]?\d+))?")


@dataclasses.dataclass(frozen=True)
class GridAxis:
  """One axis of `--sweep` as parsed: its name as typed, its values (ranges expanded) and its text."""

  name: str
  values: list[Any]
  text: str  # `name=values` as typed, for messages


def parse(texts: Sequence[str]) -> list[GridAxis]:
  """The axes of `--sweep` flags' texts, in order, each value a Python literal or text (`config.literal_value`)
  and each range its integers; not yet checked against a config (`typed_axes`). ConfigError naming the item for
  text that is no axis, an axis without values, and an empty range."""
  grid = []
  for item in (item for text in texts for item in config_lib.split_items(text, separators=" \t\n")):
    name, eq, raw = (part.strip() for part in item.partition("="))
    if not eq or not name:
      raise config_lib.ConfigError(f"--sweep item {item!r} is not an axis; {ALLOWED}")
    values = [value for piece in config_lib.split_items(raw) for value in _values(item, piece)]
    if not values:
      raise config_lib.ConfigError(f"--sweep axis {item!r} has no values; {ALLOWED}")
    grid.append(GridAxis(name, values, item))
  if not grid:
    raise config_lib.ConfigError(f"--sweep names no axis; {ALLOWED}")
  return grid


def _values(item: str, text: str) -> list[Any]:
  """The values one comma-separated piece of an axis stands for: a range's integers, else one literal."""
  match = _RANGE.fullmatch(text)
  if match is None:
    return [config_lib.literal_value(text)]
  start, stop, step = int(match[1]), int(match[2]), int(match[3] or 1)
  if step == 0:
    raise config_lib.ConfigError(f"--sweep axis {item!r}: the range {text} has step 0; allowed: a:b or a:b:step "
                                 "with a step other than 0")
  values = range(start, stop, step)
  if not values or len(values) > sweep.MAX_MEMBERS:  # (len of a range: counted, not made)
    raise config_lib.ConfigError(
        f"--sweep axis {item!r}: the range {text} holds {len(values):,} values; allowed: 1 to "
        f"{sweep.MAX_MEMBERS:,} (a:b is the integers a to b-1, as Python's range: a < b)")
  return list(values)


def typed_axes(base: ml_collections.ConfigDict, grid: Sequence[GridAxis]) -> tuple[list[sweep.Axis], list[int] | None]:
  """(the sweep's axes, its seeds or None without a seed axis) of `grid` over the run config `base`: each value
  set on a copy of `base` as the field's type (`config.set_fields`), each axis one field. ConfigError naming the
  axis for an unknown field, a section, a field two axes set, a value of another type, a value given twice."""
  axes, seeds, owner = [], None, {}
  for name, values, item in ((a.name, a.values, a.text) for a in grid):
    field = config_lib.OVERRIDE_ALIASES.get(name, name)
    default = get_field(base, field)
    if default is MISSING:
      raise config_lib.ConfigError(f"--sweep axis {item!r}: {config_lib.unknown_field(base, field)}")
    if isinstance(default, ml_collections.ConfigDict):
      raise config_lib.ConfigError(f"--sweep axis {item!r}: {field!r} is a section of the config, not a field; "
                                   f"allowed: one of its fields, e.g. {field}.{next(iter(default.keys()))}")
    if field in owner:
      raise config_lib.ConfigError(f"--sweep axes {owner[field]!r} and {item!r} both set {field}; allowed: one "
                                   "axis per field")
    owner[field] = item
    trial, typed = copy.deepcopy(base), []
    for value in values:
      try:
        config_lib.set_fields(trial, {field: value})
      except config_lib.ConfigError as err:
        raise config_lib.ConfigError(f"--sweep axis {item!r}: {err}") from None
      typed.append(get_field(trial, field))
    repeated = next((value for i, value in enumerate(typed) if value in typed[:i]), MISSING)
    if repeated is not MISSING:
      raise config_lib.ConfigError(f"--sweep axis {item!r} gives {field}={repeated!r} twice; allowed: distinct "
                                   "values")
    if field == SEED:
      seeds = typed
    else:
      axes.append(sweep.axis(name, typed, field))
  return axes, seeds


def grid_sweep(base: ml_collections.ConfigDict, texts: Sequence[str], config_path: str) -> ml_collections.ConfigDict:
  """The sweep config of `--sweep` (`texts`, the flags' values) over the run config `base` loaded from
  `config_path` (`FILE[:arg]`, which names the sweep `<config>[-<arg>]-sweep`), every member validated
  (`sweep.expand`); ConfigError in one line for a bad grid. A table in its report: rows the axes but the last,
  columns the last axis (final accuracy in %, mean and interval over the seeds)."""
  if sweep.is_sweep_config(base):
    raise config_lib.ConfigError(
        f"--sweep needs a run config, but --config={config_path!r} is a sweep config (it has its own axes); "
        "allowed: --sweep with a run config such as configs/default.py, or that sweep config without --sweep")
  axes, seeds = typed_axes(base, parse(texts))
  names = [name for name, _ in axes]
  shown = " ".join(texts)
  c = ml_collections.ConfigDict()
  c.name = run_name.RunName.of(config_path).stem + SUFFIX
  c.description = f"the grid {shown} over {config_path}"
  c.base = copy.deepcopy(base)
  c.axes = axes
  c.parts = []
  c.exclude = []
  c.seeds = seeds if seeds is not None else [base.seed]
  c.report = ml_collections.ConfigDict({
      "kind": "table", "rows": names[:-1] or names, "cols": names[-1:] if len(names) > 1 else [],
      "metric": "final_test_accuracy", "scale": 100.0, "decimals": 2, "best": "max"})
  try:
    sweep.expand(c)  # (every member validated now, in one line; the sweep mode expands it again to run it)
  except config_lib.ConfigError as err:
    raise config_lib.ConfigError(f"--sweep={shown!r}: {cli.one_line(str(err))}") from None
  return c


def workdir(config_path: str) -> str:
  """A grid's default sweep directory, runs/<config>[-<arg>]-sweep: the same command resumes it, and a grid
  widened over the same config (more seeds, another value) reruns none of the members already done there."""
  return run_name.sweep_workdir(config_path) + SUFFIX
