"""The pieces a report is made of: the member table's helpers, the paper-layout table, figures, file writers.

Both the report driver (`fedpsa_lab.report`) and the figure plug-ins (`fedpsa_lab.figures`) draw with these,
so they live below both: the plug-ins import this module, the driver imports the plug-ins and this module,
and nothing here imports either. A report reads run directories only, so no JAX is imported.

The member frame every function takes has one row per sweep member: `member`, `run_dir`, one `label:<axis>`
column per axis of the sweep and the fields of the member's summary.json (`load_members`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import textwrap
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from fedpsa_jax import io
from fedpsa_jax import sweep as sweep_lib
from fedpsa_lab import paper, report_stats

MISSING = "-"  # a cell the sweep leaves out (FedPAC on the linear model), as the paper prints it
NOT_RUN = "n/a"  # a cell whose member has no completed run yet


class ReportError(ValueError):
  """The report cannot be made: not a sweep or run directory, or a layout naming an unknown axis."""


# --- the member frame ---------------------------------------------------------------------------------

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


def cell_values(frame: pd.DataFrame, where: dict[str, Any], metric: str, scale: float) -> dict[int, float]:
  """{seed: `metric × scale`} of the completed members matching `where` ({axis: label}); {} when none."""
  rows = _matching(completed(frame), where)
  if metric not in rows or rows.empty:
    return {}
  seeds = rows["label:seed"].astype(int) if "label:seed" in rows else pd.Series(range(len(rows)), index=rows.index)
  return {int(seed): float(value) * scale for seed, value in zip(seeds, rows[metric]) if value is not None}


def cell_stats(frame: pd.DataFrame, where: dict[str, Any], metric: str, scale: float) -> tuple[float, float, int]:
  """(mean, std over seeds (0 for one), count) of `metric × scale` over the completed members matching
  `where` ({axis: label}); (nan, nan, 0) when there is none."""
  values = np.array(list(cell_values(frame, where, metric, scale).values()))
  if not len(values):
    return math.nan, math.nan, 0
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


@dataclasses.dataclass(frozen=True)
class Table:
  """A table in the paper's layout: its markdown and, one row per row key and one column per column key (CSV
  layout, row labels as the leading columns), the cells' means, the half-widths of their 95% t-intervals over
  seeds (NaN with one seed), their seed counts, and (with a reference) the paired comparison of each cell with
  the reference's cell of the same column: rows of `paired` are (row key, column, Δ, half-width, p, n); and with
  two or more columns, each row's difference over all columns at once with the seed as the unit
  (`report_stats.seed_blocked`: per seed the mean of its columns' differences, then a t-test over the seeds): rows
  of `pooled` are (row key, columns, Δ, half-width, p, seeds, pairs, the pairs above and below the reference, the
  published Δ averaged over those columns)."""

  markdown: str
  means: pd.DataFrame
  half_widths: pd.DataFrame
  counts: pd.DataFrame
  paired: pd.DataFrame | None
  pooled: pd.DataFrame | None = None


@dataclasses.dataclass(frozen=True)
class Cells:
  """A paper-layout table's numbers, before any text (`paper_cells`; `table_markdown` renders them). Arrays are
  [row key, column]: the columns are the column keys' (`col_keys`) then the extra ones (`spec.row_mean`'s Avg,
  `spec.delta`'s differences), named by `names`; `counts`, `marks` and `excluded` cover the column keys only."""

  rows: list[str]  # the row axes
  row_keys: list[tuple]  # one label per row axis, per table row
  col_keys: list[tuple]  # one label per column axis, per column
  names: list[str]  # every column's header: the column keys', then the extra columns'
  means: np.ndarray  # the mean over seeds (NaN: no completed member)
  half_widths: np.ndarray  # the half-width of its 95% t-interval (NaN with one seed, and in the extra columns)
  counts: np.ndarray  # seeds per cell
  marks: np.ndarray  # +1 / -1: above / below the reference's cell after Holm (paired over seeds); 0: neither
  excluded: np.ndarray  # the sweep leaves the cell out (`exclude`)
  bold: np.ndarray  # the best of its column (within its first row axis' group, with two or more row axes)
  paired: pd.DataFrame | None  # `Table.paired`
  pooled: pd.DataFrame | None  # `Table.pooled`
  published: dict[str, dict[str, float]]  # {row label: {column key: value}} of the spec's `published` rows

  @property
  def col_names(self) -> list[str]:
    return self.names[:len(self.col_keys)]


def paper_table(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any],
                where: dict[str, Any] | None = None) -> Table:
  """The layout `spec` (rows, cols, metric, scale, decimals, best, row_mean, delta, reference) over the members
  matching `where`: its numbers (`paper_cells`) and their markdown (`table_markdown`). Cells print the mean over
  seeds, ± the half-width of its 95% t-interval when a cell has several seeds; with `reference` ({axis: label},
  e.g. {"method": "fedbuff"}), a cell whose paired difference from the reference's cell (same column, same
  seeds; `report_stats.paired_difference`) is significant after Holm's adjustment over every such comparison of
  the table gets ▲ (above) or ▼ (below), and each row is also compared over all its columns at once
  (`Table.pooled`). A caption under the table says how many seeds the cells have."""
  cells = paper_cells(sweep, frame, spec, where)
  index = pd.MultiIndex.from_tuples(cells.row_keys, names=cells.rows) if cells.rows else None
  return Table(table_markdown(cells, spec), pd.DataFrame(cells.means, index=index, columns=cells.names),
               pd.DataFrame(cells.half_widths, index=index, columns=cells.names),
               pd.DataFrame(cells.counts, index=index, columns=cells.col_names), cells.paired, cells.pooled)


