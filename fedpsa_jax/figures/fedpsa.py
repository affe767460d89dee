"""FedPSA's report kinds: the paper's Fig. 5 (overheads) and Fig. 6 (κ against gradient alignment).

Two sweep layouts, registered through `REPORT_KINDS` (fedpsa_jax/figures/__init__.py) and chosen by a
sweep config's `report.kind`:
- `overhead` (configs/paper/fig5.py): `overhead.md` / `overhead.csv`, one table per accounting field of
  the members' summary.json (`OVERHEAD_METRICS`), and `overhead.png`: per dataset panel, bars of client and
  server compute seconds per method and a line of the MiB communicated (uploads + downloads);
- `alignment` (configs/paper/fig6.py): the (κ, align) pairs that FedPSA logs in events.jsonl with
  `fedpsa.log_alignment` (align = cos(g_client, g_server), Eqs. 21-22), pooled over the completed members,
  and their Sec. 6.6 statistics: `alignment.md`, `alignment_bins.csv`, `alignment.json` and the bin plot
  `alignment.png`.
Both first draw what the generic 'table' kind draws (`report_lib.table_curves`).
Like every module of this package it reads run directories only: no JAX is imported.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from fedpsa_jax import io, report_lib

# (summary field, scale, name) of each Fig. 5 table; bytes_communicated is added to the members by report.py.
OVERHEAD_METRICS = (("client_compute_seconds", 1.0, "client compute (s)"),
                    ("server_compute_seconds", 1.0, "server compute (s)"),
                    ("upload_bytes_per_update", 1 / 2**10, "upload per update (KiB)"),
                    ("download_bytes_per_update", 1 / 2**10, "download per update (KiB)"),
                    ("bytes_communicated", 1 / 2**20, "total communication (MiB)"))


# --- κ-alignment (Fig. 6) -----------------------------------------------------------------------------


def alignment_pairs(run_dirs: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """(κ, align) of every received update logged with an alignment in the runs' events.jsonl."""
  kappa, align = [], []
  for d in run_dirs:
    for e in io.read_events(d):
      if e.get("type") == "update" and "alignment" in e and "kappa" in e:
        kappa.append(float(e["kappa"]))
        align.append(float(e["alignment"]))
  return np.asarray(kappa), np.asarray(align)


def alignment_stats(kappa: np.ndarray, align: np.ndarray, bin_width: float = 0.1) -> dict[str, Any]:
  """Sec. 6.6: Pearson r and Spearman ρ of (κ, align) over the samples, and over the bins of κ
  (bin k = floor(κ / w), i.e. [k·w, (k+1)·w); κ = 1 in the top bin [1 − w, 1]) between each non-empty
  bin's centre and its mean alignment; the bins with their count, mean κ and mean alignment. A correlation
  needs 2+ points with variation; otherwise it is nan."""
  kappa, align = np.asarray(kappa, float), np.asarray(align, float)
  top = int(round(1.0 / bin_width)) - 1  # κ = 1 exactly (a cosine's maximum) belongs to the top bin [1 - w, 1]
  index = np.minimum(np.floor(kappa / bin_width).astype(int), top)
  bins = []
  for k in sorted(set(index.tolist())):
    sel = index == k
    bins.append({"lo": round(k * bin_width, 10), "hi": round((k + 1) * bin_width, 10),
                 "centre": round((k + 0.5) * bin_width, 10), "count": int(sel.sum()),
                 "mean_kappa": float(kappa[sel].mean()), "mean_alignment": float(align[sel].mean())})
  centres = np.array([b["centre"] for b in bins])
  means = np.array([b["mean_alignment"] for b in bins])

  def corr(fn, x, y) -> float:
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
      return math.nan
    return float(fn(x, y)[0])

  return {"n": int(len(kappa)), "bin_width": bin_width,
          "pearson": corr(scipy.stats.pearsonr, kappa, align), "spearman": corr(scipy.stats.spearmanr, kappa, align),
          "binned_pearson": corr(scipy.stats.pearsonr, centres, means),
          "binned_spearman": corr(scipy.stats.spearmanr, centres, means), "bins": bins}


CORRELATIONS = ("pearson", "spearman", "binned_pearson", "binned_spearman")
BOOTSTRAP_RESAMPLES = 2000  # of `alignment_intervals`: enough for the 2.5% / 97.5% percentiles to settle


