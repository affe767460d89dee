"""The simulator's own cost per client update: event handling, dispatch, server steps, bookkeeping and
evaluation, with a model whose training costs nearly nothing.

    python benchmarks/host_overhead.py [--methods=fedbuff,fedpsa] [--days=0.3] [--warmup_days=0.02]

Each method runs the default job's federation (embedded MNIST, 50 clients, Dirichlet α = 0.1, 10 in
flight) with the linear model, one local epoch and batches of 1,024 rows, so every client update is a
single small SGD step; in a fresh process per method. Printed per method, after the warm-up, compiles
excluded: wall time per update; the bare compute inside it (one jitted SGD step on a 128-row batch, the
size of a client's data, and one client payload, e.g. FedPSA's sketch, each timed alone); and host overhead
per update = wall − bare compute: event handling, dispatch, server steps, bookkeeping and evaluations.
The target is ≤ 0.25 ms per update on a 2-core CPU (docs/performance.md). `--phase_timing` runs with `runtime.phase_timing` on
(the host waits for the devices at every event, to time the phases apart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

flags.DEFINE_list("methods", ["fedbuff", "fedpsa"], "methods to run")
flags.DEFINE_float("days", 0.3, "virtual days per run (~1,000 client updates)")
flags.DEFINE_float("warmup_days", 0.02, "virtual days before the measurement starts")
flags.DEFINE_bool("phase_timing", False, "run with runtime.phase_timing (waits at every event)")
flags.DEFINE_string("child", "", "internal: run one method and print JSON")
FLAGS = flags.FLAGS


def measure(method: str) -> dict:
  import jax
  import optax

  from configs.default import get_config
  from fedpsa_jax.sim import runner

  config = get_config(f"method={method},model=linear")
  config.local.epochs = 1
  config.local.batch_size = 1024  # one step per update: training costs next to nothing
  config.sim.virtual_days = FLAGS.days
  config.runtime.progress = False
  config.runtime.phase_timing = FLAGS.phase_timing
  sim = runner.Simulation(config)
  sim.run_until(FLAGS.warmup_days)
  stats = sim.executor.stats

  def snapshot():
    return time.perf_counter(), sim.loop.client_updates, sim.compiles.seconds

  before = snapshot()
  sim.run_until(FLAGS.days)
  wall, updates, compile_seconds = (b - a for a, b in zip(before, snapshot()))
  wall -= compile_seconds
  apply = sim.model.apply
  x, y = sim.fed.x_train[:128], sim.fed.y_train[:128]

  @jax.jit
  def step(params, x, y):
    grads = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean())(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

  def time_alone(fn, arg, reps=200):
    arg = jax.block_until_ready(fn(arg))
    start = time.perf_counter()
    for _ in range(reps):
      arg = fn(arg)
    jax.block_until_ready(arg)
    return (time.perf_counter() - start) / reps

  params = sim.strategy.eval_models(sim.state).params
  step_seconds = time_alone(lambda p: step(p, x, y), params)
  payload_fn = sim.strategy.client.payload
  payload_seconds = 0.0
  if payload_fn is not None:  # every call on the same params, all waited for
    jax.block_until_ready(payload_fn(params, params, None))
    start = time.perf_counter()
    jax.block_until_ready([payload_fn(params, params, None) for _ in range(200)])
    payload_seconds = (time.perf_counter() - start) / 200
  payload = updates * payload_seconds
  bare = updates * step_seconds + payload
  return {"method": method, "updates": updates, "wall_ms": 1e3 * wall / updates, "bare_ms": 1e3 * bare / updates,
          "step_ms": 1e3 * step_seconds, "payload_ms": 1e3 * payload / updates,
          "host_ms": 1e3 * (wall - bare) / updates}


def main(argv):
  del argv
  if FLAGS.child:
    print(json.dumps(measure(FLAGS.child)))
    return
  print(f"host overhead per client update: linear model, 1 step per update, {FLAGS.days} virtual days "
        f"(after {FLAGS.warmup_days})")
  print(f"{'method':8s} {'updates':>7s} {'wall ms':>8s} {'bare ms':>8s} {'(step)':>7s} {'(payload)':>9s} {'host ms':>8s}")
  for method in FLAGS.methods:
    argv = [sys.executable, os.path.abspath(__file__), f"--child={method}", f"--days={FLAGS.days}",
            f"--warmup_days={FLAGS.warmup_days}"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
      raise RuntimeError(out.stderr[-2000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{r['method']:8s} {r['updates']:7d} {r['wall_ms']:8.3f} {r['bare_ms']:8.3f} {r['step_ms']:7.3f} "
          f"{r['payload_ms']:9.3f} {r['host_ms']:8.3f}", flush=True)


if __name__ == "__main__":
  app.run(main)
