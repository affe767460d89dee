"""Client execution backends: batched results equal per-job results; runs do not depend on the backend."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, models
from fedpsa_jax.models import max_pool_2x2
from fedpsa_jax.sim import executor as executor_lib
from fedpsa_jax.sim import runner
from fedpsa_jax.sim.scheduler import Dispatch
from fedpsa_jax.config import set_fields
from helpers import ROOT, small_config
from numerics import assert_close, f32_tolerance

TIMING = set(runner.PROCESS_FIELDS)


def test_vmap_width_is_the_request_or_the_in_flight_count_rounded_up():
  assert [executor_lib.vmap_width(0, c) for c in (1, 2, 3, 5, 8, 10, 17)] == [1, 2, 4, 8, 8, 16, 32]
  assert executor_lib.vmap_width(6, 10) == 6  # a request wins
  assert executor_lib.vmap_width(5, 10, devices=2) == 6 and executor_lib.vmap_width(0, 10, devices=3) == 18


def _jobs(sim, count, seed=0):
  """`count` jobs on clients of different sizes, each from its own parameters and lr."""
  rng = np.random.default_rng(seed)
  clients = rng.choice(sim.fed.num_clients, size=count, replace=False)
  base = sim.strategy.eval_models(sim.state).params
  jobs = []
  for job_id, client in enumerate(clients):
    noise = jax.tree.map(lambda x: 0.01 * job_id * jnp.ones_like(x), base)
    params = jax.tree.map(jnp.add, base, noise)
    jobs.append(executor_lib.Job(Dispatch(job_id, int(client), 0, 1), params, 0.05 / (1 + job_id), 0,
                                 sim.strategy.dispatch(sim.state, int(client))[2]))
  return jobs


def _results(sim, execution, jobs, width=4):
  ex = executor_lib.make_executor(execution, sim.executor.trainer, sim.fed, sim.strategy, sim.executor.clients_key,
                                  width=width)
  for job in jobs:
    ex.submit(job)
  return {job.dispatch.job_id: ex.result(job.dispatch.job_id) for job in jobs}, ex.stats


@pytest.mark.slow
def test_a_vmapped_job_gives_the_same_bits_in_any_company():
  """Every vmapped call has one width, so a job's result is the same, bit for bit, whichever pending jobs
  share its call (what a resumed run relies on: it recomputes its in-flight jobs in other company). Checked
  on jobs computed in three companies: all 7 pending, 3 of them, and each alone (padded to the width)."""
  sim = runner.Simulation(small_config("fedpsa", partition__method="dirichlet", partition__alpha=0.1,
                                       local__batch_size=32))
  jobs = _jobs(sim, 7)
  together, stats = _results(sim, "vmap", jobs)
  assert stats.batches < 7 and stats.steps_run % 4 == 0  # shared calls, each 4 wide
  some, _ = _results(sim, "vmap", [jobs[5], jobs[0], jobs[3]])
  for job in jobs:
    alone, _ = _results(sim, "vmap", [job])
    bits = lambda result: [np.asarray(x) for x in jax.tree.leaves(result)]
    for got in [alone[job.dispatch.job_id]] + ([some[job.dispatch.job_id]] if job.dispatch.job_id in some else []):
      assert all(np.array_equal(a, b) for a, b in zip(bits(got), bits(together[job.dispatch.job_id])))


# FedPAC exercises aux, a local loss and a data-dependent payload; FedPSA's sketch payload is compared in the
# two-device test below.
@pytest.mark.slow
@pytest.mark.parametrize("method,model", [("fedpac", "tiny_mlp")])
def test_batched_results_equal_per_job_results(method, model):
  """Whatever the batch composition (7 jobs of mixed step counts: buckets and batches of 4, 2, 1), each
  job's Δ and payload equal those of the job computed alone."""
  sim = runner.Simulation(small_config(method, model=model, partition__method="dirichlet", partition__alpha=0.1,
                                          local__batch_size=32))
  jobs = _jobs(sim, 7)
  steps = {sim.executor.steps_of(j) for j in jobs}
  assert len(steps) > 1  # the buckets and masked steps are exercised
  alone, loop_stats = _results(sim, "loop", jobs)
  batched, stats = _results(sim, "vmap", jobs)
  assert loop_stats.padding_waste == 0 and stats.jobs == 7 and stats.batches < 7
  assert stats.steps_needed == loop_stats.steps_needed and stats.steps_run >= stats.steps_needed
  # Batched and single programs sum in other orders. Compared: the trained parameters (start + Δ: Δ alone
  # is a small difference of rounded parameters) and the payload, to the rounding of `max(steps)` SGD
  # steps whose gradient elements sum a batch of 32 times the MLP's fan-in of 784 (28·28 pixels).
  rel = f32_tolerance(32 * 28 * 28, depth=max(steps))
  trained = lambda job_id, result: (jax.tree.map(jnp.add, jobs[job_id].params_start, result[0]), result[1])
  for job_id, (delta, payload) in alone.items():
    assert_close(trained(job_id, batched[job_id]), trained(job_id, (delta, payload)), rel)
    assert float(sum(jnp.sum(jnp.abs(d)) for d in jax.tree.leaves(delta))) > 0  # every job really trained
  # A batch in another order and another grouping gives the same results.
  regrouped, _ = _results(sim, "vmap", jobs[::-1][:3])
  for job_id, result in regrouped.items():
    assert_close(trained(job_id, result), trained(job_id, alone[job_id]), rel)


