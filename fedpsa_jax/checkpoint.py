"""Checkpoints of a run: everything needed to continue it exactly, written atomically (DESIGN §6).

A checkpoint is one orbax step directory `WORKDIR/checkpoints/<step>` (the step is the virtual time it
was taken at) with two items:

- `arrays`: every array of the snapshot, each distinct array object stored once (many in-flight jobs
  hold the same global parameters; FedPAC's per-client parameters share the extractor leaves);
- `meta`: JSON holding the snapshot's *skeleton* (its tree structure with every host value: ints,
  floats as exact hex strings, strings, tuples, dicts with int keys, dataclass types, and references
  to the arrays), a SHA-256 digest, dtype and shape of every array, and the run's config.

So any snapshot made of dicts, lists, tuples, named tuples, dataclasses (`flax.struct.dataclass`
states with host fields included), Python/NumPy scalars, NumPy arrays, jax arrays and typed PRNG keys
round-trips bit for bit without per-type code. A strategy state must be made of these (its `init` is
pure, so the state is everything a resumed run needs of the strategy).

Atomicity: orbax writes a step into a temporary directory and renames it when complete, so a step
killed half-way is never listed. On load, a step is also verified (format, every digest, dtype and
shape); a step that fails is moved to `WORKDIR/checkpoints_corrupt/` with a `CheckpointWarning`, and the
previous one is tried.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import os
import shutil
import time
import warnings
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

FORMAT = "fedpsa-jax-checkpoint/1"


class _QuietOrbax(logging.Filter):
  """Drops orbax's INFO chatter (a dozen lines per save under absl's INFO verbosity); keeps warnings."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


logging.getLogger("absl").addFilter(_QuietOrbax())


class CheckpointWarning(UserWarning):
  """A checkpoint could not be used (incomplete or corrupt); an older one is used instead."""


class CorruptCheckpoint(ValueError):
  """A checkpoint's files are incomplete or do not match their digests."""


class IncompatibleCheckpoint(RuntimeError):
  """A checkpoint is intact but this code cannot rebuild its snapshot (e.g. a state class was renamed
  or changed its fields). Not a reason to fall back to older checkpoints (they would fail alike, and
  starting over would discard the run's metrics): the caller must decide."""


# --- snapshot <-> (JSON skeleton, arrays) -------------------------------------------------------------


def _type_path(cls: type) -> str:
  return f"{cls.__module__}:{cls.__qualname__}"


def _import_type(path: str) -> type:
  module, _, qualname = path.partition(":")
  obj: Any = importlib.import_module(module)
  for part in qualname.split("."):
    obj = getattr(obj, part)
  return obj


