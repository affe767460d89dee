"""CASA's report figure: the clusters over time.

`run_figures(run_dir, out_dir)` reads a run directory (config.json, metrics.jsonl) and, for a CASA run,
draws `casa_clusters.png` (and its PDF): on top, each client's cluster (colour) at every evaluation (x: virtual day,
y: client); below, the number of clusters and the global and personalised test accuracy. Other runs
get no figure ([]).
"""

from __future__ import annotations

import os

import numpy as np

from fedpsa_jax import io
from fedpsa_lab import report_lib


def cluster_matrix(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(days [T], assignments [N, T]) from the metrics records that carry `clusters`."""
  rows = [r for r in records if "clusters" in r]
  days = np.array([r["day"] for r in rows], dtype=np.float64)
  clusters = np.array([r["clusters"] for r in rows], dtype=np.int64).T if rows else np.zeros((0, 0), np.int64)
  return days, clusters


def run_figures(run_dir: str, out_dir: str) -> list[str]:
  """Paths of the figures drawn for the run in `run_dir` (written to `out_dir`); [] if it is not CASA."""
  if (io.read_config(run_dir) or {}).get("method") != "casa":
    return []
  records = io.read_metrics(run_dir)
  days, clusters = cluster_matrix(records)
  if clusters.size == 0:
    return []
  os.makedirs(out_dir, exist_ok=True)
  plt = report_lib.pyplot()
  import matplotlib.ticker  # (after pyplot() chose the backend)

  fig, (top, bottom) = plt.subplots(2, 1, figsize=(report_lib.FIGURE_WIDTH, 3 * report_lib.PANEL_HEIGHT),
                                    sharex=True, height_ratios=(2, 1))
  # Step edges: each evaluation's assignment holds until the next one.
  edges = np.append(days, days[-1] + (days[-1] - days[-2] if len(days) > 1 else 1e-3))
  num = int(clusters.max()) + 1
  cmap = plt.get_cmap("tab10" if num <= 10 else "tab20", max(num, 2))
  mesh = top.pcolormesh(edges, np.arange(clusters.shape[0] + 1) - 0.5, clusters, cmap=cmap, vmin=-0.5,
                        vmax=max(num, 2) - 0.5, shading="flat")
  fig.colorbar(mesh, ax=top, ticks=range(num), label="cluster")
  top.set_ylabel("client")
  top.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  top.set_title("CASA: cluster of each client over time")
  bottom.step(days, [len(set(c)) for c in clusters.T], where="post", color="k", label="clusters")
  bottom.set_ylabel("clusters")
  bottom.set_xlabel("virtual time (days)")
  acc = bottom.twinx()
  rows = [r for r in records if "clusters" in r]
  acc.plot(days, [100 * r["test_accuracy"] for r in rows], label="global test accuracy", **report_lib.arm_style(1))
  if all("personalized_accuracy" in r for r in rows):
    acc.plot(days, [100 * r["personalized_accuracy"] for r in rows], label="personalised accuracy",
             **report_lib.arm_style(2))
  acc.set_ylabel("accuracy (%)")
  acc.set_ylim(0, 100)
  acc.grid(False)
  lines = bottom.get_legend_handles_labels()[0] + acc.get_legend_handles_labels()[0]
  report_lib.legend_below(fig, handles=lines, labels=[line.get_label() for line in lines])
  return report_lib.save_figure(fig, os.path.join(out_dir, "casa_clusters.png"))