SHARDED_SCRIPT = """
import json, sys
sys.path[:0] = [{tests!r}, {tests!r} + "/sim"]
import jax, numpy as np
from test_executor import TRAINING_TOL, _checksums, _jobs, _results
from fedpsa_jax.sim import runner
from fedpsa_jax.config import set_fields
from helpers import small_config
from numerics import assert_close
sim = runner.Simulation(small_config("fedpsa", partition__method="dirichlet", partition__alpha=0.1,
                                          local__batch_size=32))
jobs = _jobs(sim, 5)
alone, _ = _results(sim, "loop", jobs)
sharded, stats = _results(sim, "sharded", jobs)
for j in alone:
  assert_close(sharded[j], alone[j], TRAINING_TOL)
devices = {{d.id for r in (alone, sharded) for j in r for x in jax.tree.leaves(r[j]) for d in x.devices()}}
print(json.dumps({{"devices": jax.local_device_count(), "jobs": stats.jobs,
                  "waste": stats.padding_waste, "result_devices": sorted(devices), "loop": _checksums(alone)}}))
"""


def _checksums(results):
  return [[float(np.sum(np.abs(np.asarray(x)))) for x in jax.tree.leaves(results[j])] for j in sorted(results)]


# Client results of one device against several: XLA's thread pool splits the reductions of a linear model's
# SGD step (batch 32 × 784 inputs) otherwise; a checksum (Σ|x| of a leaf) averages those errors.
TRAINING_TOL = f32_tolerance(32 * 28 * 28)


def _forced_host_devices(count: int) -> dict[str, str]:
  """The environment of a subprocess with `count` host devices, keeping the caller's other XLA flags (an
  instruction-set ceiling set for the suite must hold on both sides of a comparison)."""
  flags = os.environ.get("XLA_FLAGS", "")
  return {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={count}".strip(),
          "JAX_PLATFORMS": "cpu"}


