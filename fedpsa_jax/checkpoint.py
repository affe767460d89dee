"""Checkpoints of a run: everything needed to continue it exactly, written atomically (docs/runs.md).

A checkpoint is one orbax step directory `WORKDIR/checkpoints/<step>` (the step is the virtual time it
was taken at) with two items:

- `arrays`: every array of the snapshot, each distinct array object stored once (many in-flight jobs
  hold the same global parameters; FedPAC's per-client parameters share the extractor leaves);
- `meta`: JSON holding the snapshot's *skeleton* (its tree structure with every host value: ints,
  floats as exact hex strings, strings, tuples, dicts with int keys, dataclass types, and references
  to the arrays), a SHA-256 digest, dtype and shape of every array, the run's config, and a SHA-256
  digest of all of that (the host part: loop state, clock and event heap, generator states, output
  positions, the jobs' host fields), so that a one-digit edit is caught like a flipped bit in an array.

So any snapshot made of dicts, lists, tuples, named tuples, dataclasses (`flax.struct.dataclass`
states with host fields included), Python/NumPy scalars, NumPy arrays, jax arrays and typed PRNG keys
round-trips bit for bit without per-type code. A strategy state must be made of these (its `init` is
pure, so the state is everything a resumed run needs of the strategy).

Atomicity: orbax writes a step into a temporary directory and renames it when complete, so a step
killed half-way is never listed. On load, a step is also verified (format, the host digest, every array
digest, dtype and shape); a step that fails is moved to `WORKDIR/checkpoints_corrupt/` with a
`CheckpointWarning`, and the previous one is tried.

A checkpoint is data, never code: the types its skeleton names (`module:qualname` of dataclasses and
named tuples) are looked up in an allow-list, never imported: the records (dataclasses, named tuples)
defined in the module of each registered strategy (its state classes, registered with the strategy), and
those registered with `register_record`. A checkpoint naming any other type is refused
(`UnsafeCheckpoint`) before anything of it is built, so a run directory copied from someone else is safe
to resume. (The digests detect damage, not intent: anyone can recompute them; the allow-list is what
makes a crafted checkpoint harmless.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Iterable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from fedpsa_jax.errors import UserError, exception_chain, is_write_limit

# /3: in-flight jobs are records (`sim.executor.Job`), output positions under "outputs". One format is read:
# an older checkpoint is refused (IncompatibleCheckpoint), not translated.
FORMAT = "fedpsa-jax-checkpoint/3"
_FORMAT_FAMILY = "fedpsa-jax-checkpoint/"
_META_KEYS = ("skeleton", "arrays", "config")


class _QuietOrbax(logging.Filter):
  """Drops orbax's INFO chatter (a dozen lines per save under absl's INFO verbosity), and the tracebacks its
  background threads log when a write fails (one per thread, 30-80 lines each): the save that waits for them
  raises the same exception, which its caller reports once (a full disk: one line). Keeps orbax's warnings and
  its other errors."""

  def filter(self, record: logging.LogRecord) -> bool:
    if f"{os.sep}orbax{os.sep}" not in record.pathname:
      return True
    return record.levelno >= logging.WARNING and record.exc_info is None


def _raised_in_orbax(exc: BaseException | None) -> bool:
  """Whether `exc`, or an exception it was raised while handling, passed through orbax's code."""
  return any(f"{os.sep}orbax{os.sep}" in frame.filename
             for e in exception_chain(exc) for frame in traceback.extract_tb(e.__traceback__))


# asyncio names the future's class: Future, Task, _GatheringFuture (a gather's, as orbax awaits a save's writes).
_NEVER_RETRIEVED = re.compile(r"\w+ exception was never retrieved")


