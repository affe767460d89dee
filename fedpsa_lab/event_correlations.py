"""Partial correlations between per-update quantities of events.jsonl, with intervals that resample whole runs.

FedPSA's claim is that κ measures *behavioural* staleness, not time: κ should agree with how well an update's
gradient aligns with the global model's (Eq. 22, `fedpsa.log_alignment`) beyond what the update's staleness τ and
size already say. A report layout asks for it with `report.partial_correlations`, a list of entries

  {"x": "kappa", "y": "alignment", "given": ["staleness", "log:delta_sq_norm"], "where": {"method": ["fedpsa"]},
   "resamples": 2000}

(`log:FIELD`: the field's natural logarithm; `where`: the members whose events count, by axis labels). For each
entry and each member group of `where` the report gives Pearson's r of x and y, and their partial correlation given
the `given` fields and a separate intercept per run (what a run shares: its data, its clients, its trajectory),
each with a 95% percentile interval from a bootstrap over runs (`report_stats.cluster_bootstrap`): the updates of
one run are not independent, its runs are. Beside them, the partial correlation computed within each run alone
(given the same fields and the run's intercept) and averaged over the runs on Fisher's z scale, with the t-interval
over the runs and the one-sample t-test's p, unadjusted and Holm-adjusted over the table's rows
(`report_stats.mean_correlation`): the run (a seed) is the unit, as in every other test of the reports, and with a
handful of runs this interval is the honest one, where a bootstrap that can draw only those few runs is too narrow.
Written as `partial_correlations.md` / `.csv`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pandas as pd

from fedpsa_jax import io
from fedpsa_lab import report_lib, report_stats

BOOTSTRAP_SEED = 0  # the intervals are reproducible, byte for byte


def _column(events: list[dict[str, Any]], name: str) -> np.ndarray:
  field = name.removeprefix("log:")
  values = np.array([float(e[field]) for e in events], float)
  return np.log(values) if name.startswith("log:") else values


def run_updates(run_dir: str, fields: list[str]) -> dict[str, np.ndarray] | None:
  """{field: [n]} over the run's update events that hold every field (`log:` fields positive); None with none."""
  bare = [f.removeprefix("log:") for f in fields]
  events = [e for e in io.read_events(run_dir) if e.get("type") == "update" and all(
      isinstance(e.get(b), (int, float)) and (not f.startswith("log:") or e[b] > 0) for f, b in zip(fields, bare))]
  return {f: _column(events, f) for f in fields} if events else None


def _statistics(runs: list[dict[str, np.ndarray]], x: str, y: str, given: list[str]) -> tuple[float, float]:
  joined = {k: np.concatenate([r[k] for r in runs]) for k in runs[0]}
  groups = np.concatenate([np.full(len(r[x]), i) for i, r in enumerate(runs)])
  covariates = np.column_stack([joined[g] for g in given]) if given else np.zeros((len(groups), 0))
  if len(joined[x]) < len(given) + len(runs) + 2 or np.ptp(joined[x]) == 0 or np.ptp(joined[y]) == 0:
    return math.nan, math.nan
  return (float(np.corrcoef(joined[x], joined[y])[0, 1]),
          report_stats.partial_correlation(joined[x], joined[y], covariates, groups))


def _run_partial(run: dict[str, np.ndarray], x: str, y: str, given: list[str]) -> float:
  """The partial correlation of x and y given `given` (and an intercept) within one run; NaN when too short."""
  return _statistics([run], x, y, given)[1]