@pytest.mark.slow
def test_two_host_devices_give_the_results_of_one():
  """Two forced host devices: `sharded` splits the client axis over both, `loop` sends jobs round-robin
  to both; the results equal those of one device, and come back to the device of the server state."""
  env = _forced_host_devices(2)
  out = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT.format(tests=os.path.join(ROOT, "tests"))],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  assert report["devices"] == 2 and report["jobs"] == 5
  assert report["waste"] > 0  # 5 jobs over 2 devices: at least one inert padding job ran
  assert report["result_devices"] == [0]  # results come back to the device of the server state
  sim = runner.Simulation(small_config("fedpsa", partition__method="dirichlet", partition__alpha=0.1,
                                       local__batch_size=32))
  one_device, _ = _results(sim, "loop", _jobs(sim, 5))
  assert_close(report["loop"], _checksums(one_device), TRAINING_TOL)


def test_loop_gives_each_job_to_the_client_device_given_the_fewest_jobs(monkeypatch):
  """The loop executor balances its client devices by what it sees, the jobs it gave each: a job goes to the
  device given the fewest so far (ties: the first), whatever the clients' sizes. A payload's work (FedPSA's
  sketch, on the server's device) is not counted: a result changes nothing. Two stand-in devices here, one
  of them with two jobs already; the placement never changes a job's bits
  (`test_two_host_devices_give_the_results_of_one`)."""
  sim = runner.Simulation(small_config("fedpsa", partition__method="dirichlet", partition__alpha=0.1,
                                       local__batch_size=32))
  jobs = _jobs(sim, 6)
  assert len({int(sim.fed.client_sizes[j.dispatch.client]) for j in jobs}) > 2  # (clients of different sizes)
  ex = executor_lib.make_executor("loop", sim.executor.trainer, sim.fed, sim.strategy, sim.executor.clients_key)
  placed = []

  def on_device(job, device):  # (where it would train; its training itself is not the point here)
    placed.append(device)
    return job.params_start
  monkeypatch.setattr(ex, "_loop_one", on_device)
  ex.devices, ex.device_jobs = [ex.home, "other"], {ex.home: 2, "other": 0}
  for job in jobs:
    ex.submit(job)
  assert placed == ["other", "other", ex.home, "other", ex.home, "other"]
  assert ex.device_jobs == {ex.home: 4, "other": 4}
  for job in jobs:
    ex.result(job.dispatch.job_id)  # (the payloads run: FedPSA's sketch on the server's device)
  assert ex.device_jobs == {ex.home: 4, "other": 4}


def _metrics(path):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in io.read_jsonl(path)]


@pytest.mark.slow  # a whole run per backend
def test_run_metrics_do_not_depend_on_the_backend(tmp_path):
  runs = {}
  for execution in ("loop", "vmap", "vmap"):
    name = f"{execution}{len([k for k in runs if k.startswith(execution)])}"
    config = small_config("fedpsa", days=0.015, partition__alpha=0.3, runtime__execution=execution)
    sim = runner.Simulation(config, str(tmp_path / name))
    summary = sim.run()
    assert summary["execution"] == execution
    runs[name] = _metrics(str(tmp_path / name / "metrics.jsonl"))
  assert runs["vmap0"] == runs["vmap1"]  # same seed, same backend: identical
  loop, vmap = runs["loop0"], runs["vmap0"]
  assert [r["client_updates"] for r in loop] == [r["client_updates"] for r in vmap]
  # The backends round differently, and FedPSA's weights feed those differences back through every round:
  # the runs agree to one test image in accuracy and to 0.1% in loss, not to the bit.
  one_image = 1.0 / sim.fed.y_test.shape[0]
  for a, b in zip(loop, vmap):
    assert abs(a["test_accuracy"] - b["test_accuracy"]) <= one_image + 1e-9
    assert abs(a["test_loss"] - b["test_loss"]) <= 1e-3 * abs(b["test_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedbuff", "fedpsa"])