class _QuietOrbaxFutures(logging.Filter):
  """Drops asyncio's "<Future class> exception was never retrieved" for a write that failed inside orbax: when one of
  a save's writes fails, the others' failures (the same full disk) stay in futures nobody awaits, and asyncio
  logs each with its traceback when the future is collected, late and at random. The save raised the first
  failure, which its caller reports once. A failure is orbax's when it passed through orbax's code, or when it
  says the disk is full: tensorstore's own futures carry no Python frame, only the OS error's text (and only
  orbax, through tensorstore, runs asyncio in a run). Every other asyncio record is kept."""

  def filter(self, record: logging.LogRecord) -> bool:
    if not _NEVER_RETRIEVED.match(str(record.msg)):
      return True
    failure = record.exc_info[1] if record.exc_info else None
    return not (failure is not None and (_raised_in_orbax(failure) or is_write_limit(failure)))


def _is_closed_loop_callback(exc_type: type, value: BaseException, tb: Any) -> bool:
  """A callback that tensorstore (under orbax) runs on one of its threads when a write finishes, into the
  event loop of a save that already failed and closed it: nothing is left to report (the save raised)."""
  if exc_type is not RuntimeError or str(value) != "Event loop is closed":
    return False
  return any(frame.name == "call_soon_threadsafe" for frame in traceback.extract_tb(tb))


def _unraisablehook_without_closed_loop_callbacks(hook: Callable) -> Callable:
  """`hook` (sys.unraisablehook), except for `_is_closed_loop_callback` errors, which tensorstore reports
  through it from its threads after a failed write, a traceback each."""
  def unraisablehook(unraisable: Any) -> None:
    if not _is_closed_loop_callback(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback):
      hook(unraisable)
  unraisablehook.quiets_closed_loop_callbacks = True
  return unraisablehook


def _orbax():
  """orbax.checkpoint, imported at a run's first checkpoint (or restore) rather than with this module: with
  tensorstore it holds resident memory that a run would otherwise keep from its first step to its last.
  Also keeps orbax's noise off the console, from its import on, in a process that uses it (importing this module
  changes no global logging): its chatter and its threads' tracebacks (`_QuietOrbax`, on absl's logger), the
  never-retrieved failures of a failed save (`_QuietOrbaxFutures`, on asyncio's) and tensorstore's late
  callbacks into that save's closed event loop (`_unraisablehook_without_closed_loop_callbacks`). Each once."""
  for logger, quiet in (("absl", _QuietOrbax), ("asyncio", _QuietOrbaxFutures)):
    if not any(isinstance(f, quiet) for f in logging.getLogger(logger).filters):
      logging.getLogger(logger).addFilter(quiet())
  import orbax.checkpoint as ocp

  if not getattr(sys.unraisablehook, "quiets_closed_loop_callbacks", False):
    sys.unraisablehook = _unraisablehook_without_closed_loop_callbacks(sys.unraisablehook)
  return ocp


class CheckpointWarning(UserWarning):
  """A checkpoint could not be used (incomplete or corrupt); an older one is used instead."""


class CorruptCheckpoint(ValueError):
  """A checkpoint's files are incomplete or do not match their digests."""


class IncompatibleCheckpoint(UserError, RuntimeError):
  """A checkpoint is intact but this code cannot rebuild its snapshot (e.g. a state class was renamed
  or changed its fields). Not a reason to fall back to older checkpoints (they would fail alike, and
  starting over would discard the run's metrics): the caller must decide."""


class UnsafeCheckpoint(IncompatibleCheckpoint):
  """A checkpoint names a type that is not one of this project's records: refused, nothing of it is
  built (nor set aside: the run directory is left as it is for the user to inspect)."""


# --- the records a checkpoint may name ------------------------------------------------------------------

_RECORDS: dict[str, type] = {}
_RECORD_SOURCES: list[Callable[[], Iterable[type]]] = []


def _type_path(cls: type) -> str:
  return f"{cls.__module__}:{cls.__qualname__}"


def is_record(obj: Any) -> bool:
  """A dataclass or named-tuple class: built from its fields' values only."""
  return isinstance(obj, type) and (dataclasses.is_dataclass(obj)
                                    or (issubclass(obj, tuple) and hasattr(obj, "_fields")))


def register_record(cls: type) -> type:
  """Allows checkpoints to hold instances of `cls` (a dataclass or named tuple); usable as a decorator.
  A registered strategy's own records need no call: they are allowed with the strategy."""
  if not is_record(cls):
    raise TypeError(f"{cls!r} is not a dataclass or named tuple; a checkpoint holds records only")
  _RECORDS[_type_path(cls)] = cls
  return cls


