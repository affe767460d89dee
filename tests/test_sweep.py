"""Sweeps (fedpsa_jax/sweep.py): the lock that keeps a second sweep off a busy sweep directory (the whole
sweeps run in tests/e2e/test_sweep_runs.py).
"""

from __future__ import annotations

import os

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep
from helpers import _tiny_sweep


def test_a_second_sweep_on_a_busy_sweep_directory_is_refused(tmp_path, monkeypatch):
  """A sweep holds SWEEP_DIR/.lock from writing sweep.json to its last member: a second sweep on the same
  directory is refused at once, before it writes or runs anything, and runs once the first has ended."""
  workdir = str(tmp_path / "sweep")
  ran, claims = [], []

  def member(config_json, run_dir, compilation_cache=None):
    ran.append(os.path.basename(run_dir))
    try:  # the directory stays claimed while the members run
      with sweep.locked(workdir, "intruder"):
        claims.append("taken")
    except config_lib.ConfigError:
      claims.append("refused")
    return {"status": "completed", "sweep_action": "ran"}

  monkeypatch.setattr(sweep, "run_member", member)
  with sweep.locked(workdir, "first"):
    with pytest.raises(config_lib.ConfigError) as err:
      sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)
    assert str(err.value) == (f"--workdir={workdir!r} is in use by another sweep or run (sweep first, pid "
                              f"{os.getpid()}); allowed: a sweep directory no running sweep uses (wait for that "
                              "one to end: rerunning the same command then resumes it), or another --workdir")
    assert ran == [] and os.listdir(workdir) == [sweep.LOCK_FILE]  # nothing written, nothing run
  results = sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)  # released: the next one runs
  assert len(results) == len(ran) == 3 and claims == ["refused"] * 3
  with sweep.locked(workdir):  # and releases it at its end
    pass
