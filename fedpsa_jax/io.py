"""The run directory (docs/runs.md): config.json, metrics.jsonl, events.jsonl, summary.json, checkpoints/.

Writing: `RunDir` appends and flushes lines one at a time and replaces summary.json atomically, so a run
that dies leaves every line it wrote readable. A checkpoint records the byte size of metrics.jsonl and
events.jsonl when it was taken; resuming truncates them back to it (`RunDir.truncate`), so lines written
after the checkpoint, and a line cut off by a kill, are neither duplicated nor left behind.
`check_workdir` vets a workdir before any work: writable, not holding another run, and holding no run entry
of the wrong kind or one this user cannot read and write (`check_run_entries`).

Links: the tool writes, moves and deletes only inside the folders it is given. An entry it would write through
that is a symbolic link (a `.lock` or `metrics.jsonl` pointing at someone's file, a `checkpoints/` or
`tensorboard/` pointing at someone's folder, a link anywhere inside those) is refused before any work
(`refuse_links`, naming the entry), and the files it writes are opened without following a link
(`open_no_follow`), so a link made while it runs fails the write instead of redirecting it.

Reading: `read_run` (or `read_config`, `read_summary`, `read_metrics`, `read_events`) is the one reader
of a run directory; the notebook API, sweeps, reports, figures and resume all read through it. A JSON-lines
file whose last line is torn (a run killed while writing it) is read without that line, with a
`TornLineWarning`; a bad line anywhere else, a line that is not an object or lacks a field every reader needs
(`METRICS_FIELDS`, `EVENTS_FIELDS`), and a file that cannot be read are a `DamagedRunFile` error naming the file
(and the line).

JSON has no NaN or infinities: `to_json` writes non-finite floats as the strings "nan", "inf", "-inf"
and `from_json` turns them back into floats, at any depth (lists of κ, nested dicts). Every file here
goes through that one codec. config.json is the exception on the way back: `read_config` returns it as
written (JSON form, like `config_json`), the form in which configs are compared.

This module imports neither JAX nor the simulator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import io as std_io
import json
import lzma
import math
import os
import stat
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, TextIO

import ml_collections

from fedpsa_jax import run_identity
from fedpsa_jax.config.schema import SHARED_SECTIONS
from fedpsa_jax.errors import ConfigError, DamagedRunFile, OutputWriteError, is_write_limit

CONFIG_FILE, SUMMARY_FILE, METRICS_FILE, EVENTS_FILE = "config.json", "summary.json", "metrics.jsonl", "events.jsonl"
CHECKPOINTS_DIR, CORRUPT_CHECKPOINTS_DIR = "checkpoints", "checkpoints_corrupt"  # (checkpoint.CheckpointStore's)
TENSORBOARD_DIR = "tensorboard"  # RUN_DIR/tensorboard: the event files of runtime.tensorboard (sim.recorder)
TMP_SUFFIX = ".tmp"  # `write_json_atomic`'s temporary file: PATH.tmp
COMPRESSED = ".xz"  # a records directory's metrics and events: PATH.xz (`compress_jsonl`), read as PATH is
LOCK_FILE = ".lock"  # one lock file per directory, whoever claims it (a run or a sweep)
# What a run directory holds, by kind. An entry of the other kind (a folder where metrics.jsonl belongs, a file
# where checkpoints/ belongs) is refused before anything is read or written (`check_run_entries`): a run
# would otherwise start over beside what it cannot read, or fail half-way with its outputs cut back.
RUN_FILES = (CONFIG_FILE, SUMMARY_FILE, METRICS_FILE, EVENTS_FILE, LOCK_FILE)
RUN_DIRS = (CHECKPOINTS_DIR, CORRUPT_CHECKPOINTS_DIR)
# The fields of a metrics.jsonl line that every reader draws with (a learning curve: accuracy against days),
# and the types their values may have; every evaluation writes them (`sim.runner`), with more.
METRICS_FIELDS = {"day": (int, float), "test_accuracy": (int, float)}
EVENTS_FIELDS = {"type": (str,)}  # 'update' or 'round'
# Every entry of a run directory that a run writes, moves or deletes (the folders with all they hold): none may be
# a symbolic link (`refuse_links`).
RUN_WRITES = (*RUN_FILES, CONFIG_FILE + TMP_SUFFIX, SUMMARY_FILE + TMP_SUFFIX, *RUN_DIRS, TENSORBOARD_DIR)
# The files a run or a sweep rewrites in place (appends to, truncates) rather than replacing them by a new file: none
# may have another name too (a hard link), whose content would change with them (`refuse_links`).
IN_PLACE_FILES = (METRICS_FILE, EVENTS_FILE, LOCK_FILE)
# The folders of a run directory that a run writes into while it runs (checkpoints, TensorBoard events): each is
# checked before it is written, as the run directory itself is (`RunDir.refuse_links_made`).
WRITTEN_DIRS = (CHECKPOINTS_DIR, CORRUPT_CHECKPOINTS_DIR, TENSORBOARD_DIR)
# summary.json's fields that hold text; every other field a reader may compute with holds a number or null (or
# an object or list, such as `provenance`, which no table reads).
SUMMARY_TEXT_FIELDS = ("status", "method", "dataset", "model", "execution", "interrupted_by", "error")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_SCALAR_SECTIONS = ("method", "seed", "stop_on_nan")  # the config's top-level fields that are values, not sections


def to_json(value: Any) -> Any:
  """`value` with JSON types only: non-finite floats as "nan"/"inf"/"-inf", 0-d arrays and NumPy scalars
  as Python numbers, tuples as lists (recursively)."""
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/Inf; keep them readable instead of writing invalid JSON
  if hasattr(value, "item") and getattr(value, "shape", None) == ():
    return to_json(value.item())
  if isinstance(value, dict):
    return {k: to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json(v) for v in value]
  return value


def from_json(value: Any) -> Any:
  """The inverse of `to_json` on what JSON reads back: "nan"/"inf"/"-inf" become floats again, inside
  lists and dicts too."""
  if isinstance(value, str):
    return _NONFINITE.get(value, value)
  if isinstance(value, dict):
    return {k: from_json(v) for k, v in value.items()}
  if isinstance(value, list):
    return [from_json(v) for v in value]
  return value


class TornLineWarning(UserWarning):
  """A JSON-lines file ends in an incomplete line (a run killed while writing it); it was skipped."""


def _no_follow(path: str, flags: int) -> int:
  return os.open(path, flags | os.O_NOFOLLOW, 0o666)


def open_no_follow(path: str | os.PathLike, mode: str = "r", **kwargs: Any) -> Any:
  """`open(path, mode)`, except that a symbolic link at `path` is an OSError (ELOOP) instead of the file it points
  to: what a run writes stays inside its directory even if a link appears there while it runs."""
  return open(path, mode, opener=_no_follow, **kwargs)


def symbolic_link_in(folder: str, names: Iterable[str]) -> str | None:
  """The path of the first of `names` (entries of `folder`) that is a symbolic link, or of a link anywhere inside
  one of them that is a folder (links are not followed); None when there is none."""
  return next((path for path, _ in _entries(folder, names) if os.path.islink(path)), None)


def _entries(folder: str, names: Iterable[str]) -> Iterator[tuple[str, os.stat_result]]:
  """(path, lstat) of each of `names` in `folder` that exists and of everything inside those that are folders, in
  a fixed order (links are not followed)."""
  for name in names:
    path = os.path.join(folder, name)
    try:
      yield path, os.lstat(path)
    except OSError:
      continue
    for root, dirs, files in os.walk(path):  # (nothing when `path` is not a folder; links are not entered)
      for entry in sorted(dirs + files):
        with contextlib.suppress(OSError):
          yield os.path.join(root, entry), os.lstat(os.path.join(root, entry))


def refuse_links(folder: str, names: Iterable[str], flag: str = "--workdir",
                 rewritten: Iterable[str] = IN_PLACE_FILES) -> None:
  """ConfigError naming the entry, before any work, when one of `names` in `folder` (the folder given as `flag`) is
  a symbolic link or holds one (`symbolic_link_in`): writing, moving or deleting through it would change files
  outside the folders the tool was given; or when a file among them that the tool rewrites in place (`rewritten`:
  appended, truncated) has another name too (a hard link): the tool would rewrite that other file."""
  rewritten, link, hard = set(rewritten), None, None
  for path, st in _entries(folder, names):  # (one walk: a symbolic link anywhere is named before a hard link)
    if stat.S_ISLNK(st.st_mode):
      link = path
      break
    if hard is None and os.path.basename(path) in rewritten and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
      hard = path, st.st_nlink
  if link is None:
    if hard is None:
      return
    path, count = hard
    raise ConfigError(f"{flag}={folder!r} holds {os.path.relpath(path, folder)} with {count} hard links (one file "
                      "under other names too, maybe outside the folder), which this tool rewrites in place and so "
                      "would change under every name; allowed: a file of the folder's own (replace it by a copy: "
                      f"cp {path!r} {path + '.copy'!r} && mv {path + '.copy'!r} {path!r}), or another {flag}")
  try:
    target = os.readlink(link)
  except OSError:
    target = "?"
  raise ConfigError(f"{flag}={folder!r} holds {os.path.relpath(link, folder)} as a symbolic link (to {target!r}), "
                    "which this tool would follow out of the folder it was given (it writes, moves and deletes only "
                    f"inside it); allowed: entries of the folder's own (remove the link {link!r}, or replace it by a "
                    f"copy), or another {flag}")


def write_json_atomic(path: str, obj: Any) -> None:
  """Writes `obj` as JSON to `path` through a temporary file renamed over it: `path` is either the old
  file or the whole new one, and a failed write (a full disk) leaves no temporary file behind. The temporary
  file is never a symbolic link's target (`open_no_follow`)."""
  tmp = f"{path}{TMP_SUFFIX}"
  try:
    with open_no_follow(tmp, "w") as f:
      json.dump(to_json(obj), f, indent=2, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


@contextlib.contextmanager
def _reading(path: str | os.PathLike) -> Iterator[None]:
  """Turns an OSError while reading `path` (a directory where a file belongs, no permission) into a
  DamagedRunFile naming it, and JSON nested deeper than Python's parser follows (a RecursionError) into one
  that says so."""
  try:
    yield
  except OSError as err:
    raise DamagedRunFile(f"{os.fspath(path)} cannot be read ({err.strerror or err}); allowed: a file this user "
                         "can read, as a run writes it") from None
  except RecursionError:
    raise DamagedRunFile(f"{os.fspath(path)} holds JSON nested deeper than this reader follows; allowed: a file "
                         "as a run writes it (a few levels deep)") from None
  except (lzma.LZMAError, EOFError) as err:  # (a compressed record cut short or overwritten)
    raise DamagedRunFile(f"{os.fspath(path)} cannot be decompressed ({err}); allowed: a record as a sweep keeps it "
                         "(`compress_jsonl`)") from None


def stored(path: str | os.PathLike) -> str | None:
  """Where the JSON-lines file `path` is kept: `path` itself, or its compressed form `path.xz` (a records
  directory's, `compress_jsonl`); None when neither exists."""
  path = os.fspath(path)
  return path if os.path.exists(path) else path + COMPRESSED if os.path.exists(path + COMPRESSED) else None


def _open_text(path: str) -> Any:
  """A stored JSON-lines file (`stored`) opened as text, decompressed on the fly when it is the `.xz` form."""
  if not path.endswith(COMPRESSED):
    return open_regular(path, encoding="utf-8", errors="replace")
  return std_io.TextIOWrapper(lzma.LZMAFile(open_regular(path, "rb")), encoding="utf-8", errors="replace")


def compress_jsonl(path: str) -> bool:
  """Replaces the JSON-lines file `path` by `path.xz` (lzma at preset 9; the same bytes in, the same bytes out, on
  any machine), atomically; False, changing nothing, when `path` is not a regular file of its own (absent, or a
  link, which a record keeps as a link). What a records directory keeps of a run's metrics and events: a sixth to
  an eighth of their size, read back by every reader of `io` as the file was (`stored`)."""
  if os.path.islink(path) or not os.path.isfile(path):
    return False
  with open_regular(path, "rb") as f:
    data = f.read()
  tmp = path + COMPRESSED + TMP_SUFFIX
  try:
    with open_no_follow(tmp, "wb") as f:
      f.write(lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9))
    os.replace(tmp, path + COMPRESSED)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
  os.remove(path)
  return True


