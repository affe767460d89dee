"""A sweep's directory and one member's run in it.

Every member runs into `SWEEP_DIR/runs/<member name>` (`member_dir`). Both executors run each member with the
same function, `run_member`, which skips a member whose summary.json says `completed` for this very run
(`is_done`: the same run identity, `run_identity.run_identity`, and the same budget) and otherwise lets
`Simulation` continue it from its own checkpoint (or start it): an interrupted sweep rerun with the same command
redoes nothing finished, and a field added to another method's section since then reruns nothing.
`SWEEP_DIR/sweep.json` holds the sweep config and the member list, which is all the report needs. A running sweep
holds `SWEEP_DIR/.lock` (`locked`) from writing sweep.json to its last member: a second sweep on the same directory
is refused at once (ConfigError), never run beside it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import ml_collections

from fedpsa_jax import compilation_cache as compilation_cache_lib
from fedpsa_jax import io, run_identity
from fedpsa_jax.data import fingerprint
from fedpsa_jax.errors import DamagedRunFile, OutputWriteError
from fedpsa_jax.sweep.grid import Member

SWEEP_FILE = "sweep.json"
LOCK_FILE = io.LOCK_FILE
RUNS_DIR = "runs"
# What a sweep writes, moves or deletes in its directory (the folders with all they hold: every member's run
# directory): none may be a symbolic link (`io.refuse_links`).
SWEEP_WRITES = (LOCK_FILE, SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX, RUNS_DIR)


def member_dir(sweep_dir: str, member: Member | str) -> str:
  return os.path.join(sweep_dir, RUNS_DIR, member if isinstance(member, str) else member.name)


def write_sweep_json(sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str) -> str:
  """SWEEP_DIR/sweep.json: the sweep config (its base as config.json holds a run config) and members.
  OutputWriteError when it cannot be written (a full disk)."""
  path = os.path.join(sweep_dir, SWEEP_FILE)
  try:
    os.makedirs(os.path.join(sweep_dir, RUNS_DIR), exist_ok=True)
    io.write_json_atomic(path, {"sweep": io.config_json(sweep), "members": [m.as_json() for m in members]})
  except OSError as err:
    raise OutputWriteError.of(err, err.filename or path) from None
  return path


@contextlib.contextmanager
def locked(sweep_dir: str, name: str = "") -> Iterator[None]:
  """Holds SWEEP_DIR/.lock inside the block: the sweep's claim on its directory (`io.claim`, the claim a
  run's `io.RunDir.lock` takes too). ConfigError at once if another sweep (or a run) holds it: two sweeps
  writing sweep.json and running the same members into the same run directories would collide."""
  try:
    os.makedirs(sweep_dir, exist_ok=True)
  except OSError as err:
    raise OutputWriteError.of(err, sweep_dir) from None
  owner = f"sweep {name}, pid {os.getpid()}" if name else f"sweep, pid {os.getpid()}"
  f = io.claim(os.path.join(sweep_dir, LOCK_FILE), owner, lambda holder: (
      f"--workdir={sweep_dir!r} is in use by another sweep or run ({holder}); allowed: a sweep directory no "
      "running sweep uses (wait for that one to end: rerunning the same command then resumes it), or another "
      "--workdir"))
  try:
    yield
  finally:
    f.close()  # releases the claim


def read_sweep_json(sweep_dir: str) -> dict[str, Any]:
  """SWEEP_DIR/sweep.json: {'sweep': the sweep config, 'members': [{name, labels, overrides}]}; DamagedRunFile
  naming what is missing when the file is not one `write_sweep_json` wrote (another tool's sweep.json)."""
  path = os.path.join(sweep_dir, SWEEP_FILE)
  contract = ("a sweep.json as --mode=sweep writes it: an object with 'sweep' (the sweep config: name, axes, ...) "
              "and 'members' (a list of objects with a 'name' and 'labels')")
  saved = io.read_json_object(path, contract)
  sweep, members = saved.get("sweep"), saved.get("members")
  problem = ("its 'sweep' is not an object with 'name' and a list 'axes'"
             if not (isinstance(sweep, dict) and "name" in sweep and isinstance(sweep.get("axes"), list)) else
             "its 'members' is not a list of objects with a string 'name' and an object 'labels'"
             if not (isinstance(members, list) and all(isinstance(m, dict) and isinstance(m.get("name"), str)
                                                        and isinstance(m.get("labels"), dict) for m in members)) else
             None)
  if problem:
    raise DamagedRunFile(f"{path}: {problem}; allowed: {contract}")
  return saved


def is_done(config_json: dict[str, Any], run_dir: str) -> bool:
  """Whether `run_dir` holds a completed run of this config (JSON form), so it can be skipped: the same
  run identity (`run_identity.identity_differences`: shared sections and the method's own section) and the same
  budget. A completed run with a smaller `sim.virtual_days` is not done: `Simulation` extends it. With `data.path`,
  the content must be the same too (`data.fingerprint`, computed here as the run computes it)."""
  summary, saved = io.read_summary(run_dir), io.read_config(run_dir)
  if not summary or summary.get("status") != "completed" or saved is None:
    return False
  same_budget = saved.get("sim", {}).get("virtual_days") == config_json["sim"]["virtual_days"]
  return same_budget and not run_identity.identity_differences(saved, fingerprint.pinned_json(config_json))


def run_member(config_json: dict[str, Any], run_dir: str, compilation_cache: str | None = None) -> dict[str, Any]:
  """Runs one member into `run_dir` unless it is done there; returns its summary.json as read back,
  with `sweep_action` 'ran' or 'skipped'.

  The one function both executors call (the Ray task sends the config as JSON), so both leave the same
  run directories and give the same summaries. A partial run directory continues from its checkpoint.
  `compilation_cache`: a directory for `compilation_cache.enable` (None: leave JAX as configured).
  """
  io.refuse_link_made(os.path.dirname(run_dir))  # (SWEEP_DIR/runs, checked at the start, made a link since: exit 3)
  if is_done(config_json, run_dir):  # (before JAX is imported: a Ray task's fresh process skips it cheaply)
    return {**io.read_summary(run_dir), "sweep_action": "skipped"}
  from fedpsa_jax.sim import runner  # imported here: expanding a sweep needs no JAX

  if compilation_cache:
    compilation_cache_lib.enable(compilation_cache)
  config = ml_collections.ConfigDict(config_json)
  runner.Simulation(config, run_dir).run()
  return {**io.read_summary(run_dir), "sweep_action": "ran"}
