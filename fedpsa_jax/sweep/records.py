"""A sweep's records: the finished members' results kept in a directory of their own (`--records=DIR`).

With a records directory, each finished member's record (`RECORD_FILES`: its config, summary, metrics and events,
not its checkpoints) is also kept in DIR/runs/<member>, and a member whose record there is done for its config
starts done (`restore_records`): DIR, small enough to commit, is a sweep directory the report reads, and it carries
a sweep's finished members to a fresh machine (docs/results.md keeps its sweeps so). Before any work, a symbolic
link among what the sweep writes in DIR (`RECORDS_WRITES`: every record included) is refused
(`check_records_dir`), and records are copied with links kept as links: a record's file linked elsewhere never
brings the file it points to into a sweep or a records directory.

The files on disk are what readers at any version read (`fedpsa_jax.io`): a record written plain by an earlier
version is read the same as a compressed one.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Sequence

import ml_collections

from fedpsa_jax import io
from fedpsa_jax.errors import ConfigError, DamagedRunFile, OutputWriteError
from fedpsa_jax.sweep.grid import Member
from fedpsa_jax.sweep.members import RUNS_DIR, SWEEP_FILE, is_done, member_dir, read_sweep_json, write_sweep_json

RECORD_FILES = (io.CONFIG_FILE, io.SUMMARY_FILE, io.METRICS_FILE, io.EVENTS_FILE)  # what `is_done` and a report read
# The record files a records directory keeps compressed (`io.compress_jsonl`: FILE.xz, read as FILE by `io`): the
# per-evaluation and per-update logs, nearly all of a record's bytes. A record written plain (by an earlier version,
# or copied in by hand) is read the same; `compress_records` converts one.
COMPRESSED_FILES = (io.METRICS_FILE, io.EVENTS_FILE)
FINISHED = ("completed", "diverged")  # the run statuses whose record is kept (`save_record`)
# What a sweep writes, moves or deletes in a records directory (the folders with all they hold): none may be a
# symbolic link (`io.refuse_links`).
RECORDS_WRITES = (SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX, RUNS_DIR)


def check_records_dir(records_dir: str, sweep: ml_collections.ConfigDict, sweep_dir: str) -> None:
  """ConfigError before any work when `records_dir` cannot keep this sweep's records: it is the sweep directory
  itself, a file, or the records of another sweep (its sweep.json names another one)."""
  if os.path.realpath(records_dir) == os.path.realpath(sweep_dir):
    raise ConfigError(f"--records={records_dir!r} is the sweep directory itself; allowed: another directory (the "
                      "records are a copy of the finished members, without their checkpoints)")
  if os.path.lexists(records_dir) and not os.path.isdir(records_dir):
    raise ConfigError(f"--records={records_dir!r} is not a directory; allowed: a directory (made if missing)")
  # (a member's file linked elsewhere is never copied; records are only copied, never rewritten in place: a hard
  # link there, a `cp -al` backup, is harmless)
  io.refuse_links(records_dir, RECORDS_WRITES, "--records", rewritten=())
  io.check_entry_kinds(records_dir, (SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX), (RUNS_DIR,), "--records",
                       "a sweep", "a records directory")
  if not os.path.exists(os.path.join(records_dir, SWEEP_FILE)):
    return
  try:
    kept = read_sweep_json(records_dir)["sweep"]["name"]
  except (DamagedRunFile, OSError, ValueError) as err:
    raise ConfigError(f"--records={records_dir!r} holds an unreadable {SWEEP_FILE} ({err}); allowed: the "
                      "records directory of this sweep, or a new one") from None
  if kept != sweep.name:
    raise ConfigError(f"--records={records_dir!r} holds the records of sweep {kept!r}, not of {sweep.name!r}; "
                      "allowed: the records directory of this sweep, or a new one")


def save_record(run_dir: str, records_dir: str, name: str) -> bool:
  """Copies a finished member's record (`RECORD_FILES`, not its checkpoints) from `run_dir` to
  records_dir/runs/<name>, replacing an older copy by one rename (a half-written record is never seen).
  Finished: completed, or diverged (a result the report shows). False, copying nothing, for a member not
  finished (running, interrupted, failed). OutputWriteError when it cannot be written."""
  summary = io.read_summary(run_dir)
  if not summary or summary.get("status") not in FINISHED:
    return False
  target = member_dir(records_dir, name)
  fresh, stale = f"{target}.new", f"{target}.old"
  io.refuse_link_made(os.path.dirname(target))  # (RECORDS/runs, checked at the start, made a link since: exit 3)
  try:
    for leftover in (fresh, stale):  # (a copy an interrupted save left)
      shutil.rmtree(leftover, ignore_errors=True)
    os.makedirs(fresh)
    for file in RECORD_FILES:
      if os.path.lexists(os.path.join(run_dir, file)):  # (a link, made since the check, is copied as a link)
        shutil.copy2(os.path.join(run_dir, file), fresh, follow_symlinks=False)
    for file in COMPRESSED_FILES:  # (kept as FILE.xz: what every reader of `io` reads as FILE)
      io.compress_jsonl(os.path.join(fresh, file))
    if os.path.exists(target):
      os.replace(target, stale)
    os.replace(fresh, target)
    shutil.rmtree(stale, ignore_errors=True)
  except OSError as err:
    raise OutputWriteError.of(err, err.filename or target) from None
  return True


def compress_records(records_dir: str) -> int:
  """Compresses the plain metrics and events of every record in `records_dir` (`COMPRESSED_FILES`), as
  `save_record` keeps them; the number of files compressed. For records an earlier version wrote plain."""
  count = 0
  for name in sorted(os.listdir(os.path.join(records_dir, RUNS_DIR))):
    folder = os.path.join(records_dir, RUNS_DIR, name)
    if os.path.isdir(folder) and not os.path.islink(folder):
      count += sum(io.compress_jsonl(os.path.join(folder, file)) for file in COMPRESSED_FILES)
  return count


def restore_records(records_dir: str, sweep_dir: str, members: Sequence[Member]) -> list[str]:
  """Copies into `sweep_dir` the record of each member that has no run directory there yet and whose record in
  `records_dir` is done for its config (`is_done`: the same run identity and budget); the names restored. A run
  directory already there is left to continue its own run; a record of another config or budget stays unused."""
  restored = []
  for m in members:
    record, run_dir = member_dir(records_dir, m), member_dir(sweep_dir, m)
    if os.path.lexists(run_dir) or not os.path.isdir(record) or not is_done(io.config_json(m.config), record):
      continue
    try:
      shutil.rmtree(f"{run_dir}.new", ignore_errors=True)  # (a copy an interrupted restore left)
      shutil.copytree(record, f"{run_dir}.new", symlinks=True)  # (links as links, never their targets)
      for file in COMPRESSED_FILES:  # (a run appends to the plain files, should it be extended)
        io.decompress_jsonl(os.path.join(f"{run_dir}.new", file))
      os.replace(f"{run_dir}.new", run_dir)
    except OSError as err:
      raise OutputWriteError.of(err, err.filename or run_dir) from None
    restored.append(m.name)
  return restored


def open_records(sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str,
                 records_dir: str | None, log: Callable[[str], None]) -> None:
  """A sweep's start with a records directory: its finished members restored, its sweep.json written."""
  if not records_dir:
    return
  restored = restore_records(records_dir, sweep_dir, members)
  if restored:
    log(f"{len(restored)} finished member(s) restored from the records in {records_dir}")
  write_sweep_json(sweep, members, records_dir)
