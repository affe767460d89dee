"""Figure plug-ins: every module of this package may add figures to reports without report changes.

A module defines either or both of
- `run_figures(run_dir, out_dir) -> list[str]`: figures of one run directory (e.g. CASA's cluster
  assignments over time), written into `out_dir`;
- `group_figures(run_dirs, out_dir) -> list[str]`: figures over several runs (a sweep), e.g. AiFed's
  accuracy against accumulated upload MB.
`fedpsa_jax.report` calls `run_figures` below for each run and `group_figures` for the whole sweep; they
call the function of that name in every module that defines it (in module-name order) and return the
paths written. A module that has nothing to draw for a run (not its method) returns [].
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from types import ModuleType
from typing import Sequence


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display), chosen when a figure is drawn, not
  when a module is imported. Every figure of the report and of the plug-ins gets pyplot here."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def modules() -> list[ModuleType]:
  """Every module of this package, imported (import is cached by Python, so calling this is cheap)."""
  return [importlib.import_module(f"{__name__}.{info.name}") for info in sorted(pkgutil.iter_modules(__path__),
                                                                                 key=lambda i: i.name)]


def run_figures(run_dir: str, out_dir: str) -> list[str]:
  """Every plug-in's figures of one run directory, written into `out_dir` (created); their paths."""
  os.makedirs(out_dir, exist_ok=True)
  written: list[str] = []
  for module in modules():
    if hasattr(module, "run_figures"):
      written += list(module.run_figures(run_dir, out_dir) or [])
  return written


def group_figures(run_dirs: Sequence[str], out_dir: str) -> list[str]:
  """Every plug-in's figures over several run directories, written into `out_dir` (created); their paths."""
  os.makedirs(out_dir, exist_ok=True)
  written: list[str] = []
  for module in modules():
    if hasattr(module, "group_figures"):
      written += list(module.group_figures(list(run_dirs), out_dir) or [])
  return written