def test_nothing_compiles_inside_the_loop_once_warm(method):
  """Equal-size clients (iid): once every code path has run (FedPSA: its queue of L_q = 50 κ filled,
  so the thermometer is on), the next ~100 client updates compile nothing (no jit cache rebuilt per event)."""
  # A batch size no other test uses, one per method (and at most 8: every partial batch has B rows), so that
  # this run compiles its client update itself, whatever this process ran before (jax.clear_caches() would
  # make every later test of this worker trace again).
  sim = runner.Simulation(small_config(method, days=0.05, partition__method="iid", runtime__execution="loop",
                                       local__batch_size={"fedbuff": 3, "fedpsa": 4}[method]))
  sim.run_until(0.02)
  warm, updates = sim.compiles.count, sim.loop.client_updates
  assert warm > 0 and updates > 50
  sim.run_until(0.05)
  assert sim.loop.client_updates - updates > 90
  assert sim.compiles.count == warm
  assert sim.finish()["compiles"] == warm


@pytest.mark.slow
def test_max_pool_2x2_equals_flax_max_pool():
  x = jax.random.normal(jax.random.key(0), (3, 8, 6, 4))
  np.testing.assert_array_equal(max_pool_2x2(x), nn.max_pool(x, (2, 2), strides=(2, 2)))
  grad = jax.grad(lambda x: jnp.sum(max_pool_2x2(x) ** 2))(x)
  reference = jax.grad(lambda x: jnp.sum(nn.max_pool(x, (2, 2), strides=(2, 2)) ** 2))(x)
  np.testing.assert_allclose(grad, reference, rtol=1e-6)  # no ties in continuous data
  odd = jax.random.normal(jax.random.key(1), (1, 5, 5, 2))
  np.testing.assert_array_equal(max_pool_2x2(odd), nn.max_pool(odd, (2, 2), strides=(2, 2)))


def test_max_pool_2x2_gradient_goes_to_the_first_maximum_of_a_tie():
  """Ties (common: background windows hold equal values) route the whole gradient to the first maximum,
  as flax's nn.max_pool (select-and-scatter) and PyTorch's max_pool2d do; a split would also pass the
  previous test."""
  x = jnp.round(jax.random.normal(jax.random.key(2), (4, 8, 8, 3)))  # integers: many ties per window
  g = jax.random.normal(jax.random.key(3), (4, 4, 4, 3))
  grad = jax.vjp(max_pool_2x2, x)[1](g)[0]
  reference = jax.vjp(lambda x: nn.max_pool(x, (2, 2), strides=(2, 2)), x)[1](g)[0]
  np.testing.assert_array_equal(grad, reference)
  windows = x.reshape(4, 4, 2, 4, 2, 3)
  assert int(jnp.sum(jnp.sum(windows == windows.max(axis=(2, 4), keepdims=True), axis=(2, 4)) > 1)) > 20
  # forward mode (the rule is a custom JVP) gives the same directional derivative as reverse mode
  t = jax.random.normal(jax.random.key(4), x.shape)
  _, y_dot = jax.jvp(max_pool_2x2, (x,), (t,))
  np.testing.assert_allclose(jnp.vdot(y_dot, g), jnp.vdot(t, grad), rtol=1e-5)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])  # the MNIST CNN's convs and the CIFAR CNN's
