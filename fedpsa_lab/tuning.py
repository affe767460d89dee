"""A tuning sweep's selection: each shape's server step, chosen on tuning seeds by a rule declared before the runs.

A tuning sweep (`configs/results/step_tuning.py`) declares in its `analysis.selection` section the arms it tunes,
`[[arm label, shape, effective step]]`, the grid it starts from, the ladder (the factor between neighbouring
steps) and how many rungs a shape may grow past either end of the grid. The rule, applied per shape:

1. the score of a step is the primary endpoint (`analysis.primary`, × `analysis.scale`) averaged over every
   (tuning seed, block) cell of that arm, each cell weighted equally (the tuning seeds and both α, say);
2. a step with a diverged member, or with a member not yet finished, has no score; a shape is *complete* when
   every step it has declared has all its cells, and only a complete shape is selected;
3. the step with the highest score is selected; exactly equal scores go to the smaller step;
4. if the selected step is the largest (smallest) the shape has run and fewer than `max_extensions` rungs
   have been added on that side, the shape is *extended*: the next rung, step × ladder (step / ladder), must
   be run before anything is selected (`Choice.extend`); a shape at its last allowed rung is selected there
   and flagged `at_edge` (its best step may lie beyond).

`choices(frame, sweep)` applies it; `selected_steps(records_dir)` reads a tuning sweep's records and returns the
chosen {shape: step}, refusing while any shape is incomplete or must still be extended: the confirmation
config (`configs/results/tuned.py`) is built from it. `write` puts the scores and the choices in
`report/tuning.md` and `tuning.csv`. `mean_flush_sum` measures a buffer's mean Σw from the runs' round events,
the figure that converts FedBuff's server step η into its effective step η × Σw. `SHAPES` are the three shapes the
tuning and the confirmation sweeps run, with the η each needs for a given effective step.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from fedpsa_jax import io
from fedpsa_lab import contrasts, report_lib

SELECTION_KEY = "selection"
# FedBuff's mean Σw per flush on the embedded MNIST job (`mean_flush_sum` over shape_step's 16 FedBuff records;
# held to them by tests/test_tuning.py).
FEDBUFF_MEAN_STEP = 0.6556


@dataclasses.dataclass(frozen=True)
class Shape:
  """A buffer shape: a method as it is (its own weights), with only its server step η varied."""

  fields: dict[str, Any]  # the method and the fields that make this shape
  eta_field: str  # the field of its server step η
  mean_flush_sum: float  # its mean Σw per flush on the job: effective step = η × this

  def eta(self, step: float) -> float:
    """The η of effective step `step`: the step itself where Σw is 1, else rounded to 4 decimals."""
    return step if self.mean_flush_sum == 1.0 else round(step / self.mean_flush_sum, 4)

  def fields_at(self, step: float) -> dict[str, Any]:
    """The config fields of this shape at effective step `step`."""
    return {**self.fields, self.eta_field: self.eta(step)}


# shape -> Shape (docs/methods.md, "Shape and step"): the staleness discount, the uniform buffer, κ-softmax.
SHAPES = {
    "fedbuff": Shape({"method": "fedbuff"}, "fedbuff.server_lr", FEDBUFF_MEAN_STEP),
    "uniform": Shape({"method": "fedbuff", "fedbuff.weighting": "uniform", "fedbuff.step": "unit"},
                     "fedbuff.server_lr", 1.0),
    "fedpsa": Shape({"method": "fedpsa"}, "fedpsa.server_lr", 1.0),
}


@dataclasses.dataclass(frozen=True)
class Choice:
  """One shape's outcome: the selected step and arm, or the rung to run next (`extend`), or nothing yet."""

  shape: str
  step: float | None  # the selected effective step (None: not selectable yet)
  arm: str | None  # its arm label
  extend: float | None  # the next rung to run before selecting (None: no extension owed)
  complete: bool  # every declared step of the shape has all its cells
  at_edge: bool  # selected at the last rung allowed on that side: the best may lie beyond

  @property
  def status(self) -> str:
    if not self.complete:
      return "incomplete"
    if self.extend is not None:
      return f"extend to {self.extend:g}"
    return f"selected {self.step:g}" + (" (at the last allowed rung)" if self.at_edge else "")


