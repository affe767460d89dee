"""AiFed's figure (the paper's Figs. 7-8): test accuracy against accumulated uploaded communication.

`group_figures(run_dirs, out_dir, report)` reads each run directory's `metrics.jsonl` (one record per evaluation,
with the cumulative `bytes_uploaded`) and draws `accuracy_vs_upload.png` (and its PDF): x = accumulated upload in
MiB (cost_a, Eq. 17), y = test accuracy (%), one line per arm, the mean over its runs with its 95% t-interval as a
band (`report_lib.curves_figure`). A sweep's members (`report`) follow its curves' layout: its arms, panels and
printed names; any other set of runs (or a sweep without curves) is one arm per method (AiFed per variant and LIR
kind). It works for any
method's runs. The matplotlib backend is Agg (files only).
"""

from __future__ import annotations

import os

import pandas as pd

from fedpsa_jax import io
from fedpsa_lab import report_lib


def _method(run_dir: str) -> tuple[str, str]:
  """(`method`, with AiFed's variant and LIR kind; its printed name)."""
  summary, config = io.read_summary(run_dir) or {}, io.read_config(run_dir) or {}
  method = summary.get("method") or config.get("method") or "?"
  name = report_lib.RUN_NAMES.get(method, method)
  if method == "aifed" and isinstance(config.get("aifed"), dict):
    variant, lir = config["aifed"].get("variant"), config["aifed"].get("lir")
    return f"aifed[{variant}/{lir}]", f"{name} ({variant}, LIR {lir})"
  return method, name


def accuracy_vs_upload(run_dir: str) -> tuple[list[float], list[float]]:
  """(accumulated upload in MiB, test accuracy) at each evaluation of one run."""
  records = io.read_metrics(run_dir)
  return ([r.get("bytes_uploaded", 0) / 2 ** 20 for r in records], [r["test_accuracy"] for r in records])


def group_figures(run_dirs: list[str], out_dir: str, report: report_lib.SweepReport | None = None) -> list[str]:
  """Accuracy against accumulated uploaded MiB for `run_dirs` (module docstring) into `out_dir`; the paths written
  (none without a run: an empty figure would say nothing)."""
  if not run_dirs:
    return []
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "accuracy_vs_upload.png")
  layout = report_lib.curve_layout(report.spec) if report is not None else None
  if layout is not None:
    return report_lib.curves_figure(report.sweep, report.frame, report.spec, *layout, path, x="bytes_uploaded")
  methods = [_method(d) for d in run_dirs]
  frame = pd.DataFrame({"run_dir": run_dirs, "status": "completed", "label:method": [m for m, _ in methods]})
  return report_lib.curves_figure({"axes": [("method", [(m, {}) for m in dict(methods)])]}, frame,
                                  {"display": dict(methods)}, [], "method", path, x="bytes_uploaded")