def register_record_source(source: Callable[[], Iterable[type]]) -> Callable[[], Iterable[type]]:
  """Adds `source() -> records` to the allow-list, called each time a checkpoint is read: how a registry
  above this module (the strategies', `strategies.base.strategy_records`) allows the records of whatever it
  holds then, without this module importing it. Usable as a decorator."""
  _RECORD_SOURCES.append(source)
  return source


def allowed_records() -> dict[str, type]:
  """{'module:qualname': class} of every type a checkpoint may name: `register_record`'s, and those of each
  `register_record_source` (the records defined in the module of each registered strategy, and of the
  strategies it derives from, which hold its state classes). Nothing is imported here."""
  allowed = dict(_RECORDS)
  for source in _RECORD_SOURCES:
    for cls in source():
      if not is_record(cls):
        raise TypeError(f"{cls!r} is not a dataclass or named tuple; a checkpoint holds records only")
      allowed[_type_path(cls)] = cls
  return allowed


def _record_type(path: str, allowed: dict[str, type], kind: str) -> type:
  """The allowed class named `path` (never imported: looked up). Otherwise IncompatibleCheckpoint for a
  path in this project (a record renamed or removed since the checkpoint was written) and
  UnsafeCheckpoint for any other."""
  cls = allowed.get(path)
  if cls is None and path.startswith("fedpsa_jax."):  # (a record of this project that this code lacks)
    raise IncompatibleCheckpoint(f"this code has no record {path!r} (renamed or removed since?)")
  if cls is None:
    raise UnsafeCheckpoint(
        f"it names the type {path!r}, which is not a record of this code (allowed: the strategies' state "
        f"classes and records registered with checkpoint.register_record); refused, nothing of it was "
        f"built")
  if (kind == "dataclass") != dataclasses.is_dataclass(cls):  # (a named tuple is the other kind of record)
    raise UnsafeCheckpoint(f"it names {path!r} as a {kind}, which it is not")
  return cls