def alignment_intervals(kappa: np.ndarray, align: np.ndarray, bin_width: float = 0.1,
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict[str, list[float]]:
  """{correlation: [low, high]}: the 95% percentile-bootstrap interval of each of `alignment_stats`'s four
  correlations, resampling the (κ, align) pairs with replacement (and re-binning for the binned ones) from the
  random stream `seed`. It treats the pairs as independent, which consecutive updates of one run are not
  quite: the intervals are a lower bound on the uncertainty. [nan, nan] where a correlation is undefined."""
  kappa, align = np.asarray(kappa, float), np.asarray(align, float)
  rng = np.random.default_rng(seed)
  draws = {name: [] for name in CORRELATIONS}
  for _ in range(resamples if len(kappa) >= 3 else 0):
    idx = rng.integers(0, len(kappa), len(kappa))
    stats = alignment_stats(kappa[idx], align[idx], bin_width)
    for name in CORRELATIONS:
      draws[name].append(stats[name])
  out = {}
  for name, values in draws.items():
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]
    out[name] = [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if len(values) else [
        math.nan, math.nan]
  return out


def alignment_markdown(stats: dict[str, Any]) -> str:
  """The statistics of `alignment_stats` as markdown: the correlations (with their bootstrap intervals when
  `stats` has `intervals`), then one row per κ bin."""
  ci = stats.get("intervals")
  cell = lambda name: f"{stats[name]:.4f}" + (f" [{ci[name][0]:.3f}, {ci[name][1]:.3f}]" if ci else "")
  lines = [f"{stats['n']} received updates (pairs of κ, align)."
           + (" In brackets: 95% bootstrap intervals over the pairs (assumed independent)." if ci else ""), "",
           "| level | Pearson r | Spearman ρ |", "|---|---|---|",
           f"| sample | {cell('pearson')} | {cell('spearman')} |",
           f"| binned (width {stats['bin_width']}) | {cell('binned_pearson')} | {cell('binned_spearman')} |",
           "", "| κ bin | count | mean κ | mean alignment |", "|---|---|---|---|"]
  lines += [f"| [{b['lo']:.1f}, {b['hi']:.1f}) | {b['count']} | {b['mean_kappa']:.4f} | {b['mean_alignment']:.4f} |"
            for b in stats["bins"]]
  return "\n".join(lines) + "\n"


def alignment_figure(stats: dict[str, Any], path: str, pairs: tuple[np.ndarray, np.ndarray] | None = None) -> str:
  """Fig. 6: mean alignment per κ bin (line) and the count per bin (bars, second axis); with `pairs`
  (κ, align) also every sample, faintly."""
  plt = report_lib.pyplot()
  bins = stats["bins"]
  fig, ax = plt.subplots(figsize=(6, 3.8))
  centres = [b["centre"] for b in bins]
  twin = ax.twinx()
  twin.bar(centres, [b["count"] for b in bins], width=0.8 * stats["bin_width"], alpha=0.3, color="gray")
  twin.set_ylabel("count")
  if pairs is not None:
    ax.scatter(pairs[0], pairs[1], s=6, alpha=0.25, color="C1", label="updates")
  ax.plot(centres, [b["mean_alignment"] for b in bins], "o-", color="C0", label="bin mean")
  ax.set_zorder(twin.get_zorder() + 1)  # the line over the count bars
  ax.patch.set_visible(False)
  ax.set_xlabel("κ (bin centre)")
  ax.set_ylabel("mean alignment cos(g_client, g_server)")
  ax.set_title(f"n={stats['n']}: r={stats['pearson']:.3f}, ρ={stats['spearman']:.3f}; binned "
               f"r={stats['binned_pearson']:.3f}, ρ={stats['binned_spearman']:.3f}", fontsize=9)
  ax.grid(True, alpha=0.3)
  return report_lib.save_figure(fig, path)


def alignment_report(r: report_lib.SweepReport) -> list[str]:
  """Report kind 'alignment' (Fig. 6): the pairs of every completed member pooled, their statistics
  (`spec.bin_width`, default 0.1) with bootstrap intervals (`alignment_intervals`) and the bin plot. No pairs
  while members are still to finish gives alignment.md saying so (the report of a sweep in progress); no pairs
  once all have finished is an error naming the config that logs them."""
  written = report_lib.table_curves(r)
  done = report_lib.completed(r.frame)
  kappa, align = alignment_pairs(done["run_dir"].tolist())
  if len(kappa) == 0 and len(done) < len(r.frame):
    note = (f"No κ-alignment pairs yet: {len(done)} of {len(r.frame)} members have completed, and their "
            "events.jsonl files hold none. Rerun the report once the FedPSA members have finished.\n")
    return [*written, report_lib.write_text(r.path("alignment.md"), r.title + "\n" + note)]
  if len(kappa) == 0:
    raise report_lib.ReportError(f"{r.sweep_dir!r}: no κ-alignment pairs in the members' events.jsonl; allowed: a "
                                 "sweep run with fedpsa.log_alignment=True and output.events=True "
                                 "(configs/paper/fig6.py)")
  bin_width = float(r.spec.get("bin_width", 0.1))
  stats = {**alignment_stats(kappa, align, bin_width), "intervals": alignment_intervals(kappa, align, bin_width)}
  written.append(report_lib.write_text(r.path("alignment.md"), r.title + "\n" + alignment_markdown(stats)))
  written.append(report_lib.write_csv(pd.DataFrame(stats["bins"]), r.path("alignment_bins.csv")))
  io.write_json_atomic(r.path("alignment.json"), stats)
  written.append(r.path("alignment.json"))
  written.append(alignment_figure(stats, r.path("alignment.png"), (kappa, align)))
  return written


# --- overheads (Fig. 5) -------------------------------------------------------------------------------


def overhead_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], path: str) -> str:
  """Fig. 5: per dataset panel, bars of client and server compute seconds per method and a line of the
  MiB communicated (uploads + downloads), on a second axis."""
  plt = report_lib.pyplot()
  methods = report_lib.axis_labels(sweep, "method", frame)
  datasets = report_lib.axis_labels(sweep, "dataset", frame)
  fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.6), squeeze=False)
  x = np.arange(len(methods))
  for ax, dataset in zip(axes.flat, datasets):
    stat = {m: {k: report_lib.cell_stats(frame, {"method": m, "dataset": dataset}, k, s)[0]
                for k, s, _ in OVERHEAD_METRICS} for m in methods}
    ax.bar(x - 0.2, [stat[m]["client_compute_seconds"] for m in methods], 0.4, label="client compute (s)")
    ax.bar(x + 0.2, [stat[m]["server_compute_seconds"] for m in methods], 0.4, label="server compute (s)")
    names = [report_lib.display_name(spec, m).replace(" (Ours)", "").replace(" (Base)", "") for m in methods]
    ax.set_xticks(x, names, rotation=45, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title(report_lib.display_name(spec, dataset))
    twin = ax.twinx()
    twin.plot(x, [stat[m]["bytes_communicated"] for m in methods], "k.-", label="communication (MiB)")
    twin.set_ylabel("MiB communicated")
  handles = axes.flat[0].get_legend_handles_labels()
  axes.flat[0].legend(handles[0] + [plt.Line2D([], [], color="k", marker=".")],
                      handles[1] + ["communication (MiB)"], fontsize=7)
  return report_lib.save_figure(fig, path)


def overhead_report(r: report_lib.SweepReport) -> list[str]:
  """Report kind 'overhead' (Fig. 5): one table per `OVERHEAD_METRICS` field in the sweep's rows × cols
  layout (overhead.md, and their means side by side in overhead.csv), and the figure."""
  written = report_lib.table_curves(r)
  sections, tables = [r.title], []
  for metric, scale, name in OVERHEAD_METRICS:
    table = report_lib.paper_table(r.sweep, r.frame, {**r.spec, "metric": metric, "scale": scale, "decimals": 3})
    sections.append(f"## {name}\n\n{table.markdown}")
    tables.append(table.means.add_prefix(f"{metric}:"))
  written.append(report_lib.write_text(r.path("overhead.md"), "\n".join(sections)))
  written.append(report_lib.write_csv(pd.concat(tables, axis=1), r.path("overhead.csv")))
  written.append(overhead_figure(r.sweep, r.frame, r.spec, r.path("overhead.png")))
  return written


REPORT_KINDS = {"overhead": overhead_report, "alignment": alignment_report}

__all__ = ["BOOTSTRAP_RESAMPLES", "CORRELATIONS", "OVERHEAD_METRICS", "REPORT_KINDS", "alignment_figure",
           "alignment_intervals", "alignment_markdown", "alignment_pairs",
           "alignment_report", "alignment_stats", "overhead_figure", "overhead_report"]
