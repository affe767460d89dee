"""Client updates per second of whole simulations, per execution backend, against the bare-steps ideal.

    python benchmarks/throughput.py [--days=0.03] [--warmup_days=0.005] [--models=mnist_cnn,linear]
                                    [--executions=loop,loop@2,loop@3,vmap,sharded@2] [--method=fedpsa]

For each model (the default job: the embedded MNIST, 50 clients, Dirichlet α = 0.1; `--method=fedbuff`
is the job FLGo was measured on) and each backend, one run in a fresh process (no jit cache shared
between rows); figures are taken after `warmup_days`. `name@D` runs with D forced host devices
(`--xla_force_host_platform_device_count=D`, the only way to get several devices on a CPU): `loop@2`
trains clients on both devices, `loop@3` on two while the third serves (see executor.client_devices),
`sharded@2` splits each batch's client axis.

Printed per row: client updates per second (compile time excluded); the ideal: the window's samples
(epochs × each client's n) as bare jitted SGD steps of full batches B, no masks, back to back on every
device that trains clients, all at once, and `of ideal` = rate / ideal rate; cores busy (process CPU
time / wall time: 2.00 is two cores busy all the time); with `--phase_timing` only (it makes
the host wait at every event, so the rate is lower), the share of wall time the host spends outside
waiting for client results (host loop, aggregation, evaluation, and with `loop`, the time training
overlaps with them), and the payloads' (e.g. FedPSA's sketch) part of the wall time;
padding waste (masked steps / steps run); compiles over the whole run (and inside the window); the bare
step's time per device; the final accuracy.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

flags.DEFINE_float("days", 0.03, "virtual days per run")
flags.DEFINE_float("warmup_days", 0.005, "virtual days before the measurement starts")
flags.DEFINE_list("models", ["mnist_cnn", "linear"], "models to run")
flags.DEFINE_list("executions", ["loop", "loop@2", "loop@3", "vmap", "sharded@2"],
                  "execution backends; `name@D` runs with D forced host devices")
flags.DEFINE_string("method", "fedpsa", "the method of the runs")
flags.DEFINE_bool("phase_timing", False, "run with runtime.phase_timing: fills the `outside train` and "
                  "`(payload)` columns, at the cost of a wait for the devices at every event")
flags.DEFINE_string("child", "", "internal: run one (model, execution) and print JSON")
FLAGS = flags.FLAGS


def measure(model: str, execution: str) -> dict:
  import jax
  import optax

  from configs.default import get_config
  from fedpsa_jax.sim import runner

  config = get_config(f"method={FLAGS.method},model={model}")
  config.runtime.execution = execution
  config.sim.virtual_days = FLAGS.days
  config.runtime.progress = False
  config.runtime.phase_timing = FLAGS.phase_timing
  sim = runner.Simulation(config)
  sim.run_until(FLAGS.warmup_days)
  # The window's work is what the executor computed in it (jobs and their steps), not what arrived:
  # with lazy execution, results computed before the window arrive in it. Compile time is taken out.
  stats = sim.executor.stats

  def snapshot():
    return (time.perf_counter(), time.process_time(), stats.jobs, stats.samples_needed, sim.executor.train_seconds,
            stats.payload_seconds, stats.compile_seconds, sim.compiles.seconds, sim.compiles.count)

  before = snapshot()
  summary = sim.finish()
  wall, cpu, updates, samples, train, payload, executor_compile, compile_seconds, compiles = (
      b - a for a, b in zip(before, snapshot()))
  cores_busy = cpu / wall  # (compiles included on both sides)
  wall -= compile_seconds
  train -= payload + executor_compile

  # The ideal: the window's samples as bare jitted SGD steps (full batches of B, plain mean loss, no
  # masks), back to back on each device that trains clients, all devices at once.
  b = config.local.batch_size
  apply = sim.model.apply

  @jax.jit
  def step(params, x, y):
    grads = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean())(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

  ex = sim.executor
  mesh = getattr(ex, "mesh", None)  # (sharded: its devices; loop: its client devices; vmap: the server's)
  devices = list(mesh.devices.flat) if mesh is not None else getattr(ex, "devices", [ex.home])
  chains = [jax.device_put((sim.strategy.eval_models(sim.state).params, sim.fed.x_train[:b], sim.fed.y_train[:b]), d)
            for d in devices]
  params = jax.block_until_ready([step(*chain) for chain in chains])
  # The median of 5 timings of `reps` steps: a single timing of 20 linear steps (~2 ms) moved the ideal by
  # up to ±25% from one run to the next on a shared machine.
  reps = max(20, int(0.2 / measure_one(step, params, chains, 5)))
  step_seconds = statistics.median(measure_one(step, params, chains, reps) for _ in range(5))
  return {"model": model, "execution": summary["execution"], "devices": jax.local_device_count(),
          "train_devices": len(devices), "updates": updates, "updates_per_s": updates / wall,
          "cores_busy": cores_busy,
          "outside_training": 1 - train / wall if FLAGS.phase_timing else None,
          "payload_share": payload / wall if FLAGS.phase_timing else None,
          "window_compiles": compiles, "padding_waste": summary["padding_waste"], "compiles": summary["compiles"],
          "step_ms": 1e3 * step_seconds, "ideal_updates_per_s": updates / (samples / b * step_seconds),
          "final_accuracy": summary["final_test_accuracy"]}


def measure_one(step, params, chains, reps: int) -> float:
  """Seconds per step of `reps` bare steps back to back on every device at once (all devices' steps overlap)."""
  import jax

  start = time.perf_counter()
  for _ in range(reps):
    params = [step(p, x, y) for p, (_, x, y) in zip(params, chains)]
  jax.block_until_ready(params)
  return (time.perf_counter() - start) / (reps * len(chains))


def run_child(model: str, execution: str) -> dict:
  env = dict(os.environ)
  execution, _, devices = execution.partition("@")
  if devices:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
  argv = [sys.executable, os.path.abspath(__file__), f"--child={model}:{execution}", f"--days={FLAGS.days}",
          f"--warmup_days={FLAGS.warmup_days}", f"--method={FLAGS.method}", f"--phase_timing={FLAGS.phase_timing}"]
  out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
  if out.returncode:
    raise RuntimeError(out.stderr[-2000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def _share(value: float | None) -> str:
  return "-" if value is None else f"{value:.1%}"


def main(argv):
  del argv
  if FLAGS.child:
    print(json.dumps(measure(*FLAGS.child.split(":"))))
    return
  header = (f"{'model':10s} {'execution':9s} {'dev':>3s} {'train':>5s} {'upd/s':>6s} {'ideal/s':>7s} {'of ideal':>8s} "
            f"{'cores busy':>10s} {'outside train':>13s} {'(payload)':>9s} {'padding':>7s} {'compiles':>12s} {'step ms':>7s} "
            f"{'final acc':>9s}")
  print(f"{FLAGS.method}, {FLAGS.days} virtual days (measured after {FLAGS.warmup_days})")
  print(header)
  for model in FLAGS.models:
    for execution in FLAGS.executions:
      r = run_child(model, execution)  # a fresh process each: no jit cache shared between rows
      print(f"{r['model']:10s} {r['execution']:9s} {r['devices']:3d} {r['train_devices']:5d} {r['updates_per_s']:6.2f} "
            f"{r['ideal_updates_per_s']:7.2f} {r['updates_per_s'] / r['ideal_updates_per_s']:8.0%} "
            f"{r['cores_busy']:10.2f} {_share(r['outside_training']):>13s} {_share(r['payload_share']):>9s} "
            f"{r['padding_waste']:7.1%} "
            f"{r['compiles']:5d} ({r['window_compiles']:3d} in) {r['step_ms']:7.1f} "
            f"{r['final_accuracy']:9.4f}", flush=True)


if __name__ == "__main__":
  app.run(main)
