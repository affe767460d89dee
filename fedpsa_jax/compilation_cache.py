"""JAX's persistent compilation cache for sweeps: turned on once per process, cleared of what killed processes left.

A sweep's members compile the same functions again and again (new closures, same HLO); the cache, keyed by
HLO, backend and JAX version, spares a member most of its compiles (docs/performance.md). Cached executables
are the compiled code itself: results do not change.

JAX writes an entry in place (its file cache, `LRUCache`: `KEY-cache`, then, when a size cap turns eviction on,
`KEY-atime`), and never rewrites a key that exists. So a process killed while it writes (a stopped sweep, a
Ctrl-C'd `make test-fast`) can leave
- a truncated `KEY-cache`: every later process that compiles that function warns "Error reading persistent
  compilation cache entry ... incomplete or truncated stream" on stderr and compiles it again, forever;
- with eviction on, a `KEY-cache` without its `KEY-atime`: every later write fails and warns (JAX reads every
  entry's atime before it writes one), so the cache stops growing.
And a process that reads an entry while another writes it (two members of a Ray sweep on one node, the test
suite's workers) sees the same truncation and warns on its console. `write_whole_entries` makes this process
write each file of an entry whole (into a temporary file beside it, then renamed over it), so that no reader ever
sees part of one and a killed writer leaves only its temporary file; `repair` removes what older writers left
before a process uses the directory, and temporary files an hour old: the function is compiled once more and
stored whole.

An entry is judged by JAX's own reader (`_jax_entry_reader`: the functions JAX reads an entry with, so the
judgement follows JAX's layout when an upgrade changes it), never by a copy of that layout here. Where this JAX
no longer has those functions, no entry can be judged: `repair` removes nothing, and says so once in the log.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Callable

_log = logging.getLogger(__name__)


@functools.cache
def _jax_entry_reader() -> tuple[Callable[[bytes], object], str, str] | None:
  """(read, cache suffix, atime suffix) from this JAX's file cache: `read(data)` raises when JAX could not read
  the entry `data` (a truncated or damaged compressed stream, or no executable after the compile-time prefix).
  None when this JAX does not have them (nothing can then be judged)."""
  try:
    from jax._src import compilation_cache as jax_cache
    from jax._src import lru_cache

    decompress, split = jax_cache.decompress_executable, jax_cache.extract_executable_and_time
    suffixes = (lru_cache._CACHE_SUFFIX, lru_cache._ATIME_SUFFIX)  # noqa: SLF001 — JAX's own names
  except (ImportError, AttributeError) as err:
    _log.warning("compilation cache: this JAX has no entry reader to judge entries with (%s); none is removed",
                 err)
    return None

  def read(data: bytes) -> object:
    executable, _ = split(decompress(data))
    if not executable:
      raise ValueError("no executable after the compile time")
    return executable

  return read, *suffixes


def is_complete(data: bytes) -> bool:
  """Whether JAX can read `data`, a `KEY-cache` file's bytes, as an entry (True when this JAX cannot tell)."""
  reader = _jax_entry_reader()
  if reader is None:
    return True
  try:
    reader[0](data)
  except Exception:  # each decompressor raises its own error type for a damaged stream
    return False
  return True


def damaged_entries(path: str) -> list[str]:
  """The `KEY-cache` files of the cache directory `path` (sorted names) that a killed writer left: ones JAX
  cannot read (`is_complete`), and, in a directory where eviction keeps last-access times, ones without their
  `KEY-atime`. [] when this JAX cannot judge them."""
  reader = _jax_entry_reader()
  if reader is None:
    return []
  _, cache_suffix, atime_suffix = reader
  names = set(os.listdir(path))
  evicting = any(n.endswith(atime_suffix) for n in names)
  damaged = []
  for name in sorted(n for n in names if n.endswith(cache_suffix)):
    key = name[:-len(cache_suffix)]
    try:
      with open(os.path.join(path, name), "rb") as f:
        whole = is_complete(f.read())
    except FileNotFoundError:  # evicted or repaired by another process meanwhile
      continue
    if not whole or (evicting and key + atime_suffix not in names):
      damaged.append(name)
  return damaged