def paper_cells(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any],
                where: dict[str, Any] | None = None) -> Cells:
  """The numbers of `paper_table`'s layout `spec` over the members matching `where`."""
  rows, cols = list(spec.get("rows", [])), list(spec.get("cols", []))
  where = dict(where or {})
  metric, scale = spec.get("metric", "final_test_accuracy"), float(spec.get("scale", 1.0))
  reference = dict(spec.get("reference") or {})
  published = {}  # {row label: {column key: value}} of the `published` rows [row label, column key, value]
  for row_label, key, value in (spec.get("published") or {}).get("values", []) if (spec.get("published") or {}).get(
      "metric") == metric else []:
    published.setdefault(str(row_label), {})[str(key)] = float(value)
  row_keys = [tuple(k) for k in _product([axis_labels(sweep, r, frame) for r in rows])]
  col_keys = [tuple(k) for k in _product([axis_labels(sweep, c, frame) for c in cols])]
  means = np.full((len(row_keys), len(col_keys)), np.nan)
  halves = np.full_like(means, np.nan)
  counts = np.zeros(means.shape, int)
  marks = np.zeros(means.shape, int)
  excluded = np.zeros(means.shape, bool)
  paired, pooled = [], {}  # pooled: {row key: ({column: {seed: Δ}}, [published Δ per column])}
  compared = []  # [(i, j, PairedDifference)]: the table's family of comparisons with the reference
  for i, rk in enumerate(row_keys):
    for j, ck in enumerate(col_keys):
      labels = {**where, **dict(zip(rows, rk)), **dict(zip(cols, ck))}
      excluded[i, j] = _is_excluded(sweep, labels)
      values = cell_values(frame, labels, metric, scale)
      stat = report_stats.interval(list(values.values()))
      means[i, j], halves[i, j], counts[i, j] = stat.mean, stat.half_width, stat.n
      if reference and values and any(labels.get(k) != v for k, v in reference.items()):
        base = cell_values(frame, {**labels, **reference}, metric, scale)
        if base:
          d = report_stats.paired_difference(values, base)
          compared.append((i, j, d))
          published_difference = _published(published, {**labels, **reference}, rows, ck, rk)
          paired.append((*rk, _key_text(spec, cols, ck) or metric, d.diff.mean, d.diff.half_width, d.p_value, d.diff.n,
                         published_difference))
          common = sorted(set(values) & set(base))
          if common:
            by_column, published_by_column = pooled.setdefault(rk, ({}, []))
            by_column[ck] = {s: values[s] - base[s] for s in common}
            published_by_column.append(published_difference)
  # ▲/▼ only where a difference survives Holm's adjustment over the table's comparisons read together.
  for (i, j, d), p_holm in zip(compared, report_stats.holm([d.p_value for _, _, d in compared])):
    marks[i, j] = int(np.sign(d.diff.mean)) if p_holm < report_stats.SIGNIFICANCE else 0
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
  no_interval = [np.full(len(row_keys), np.nan) for _ in extra_means]
  all_means = np.column_stack([means, *extra_means]) if extra_means else means
  all_halves = np.column_stack([halves, *no_interval]) if extra_means else halves
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
  paired_frame = pooled_frame = None
  if reference:
    paired_frame = pd.DataFrame(paired, columns=[*rows, "column", "difference", "ci95_half_width", "p_value", "seeds",
                                                 "published_difference"])
    pooled_frame = _pooled_frame(pooled, rows)
  return Cells(rows, row_keys, col_keys, col_names + extra_names, all_means, all_halves, counts, marks, excluded,
               bold, paired_frame, pooled_frame, published)


def table_markdown(cells: Cells, spec: dict[str, Any]) -> str:
  """`cells` as the markdown table `paper_table` writes: a cell the sweep leaves out as `MISSING`, one not yet
  run as `NOT_RUN`, else its mean (± its half-width), the column's best in bold, ▲ / ▼ for a significant
  difference from the reference; then the caption and, when the spec has them, the published values."""
  decimals = int(spec.get("decimals", 2))
  reference = dict(spec.get("reference") or {})
  n_keys = len(cells.col_keys)

  def fmt(i: int, j: int) -> str:
    if j < n_keys and cells.excluded[i, j]:
      return MISSING
    m = cells.means[i, j]
    if np.isnan(m):
      return NOT_RUN
    half = cells.half_widths[i, j]
    text = f"{m:.{decimals}f}" + (f" ± {half:.{decimals}f}" if not np.isnan(half) else "")
    text = f"**{text}**" if cells.bold[i, j] else text
    return text + {1: " ▲", -1: " ▼"}.get(int(cells.marks[i, j]) if j < n_keys else 0, "")

  header = [display_name(spec, r) for r in cells.rows] + cells.names
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for i, rk in enumerate(cells.row_keys):
    lines.append("| " + " | ".join([display_name(spec, v) if not isinstance(v, float) else str(v) for v in rk]
                                    + [fmt(i, j) for j in range(len(cells.names))]) + " |")
  lines += ["", _caption(cells.counts[cells.counts > 0], spec, reference)]
  if cells.published:
    lines += ["", f"Published ({spec['published'].get('source', '')}):", "",
              _published_markdown(cells.published, cells.rows, cells.row_keys, cells.col_keys, cells.col_names, spec)]
  return "\n".join(lines) + "\n"