def decompress_jsonl(path: str) -> bool:
  """The inverse of `compress_jsonl`: `path.xz` back to `path` (a run appends to the plain file); False when there is
  no `path.xz` of its own."""
  packed = path + COMPRESSED
  if os.path.islink(packed) or not os.path.isfile(packed):
    return False
  with _reading(packed), open_regular(packed, "rb") as f:
    data = lzma.decompress(f.read())
  tmp = path + TMP_SUFFIX
  with open_no_follow(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)
  os.remove(packed)
  return True


_SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def open_regular(path: str | os.PathLike, mode: str = "r", **kwargs: Any) -> Any:
  """`open(path, mode)` for reading ('r' or 'rb'), refusing anything but a regular file with a DamagedRunFile naming
  it: a FIFO would block the reader until something writes to it, a device may never end. Never blocks on opening
  (O_NONBLOCK, cleared once the file is known to be regular). A directory is an IsADirectoryError, as `open`
  gives."""
  try:
    bits = os.stat(path).st_mode
  except OSError:
    bits = 0  # (the open below raises what a missing or forbidden file raises)
  kind = next((name for test, name in _SPECIAL_FILES if test(bits)), None)
  if kind is None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    bits = os.fstat(fd).st_mode  # (what was opened, should the path have changed since the stat)
    if stat.S_ISREG(bits):
      os.set_blocking(fd, True)
      return os.fdopen(fd, mode, **kwargs)
    os.close(fd)
    if stat.S_ISDIR(bits):
      raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    kind = next((name for test, name in _SPECIAL_FILES if test(bits)), "not a regular file")
  raise DamagedRunFile(f"{os.fspath(path)} is {kind}, not a regular file; allowed: a file as a run writes it")