_PARTIAL = ".partial-"  # (in the names of `write_whole_entries`' temporary files: `.KEY-cache.partial-PID-THREAD`)
_PARTIAL_AGE_SECONDS = 3600  # a temporary file this old lost its writer (a write takes well under a second)


class _WholeWrites:
  """Mixed into the class of a cache's path: `write_bytes` writes a temporary file beside the path and renames it
  over the path (one step on a POSIX filesystem), so that a reader finds the whole file or none. Paths joined to
  it are of the same class (pathlib keeps a path's class)."""

  def write_bytes(self, data) -> int:
    target = os.fspath(self)
    partial = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}{_PARTIAL}{os.getpid()}-"
                           f"{threading.get_ident()}")
    try:
      with open(partial, "wb") as f:
        f.write(data)
      os.replace(partial, target)
    finally:
      if os.path.lexists(partial):  # (the write failed: nothing of it is left)
        os.remove(partial)
    return len(data)


@functools.cache
def _whole_writes_class(path_class: type) -> type:
  """`path_class` (JAX's: etils' local path where etils is installed, else pathlib's) with `_WholeWrites`."""
  return type(f"WholeWrites{path_class.__name__}", (_WholeWrites, path_class), {})


@functools.cache
def write_whole_entries() -> bool:
  """Makes JAX's file cache in this process write each file of an entry whole (`_WholeWrites`): its `LRUCache`
  reads and writes through its `path`, which a cache in a local directory gets as a path of that class at its first
  `get` or `put` (a remote one, `gs://...`, keeps JAX's own writes). Idempotent; False (and JAX's own writes) where
  this JAX has no such file cache."""
  try:
    from jax._src import lru_cache
    get, put = lru_cache.LRUCache.get, lru_cache.LRUCache.put
  except (ImportError, AttributeError) as err:
    _log.warning("compilation cache: this JAX has no file cache to write whole entries with (%s)", err)
    return False

  def whole(cache: lru_cache.LRUCache) -> None:
    if not isinstance(cache.path, _WholeWrites) and "://" not in str(cache.path):
      cache.path = _whole_writes_class(type(cache.path))(os.fspath(cache.path))

  @functools.wraps(get)
  def get_whole(self, key: str):
    whole(self)
    return get(self, key)

  @functools.wraps(put)
  def put_whole(self, key: str, value: bytes) -> None:
    whole(self)
    return put(self, key, value)

  lru_cache.LRUCache.get, lru_cache.LRUCache.put = get_whole, put_whole
  return True


def _stale_partial_files(path: str) -> list[str]:
  """The temporary files of `write_whole_entries` in `path` whose writer is gone (an hour old or more)."""
  old = time.time() - _PARTIAL_AGE_SECONDS
  stale = []
  for name in os.listdir(path):
    try:
      if _PARTIAL in name and os.stat(os.path.join(path, name)).st_mtime < old:
        stale.append(name)
    except FileNotFoundError:
      continue
  return stale


def repair(path: str) -> list[str]:
  """Removes `damaged_entries(path)` (with their `KEY-atime`) and returns their names, and the temporary files of
  writers gone (`write_whole_entries`); nothing when `path` does not exist. A function whose entry was removed
  compiles once more and is stored whole."""
  if not os.path.isdir(path):
    return []
  for name in _stale_partial_files(path):
    try:
      os.remove(os.path.join(path, name))
    except FileNotFoundError:
      pass
  removed = damaged_entries(path)
  for name in removed:
    _, cache_suffix, atime_suffix = _jax_entry_reader()
    for file in (name, name[:-len(cache_suffix)] + atime_suffix):
      try:
        os.remove(os.path.join(path, file))
      except FileNotFoundError:
        pass
  if removed:
    _log.info("compilation cache %s: removed %d entries left incomplete by a stopped process", path, len(removed))
  return removed


def enable(path: str) -> bool:
  """Turns on JAX's persistent compilation cache in `path` for this process (after `repair`), unless one is
  configured. It must be set before this process compiles anything (JAX reads it once), so the sweep mode
  calls it before any member runs and each Ray task calls it in its worker. Returns whether it was set here."""
  import jax

  write_whole_entries()
  if jax.config.jax_compilation_cache_dir:
    return False
  os.makedirs(path, exist_ok=True)
  repair(path)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # a sweep's many small compiles too
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return True
