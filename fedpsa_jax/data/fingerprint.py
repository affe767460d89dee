"""The content fingerprint of `data.path`: what a run's identity holds of a dataset named by its path.

`data.path` only says where the data is (a file or folder may move, and a run may continue from the new
place); `data.fingerprint` says what it is. The fingerprint is computed when a run is prepared, recorded in its
config.json, and compared like any field of the run's identity (`run_identity.py`): a run continues, and a
sweep member counts as done, only on the same content. Set by hand, it pins a config to one content.

- An .npz: the SHA-256 of the file's bytes.
- A prepared tfds folder: the SHA-256 of its features.json and dataset_info.json and of the names and sizes of
  its files (hashing every shard, gigabytes for large datasets, on every start would cost more than it guards;
  tfds writes the splits' byte counts into dataset_info.json). Modification times are left out, so a copy
  has the fingerprint of its original.

Standard library only (no JAX, no tfds): the sweep and the command line compute it before building anything.
"""

from __future__ import annotations

import copy
import hashlib
import os
from typing import Any, Mapping

import ml_collections

from fedpsa_jax.errors import ConfigError

LENGTH = 16  # hex digits kept: 64 bits, far beyond any collision among one user's datasets
_CHUNK = 1 << 20


def content_fingerprint(path: str) -> str:
  """The fingerprint of the .npz file or prepared tfds folder at `path` (see the module docstring)."""
  digest = hashlib.sha256()
  if os.path.isdir(path):
    for name in ("features.json", "dataset_info.json"):
      with open(os.path.join(path, name), "rb") as f:
        digest.update(name.encode() + b"\0" + f.read() + b"\0")
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
      if entry.is_file():
        digest.update(f"{entry.name}\0{entry.stat().st_size}\0".encode())
  else:
    with open(path, "rb") as f:
      while chunk := f.read(_CHUNK):
        digest.update(chunk)
  return digest.hexdigest()[:LENGTH]


def resolved(data: Any) -> str | None:
  """The fingerprint a run of the `data` section (a ConfigDict or its JSON form) has: None without `data.path`;
  else the content's, after checking it against `data.fingerprint` when that is set (ConfigError when they
  differ, or when the path cannot be read)."""
  path, pinned = data.get("path"), data.get("fingerprint")
  if path is None:
    return pinned
  try:
    actual = content_fingerprint(path)
  except OSError as err:
    raise ConfigError(f"data.path={path!r} cannot be read ({err.strerror or err}); allowed: a readable .npz file "
                      "or prepared tfds folder") from None
  if pinned is not None and pinned != actual:
    raise ConfigError(f"data.fingerprint={pinned!r} is invalid: the content of data.path={path!r} has the "
                      f"fingerprint {actual!r}; allowed: {actual!r} (this content), or None (any content, recorded "
                      "when the run starts)")
  return actual


def pinned(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with `data.fingerprint` set to its data's (`resolved`): a copy when it has a `data.path` (`config`
  itself is unchanged), else `config`."""
  if config.data.get("path") is None:
    return config
  out = copy.deepcopy(config)
  out.data.fingerprint = resolved(config.data)
  return out


def pinned_json(config_json: Mapping[str, Any]) -> dict[str, Any]:
  """`pinned` for a config's JSON form (as config.json holds it): a new dict when it has a `data.path`."""
  data = config_json.get("data", {})
  if data.get("path") is None:
    return dict(config_json)
  return {**config_json, "data": {**data, "fingerprint": resolved(data)}}
