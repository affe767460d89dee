"""The run loop (sim/runner.py) on short runs of the embedded MNIST subset: the AULC and time-to-target
readings, a failed run's metrics and summary, the summary's bytes and compute seconds, the evaluation against a
per-sample reference; and the host loop, which waits on the devices only where it must.

Between evaluations, FedBuff's and FedPSA's loops read no device value on the host (each read is a sync: the
host stops until the device has computed it); evaluations write metrics and may read.
`jax.transfer_guard_device_to_host` cannot check this on a CPU (its arrays already live in host memory, so
nothing is ever "transferred"), so every host read of a jax array (`float`, `int`, `bool`, `device_get`,
`tolist`) is refused here at its source: `ArrayImpl._value` and `__array__`. (A bare `np.asarray(x)` or
`x.item()` reads through the buffer protocol and is not caught; FedBuff's and FedPSA's loops have none.)
"""

from __future__ import annotations

import contextlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import array as jax_array

from fedpsa_jax import io, local, metrics
from fedpsa_jax.sim import runner
from helpers import small_config


def test_aulc_formula():
  assert metrics.aulc([0, 1, 2], [0.0, 0.5, 1.0]) == pytest.approx(1.0)
  assert metrics.aulc([0, 10], [0.6, 0.6]) == pytest.approx(6.0)


def test_failed_run_keeps_metrics_and_writes_summary(tmp_path, monkeypatch):
  c = small_config("fedbuff", days=0.02)
  sim = runner.Simulation(c, str(tmp_path))
  calls = {"n": 0}
  original = sim.strategy.receive

  def failing_receive(state, arrivals):
    calls["n"] += 1
    if calls["n"] == 30:
      raise RuntimeError("injected failure")
    return original(state, arrivals)

  monkeypatch.setattr(sim.strategy, "receive", failing_receive)
  with pytest.raises(RuntimeError, match="injected"):
    sim.run()
  assert json.load(open(tmp_path / "summary.json"))["status"] == "failed"
  assert len(io.read_jsonl(str(tmp_path / "metrics.jsonl"))) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedbuff", "fedpsa"])
def test_summary_accounts_bytes_and_compute(method):
  """Every update uploads Δ (the model's size) plus the payload; every dispatch downloads the model. Under
  runtime.phase_timing the compute phases have their seconds; without it they are null (not timed)."""
  untimed = runner.Simulation(small_config(method, days=0.01)).run()
  sim = runner.Simulation(small_config(method, days=0.01, runtime__phase_timing=True))
  summary = sim.run()
  assert {k: v for k, v in summary.items() if k not in runner.PROCESS_FIELDS} == {
      k: v for k, v in untimed.items() if k not in runner.PROCESS_FIELDS}  # timing changes nothing else
  phases = ("server_compute_seconds", "client_compute_seconds", "client_payload_seconds", "train_seconds")
  assert all(untimed[k] is None for k in phases)
  assert summary["client_payload_seconds"] >= 0 and summary["train_seconds"] == summary["client_compute_seconds"]
  if method == "fedpsa":
    assert summary["client_payload_seconds"] > 0
  model_bytes = sum(x.size * 4 for x in jax.tree.leaves(sim.state.params))  # float32 parameters
  extra = 0 if method == "fedbuff" else 4 * sim.config.fedpsa.sketch_dim  # FedPSA: the float32 sketch
  assert summary["client_updates"] > 0
  assert summary["bytes_uploaded"] == summary["client_updates"] * summary["upload_bytes_per_update"]
  assert summary["upload_bytes_per_update"] == model_bytes + extra
  # Downloads: one model per dispatch, and every received update was dispatched (some still in flight).
  assert summary["bytes_downloaded"] % model_bytes == 0
  assert summary["bytes_downloaded"] // model_bytes >= summary["client_updates"]
  assert summary["server_compute_seconds"] > 0 and summary["client_compute_seconds"] > 0


@pytest.mark.slow
def test_time_to_target_is_the_first_evaluation_reaching_it():
  # (Flax's init: the linear model passes 0.5 within these 0.01 days, PyTorch's init not yet.)
  sim = runner.Simulation(small_config("fedbuff", days=0.01, eval__target_accuracy=0.5, model__init="flax"))
  summary = sim.run()
  first = next(r for r in sim.history if r["test_accuracy"] >= 0.5)
  assert all(r["test_accuracy"] < 0.5 for r in sim.history if r["time"] < first["time"])
  assert summary["day_to_target"] == first["day"] and summary["round_to_target"] == first["round"]
  assert summary["client_updates_to_target"] == first["client_updates"] > 0
  assert 0 < summary["bytes_uploaded_to_target"] <= summary["bytes_uploaded"]
  sim = runner.Simulation(small_config("fedbuff", days=0.002, eval__target_accuracy=0.999))
  assert sim.run()["day_to_target"] is None