@pytest.mark.parametrize("batch", [5, 19, 64])
def test_batch_chunked_conv_equals_the_plain_convolution(batch, padding):
  """Values, input and kernel gradients, forward mode and vmap equal lax.conv_general_dilated's (19: a last
  chunk of 3 images; 5: a single chunk)."""
  dn = ("NHWC", "HWIO", "NHWC")
  plain = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=dn)
  chunked = lambda x, w: models.batch_chunked_conv(x, w, (1, 1), padding, dimension_numbers=dn)
  kx, kw, kg, kt = jax.random.split(jax.random.key(batch), 4)
  x, w = jax.random.normal(kx, (batch, 10, 10, 3)), jax.random.normal(kw, (5, 5, 3, 4))
  g = jax.random.normal(kg, plain(x, w).shape)  # 10x10 (SAME) or 6x6 (VALID) outputs
  # Each output sums 5·5·3 products; an input-gradient element 5·5·4; a kernel-gradient element one
  # product per image and output pixel, batch·h·w of them (the longest reduction, and its elements cancel).
  forward, input_grad, kernel_grad = (f32_tolerance(5 * 5 * 3), f32_tolerance(5 * 5 * 4),
                                      f32_tolerance(g.shape[0] * g.shape[1] * g.shape[2]))
  assert_close(jax.jit(chunked)(x, w), plain(x, w), forward)
  grads = jax.jit(lambda x, w, g: jax.vjp(chunked, x, w)[1](g))(x, w, g)
  want = jax.vjp(plain, x, w)[1](g)
  assert_close(grads[0], want[0], input_grad)
  assert_close(grads[1], want[1], kernel_grad)
  # Forward mode: the tangent of each output sums the tangent conv of x and of w.
  tangents = (jax.random.normal(kt, x.shape), jnp.ones_like(w))
  assert_close(jax.jvp(chunked, (x, w), tangents)[1], jax.jvp(plain, (x, w), tangents)[1], 2 * forward)
  stacked = jnp.stack([w, 2 * w])
  assert_close(jax.vmap(chunked, in_axes=(None, 0))(x, stacked), jax.vmap(plain, in_axes=(None, 0))(x, stacked),
               forward)


