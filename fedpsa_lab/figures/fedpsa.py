"""FedPSA's report kinds: the paper's Fig. 5 (overheads) and Fig. 6 (κ against gradient alignment).

Two sweep layouts, registered through `REPORT_KINDS` (fedpsa_lab/figures/__init__.py) and chosen by a
sweep config's `report.kind`:
- `overhead` (configs/paper/fig5.py): `overhead.md` / `overhead.csv`, one table per accounting field of
  the members' summary.json (`OVERHEAD_METRICS`), and `overhead.png`: per dataset panel, bars of client and
  server compute seconds per method and a line of the MiB communicated (uploads + downloads);
- `alignment` (configs/paper/fig6.py): the (κ, align) pairs that FedPSA logs in events.jsonl with
  `fedpsa.log_alignment` (align = cos(g_client, g_server), Eqs. 21-22), pooled over the completed members,
  and their Sec. 6.6 statistics (with circular block bootstrap intervals, and a correlation detrended in time
  within each run): `alignment.md`, `alignment_bins.csv`, `alignment.json` and the bin plot `alignment.png`.
Both first draw what the generic 'table' kind draws (`report_lib.table_curves`).
Like every module of this package it reads run directories only: no JAX is imported.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from fedpsa_jax import io
from fedpsa_lab import report_lib, report_stats

# (summary field, scale, name) of each Fig. 5 table; bytes_communicated is added to the members by report.py.
OVERHEAD_METRICS = (("client_compute_seconds", 1.0, "client compute (s)"),
                    ("server_compute_seconds", 1.0, "server compute (s)"),
                    ("upload_bytes_per_update", 1 / 2**10, "upload per update (KiB)"),
                    ("download_bytes_per_update", 1 / 2**10, "download per update (KiB)"),
                    ("bytes_communicated", 1 / 2**20, "total communication (MiB)"))


# --- κ-alignment (Fig. 6) -----------------------------------------------------------------------------


def alignment_frame(run_dirs: Sequence[str]) -> pd.DataFrame:
  """One row per received update logged with an alignment, in each run's arrival order: `run` (the index of
  its directory in `run_dirs`), `time` (its virtual arrival time; its position in the run where the event
  lacks one), `kappa` and `alignment`."""
  rows = []
  for i, d in enumerate(run_dirs):
    updates = [e for e in io.read_events(d) if e.get("type") == "update" and "alignment" in e and "kappa" in e]
    rows += [(i, float(e.get("arrival_time", position)), float(e["kappa"]), float(e["alignment"]))
             for position, e in enumerate(updates)]
  return pd.DataFrame(rows, columns=["run", "time", "kappa", "alignment"])


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson's r of `x` and `y`, or nan for fewer than 2 points or a constant one."""
  if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return math.nan
  xc, yc = x - x.mean(), y - y.mean()
  return float(xc @ yc / math.sqrt(float(xc @ xc) * float(yc @ yc)))


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman's ρ: Pearson's r of the ranks (ties share their mean rank), nan as `_pearson`."""
  return _pearson(scipy.stats.rankdata(x), scipy.stats.rankdata(y)) if len(x) else math.nan


def _bins(kappa: np.ndarray, bin_width: float) -> tuple[np.ndarray, np.ndarray]:
  """(the non-empty bins' indices k, each update's position among them): bin k = floor(κ / w), i.e.
  [k·w, (k+1)·w); κ = 1 exactly (a cosine's maximum) joins the top bin [1 − w, 1]."""
  index = np.minimum(np.floor(kappa / bin_width).astype(int), int(round(1.0 / bin_width)) - 1)
  return np.unique(index, return_inverse=True)


def _correlations(kappa: np.ndarray, align: np.ndarray, bin_width: float) -> dict[str, float]:
  """`alignment_stats`'s four correlations, without the bin table (the bootstrap's inner step)."""
  keys, inverse = _bins(kappa, bin_width)
  centres = (keys + 0.5) * bin_width
  means = np.bincount(inverse, align) / np.bincount(inverse)
  return {"pearson": _pearson(kappa, align), "spearman": _spearman(kappa, align),
          "binned_pearson": _pearson(centres, means), "binned_spearman": _spearman(centres, means)}


def alignment_stats(kappa: np.ndarray, align: np.ndarray, bin_width: float = 0.1) -> dict[str, Any]:
  """Sec. 6.6: Pearson r and Spearman ρ of (κ, align) over the samples, and over the bins of κ
  (bin k = floor(κ / w), i.e. [k·w, (k+1)·w); κ = 1 in the top bin [1 − w, 1]) between each non-empty
  bin's centre and its mean alignment; the bins with their count, mean κ, mean alignment and the half-width of
  its 95% t-interval (`alignment_ci95`, nan for a bin of one update). A correlation needs 2+ points with
  variation; otherwise it is nan."""
  kappa, align = np.asarray(kappa, float), np.asarray(align, float)
  keys, inverse = _bins(kappa, bin_width)
  bins = []
  for i, k in enumerate(keys.tolist()):
    in_bin = inverse == i
    bins.append({"lo": round(k * bin_width, 10), "hi": round((k + 1) * bin_width, 10),
                 "centre": round((k + 0.5) * bin_width, 10), "count": int(in_bin.sum()),
                 "mean_kappa": float(kappa[in_bin].mean()), "mean_alignment": float(align[in_bin].mean()),
                 "alignment_ci95": report_stats.interval(align[in_bin]).half_width})
  return {"n": int(len(kappa)), "bin_width": bin_width, **_correlations(kappa, align, bin_width), "bins": bins}


def detrended_pearson(kappa: np.ndarray, align: np.ndarray, time: np.ndarray, run: np.ndarray) -> float:
  """Pearson r of κ and align after a straight line in the arrival `time` is removed from each, within each
  `run` (least squares): the part of the correlation that a drift both share over training (κ rising while the
  alignment falls as the model converges, say) cannot produce. For one run it is the partial correlation of κ
  and align given the time (a run of 1 or 2 updates is fitted exactly and adds nothing). nan without variation."""
  ids = np.unique(np.asarray(run), return_inverse=True)[1]
  count = np.bincount(ids)
  if not np.any(count >= 3):  # every residual zero but for rounding
    return math.nan
  per_run_mean = lambda v: (np.bincount(ids, v) / count)[ids]
  t = np.asarray(time, float) - per_run_mean(np.asarray(time, float))
  spread = np.bincount(ids, t * t)[ids]

  def residual(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y, float) - per_run_mean(np.asarray(y, float))
    slope = np.divide(np.bincount(ids, t * y)[ids], spread, out=np.zeros_like(y), where=spread > 0)
    return y - slope * t

  return _pearson(residual(kappa), residual(align))


def autocorrelations(frame: pd.DataFrame, column: str, lags: int) -> list[float]:
  """The lag-1..`lags` autocorrelation of `column` within the runs (arrival order) of `alignment_frame`'s rows,
  pooled: Σ over runs of Σ_t (x_t − x̄)(x_{t+k} − x̄) over Σ over runs of Σ_t (x_t − x̄)², x̄ each run's mean."""
  centred = [g.to_numpy(float) - g.mean() for _, g in frame.groupby("run", sort=False)[column]]
  total = sum(float(c @ c) for c in centred)
  return [sum(float(c[:-k] @ c[k:]) for c in centred if len(c) > k) / total if total > 0 else math.nan
          for k in range(1, lags + 1)]


def block_length(frame: pd.DataFrame) -> int:
  """The block bootstrap's block: the median run length to the power 1/3, rounded up (the order of block that
  Hall, Horowitz and Jing, Biometrika 1995, give for estimating the bootstrap's variance)."""
  lengths = frame.groupby("run").size()
  return max(1, math.ceil(float(np.median(lengths)) ** (1 / 3))) if len(lengths) else 1


def block_bootstrap_indices(lengths: Sequence[int], block: int, rng: np.random.Generator) -> np.ndarray:
  """Row indices of one circular block bootstrap resample (Politis and Romano 1992) of series laid end to end,
  of `lengths`: each series is rebuilt from ceil(n / block) blocks of `block` consecutive rows of its own,
  starting uniformly at random and wrapping past its end (so its first and last rows are drawn as often as the
  rest), cut to its n rows. `block=1` is the ordinary bootstrap of each series."""
  out, offset = [], 0
  for n in lengths:
    starts = rng.integers(0, n, -(-n // block))
    out.append(offset + ((starts[:, None] + np.arange(block)) % n).ravel()[:n])
    offset += n
  return np.concatenate(out) if out else np.zeros(0, int)


CORRELATIONS = ("pearson", "spearman", "binned_pearson", "binned_spearman", "detrended_pearson")
BOOTSTRAP_RESAMPLES = 2000  # of `alignment_intervals`: enough for the 2.5% / 97.5% percentiles to settle


def alignment_intervals(frame: pd.DataFrame, bin_width: float = 0.1, block: int = 1,
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict[str, list[float]]:
  """{correlation: [low, high]}: the 95% percentile-bootstrap interval of each of `CORRELATIONS`
  (`alignment_stats`'s four and `detrended_pearson`) over `alignment_frame`'s rows, from the random stream
  `seed`. Each run is resampled on its own, in blocks of `block` consecutive updates
  (`block_bootstrap_indices`), which keeps the dependence between successive updates that a pair-by-pair
  resample (`block=1`) would treat as absent; the binned correlations are re-binned each time. [nan, nan]
  where a correlation is undefined."""
  frame = frame.sort_values("run", kind="stable")
  kappa, align, time, run = (frame[c].to_numpy() for c in ("kappa", "alignment", "time", "run"))
  lengths = np.bincount(np.unique(run, return_inverse=True)[1]).tolist() if len(run) else []
  rng = np.random.default_rng(seed)
  draws = {name: [] for name in CORRELATIONS}
  for _ in range(resamples if len(frame) >= 3 else 0):
    i = block_bootstrap_indices(lengths, block, rng)
    stats = {**_correlations(kappa[i], align[i], bin_width), "detrended_pearson": detrended_pearson(
        kappa[i], align[i], time[i], run[i])}
    for name in CORRELATIONS:
      draws[name].append(stats[name])
  out = {}
  for name, values in draws.items():
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]
    out[name] = [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if len(values) else [
        math.nan, math.nan]
  return out


def alignment_summary(frame: pd.DataFrame, bin_width: float = 0.1, block: int | None = None,
                      resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
  """Everything alignment.json holds for `alignment_frame`'s rows: `alignment_stats`, `detrended_pearson`, the
  number of runs, the bootstrap's block (`block`, else `block_length`), the within-run autocorrelation of κ and
  of align at lags 1..block, and two sets of 95% intervals (`resamples` each): `intervals` resampled in blocks, and
  `independent_intervals` pair by pair (what they would be if successive updates were independent)."""
  block = block or block_length(frame)
  columns = [frame[c].to_numpy() for c in ("kappa", "alignment", "time", "run")]
  return {**alignment_stats(columns[0], columns[1], bin_width), "detrended_pearson": detrended_pearson(*columns),
          "runs": int(frame["run"].nunique()), "block_length": block,
          "autocorrelation": {c: autocorrelations(frame, c, block) for c in ("kappa", "alignment")},
          "intervals": alignment_intervals(frame, bin_width, block, resamples),
          "independent_intervals": alignment_intervals(frame, bin_width, 1, resamples)}


def alignment_markdown(stats: dict[str, Any]) -> str:
  """`alignment_summary`'s statistics as markdown: the correlations with their block-bootstrap intervals (and
  the pair-by-pair ones), the detrended Pearson r, the autocorrelations, then one row per κ bin."""
  ci, independent = stats["intervals"], stats["independent_intervals"]
  interval = lambda pair: "n/a" if math.isnan(pair[0]) else f"{pair[0]:.3f}, {pair[1]:.3f}"
  cell = lambda name: f"{stats[name]:.4f} [{interval(ci[name])}] ({interval(independent[name])})"
  lags = lambda name: ", ".join(f"{v:.2f}" for v in stats["autocorrelation"][name])
  lines = [f"{stats['n']} received updates (pairs of κ, align) from {stats['runs']} runs. In brackets: 95% "
           f"circular block bootstrap intervals (each run resampled on its own, in blocks of {stats['block_length']} "
           "consecutive updates, which keeps the dependence between successive updates); in parentheses, the "
           "intervals that would hold if the pairs were independent.", "",
           "| level | Pearson r | Spearman ρ |", "|---|---|---|",
           f"| sample | {cell('pearson')} | {cell('spearman')} |",
           f"| binned (width {stats['bin_width']}) | {cell('binned_pearson')} | {cell('binned_spearman')} |",
           f"| sample, detrended within each run | {cell('detrended_pearson')} | - |", "",
           "Detrended: a straight line in the virtual arrival time removed from κ and from align within each run, "
           "so that a drift both share over training cannot make the correlation. Autocorrelation within a run at "
           f"lags 1 to {stats['block_length']}: κ {lags('kappa')}; align {lags('alignment')}.", "",
           "| κ bin | count | mean κ | mean alignment (95% t-interval) |", "|---|---|---|---|"]
  half = lambda b: "" if math.isnan(b["alignment_ci95"]) else f" ± {b['alignment_ci95']:.4f}"
  lines += [f"| [{b['lo']:.1f}, {b['hi']:.1f}) | {b['count']} | {b['mean_kappa']:.4f} | {b['mean_alignment']:.4f}"
            f"{half(b)} |" for b in stats["bins"]]
  return "\n".join(lines) + "\n"


def alignment_figure(stats: dict[str, Any], path: str, pairs: tuple[np.ndarray, np.ndarray] | None = None) -> list[str]:
  """Fig. 6: mean alignment per κ bin (line, with its 95% t-interval over the bin's updates) and the count per bin
  (bars, second axis); with `pairs` (κ, align) also every sample, faintly."""
  bins = stats["bins"]
  fig, (ax,) = report_lib.panels(1, height=1.4 * report_lib.PANEL_HEIGHT)
  centres = [b["centre"] for b in bins]
  twin = ax.twinx()
  twin.bar(centres, [b["count"] for b in bins], width=0.8 * stats["bin_width"], alpha=0.3, color="gray",
           label="updates per bin (right axis)")
  twin.set_ylabel("updates per bin")
  twin.grid(False)
  if pairs is not None:
    ax.scatter(pairs[0], pairs[1], s=5, alpha=0.25, color=report_lib.OKABE_ITO[1], label="one update")
  ax.errorbar(centres, [b["mean_alignment"] for b in bins], yerr=[b["alignment_ci95"] for b in bins], fmt="o-",
              color=report_lib.OKABE_ITO[0], capsize=3, label="bin mean, 95% t-interval over its updates")
  ax.set_ylim(-1.05, 1.05)  # a cosine's range: a bin of 2 or 3 updates has an interval far wider
  ax.set_zorder(twin.get_zorder() + 1)  # the line over the count bars
  ax.patch.set_visible(False)
  ax.set_xlabel("κ (bin centre)")
  ax.set_ylabel(r"alignment $\cos(g_{\mathrm{client}}, g_{\mathrm{server}})$")
  ax.set_title(f"n = {stats['n']} updates: r = {stats['pearson']:.3f}, ρ = {stats['spearman']:.3f}; binned "
               f"r = {stats['binned_pearson']:.3f}, ρ = {stats['binned_spearman']:.3f}")
  report_lib.legend_below(fig)
  return report_lib.save_figure(fig, path)


def alignment_report(r: report_lib.SweepReport) -> list[str]:
  """Report kind 'alignment' (Fig. 6): the pairs of every completed member pooled, their statistics
  (`alignment_summary`; `spec.bin_width`, default 0.1, and `spec.block_length`, default `block_length`) and the
  bin plot. No pairs while members are still to finish gives alignment.md saying so (the report of a sweep in
  progress); no pairs once all have finished is an error naming the config that logs them."""
  written = report_lib.table_curves(r)
  done = report_lib.completed(r.frame)
  frame = alignment_frame(done["run_dir"].tolist())
  if frame.empty and len(done) < len(r.frame):
    state = (f"none of the {len(r.frame)} members has completed" if done.empty else
             f"{len(done)} of {len(r.frame)} members have completed, and their events.jsonl files hold none")
    note = f"No κ-alignment pairs yet: {state}. Rerun the report once the FedPSA members have finished.\n"
    return [*written, report_lib.write_text(r.path("alignment.md"), r.title + "\n" + note)]
  if frame.empty:
    raise report_lib.ReportError(f"{r.sweep_dir!r}: no κ-alignment pairs in the members' events.jsonl; allowed: a "
                                 "sweep run with fedpsa.log_alignment=True and output.events=True "
                                 "(configs/paper/fig6.py)")
  stats = alignment_summary(frame, float(r.spec.get("bin_width", 0.1)), r.spec.get("block_length"))
  written.append(report_lib.write_text(r.path("alignment.md"), r.title + "\n" + alignment_markdown(stats)))
  written.append(report_lib.write_csv(pd.DataFrame(stats["bins"]), r.path("alignment_bins.csv")))
  io.write_json_atomic(r.path("alignment.json"), stats)
  written.append(r.path("alignment.json"))
  written += alignment_figure(stats, r.path("alignment.png"), (frame["kappa"], frame["alignment"]))
  return written


# --- overheads (Fig. 5) -------------------------------------------------------------------------------


def overhead_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], path: str) -> list[str]:
  """Fig. 5: per dataset panel, bars of client and server compute seconds per method and a line of the
  MiB communicated (uploads + downloads), on a second axis."""
  methods = report_lib.axis_labels(sweep, "method", frame)
  datasets = report_lib.axis_labels(sweep, "dataset", frame)
  fig, axes = report_lib.panels(len(datasets), height=1.3 * report_lib.PANEL_HEIGHT)
  x = np.arange(len(methods))
  for ax, dataset in zip(axes, datasets):
    stat = {m: {k: report_lib.cell_stats(frame, {"method": m, "dataset": dataset}, k, s)[0]
                for k, s, _ in OVERHEAD_METRICS} for m in methods}
    ax.bar(x - 0.2, [stat[m]["client_compute_seconds"] for m in methods], 0.4, label="client compute",
           color=report_lib.OKABE_ITO[1])
    ax.bar(x + 0.2, [stat[m]["server_compute_seconds"] for m in methods], 0.4, label="server compute",
           color=report_lib.OKABE_ITO[2])
    names = [report_lib.display_name(spec, m).replace(" (Ours)", "").replace(" (Base)", "") for m in methods]
    ax.set_xticks(x, names, rotation=45, ha="right")
    ax.set_ylabel("compute (s)")
    ax.set_title(report_lib.display_name(spec, dataset))
    twin = ax.twinx()
    twin.plot(x, [stat[m]["bytes_communicated"] for m in methods], marker=".", label="communicated (right axis)",
              **report_lib.arm_style(0))
    twin.set_ylabel("communicated (MiB)")
    twin.grid(False)
  report_lib.legend_below(fig)
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
  written += overhead_figure(r.sweep, r.frame, r.spec, r.path("overhead.png"))
  return written


REPORT_KINDS = {"overhead": overhead_report, "alignment": alignment_report}

__all__ = ["BOOTSTRAP_RESAMPLES", "CORRELATIONS", "OVERHEAD_METRICS", "REPORT_KINDS", "alignment_figure",
           "alignment_frame", "alignment_intervals", "alignment_markdown", "alignment_report",
           "alignment_stats", "alignment_summary", "autocorrelations", "block_bootstrap_indices", "block_length",
           "detrended_pearson", "overhead_figure", "overhead_report"]
