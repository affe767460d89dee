"""SIGINT and SIGTERM stop a run cleanly, and never cut a checkpoint in half.

`handle_signals()` makes both signals raise `errors.Interrupted` in the main thread, so the run unwinds
(summary written with status `interrupted`, files closed, the workdir lock released) and the command line
turns the exception into its exit code (130 / 143). `deferred_signals()` holds a signal back while
something that must not be cut (a checkpoint write) finishes, then delivers it: a signal is never lost,
and never lands half-way through a checkpoint.

A module of its own, standard library only, because the simulator's recorder and runner use
`deferred_signals`: they must not import the command line, which sits on top of them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

from fedpsa_jax import errors

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_interrupted(signum: int, frame: Any) -> None:
  del frame
  raise errors.Interrupted(signum)


def handle_signals() -> None:
  """SIGINT and SIGTERM raise `errors.Interrupted` in the main thread from now on (main thread only)."""
  for signum in SIGNALS:
    signal.signal(signum, _raise_interrupted)


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


def _deliver(signum: int, handler: Any) -> None:
  """Delivers a held-back signal as its handler would have."""
  if callable(handler):
    handler(signum, None)
  elif handler == signal.SIG_DFL:
    signal.raise_signal(signum)  # the default action (SIGTERM: the process ends; SIGINT: KeyboardInterrupt)
  # SIG_IGN (or None: a handler not set from Python): nothing to do
