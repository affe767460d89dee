"""The host loop waits on the devices only where it must: between evaluations, FedBuff's and
FedPSA's loops read no device value on the host (each read is a sync: the host stops until the device has
computed it). Evaluations write metrics and may read.

`jax.transfer_guard_device_to_host` cannot check this on a CPU (its arrays already live in host memory, so
nothing is ever "transferred"), so every host read of a jax array (`float`, `int`, `bool`,
`device_get`, `tolist`) is refused here at its source: `ArrayImpl._value` and `__array__`. (A
bare `np.asarray(x)` or `x.item()` reads through the buffer protocol and is not caught; FedBuff's and
FedPSA's loops have none.)
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import pytest
from jax._src import array as jax_array

from fedpsa_jax import io
from fedpsa_jax.sim import runner
from helpers import small_config


class HostRead(RuntimeError):
  pass


_refusing = [False]  # inside `no_host_reads` and outside an evaluation


@contextlib.contextmanager
def no_host_reads():
  """Within: reading a jax array's value on the host raises HostRead (unless `allow_host_reads`)."""
  value, to_numpy = jax_array.ArrayImpl._value, jax_array.ArrayImpl.__array__

  def checked_value(self):
    if _refusing[0]:
      raise HostRead(f"host read of a device array {self.shape} {self.dtype}")
    return value.fget(self)

  def checked_array(self, *args, **kwargs):
    if _refusing[0]:
      raise HostRead(f"host read of a device array {self.shape} {self.dtype}")
    return to_numpy(self, *args, **kwargs)

  jax_array.ArrayImpl._value, jax_array.ArrayImpl.__array__ = property(checked_value), checked_array
  _refusing[0] = True
  try:
    yield
  finally:
    _refusing[0] = False
    jax_array.ArrayImpl._value, jax_array.ArrayImpl.__array__ = value, to_numpy


@contextlib.contextmanager
def allow_host_reads():
  before, _refusing[0] = _refusing[0], False
  try:
    yield
  finally:
    _refusing[0] = before


def _guarded_run(sim: runner.Simulation, until_day: float) -> None:
  """Runs `sim` to `until_day` with host reads refused everywhere but in evaluations."""
  evaluate = sim._log_eval

  def allowed(t):
    with allow_host_reads():
      return evaluate(t)

  sim._log_eval = allowed
  with no_host_reads():
    sim.run_until(until_day)


@pytest.mark.parametrize("read", [lambda x: float(x[0]), lambda x: int(x[0]), lambda x: bool(x[0] > 0),
                                  lambda x: x.tolist(), jax.device_get])
def test_the_check_refuses_every_kind_of_host_read(read):
  x = jnp.ones((3,)) * 2
  with no_host_reads(), pytest.raises(HostRead):
    read(x)
  assert float(x[0]) == 2.0  # restored


def test_the_check_catches_a_read_inside_the_loop():
  sim = runner.Simulation(small_config("fedbuff", days=0.02))
  sim.run_until(0.006)
  receive = sim.strategy.receive

  def peeking(state, arrivals):
    float(jnp.sum(arrivals[0].delta["params"]["Dense_0"]["bias"]))  # a host read: a sync per event
    return receive(state, arrivals)

  sim.strategy.receive = peeking
  with pytest.raises(HostRead):
    _guarded_run(sim, 0.02)


@contextlib.contextmanager
def counted_waits():
  """Within: counts every wait for a device (`jax.block_until_ready` and the array method), outside
  evaluations (`_guarded_run` allows those)."""
  waits = []
  function, method = jax.block_until_ready, jax_array.ArrayImpl.block_until_ready

  def counted_function(x):
    if _refusing[0]:
      waits.append(x)
    return function(x)

  def counted_method(self):
    if _refusing[0]:
      waits.append(self)
    return method(self)

  jax.block_until_ready, jax_array.ArrayImpl.block_until_ready = counted_function, counted_method
  try:
    yield waits
  finally:
    jax.block_until_ready, jax_array.ArrayImpl.block_until_ready = function, method


@pytest.mark.parametrize("method", ["fedbuff", "fedpsa"])
@pytest.mark.parametrize("events", [False, True])
def test_no_host_read_and_no_wait_per_event_between_evaluations(method, events, tmp_path):
  """Between evaluations the host reads no device value (event lines wait until the evaluation) and waits
  for a device only to bound its lead (once per round, never per event); runtime.phase_timing off."""
  sim = runner.Simulation(small_config(method, days=0.03, output__events=events), str(tmp_path / "run"))
  sim.run_until(0.006)  # past the first compiles and evaluations
  updates, evaluations, rounds = sim.loop.client_updates, len(sim.history), sim.loop.round
  with counted_waits() as waits:
    _guarded_run(sim, 0.03)
  assert sim.loop.client_updates > updates + 20 and len(sim.history) > evaluations  # real work, evaluations too
  assert 0 < len(waits) <= sim.loop.round - rounds < sim.loop.client_updates - updates  # one per round at most
  assert len(sim.rounds_in_flight) <= runner.ROUNDS_AHEAD
  sim.finish()
  if events:  # every update and every round written, deferred or not
    lines = io.read_events(str(tmp_path / "run"))
    assert sum(line["type"] == "update" for line in lines) == sim.loop.client_updates
    assert sum(line["type"] == "round" for line in lines) == sim.loop.round
    assert all(isinstance(v, (int, float, str, list, type(None))) for line in lines for v in line.values())


def test_phase_timing_waits_at_every_event():
  """The check above would see waits: with runtime.phase_timing the host waits at every event."""
  sim = runner.Simulation(small_config("fedbuff", days=0.02, runtime__phase_timing=True))
  sim.run_until(0.006)
  updates = sim.loop.client_updates
  with counted_waits() as waits:
    _guarded_run(sim, 0.02)
  assert len(waits) >= 2 * (sim.loop.client_updates - updates)
