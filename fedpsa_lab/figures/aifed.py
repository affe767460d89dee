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


MAX_LEGEND_RUNS = 8  # more runs than this: one legend entry per method, its runs in one colour


def _method(run_dir: str) -> str:
  """`method`, with AiFed's variant and LIR kind."""
  summary, config = io.read_summary(run_dir) or {}, io.read_config(run_dir) or {}
  method = summary.get("method") or config.get("method") or "?"
  if method == "aifed" and isinstance(config.get("aifed"), dict):
    method = f"aifed[{config['aifed'].get('variant')}/{config['aifed'].get('lir')}]"
  return method


def _label(run_dir: str) -> str:
  """`_method`, then the directory name to tell repeats apart."""
  return f"{_method(run_dir)} ({os.path.basename(os.path.normpath(run_dir))})"


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
  fig, ax = plt.subplots(figsize=(8.4, 4.2))
  # A few runs: a line and a legend entry each. A sweep's many: one colour and one entry per method (its seeds
  # and settings as thin lines), so that the legend stays short; it stands beside the axes, never over the data.
  by_method = len(run_dirs) > MAX_LEGEND_RUNS
  colours: dict[str, str] = {}
  for run_dir in run_dirs:
    mb, acc = accuracy_vs_upload(run_dir)
    if not by_method:
      ax.plot(mb, acc, marker=".", label=_label(run_dir))
      continue
    method = _method(run_dir)
    first = method not in colours
    colours.setdefault(method, f"C{len(colours) % 10}")
    ax.plot(mb, acc, color=colours[method], linewidth=0.8, alpha=0.6, label=method if first else None)
  ax.set_xlabel("accumulated upload cost_a (MiB)")
  ax.set_ylabel("test accuracy")
  ax.set_ylim(0.0, 1.0)
  ax.set_title(f"Accuracy vs communication ({len(run_dirs)} run{'s' if len(run_dirs) != 1 else ''})")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
  return [report_lib.save_figure(fig, os.path.join(out_dir, "accuracy_vs_upload.png"))]
