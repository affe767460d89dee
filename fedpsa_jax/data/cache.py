"""Parsed and decoded datasets kept on disk, so that a dataset is decoded once per machine, not once per run.

A cache file holds one split as `x` (uint8 images) and `y` (int32 labels), the raw arrays before
normalisation, so every run normalises the same bits as a fresh decode would. A file is written whole or not
at all (a temporary file renamed into place) and read with NumPy's loader with pickles refused (data only);
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
import tempfile
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
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz.tmp")
    with os.fdopen(fd, "wb") as f:
      np.savez(f, x=x, y=y)
    os.replace(tmp, path)
  except OSError:
    if tmp is not None:
      with contextlib.suppress(OSError):
        os.remove(tmp)
    return
  if replaces:
    directory, name = os.path.split(path)
    with contextlib.suppress(OSError):
      for old in os.listdir(directory):
        if old != name and old.startswith(replaces) and old.endswith(".npz"):
          with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, old))


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
