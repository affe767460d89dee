"""Parsed and decoded datasets kept on disk, so that a dataset is decoded once per machine, not once per run.

A cache file holds one split as `x` (uint8 images) and `y` (int32 labels), the raw arrays before
normalisation, so every run normalises the same bits as a fresh decode would. A file is written whole or not
at all (a temporary file renamed into place; one that a killed process left behind is removed by the next write
into the directory, `_remove_stale_temporaries`) and read with NumPy's loader with pickles refused (data only);
one that cannot be read or is not what its key promises is ignored, decoded again and rewritten. A cache
directory that cannot be written costs the decode, never the run.

A file's name is its key: what it was decoded from. For a tfds split that is the place and the prepared files
themselves (`split_fingerprint`: the resolved directory, then the files' names, sizes and modification times), so
a dataset prepared again, or another copy elsewhere, gets its own entry; an entry for files prepared again in the
same place replaces the earlier one, which nothing can read any more (without that, every preparation, or every
copy of the folder made afresh, would leave ~55 MB of MNIST behind).

The root is `$FEDPSA_JAX_CACHE`, else `$XDG_CACHE_HOME/fedpsa-jax`, else `~/.cache/fedpsa-jax`; delete it at
any time to free the space (MNIST: ~55 MB, CIFAR: ~180 MB).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import time
from typing import Callable

import numpy as np

CACHE_ENV = "FEDPSA_JAX_CACHE"
FORMAT = 1  # part of every key: a change of what a file holds makes old files unused, never misread


def cache_root() -> str:
  return os.environ.get(CACHE_ENV) or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fedpsa-jax")


def cache_file(*parts: str) -> str:
  """`<root>/<parts joined by '-'>.npz`, with path separators in the parts made safe (`emnist/digits`)."""
  name = "-".join(part.replace(os.sep, "_") for part in parts)
  return os.path.join(cache_root(), f"{name}.npz")


def read_arrays(path: str, valid: Callable[[np.ndarray, np.ndarray], bool]) -> tuple[np.ndarray, np.ndarray] | None:
  """The cached (x, y), or None if the file is missing, unreadable, or fails `valid` (or the basic shape: uint8
  images and int32 labels, one label per image)."""
  try:
    with np.load(path, allow_pickle=False) as f:
      x, y = f["x"], f["y"]
  except Exception:  # any defect means: decode again (and overwrite)
    return None
  ok = (x.dtype == np.uint8 and y.dtype == np.int32 and y.ndim == 1 and x.ndim >= 2 and len(x) == len(y)
        and valid(x, y))
  return (x, y) if ok else None


def write_arrays(path: str, x: np.ndarray, y: np.ndarray, replaces: str | None = None) -> None:
  """Writes the file whole or not at all (a temporary file renamed); an unwritable place is no error.

  `replaces`: a file-name prefix in the same directory; once `path` is in place, the other entries that start with
  it are removed (the same split decoded from files since prepared again in the same place)."""
  tmp = None
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _remove_stale_temporaries(os.path.dirname(path))
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=_temporary_prefix(), suffix=TEMPORARY_SUFFIX)
    with os.fdopen(fd, "wb") as f:
      np.savez(f, x=x, y=y)
    os.replace(tmp, path)
  except BaseException as err:  # (a Ctrl-C or SIGTERM during the write too: the partial file goes)
    if tmp is not None:
      with contextlib.suppress(OSError):
        os.remove(tmp)
    if isinstance(err, OSError):
      return
    raise
  if replaces:
    directory, name = os.path.split(path)
    with contextlib.suppress(OSError):
      for old in os.listdir(directory):
        if old != name and old.startswith(replaces) and old.endswith(".npz"):
          with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, old))


TEMPORARY_SUFFIX = ".npz.tmp"


def _temporary_prefix() -> str:
  """`<host>.<pid>.`: whose temporary file it is, so that another process can tell one left behind."""
  return f"{socket.gethostname().replace('.', '_')}.{os.getpid()}."


UNOWNED_TEMPORARY_SECONDS = 86_400  # a temporary file that names no process: a day old is long abandoned


def _remove_stale_temporaries(directory: str) -> None:
  """Removes the temporary files of this host's processes that no longer run (killed during a write: up to
  ~55 MB each for MNIST), and those that name no process (older versions' `tmp*.npz.tmp`) once a day old.
  Another host's (a shared home directory) are left alone: their process cannot be checked from here."""
  host = socket.gethostname().replace(".", "_")
  with contextlib.suppress(OSError):
    for entry in os.scandir(directory):
      parts = entry.name.split(".")
      if not entry.name.endswith(TEMPORARY_SUFFIX) or not entry.is_file(follow_symlinks=False):
        continue
      owned = len(parts) >= 4 and parts[1].isdigit()
      if (owned and parts[0] == host and not _running(int(parts[1]))) or (
          not owned and time.time() - entry.stat(follow_symlinks=False).st_mtime > UNOWNED_TEMPORARY_SECONDS):
        with contextlib.suppress(OSError):
          os.remove(entry.path)


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # (EPERM: another user's process, running)
    return True
  return True


def split_fingerprint(directory: str, split: str) -> str | None:
  """A short key of one prepared tfds split, `<place>-<files>`: a digest of the resolved directory and the split,
  then one that adds the name, size and modification time of each of its files
  (`<dataset>-<split>.<format>-<shard>-of-<n>`); None when the directory holds none."""
  try:
    directory = os.path.realpath(directory)
    entries = sorted(os.scandir(directory), key=lambda e: e.name)
  except OSError:
    return None
  files = [(e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries
           if e.is_file() and f"-{split}." in e.name]
  if not files:
    return None
  digest = lambda value: hashlib.sha256(json.dumps(value).encode()).hexdigest()[:8]
  return f"{digest([FORMAT, directory, split])}-{digest([FORMAT, directory, split, files])}"
