"""Figure plug-ins: every module of this package may add figures to reports without report changes.

A module defines any of
- `run_figures(run_dir, out_dir) -> list[str]`: figures of one run directory (e.g. CASA's cluster
  assignments over time), written into `out_dir`;
- `group_figures(run_dirs, out_dir, report=None) -> list[str]`: figures over several runs, e.g. AiFed's
  accuracy against accumulated upload MiB; `report` (a `report_lib.SweepReport`) when the runs are a sweep's
  members, whose layout (arms, panels, printed names) the figure then follows;
- `REPORT_KINDS = {kind: fn}`: sweep report layouts beyond report.py's generic 'table', 'curves' and
  'heatmap', chosen by a sweep config's `report.kind`; `fn(r: report_lib.SweepReport) -> list[str]` writes
  into `r.out` (FedPSA's Fig. 5 'overhead' and Fig. 6 'alignment', figures/fedpsa.py).
`fedpsa_lab.report` calls `run_figures` below for each run and `group_figures` for the whole sweep; they
call the function of that name in every module that defines it (in module-name order) and return the
paths written. A module that has nothing to draw for a run (not its method) returns []. `report_kinds`
gathers the modules' kinds for `report.report_kinds`. The modules read run directories only, so that
reports need no JAX. They draw with `fedpsa_lab.report_lib` (tables, `pyplot`, `panels`, `save_figure`: the
lab's one figure style, a PDF beside each PNG), never with
`fedpsa_lab.report`, which imports this package.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from types import ModuleType
from typing import Sequence

from fedpsa_lab.report_lib import ReportKind, SweepReport


def modules() -> list[ModuleType]:
  """Every module of this package, imported (import is cached by Python, so calling this is cheap)."""
  return [importlib.import_module(f"{__name__}.{info.name}") for info in sorted(pkgutil.iter_modules(__path__),
                                                                                 key=lambda i: i.name)]


def run_figures(run_dir: str, out_dir: str) -> list[str]:
  """Every plug-in's figures of one run directory, written into `out_dir`; their paths. A plug-in that draws
  creates `out_dir`, so a sweep report whose members have no figure of their own leaves no empty folder each."""
  written: list[str] = []
  for module in modules():
    if hasattr(module, "run_figures"):
      written += list(module.run_figures(run_dir, out_dir) or [])
  return written


def group_figures(run_dirs: Sequence[str], out_dir: str, report: SweepReport | None = None) -> list[str]:
  """Every plug-in's figures over several run directories, written into `out_dir` (created), in the layout of
  `report` when they are its sweep's members; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  written: list[str] = []
  for module in modules():
    if hasattr(module, "group_figures"):
      written += list(module.group_figures(list(run_dirs), out_dir, report) or [])
  return written


def report_kinds() -> dict[str, ReportKind]:
  """{kind: fn} of every module's `REPORT_KINDS`; a kind that two modules define is an error (one would
  silently hide the other)."""
  kinds: dict[str, ReportKind] = {}
  for module in modules():
    for kind, fn in dict(getattr(module, "REPORT_KINDS", {})).items():
      if kind in kinds:
        raise ValueError(f"report kind {kind!r} is defined twice, the second time by {module.__name__}")
      kinds[kind] = fn
  return kinds
