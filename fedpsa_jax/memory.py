"""Giving freed heap memory back to the operating system, so that a run's RSS follows what it holds.

XLA's compiler (LLVM) and the host loop allocate and free many small blocks; glibc's malloc keeps freed
memory in its arenas rather than returning it, so a process's RSS grows with what it ever held at once,
not with what it holds. `malloc_trim(0)` returns the free pages. A run trims after each compile (compiles free
the most and come at a run's start, so this costs nothing measurable); `runtime.trim_heap` trims at each
evaluation and once a second of rounds as well, which lowers the peak further but costs speed, as the pages
come back as page faults (figures: docs/performance.md, "Memory"). Elsewhere than glibc (macOS, musl) there is
no `malloc_trim` and `trim_heap` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # (compiles.py counts the same event)


def _find_malloc_trim():
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  except OSError:
    return None
  trim = getattr(libc, "malloc_trim", None)
  if trim is not None:
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
  return trim


_MALLOC_TRIM = _find_malloc_trim()  # the C library's function, looked up once (None: not glibc)


def trim_heap() -> bool:
  """Returns the heap's free pages to the operating system (glibc); True if the C library could."""
  return bool(_MALLOC_TRIM is not None and _MALLOC_TRIM(0))


class PeriodicTrim:
  """`maybe()` trims the heap when at least `every_seconds` of wall time passed since its last trim: the host
  loop calls it once per round, and the check is one clock read."""

  def __init__(self, every_seconds: float = 1.0):
    self.every_seconds = every_seconds
    self.last = time.perf_counter()

  def maybe(self) -> None:
    now = time.perf_counter()
    if now - self.last >= self.every_seconds:
      trim_heap()
      self.last = time.perf_counter()


def _trim_after_compile(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  if event == _COMPILE_EVENT and _open_trimmers[0] > 0:
    trim_heap()


# How many `TrimAfterCompiles` are open: one listener serves them all (it is registered with JAX once, the
# first time one opens), so that several open runs (a notebook's) do not trim several times per compile.
_open_trimmers = [0]
_registered = [False]


class TrimAfterCompiles:
  """While open, trims the heap after every XLA compile of this process (compiling frees the most)."""

  def __init__(self):
    self._open = False

  def open(self) -> "TrimAfterCompiles":
    if not self._open and _MALLOC_TRIM is not None:
      if not _registered[0]:
        jax.monitoring.register_event_duration_secs_listener(_trim_after_compile)
        _registered[0] = True
      _open_trimmers[0] += 1
      self._open = True
    return self

  def close(self) -> None:
    if self._open:
      _open_trimmers[0] -= 1
      self._open = False


class HeapTrimmer:
  """What a run does to give freed memory back, in one place: while open, trims after every compile
  (`TrimAfterCompiles`); with `during_rounds` (`runtime.trim_heap`) also after each evaluation
  (`after_evaluation`) and at most once a second of rounds (`after_round`, a `PeriodicTrim`), which cost speed
  (docs/performance.md, "Memory") and are off by default."""

  def __init__(self, during_rounds: bool, every_seconds: float = 1.0):
    self.during_rounds = during_rounds
    self.after_compiles = TrimAfterCompiles()
    self.periodic = PeriodicTrim(every_seconds)

  def open(self) -> "HeapTrimmer":
    self.after_compiles.open()
    return self

  def close(self) -> None:
    self.after_compiles.close()

  def after_round(self) -> None:
    if self.during_rounds:
      self.periodic.maybe()

  def after_evaluation(self) -> None:
    if self.during_rounds:
      trim_heap()