def _digest(x: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def host_digest(meta: dict) -> str:
  """SHA-256 of a checkpoint's meta record without its own digest, as canonical JSON (sorted keys, no
  whitespace): the skeleton with every host value, the arrays' digests, the config, the step."""
  body = {k: v for k, v in meta.items() if k != "sha256"}
  text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
  return hashlib.sha256(text.encode("ascii")).hexdigest()


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
  default device unless it was a host array) and shared by every place that referenced it.

  Every type the skeleton names is checked against `allowed_records()` first, so a checkpoint naming a
  foreign type raises UnsafeCheckpoint before anything is built."""
  allowed = allowed_records()
  _check_types(skeleton, allowed)
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
      return _record_type(node["type"], allowed, kind)(*(walk(v) for v in node["items"]))
    if kind == "dataclass":
      return _record_type(node["type"], allowed, kind)(**{k: walk(v) for k, v in node["fields"].items()})
    raise ValueError(f"unknown node kind {kind!r}")

  return walk(skeleton)


def _check_types(node: Any, allowed: dict[str, type]) -> None:
  """Raises UnsafeCheckpoint for the first type the skeleton names outside `allowed` (before any decoding)."""
  stack = [node]
  while stack:
    node = stack.pop()
    if isinstance(node, list):
      stack.extend(node)
    elif isinstance(node, dict):
      if node.get("kind") in ("namedtuple", "dataclass"):
        _record_type(str(node.get("type")), allowed, node["kind"])
      stack.extend(node.values())


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
    self.keep = keep
    self._orbax_manager = None  # made (and orbax imported) when first needed: `_manager`

  @property
  def _manager(self):
    if self._orbax_manager is None:
      ocp = _orbax()
      options = ocp.CheckpointManagerOptions(
          max_to_keep=self.keep, create=True,
          # Synchronous: a checkpoint is complete on disk before the run writes another metrics line, so
          # the metrics position it records is always consistent with what is on disk.
          enable_async_checkpointing=False,
          cleanup_tmp_directories=True)  # removes what a kill during a save left behind
      self._orbax_manager = ocp.CheckpointManager(self.directory, options=options, item_names=("arrays", "meta"))
    return self._orbax_manager

  def steps(self) -> list[int]:
    if self._orbax_manager is None and not os.path.isdir(self.directory):
      return []  # a new run: nothing to list, and no orbax until its first checkpoint
    return sorted(self._manager.all_steps())

  def save(self, step: int, snapshot: Any, config: dict) -> None:
    """Writes `snapshot` as checkpoint `step` (atomically: visible only once complete)."""
    skeleton, arrays, info = encode(snapshot)
    meta = {"format": FORMAT, "step": step, "skeleton": skeleton, "arrays": info, "config": config,
            "saved_at": time.time()}
    meta["sha256"] = host_digest(json.loads(json.dumps(meta)))  # (as it will read back)
    ocp = _orbax()
    self._manager.save(step, force=True, args=ocp.args.Composite(
        arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)))
    self._manager.wait_until_finished()

  def _read_verified(self, step: int) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, verified host arrays) of a step; any failure here means the files are not intact."""
    ocp = _orbax()
    meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    written = meta.get("format") if isinstance(meta, dict) else None
    if isinstance(written, str) and written.startswith(_FORMAT_FAMILY) and written != FORMAT:
      raise IncompatibleCheckpoint(f"it was written in the format {written!r} and this code reads {FORMAT!r} only")
    if (written != FORMAT or meta.get("step") != step or not all(k in meta for k in _META_KEYS)):
      raise CorruptCheckpoint(f"metadata is not a complete {FORMAT} record for step {step}")
    if meta.get("sha256") != host_digest(meta):
      raise CorruptCheckpoint("its host part (loop state, clock, generators, output positions, jobs, config) "
                              "does not match its recorded digest")
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

  def restore_latest(self, accept: Callable[[Restored], str | None] | None = None) -> Restored | None:
    """The newest checkpoint that reads back completely (and that `accept` takes: it returns None, or why
    not); each newer one that does not is moved to `checkpoints_corrupt/` with a warning. None when there
    is no usable checkpoint. IncompatibleCheckpoint when the newest one is in another format, or is intact
    but cannot be rebuilt by this code; UnsafeCheckpoint when it names a type that is not one of this
    project's records."""
    for step in reversed(self.steps()):
      path = os.path.join(self.directory, str(step))
      try:
        meta, arrays = self._read_verified(step)
      except IncompatibleCheckpoint as err:
        # Another format: the older steps are no better, and starting over would discard the run's metrics.
        # Nothing is set aside: the run directory waits, as it is, for the code that wrote it.
        raise IncompatibleCheckpoint(
            f"checkpoint {path} is refused: {err}; run the code version that wrote it, or use another "
            "--workdir for a new run") from None
      except Exception as err:  # any failure to read or verify a step means: do not trust it
        moved = self._set_aside(step)
        warnings.warn(f"checkpoint {path} is incomplete or corrupt ({type(err).__name__}: {err}); moved to "
                      f"{moved}, trying the previous one", CheckpointWarning, stacklevel=2)
        continue
      try:
        snapshot = decode(meta["skeleton"], arrays, meta["arrays"])
      except UnsafeCheckpoint as err:
        raise UnsafeCheckpoint(
            f"checkpoint {path} is refused: {err}. A checkpoint holds data only; resume only run "
            "directories from a trusted source, or use another --workdir for a new run") from None
      except Exception as err:
        raise IncompatibleCheckpoint(
            f"checkpoint {path} is intact but this code cannot rebuild it ({type(err).__name__}: {err}); "
            "run the code version that wrote it, or use another --workdir for a new run") from err
      restored = Restored(step, snapshot, meta["config"])
      reason = accept(restored) if accept is not None else None
      if reason is not None:
        moved = self._set_aside(step)
        warnings.warn(f"checkpoint {path} does not match the run's files ({reason}); moved to {moved}, "
                      "trying the previous one", CheckpointWarning, stacklevel=2)
        continue
      return restored
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
    if self._orbax_manager is not None:
      self._orbax_manager.close()

