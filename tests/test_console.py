"""What a user sees on the console: the run's own lines, not the libraries' info logs (unless --verbose);
a whole run's console is checked in tests/e2e/test_console_run.py.
"""

from __future__ import annotations

import logging as std_logging

import pytest
from absl import logging

from fedpsa_jax.cli import modes


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
