"""The run directory (DESIGN §6): config.json, metrics.jsonl, events.jsonl, summary.json, checkpoints/.

Lines are appended and flushed one at a time and summary.json is replaced atomically, so a run that
dies leaves every line it wrote readable. A checkpoint records the byte size of metrics.jsonl and
events.jsonl when it was taken; resuming truncates them back to it (`RunDir.truncate`), so lines
written after the checkpoint, and a line cut off by a kill, are neither duplicated nor left behind.
`check_workdir` vets a workdir before any work: writable, and not holding a run of another config.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from typing import Any, Iterable

import ml_collections

from fedpsa_jax import config as config_lib

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _jsonable(value: Any) -> Any:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/Inf; keep them readable instead of writing invalid JSON
  if hasattr(value, "item") and getattr(value, "shape", None) == ():
    return _jsonable(value.item())
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def write_json_atomic(path: str, obj: Any) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(_jsonable(obj), f, indent=2, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def restore_nonfinite(record: dict) -> dict:
  """A record read back from JSON with the top-level 'nan'/'inf'/'-inf' strings (how `_jsonable`
  writes non-finite floats) turned back into floats."""
  return {k: _NONFINITE[v] if isinstance(v, str) and v in _NONFINITE else v for k, v in record.items()}


def config_json(config: ml_collections.ConfigDict) -> dict:
  """The config as config.json holds it (JSON types: lists for tuples, strings for non-finite floats)."""
  return json.loads(json.dumps(_jsonable(config.to_dict())))


def check_workdir(path: str, config: ml_collections.ConfigDict) -> bool:
  """Raises ConfigError, before any work, when `path` cannot be a run directory for `config`:
  it cannot be created or written, or it holds config.json of a different config (apart from
  `config.RESUMABLE_FIELDS`). Creates the directory; returns whether it had to."""
  created = not os.path.isdir(path)
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, f".write-test-{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as err:
    raise config_lib.ConfigError(
        f"--workdir={path!r} is not writable ({err.strerror or err}); allowed: a directory this user can "
        "create and write") from None
  saved_path = os.path.join(path, "config.json")
  if not os.path.exists(saved_path):
    return created
  try:
    with open(saved_path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as err:
    raise config_lib.ConfigError(f"--workdir={path!r} holds an unreadable config.json ({err}); allowed: "
                                 "a workdir with a valid config.json, or an empty or new workdir") from None
  diffs = config_lib.config_differences(saved, config_json(config))
  if diffs:
    shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
    raise config_lib.ConfigError(
        f"--workdir={path!r} holds a run of a different config ({shown}); allowed: the same config to "
        f"resume that run (only {', '.join(config_lib.RESUMABLE_FIELDS)} may change), or another "
        "--workdir")
  return created


class RunDir:
  """A run's output folder."""

  def __init__(self, path: str):
    self.path = path
    os.makedirs(path, exist_ok=True)
    self._files: dict[str, Any] = {}
    self._lock: Any = None

  def lock(self) -> None:
    """Claims the directory for this run until `close()` (or the process dies: the OS drops the lock
    then, so a killed run never leaves it stale). ConfigError if another run holds it: two runs
    appending to and truncating the same outputs would corrupt both."""
    f = open(self.file(".lock"), "a+")
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      f.seek(0)
      owner = f.read().strip() or "unknown"
      f.close()
      raise config_lib.ConfigError(
          f"--workdir={self.path!r} is in use by another run ({owner}); allowed: a workdir no running "
          "process (or unclosed Simulation) writes to") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    self._lock = f

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def write_config(self, config: ml_collections.ConfigDict) -> None:
    write_json_atomic(self.file("config.json"), config.to_dict())

  def append(self, name: str, records: Iterable[dict]) -> None:
    """Appends JSON lines to `name` and flushes them to the OS at once."""
    if name not in self._files:
      self._files[name] = open(self.file(name), "a")
    f = self._files[name]
    for record in records:
      f.write(json.dumps(_jsonable(record), sort_keys=True) + "\n")
    f.flush()

  def sync(self) -> None:
    """Flushes and fsyncs every open output, so that what a checkpoint records is on disk."""
    for f in self._files.values():
      f.flush()
      os.fsync(f.fileno())

  def size(self, name: str) -> int:
    """The byte size of output `name` (0 when absent), after flushing it."""
    if name in self._files:
      self._files[name].flush()
    path = self.file(name)
    return os.path.getsize(path) if os.path.exists(path) else 0

  def truncate(self, name: str, size: int) -> None:
    """Cuts output `name` back to `size` bytes (what a checkpoint recorded); RuntimeError if shorter."""
    if name in self._files:
      self._files.pop(name).close()
    path = self.file(name)
    have = os.path.getsize(path) if os.path.exists(path) else 0
    if have < size:
      raise RuntimeError(f"{path} has {have} bytes but the checkpoint resumed from recorded {size}; the file "
                         "was changed outside the run, so it cannot continue exactly")
    if os.path.exists(path) and have > size:
      with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())

  def write_summary(self, summary: dict) -> None:
    write_json_atomic(self.file("summary.json"), summary)

  def close(self) -> None:
    for f in self._files.values():
      f.close()
    self._files.clear()
    if self._lock is not None:
      self._lock.close()  # releases the flock
      self._lock = None
