"""Entry point: `python launch.py --config=configs/default.py[:arg] [--config.field=value ...]`.

Modes: train (default). A bad config fails before any work with one message naming each bad field.
"""

from __future__ import annotations

import datetime
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from fedpsa_jax import config as config_lib
from fedpsa_jax.sim import runner

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Run config file[:arg].",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
_MODE = flags.DEFINE_enum("mode", "train", ["train"], "What to do with the config.")


def default_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  arg = config_path.split(":", 1)[1].replace(",", "_").replace("=", "-") if ":" in config_path else ""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}{'-' + arg if arg else ''}-{stamp}")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  errors = config_lib.config_errors(config)
  if errors:
    print("invalid config:\n  " + "\n  ".join(errors), file=sys.stderr)
    return 2
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename
                                              if hasattr(flags.FLAGS["config"], "config_filename")
                                              else sys.argv[0])
  logging.info("workdir: %s", workdir)
  summary = runner.Simulation(config, workdir).run()
  print(runner.summary_line(summary))
  print(f"outputs in {workdir}")
  return 0 if summary["status"] == "completed" else 1


if __name__ == "__main__":
  app.run(main)
