"""AiFed's figure (the paper's Figs. 7-8): test accuracy against accumulated uploaded communication.

`group_figures(run_dirs, out_dir)` reads each run directory's `metrics.jsonl` (one record per evaluation,
with the cumulative `bytes_uploaded`) and `summary.json` (`method`, and `aifed.variant` from
`config.json` when present) and draws one line per run: x = accumulated upload in MiB (cost_a, Eq. 17),
y = test accuracy. It works for any set of runs of any method. The matplotlib backend is Agg (files only).
"""

from __future__ import annotations

import os

from fedpsa_jax import io
from fedpsa_lab import report_lib


def _label(run_dir: str) -> str:
  """`method` (with AiFed's variant and LIR kind), then the directory name to tell repeats apart."""
  summary, config = io.read_summary(run_dir) or {}, io.read_config(run_dir) or {}
  method = summary.get("method") or config.get("method") or "?"
  if method == "aifed" and "aifed" in config:
    method = f"aifed[{config['aifed'].get('variant')}/{config['aifed'].get('lir')}]"
  return f"{method} ({os.path.basename(os.path.normpath(run_dir))})"


def accuracy_vs_upload(run_dir: str) -> tuple[list[float], list[float]]:
  """(accumulated upload in MiB, test accuracy) at each evaluation of one run."""
  records = io.read_metrics(run_dir)
  return ([r.get("bytes_uploaded", 0) / 2 ** 20 for r in records], [r["test_accuracy"] for r in records])


def group_figures(run_dirs: list[str], out_dir: str) -> list[str]:
  """Accuracy against accumulated uploaded MiB for `run_dirs`, one PNG in `out_dir`; returns its path (none
  without a run: an empty figure would say nothing)."""
  if not run_dirs:
    return []
  plt = report_lib.pyplot()
  os.makedirs(out_dir, exist_ok=True)
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for run_dir in run_dirs:
    mb, acc = accuracy_vs_upload(run_dir)
    ax.plot(mb, acc, marker=".", label=_label(run_dir))
  ax.set_xlabel("accumulated upload cost_a (MiB)")
  ax.set_ylabel("test accuracy")
  ax.set_title("Accuracy vs communication")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return [report_lib.save_figure(fig, os.path.join(out_dir, "accuracy_vs_upload.png"))]
