"""Reports: the paper's tables (markdown and CSV) and figures (PNG, each with a PDF beside it) from a sweep or a
single run directory.

`build(workdir)` looks at what `workdir` is:
- a sweep directory (`sweep.json`, written by `fedpsa_jax.sweep`): reads every member's summary.json
  (and metrics.jsonl / events.jsonl where a figure needs them) and draws the layout of the sweep config's
  `report` section into `WORKDIR/report/`:
  - always `members.csv` (one row per member: its run directory relative to WORKDIR, its labels and every summary
    field), the table `table.md` / `table.csv` (rows × columns of `report.rows` / `report.cols`, cells the metric ×
    scale, mean ± the half-width of its 95% t-interval over seeds when there are several, `table_ci95.csv` and
    `table_n.csv` then too; ▲/▼ where a paired difference from `report.reference` is larger than the noise, all of
    them in `paired.md` with each row's difference over all columns at once; a table per `report.more_metrics`
    entry; the best of each column in bold within each group of the outer row axis; '-' for a member the sweep
    leaves out; the commits, data and machines of the members)
    and `curves.png` (learning curves: one panel per column, one line per row, mean over seeds with its 95%
    t-interval as a band) and, with `report.reference`, `curves_paired.png` (each row's difference from the
    reference over time, computed within each seed, with its 95% t-interval over seeds as a band);
  - then the files of the layout's kind, `report.kind`, a function registered in `report_kinds()`:
    - `table` (the default): the learning curves above;
    - `curves`: those figures laid out as `report.panels` × lines `report.lines` instead;
    - `heatmap`: the curves, then one `heatmap_<part>.png` / `heatmap_<part>.csv` per `report.heatmaps`
      entry and `heatmap.md`;
    - the plug-ins' kinds (`REPORT_KINDS` of a `fedpsa_lab.figures` module): FedPSA's Fig. 5 `overhead`
      and Fig. 6 `alignment` (figures/fedpsa.py);
    an unknown kind is a ReportError naming the allowed ones;
  - then the figure plug-ins (`fedpsa_lab.figures`): `run_figures` per member into
    `report/runs/<member>/`, `group_figures` over all members into `report/` (AiFed's
    `accuracy_vs_upload.png` in the curves' layout).
  Every figure is drawn in one style (`report_lib.STYLE`: size, font, a colour-blind-safe palette with line
  styles, legends below the panels) and written as PNG and PDF without a date, so a redraw is byte for byte.
  `build(workdir, layout)` draws a sweep with the `report` section of `layout` (a sweep config of the same name,
  as JSON) instead of the stored one (`with_layout`): `--mode=report --config=SWEEP_CONFIG`.
- a run directory (`metrics.jsonl`): its learning curve `report/learning_curve.png` and the plug-ins'
  `run_figures`.

This module is the driver: it reads the members, picks the kind and calls the plug-ins. The tables, figures
and writers it and the plug-ins share are in `fedpsa_lab.report_lib`, below both.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from fedpsa_jax import errors, io
from fedpsa_jax import sweep as sweep_lib
from fedpsa_lab import contrasts, event_correlations, figures, report_lib, report_stats, tuning
from fedpsa_lab.report_lib import ReportError, ReportKind, SweepReport, load_members

REPORT_DIR = "report"


# --- the generic report kinds -------------------------------------------------------------------------


def _heatmap_kind(r: SweepReport) -> list[str]:
  """'heatmap': per `spec.heatmaps` entry (part, row axis, col axis), the part's metric as a heatmap and a
  table (Fig. 4), the tables together in heatmap.md."""
  written, sections = report_lib.table_curves(r), [r.title]
  for part, row, col in r.spec["heatmaps"]:
    written += report_lib.heatmap_figure(r.sweep, r.frame, r.spec, part, row, col, r.path(f"heatmap_{part}.png"))
    table = report_lib.paper_table(r.sweep, r.frame, {**r.spec, "rows": [row], "cols": [col]}, where={"part": part})
    sections.append(f"## {part}\n\n{table.markdown}")
    written.append(report_lib.write_csv(table.means, r.path(f"heatmap_{part}.csv")))
  written.append(report_lib.write_text(r.path("heatmap.md"), "\n".join(sections)))
  return written


# The layouts every sweep may use; a paper's own (FedPSA's Figs. 5-6) come from figure plug-ins.
GENERIC_KINDS: dict[str, ReportKind] = {"table": report_lib.table_curves, "curves": report_lib.table_curves,
                                        "heatmap": _heatmap_kind}


def report_kinds() -> dict[str, ReportKind]:
  """{kind: fn} of every sweep layout: the generic ones and the figure plug-ins' `REPORT_KINDS`."""
  plugins = figures.report_kinds()
  clash = sorted(set(plugins) & set(GENERIC_KINDS))
  if clash:
    raise ReportError(f"figure plug-ins redefine the generic report kinds {clash}")
  return {**GENERIC_KINDS, **plugins}