def _pooled_frame(pooled: dict[tuple, tuple[dict[tuple, dict[int, float]], list[float]]], rows: list[str]
                  ) -> pd.DataFrame:
  """`Table.pooled` from {row key: ({column: {seed: Δ}}, [published Δ per column])}: one row per row key compared
  in two or more columns, the seed as the unit (`report_stats.seed_blocked`: a seed's columns share its data,
  partition, latencies and initial model, so its pairs are not independent)."""
  records = []
  for rk, (by_column, published_by_column) in pooled.items():
    if len(by_column) < 2:
      continue
    d = report_stats.seed_blocked({"row": by_column}, {"row": 1.0})
    every = np.array([v for column in by_column.values() for v in column.values()])
    records.append((*rk, len(by_column), d.diff.mean, d.diff.half_width, d.p_value, d.diff.n, len(every),
                    int((every > 0).sum()), int((every < 0).sum()), float(np.mean(published_by_column))))
  return pd.DataFrame(records, columns=[*rows, "n_columns", "difference", "ci95_half_width", "p_value", "seeds",
                                        "pairs", "above", "below", "published_difference"])


def column_key(labels: Sequence[Any]) -> str:
  """A column's key in a `published` section: its labels joined by ','."""
  return ",".join(str(label) for label in labels)


def _published(published: dict[str, Any], reference_labels: dict[str, Any], rows: list[str], ck: tuple,
               rk: tuple) -> float:
  """The published value of row `rk` minus the reference's, in column `ck`; NaN when either is missing."""
  if not published or len(rows) != 1:
    return math.nan
  own = published.get(str(rk[0]), {}).get(column_key(ck))
  base = published.get(str(reference_labels[rows[0]]), {}).get(column_key(ck))
  return math.nan if own is None or base is None else float(own) - float(base)


def _published_markdown(published: dict[str, Any], rows: list[str], row_keys: list[tuple], col_keys: list[tuple],
                        col_names: list[str], spec: dict[str, Any]) -> str:
  """The published values in the table's layout (one row axis), the best of each column in bold."""
  grid = np.array([[float(published.get(str(rk[0]), {}).get(column_key(ck), math.nan)) for ck in col_keys]
                   for rk in row_keys])
  lines = ["| " + " | ".join([display_name(spec, r) for r in rows] + col_names) + " |", "|" + "---|" * (1 + len(col_keys))]
  for i, rk in enumerate(row_keys):
    cells = []
    for j in range(len(col_keys)):
      v = grid[i, j]
      best = not np.isnan(v) and np.isclose(v, np.nanmax(grid[:, j]))
      cells.append(MISSING if np.isnan(v) else f"**{v:.2f}**" if best else f"{v:.2f}")
    lines.append("| " + " | ".join([display_name(spec, rk[0])] + cells) + " |")
  return "\n".join(lines)


def _caption(counts: np.ndarray, spec: dict[str, Any], reference: dict[str, Any]) -> str:
  """What the cells are: the seed count (or range), what ± means, what ▲/▼ mean."""
  if not counts.size:
    return "No member has completed yet."
  low, high = int(counts.min()), int(counts.max())
  if high == 1:
    return "One seed per cell: no interval and no significance can be stated."
  seeds = f"{low}" if low == high else f"{low}-{high}"
  text = (f"Mean over {seeds} seeds ± the half-width of its {report_stats.CONFIDENCE:.0%} Student-t interval"
          f"{'' if low > 1 else ' (none for a cell with one seed)'}.")
  if reference:
    name = " ".join(display_name(spec, v) for v in reference.values())
    text += (f" ▲ / ▼: above / below {name} by more than the noise (paired t-test over the same seeds, Holm-adjusted "
             f"over this table's comparisons, p (Holm) < {report_stats.SIGNIFICANCE:.2f}; paired.md has every "
             "difference).")
  return text


def _product(lists: Sequence[Sequence[Any]]) -> list[tuple]:
  return list(itertools.product(*lists))