def test_batch_chunked_conv_computes_the_kernel_gradient_per_chunk_on_cpu():
  """The CPU program of the kernel gradient holds one convolution per chunk of 8 images (the speed-up)
  where the plain convolution's holds one; the forward alone stays one convolution. On another backend
  (a GPU) the kernel gradient is the plain convolution."""
  dn = ("NHWC", "HWIO", "NHWC")
  conv = lambda x, w: models.batch_chunked_conv(x, w, (1, 1), "SAME", dimension_numbers=dn)
  x, w = jnp.ones((64, 14, 14, 32)), jnp.ones((5, 5, 32, 64))
  count = lambda f: f.lower(x, w).as_text().count("stablehlo.convolution")
  assert count(jax.jit(conv)) == 1
  kernel_grad = lambda conv: jax.jit(jax.grad(lambda x, w: jnp.sum(conv(x, w)), argnums=1))
  plain = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
  assert count(kernel_grad(plain)) == 1
  assert count(kernel_grad(conv)) == (64 // models.CPU_CONV_CHUNK if jax.default_backend() == "cpu" else 1)


def test_loop_issues_each_job_when_it_is_dispatched():
  """loop: training is issued at submit (the host does not wait for it), so jobs run while the host
  goes on; the result is the job's alone."""
  sim = runner.Simulation(small_config("fedbuff", partition__method="dirichlet", partition__alpha=0.1,
                                       local__batch_size=32))
  jobs = _jobs(sim, 3)
  ex = executor_lib.make_executor("loop", sim.executor.trainer, sim.fed, sim.strategy, sim.executor.clients_key)
  for job in jobs:
    ex.submit(job)
  assert set(ex.issued) == {0, 1, 2} and ex.stats.jobs == 3 and isinstance(ex, executor_lib.LoopExecutor)
  assert ex.device_jobs == {ex.devices[0]: 3}
  alone, _ = _results(sim, "loop", jobs[1:2])
  for a, b in zip(jax.tree.leaves(ex.result(1)), jax.tree.leaves(alone[1])):
    np.testing.assert_array_equal(a, b)


def _arriving(jobs, arrival_times):
  """`jobs` re-dispatched to arrive at `arrival_times` (dispatched at 0, in job id order)."""
  return [executor_lib.Job(Dispatch(j.dispatch.job_id, j.dispatch.client, 0, t), j.params_start, j.lr,
                           j.dispatch_round, j.aux) for j, t in zip(jobs, arrival_times)]


@pytest.mark.slow
def test_loop_issues_jobs_ahead_in_arrival_order_with_the_results_of_issuing_at_dispatch():
  """loop with `jobs_ahead=2` (one device here): submitting issues nothing; a result issues its job, then
  the next to arrive (arrival time, then client, then job id: the scheduler's order) while fewer than 2 are
  issued; a job asked for before its turn is issued then. Every result is the bits of issuing each job at
  its dispatch (`jobs_ahead=0`)."""
  sim = runner.Simulation(small_config("fedbuff", partition__method="dirichlet", partition__alpha=0.1,
                                       local__batch_size=32))
  jobs = _arriving(_jobs(sim, 6), [40, 10, 30, 10, 20, 50])
  order = [j.dispatch.job_id for j in sorted(jobs, key=lambda j: (j.dispatch.arrival_time, j.dispatch.client,
                                                                  j.dispatch.job_id))]
  make = lambda ahead: executor_lib.make_executor("loop", sim.executor.trainer, sim.fed, sim.strategy,
                                                  sim.executor.clients_key, jobs_ahead=ahead)
  ex, at_dispatch = make(2), make(0)
  assert len(ex.devices) == 1 and ex.max_issued == 2
  for job in jobs:
    ex.submit(job)
    at_dispatch.submit(job)
  assert set(at_dispatch.issued) == set(range(6)) and not ex.issued and ex.stats.jobs == 0
  results = {order[0]: ex.result(order[0])}
  assert set(ex.issued) == {order[1], order[2]} and ex.stats.jobs == 3
  results[order[4]] = ex.result(order[4])  # out of turn: issued at once, beside the two issued ahead
  assert set(ex.issued) == {order[1], order[2]} and set(ex.waiting) == {order[3], order[5]}
  results[order[1]] = ex.result(order[1])
  assert set(ex.issued) == {order[2], order[3]} and set(ex.waiting) == {order[5]}
  for job_id in (order[2], order[3], order[5]):
    results[job_id] = ex.result(job_id)
  assert not ex.issued and not ex.waiting and not ex.arrival_order and ex.stats.jobs == 6
  for job_id, result in results.items():
    for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(at_dispatch.result(job_id))):
      np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_jobs_ahead_is_a_validated_field_that_never_changes_a_run(tmp_path):
  """A whole run with the default `runtime.jobs_ahead` (2), with 1, and with every job issued at its dispatch
  (0) writes the same metrics, bit for bit; and the field may change when a run resumes. A negative value
  is refused, naming the field."""
  runs = {}
  for ahead in (0, 1, 2):
    config = small_config("fedbuff", days=0.015, runtime__execution="loop", runtime__jobs_ahead=ahead)
    runner.Simulation(config, str(tmp_path / str(ahead))).run()
    runs[ahead] = _metrics(str(tmp_path / str(ahead) / "metrics.jsonl"))
  assert len(runs[0]) > 3 and runs[0] == runs[1] == runs[2]
  assert small_config("fedbuff").runtime.jobs_ahead == 2
  with pytest.raises(config_lib.ConfigError, match=r"runtime\.jobs_ahead.*0: each client update at its dispatch"):
    config_lib.validate(small_config("fedbuff", runtime__jobs_ahead=-1))


JOBS_AHEAD_SCRIPT = """
import json, sys
sys.path[:0] = [{tests!r}, {tests!r} + "/sim"]
import jax
from fedpsa_jax.sim import executor as executor_lib, runner
from helpers import small_config
issue, placed = executor_lib.LoopExecutor._issue, {{}}

def recording_issue(self, job):  # (where each job trained)
  issue(self, job)
  placed[job.dispatch.job_id] = self.issued[job.dispatch.job_id][2].id

executor_lib.LoopExecutor._issue = recording_issue
runs = {{}}
for ahead in (0, 2):
  placed = {{}}
  sim = runner.Simulation(small_config("fedpsa", days=0.015, runtime__execution="loop", runtime__jobs_ahead=ahead))
  sim.run_until(0.015)
  runs[ahead] = {{"history": [{{k: v for k, v in r.items() if k not in runner.PROCESS_FIELDS}} for r in sim.history],
                 "placed": placed}}
print(json.dumps({{"devices": jax.local_device_count(), "runs": runs}}))
"""


