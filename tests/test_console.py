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
  yield
  std_logging.getLogger().setLevel(root)
  logging.set_verbosity(absl_level)


def test_quiet_library_logs_keeps_warnings_and_drops_info_lines(restore_levels):
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger().setLevel(std_logging.INFO)
  modes.quiet_library_logs()
  for name in ("jax._src.xla_bridge", "tensorflow_datasets", "absl"):
    logger = std_logging.getLogger(name)
    assert not logger.isEnabledFor(std_logging.INFO) and logger.isEnabledFor(std_logging.WARNING), name
