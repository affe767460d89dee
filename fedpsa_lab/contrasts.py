"""A sweep's declared contrasts: the effect of each, with the seed as the unit, ± its 95% interval, Holm's p.

A results sweep declares its analysis before any member runs, in the sweep config's `analysis` section
(`configs/results/shape_step.py` is the example): the unit (`seed`), the axis whose labels are the arms
(`axis`), the axes averaged within a seed (`blocks`, e.g. α), the primary endpoint and the secondary ones, and
the family of contrasts, each `[name, {arm: coefficient}]` with coefficients summing to 0. For each endpoint
the report gives:

- over all blocks at once: each contrast computed within each seed, the blocks averaged first, then a one-sample
  t-test over the seeds (`report_stats.seed_blocked`); the contrasts of the family Holm-adjusted together;
- per block: the same contrast within one block (a paired t-test over the seeds); the contrasts × blocks a second
  family, Holm-adjusted together.

With `gain_fraction` declared, the report also gives each arm's gain over the last `gain_fraction` of its run
(gain.md): how far from a plateau its endpoint was taken.

Endpoints: `tail_test_accuracy`, the mean test accuracy over the evaluations in the last `tail_fraction` of the
run's virtual horizon (from metrics.jsonl: a single evaluation on a small test set jumps by several points from
one evaluation to the next), and any summary.json field (`final_test_accuracy`, `aulc_per_day`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import pandas as pd

from fedpsa_jax import io
from fedpsa_lab import report_lib, report_stats

TAIL_ENDPOINT = "tail_test_accuracy"
ENDPOINT_NAMES = {TAIL_ENDPOINT: "mean accuracy over the last {pct:g}% of the run",
                  "final_test_accuracy": "final accuracy (one evaluation)", "aulc_per_day": "AULC per day"}


def tail_accuracy(records: list[dict[str, Any]], horizon_days: float, fraction: float) -> float:
  """The mean `test_accuracy` of the evaluations at day ≥ (1 − fraction) · horizon (NaN with none there, e.g. a
  run stopped early)."""
  start = (1.0 - fraction) * horizon_days - 1e-9 * horizon_days  # (the grid's days are sums of float steps)
  values = [r["test_accuracy"] for r in records if r.get("day", -1.0) >= start and "test_accuracy" in r]
  return float(sum(values) / len(values)) if values else math.nan


def window_accuracy(records: list[dict[str, Any]], horizon_days: float, start: float, end: float) -> float:
  """The mean `test_accuracy` of the evaluations at start · horizon ≤ day ≤ end · horizon (NaN with none)."""
  slack = 1e-9 * horizon_days  # (the grid's days are sums of float steps)
  values = [r["test_accuracy"] for r in records if "test_accuracy" in r
            and start * horizon_days - slack <= r.get("day", -1.0) <= end * horizon_days + slack]
  return float(sum(values) / len(values)) if values else math.nan


def gain(records: list[dict[str, Any]], horizon_days: float, tail_fraction: float, gain_fraction: float) -> float:
  """The rise over the last `gain_fraction` of a run: the tail endpoint (`tail_accuracy`, the last `tail_fraction`)
  minus the mean over a window as wide that ends where the last `gain_fraction` begins. Windows rather than single
  evaluations, since one evaluation on a small test set jumps by several points."""
  before = window_accuracy(records, horizon_days, 1.0 - gain_fraction - tail_fraction, 1.0 - gain_fraction)
  return tail_accuracy(records, horizon_days, tail_fraction) - before


def gain_frame(frame: pd.DataFrame, sweep: dict[str, Any]) -> pd.DataFrame:
  """One row per arm × block, and per arm over all blocks (each seed's blocks averaged first): the mean gain over
  the seeds (`gain`, × the analysis' scale) ± the half-width of its 95% t-interval, and the seeds."""
  analysis = sweep["analysis"]
  horizon, scale = sweep["base"]["sim"]["virtual_days"], analysis.get("scale", 1.0)
  gains: dict[str, dict[Any, dict[int, float]]] = {}
  for _, row in frame[frame["status"] == "completed"].iterrows():
    value = gain(io.read_metrics(row["run_dir"]), horizon, analysis["tail_fraction"], analysis["gain_fraction"])
    block = ",".join(str(row[f"label:{b}"]) for b in analysis.get("blocks", []))
    arm, seed = row[f"label:{analysis['axis']}"], int(row["label:seed"])
    gains.setdefault(arm, {}).setdefault(block, {})[seed] = value * scale
  rows = []
  for arm, by_block in gains.items():
    seeds = sorted(set.intersection(*(set(v) for v in by_block.values())))
    pooled = {"all": {s: sum(v[s] for v in by_block.values()) / len(by_block) for s in seeds}}
    for block, values in ({**by_block, **pooled} if len(by_block) > 1 else by_block).items():
      i = report_stats.interval(list(values.values()))
      rows.append({"arm": arm, "block": block, "gain": i.mean, "ci95_half_width": i.half_width, "seeds": i.n})
  return pd.DataFrame(rows)


def gain_markdown(table: pd.DataFrame, sweep: dict[str, Any], title: str) -> str:
  """gain.md: the definition, then one row per arm × block."""
  analysis = sweep["analysis"]
  tail, span = 100 * analysis["tail_fraction"], 100 * analysis["gain_fraction"]
  lines = [title, f"Each arm's gain over the last {span:g}% of its run: its mean test accuracy over the last "
           f"{tail:g}% (the primary endpoint) minus its mean over the {tail:g}% of the run that ends where the last "
           f"{span:g}% begins ({100 - span - tail:g}% to {100 - span:g}% of the run), in percentage points: the mean "
           "over the seeds ± the half-width of its 95% t-interval. A gain well above zero means the arm was still "
           "climbing when its endpoint was taken; block `all` averages a seed's blocks first.", "",
           "| arm | block | gain ± 95% CI | seeds |", "|---|---|---|---|"]
  for _, r in table.iterrows():
    half = "" if math.isnan(r.ci95_half_width) else f" ± {r.ci95_half_width:.2f}"
    lines.append(f"| {r.arm} | {r.block} | {'-' if math.isnan(r.gain) else f'{r.gain:+.2f}{half}'} | {r.seeds} |")
  return "\n".join([*lines, ""])


def endpoint_values(frame: pd.DataFrame, sweep: dict[str, Any], endpoint: str
                    ) -> dict[str, dict[Any, dict[int, float]]]:
  """{arm: {block labels: {seed: value × scale}}} of the completed members (`report_lib.load_members`' frame)."""
  analysis = sweep["analysis"]
  horizon, scale = sweep["base"]["sim"]["virtual_days"], analysis.get("scale", 1.0)
  out: dict[str, dict[Any, dict[int, float]]] = {}
  for _, row in frame[frame["status"] == "completed"].iterrows():
    if endpoint == TAIL_ENDPOINT:
      value = tail_accuracy(io.read_metrics(row["run_dir"]), horizon, analysis["tail_fraction"])
    else:
      value = float(row[endpoint])
    block = tuple(row[f"label:{b}"] for b in analysis.get("blocks", []))
    arm, seed = row[f"label:{analysis['axis']}"], int(row["label:seed"])
    out.setdefault(arm, {}).setdefault(block, {})[seed] = value * scale
  return out


def contrast_frame(frame: pd.DataFrame, sweep: dict[str, Any]) -> pd.DataFrame:
  """One row per endpoint × family × contrast (× block): estimate, half-width, seeds, p, Holm's p (over the
  row's family) and the verdict."""
  analysis = sweep["analysis"]
  rows = []
  for endpoint in [analysis["primary"], *analysis.get("secondary", [])]:
    values = endpoint_values(frame, sweep, endpoint)
    blocks = sorted({b for arm in values.values() for b in arm}, key=str)
    for name, weights in analysis["contrasts"]:
      rows.append(_row(endpoint, "all blocks", name, "all", report_stats.seed_blocked(values, weights)))
      for b in blocks if len(blocks) > 1 else []:
        only = {arm: {b: by_block[b]} for arm, by_block in values.items() if b in by_block}
        rows.append(_row(endpoint, "per block", name, ",".join(map(str, b)), report_stats.seed_blocked(only, weights)))
  out = pd.DataFrame(rows)
  if len(out):
    out["p_holm"] = out.groupby(["endpoint", "family"], sort=False)["p_value"].transform(report_stats.holm)
    out["verdict"] = [_verdict(d, p, n) for d, p, n in zip(out["difference"], out["p_holm"], out["seeds"])]
  return out


def _row(endpoint: str, family: str, name: str, block: str, d: report_stats.PairedDifference) -> dict[str, Any]:
  return {"endpoint": endpoint, "family": family, "contrast": name, "block": block, "difference": d.diff.mean,
          "ci95_half_width": d.diff.half_width, "seeds": d.diff.n, "p_value": d.p_value}


def _verdict(difference: float, p_holm: float, seeds: int) -> str:
  if seeds < 2:
    return "no complete seed yet" if seeds == 0 else "one seed: unknown"
  if not p_holm < report_stats.SIGNIFICANCE:
    return "within the noise"
  return "higher" if difference > 0 else "lower"


def _p(p: float) -> str:
  return "n/a" if math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def contrasts_markdown(table: pd.DataFrame, sweep: dict[str, Any], title: str) -> str:
  """contrasts.md: the plan as declared, then per endpoint the family over all blocks and the per-block family."""
  analysis = sweep["analysis"]
  blocks = ", ".join(analysis.get("blocks", [])) or "none"
  lines = [title, "Declared in the sweep config before the runs (its `analysis` section). Unit: the "
           f"{analysis['unit']} (members sharing one share data, partition, latencies and initial model); "
           f"blocks averaged within a seed: {blocks}. Each effect is the contrast's mean over the seeds ± the "
           "half-width of its 95% t-interval (percentage points), then the two-sided p of the one-sample t-test "
           "over the seeds, unadjusted and Holm-adjusted over the family (the contrasts of one table). The verdict "
           "reads Holm's p at 0.05.", ""]
  pct = 100 * analysis.get("tail_fraction", 0.1)
  for endpoint, part in table.groupby("endpoint", sort=False):
    role = "primary" if endpoint == analysis["primary"] else "secondary"
    lines.append(f"## {ENDPOINT_NAMES.get(endpoint, endpoint).format(pct=pct)} ({role} endpoint)\n")
    for family, rows in part.groupby("family", sort=False):
      with_block = family == "per block"
      lines.append(f"### {'Per block' if with_block else 'Over all blocks (seed means)'}\n")
      head = ["contrast", *(["block"] if with_block else []), "effect ± 95% CI", "seeds", "p (Holm)",
              "p (unadjusted)", "verdict"]
      lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
      for _, r in rows.iterrows():
        half = "" if math.isnan(r.ci95_half_width) else f" ± {r.ci95_half_width:.2f}"
        effect = "-" if math.isnan(r.difference) else f"{r.difference:+.2f}{half}"
        cells = [r.contrast, *([r.block] if with_block else []), effect, str(r.seeds),
                 _p(r.p_holm), _p(r.p_value), r.verdict]
        lines.append("| " + " | ".join(cells) + " |")
      lines.append("")
  return "\n".join(lines)


def write(frame: pd.DataFrame, sweep: dict[str, Any], out: str, title: str) -> list[str]:
  """contrasts.md and contrasts.csv into `out`, and gain.md and gain.csv where the analysis declares a
  `gain_fraction`; nothing for a sweep without an `analysis` section or whose analysis declares no contrasts (a
  tuning sweep's)."""
  analysis = sweep.get("analysis") or {}
  if not analysis.get("contrasts"):
    return []
  table = contrast_frame(frame, sweep)
  written = [report_lib.write_text(os.path.join(out, "contrasts.md"), contrasts_markdown(table, sweep, title)),
             report_lib.write_csv(table, os.path.join(out, "contrasts.csv"))]
  if analysis.get("gain_fraction"):
    gains = gain_frame(frame, sweep)
    written += [report_lib.write_text(os.path.join(out, "gain.md"), gain_markdown(gains, sweep, title)),
                report_lib.write_csv(gains, os.path.join(out, "gain.csv"))]
  return written


__all__ = ["ENDPOINT_NAMES", "TAIL_ENDPOINT", "contrast_frame", "contrasts_markdown", "endpoint_values", "gain",
           "gain_frame", "gain_markdown", "tail_accuracy", "window_accuracy", "write"]
