"""The lab's modes of launch.py: `report`, the tables and figures of a sweep or a run directory.

launch.py hands `MODES` to the simulator's `fedpsa_jax.cli.modes.main`, which runs a mode it does not hold
itself through this table, inside the same one-line error handling and exit codes as its own modes.
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax import cli, errors, io
from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep as sweep_lib
from fedpsa_jax.cli import modes as core_modes


def run_report(workdir: str | None, config: ml_collections.ConfigDict | None = None) -> int:
  """The report mode: tables and figures of a sweep or a run directory into WORKDIR/report. With a sweep
  `config` (`--config=SWEEP_CONFIG`), its report section is the layout (`report.with_layout`); any other
  config (launch.py's default) is not used."""
  from fedpsa_lab import report  # matplotlib only when a report is drawn

  if not workdir:
    raise config_lib.ConfigError("--workdir is required for --mode=report; allowed: a sweep directory (with "
                                 "sweep.json) or a run directory (with metrics.jsonl)")
  layout = io.config_json(config) if config is not None and sweep_lib.is_sweep_config(config) else None
  try:
    written = report.build(workdir, layout)
  except report.ReportError as err:  # (report.py's own error type: bad input as well)
    raise errors.UserError(str(err)) from None
  cli.say("\n".join(["report written:", *written]))
  return cli.EXIT_OK


def report_mode(config: ml_collections.ConfigDict, options: core_modes.Options) -> int:
  """`--mode=report`: `run_report` of `--workdir`, with `--config` as the layout when it is a sweep config."""
  return run_report(options.workdir, config)


MODES: dict[str, core_modes.Mode] = {"report": report_mode}