def selection_arms(sweep: dict[str, Any]) -> list[tuple[str, str, float]]:
  """(arm label, shape, effective step) of every arm the sweep's `analysis.selection` declares."""
  return [(str(a), str(s), float(e)) for a, s, e in sweep["analysis"][SELECTION_KEY]["arms"]]


def scores(frame: pd.DataFrame, sweep: dict[str, Any]) -> pd.DataFrame:
  """One row per declared arm: shape, step, the score (rule 1), its cells, how many of the declared cells that is,
  the SD over the cells and whether any member diverged."""
  analysis = sweep["analysis"]
  values = contrasts.endpoint_values(frame, sweep, analysis["primary"])
  blocks = analysis.get("blocks", [])
  expected = len(sweep["seeds"]) * math.prod(
      len(vals) for name, vals in sweep["axes"] if name in blocks)
  axis = analysis["axis"]
  diverged = set(frame.loc[frame["status"] == "diverged", f"label:{axis}"]) if len(frame) else set()
  rows = []
  for arm, shape, step in selection_arms(sweep):
    cells = [v for by_seed in values.get(arm, {}).values() for v in by_seed.values()]
    finite = [v for v in cells if not math.isnan(v)]
    rows.append({"arm": arm, "shape": shape, "step": step, "cells": len(finite), "cells_declared": expected,
                 "score": float(np.mean(finite)) if finite else math.nan,
                 "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else math.nan,
                 "diverged": arm in diverged})
  return pd.DataFrame(rows)


def _choice(shape: str, rows: pd.DataFrame, selection: dict[str, Any]) -> Choice:
  grid, ladder, cap = [float(e) for e in selection["grid"]], float(selection["ladder"]), int(selection["max_extensions"])
  complete = bool(((rows["cells"] == rows["cells_declared"]) | rows["diverged"]).all())
  if not complete:
    return Choice(shape, None, None, None, False, False)
  usable = rows[~rows["diverged"]].sort_values("step")
  if usable.empty:
    return Choice(shape, None, None, None, True, False)
  best = usable.loc[usable["score"] == usable["score"].max()].iloc[0]  # (sorted by step: a tie goes to the smaller)
  steps = sorted(rows["step"])
  above, below = sum(e > max(grid) for e in steps), sum(e < min(grid) for e in steps)
  step = float(best["step"])
  if step == steps[-1]:
    if above < cap:
      return Choice(shape, None, None, step * ladder, True, False)
    return Choice(shape, step, str(best["arm"]), None, True, True)
  if step == steps[0]:
    if below < cap:
      return Choice(shape, None, None, step / ladder, True, False)
    return Choice(shape, step, str(best["arm"]), None, True, True)
  return Choice(shape, step, str(best["arm"]), None, True, False)


def choices(frame: pd.DataFrame, sweep: dict[str, Any]) -> dict[str, Choice]:
  """{shape: Choice} by the declared rule (module docstring), in the order the shapes are declared."""
  table, selection = scores(frame, sweep), sweep["analysis"][SELECTION_KEY]
  shapes = list(dict.fromkeys(table["shape"]))
  return {s: _choice(s, table[table["shape"] == s], selection) for s in shapes}


class SelectionPending(ValueError):
  """The tuning records do not select a step for every shape yet (a shape incomplete or owed an extension)."""


def selected_steps(records_dir: str) -> dict[str, tuple[float, bool]]:
  """{shape: (selected effective step, at_edge)} from a tuning sweep's records directory; SelectionPending naming
  each shape that has no selection yet and why."""
  sweep, frame = report_lib.load_members(records_dir)
  out, pending = {}, []
  for shape, c in choices(frame, sweep).items():
    if c.step is None:
      pending.append(f"{shape}: {c.status}")
    else:
      out[shape] = (c.step, c.at_edge)
  if pending:
    raise SelectionPending(f"{records_dir!r} selects no step yet for " + "; ".join(pending))
  return out