def paired_markdown(paired: pd.DataFrame, spec: dict[str, Any], pooled: pd.DataFrame | None = None) -> str:
  """paired.md: per metric, every cell's difference from the reference (same column, same seeds): Δ ± the
  half-width of its 95% t-interval, the paired t-test's p and its Holm adjustment over the metric's comparisons
  (`p_holm`, report_stats.holm), the pairs, and whether Δ is larger than the noise; then, with `pooled`
  (`Table.pooled` with `metric` and `p_holm`), each row's difference over all the columns at once."""
  reference = " ".join(display_name(spec, v) for v in dict(spec.get("reference") or {}).values())
  decimals = int(spec.get("decimals", 2))
  keys = [c for c in paired.columns if c not in ("column", "difference", "ci95_half_width", "p_value", "p_holm",
                                                  "seeds", "metric", "published_difference")]
  level = f"{report_stats.SIGNIFICANCE:.2f}"
  sections = [f"Paired differences from {reference}: each cell minus {reference}'s cell of the same column, over "
              f"the seeds both have (a paired t-test). Each table makes many comparisons at once, so some p < {level} "
              "are expected by chance alone: p (Holm) is p adjusted over the comparisons of its table (Holm's "
              f"step-down), and the verdict reads it: 'higher' or 'lower' when p (Holm) < {level}, 'within the noise' "
              "otherwise. p is the unadjusted value, for reference.\n"]
  for metric, rows in paired.groupby("metric", sort=False):
    with_paper = rows["published_difference"].notna().any()
    extra = ["published Δ", "the published ordering"] if with_paper else []
    stats = ["column", "Δ", "p (unadjusted)", "p (Holm)", "seeds", "verdict"]
    lines = [f"## {display_name(spec, metric)}\n",
             "| " + " | ".join([display_name(spec, k) for k in keys] + stats + extra) + " |",
             "|" + "---|" * (len(keys) + len(stats) + len(extra))]
    for _, r in rows.iterrows():
      cells = [str(r.column), *_comparison_cells(r, decimals, with_paper, "one seed: unknown" if r.seeds < 2 else "",
                                                 [str(int(r.seeds))])]
      lines.append("| " + " | ".join([display_name(spec, r[k]) for k in keys] + cells) + " |")
    sections.append("\n".join(lines) + "\n")
    if pooled is not None and (pooled["metric"] == metric).any():
      sections.append(_pooled_markdown(pooled[pooled["metric"] == metric], keys, spec, reference, decimals))
  return "\n".join(sections)


def _pooled_markdown(pooled: pd.DataFrame, keys: list[str], spec: dict[str, Any], reference: str,
                     decimals: int) -> str:
  """One metric's `Table.pooled` rows as a paired.md section: each row's Δ over all its columns, its p and
  Holm's adjustment over the rows, the pairs, a verdict and (where published) the published Δ averaged."""
  with_paper = pooled["published_difference"].notna().any()
  level = f"{report_stats.SIGNIFICANCE:.2f}"
  stats = ["columns", "Δ", "p (unadjusted)", "p (Holm)", "seeds", "above / below", "verdict"] + (
      ["published Δ", "the published ordering"] if with_paper else [])
  lines = ["### Over all columns at once\n",
           f"Each row against {reference} in every column together, with the seed as the unit: runs of one seed "
           "share the data split, the partition, the clients' latencies and the initial model in every column, so "
           "a seed's differences are not independent of each other. Δ is the mean over the seeds of each seed's "
           "mean difference over the columns (each column weighs the same; a seed missing a column is left out), "
           f"with its 95% t-interval and the one-sample t-test over the seeds. p (Holm) is adjusted over this "
           f"table's rows, and the verdict reads it ('within the noise' unless p (Holm) < {level}). Above / below: "
           f"the (seed, column) pairs in which the row is above or below {reference}.\n",
           "| " + " | ".join([display_name(spec, k) for k in keys] + stats) + " |",
           "|" + "---|" * (len(keys) + len(stats))]
  for _, r in pooled.iterrows():
    unknown = "too few seeds" if np.isnan(r.p_value) else ""
    counts = [str(int(r.seeds)), f"{int(r.above)} / {int(r.below)}"]
    cells = [str(int(r.n_columns)), *_comparison_cells(r, decimals, with_paper, unknown, counts)]
    lines.append("| " + " | ".join([display_name(spec, r[k]) for k in keys] + cells) + " |")
  return "\n".join(lines) + "\n"


def _comparison_cells(r: pd.Series, decimals: int, with_paper: bool, unknown: str, counts: list[str]) -> list[str]:
  """A paired.md row's cells from Δ on: Δ ± half-width, p, p (Holm), `counts`, the verdict (`unknown` when
  set, else whether Δ is larger than the noise after Holm's adjustment) and, `with_paper`, the published Δ and
  its ordering."""
  half = "" if np.isnan(r.ci95_half_width) else f" ± {r.ci95_half_width:.{decimals}f}"
  p_text = lambda v: "n/a" if np.isnan(v) else f"{v:.3f}"
  verdict = unknown or ("within the noise" if not r.p_holm < report_stats.SIGNIFICANCE
                        else "higher" if r.difference > 0 else "lower")
  cells = [f"{r.difference:+.{decimals}f}{half}", p_text(r.p_value), p_text(r.p_holm), *counts, verdict]
  if with_paper:
    cells += ["-" if np.isnan(r.published_difference) else f"{r.published_difference:+.2f}",
              _ordering(r.published_difference, r.difference, verdict)]
  return cells


def _ordering(published: float, ours: float, verdict: str) -> str:
  """Whether our paired difference reproduces the sign of the published one: 'holds' / 'reversed' when ours
  is larger than the noise, 'not resolved' when it is not."""
  if np.isnan(published):
    return "-"
  if verdict in ("higher", "lower"):
    return "holds" if np.sign(ours) == np.sign(published) else "reversed" if published != 0 else "published: a tie"
  return "not resolved"