def _digest(x: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


class _Encoder:
  """Turns a snapshot into a JSON skeleton plus a flat dict of arrays (each distinct array once)."""

  def __init__(self):
    self.arrays: dict[str, Any] = {}
    self.info: dict[str, dict] = {}
    self._refs: dict[int, str] = {}
    self._alive: list[Any] = []  # keeps encoded objects alive, so that no id() is reused meanwhile

  def encode(self, x: Any, path: str) -> Any:
    if x is None or isinstance(x, (bool, str)):
      return x
    if isinstance(x, int):
      return x
    if isinstance(x, float):
      return {"kind": "float", "hex": x.hex()}  # exact, and NaN/Inf-safe
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return {"kind": "prng_key", "impl": str(jax.random.key_impl(x)),
              "data": self._array(jax.random.key_data(x), path)}
    if isinstance(x, (jax.Array, np.ndarray)):
      return self._array(x, path)
    if isinstance(x, np.generic):
      return {"kind": "np_scalar", "dtype": x.dtype.str, "value": self.encode(x.item(), path)}
    if isinstance(x, flax.core.FrozenDict):
      return {"kind": "frozendict", "items": self._items(dict(x), path)}
    if isinstance(x, dict):
      return {"kind": "dict", "items": self._items(x, path)}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple (e.g. an optax state)
      return {"kind": "namedtuple", "type": _type_path(type(x)),
              "items": [self.encode(v, f"{path}.{f}") for f, v in zip(x._fields, x)]}
    if isinstance(x, (tuple, list)):
      return {"kind": type(x).__name__, "items": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(x)]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
      fields = {}
      for f in dataclasses.fields(x):
        if not f.init:
          raise TypeError(f"cannot checkpoint {path}: field {f.name!r} of {type(x).__name__} is not an "
                          "__init__ argument; keep state in __init__ fields")
        fields[f.name] = self.encode(getattr(x, f.name), f"{path}.{f.name}")
      return {"kind": "dataclass", "type": _type_path(type(x)), "fields": fields}
    raise TypeError(f"cannot checkpoint {path} of type {type(x).__name__}; allowed: dicts, lists, tuples, "
                    "dataclasses, scalars, numpy/jax arrays")

  def _items(self, d: dict, path: str) -> list:
    for k in d:
      if not isinstance(k, (str, int)) or isinstance(k, bool):
        raise TypeError(f"cannot checkpoint {path}: dict key {k!r} is not a str or int")
    return [[k, self.encode(v, f"{path}[{k!r}]")] for k, v in d.items()]

  def _array(self, x: Any, path: str) -> dict:
    ref = self._refs.get(id(x))
    if ref is None:
      if getattr(x, "dtype", None) == object:
        raise TypeError(f"cannot checkpoint {path}: object arrays are not supported")
      ref = f"a{len(self.arrays)}"
      self._refs[id(x)] = ref
      self._alive.append(x)
      self.arrays[ref] = x
      host = np.asarray(jax.device_get(x))
      self.info[ref] = {"dtype": host.dtype.name, "shape": list(host.shape), "sha256": _digest(host),
                        "host": isinstance(x, np.ndarray)}
    return {"kind": "array", "ref": ref}


def encode(snapshot: Any) -> tuple[Any, dict[str, Any], dict[str, dict]]:
  """(skeleton, arrays, info) of a snapshot: the JSON structure, `{ref: array}`, `{ref: dtype/shape/digest}`."""
  enc = _Encoder()
  skeleton = enc.encode(snapshot, "snapshot")
  return skeleton, enc.arrays, enc.info


def verify(arrays: dict[str, Any], info: dict[str, dict]) -> dict[str, np.ndarray]:
  """The arrays as host arrays, each checked against its recorded dtype, shape and SHA-256 digest;
  CorruptCheckpoint on the first mismatch or a missing or unexpected array."""
  if set(arrays) != set(info):
    raise CorruptCheckpoint(f"arrays {sorted(set(info) ^ set(arrays))} are missing or unexpected")
  out = {}
  for ref, meta in info.items():
    host = np.asarray(jax.device_get(arrays[ref]))
    if host.dtype.name != meta["dtype"] or list(host.shape) != meta["shape"] or _digest(host) != meta["sha256"]:
      raise CorruptCheckpoint(f"array {ref} does not match its recorded digest, dtype or shape")
    out[ref] = host
  return out


def decode(skeleton: Any, arrays: dict[str, Any], info: dict[str, dict]) -> Any:
  """The inverse of `encode` (given `encode`'s arrays, or `verify`'s); an array is placed once (on the
  default device unless it was a host array) and shared by every place that referenced it."""
  done: dict[str, Any] = {}

  def array(ref: str) -> Any:
    if ref not in done:
      host = np.asarray(jax.device_get(arrays[ref]))
      done[ref] = host if info[ref]["host"] else jax.device_put(host)
    return done[ref]

  def walk(node: Any) -> Any:
    if node is None or isinstance(node, (bool, str, int)):
      return node
    kind = node["kind"]
    if kind == "float":
      return float.fromhex(node["hex"])
    if kind == "array":
      return array(node["ref"])
    if kind == "prng_key":
      return jax.random.wrap_key_data(walk(node["data"]), impl=node["impl"])
    if kind == "np_scalar":
      return np.dtype(node["dtype"]).type(walk(node["value"]))
    if kind in ("dict", "frozendict"):
      d = {k: walk(v) for k, v in node["items"]}
      return flax.core.FrozenDict(d) if kind == "frozendict" else d
    if kind == "tuple":
      return tuple(walk(v) for v in node["items"])
    if kind == "list":
      return [walk(v) for v in node["items"]]
    if kind == "namedtuple":
      return _import_type(node["type"])(*(walk(v) for v in node["items"]))
    if kind == "dataclass":
      cls = _import_type(node["type"])
      if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{node['type']} is not a dataclass")
      return cls(**{k: walk(v) for k, v in node["fields"].items()})
    raise ValueError(f"unknown node kind {kind!r}")

  return walk(skeleton)


# --- the store ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Restored:
  """A checkpoint read back: its step (virtual time), the snapshot and the config it was made with."""

  step: int
  snapshot: Any
  config: dict


class CheckpointStore:
  """The checkpoints of one run directory: `save(step, snapshot)`, `restore_latest()`, `close()`."""

  def __init__(self, directory: str, keep: int):
    self.directory = os.path.abspath(directory)
    self.corrupt_directory = os.path.join(os.path.dirname(self.directory), "checkpoints_corrupt")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True,
        # Synchronous: a checkpoint is complete on disk before the run writes another metrics line, so
        # the metrics position it records is always consistent with what is on disk.
        enable_async_checkpointing=False,
        cleanup_tmp_directories=True)  # removes what a kill during a save left behind
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("arrays", "meta"))

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, snapshot: Any, config: dict) -> None:
    """Writes `snapshot` as checkpoint `step` (atomically: visible only once complete)."""
    skeleton, arrays, info = encode(snapshot)
    meta = {"format": FORMAT, "step": step, "skeleton": skeleton, "arrays": info, "config": config,
            "saved_at": time.time()}
    self._manager.save(step, force=True, args=ocp.args.Composite(
        arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)))
    self._manager.wait_until_finished()

  def _read_verified(self, step: int) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, verified host arrays) of a step; any failure here means the files are not intact."""
    meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    if (not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("step") != step
        or not all(k in meta for k in ("skeleton", "arrays", "config"))):
      raise CorruptCheckpoint(f"metadata is not a complete {FORMAT} record for step {step}")
    info = meta["arrays"]
    # Restore onto this process's default device (not the saved sharding), so that a checkpoint
    # written on one backend can be continued on another.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    # dtypes by name through jnp.dtype, which knows the ml_dtypes ones (bfloat16, ...) numpy does not.
    target = {ref: (np.empty(m["shape"], jnp.dtype(m["dtype"])) if m["host"] else
                    jax.ShapeDtypeStruct(tuple(m["shape"]), jnp.dtype(m["dtype"]), sharding=device))
              for ref, m in info.items()}
    arrays = self._manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(target))).arrays
    return meta, verify(dict(arrays), info)

  def restore_latest(self) -> Restored | None:
    """The newest checkpoint that reads back completely; each newer one that does not is moved to
    `checkpoints_corrupt/` with a warning. None when there is no usable checkpoint.
    IncompatibleCheckpoint when the newest intact one cannot be rebuilt by this code."""
    for step in reversed(self.steps()):
      try:
        meta, arrays = self._read_verified(step)
      except Exception as err:  # any failure to read or verify a step means: do not trust it
        moved = self._set_aside(step)
        warnings.warn(f"checkpoint {os.path.join(self.directory, str(step))} is incomplete or corrupt "
                      f"({type(err).__name__}: {err}); moved to {moved}, trying the previous one",
                      CheckpointWarning, stacklevel=2)
        continue
      try:
        snapshot = decode(meta["skeleton"], arrays, meta["arrays"])
      except Exception as err:
        raise IncompatibleCheckpoint(
            f"checkpoint {os.path.join(self.directory, str(step))} is intact but this code cannot rebuild "
            f"it ({type(err).__name__}: {err}); run the code version that wrote it, or use another "
            "--workdir for a new run") from err
      return Restored(step, snapshot, meta["config"])
    return None

  def _set_aside(self, step: int) -> str:
    """Moves a bad step out of orbax's directory (so a later save of the same step can succeed)."""
    os.makedirs(self.corrupt_directory, exist_ok=True)
    target = os.path.join(self.corrupt_directory, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    suffix = 0
    while os.path.exists(target + (f"-{suffix}" if suffix else "")):
      suffix += 1
    target += f"-{suffix}" if suffix else ""
    shutil.move(os.path.join(self.directory, str(step)), target)
    self._manager.reload()
    return target

  def close(self) -> None:
    self._manager.close()

