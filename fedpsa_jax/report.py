"""Reports: the paper's tables (markdown and CSV) and figures (PNG) from a sweep or a single run directory.

`build(workdir)` looks at what `workdir` is:
- a sweep directory (`sweep.json`, written by `fedpsa_jax.sweep`): reads every member's summary.json
  (and metrics.jsonl / events.jsonl where a figure needs them) and draws the layout of the sweep config's
  `report` section into `WORKDIR/report/`:
  - always `members.csv` (one row per member: its labels and every summary field), the table
    `table.md` / `table.csv` (rows × columns of `report.rows` / `report.cols`, cells the metric × scale,
    mean ± std over seeds when there are several, `table_std.csv` then too; the best of each column in bold
    within each group of the outer row axis; '-' for a member the sweep leaves out) and `curves.png`
    (learning curves: one panel per column, one line per row, mean over seeds);
  - `kind='curves'`: `curves.png` laid out as `report.panels` × lines `report.lines` instead;
  - `kind='heatmap'`: one `heatmap_<part>.png` and `heatmap_<part>.md` per `report.heatmaps` entry;
  - `kind='overhead'`: `overhead.png` (bars: client and server compute seconds; line: MB communicated,
    per method, one panel per dataset) and `overhead.md` / `overhead.csv`;
  - `kind='alignment'`: the κ-alignment statistics `alignment.md` / `alignment_bins.csv` and the bin plot
    `alignment.png` (pairs pooled over members from events.jsonl);
  - then the figure plug-ins (`fedpsa_jax.figures`): `run_figures` per member into
    `report/runs/<member>/`, `group_figures` over all members into `report/`.
- a run directory (`metrics.jsonl`): its learning curve `report/learning_curve.png` and the plug-ins'
  `run_figures`.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Sequence

import numpy as np
import pandas as pd
import scipy.stats

from fedpsa_jax import figures, io
from fedpsa_jax import sweep as sweep_lib

REPORT_DIR = "report"
MISSING = "-"  # a cell the sweep leaves out (FedPAC on the linear model), as the paper prints it
NOT_RUN = "n/a"  # a cell whose member has no completed run yet


class ReportError(ValueError):
  """The report cannot be made: not a sweep or run directory, or a layout naming an unknown axis."""


# --- reading ------------------------------------------------------------------------------------------


def load_members(sweep_dir: str) -> tuple[dict[str, Any], pd.DataFrame]:
  """(sweep.json's sweep config, one row per member: `member`, `run_dir`, its labels, its summary fields).

  A member without summary.json has status 'missing'; a member not completed keeps its fields but its
  metrics are not used in tables (see `cell_stats`)."""
  saved = sweep_lib.read_sweep_json(sweep_dir)
  rows = []
  for m in saved["members"]:
    run_dir = sweep_lib.member_dir(sweep_dir, m["name"])
    summary = io.read_summary(run_dir) or {"status": "missing"}
    rows.append({"member": m["name"], "run_dir": run_dir, **{f"label:{k}": v for k, v in m["labels"].items()},
                 **{k: v for k, v in summary.items() if not isinstance(v, (dict, list))}})
  return saved["sweep"], pd.DataFrame(rows)


def _ordered(values: Sequence[Any]) -> list[Any]:
  """Unique values in order of first appearance (the sweep's axis order, not sorted)."""
  return list(dict.fromkeys(values))


def _axis_labels(sweep: dict[str, Any], name: str, frame: pd.DataFrame) -> list[Any]:
  """The labels of axis `name` in the sweep config's order (all of them, excluded ones included)."""
  for axis_name, values in list(sweep["axes"]) + [a for _, more in sweep.get("parts", []) for a in more]:
    if axis_name == name:
      return _ordered([label for label, _ in values])
  column = f"label:{name}"
  if column not in frame:
    raise ReportError(f"report layout names the axis {name!r}, which the sweep does not have; allowed: "
                      f"{', '.join(c[6:] for c in frame.columns if c.startswith('label:'))}")
  return _ordered(frame[column].tolist())


def _completed(frame: pd.DataFrame) -> pd.DataFrame:
  return frame[frame["status"] == "completed"] if "status" in frame else frame.iloc[:0]


# --- tables -------------------------------------------------------------------------------------------


def cell_stats(frame: pd.DataFrame, where: dict[str, Any], metric: str, scale: float) -> tuple[float, float, int]:
  """(mean, std over seeds (0 for one), count) of `metric × scale` over the completed members matching
  `where` ({axis: label}); (nan, nan, 0) when there is none."""
  rows = _completed(frame)
  for k, v in where.items():
    rows = rows[rows[f"label:{k}"] == v]
  if metric not in rows or rows.empty:
    return math.nan, math.nan, 0
  values = rows[metric].astype(float).to_numpy() * scale
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0, len(values)


def _display(spec: dict[str, Any], value: Any) -> str:
  return str(spec.get("display", {}).get(str(value), value))


def _key_text(spec: dict[str, Any], axes: Sequence[str], key: Sequence[Any]) -> str:
  """'CIFAR-10 α=0.1' for key (cifar10, 0.1) of axes (dataset, alpha): numbers carry their axis name."""
  parts = []
  for name, value in zip(axes, key):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      parts.append(f"{_display(spec, name)}={value}")
    else:
      parts.append(_display(spec, value))
  return " ".join(parts)


def _is_excluded(sweep: dict[str, Any], labels: dict[str, Any]) -> bool:
  return any(all(labels.get(k) == v for k, v in e.items()) for e in sweep.get("exclude", []))


def paper_table(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any],
                where: dict[str, Any] | None = None) -> tuple[str, pd.DataFrame, pd.DataFrame]:
  """(markdown, means, stds) of the layout `spec` (rows, cols, metric, scale, decimals, best, row_mean,
  delta) over the members matching `where`. The frames have one row per row key and one column per
  column key (CSV layout; row labels as the leading columns)."""
  rows, cols = list(spec.get("rows", [])), list(spec.get("cols", []))
  where = dict(where or {})
  metric, scale, decimals = spec.get("metric", "final_test_accuracy"), float(spec.get("scale", 1.0)), int(
      spec.get("decimals", 2))
  row_keys = [tuple(k) for k in _product([_axis_labels(sweep, r, frame) for r in rows])]
  col_keys = [tuple(k) for k in _product([_axis_labels(sweep, c, frame) for c in cols])]
  means = np.full((len(row_keys), len(col_keys)), np.nan)
  stds = np.full_like(means, np.nan)
  counts = np.zeros(means.shape, int)
  excluded = np.zeros(means.shape, bool)
  for i, rk in enumerate(row_keys):
    for j, ck in enumerate(col_keys):
      labels = {**where, **dict(zip(rows, rk)), **dict(zip(cols, ck))}
      excluded[i, j] = _is_excluded(sweep, labels)
      means[i, j], stds[i, j], counts[i, j] = cell_stats(frame, labels, metric, scale)
  col_names = [_key_text(spec, cols, ck) or metric for ck in col_keys]
  extra_means, extra_names = [], []
  if spec.get("row_mean"):
    extra_means.append(np.nanmean(np.where(counts > 0, means, np.nan), axis=1) if means.size else means[:, :0])
    extra_names.append("Avg")
  delta = list(spec.get("delta", []))
  if delta:
    a = [j for j, ck in enumerate(col_keys) if ck[-1] == delta[0]]
    b = [j for j, ck in enumerate(col_keys) if ck[-1] == delta[1]]
    for ja, jb in zip(a, b):
      extra_means.append(means[:, ja] - means[:, jb])
      extra_names.append(f"{_display(spec, delta[0])} − {_display(spec, delta[1])}" + (
          f" ({_key_text(spec, cols[:-1], col_keys[ja][:-1])})" if len(cols) > 1 else ""))
  all_means = np.column_stack([means, *extra_means]) if extra_means else means
  all_stds = np.column_stack([stds, *[np.full(len(row_keys), np.nan) for _ in extra_means]]) if extra_means else stds
  names = col_names + extra_names
  bold = np.zeros(all_means.shape, bool)
  best = spec.get("best", "max")
  if best in ("max", "min"):
    groups = _ordered([rk[0] for rk in row_keys]) if len(rows) > 1 else [None]
    for g in groups:
      idx = [i for i, rk in enumerate(row_keys) if g is None or rk[0] == g]
      for j in range(all_means.shape[1]):
        column = all_means[idx, j]
        if np.all(np.isnan(column)):
          continue
        target = np.nanmax(column) if best == "max" else np.nanmin(column)
        bold[idx, j] = np.isclose(column, target) & ~np.isnan(column)
  multi_seed = counts.max(initial=0) > 1

  def fmt(i: int, j: int) -> str:
    if j < len(col_keys) and excluded[i, j]:
      return MISSING
    m = all_means[i, j]
    if np.isnan(m):
      return NOT_RUN
    text = f"{m:.{decimals}f}" + (f" ± {all_stds[i, j]:.{decimals}f}" if multi_seed and not np.isnan(all_stds[i, j])
                                  else "")
    return f"**{text}**" if bold[i, j] else text

  header = [_display(spec, r) for r in rows] + names
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for i, rk in enumerate(row_keys):
    lines.append("| " + " | ".join([_display(spec, v) if not isinstance(v, float) else str(v) for v in rk]
                                    + [fmt(i, j) for j in range(len(names))]) + " |")
  index = pd.MultiIndex.from_tuples(row_keys, names=rows) if rows else None
  mean_frame = pd.DataFrame(all_means, index=index, columns=names)
  std_frame = pd.DataFrame(all_stds, index=index, columns=names)
  return "\n".join(lines) + "\n", mean_frame, std_frame


def _product(lists: Sequence[Sequence[Any]]) -> list[tuple]:
  return list(itertools.product(*lists))


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
  bin's centre and its mean alignment; the bins with their count, mean κ and mean alignment. A correlation needs 2+ points with
  variation; otherwise it is nan."""
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


# --- figures ------------------------------------------------------------------------------------------


_pyplot = figures.pyplot  # (the one place the backend is chosen)


def _mean_curve(run_dirs: Sequence[str], y: str = "test_accuracy") -> tuple[np.ndarray, np.ndarray] | None:
  """(days, mean of `y` over the runs) on the days every run logged (the evaluation grid)."""
  frames = []
  for d in run_dirs:
    records = io.read_metrics(d)
    if records:
      frames.append(pd.DataFrame(records).set_index("day")[y].astype(float))
  if not frames:
    return None
  joined = pd.concat(frames, axis=1, join="inner").sort_index()
  return joined.index.to_numpy(), joined.mean(axis=1).to_numpy()


def curves_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], panels: Sequence[str],
                  lines: str, path: str) -> str | None:
  """Learning curves: one panel per combination of `panels`, one line per label of `lines` (mean over
  seeds of test accuracy against virtual days). None when no member has metrics."""
  plt = _pyplot()
  done = _completed(frame)
  if done.empty:
    return None
  keys = _product([_axis_labels(sweep, p, frame) for p in panels])
  ncols = min(len(keys), 3)
  nrows = math.ceil(len(keys) / ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(4.5 * ncols, 3.3 * nrows), squeeze=False)
  for ax, key in zip(axes.flat, keys):
    for label in _axis_labels(sweep, lines, frame):
      sel = done
      for k, v in {**dict(zip(panels, key)), lines: label}.items():
        sel = sel[sel[f"label:{k}"] == v]
      curve = _mean_curve(sel["run_dir"].tolist())
      if curve is not None:
        ax.plot(curve[0], 100 * curve[1], label=_display(spec, label))
    ax.set_title(_key_text(spec, panels, key) or sweep.get("name", ""))
    ax.set_xlabel("virtual day")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis("off")
  if axes.flat[0].get_legend_handles_labels()[0]:
    axes.flat[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def heatmap_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], part: str, row: str, col: str,
                   path: str) -> str:
  """The metric over a 2-D grid (rows: labels of `row`, columns: labels of `col`) of sweep part `part`."""
  plt = _pyplot()
  sub = frame[frame["label:part"] == part] if "label:part" in frame else frame
  rows, cols = _ordered(sub[f"label:{row}"].tolist()), _ordered(sub[f"label:{col}"].tolist())
  scale = float(spec.get("scale", 1.0))
  grid = np.array([[cell_stats(sub, {row: r, col: c}, spec.get("metric", "final_test_accuracy"), scale)[0]
                    for c in cols] for r in rows])
  fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 2.5, 0.8 * len(rows) + 1.8))
  image = ax.imshow(grid, cmap="viridis", aspect="auto")
  middle = np.nanmean([np.nanmin(grid), np.nanmax(grid)]) if np.isfinite(grid).any() else 0.0
  for i in range(len(rows)):
    for j in range(len(cols)):
      if not np.isnan(grid[i, j]):  # dark text on viridis' light (high) end, white on its dark end
        ax.text(j, i, f"{grid[i, j]:.{int(spec.get('decimals', 2))}f}", ha="center", va="center", fontsize=8,
                color="k" if grid[i, j] > middle else "w")
  ax.set_xticks(range(len(cols)), [str(c) for c in cols])
  ax.set_yticks(range(len(rows)), [str(r) for r in rows])
  ax.set_xlabel(_display(spec, col))
  ax.set_ylabel(_display(spec, row))
  ax.set_title(f"{sweep.get('name', '')}: {spec.get('metric', 'final_test_accuracy')}")
  fig.colorbar(image, ax=ax)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


OVERHEAD_METRICS = (("client_compute_seconds", 1.0, "client compute (s)"),
                    ("server_compute_seconds", 1.0, "server compute (s)"),
                    ("upload_bytes_per_update", 1 / 2**10, "upload per update (KiB)"),
                    ("download_bytes_per_update", 1 / 2**10, "download per update (KiB)"),
                    ("bytes_communicated", 1 / 2**20, "total communication (MiB)"))


def overhead_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], path: str) -> str:
  """Fig. 5: per dataset panel, bars of client and server compute seconds per method and a line of the
  MiB communicated (uploads + downloads), on a second axis."""
  plt = _pyplot()
  methods = _axis_labels(sweep, "method", frame)
  datasets = _axis_labels(sweep, "dataset", frame)
  fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.6), squeeze=False)
  x = np.arange(len(methods))
  for ax, dataset in zip(axes.flat, datasets):
    stat = {m: {k: cell_stats(frame, {"method": m, "dataset": dataset}, k, s)[0] for k, s, _ in OVERHEAD_METRICS}
            for m in methods}
    ax.bar(x - 0.2, [stat[m]["client_compute_seconds"] for m in methods], 0.4, label="client compute (s)")
    ax.bar(x + 0.2, [stat[m]["server_compute_seconds"] for m in methods], 0.4, label="server compute (s)")
    ax.set_xticks(x, [_display(spec, m).replace(" (Ours)", "").replace(" (Base)", "") for m in methods],
                  rotation=45, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title(_display(spec, dataset))
    twin = ax.twinx()
    twin.plot(x, [stat[m]["bytes_communicated"] for m in methods], "k.-", label="communication (MiB)")
    twin.set_ylabel("MiB communicated")
  handles = axes.flat[0].get_legend_handles_labels()
  axes.flat[0].legend(handles[0] + [plt.Line2D([], [], color="k", marker=".")],
                      handles[1] + ["communication (MiB)"], fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def alignment_figure(stats: dict[str, Any], path: str, pairs: tuple[np.ndarray, np.ndarray] | None = None) -> str:
  """Fig. 6: mean alignment per κ bin (line) and the count per bin (bars, second axis); with `pairs`
  (κ, align) also every sample, faintly."""
  plt = _pyplot()
  bins = stats["bins"]
  fig, ax = plt.subplots(figsize=(6, 3.8))
  centres = [b["centre"] for b in bins]
  twin = ax.twinx()
  twin.bar(centres, [b["count"] for b in bins], width=0.8 * stats["bin_width"], alpha=0.3, color="gray")
  twin.set_ylabel("count")
  if pairs is not None:
    ax.scatter(pairs[0], pairs[1], s=6, alpha=0.25, color="C1", label="updates")
  ax.plot(centres, [b["mean_alignment"] for b in bins], "o-", color="C0", label="bin mean")
  ax.set_zorder(twin.get_zorder() + 1)
  ax.patch.set_visible(False)
  ax.set_xlabel("κ (bin centre)")
  ax.set_ylabel("mean alignment cos(g_client, g_server)")
  ax.set_title(f"n={stats['n']}: r={stats['pearson']:.3f}, ρ={stats['spearman']:.3f}; binned "
               f"r={stats['binned_pearson']:.3f}, ρ={stats['binned_spearman']:.3f}", fontsize=9)
  ax.grid(True, alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def learning_curve(run_dir: str, path: str) -> str:
  """A single run's test accuracy against virtual days."""
  plt = _pyplot()
  records = io.read_metrics(run_dir)
  summary = io.read_summary(run_dir) or {}
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot([r["day"] for r in records], [100 * float(r["test_accuracy"]) for r in records],
          label=f"{summary.get('method', '')} on {summary.get('dataset', '')}")
  ax.set_xlabel("virtual day")
  ax.set_ylabel("test accuracy (%)")
  ax.grid(True, alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


# --- the report ---------------------------------------------------------------------------------------


def _write(path: str, text: str) -> str:
  with open(path, "w") as f:
    f.write(text)
  return path


def _csv(frame: pd.DataFrame, path: str) -> str:
  frame.to_csv(path, index=frame.index.names != [None])
  return path


def sweep_report(sweep_dir: str) -> list[str]:
  """Every table and figure of a sweep directory into SWEEP_DIR/report; the paths written."""
  sweep, frame = load_members(sweep_dir)
  spec = dict(sweep.get("report", {}))
  kind = spec.get("kind", "table")
  out = os.path.join(sweep_dir, REPORT_DIR)
  os.makedirs(out, exist_ok=True)
  if "bytes_uploaded" in frame:
    frame["bytes_communicated"] = frame["bytes_uploaded"].astype(float) + frame["bytes_downloaded"].astype(float)
  written = [_csv(frame.set_index("member"), os.path.join(out, "members.csv"))]
  title = f"# {sweep.get('name')}: {sweep.get('description', '')}\n\n"  # (the name says -smoke for a smoke run)
  if spec.get("rows") or spec.get("cols"):
    markdown, means, stds = paper_table(sweep, frame, spec)
    written.append(_write(os.path.join(out, "table.md"), title + markdown))
    written.append(_csv(means, os.path.join(out, "table.csv")))
    if _completed(frame).groupby([c for c in frame if c.startswith("label:") and c != "label:seed"]).size().max() > 1:
      written.append(_csv(stds, os.path.join(out, "table_std.csv")))
  if kind == "curves":
    path = curves_figure(sweep, frame, spec, list(spec["panels"]), spec["lines"], os.path.join(out, "curves.png"))
    written += [path] if path else []
  elif spec.get("cols") and spec.get("rows"):
    path = curves_figure(sweep, frame, spec, list(spec["cols"]), spec["rows"][-1], os.path.join(out, "curves.png"))
    written += [path] if path else []
  if kind == "heatmap":
    sections = [title]
    for part, row, col in spec["heatmaps"]:
      written.append(heatmap_figure(sweep, frame, spec, part, row, col, os.path.join(out, f"heatmap_{part}.png")))
      markdown, means, _ = paper_table(sweep, frame, {**spec, "rows": [row], "cols": [col]}, where={"part": part})
      sections.append(f"## {part}\n\n{markdown}")
      written.append(_csv(means, os.path.join(out, f"heatmap_{part}.csv")))
    written.append(_write(os.path.join(out, "heatmap.md"), "\n".join(sections)))
  if kind == "overhead":
    sections, tables = [title], []
    for metric, scale, name in OVERHEAD_METRICS:
      markdown, means, _ = paper_table(sweep, frame, {**spec, "metric": metric, "scale": scale, "decimals": 3})
      sections.append(f"## {name}\n\n{markdown}")
      tables.append(means.add_prefix(f"{metric}:"))
    written.append(_write(os.path.join(out, "overhead.md"), "\n".join(sections)))
    written.append(_csv(pd.concat(tables, axis=1), os.path.join(out, "overhead.csv")))
    written.append(overhead_figure(sweep, frame, spec, os.path.join(out, "overhead.png")))
  if kind == "alignment":
    kappa, align = alignment_pairs(_completed(frame)["run_dir"].tolist())
    if len(kappa) == 0:
      raise ReportError(f"{sweep_dir!r}: no κ-alignment pairs in the members' events.jsonl; allowed: a sweep "
                        "run with fedpsa.log_alignment=True and output.events=True (configs/paper/fig6.py)")
    stats = alignment_stats(kappa, align, float(spec.get("bin_width", 0.1)))
    written.append(_write(os.path.join(out, "alignment.md"), title + alignment_markdown(stats)))
    written.append(_csv(pd.DataFrame(stats["bins"]), os.path.join(out, "alignment_bins.csv")))
    io.write_json_atomic(os.path.join(out, "alignment.json"), stats)
    written.append(os.path.join(out, "alignment.json"))
    written.append(alignment_figure(stats, os.path.join(out, "alignment.png"), (kappa, align)))
  run_dirs = [d for d in frame["run_dir"] if os.path.exists(os.path.join(d, "metrics.jsonl"))]
  for d in run_dirs:
    written += figures.run_figures(d, os.path.join(out, "runs", os.path.basename(d)))
  written += figures.group_figures(run_dirs, out)
  return written


def alignment_markdown(stats: dict[str, Any]) -> str:
  lines = [f"{stats['n']} received updates (pairs of κ, align).", "",
           "| level | Pearson r | Spearman ρ |", "|---|---|---|",
           f"| sample | {stats['pearson']:.4f} | {stats['spearman']:.4f} |",
           f"| binned (width {stats['bin_width']}) | {stats['binned_pearson']:.4f} | {stats['binned_spearman']:.4f} |",
           "", "| κ bin | count | mean κ | mean alignment |", "|---|---|---|---|"]
  lines += [f"| [{b['lo']:.1f}, {b['hi']:.1f}) | {b['count']} | {b['mean_kappa']:.4f} | {b['mean_alignment']:.4f} |"
            for b in stats["bins"]]
  return "\n".join(lines) + "\n"


def run_report(run_dir: str) -> list[str]:
  """A single run directory: its learning curve and the plug-ins' figures, into RUN_DIR/report."""
  out = os.path.join(run_dir, REPORT_DIR)
  os.makedirs(out, exist_ok=True)
  return [learning_curve(run_dir, os.path.join(out, "learning_curve.png")), *figures.run_figures(run_dir, out)]


def build(workdir: str) -> list[str]:
  """The report of a sweep directory or a run directory (module docstring); the paths written."""
  if os.path.exists(os.path.join(workdir, sweep_lib.SWEEP_FILE)):
    return sweep_report(workdir)
  if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return run_report(workdir)
  raise ReportError(f"--workdir={workdir!r} is neither a sweep directory (no {sweep_lib.SWEEP_FILE}) nor a run "
                    "directory (no metrics.jsonl); allowed: the --workdir of a --mode=sweep or of a run")


def read_table_csv(path: str) -> pd.DataFrame:
  """A report's table.csv back as a DataFrame (row labels as columns)."""
  return pd.read_csv(path)


__all__ = ["ReportError", "alignment_pairs", "alignment_stats", "build", "load_members", "paper_table",
           "read_table_csv", "run_report", "sweep_report"]
