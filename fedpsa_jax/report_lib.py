"""The pieces a report is made of: the member table's helpers, the paper-layout table, figures, file writers.

Both the report driver (`fedpsa_jax.report`) and the figure plug-ins (`fedpsa_jax.figures`) draw with these,
so they live below both: the plug-ins import this module, the driver imports the plug-ins and this module,
and nothing here imports either. A report reads run directories only, so no JAX is imported.

The member frame every function takes has one row per sweep member: `member`, `run_dir`, one `label:<axis>`
column per axis of the sweep and the fields of the member's summary.json (`report.load_members`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from fedpsa_jax import io

MISSING = "-"  # a cell the sweep leaves out (FedPAC on the linear model), as the paper prints it
NOT_RUN = "n/a"  # a cell whose member has no completed run yet


class ReportError(ValueError):
  """The report cannot be made: not a sweep or run directory, or a layout naming an unknown axis."""


# --- the member frame ---------------------------------------------------------------------------------

def _ordered(values: Sequence[Any]) -> list[Any]:
  """Unique values in order of first appearance (the sweep's axis order, not sorted)."""
  return list(dict.fromkeys(values))


def axis_labels(sweep: dict[str, Any], name: str, frame: pd.DataFrame) -> list[Any]:
  """The labels of axis `name` in the sweep config's order (all of them, excluded ones included)."""
  for axis_name, values in list(sweep["axes"]) + [a for _, more in sweep.get("parts", []) for a in more]:
    if axis_name == name:
      return _ordered([label for label, _ in values])
  column = f"label:{name}"
  if column not in frame:
    raise ReportError(f"report layout names the axis {name!r}, which the sweep does not have; allowed: "
                      f"{', '.join(c[6:] for c in frame.columns if c.startswith('label:'))}")
  return _ordered(frame[column].tolist())


def completed(frame: pd.DataFrame) -> pd.DataFrame:
  """The members whose run completed (the only ones a table or figure uses)."""
  return frame[frame["status"] == "completed"] if "status" in frame else frame.iloc[:0]


# --- tables -------------------------------------------------------------------------------------------


def cell_stats(frame: pd.DataFrame, where: dict[str, Any], metric: str, scale: float) -> tuple[float, float, int]:
  """(mean, std over seeds (0 for one), count) of `metric × scale` over the completed members matching
  `where` ({axis: label}); (nan, nan, 0) when there is none."""
  rows = completed(frame)
  for k, v in where.items():
    rows = rows[rows[f"label:{k}"] == v]
  if metric not in rows or rows.empty:
    return math.nan, math.nan, 0
  values = rows[metric].astype(float).to_numpy() * scale
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0, len(values)


def display_name(spec: dict[str, Any], value: Any) -> str:
  """How the layout prints a label or axis name (`spec.display`, e.g. 'fedpsa' -> 'FedPSA (Ours)')."""
  return str(spec.get("display", {}).get(str(value), value))


def _key_text(spec: dict[str, Any], axes: Sequence[str], key: Sequence[Any]) -> str:
  """'CIFAR-10 α=0.1' for key (cifar10, 0.1) of axes (dataset, alpha): numbers carry their axis name."""
  parts = []
  for name, value in zip(axes, key):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      parts.append(f"{display_name(spec, name)}={value}")
    else:
      parts.append(display_name(spec, value))
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
  row_keys = [tuple(k) for k in _product([axis_labels(sweep, r, frame) for r in rows])]
  col_keys = [tuple(k) for k in _product([axis_labels(sweep, c, frame) for c in cols])]
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
      extra_names.append(f"{display_name(spec, delta[0])} − {display_name(spec, delta[1])}" + (
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

  header = [display_name(spec, r) for r in rows] + names
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for i, rk in enumerate(row_keys):
    lines.append("| " + " | ".join([display_name(spec, v) if not isinstance(v, float) else str(v) for v in rk]
                                    + [fmt(i, j) for j in range(len(names))]) + " |")
  index = pd.MultiIndex.from_tuples(row_keys, names=rows) if rows else None
  mean_frame = pd.DataFrame(all_means, index=index, columns=names)
  std_frame = pd.DataFrame(all_stds, index=index, columns=names)
  return "\n".join(lines) + "\n", mean_frame, std_frame


def _product(lists: Sequence[Sequence[Any]]) -> list[tuple]:
  return list(itertools.product(*lists))


# --- figures ------------------------------------------------------------------------------------------


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display), chosen when a figure is drawn, not
  when a module is imported. Every figure of the report and of the plug-ins gets pyplot here."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def save_figure(fig: Any, path: str) -> str:
  """The one ending of every figure: tight layout, a 120-dpi PNG at `path`, the figure closed (pyplot keeps
  every open figure alive otherwise); `path`."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  pyplot().close(fig)
  return path


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
  plt = pyplot()
  done = completed(frame)
  if done.empty:
    return None
  keys = _product([axis_labels(sweep, p, frame) for p in panels])
  ncols = min(len(keys), 3)
  nrows = math.ceil(len(keys) / ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(4.5 * ncols, 3.3 * nrows), squeeze=False)
  for ax, key in zip(axes.flat, keys):
    for label in axis_labels(sweep, lines, frame):
      sel = done
      for k, v in {**dict(zip(panels, key)), lines: label}.items():
        sel = sel[sel[f"label:{k}"] == v]
      curve = _mean_curve(sel["run_dir"].tolist())
      if curve is not None:
        ax.plot(curve[0], 100 * curve[1], label=display_name(spec, label))
    ax.set_title(_key_text(spec, panels, key) or sweep.get("name", ""))
    ax.set_xlabel("virtual day")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
  for ax in list(axes.flat)[len(keys):]:
    ax.axis("off")
  if axes.flat[0].get_legend_handles_labels()[0]:
    axes.flat[0].legend(fontsize=7)
  return save_figure(fig, path)


def heatmap_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], part: str, row: str, col: str,
                   path: str) -> str:
  """The metric over a 2-D grid (rows: labels of `row`, columns: labels of `col`) of sweep part `part`."""
  plt = pyplot()
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
  ax.set_xlabel(display_name(spec, col))
  ax.set_ylabel(display_name(spec, row))
  ax.set_title(f"{sweep.get('name', '')}: {spec.get('metric', 'final_test_accuracy')}")
  fig.colorbar(image, ax=ax)
  return save_figure(fig, path)


def learning_curve(run_dir: str, path: str) -> str:
  """A single run's test accuracy against virtual days."""
  plt = pyplot()
  records = io.read_metrics(run_dir)
  summary = io.read_summary(run_dir) or {}
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot([r["day"] for r in records], [100 * float(r["test_accuracy"]) for r in records],
          label=f"{summary.get('method', '')} on {summary.get('dataset', '')}")
  ax.set_xlabel("virtual day")
  ax.set_ylabel("test accuracy (%)")
  ax.grid(True, alpha=0.3)
  ax.legend()
  return save_figure(fig, path)


# --- writing, and what a report kind draws from -------------------------------------------------------


def write_text(path: str, text: str) -> str:
  """`text` into the file `path`; `path`."""
  with open(path, "w") as f:
    f.write(text)
  return path


def write_csv(frame: pd.DataFrame, path: str) -> str:
  """`frame` as CSV at `path`, its index written only when named (the row labels of a table); `path`."""
  frame.to_csv(path, index=frame.index.names != [None])
  return path


@dataclasses.dataclass(frozen=True)
class SweepReport:
  """What a report kind draws from: the sweep directory, its sweep config (`sweep`), one row per member
  (`frame`, see the module docstring), the layout (`spec`, the sweep config's `report` section), the output
  directory and the markdown title."""

  sweep_dir: str
  sweep: dict[str, Any]
  frame: pd.DataFrame
  spec: dict[str, Any]
  out: str
  title: str

  def path(self, name: str) -> str:
    """`name` inside the report directory."""
    return os.path.join(self.out, name)


ReportKind = Callable[[SweepReport], list[str]]


def table_curves(r: SweepReport) -> list[str]:
  """Learning curves in the table's layout (one panel per column key, one line per label of the last row
  axis), when the layout has both rows and cols; what every kind but 'curves' draws."""
  if not (r.spec.get("cols") and r.spec.get("rows")):
    return []
  path = curves_figure(r.sweep, r.frame, r.spec, list(r.spec["cols"]), r.spec["rows"][-1], r.path("curves.png"))
  return [path] if path else []


__all__ = ["MISSING", "NOT_RUN", "ReportError", "ReportKind", "SweepReport", "axis_labels", "cell_stats", "completed",
           "curves_figure", "display_name", "heatmap_figure", "learning_curve", "paper_table", "pyplot", "save_figure",
           "table_curves", "write_csv", "write_text"]