def _cpu_text(machine: dict) -> str:
  """The CPU's model, then its vector instruction set and XLA's cap on it where recorded (records written before
  `vector_isa` existed name the model only)."""
  text = machine["cpu"] + (f", {machine['vector_isa']}" if machine.get("vector_isa") else "")
  cap = re.search(r"--xla_cpu_max_isa=(\S+)", machine.get("xla_flags") or "")
  return text + (f" (XLA held to {cap.group(1)})" if cap else "")


def provenance_section(frame: pd.DataFrame) -> str:
  """'## Provenance': the commits, data fingerprints and machines the completed members' summary.json name
  (`fedpsa_jax.provenance`), each with its member count, and their wall time in all."""
  done = completed(frame)
  seen: dict[str, dict[str, int]] = {"code": {}, "data": {}, "machine": {}}
  for run_dir in done["run_dir"]:
    p = (io.read_summary(run_dir) or {}).get("provenance") or {}
    code, data, machine = p.get("code") or {}, p.get("data") or {}, p.get("machine") or {}
    entries = {
        "code": (f"commit {code['commit']}" + (" with uncommitted changes" if code.get("dirty") else "")
                 if code.get("commit") else "not recorded"),
        "data": f"{data['name']} {data['fingerprint']}" if data else "not recorded",
        "machine": (f"{_cpu_text(machine)} ({machine['cores']} cores), {machine['backend']}: {machine['devices']}, "
                    f"jax {machine['jax']}" if machine else "not recorded")}
    for k, v in entries.items():
      seen[k][v] = seen[k].get(v, 0) + 1
  lines = ["## Provenance", "", f"{len(done)} completed members"
           + (f", {done['wall_seconds'].astype(float).sum() / 3600:.2f} h of wall time in all (their `wall_seconds`)."
              if "wall_seconds" in done and len(done) else ".")]
  for k, title in (("code", "Code"), ("data", "Data (name, fingerprint)"), ("machine", "Machine")):
    lines.append(f"- {title}: " + "; ".join(f"{v} ({n} members)" for v, n in seen[k].items()))
  return "\n".join(lines) + "\n"


# --- figures ------------------------------------------------------------------------------------------

# One style for every figure of the lab, the report's and the plug-ins' (`pyplot` sets it): a journal's full text
# width, one font at one size, and the Okabe-Ito palette, told apart with the common colour-vision deficiencies,
# each colour paired with its own line style so that arms stay apart in greyscale print as well.
FIGURE_WIDTH = 7.0  # inches: every figure has this width
PANEL_HEIGHT = 2.4  # inches per row of panels
LEGEND_HEIGHT = 0.9  # inches below the panels for the legend (and its title)
PANELS_PER_ROW = 3
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442")
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (8, 2)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1)))
FONT_SIZE = 8  # points: titles, labels, ticks and legends alike
STYLE: dict[str, Any] = {
    "font.family": "DejaVu Sans",  # matplotlib's own font: the same glyphs (and bytes) on every machine
    **{k: FONT_SIZE for k in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize",
                              "ytick.labelsize", "legend.fontsize", "legend.title_fontsize")},
    "axes.grid": True, "grid.alpha": 0.3, "lines.linewidth": 1.3, "legend.frameon": False,
    "figure.constrained_layout.use": True,  # (makes room for a legend outside the panels; tight_layout does not)
    "savefig.dpi": 150,
    "pdf.fonttype": 42}  # TrueType text in the PDF, not Type 3 outlines: the text stays text, as publishers ask
BAND = "95% t-interval over seeds"  # what every shaded band of a curve is, as its legend says
# {scale: unit} of a table's cells, for the axes of differences: accuracy × 100 is in percentage points.
UNITS = {100.0: "percentage points", 2.0**-20: "MiB", 2.0**-10: "KiB"}
# The x of a learning curve: {metrics.jsonl field: (axis label, factor)}.
CURVE_X = {"day": ("virtual time (days)", 1.0), "bytes_uploaded": ("accumulated upload (MiB)", 2.0**-20)}
# Metadata that would change a figure's bytes between redraws (the PDF's date) or matplotlib versions: left out,
# so that `make results-report` redraws the committed figures byte for byte.
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display) with the lab's `STYLE`, chosen when a figure is
  drawn, not when a module is imported. Every figure of the report and of the plug-ins gets pyplot here."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  matplotlib.rcParams.update({**STYLE, "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO, linestyle=LINE_STYLES)})
  return plt


