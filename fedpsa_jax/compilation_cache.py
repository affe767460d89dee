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
`repair` removes both kinds before a process uses the directory: the function is compiled once more and
stored whole. (Another process reading an entry while one writes it sees the same truncation, warns and
compiles; that needs atomic writes in JAX, and costs one compile.)

An entry is judged by JAX's own reader (`_jax_entry_reader`: the functions JAX reads an entry with, so the
judgement follows JAX's layout when an upgrade changes it), never by a copy of that layout here. Where this JAX
no longer has those functions, no entry can be judged: `repair` removes nothing, and says so once in the log.
"""

from __future__ import annotations

import functools
import logging
import os
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


def repair(path: str) -> list[str]:
  """Removes `damaged_entries(path)` (with their `KEY-atime`) and returns their names; nothing when `path`
  does not exist. A function whose entry was removed compiles once more and is stored whole."""
  if not os.path.isdir(path):
    return []
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

  if jax.config.jax_compilation_cache_dir:
    return False
  os.makedirs(path, exist_ok=True)
  repair(path)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # a sweep's many small compiles too
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return True
