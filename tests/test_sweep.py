"""Sweeps (fedpsa_jax/sweep.py): the lock that keeps a second sweep off a busy sweep directory, the bounds on
seeds and members, sweep.json's contract, and a full disk that stops a sweep (the whole sweeps run in
tests/e2e/test_sweep_runs.py).
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import errors, sweep
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


def test_seeds_and_members_are_bounded_before_anything_is_expanded(monkeypatch):
  """`seeds=1e9` would expand (and validate) billions of member configs in memory before the first one ran:
  the seed count and the member count are refused first, in one line."""
  import configs.paper.table1 as table1  # (tests/ and the repository root are on the path)

  with pytest.raises(config_lib.ConfigError, match=r"'seeds=1000000000' is invalid; allowed: seeds=<an integer in "
                     r"\[1, 1000\]>"):
    table1.get_config(f"smoke,seeds={10**9}")
  expanded = []
  monkeypatch.setattr(sweep.copy, "deepcopy", lambda x: expanded.append(x) or x)
  grid = table1.get_config("smoke,seeds=1000")  # 42 combinations (3 excluded) x 1,000 seeds
  with pytest.raises(config_lib.ConfigError, match=r"^sweep 'table1-smoke' has 42,000 members \(1000 seeds\); "
                     r"allowed: at most 10,000"):
    sweep.expand(grid)
  assert expanded == []  # refused before any member was built
  grid.seeds = list(range(sweep.MAX_SEEDS + 1))
  with pytest.raises(config_lib.ConfigError, match=r"sweep seeds='\[1001 seeds\]' is invalid; allowed: a list of 1 "
                     r"to 1,000 integers"):
    sweep.expand(grid)


@pytest.mark.parametrize("saved,problem", [
    ({"hello": 1}, "its 'sweep' is not an object with 'name' and a list 'axes'"),
    ({"sweep": {"name": "s", "axes": []}, "members": {"a": 1}}, "its 'members' is not a list of objects"),
    ({"sweep": {"name": "s", "axes": []}, "members": [{"name": "m"}]}, "its 'members' is not a list of objects"),
    ([1, 2], "holds a JSON array, not an object"),
])
def test_a_sweep_json_this_code_did_not_write_is_named_with_its_contract(tmp_path, saved, problem):
  (tmp_path / sweep.SWEEP_FILE).write_text(json.dumps(saved))
  with pytest.raises(errors.DamagedRunFile) as err:
    sweep.read_sweep_json(str(tmp_path))
  assert problem in str(err.value) and "allowed: a sweep.json as --mode=sweep writes it" in str(err.value)


def test_a_full_disk_stops_the_sweep_instead_of_failing_every_member(tmp_path, monkeypatch):
  """Every member after one that met a full disk would fail alike (each after building its run): the sweep
  stops with that member's OutputWriteError (exit 3), and rerunning resumes it."""
  ran = []

  def member(config_json, run_dir, compilation_cache=None):
    ran.append(os.path.basename(run_dir))
    raise errors.OutputWriteError(errno.ENOSPC, "No space left on device", os.path.join(run_dir, "metrics.jsonl"))

  monkeypatch.setattr(sweep, "run_member", member)
  with pytest.raises(errors.OutputWriteError) as err:
    sweep.run_local(_tiny_sweep(), str(tmp_path / "sweep"), log=lambda _: None)
  assert len(ran) == 1 and err.value.filename.endswith(os.path.join(ran[0], "metrics.jsonl"))
  full = OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(sweep.io, "write_json_atomic", lambda *args: (_ for _ in ()).throw(full))
  with pytest.raises(errors.OutputWriteError, match=r"cannot write .*sweep.json: No space left on device \(ENOSPC\)"):
    sweep.write_sweep_json(_tiny_sweep(), [], str(tmp_path / "other"))