def arm_style(i: int) -> dict[str, Any]:
  """The colour and line style of the i-th label of an axis: fixed by its place in the sweep's order, so that an arm
  looks the same in every figure of a report (curves_paired.png leaves the reference out and keeps the others').
  Past the 8 colours the line styles shift by one each round, so that no two of the first 64 arms look alike."""
  return {"color": OKABE_ITO[i % len(OKABE_ITO)],
          "linestyle": LINE_STYLES[(i + i // len(OKABE_ITO)) % len(LINE_STYLES)]}


def panels(count: int, height: float = PANEL_HEIGHT) -> tuple[Any, list[Any]]:
  """A figure of the lab's width with `count` panels, `PANELS_PER_ROW` to a row, each row `height` inches high, and
  room for a legend below them: (figure, its panels)."""
  ncols = max(1, min(count, PANELS_PER_ROW))
  nrows = max(1, math.ceil(count / ncols))
  fig, axes = pyplot().subplots(nrows, ncols, figsize=(FIGURE_WIDTH, height * nrows + LEGEND_HEIGHT), squeeze=False)
  for ax in list(axes.flat)[count:]:
    ax.remove()
  return fig, list(axes.flat)[:count]


def legend_below(fig: Any, title: str | None = None, handles: Sequence[Any] = (), labels: Sequence[str] = ()) -> None:
  """The figure's one legend, below its panels, so that it hides no data: `handles` / `labels`, else every labelled
  artist of its panels once (a line absent from the first panel still gets its entry)."""
  if not handles:
    seen = {}
    for ax in fig.axes:
      for handle, label in zip(*ax.get_legend_handles_labels()):
        seen.setdefault(label, handle)
    labels, handles = list(seen), list(seen.values())
  if handles:  # one row up to three entries, else two rows (at most four columns: the lab's width holds them)
    ncols = len(handles) if len(handles) <= 3 else min(4, math.ceil(len(handles) / 2))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, title=title)


def save_figure(fig: Any, path: str) -> list[str]:
  """The one ending of every figure: the PNG `path` and a PDF beside it (for print: vector lines, text as text),
  without the metadata that would change their bytes from one redraw to the next; the figure closed (pyplot keeps
  every open figure alive otherwise). [the PNG, the PDF]."""
  pdf = os.path.splitext(path)[0] + ".pdf"
  fig.savefig(path, metadata=PNG_METADATA)
  fig.savefig(pdf, metadata=PDF_METADATA)
  pyplot().close(fig)
  return [path, pdf]


def _matching(frame: pd.DataFrame, where: dict[str, Any]) -> pd.DataFrame:
  """The rows of `frame` with every label of `where` ({axis: label})."""
  for k, v in where.items():
    frame = frame[frame[f"label:{k}"] == v]
  return frame


def _seed_curves(runs: pd.DataFrame, fields: Sequence[str] = ("test_accuracy",)) -> dict[str, pd.DataFrame]:
  """{field: [evaluation day, seed]} of the member rows `runs` (their row position as the seed where the sweep has no
  seed axis), at the days every run logged (the evaluation grid); {} when none has metrics."""
  seeds = runs["label:seed"].astype(int).tolist() if "label:seed" in runs else list(range(len(runs)))
  per_run = {}
  for seed, run_dir in zip(seeds, runs["run_dir"]):
    records = pd.DataFrame(io.read_metrics(run_dir))
    if len(records):
      per_run[seed] = records.set_index("day").reindex(columns=list(fields)).astype(float)
  if not per_run:
    return {}
  joined = pd.concat(per_run, axis=1, join="inner").sort_index()  # columns: (seed, field)
  return {f: joined.xs(f, axis=1, level=1) for f in fields}


def _band_line(ax: Any, x: Any, table: pd.DataFrame, label: str, style: dict[str, Any],
               clip: tuple[float, float] = (-math.inf, math.inf)) -> int:
  """A line of the mean over the columns (seeds) of [point, seed] `table` at `x`, with its 95% t-interval as a band
  where there are several seeds, clipped to `clip` (the range the quantity can take, which a t-interval over a few
  seeds can reach past); the number of seeds."""
  stats = [report_stats.interval(row) for row in table.to_numpy()]
  mean, half = np.array([s.mean for s in stats]), np.array([s.half_width for s in stats])
  ax.plot(x, mean, label=label, **style)
  if not np.isnan(half).all():
    ax.fill_between(x, np.clip(mean - half, *clip), np.clip(mean + half, *clip), color=style["color"], alpha=0.15,
                    linewidth=0)
  return table.shape[1]


def _seeds_text(counts: set[int]) -> str:
  """'8 seeds', or '3-5 seeds' when the lines differ."""
  low, high = min(counts, default=0), max(counts, default=0)
  return f"{low} seed{'s' if high != 1 else ''}" if low == high else f"{low}-{high} seeds"


def curves_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], panel_axes: Sequence[str],
                  lines: str, path: str, x: str = "day") -> list[str]:
  """Learning curves: one panel per combination of `panel_axes`, one line per label of `lines` (its printed name,
  `spec.display`): test accuracy (%) against `x` (a `CURVE_X` field, each point at its mean over the seeds), mean
  over the seeds with its 95% t-interval as a band. The paths written; [] when no member completed."""
  done = completed(frame)
  if done.empty:
    return []
  x_label, factor = CURVE_X[x]
  keys = _product([axis_labels(sweep, p, frame) for p in panel_axes])
  fig, axes = panels(len(keys))
  seeds, fields = set(), ["test_accuracy"] + ([] if x == "day" else [x])
  for ax, key in zip(axes, keys):
    for i, arm in enumerate(axis_labels(sweep, lines, frame)):
      curves = _seed_curves(_matching(done, {**dict(zip(panel_axes, key)), lines: arm}), fields)
      if curves:
        at = curves["test_accuracy"].index if x == "day" else factor * curves[x].mean(axis=1)
        seeds.add(_band_line(ax, at, 100 * curves["test_accuracy"], display_name(spec, arm), arm_style(i), (0, 100)))
    ax.set_title(_key_text(spec, panel_axes, key))
    ax.set_xlabel(x_label)
    ax.set_ylabel("test accuracy (%)")
  legend_below(fig, f"mean over {_seeds_text(seeds)}; shaded: {BAND}")
  return save_figure(fig, path)


