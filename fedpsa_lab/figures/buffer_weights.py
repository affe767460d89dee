"""How each buffering method weighs its buffer: the weights a flush gave its B updates, from metrics.jsonl.

A method that logs `weights` at an evaluation (the last flush's, one per buffered update: FedBuff's
server_lr · s(τ) / B, FedPSA's softmax of κ / Temp of Eq. 19, AiFed's) is summarised per run by
`weight_spread`: the total Σw (the server's step as a fraction of the buffer's plain mean), and the shape of
the weighting, B · w / Σw, whose heaviest and lightest entries are 1 for a plain mean. Runs that also log
`temperature` and `kappa` (FedPSA) add Temp's range and the spread of κ in the buffer, which together set
how far from uniform the softmax can go. `group_figures` writes `buffer_weights.md` / `.csv` for a sweep:
one row per completed run and one per method label (the mean of its runs). Reads run directories only: no JAX.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pandas as pd

from fedpsa_jax import io
from fedpsa_lab import report_lib

COLUMNS = (("flushes", "flushes logged", 0), ("step", "Σw", 3), ("heaviest", "heaviest B·w/Σw", 3),
           ("lightest", "lightest B·w/Σw", 3), ("temperature_min", "Temp min", 2), ("temperature_max", "Temp max", 2),
           ("kappa_spread", "κ spread", 3))


def _method(run_dir: str, name: str) -> str:
  """A sweep member's `method` label (its directory name, `sweep.member_name`: a sweep may run one method under
  several labels, e.g. FedPSA with uniform weights), else the run's config `method`."""
  labels = dict(part.split("=", 1) for part in name.split(",") if "=" in part)
  return labels.get("method") or (io.read_config(run_dir) or {}).get("method", "?")


def weight_spread(run_dir: str) -> dict[str, Any] | None:
  """Over the flushes logged in `run_dir`'s metrics.jsonl (the last one before each evaluation): the mean
  total weight Σw, the mean of B·max(w)/Σw and of B·min(w)/Σw, and, where logged, Temp's range and the mean of
  max(κ) − min(κ) in the buffer. None for a run that logged no weights."""
  logged = [r for r in io.read_metrics(run_dir) if r.get("weights")]
  if not logged:
    return None
  weights = [np.asarray(r["weights"], float) for r in logged]
  shapes = [len(w) * w / w.sum() for w in weights]
  temps = [float(r["temperature"]) for r in logged if r.get("temperature") is not None]
  kappas = [np.asarray(r["kappa"], float) for r in logged if r.get("kappa")]
  name = os.path.basename(os.path.normpath(run_dir))
  return {"run": name, "method": _method(run_dir, name),
          "flushes": len(logged), "step": float(np.mean([w.sum() for w in weights])),
          "heaviest": float(np.mean([s.max() for s in shapes])), "lightest": float(np.mean([s.min() for s in shapes])),
          "temperature_min": min(temps, default=math.nan), "temperature_max": max(temps, default=math.nan),
          "kappa_spread": float(np.mean([k.max() - k.min() for k in kappas])) if kappas else math.nan}


def _markdown(frame: pd.DataFrame, first: str) -> str:
  """`frame`'s rows as a markdown table: `first`, then `COLUMNS` (n/a where a value is missing)."""
  num = lambda v, d: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"
  lines = ["| " + " | ".join([first, *(name for _, name, _ in COLUMNS)]) + " |",
           "|" + "---|" * (len(COLUMNS) + 1)]
  lines += ["| " + " | ".join([str(row[first]), *(num(row[key], d) for key, _, d in COLUMNS)]) + " |"
            for _, row in frame.iterrows()]
  return "\n".join(lines) + "\n"


def group_figures(run_dirs: list[str], out_dir: str, report: report_lib.SweepReport | None = None) -> list[str]:
  """`buffer_weights.md` / `buffer_weights.csv`: `weight_spread` of every completed run among `run_dirs` that
  logs weights (a run still going would mix a part of its course into the means), and the mean per method;
  nothing when there is none. (Per run and per `method` label, whatever the layout of `report`.)"""
  done = [d for d in sorted(run_dirs) if (io.read_summary(d) or {}).get("status") == "completed"]
  rows = [row for row in map(weight_spread, done) if row is not None]
  if not rows:
    return []
  runs = pd.DataFrame(rows)
  methods = runs.drop(columns="run").groupby("method", sort=True).mean().reset_index()
  text = ("# How each buffering method weighs its buffer\n\n"
          "Σw is the server's step as a fraction of the buffer's plain mean; B·w/Σw is the weighting's shape, 1 "
          "for every update of a plain mean. From the last flush before each evaluation (metrics.jsonl), averaged "
          "over the evaluations; Temp and κ where the method logs them (FedPSA, Eq. 19: w = softmax(κ / Temp)).\n\n"
          "## Per method (mean of its runs)\n\n" + _markdown(methods, "method") +
          "\n## Per run\n\n" + _markdown(runs, "run"))
  return [report_lib.write_text(os.path.join(out_dir, "buffer_weights.md"), text),
          report_lib.write_csv(runs.set_index("run"), os.path.join(out_dir, "buffer_weights.csv"))]
