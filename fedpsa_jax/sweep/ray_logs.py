"""Where Ray's own output goes while a sweep runs on it: SWEEP_DIR/ray.log, so that the console holds the sweep's
lines only.

Ray writes from the sweep's process in two ways: its `ray` logger (joining the cluster, its warnings) and, from its
own threads, lines it prints on stdout and stderr (the raylet's notes that a worker died or that a task is retried,
the autoscaler's). `output_to` points the logger at the file and sends what any thread but the main one writes on
stdout and stderr there too; the sweep's own lines come from the main thread and reach the console as before. A
member's own output (its worker's stdout and stderr) stays where Ray keeps it, in the logs folder of the Ray session
on the member's node (`/tmp/ray/session_latest/logs/worker-*.out`, `.err`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Iterator, TextIO

from fedpsa_jax import io
from fedpsa_jax.errors import OutputWriteError

RAY_LOG = "ray.log"
RAY_LOGGER = "ray"  # Ray's Python logger in the sweep's process (its children, `ray.*`, pass their records to it)


class MainThreadConsole:
  """Stands for sys.stdout or sys.stderr: what the main thread writes goes to `console`, what any other thread
  writes (Ray's threads) to `log`. Everything else (`fileno`, `isatty`, `encoding`, ...) is the console's."""

  def __init__(self, console: TextIO, log: TextIO):
    self._console, self._log = console, log

  def write(self, text: str) -> int:
    on_main = threading.current_thread() is threading.main_thread()
    return (self._console if on_main else self._log).write(text)

  def flush(self) -> None:
    self._console.flush()
    self._log.flush()

  def __getattr__(self, name: str):
    return getattr(self._console, name)


@contextlib.contextmanager
def output_to(path: str) -> Iterator[None]:
  """Inside the block, Ray's output in this process goes to `path` (appended: a resumed sweep's log follows the
  earlier attempts'), opened without following a link; the logger's handlers and sys.stdout and sys.stderr are
  put back after it."""
  try:
    log = io.open_no_follow(path, "a", buffering=1)  # (line-buffered: each line there as Ray writes it)
  except OSError as err:
    raise OutputWriteError.of(err, path) from None
  logger = logging.getLogger(RAY_LOGGER)
  saved = logger.handlers[:], logger.propagate, sys.stdout, sys.stderr
  handler = logging.StreamHandler(log)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
  logger.handlers, logger.propagate = [handler], False
  sys.stdout, sys.stderr = MainThreadConsole(sys.stdout, log), MainThreadConsole(sys.stderr, log)
  try:
    yield
  finally:
    logger.handlers, logger.propagate, sys.stdout, sys.stderr = saved
    log.close()