def paired_curves_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any],
                         panel_axes: Sequence[str], lines: str, path: str) -> list[str]:
  """Each arm's difference in test accuracy from the reference arm (`spec.reference`, a label of `lines`) over
  virtual time, one panel per combination of `panel_axes`: the difference computed within each seed (the runs of a
  seed share the data split, partition, latencies and initial model), then its mean over the seeds with its 95%
  t-interval as a band. What a figure of overlapping curves cannot show. The paths written; [] without such a
  reference or a completed member."""
  reference, arms, done = dict(spec.get("reference") or {}), axis_labels(sweep, lines, frame), completed(frame)
  if set(reference) != {lines} or reference[lines] not in arms or done.empty:
    return []
  keys = _product([axis_labels(sweep, p, frame) for p in panel_axes])
  fig, axes = panels(len(keys))
  name, seeds = display_name(spec, reference[lines]), set()
  for ax, key in zip(axes, keys):
    where = dict(zip(panel_axes, key))
    base = _seed_curves(_matching(done, {**where, **reference})).get("test_accuracy")
    ax.axhline(0, label=f"{name} (the reference)", linewidth=0.8, **arm_style(arms.index(reference[lines])))
    for i, arm in enumerate(arms):
      curves = _seed_curves(_matching(done, {**where, lines: arm}))
      if arm == reference[lines] or base is None or not curves:
        continue
      # (Aligned on day and seed: a seed or day that either lacks is left out, never half-used.)
      diff = (100 * (curves["test_accuracy"] - base)).dropna(axis=1, how="all").dropna(axis=0, how="any")
      if diff.size:
        seeds.add(_band_line(ax, diff.index, diff, display_name(spec, arm), arm_style(i)))
    ax.set_title(_key_text(spec, panel_axes, key))
    ax.set_xlabel(CURVE_X["day"][0])
    ax.set_ylabel("Δ test accuracy\n(percentage points)")
  legend_below(fig, f"difference from {name} within each seed, mean over {_seeds_text(seeds)}; shaded: {BAND}")
  return save_figure(fig, path)


def heatmap_figure(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], part: str, row: str, col: str,
                   path: str) -> list[str]:
  """The metric over a 2-D grid (rows: labels of `row`, columns: labels of `col`) of sweep part `part`."""
  sub = frame[frame["label:part"] == part] if "label:part" in frame else frame
  rows, cols = _ordered(sub[f"label:{row}"].tolist()), _ordered(sub[f"label:{col}"].tolist())
  metric, scale = spec.get("metric", "final_test_accuracy"), float(spec.get("scale", 1.0))
  grid = np.array([[cell_stats(sub, {row: r, col: c}, metric, scale)[0] for c in cols] for r in rows])
  fig, (ax,) = panels(1, height=0.4 * len(rows) + 1.4)
  image = ax.imshow(grid, cmap="viridis", aspect="auto")
  middle = np.nanmean([np.nanmin(grid), np.nanmax(grid)]) if np.isfinite(grid).any() else 0.0
  for i in range(len(rows)):
    for j in range(len(cols)):
      if not np.isnan(grid[i, j]):  # dark text on viridis' light (high) end, white on its dark end
        ax.text(j, i, f"{grid[i, j]:.{int(spec.get('decimals', 2))}f}", ha="center", va="center",
                color="k" if grid[i, j] > middle else "w")
  ax.set_xticks(range(len(cols)), [str(c) for c in cols])
  ax.set_yticks(range(len(rows)), [str(r) for r in rows])
  ax.set_xlabel(display_name(spec, col))
  ax.set_ylabel(display_name(spec, row))
  ax.grid(False)
  fig.colorbar(image, ax=ax, label=display_name(spec, metric))
  return save_figure(fig, path)


def paired_figure(pooled: pd.DataFrame, spec: dict[str, Any], path: str) -> list[str]:
  """Every row's difference from the reference over all columns at once (`Table.pooled` with `metric`), one
  panel per metric: Δ with its 95% t-interval over seeds per row, and the published Δ (averaged over the same
  columns) as a cross where there is one. A row without an interval (too few seeds) is its point alone."""
  metrics = list(dict.fromkeys(pooled["metric"]))
  keys = [c for c in pooled.columns if c not in ("n_columns", "difference", "ci95_half_width", "p_value", "p_holm",
                                                  "seeds", "pairs", "above", "below", "metric",
                                                  "published_difference")]
  fig, axes = panels(len(metrics), height=0.3 * pooled.groupby("metric").size().max() + 1.6)
  reference = " ".join(display_name(spec, v) for v in dict(spec.get("reference") or {}).values())
  over = " and ".join(display_name(spec, c) for c in spec.get("cols", [])) or "the columns"
  unit = UNITS.get(float(spec.get("scale", 1.0)))
  legend = {}  # {label: artist}: ours first, then the paper's where any panel has it
  for ax, metric in zip(axes, metrics):
    rows = pooled[pooled["metric"] == metric].reset_index(drop=True)
    y = np.arange(len(rows))[::-1]
    legend[f"this study: mean Δ, {BAND}"] = ax.errorbar(
        rows["difference"], y, xerr=rows["ci95_half_width"].fillna(0), fmt="o", color=OKABE_ITO[0], capsize=3)
    if rows["published_difference"].notna().any():
      legend["the paper's Δ"] = ax.plot(rows["published_difference"], y, "x", color=OKABE_ITO[4], markersize=7)[0]
    ax.axvline(0, color="gray", linewidth=0.8)
    ax.set_yticks(y, [" ".join(display_name(spec, r[k]) for k in keys) for _, r in rows.iterrows()])
    ax.set_xlabel(f"Δ from {reference}, mean over {over}" + (f"\n({unit})" if unit else ""))
    ax.set_title(textwrap.fill(display_name(spec, metric), 36))
    ax.grid(False, axis="y")
  legend_below(fig, handles=list(legend.values()), labels=list(legend))
  return save_figure(fig, path)