def read_json(path: str | os.PathLike) -> Any:
  """A JSON file decoded with `from_json`; DamagedRunFile when it cannot be read, is not a regular file or is not
  JSON."""
  with _reading(path), open_regular(path) as f:
    try:
      return from_json(json.load(f))
    except ValueError as err:
      raise DamagedRunFile(f"{os.fspath(path)} is not valid JSON ({err})") from None


def read_json_object(path: str | os.PathLike, what: str) -> dict:
  """`read_json` of a file that must hold one JSON object (summary.json, sweep.json); DamagedRunFile naming
  the file and `what` it should be otherwise."""
  value = read_json(path)
  if not isinstance(value, dict):
    raise DamagedRunFile(f"{os.fspath(path)} holds a JSON {_json_kind(value)}, not an object; allowed: {what}")
  return value


def _json_kind(value: Any) -> str:
  return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def read_jsonl(path: str | os.PathLike, required: Mapping[str, tuple[type, ...]] | None = None) -> list[dict]:
  """The records of a JSON-lines file decoded with `from_json`, read from `path` or, where a records directory keeps
  it compressed, from `path.xz` (`stored`); [] when neither exists.

  A last line that is not JSON is torn (a run killed while writing it, or a copy of a run still going):
  it is skipped with a TornLineWarning. A bad line before the last, a line that is JSON but not an object,
  or an object without one of the `required` fields ({name: the types its value may have}) raises
  DamagedRunFile naming the file and the line (none of them is what an interrupted write leaves)."""
  source = stored(path)
  if source is None:
    return []
  path = source  # (the messages name the file read)
  with _reading(path), _open_text(path) as f:
    lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
  records = []
  required = dict(required or {})
  allowed = "one JSON object per line" + (f" with the fields {', '.join(required)}" if required else "")
  for i, (number, line) in enumerate(lines):
    try:
      record = from_json(json.loads(line))
    except RecursionError:
      raise DamagedRunFile(f"{os.fspath(path)}: line {number} holds JSON nested deeper than this reader follows; "
                           f"allowed: {allowed}, a few levels deep") from None
    except ValueError as err:
      if i == len(lines) - 1:
        warnings.warn(f"{os.fspath(path)}: its last line (line {number}) is incomplete, as a run stopped while "
                      "writing it leaves it; read without it", TornLineWarning, stacklevel=2)
        break
      raise DamagedRunFile(f"{os.fspath(path)}: line {number} is not valid JSON ({err}); allowed: {allowed} "
                           "(only the last line may be incomplete)") from None
    if not isinstance(record, dict):
      raise DamagedRunFile(f"{os.fspath(path)}: line {number} is a JSON {_json_kind(record)}, not an object; "
                           f"allowed: {allowed}")
    missing = [name for name in required if name not in record]
    if missing:
      raise DamagedRunFile(f"{os.fspath(path)}: line {number} lacks the field(s) {', '.join(missing)}; allowed: "
                           f"{allowed}, as a run writes it")
    wrong = [f"{name}={record[name]!r}" for name, types in required.items()
             if not isinstance(record[name], types) or isinstance(record[name], bool)]
    if wrong:
      raise DamagedRunFile(f"{os.fspath(path)}: line {number} has {', '.join(wrong)}, a value of the wrong type; "
                           f"allowed: {allowed}, as a run writes them")
    records.append(record)
  return records


