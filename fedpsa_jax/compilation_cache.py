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
"""

from __future__ import annotations

import logging
import os
import zlib

CACHE_SUFFIX = "-cache"  # JAX's file-cache names for an entry and its last-access time
ATIME_SUFFIX = "-atime"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame; JAX compresses with zstd when it can import it, else zlib
_TIME_BYTES = 4  # the compile time JAX stores before the executable (JAX 0.10's entry layout)

_log = logging.getLogger(__name__)


def _zstd_decompress():
  """The zstd decompression JAX would use (Python 3.14's `compression.zstd`, else `zstandard`), or None."""
  try:
    from compression import zstd  # type: ignore[import-not-found]
    return zstd.decompress
  except ImportError:
    pass
  try:
    import zstandard  # type: ignore[import-not-found]
    return zstandard.ZstdDecompressor().decompress
  except ImportError:
    return None


def is_complete(data: bytes) -> bool:
  """Whether `data`, a `KEY-cache` file's bytes, is a whole compressed entry: a zlib stream that reaches its
  end (checksum included) with nothing after it, or a zstd frame that decompresses, holding more than the
  compile-time prefix. A zstd entry where no zstd module is importable counts as complete (JAX could not
  have written it in this environment, and cannot be judged here)."""
  if data.startswith(_ZSTD_MAGIC):
    decompress = _zstd_decompress()
    if decompress is None:
      return True
    try:
      return len(decompress(data)) > _TIME_BYTES
    except Exception:  # each library raises its own error type for a damaged frame
      return False
  stream = zlib.decompressobj()
  try:
    body = stream.decompress(data)
  except zlib.error:
    return False
  return stream.eof and not stream.unused_data and len(body) > _TIME_BYTES


def damaged_entries(path: str) -> list[str]:
  """The `KEY-cache` files of the cache directory `path` (sorted names) that a killed writer left: truncated
  ones (`is_complete`), and, in a directory where eviction keeps last-access times, ones without their
  `KEY-atime`."""
  names = set(os.listdir(path))
  evicting = any(n.endswith(ATIME_SUFFIX) for n in names)
  damaged = []
  for name in sorted(n for n in names if n.endswith(CACHE_SUFFIX)):
    key = name[:-len(CACHE_SUFFIX)]
    try:
      with open(os.path.join(path, name), "rb") as f:
        whole = is_complete(f.read())
    except FileNotFoundError:  # evicted or repaired by another process meanwhile
      continue
    if not whole or (evicting and key + ATIME_SUFFIX not in names):
      damaged.append(name)
  return damaged


def repair(path: str) -> list[str]:
  """Removes `damaged_entries(path)` (with their `KEY-atime`) and returns their names; nothing when `path`
  does not exist. A function whose entry was removed compiles once more and is stored whole."""
  if not os.path.isdir(path):
    return []
  removed = damaged_entries(path)
  for name in removed:
    for file in (name, name[:-len(CACHE_SUFFIX)] + ATIME_SUFFIX):
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
