"""SIGINT and SIGTERM stop a run cleanly, and never cut a checkpoint in half.

`handle_signals()` makes the first of these signals raise `errors.Interrupted` in the main thread, so the run
unwinds (summary written with status `interrupted`, files closed, the workdir lock released) and the command
line turns the exception into its exit code (130 / 143); a second one while it stops (an impatient Ctrl-C, a
scheduler's SIGTERM after it) is dropped, so the stop completes and the exit code stays the first signal's.
`exit_on_signal(code)`, once the exit code is known, makes a later signal end the process at once with that
code (not a traceback from the interpreter's clean-up). `end_process(code)` then ends the process without the
interpreter's finalization: a signal that arrived while XLA compiled left that compile running on JAX's
compile threads, and the finalization would free the JAX client under it (a segmentation fault), and it
restores the default handlers, under which one more signal would kill the process instead of letting it
exit with its code. `exit_while_starting()` covers the start (imports, flags, the config file), before
anything is written: a signal then ends the process at once, in one line. `deferred_signals()` holds a signal back while
something that must not be cut (a checkpoint write) finishes, then delivers it: a signal is never lost,
and never lands half-way through a checkpoint. `kept_handlers()` keeps these handlers through a library call
that installs its own (`ray.init`).

A module of its own, standard library only, because the simulator's recorder and runner use
`deferred_signals`: they must not import the command line, which sits on top of them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from typing import Any, Iterator, NoReturn

from fedpsa_jax import errors

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _FirstSignalStops:
  """The handler `handle_signals` installs: the first signal raises `errors.Interrupted` (or, where Python
  would swallow it, leaves it to `stop_if_signalled`); any later one is dropped (the run is already stopping,
  and the exit code is the first signal's)."""

  def __init__(self):
    self.received: int | None = None  # the first signal

  def __call__(self, signum: int, frame: Any) -> None:
    if self.received is None:
      self.received = signum
      if not _swallowed_there(frame):  # (there `stop_if_signalled` raises it at the run's next step)
        raise errors.Interrupted(signum)


def _swallowed_there(frame: Any) -> bool:
  """Whether Python would print and drop an exception raised in `frame`: inside a `__del__` or a
  garbage-collection callback (JAX registers one, which a signal can land in while a run compiles)."""
  callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code.co_name == "__del__" or frame.f_code in callbacks:
      return True
    frame = frame.f_back
  return False


def handle_signals() -> None:
  """From now on the first SIGINT or SIGTERM raises `errors.Interrupted` in the main thread, and later ones
  are dropped (main thread only)."""
  handler = _FirstSignalStops()
  for signum in SIGNALS:
    signal.signal(signum, handler)


def stop_if_signalled() -> None:
  """Raises `errors.Interrupted` when `handle_signals`' handler (still installed) has received a signal and
  the caller goes on all the same: the signal landed where an exception would be swallowed (a `__del__`, a
  garbage-collection callback: not raised there), or in a weakref callback, whose exception Python prints and
  drops. The simulator's loop calls it at each step, so such a stop still stops the run; the Ray executor calls it
  where Ray turned the handler's exception into a bare KeyboardInterrupt, so the stop names its signal."""
  handler = signal.getsignal(signal.SIGTERM)  # (the process's handler: signals are process-wide state)
  if isinstance(handler, _FirstSignalStops) and handler.received is not None:
    raise errors.Interrupted(handler.received)


def exit_while_starting() -> None:
  """Until `handle_signals`, SIGINT or SIGTERM end the process at once with one line and 128 + the signal:
  nothing is written before a mode starts (imports, flags, the config file), so there is nothing to stop
  cleanly, and Python's KeyboardInterrupt would print the traceback of whatever import it cut (main thread
  only; standard library only, so that launch.py can call it before importing anything else)."""
  def handler(signum: int, frame: Any) -> None:
    del frame
    with contextlib.suppress(OSError):  # (stderr closed: the exit code still says it)
      os.write(2, f"interrupted by {signal.Signals(signum).name} while starting: nothing was run or "
                  "written\n".encode())
    os._exit(128 + signum)

  for signum in SIGNALS:
    signal.signal(signum, handler)


def _flush_streams() -> None:
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):  # (a closed pipe: nothing more can reach it)
      stream.flush()


def end_process(code: int) -> NoReturn:
  """Ends the process now with `code`, once everything is written and closed (the command line, after a
  stop): stdout, stderr and the log handlers flushed, a Ray instance this process started shut down, and
  no interpreter finalization, whose freeing of the JAX client can crash under a compile that the signal
  left running on JAX's threads, and which restores the default signal handlers."""
  _flush_streams()
  with contextlib.suppress(Exception):
    logging.shutdown()
  ray = sys.modules.get("ray")  # (never imported here: only a sweep with --executor=ray started one)
  if ray is not None and getattr(ray, "is_initialized", lambda: False)():
    with contextlib.suppress(Exception):
      ray.shutdown()
  os._exit(code)


def exit_on_signal(code: int) -> None:
  """From now on (the program is exiting with `code`) SIGINT and SIGTERM end the process at once with `code`,
  stdout and stderr flushed: nothing is left to save, and a signal inside the interpreter's clean-up (JAX's
  atexit hooks) would otherwise print a traceback there (main thread only)."""
  def handler(signum: int, frame: Any) -> None:
    del signum, frame
    _flush_streams()
    os._exit(code)

  for signum in SIGNALS:
    signal.signal(signum, handler)


@contextlib.contextmanager
def deferred_signals(deliver: bool = True) -> Iterator[None]:
  """Holds SIGINT and SIGTERM back inside the block and delivers the first one after it, through the
  handler that was in place (ours raises `Interrupted`; Python's default SIGINT handler raises
  KeyboardInterrupt; a default SIGTERM ends the process); `deliver=False` drops them instead (for the
  cleanup of a run that is already stopping). Outside the main thread (where signals are never
  delivered) the block simply runs."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  received: list[int] = []
  previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
  for signum in SIGNALS:
    signal.signal(signum, lambda signum, frame: received.append(signum))
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    if received and deliver:
      _deliver(received[0], previous[received[0]])


@contextlib.contextmanager
def kept_handlers() -> Iterator[None]:
  """The SIGINT and SIGTERM handlers in place before the block are in place after it, at the C level too: a library
  that installs its own inside it leaves none behind. `ray.init` does: a SIGTERM handler that exits the process at
  once, without the run's clean stop, and under it the C++ core's crash handler, which prints a stack dump first
  (main thread only; elsewhere the block simply runs)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
  try:
    yield
  finally:
    for signum, handler in previous.items():
      if handler is not None:  # (None: a handler not set from Python, which Python cannot put back)
        signal.signal(signum, handler)


def _deliver(signum: int, handler: Any) -> None:
  """Delivers a held-back signal as its handler would have."""
  if callable(handler):
    handler(signum, None)
  elif handler == signal.SIG_DFL:
    signal.raise_signal(signum)  # the default action (SIGTERM: the process ends; SIGINT: KeyboardInterrupt)
  # SIG_IGN (or None: a handler not set from Python): nothing to do