def config_json(config: ml_collections.ConfigDict) -> dict:
  """The config as config.json holds it (JSON types: lists for tuples, strings for non-finite floats)."""
  return json.loads(json.dumps(to_json(config.to_dict())))


# --- reading a run directory -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """Everything a run directory holds besides checkpoints: config.json (JSON form) and summary.json
  (None when absent: a run still going or killed early), metrics.jsonl and events.jsonl ([] when absent)."""

  config: dict | None
  summary: dict | None
  metrics: list[dict]
  events: list[dict]


def read_config(run_dir: str | os.PathLike) -> dict | None:
  """config.json as written (JSON form, comparable with `config_json`), or None when absent. A file that
  cannot be read or is not a JSON object raises DamagedRunFile (a ValueError)."""
  path = os.path.join(run_dir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with _reading(path), open_regular(path) as f:
    try:
      config = json.load(f)
    except ValueError as err:
      raise DamagedRunFile(f"{path} is not valid JSON ({err})") from None
  if not isinstance(config, dict):
    raise DamagedRunFile(f"{path} holds a JSON {_json_kind(config)}, not an object; allowed: a run's config")
  problem = _config_shape_problem(config)
  if problem:
    raise DamagedRunFile(f"{path}: {problem}; allowed: a run's config as a run writes it (a string 'method', and "
                         "each section, such as 'sim' and the method's own, an object)")
  return config


def _config_shape_problem(config: dict) -> str | None:
  """What makes a config.json object unusable by the readers (they compare its sections field by field), or None:
  a 'method' that is not a string, or a section that is not an object."""
  method = config.get("method")
  if "method" in config and not isinstance(method, str):
    return f"its 'method' is a JSON {_json_kind(method)}, not a string"
  for name in (*SHARED_SECTIONS, method if isinstance(method, str) else None, "runtime"):
    value = config.get(name)
    if name in config and name not in _SCALAR_SECTIONS and not isinstance(value, dict):
      return f"its section {name!r} is a JSON {_json_kind(value)}, not an object"
  return None


def read_summary(run_dir: str | os.PathLike) -> dict | None:
  """summary.json with its non-finite numbers restored, or None when absent; DamagedRunFile when it is not
  a JSON object, or when a field holds a value of the wrong type: text in a field other than
  `SUMMARY_TEXT_FIELDS` (the numbers tables and sweeps compute with), or a number in one of those."""
  path = os.path.join(run_dir, SUMMARY_FILE)
  if not os.path.exists(path):
    return None
  allowed = ("a run's summary, as a run writes it: text in " + ", ".join(SUMMARY_TEXT_FIELDS)
             + "; a number or null in every other field")
  summary = read_json_object(path, allowed)
  wrong = [f"{name}={value!r}" for name, value in summary.items()
           if value is not None and not isinstance(value, (dict, list))
           and isinstance(value, str) != (name in SUMMARY_TEXT_FIELDS)]
  if wrong:
    raise DamagedRunFile(f"{path} has {', '.join(wrong[:3])}, a value of the wrong type; allowed: {allowed}")
  return summary


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
  """metrics.jsonl: one record per evaluation, each with at least `METRICS_FIELDS`."""
  return read_jsonl(os.path.join(run_dir, METRICS_FILE), METRICS_FIELDS)


def read_events(run_dir: str | os.PathLike) -> list[dict]:
  """events.jsonl: one record per received update (and per round), each with its `type`; [] unless the run
  wrote events."""
  return read_jsonl(os.path.join(run_dir, EVENTS_FILE), EVENTS_FIELDS)


def read_run(run_dir: str | os.PathLike, events: bool = True) -> RunRecord:
  """A run directory's config, summary, metrics and events (see RunRecord); `events=False` leaves
  events.jsonl unread (it holds a line per update, the largest file of a long run) and gives []."""
  return RunRecord(read_config(run_dir), read_summary(run_dir), read_metrics(run_dir),
                   read_events(run_dir) if events else [])


def check_run_entries(path: str, extra_dirs: Iterable[str] = ()) -> None:
  """ConfigError, before anything in it is read or written, when the run directory `path` holds one of a run's
  entries (`RUN_FILES`, `RUN_DIRS`, and `extra_dirs`: the folders this run's options add) as the other kind (a
  directory where a run writes a file, a file where it keeps a directory, or neither) or as one this user
  cannot read and write (a folder: anything in it)."""
  check_entry_kinds(path, RUN_FILES, (*RUN_DIRS, *extra_dirs), "--workdir", "a run", "a run directory")


def check_entry_kinds(path: str, files: Iterable[str], dirs: Iterable[str], flag: str, owner: str,
                      folder: str) -> None:
  """`check_run_entries` for any folder a tool writes (a run's, a sweep's, a records folder): each of `files` that
  exists must be a file this user can read and write, each of `dirs` a folder whose every entry it can use;
  otherwise ConfigError naming the entry, `owner` (what keeps it: 'a run') and the `folder` ('a run directory')."""
  for name, want_dir in [(n, False) for n in files] + [(n, True) for n in dirs]:
    entry = os.path.join(path, name)
    if not os.path.lexists(entry):
      continue
    want = "a directory" if want_dir else "a file"
    have = ("a directory" if os.path.isdir(entry) else "a file" if os.path.isfile(entry)
            else "neither a file nor a directory")
    if have != want:
      raise ConfigError(f"{flag}={path!r} holds {name} as {have}, where {owner} keeps {want}; allowed: {folder} as "
                        f"{owner} leaves it (move {entry!r} away), or another {flag}")
    inaccessible = _inaccessible(entry) if want_dir else (
        None if os.access(entry, os.R_OK | os.W_OK) else entry)
    if inaccessible is not None:
      held = os.path.relpath(inaccessible, path)
      raise ConfigError(f"{flag}={path!r} holds {held}, which this user cannot read and write; allowed: {folder} "
                        f"this user can read and write (give it access to {inaccessible!r}), or another {flag}")


def _inaccessible(directory: str) -> str | None:
  """The first entry under `directory` (itself included) that this user cannot use as a run does: a directory it
  cannot list, enter and write (a checkpoint is read, and an old one deleted or set aside), or a file it cannot
  read; None when there is none."""
  if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
    return directory
  for root, dirs, files in os.walk(directory, onerror=lambda err: None):
    for name in dirs:
      if not os.access(os.path.join(root, name), os.R_OK | os.W_OK | os.X_OK):
        return os.path.join(root, name)
    for name in files:
      if not os.access(os.path.join(root, name), os.R_OK):
        return os.path.join(root, name)
  return None


def make_dirs(path: str) -> list[str]:
  """`os.makedirs(path, exist_ok=True)`, or nothing: when it fails part-way (a name or a path too long for the
  file system, a permission further down), the directories it made are removed again before the error
  propagates, so a refused --workdir leaves no empty folders behind. Returns the directories it made, deepest
  first (for `remove_dirs`, should later work in them fail)."""
  missing, parent = [], os.path.abspath(path)
  while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
    missing.append(parent)
    parent = os.path.dirname(parent)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:
    remove_dirs(missing)
    raise
  return missing


def remove_dirs(made: Iterable[str]) -> None:
  """Removes the directories `made` (deepest first) that are empty; one that is not, or another process's, stays."""
  for folder in made:
    with contextlib.suppress(OSError):
      os.rmdir(folder)