def correlation_frame(frame: pd.DataFrame, entries: list[dict[str, Any]]) -> pd.DataFrame:
  """One row per entry × member group: x, y, given, the group, runs, updates, r and the partial r with their
  bootstrap intervals, and the per-run partial r's mean, t-interval and p (unadjusted, and Holm over the rows)."""
  rows = []
  for entry in entries:
    x, y, given = entry["x"], entry["y"], list(entry.get("given", []))
    where = {axis: list(labels) for axis, labels in dict(entry.get("where", {})).items()}
    done = frame[frame["status"] == "completed"]
    for axis, labels in where.items():
      done = done[done[f"label:{axis}"].isin(labels)]
    key_axes = list(where)
    for key, members in (done.groupby([f"label:{a}" for a in key_axes], sort=False) if key_axes else [((), done)]):
      runs = [r for r in (run_updates(d, [x, y, *given]) for d in members["run_dir"]) if r is not None]
      if not runs:
        continue
      r, partial = _statistics(runs, x, y, given)
      boot = report_stats.cluster_bootstrap(runs, lambda chosen: _statistics(chosen, x, y, given),
                                            int(entry.get("resamples", 2000)), BOOTSTRAP_SEED)
      low, high = (np.nanpercentile(boot, [2.5, 97.5], axis=0) if len(runs) > 1
                   else np.full((2, 2), math.nan))
      per_run = [v for v in (_run_partial(run, x, y, given) for run in runs) if not math.isnan(v)]
      over_runs = report_stats.mean_correlation(per_run)
      group = ",".join(f"{a}={v}" for a, v in zip(key_axes, key if isinstance(key, tuple) else (key,)))
      rows.append({"x": x, "y": y, "given": " + ".join(given) or "-", "group": group or "all", "runs": len(runs),
                   "updates": int(sum(len(u[x]) for u in runs)), "r": r, "r_low": low[0], "r_high": high[0],
                   "partial_r": partial, "partial_low": low[1], "partial_high": high[1],
                   "run_partial_r": over_runs.r, "run_partial_low": over_runs.low,
                   "run_partial_high": over_runs.high, "run_partial_p": over_runs.p_value})
  table = pd.DataFrame(rows)
  if not table.empty:
    table["run_partial_p_holm"] = report_stats.holm(table["run_partial_p"].to_numpy())
  return table


def correlations_markdown(table: pd.DataFrame, title: str) -> str:
  lines = [title, "Pearson's r over every update of the group's runs, and the partial correlation given the listed "
           "fields and an intercept per run; [a, b]: the 95% percentile interval of a bootstrap that resamples whole "
           f"runs (seeded, {BOOTSTRAP_SEED}). Per run: the partial correlation within each run, averaged over the runs "
           "on Fisher's z scale, with the 95% t-interval over the runs and the two-sided p of the t-test of a zero "
           "mean, unadjusted and Holm-adjusted over this table's rows. The run is the unit of these, and the verdict "
           "reads their Holm p at 0.05: with few runs the bootstrap, which can draw only those runs, is too narrow.",
           "", "| x | y | given | group | runs | updates | r [95%] | partial r [95%] | per run: partial r [95%] "
           "| p (Holm) | p (unadjusted) | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  fmt = lambda v, lo, hi: "n/a" if math.isnan(v) else f"{v:+.3f}" + ("" if math.isnan(lo) else f" [{lo:+.3f}, {hi:+.3f}]")
  p_fmt = lambda p: "n/a" if math.isnan(p) else f"{p:.3f}"
  verdict = lambda r: ("n/a" if math.isnan(r.run_partial_p_holm) else "within the noise"
                       if r.run_partial_p_holm >= report_stats.SIGNIFICANCE else
                       "positive" if r.run_partial_r > 0 else "negative")
  for _, r in table.iterrows():
    lines.append(f"| {r.x} | {r.y} | {r.given} | {r.group} | {r.runs} | {r.updates} | {fmt(r.r, r.r_low, r.r_high)} "
                 f"| {fmt(r.partial_r, r.partial_low, r.partial_high)} "
                 f"| {fmt(r.run_partial_r, r.run_partial_low, r.run_partial_high)} | {p_fmt(r.run_partial_p_holm)} "
                 f"| {p_fmt(r.run_partial_p)} | {verdict(r)} |")
  return "\n".join(lines) + "\n"


def write(frame: pd.DataFrame, spec: dict[str, Any], out: str, title: str) -> list[str]:
  """partial_correlations.md / .csv for a layout with `partial_correlations`; nothing otherwise, or while no
  member has the events."""
  entries = spec.get("partial_correlations") or []
  table = correlation_frame(frame, entries) if entries else pd.DataFrame()
  if table.empty:
    return []
  return [report_lib.write_text(os.path.join(out, "partial_correlations.md"), correlations_markdown(table, title)),
          report_lib.write_csv(table, os.path.join(out, "partial_correlations.csv"))]


__all__ = ["BOOTSTRAP_SEED", "correlation_frame", "correlations_markdown", "run_updates", "write"]