def tuning_markdown(table: pd.DataFrame, picked: dict[str, Choice], sweep: dict[str, Any], title: str) -> str:
  analysis = sweep["analysis"]
  selection = analysis[SELECTION_KEY]
  endpoint = contrasts.ENDPOINT_NAMES.get(analysis["primary"], analysis["primary"]).format(
      pct=100 * analysis.get("tail_fraction", 0.1))
  lines = [title, f"Declared in the sweep config before the runs (`analysis.selection`): each shape's score at a "
           f"step is the {endpoint} (%) averaged over every (seed, {', '.join(analysis.get('blocks', []))}) cell "
           f"of the tuning seeds {', '.join(map(str, sweep['seeds']))}; the highest score is selected (an exact "
           "tie goes to the smaller step; a step with a diverged member is never selected); a best step at the "
           f"edge of what a shape has run is extended by one rung (× or ÷ {float(selection['ladder']):g}), at most "
           f"{int(selection['max_extensions'])} rungs past the grid "
           f"{', '.join(f'{float(e):g}' for e in selection['grid'])} on either side.", "",
           "| shape | effective step | arm | score (%) | SD over cells | cells |", "|---|---|---|---|---|---|"]
  for _, r in table.iterrows():
    chosen = picked[r["shape"]].arm == r["arm"]
    score = "diverged" if r["diverged"] else ("-" if math.isnan(r["score"]) else f"{r['score']:.2f}")
    score = f"**{score}**" if chosen else score
    sd = "-" if math.isnan(r["sd"]) else f"{r['sd']:.2f}"
    lines.append(f"| {r['shape']} | {r['step']:g} | {r['arm']} | {score} | {sd} | {r['cells']}/{r['cells_declared']} |")
  lines += ["", "| shape | outcome |", "|---|---|"]
  lines += [f"| {shape} | {c.status} |" for shape, c in picked.items()]
  return "\n".join(lines) + "\n"


def write(frame: pd.DataFrame, sweep: dict[str, Any], out: str, title: str) -> list[str]:
  """tuning.md and tuning.csv into `out`; nothing for a sweep that declares no selection."""
  if SELECTION_KEY not in (sweep.get("analysis") or {}):
    return []
  table, picked = scores(frame, sweep), choices(frame, sweep)
  table["outcome"] = [picked[s].status if picked[s].arm in (None, a) else "" for s, a in zip(table["shape"], table["arm"])]
  return [report_lib.write_text(os.path.join(out, "tuning.md"), tuning_markdown(table, picked, sweep, title)),
          report_lib.write_csv(table, os.path.join(out, "tuning.csv"))]


def flush_sums(run_dir: str) -> list[float]:
  """Σ_i w_i of every flush of a run, from its events.jsonl round records (their `weights`)."""
  sums = []
  for event in io.read_events(run_dir):
    if event.get("type") == "round" and event.get("weights"):
      sums.append(float(math.fsum(event["weights"])))
  return sums


def mean_flush_sum(run_dirs: Iterable[str]) -> float:
  """The mean over runs of each run's mean Σw per flush (each run weighted equally): a buffer's mean effective
  step at η = 1."""
  means = [float(np.mean(s)) for s in (flush_sums(d) for d in run_dirs) if s]
  if not means:
    raise ValueError("no flush weights in these runs' events (output.events=True records them)")
  return float(np.mean(means))


def grid_labels(shape: str, steps: Sequence[float]) -> list[str]:
  """The arm labels of a shape's steps, `<shape>_x<step>` with the step's point written `p` (`fedpsa_x2p25`: a label
  is a directory name and a key of the report's display names, which hold no dots)."""
  return [f"{shape}_x{e:g}".replace(".", "p") for e in steps]


__all__ = ["Choice", "FEDBUFF_MEAN_STEP", "SELECTION_KEY", "SHAPES", "SelectionPending", "Shape", "choices", "flush_sums", "grid_labels",
           "mean_flush_sum", "scores", "selected_steps", "selection_arms", "tuning_markdown", "write"]