def check_workdir(path: str, config: ml_collections.ConfigDict) -> bool:
  """Raises ConfigError, before any work, when `path` cannot be a run directory for `config`:
  it cannot be created or written, it holds an entry a run writes through that is a symbolic link
  (`refuse_links`), an entry of a run of the wrong kind or one this user cannot read and write
  (`check_run_entries`), or it holds config.json of another run
  (`run_identity.identity_differences`: a difference in a shared field or in the method's own section).
  Creates the directory; returns whether it had to."""
  created = not os.path.isdir(path)
  probe, made = os.path.join(path, f".write-test-{os.getpid()}"), []
  try:
    made = make_dirs(path)
    with open_no_follow(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as err:
    with contextlib.suppress(OSError):  # (nothing left behind: the probe written in part, the folders made for it)
      os.remove(probe)
    remove_dirs(made)
    if is_write_limit(err):  # (not bad input: the same exit code as a disk that fills up during the run)
      raise OutputWriteError.of(err, path) from None
    raise ConfigError(
        f"--workdir={path!r} is not writable ({err.strerror or err}); allowed: a directory this user can "
        "create and write") from None
  refuse_links(path, RUN_WRITES)
  check_run_entries(path, (TENSORBOARD_DIR,) if config.runtime.tensorboard else ())
  try:
    saved = read_config(path)
  except (OSError, ValueError) as err:
    raise ConfigError(f"--workdir={path!r} holds an unreadable config.json ({err}); allowed: "
                      "a workdir with a valid config.json, or an empty or new workdir") from None
  if saved is None:
    return created
  old = run_identity.fields_of_an_older_schema(saved)
  if old:
    raise ConfigError(
        f"--workdir={path!r} holds a run written by an older version of this code, whose config fields have "
        f"since moved ({'; '.join(old[:3])}{'; ...' if len(old) > 3 else ''}); it cannot be resumed by this "
        "version; allowed: another --workdir (the old run's outputs stay readable by --mode=report)")
  diffs = run_identity.identity_differences(saved, config_json(config))
  if diffs:
    shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
    raise ConfigError(
        f"--workdir={path!r} holds a run of a different config ({shown}); allowed: the same config to "
        f"resume that run (only {run_identity.what_may_change()} may change), or another --workdir")
  return created


def claim(lock_path: str, owner: str, refusal: Callable[[str], str]) -> TextIO:
  """Claims a directory by an exclusive `flock` on its lock file `lock_path`, and writes `owner` into it for
  whoever is refused next. The claim lasts while the returned file is open: closing it releases it, and so
  does the process's death, even by SIGKILL (the OS drops the lock), so a claim is never left stale.
  ConfigError(`refusal(holder)`) at once, without waiting, when another process (or another open claim)
  holds it; `holder` is what that claimant wrote ('unknown' if nothing)."""
  try:  # (read and write, created if missing, never truncated before the lock is held, never through a link)
    f = os.fdopen(os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666), "r+")
  except OSError as err:  # (a directory where the lock file belongs is refused earlier: `check_run_entries`)
    raise OutputWriteError.of(err, lock_path) from None
  try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    f.seek(0)
    holder = f.read().strip() or "unknown"
    f.close()
    raise ConfigError(refusal(holder)) from None
  try:
    f.seek(0)
    f.truncate()
    f.write(owner + "\n")
    f.flush()
  except BaseException as err:
    with contextlib.suppress(OSError):  # (closing flushes what could not be written, and fails again)
      f.close()  # (releases the flock)
    if isinstance(err, OSError):  # (a full disk)
      raise OutputWriteError.of(err, lock_path) from None
    raise
  return f


