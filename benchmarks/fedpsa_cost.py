"""What FedPSA costs beside FedBuff: whole runs side by side, and the pieces of FedPSA's sketch.

    python benchmarks/fedpsa_cost.py [--part=runs,pieces] [--models=mnist_cnn,linear] [--repeats=2]
                                     [--days=0.05] [--warmup_days=0.01] [--piece_repeats=15] [--execution=auto]

`runs`: FedBuff and FedPSA through the same runner with the same seeds (configs/default.py, `model=` each of
`--models`, two forced host devices as `launch.py --host_devices=2` gives), one fresh process per run so that
each has its own peak RSS (`ru_maxrss`) and jit cache; the runs alternate between the methods, repeat after
repeat, so that a drift of the (shared) machine affects both alike. Printed per run: client updates per second
after `--warmup_days`, compile time excluded (as benchmarks/throughput.py counts it), and the process's peak
RSS; then per (model, method) the medians, and FedPSA's ratios to FedBuff.

`pieces` (one process, the default job's model): the sketch's matrix-vector product as the run computes it
(`sensitivity.project` on the run's projection blocks) beside a bare `jax.jit(lambda R, s: R @ s)` of the
same shape on a flat R; the client's whole payload (Eq. 8 sensitivity and sketch, `strategy.client.payload`,
what the executor calls) beside one SGD step at the run's batch size; and one server round of K = buffer_size
arrivals for FedBuff and for FedPSA (`strategy.receive`). Every piece is timed `--piece_repeats` times,
interleaved with the others (one call of each in turn), and the median printed.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

import gpu_backends  # (its flags are defined only when it runs as a script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

flags.DEFINE_list("part", ["runs", "pieces"], "what to measure: runs (whole simulations), pieces (in one process)")
flags.DEFINE_list("models", ["mnist_cnn", "linear"], "models of the runs (configs/default.py:model=...)")
flags.DEFINE_list("methods", ["fedbuff", "fedpsa"], "methods of the runs, alternated; fedpsa+P: FedPSA with "
                  "fedpsa.projection=P (e.g. fedpsa+count_sketch)")
flags.DEFINE_integer("repeats", 2, "runs per (model, method)")
flags.DEFINE_float("days", 0.05, "virtual days per run")
flags.DEFINE_float("warmup_days", 0.01, "virtual days before the measurement starts")
flags.DEFINE_integer("host_devices", 2, "forced host devices per run (launch.py's default)")
flags.DEFINE_string("execution", "auto", "runtime.execution of the runs (loop, vmap, sharded; auto: loop)")
flags.DEFINE_integer("piece_repeats", 15, "timed calls per piece (median)")
flags.DEFINE_string("child", "", "internal: run one model:method and print JSON")
FLAGS = flags.FLAGS


def _config(arg: str):
  from configs.default import get_config

  config = get_config(arg)
  config.runtime.progress = False
  config.runtime.execution = FLAGS.execution
  return config


def measure_run(model: str, method: str) -> dict:
  """One simulation: updates/s after the warm-up (compiles excluded), this process's peak RSS and, where the device
  keeps statistics (a GPU), its peak memory in use."""
  import jax

  from fedpsa_jax.sim import runner

  name, _, projection = method.partition("+")  # "fedpsa+count_sketch": FedPSA with fedpsa.projection set
  config = _config(f"method={name},model={model}")
  if projection:
    config.fedpsa.projection = projection
  config.sim.virtual_days = FLAGS.days
  sim = runner.Simulation(config)
  sim.run_until(FLAGS.warmup_days)
  start, updates, compile_seconds = time.perf_counter(), sim.loop.client_updates, sim.compiles.seconds
  summary = sim.finish()
  wall = time.perf_counter() - start - (sim.compiles.seconds - compile_seconds)
  updates = sim.loop.client_updates - updates
  # ru_maxrss: KiB on Linux. A GPU's own peak is kept apart: there the model lives in device memory, not in RSS.
  peak, source = gpu_backends.peak_memory()
  return {"model": model, "method": method, "updates": updates, "updates_per_s": updates / wall,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "peak_device_mb": peak / 2**20 if source == "device" else None,
          "final_accuracy": summary["final_test_accuracy"], "execution": summary["execution"],
          "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"}


def run_child(model: str, method: str) -> dict:
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={FLAGS.host_devices}").strip()
  argv = [sys.executable, os.path.abspath(__file__), f"--child={model}:{method}", f"--execution={FLAGS.execution}",
          f"--days={FLAGS.days}", f"--warmup_days={FLAGS.warmup_days}"]
  out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def runs() -> None:
  rows = []
  # No JAX here: on a GPU this process would take the memory its children need (JAX preallocates).
  print(f"runs: {FLAGS.days} virtual days each, measured after {FLAGS.warmup_days}; {FLAGS.host_devices} host devices; "
        f"runtime.execution={FLAGS.execution}")
  print(f"{'model':10s} {'method':19s} {'run':>3s} {'upd/s':>7s} {'peak RSS MB':>11s} {'device MB':>9s} "
        f"{'final acc':>9s}")
  for repeat in range(FLAGS.repeats):
    for model in FLAGS.models:
      for method in FLAGS.methods:
        r = run_child(model, method)
        rows.append(r)
        device_mb = "-" if r["peak_device_mb"] is None else f"{r['peak_device_mb']:.0f}"
        print(f"{model:10s} {method:19s} {repeat + 1:3d} {r['updates_per_s']:7.2f} {r['peak_rss_mb']:11.0f} "
              f"{device_mb:>9s} {r['final_accuracy']:9.4f}", flush=True)
  print(f"\nmedians, on {rows[0]['device']}, execution {rows[0]['execution']}")
  for model in FLAGS.models:
    medians = {}
    for method in FLAGS.methods:
      mine = [r for r in rows if r["model"] == model and r["method"] == method]
      medians[method] = (statistics.median(r["updates_per_s"] for r in mine),
                         statistics.median(r["peak_rss_mb"] for r in mine))
      print(f"{model:10s} {method:19s} {medians[method][0]:7.2f} upd/s {medians[method][1]:7.0f} MB")
    for method in [m for m in FLAGS.methods if m.startswith("fedpsa")] if "fedbuff" in medians else []:
      (psa_rate, psa_rss), (buff_rate, buff_rss) = medians[method], medians["fedbuff"]
      print(f"{model:10s} {method} / fedbuff: {psa_rate / buff_rate:.2f}x updates/s, peak RSS "
            f"{psa_rss - buff_rss:+.0f} MB ({psa_rss / buff_rss - 1:+.0%})")


def pieces() -> None:
  import dataclasses

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.flatten_util import ravel_pytree

  from fedpsa_jax import local, seeding, sensitivity, strategies
  from fedpsa_jax.sim import runner

  sim = runner.Simulation(_config("method=fedpsa"))
  strategy, fed, trainer = sim.strategy, sim.fed, sim.executor.trainer
  params = strategy.eval_models(sim.state).params
  k, d = strategy.hparams.sketch_dim, sensitivity.num_params(params)

  # The sketch's product on the sensitivity of the global model, and a bare product of the same shape.
  s = sensitivity.sensitivity(sim.model.apply, params, *strategy.calibration)
  flat_R = sensitivity.projection_matrix(seeding.device_key(sim.config.seed, "fedpsa/projection"), k, d)
  flat_s = ravel_pytree(s)[0]
  bare = jax.jit(lambda R, s: R @ s)

  # The client's payload at a trained model (the global model plus noise), as the executor calls it.
  end = jax.tree.map(lambda p: p + 1e-3 * jax.random.normal(jax.random.key(1), p.shape, p.dtype), params)
  client = int(np.argsort(fed.client_sizes)[len(fed.client_sizes) // 2])
  job = strategies.ClientJob(client, local.ClientData(fed.x_train, fed.y_train, fed.client_indices[client], None,
                                                      np.int32(fed.client_sizes[client])))

  # One SGD step at batch B, as profiling.py times it.
  n, row = int(fed.client_sizes[client]), fed.client_indices[client]
  orders = local.epoch_orders(jax.random.key(0), jnp.int32(n), row.shape[0], trainer.epochs)
  step_state = local.StepState(params=params, anchor=params, lr=jnp.float32(0.01))
  data = local.ClientData(x_all=fed.x_train, y_all=fed.y_train, index_row=row, orders=orders, num_samples=jnp.int32(n))
  sgd_step = jax.jit(lambda state, data: trainer.sgd_step(state, data, jnp.int32(0)).params)

  # One server round of each method: K arrivals received together (K = FedPSA's buffer size).
  K = strategy.hparams.buffer_size
  arrivals = [strategies.Arrival(client=i, num_samples=100, staleness=0, dispatch_round=0, params_start=params,
                                 delta=jax.tree.map(lambda p, i=i: 1e-3 * jax.random.normal(jax.random.key(i), p.shape),
                                                    params), payload=strategy.client.payload(params, end, job))
              for i in range(K)]
  config = _config("method=fedbuff")
  config.fedbuff.buffer_size = K
  fedbuff = strategies.registered()["fedbuff"](config, strategy.ctx)
  buff_state, psa_state = fedbuff.init(params), sim.state
  buff_arrivals = [dataclasses.replace(a, payload=()) for a in arrivals]

  calls = {
      f"bare jit(R @ s), R {k} x {d:,}": lambda: bare(flat_R, flat_s),
      "sketch as the run computes it": lambda: sensitivity.project(strategy.projection, s),
      "client payload (Eq. 8 + sketch)": lambda: strategy.client.payload(params, end, job),
      f"one SGD step (B = {trainer.batch_size})": lambda: sgd_step(step_state, data),
      f"FedBuff server round (K = {K})": lambda: fedbuff.receive(buff_state, buff_arrivals)[0],
      f"FedPSA server round (K = {K})": lambda: strategy.receive(psa_state, arrivals)[0],
  }
  times = {name: [] for name in calls}
  for call in calls.values():  # warm-up: compiles
    jax.block_until_ready(call())
  for _ in range(FLAGS.piece_repeats):
    for name, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      times[name].append(time.perf_counter() - start)
  print(f"\npieces: the default job's model, medians of {FLAGS.piece_repeats} interleaved calls")
  step = statistics.median(times[f"one SGD step (B = {trainer.batch_size})"])
  for name, ts in times.items():
    print(f"{name:40s} {1e3 * statistics.median(ts):8.1f} ms {statistics.median(ts) / step:6.2f} x SGD step")


def main(argv):
  del argv
  if FLAGS.child:
    print(json.dumps(measure_run(*FLAGS.child.split(":"))))
    return
  if "runs" in FLAGS.part:
    runs()
  if "pieces" in FLAGS.part:
    pieces()


if __name__ == "__main__":
  app.run(main)