# The printed names of a run's method and data where no sweep layout names them: the paper's, and the other methods'.
RUN_NAMES = {**paper.DISPLAY_NAMES, "aifed": "AiFed", "casa": "CASA"}


def learning_curve(run_dir: str, path: str) -> list[str]:
  """A single run's test accuracy against virtual time, titled with its method and data (`RUN_NAMES`)."""
  records = io.read_metrics(run_dir)
  summary = io.read_summary(run_dir) or {}
  fig, (ax,) = panels(1)
  ax.plot([r["day"] for r in records], [100 * float(r["test_accuracy"]) for r in records], **arm_style(0))
  ax.set_title(" on ".join(RUN_NAMES.get(str(summary[k]), str(summary[k])) for k in ("method", "dataset")
                          if summary.get(k)))
  ax.set_xlabel(CURVE_X["day"][0])
  ax.set_ylabel("test accuracy (%)")
  return save_figure(fig, path)


# --- writing, and what a report kind draws from -------------------------------------------------------


def write_text(path: str, text: str) -> str:
  """`text` into the file `path` (never through a symbolic link made there since the report began); `path`."""
  with io.open_no_follow(path, "w") as f:
    f.write(text)
  return path


# Significant digits of a CSV's fractional floats. Statistics computed on another CPU differ in their last bits
# (other vector widths, other summation orders in numpy's BLAS); at full precision a redraw there would rewrite every
# CSV. Eight digits keep far more than any report reads, and a last-bit change reaches them only at a rounding
# boundary. Whole numbers (counts and bytes, floats only because a column has gaps) are written whole.
CSV_SIGNIFICANT_DIGITS = 8


def _csv_float(value: float) -> str:
  if value.is_integer() and abs(value) < 2**53:  # (every integer up to 2^53 is exact in a float64)
    return str(int(value))
  return f"{value:.{CSV_SIGNIFICANT_DIGITS}g}"


def write_csv(frame: pd.DataFrame, path: str) -> str:
  """`frame` as CSV at `path`, its index written only when named (the row labels of a table), its fractional floats
  at `CSV_SIGNIFICANT_DIGITS` significant digits (so that a redraw on another machine writes the same bytes) and
  its whole ones whole; `path` (never written through a symbolic link made there since the report began)."""
  with io.open_no_follow(path, "w", newline="") as f:
    frame.to_csv(f, index=frame.index.names != [None], float_format=_csv_float)
  return path


@dataclasses.dataclass(frozen=True)
class SweepReport:
  """What a report kind draws from: the sweep directory, its sweep config (`sweep`), one row per member
  (`frame`, see the module docstring), the layout (`spec`, the sweep config's `report` section), the output
  directory and the markdown title (its one line, with its newline)."""

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


def curve_layout(spec: dict[str, Any]) -> tuple[list[str], str] | None:
  """(panel axes, line axis) of a layout's learning curves: kind 'curves' its `panels` × `lines`, every other kind
  one panel per column key and one line per label of the last row axis (with both rows and cols); else None."""
  if spec.get("kind") == "curves":
    return list(spec["panels"]), spec["lines"]
  if spec.get("cols") and spec.get("rows"):
    return list(spec["cols"]), spec["rows"][-1]
  return None


def table_curves(r: SweepReport) -> list[str]:
  """The layout's learning curves (`curve_layout`): curves.png and, with a reference arm among its lines,
  curves_paired.png (each arm's difference from it over time); what every kind draws first."""
  layout = curve_layout(r.spec)
  if layout is None:
    return []
  return [*curves_figure(r.sweep, r.frame, r.spec, *layout, r.path("curves.png")),
          *paired_curves_figure(r.sweep, r.frame, r.spec, *layout, r.path("curves_paired.png"))]


__all__ = ["MISSING", "NOT_RUN", "ReportError", "ReportKind", "SweepReport", "axis_labels", "cell_stats", "completed", "load_members",
           "curves_figure", "curve_layout", "display_name", "heatmap_figure", "learning_curve", "paired_figure", "paired_markdown", "paper_cells", "paper_table", "table_markdown", "Cells", "provenance_section", "Table", "cell_values", "column_key", "pyplot", "save_figure",
           "table_curves", "paired_curves_figure", "panels", "legend_below", "arm_style", "RUN_NAMES", "STYLE", "BAND", "write_csv", "write_text"]
