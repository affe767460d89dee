"""What can go wrong that a user caused or must act on, as exception types (docs/runs.md, the exit codes).

This module imports nothing from the project (nor JAX), so that every layer, down to the run-directory
reader and the sweep and report tools, can raise and catch the same errors. `launch.py` turns each into
one line on stderr and its exit code (`fedpsa_jax.cli`), without a traceback:

- `UserError` (exit 2): bad input found before any work, or a run directory that cannot be used as it is
  (a config value, a flag, a config file, the workdir, missing or malformed data (`DataError`), a checkpoint
  this code must not or cannot rebuild, a damaged output file). `ConfigError` is the common case.
- `OutputWriteError` (exit 3): the run could not write one of its outputs (a full disk, a quota, a
  read-only file system); its state on disk stays resumable.
- `Interrupted` (exit 128 + the signal: 130 for SIGINT, 143 for SIGTERM): a signal stopped the run.
"""

from __future__ import annotations

import contextlib
import errno as errno_lib
import logging
import os
import signal
from typing import Iterator


class UserError(Exception):
  """Bad input or a run directory that cannot be used: one message naming what and what is allowed."""


class ConfigError(UserError, ValueError):
  """Bad input found before any training: a config value, the workdir, or a resume that cannot be.

  A ValueError, so callers that catch ValueError (notebooks, older code) keep working. The message names
  the field or flag, the value, and what is allowed."""


class DataError(UserError, ValueError):
  """A dataset that cannot be used as it is: a file that cannot be read, a missing key or split, images of the
  wrong shape or dtype, labels outside the classes. Found when the data is loaded, before any training; the
  message names the file (or the dataset) and what is wrong."""


class DamagedRunFile(UserError, ValueError):
  """A file of a run or sweep directory cannot be read or is not what a run writes: unreadable, not JSON, a
  line that is not JSON (other than a torn last line, which the readers skip with a warning), not an object,
  or without a field every reader needs. The message names the file (and line) and what is allowed."""


# What to do about an output that cannot be written, by its cause: only a full device or quota is fixed by
# making room; the others are a path of the wrong kind or one this user may not write.
_ADVICE = {
    errno_lib.ENOSPC: "make room and rerun the same command (a run resumes from its last checkpoint)",
    errno_lib.EDQUOT: "make room and rerun the same command (a run resumes from its last checkpoint)",
    errno_lib.EROFS: "the file system is read-only; allowed: a --workdir on a writable file system",
    errno_lib.EACCES: "this user may not write there; allowed: a --workdir this user can write",
    errno_lib.EPERM: "this user may not write there; allowed: a --workdir this user can write",
    errno_lib.ENOTDIR: "a part of the path is a file where a directory must be; allowed: move that file away, "
                       "or another --workdir",
    errno_lib.EISDIR: "it is a directory where a file must be; allowed: move that directory away, or another "
                      "--workdir",
    errno_lib.ELOOP: "it is a symbolic link, which this tool never writes through; allowed: remove the link, or "
                     "another --workdir",
    errno_lib.EFBIG: "a limit on the size of one file (ulimit -f) stops the write; allowed: raise the limit and rerun "
                     "the same command (a run resumes from its last checkpoint)",
}


class OutputWriteError(OSError):
  """Writing one of the run's outputs failed (ENOSPC and the like). An OSError with the original errno,
  strerror and the path, so callers that catch OSError keep working. Its message's advice fits the cause
  (a full disk: make room; a read-only file system, a permission, a path of the wrong kind: which)."""

  def __str__(self) -> str:
    code = errno_lib.errorcode.get(self.errno, str(self.errno)) if self.errno is not None else "error"
    advice = _ADVICE.get(self.errno, "rerun the same command once it can be written (a run resumes from its "
                                     "last checkpoint)")
    return f"cannot write {self.filename}: {self.strerror or 'write failed'} ({code}); {advice}"

  @classmethod
  def of(cls, err: BaseException, path: str | os.PathLike) -> "OutputWriteError":
    """The error of writing `path` that `err` (an OSError, or a library error wrapping one) describes."""
    if isinstance(err, OutputWriteError):
      return err
    code, strerror = getattr(err, "errno", None), getattr(err, "strerror", None)
    if code is None and is_write_limit(err):  # (a library's error that only says so in its text)
      full = (errno_lib.EDQUOT if "Disk quota exceeded" in str(err) else
              errno_lib.ENOSPC if is_disk_full(err) else errno_lib.EFBIG)
      code, strerror = full, os.strerror(full)
    return cls(code, strerror or str(err), os.fspath(path))


class Interrupted(KeyboardInterrupt):
  """A signal (SIGINT, SIGTERM) asked the run to stop.

  A KeyboardInterrupt, so that everything that already stops cleanly on Ctrl-C (and never swallows it
  as an ordinary Exception) treats SIGTERM alike."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.signum).name

  def __str__(self) -> str:
    return f"interrupted by {self.signal_name}"


def exception_chain(err: BaseException | None) -> Iterator[BaseException]:
  """`err`, then the error it was raised from or while handling, and so on (each once: a chain may loop)."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    yield err
    err = err.__cause__ or err.__context__


def is_write_limit(err: BaseException) -> bool:
  """Whether `err` (or an error it wraps) says a write met a limit: a full device or quota (`is_disk_full`), or a
  limit on one file's size (EFBIG: `ulimit -f`)."""
  if is_disk_full(err):
    return True
  return any(getattr(e, "errno", None) == errno_lib.EFBIG or "File too large" in str(e) for e in exception_chain(err))


def is_disk_full(err: BaseException) -> bool:
  """Whether `err` (or an error it wraps) says the device or the quota is full."""
  for e in exception_chain(err):
    if getattr(e, "errno", None) in (errno_lib.ENOSPC, errno_lib.EDQUOT):
      return True
    if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
      return True  # (tensorstore, under orbax, reports the OS error as text)
  return False


@contextlib.contextmanager
def absl_warnings_held() -> Iterator[None]:
  """absl's log lines below ERROR kept off the console while a library runs that logs what went wrong
  (ml_collections' "get_config returned None", tfds' "Split train has no examples"): the tool says it in one line
  of its own, and the library's lines would come before that line."""
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    absl_logger.setLevel(level)
