"""The member loop both sweep executors share, and the local executor.

Both executors hand their members' outcomes to one loop (`collect`: failures, a full disk, records, the log): the
local one (`run_local`) runs them one after another in this process, the Ray one (`fedpsa_jax.sweep.ray_executor`)
as tasks on a cluster. Before any of that, a symbolic link among what the sweep writes in its directory or in a
records directory is refused (`check_dirs`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator, Sequence

import ml_collections

from fedpsa_jax import io
from fedpsa_jax.errors import OutputWriteError, is_write_limit
from fedpsa_jax.sweep import members as members_lib
from fedpsa_jax.sweep import records
from fedpsa_jax.sweep.grid import Member, expand, run_order
from fedpsa_jax.sweep.members import LOCK_FILE, RUNS_DIR, SWEEP_FILE, SWEEP_WRITES, locked, member_dir, write_sweep_json


def check_dirs(sweep: ml_collections.ConfigDict, sweep_dir: str, records_dir: str | None,
               compilation_cache: str | None) -> None:
  """ConfigError before any work when the sweep directory holds an entry the sweep writes through that is a symbolic
  link (`SWEEP_WRITES`, every member's run directory included, and the compilation cache when it lies in there), or
  when `records_dir` cannot keep this sweep's records (`check_records_dir`)."""
  cache = [os.path.relpath(compilation_cache, sweep_dir)] if compilation_cache and os.path.abspath(
      os.path.dirname(compilation_cache)) == os.path.abspath(sweep_dir) else []
  io.refuse_links(sweep_dir, (*SWEEP_WRITES, *cache))
  io.check_entry_kinds(sweep_dir, (LOCK_FILE, SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX), (RUNS_DIR,), "--workdir",
                       "a sweep", "a sweep directory")
  if records_dir:
    records.check_records_dir(records_dir, sweep, sweep_dir)


def _stop_if_disk_full(err: BaseException, run_dir: str) -> None:
  """Raises the OutputWriteError of a member that failed on a full disk (or quota, or a file-size limit): the sweep
  stops there."""
  if is_write_limit(err):
    raise OutputWriteError.of(err, getattr(err, "filename", None) or run_dir) from None


def _failure(member: Member, err: BaseException) -> dict[str, Any]:
  return {"status": "failed", "sweep_action": "failed", "error": f"{type(err).__name__}: {err}", "member": member.name}


# One member's outcome as an executor hands it over: the member and a call that returns its summary (running
# it, for the local executor; reading a finished task's result, for Ray) or raises what the member raised.
Completion = tuple[Member, Callable[[], dict]]


def collect(members: Sequence[Member], completions: Iterator[Completion], sweep_dir: str, records_dir: str | None,
            log: Callable[[str], None], stop: Callable[[], None] = lambda: None) -> dict[str, dict]:
  """The member loop both executors share: each member's summary as it completes, its record kept, a line logged;
  {member name: summary}, in axis order.

  A member that raises an Exception is recorded as failed and the sweep goes on, except on a full disk (every
  member after it would fail alike): `stop()` (the executor's members still running are cancelled) and the
  member's OutputWriteError. `records_dir`: see `fedpsa_jax.sweep.records` (each member's record is saved once it
  has finished, skipped members' too)."""
  results, start = {}, time.perf_counter()
  for m, outcome in completions:
    try:
      results[m.name] = outcome()
    except Exception as err:  # noqa: BLE001 — one broken member must not stop a long sweep
      if is_write_limit(err):
        stop()
      _stop_if_disk_full(err, member_dir(sweep_dir, m))
      results[m.name] = _failure(m, err)
    if records_dir:
      records.save_record(member_dir(sweep_dir, m), records_dir, m.name)
    log(f"[{len(results)}/{len(members)}] {m.name}: {_outcome(results[m.name])} "
        f"({time.perf_counter() - start:.1f} s into the sweep)")
  return {m.name: results[m.name] for m in members}


def run_local(sweep: ml_collections.ConfigDict, sweep_dir: str, log: Callable[[str], None] = print,
              compilation_cache: str | None = None, records_dir: str | None = None) -> dict[str, dict]:
  """Runs every member one after another in this process, seed by seed (`run_order`); {member name: summary},
  in axis order. A failed member, a full disk and `records_dir`: as `collect` says. An interruption
  (KeyboardInterrupt) stops the sweep; rerunning resumes (finished members are skipped)."""
  members = expand(sweep)
  check_dirs(sweep, sweep_dir, records_dir, compilation_cache)
  with locked(sweep_dir, sweep.name):
    write_sweep_json(sweep, members, sweep_dir)
    records.open_records(sweep, members, sweep_dir, records_dir, log)
    completions = ((m, lambda m=m: members_lib.run_member(io.config_json(m.config), member_dir(sweep_dir, m),
                                                          compilation_cache))
                   for m in run_order(members))
    return collect(members, completions, sweep_dir, records_dir, log)


def _outcome(summary: dict[str, Any]) -> str:
  if summary.get("sweep_action") == "failed":
    return f"failed ({summary['error']})"
  acc = summary.get("final_test_accuracy")
  return f"{summary['sweep_action']}, {summary.get('status')}" + (f", final acc {acc:.4f}" if acc is not None else "")