def _tables(sweep: dict[str, Any], frame: pd.DataFrame, spec: dict[str, Any], out: str, title: str) -> list[str]:
  """table.md: one table per metric of the layout (`report.metric`, then `report.more_metrics`) and the
  provenance of the members; per metric its means, intervals and seed counts as CSV (`table.csv`,
  `table_ci95.csv`, `table_n.csv` for the first; `table_<metric>*.csv` for the others); with
  `report.reference`, every paired difference from the reference in paired.md / paired.csv, with its p adjusted
  (Holm) over the comparisons of its metric's table, and with two or more columns each row's difference over
  all of them at once (paired.md, paired_over_columns.csv and the figure paired.png; Holm over the rows)."""
  metrics = [spec.get("metric", "final_test_accuracy"), *spec.get("more_metrics", [])]
  sections, written, paired, pooled = [title], [], [], []
  for k, metric in enumerate(metrics):
    table = report_lib.paper_table(sweep, frame, {**spec, "metric": metric})
    sections.append((f"## {report_lib.display_name(spec, metric)}\n\n" if len(metrics) > 1 else "") + table.markdown)
    stem = "table" if k == 0 else f"table_{metric}"
    written.append(report_lib.write_csv(table.means, os.path.join(out, f"{stem}.csv")))
    if table.counts.to_numpy().max(initial=0) > 1:
      written.append(report_lib.write_csv(table.half_widths, os.path.join(out, f"{stem}_ci95.csv")))
      written.append(report_lib.write_csv(table.counts, os.path.join(out, f"{stem}_n.csv")))
    if table.paired is not None:
      paired.append(table.paired.assign(metric=metric))
      pooled.append(table.pooled.assign(metric=metric))
  sections.append(report_lib.provenance_section(frame))
  written.insert(0, report_lib.write_text(os.path.join(out, "table.md"), "\n".join(sections)))
  if paired:
    both = pd.concat(paired, ignore_index=True)
    # One family per metric's table: every method and column compared with the reference at once.
    both["p_holm"] = both.groupby("metric", sort=False)["p_value"].transform(report_stats.holm)
    over_columns = pd.concat(pooled, ignore_index=True)
    over_columns["p_holm"] = over_columns.groupby("metric", sort=False)["p_value"].transform(report_stats.holm)
    written.append(report_lib.write_text(os.path.join(out, "paired.md"),
                                         title + "\n" + report_lib.paired_markdown(both, spec, over_columns)))
    written.append(report_lib.write_csv(both, os.path.join(out, "paired.csv")))
    if len(over_columns):
      written.append(report_lib.write_csv(over_columns, os.path.join(out, "paired_over_columns.csv")))
      written += report_lib.paired_figure(over_columns, spec, os.path.join(out, "paired.png"))
  return written


def with_layout(sweep: dict[str, Any], layout: dict[str, Any] | None, sweep_dir: str) -> dict[str, Any]:
  """`sweep` (sweep.json's sweep config) with its `report` section replaced by that of `layout` (a sweep config
  as JSON, of the same name), or unchanged without one: a report drawn with a layout improved since the sweep
  ran (the paper's numbers beside ours, another metric) without running a member again. The layout only says
  how to present results: the members and their metrics are sweep.json's and the runs'."""
  if layout is None:
    return sweep
  if layout.get("name") != sweep.get("name"):
    raise ReportError(f"--config names sweep {layout.get('name')!r} but {sweep_dir!r} holds sweep "
                      f"{sweep.get('name')!r}; allowed: the config of the sweep that ran there (its report section "
                      "is used), or no --config (the layout stored in sweep.json)")
  return {**sweep, "report": layout.get("report", {})}


def _as_run(sweep: dict[str, Any]) -> str:
  """' (as run: D virtual days on DATA)': what the members ran, which a description written for the full
  configuration (a smoke variant's "after 10 days") does not say."""
  base = sweep.get("base") or {}
  varied = {field for _, values in [*sweep.get("axes", []), *[a for _, more in sweep.get("parts", []) for a in more]]
            for _, fields in values for field in fields}  # (a field an axis sets differs between members)
  days = (base.get("sim") or {}).get("virtual_days")
  data = None if any(f.startswith("data.") for f in varied) else (
      (base.get("data") or {}).get("name") or (base.get("data") or {}).get("path"))
  if not isinstance(days, (int, float)) or "sim.virtual_days" in varied:
    return ""
  return f" (as run: {days:g} virtual day{'s' if days != 1 else ''}" + (f" on {data})" if data else ")")