@pytest.mark.parametrize("batch_size", [10, 37, 1000])
def test_evaluation_equals_a_per_sample_reference(batch_size):
  """The evaluator (equal batches, the last padded and masked) gives the accuracy and mean cross-entropy of
  a per-sample NumPy reference on 37 test rows, whatever the batch (10: 3 padded rows; 37: one batch; 1000:
  capped at the set)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(37, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=37).astype(np.int32)
  params = {"w": rng.normal(size=(5, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
  apply_fn = lambda p, xb: xb @ p["w"] + p["b"]
  logits = x.astype(np.float64) @ params["w"] + params["b"]
  log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1, keepdims=True)) \
      - logits.max(1, keepdims=True)
  ref_accuracy = float(np.mean(np.argmax(logits, 1) == y))
  ref_loss = float(-np.mean(log_probs[np.arange(37), y]))
  evaluate = metrics.make_evaluator(apply_fn, jax.numpy.asarray(x), jax.numpy.asarray(y), batch_size)
  result = evaluate(jax.tree.map(jax.numpy.asarray, params))
  assert result["test_accuracy"] == pytest.approx(ref_accuracy, abs=1e-12)
  assert result["test_loss"] == pytest.approx(ref_loss, rel=1e-5)


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


@pytest.mark.slow
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


# The client side's programs: local training (loop executor: rolled for a model without convolutions, else
# unrolled) and the payloads computed beside it (FedPAC's statistics, AiFed's layer masks).
_CLIENT = ("jit(_run_job)", "jit(_run_batches)", "jit(client_statistics)", "jit(almu_payload)")


def _client_compiles_of_runs(configs) -> tuple[list[int], list[int]]:
  """(the client programs (`_CLIENT`) each run of `configs` compiled, each run's largest client), the runs built
  one after the other in this process (a run's compile counter counts the whole process's compiles)."""
  counts, largest = [], []
  for c in configs:
    sim = runner.Simulation(c)
    sim.run_until(c.sim.virtual_days)
    assert sim.loop.client_updates > 0
    counts.append(sum(sim.compiles.by_function[name] for name in _CLIENT))
    largest.append(int(np.max(sim.fed.client_sizes)))
    sim.close()
  return counts, largest


# Batch sizes no other test uses: the first run of each test below compiles its client programs in this process
# whatever ran before it (where jax.clear_caches() would make every later test of this worker trace again). At
# most 8, so that every client's partial batch has B rows (`LocalTrainer.epoch_plan`): the programs a run needs
# do not depend on which clients its few updates happen to train.
_OWN_BATCH, _OTHER_OWN_BATCH = {"local__batch_size": 7}, {"local__batch_size": 6}


@pytest.mark.slow  # (two short runs each, 2-4 s)
@pytest.mark.parametrize("method,model", [("fedbuff", "linear"), ("fedasync", "linear"), ("fedpac", "tiny_mlp"),
                                          ("aifed", "tiny_mlp")])
def test_a_second_run_in_a_process_compiles_no_local_training_again(method, model):
  """Runs of one model and local setup build equal local trainers (one model instance per kind; FedAsync's
  proximal term and FedPAC's loss are values, not closures) and share the compiled payloads (module-level jits
  with static settings), so a process compiles a client's work once however many runs it builds: a sweep's
  members, a notebook's runs."""
  counts, _ = _client_compiles_of_runs([small_config(method, model=model, days=0.006, **_OWN_BATCH)] * 2)
  assert counts[0] > 0 and counts[1] == 0, counts


@pytest.mark.slow
def test_runs_whose_largest_client_differs_share_local_training():
  """Local training reads the clients' rows padded to a power-of-two width (`local.training_width`), so another
  partition (another α here: a sweep's members) whose largest client differs compiles no client update again."""
  configs = [small_config("fedbuff", days=0.006, partition__alpha=alpha, **_OTHER_OWN_BATCH) for alpha in (1.0, 0.5)]
  counts, largest = _client_compiles_of_runs(configs)
  assert largest[0] != largest[1] and local.training_width(largest[0]) == local.training_width(largest[1]), largest
  assert counts[0] > 0 and counts[1] == 0, counts