def refuse_link_made(path: str, was_link: bool = False) -> None:
  """OutputWriteError (ELOOP: exit 3) naming `path` when it is a symbolic link now and was not one when the work
  began (`was_link`): a folder replaced by a link while a run or a sweep goes on, whose next write would land
  where the link points."""
  if os.path.islink(path) and not was_link:
    raise OutputWriteError(errno.ELOOP, "it became a symbolic link while the run went on", path)


class RunDir:
  """A run's output folder."""

  def __init__(self, path: str):
    self.path = path
    os.makedirs(path, exist_ok=True)
    self._was_link = os.path.islink(path)  # (the folder given may be a link; one made later is refused)
    self._files: dict[str, Any] = {}
    self._lock: Any = None

  def refuse_links_made(self) -> None:
    """OutputWriteError (exit 3) naming it when the run directory, or a folder in it that the run writes into
    (`WRITTEN_DIRS`), has become a symbolic link since the run began (`refuse_link_made`). Called before each
    write into those folders: the files themselves are opened without following links (`open_no_follow`), the
    folders they lie in are checked here."""
    refuse_link_made(self.path, self._was_link)
    for name in WRITTEN_DIRS:
      refuse_link_made(self.file(name))

  def lock(self) -> None:
    """Claims the directory for this run until `close()` (`claim`). ConfigError if another run holds it: two
    runs appending to and truncating the same outputs would corrupt both."""
    self._lock = claim(self.file(LOCK_FILE), f"pid {os.getpid()}", lambda holder: (
        f"--workdir={self.path!r} is in use by another run ({holder}); allowed: a workdir no running "
        "process (or unclosed Simulation) writes to"))

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def write_config(self, config: ml_collections.ConfigDict) -> None:
    write_json_atomic(self.file("config.json"), config.to_dict())

  def append(self, name: str, records: Iterable[dict]) -> None:
    """Appends JSON lines to `name` and flushes them to the OS at once."""
    if name not in self._files:
      self._files[name] = open_no_follow(self.file(name), "a")
    f = self._files[name]
    for record in records:
      f.write(json.dumps(to_json(record), sort_keys=True) + "\n")
    f.flush()

  def sync(self) -> None:
    """Flushes and fsyncs every open output, so that what a checkpoint records is on disk; OutputWriteError
    naming the output that fails."""
    for f in self._files.values():
      try:
        f.flush()
        os.fsync(f.fileno())
      except OSError as err:
        raise OutputWriteError.of(err, f.name) from None

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
      with open_no_follow(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())

  def write_summary(self, summary: dict) -> None:
    write_json_atomic(self.file("summary.json"), summary)

  def close(self) -> None:
    for f in self._files.values():
      try:
        f.close()
      except OSError:  # (a flush that failed before, e.g. a full disk, fails again: the error was raised then)
        pass
    self._files.clear()
    if self._lock is not None:
      self._lock.close()  # releases the flock
      self._lock = None
