"""Counting XLA compilations, to check that nothing recompiles inside the simulation loop."""

from __future__ import annotations

import collections

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # recorded by JAX once per backend compile


class CompileCounter:
  """Counts the XLA compilations that happen while it is open (any thread of this process).

  `with CompileCounter() as c: ...; c.count`, or `open()`/`close()` around a longer span.
  `by_function` counts them per jitted function name (e.g. 'jit(_run_batches)'): a name counted more
  often than it has shapes and devices is compiling the same program again.
  """

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    self.by_function: collections.Counter[str] = collections.Counter()
    self._open = False

  def _listener(self, event: str, duration: float, **kwargs) -> None:
    if event == _COMPILE_EVENT:
      self.count += 1
      self.seconds += duration
      self.by_function[str(kwargs.get("fun_name", "?"))] += 1

  def open(self) -> "CompileCounter":
    if not self._open:
      jax.monitoring.register_event_duration_secs_listener(self._listener)
      self._open = True
    return self

  def close(self) -> None:
    if self._open:
      jax.monitoring.unregister_event_duration_listener(self._listener)
      self._open = False

  def __enter__(self) -> "CompileCounter":
    return self.open()

  def __exit__(self, *exc) -> None:
    self.close()