@pytest.mark.slow
def test_jobs_ahead_never_changes_a_run_on_two_host_devices():
  """With two host devices (the CPU default), issuing jobs ahead in arrival order puts them on other
  devices than issuing each at its dispatch, and the run is the same bit for bit."""
  out = subprocess.run([sys.executable, "-c", JOBS_AHEAD_SCRIPT.format(tests=os.path.join(ROOT, "tests"))],
                       capture_output=True, text=True, env=_forced_host_devices(2), cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  at_dispatch, ahead = report["runs"]["0"], report["runs"]["2"]
  assert report["devices"] == 2 and len(ahead["history"]) > 3
  both = set(ahead["placed"]) & set(at_dispatch["placed"])
  assert set(ahead["placed"].values()) == {0, 1} and len(both) > 20
  assert any(ahead["placed"][j] != at_dispatch["placed"][j] for j in both)  # other devices for some jobs
  assert ahead["history"] == at_dispatch["history"]


THREE_DEVICES_SCRIPT = """
import json, sys
sys.path[:0] = [{tests!r}, {tests!r} + "/sim"]
import jax, numpy as np
from test_executor import _checksums, _jobs
from fedpsa_jax.sim import executor as executor_lib, runner
from fedpsa_jax.config import set_fields
from helpers import small_config
sim = runner.Simulation(small_config("fedpsa", partition__method="dirichlet", partition__alpha=0.1,
                                     local__batch_size=32))
jobs = _jobs(sim, 6)
ex = executor_lib.make_executor("loop", sim.executor.trainer, sim.fed, sim.strategy, sim.executor.clients_key)
for job in jobs:
  ex.submit(job)
trained_on = {{j: sorted(d.id for d in jax.tree.leaves(end)[0].devices()) for j, (_, end, _) in ex.issued.items()}}
results = {{j.dispatch.job_id: ex.result(j.dispatch.job_id) for j in jobs}}
print(json.dumps({{"home": ex.home.id, "devices": [d.id for d in ex.devices], "trained_on": trained_on,
                  "jobs_per_device": [ex.device_jobs[d] for d in ex.devices],
                  "result_devices": sorted({{d.id for r in results.values() for x in jax.tree.leaves(r)
                                             for d in x.devices()}}), "loop": _checksums(results),
                  "data": [[x.unsafe_buffer_pointer() for x in ex.device_data[d]] for d in ex.devices],
                  "home_data": [x.unsafe_buffer_pointer() for x in (sim.fed.x_train, sim.fed.y_train,
                                                                    ex.train_table)]}}))
sim.run_until(0.02)
trainer = sim.executor.trainer
# The local training programs the clients' sizes call for: rolled, one per partial-batch size; unrolled, one
# per (batches per call, rows per batch).
programs = ({{trainer.epoch_plan(int(n))[1] for n in sim.fed.client_sizes}} if trainer.loop == "rolled" else
            {{shape[1:] for n in sim.fed.client_sizes for shape in trainer.epoch_calls(int(n))}})
print(json.dumps({{"compiles": dict(sim.compiles.by_function), "programs": len(programs), "loop": trainer.loop}}))
"""


@pytest.mark.slow
def test_three_host_devices_keep_the_server_device_free_and_give_the_results_of_one():
  """Three forced host devices: loop trains on the two that are not the server's, balanced by job count, and
  the results (brought back to the server's device) equal one device's."""
  env = _forced_host_devices(3)
  out = subprocess.run([sys.executable, "-c", THREE_DEVICES_SCRIPT.format(tests=os.path.join(ROOT, "tests"))],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  report, compiles = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
  assert report["home"] == 0 and report["devices"] == [1, 2]
  assert {d for ids in report["trained_on"].values() for d in ids} == {1, 2}
  assert report["jobs_per_device"] == [3, 3]  # the fewest jobs first: 6 jobs, 3 each
  assert report["result_devices"] == [0]
  # The client devices train on the server's data in place: host devices share one memory, no copies.
  assert report["data"] == [report["home_data"]] * 2
  sim = runner.Simulation(small_config("fedpsa", partition__method="dirichlet", partition__alpha=0.1,
                                       local__batch_size=32))
  one_device, _ = _results(sim, "loop", _jobs(sim, 6))
  assert_close(report["loop"], _checksums(one_device), TRAINING_TOL)
  # The run compiled each server function once (its first state is committed to the server's device like
  # every later one) and each local training program at most once per client device.
  counts = compiles["compiles"]
  for name in ("sketch_of", "_aggregate", "batch_stats"):
    assert counts[f"jit({name})"] == 1, (name, counts)
  training = "jit(_run_job)" if compiles["loop"] == "rolled" else "jit(_run_batches)"
  assert 1 <= counts[training] <= 2 * compiles["programs"], counts


@pytest.mark.slow
@pytest.mark.parametrize("jobs_ahead", [0, 2])
def test_loop_counts_each_second_of_client_compute_once(jobs_ahead):
  """train_seconds adds up the executor's timed spans: none may run inside another (a nested span was
  counted twice: the wait for the server's device inside `result` inflated 8.5 s of training to 12 s).
  One span per result, and with `jobs_ahead=0` one more per submit (its training is issued there)."""
  sim = runner.Simulation(small_config("fedbuff", days=0.01, runtime__execution="loop",
                                       runtime__jobs_ahead=jobs_ahead))
  timed, depth = sim.executor._timed, {"now": 0, "max": 0, "spans": 0}

  @contextlib.contextmanager
  def tracked():
    depth["now"] += 1
    depth["max"], depth["spans"] = max(depth["max"], depth["now"]), depth["spans"] + 1
    try:
      with timed():
        yield
    finally:
      depth["now"] -= 1

  sim.executor._timed = tracked
  sim.run()
  assert depth["spans"] >= (2 if jobs_ahead == 0 else 1) * sim.loop.client_updates and depth["max"] == 1


@pytest.mark.slow  # a whole run, cut and resumed, per method
@pytest.mark.parametrize("method", ["fedpsa", "ca2fl"])
def test_a_vmap_run_resumes_bit_for_bit(method, tmp_path):
  """A run killed after a checkpoint and resumed (its in-flight jobs recomputed together, in other calls
  than the first time) writes what the uninterrupted run writes, bit for bit, under vmap too. (With batches
  of varying width both of these runs differed in their metrics.)"""
  from test_checkpoint import outputs, resumable_config

  config = lambda: set_fields(resumable_config(method), {"runtime.execution": "vmap"})
  runner.Simulation(config(), str(tmp_path / "whole")).run()
  first = runner.Simulation(config(), str(tmp_path / "cut"))
  assert first.parts.execution == "vmap"
  first.run_until(0.0135)  # past the checkpoint at 0.01 and the evaluations at 0.0125
  first.close()
  runner.Simulation(config(), str(tmp_path / "cut")).run()
  assert outputs(tmp_path / "cut") == outputs(tmp_path / "whole")


def test_auto_is_the_loop_on_every_backend_and_a_named_backend_is_kept():
  """`auto` stands for `loop`, the fastest measured on a CPU and on a GPU (docs/performance.md); a backend
  named in the config is used as named."""
  assert executor_lib.resolve_execution("auto") == "loop"
  for name in ("loop", "vmap", "sharded"):
    assert executor_lib.resolve_execution(name) == name