def sweep_report(sweep_dir: str, layout: dict[str, Any] | None = None) -> list[str]:
  """Every table and figure of a sweep directory into SWEEP_DIR/report; the paths written: members.csv (its
  `run_dir` relative to SWEEP_DIR), the table (when the layout has rows or cols), the files of the layout's
  kind, the plug-ins' figures.
  `layout`: a sweep config (as JSON) whose `report` section replaces the stored one (`with_layout`)."""
  sweep, frame = load_members(sweep_dir)
  sweep = with_layout(sweep, layout, sweep_dir)
  spec = dict(sweep.get("report", {}))
  kind, kinds = spec.get("kind", "table"), report_kinds()
  if kind not in kinds:  # before any file is written
    raise ReportError(f"{sweep_dir!r}: report.kind={kind!r} is invalid; allowed: {', '.join(sorted(kinds))}")
  out = os.path.join(sweep_dir, REPORT_DIR)
  os.makedirs(out, exist_ok=True)
  if "bytes_uploaded" in frame:
    frame["bytes_communicated"] = frame["bytes_uploaded"].astype(float) + frame["bytes_downloaded"].astype(float)
  # Relative to the sweep directory: a report copied elsewhere (results/) names no path of the machine
  # that ran it, and stays true when the sweep directory moves.
  listed = frame.assign(run_dir=[os.path.relpath(d, sweep_dir) for d in frame["run_dir"]])
  written = [report_lib.write_csv(listed.set_index("member"), os.path.join(out, "members.csv"))]
  title = f"# {sweep.get('name')}: {sweep.get('description', '')}{_as_run(sweep)}\n"
  if spec.get("rows") or spec.get("cols"):
    written += _tables(sweep, frame, spec, out, title)
  written += contrasts.write(frame, sweep, out, title)  # the declared analysis (`analysis`), if any
  written += tuning.write(frame, sweep, out, title)  # a tuning sweep's selection (`analysis.selection`), if any
  written += event_correlations.write(frame, spec, out, title)  # `report.partial_correlations`, if any
  r = SweepReport(sweep_dir, sweep, frame, spec, out, title)
  written += kinds[kind](r)
  run_dirs = [d for d in frame["run_dir"] if io.stored(os.path.join(d, io.METRICS_FILE))]
  for d in run_dirs:
    written += figures.run_figures(d, os.path.join(out, "runs", os.path.basename(d)))
  written += figures.group_figures(run_dirs, out, r)
  return written


def run_report(run_dir: str) -> list[str]:
  """A single run directory: its learning curve and the plug-ins' figures, into RUN_DIR/report."""
  out = os.path.join(run_dir, REPORT_DIR)
  os.makedirs(out, exist_ok=True)
  return [*report_lib.learning_curve(run_dir, os.path.join(out, "learning_curve.png")),
          *figures.run_figures(run_dir, out)]


def build(workdir: str, layout: dict[str, Any] | None = None) -> list[str]:
  """The report of a sweep directory or a run directory (module docstring); the paths written. `layout`: for a
  sweep directory, a sweep config (as JSON) whose `report` section to draw with (`with_layout`).

  A file of the directory that cannot be read, or is not what a run or sweep writes, is an
  `errors.DamagedRunFile` naming it (the readers in `io`); a report file that cannot be written (a
  read-only or full file system) an `errors.OutputWriteError`."""
  io.refuse_links(workdir, (REPORT_DIR,))  # (the report is written, and its old files replaced, in there)
  try:
    if os.path.exists(os.path.join(workdir, sweep_lib.SWEEP_FILE)):
      return sweep_report(workdir, layout)
    if io.stored(os.path.join(workdir, io.METRICS_FILE)):
      if layout is not None:
        raise ReportError(f"--config names sweep {layout.get('name')!r} but {workdir!r} is a run directory; allowed: "
                          "with a run directory, no sweep config (a run's report has no layout)")
      return run_report(workdir)
  except OSError as err:  # (reading raises DamagedRunFile: what is left is writing the report)
    raise errors.OutputWriteError.of(err, err.filename or os.path.join(workdir, REPORT_DIR)) from None
  raise ReportError(f"--workdir={workdir!r} is neither a sweep directory (no {sweep_lib.SWEEP_FILE}) nor a run "
                    "directory (no metrics.jsonl); allowed: the --workdir of a --mode=sweep or of a run")


__all__ = ["GENERIC_KINDS", "REPORT_DIR", "ReportError", "ReportKind", "SweepReport", "build", "load_members",
           "report_kinds", "run_report", "sweep_report", "with_layout"]
