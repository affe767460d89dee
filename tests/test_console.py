"""What a user sees on the console: the run's own lines, not the libraries' info logs (unless --verbose);
a whole run's console is checked in tests/e2e/test_console_run.py. And how a command exits.
"""

from __future__ import annotations

import logging as std_logging
import os
import subprocess
import sys

import pytest
from absl import logging

from fedpsa_jax.cli import modes
from helpers import ROOT


@pytest.fixture
def restore_levels():
  root, absl_level = std_logging.getLogger().level, logging.get_verbosity()
  filters = list(std_logging.getLogger("absl").filters)
  yield
  std_logging.getLogger().setLevel(root)
  logging.set_verbosity(absl_level)
  std_logging.getLogger("absl").filters[:] = filters


def test_quiet_library_logs_keeps_warnings_and_drops_info_lines(restore_levels):
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger().setLevel(std_logging.INFO)
  modes.quiet_library_logs()
  for name in ("jax._src.xla_bridge", "tensorflow_datasets", "absl"):
    logger = std_logging.getLogger(name)
    assert not logger.isEnabledFor(std_logging.INFO) and logger.isEnabledFor(std_logging.WARNING), name


def test_tfds_advice_to_install_opencv_is_dropped_other_warnings_are_kept(restore_levels, caplog):
  """tfds logs its OpenCV advice through absl the first time it decodes a split (a real fixture run shows
  it); nothing a user must do, so the quiet console drops it, and only it."""
  modes.quiet_library_logs()
  modes.quiet_library_logs()  # (twice: one filter, not two)
  assert std_logging.getLogger("absl").filters.count(modes._actionable) == 1
  with caplog.at_level(std_logging.WARNING, logger="absl"):
    logging.warning("OpenCV is not installed. We recommend using OpenCV because it is faster.")
    logging.warning("Dataset mnist is stored in an old format.")
  assert [r.getMessage() for r in caplog.records] == ["Dataset mnist is stored in an old format."]


# A process whose exit has a hook and an object that only a garbage collection frees (a cycle with `__del__`).
_EXIT = """
import atexit, gc, sys
from fedpsa_jax import cli
if sys.argv[1] == "skip":
  cli.skip_final_collections()
atexit.register(lambda: print("a later hook runs before the freeze:", gc.get_freeze_count() == 0))
class Cycle:
  def __del__(self):
    print("collected at exit")
cycle = Cycle()
cycle.itself = cycle
"""


@pytest.mark.parametrize("skip", [False, True])
def test_the_exit_skips_its_final_collections_after_every_other_exit_hook(skip):
  """launch.py calls `skip_final_collections` first: the interpreter's exit then no longer walks JAX's millions of
  objects looking for garbage (benchmarks/command_exit.py), and every exit hook still runs as before it."""
  done = subprocess.run([sys.executable, "-c", _EXIT, "skip" if skip else "keep"], cwd=ROOT, capture_output=True,
                        text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
  assert done.returncode == 0 and not done.stderr, done.stderr
  expected = ["a later hook runs before the freeze: True"] + ([] if skip else ["collected at exit"])
  assert done.stdout.splitlines() == expected
