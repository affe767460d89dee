"""A sweep's grid: one sweep config describes many full run configs, its members.

A sweep config (`configs/paper/*.py`, `get_config(arg)`) is a ConfigDict with:

- `name`: the sweep's name (also the report's title);
- `base`: the run config every member starts from (`config.base_config()` plus changes);
- `axes`: a list of `(axis_name, [(label, {dotted_field: value, ...}), ...])`: the members are the
  product of the axes, each member the base with the overrides of one label per axis applied (an axis
  value may set several fields, e.g. a dataset and its model, or an ablation's two switches);
- `exclude`: a list of `{axis_name: label}`; a member matching every item of one of them is left out
  (FedPAC on the linear model);
- `seeds`: every member is repeated once per seed (the run field `seed`);
- `report`: the layout `fedpsa_lab.report` draws (see there).

Every member is a full run config that must pass `config.validate`, and has a stable directory name made of its
labels, `method=fedpsa,dataset=cifar10,alpha=0.1,seed=0` (`member_name`). Both executors run every member's first
seed before any second one (`run_order`): a sweep stopped partway has whole seeds to report.

What `configs/` and `fedpsa_lab` import to write sweeps: this module imports no JAX (validating a member loads
the strategies, which do).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from typing import Any, Callable, Sequence

import ml_collections

from fedpsa_jax import config as config_lib
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.validation import INT64_MAX

_LABEL = re.compile(r"^[A-Za-z0-9._+-]+$")  # labels become directory names: keep them portable
# Every member is a full run (minutes to days) expanded, validated and listed in sweep.json before the first
# one starts: beyond these counts a sweep is a typo (`seeds=1e9`), refused before anything is expanded. The
# paper's largest grid (Table 1) has 120 members per seed.
MAX_SEEDS = 1_000
MAX_MEMBERS = 10_000

Axis = tuple[str, Sequence[tuple[Any, dict[str, Any]]]]


@dataclasses.dataclass(frozen=True)
class Member:
  """One run of a sweep: its labels per axis (and seed), its overrides and its full run config."""

  name: str  # directory name under SWEEP_DIR/runs, from the labels: 'method=fedpsa,alpha=0.1,seed=0'
  labels: dict[str, Any]  # axis name -> label, plus 'seed'
  overrides: dict[str, Any]  # dotted field -> value, applied to the sweep's base (seed included)
  config: ml_collections.ConfigDict

  def as_json(self) -> dict[str, Any]:
    return {"name": self.name, "labels": self.labels, "overrides": self.overrides}


def axis(name: str, values: Sequence[Any], field: str | None = None,
         extra: Callable[[Any], dict[str, Any]] | None = None) -> Axis:
  """An axis whose labels are `values`, each setting `field` (default: `name`) to the value, plus the
  fields `extra(value)` returns (e.g. the model that goes with a dataset)."""
  return (name, [(v, {field or name: v, **(extra(v) if extra else {})}) for v in values])


def is_sweep_config(c: Any) -> bool:
  return isinstance(c, ml_collections.ConfigDict) and all(k in c for k in ("name", "base", "axes", "seeds"))


def member_name(labels: dict[str, Any]) -> str:
  return ",".join(f"{k}={v}" for k, v in labels.items())


def expand(sweep: ml_collections.ConfigDict) -> list[Member]:
  """The members of a sweep, in axis order (the last axis fastest, seeds innermost), each validated.

  Raises ConfigError naming the member and field when a member's config is invalid, a label cannot
  be a directory name, or two members would share a directory.
  """
  if not is_sweep_config(sweep):
    raise ConfigError("a sweep config needs the fields name, base, axes, seeds (see fedpsa_jax/sweep/grid.py)")
  axes = [(str(name), list(values)) for name, values in sweep.axes]
  # `parts`: a union of grids, [(part_label, more_axes), ...]; each part is the product of `axes` and its
  # own axes, labelled `part=<label>` (Fig. 4: the γ×δ grid beside the L_s×L_q grid).
  parts = [(label, [("part", [(label, {})]), *axes, *[(str(n), list(v)) for n, v in more]])
           for label, more in sweep.get("parts", [])] or [(None, axes)]
  excludes = [dict(e) for e in sweep.get("exclude", [])]
  seeds = sweep.seeds
  if (not isinstance(seeds, (list, tuple)) or not 1 <= len(seeds) <= MAX_SEEDS
      or not all(isinstance(s, int) and 0 <= s <= INT64_MAX for s in seeds)):
    shown = seeds if not isinstance(seeds, (list, tuple)) or len(seeds) <= 10 else f"[{len(seeds)} seeds]"
    raise ConfigError(f"sweep seeds={shown!r} is invalid; allowed: a list of 1 to {MAX_SEEDS:,} integers in "
                      f"[0, {INT64_MAX}]")
  seeds = list(seeds)
  count = sum(math.prod(len(values) for _, values in part_axes) for _, part_axes in parts) * len(seeds)
  if count > MAX_MEMBERS:  # (before the members are expanded; excluded ones counted too)
    raise ConfigError(f"sweep {sweep.name!r} has {count:,} members ({len(seeds)} seeds); allowed: at most "
                      f"{MAX_MEMBERS:,} (fewer seeds or axis values, or several sweeps)")
  members, names = [], set()
  combos = [(part_axes, combo) for _, part_axes in parts
            for combo in itertools.product(*(values for _, values in part_axes))]
  for axes, combo in combos:
    labels = {name: label for (name, _), (label, _) in zip(axes, combo)}
    if any(all(labels.get(k) == v for k, v in e.items()) for e in excludes):
      continue
    for seed in seeds:
      overrides: dict[str, Any] = {}
      for _, fields in combo:
        overrides.update(fields)
      overrides["seed"] = seed
      full_labels = {**labels, "seed": seed}
      name = member_name(full_labels)
      bad = [str(v) for v in full_labels.values() if not _LABEL.match(str(v))]
      if bad:
        raise ConfigError(f"sweep {sweep.name!r}: label(s) {bad} cannot be part of a directory name; "
                                     "allowed: letters, digits and . _ + -")
      if name in names:
        raise ConfigError(f"sweep {sweep.name!r}: two members are both named {name!r}")
      names.add(name)
      config = copy.deepcopy(sweep.base)
      try:
        config_lib.set_fields(config, overrides)
      except ConfigError as err:
        raise ConfigError(f"sweep {sweep.name!r}, member {name}: {err}") from None
      errors = config_lib.config_errors(config)
      if errors:
        raise ConfigError(f"sweep {sweep.name!r}, member {name}: invalid config:\n  " + "\n  ".join(errors))
      members.append(Member(name, full_labels, overrides, config))
  return members


def run_order(members: Sequence[Member]) -> list[Member]:
  """The order a sweep runs its members in: every member's first seed before any second one (axis order within a
  seed), so that a sweep stopped partway holds whole seeds of every member, a table with an interval over the
  seeds done, rather than all seeds of the first members and nothing of the rest."""
  position = {seed: i for i, seed in enumerate(dict.fromkeys(m.labels["seed"] for m in members))}
  return sorted(members, key=lambda m: position[m.labels["seed"]])
