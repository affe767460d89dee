"""Steps per compiled call of the unrolled local loop: compile time against run time.

    taskset -c 0 python benchmarks/unroll.py [--models=linear,tiny_mlp,mnist_cnn] [--counts=1,2,4,8,16]

For each model and each count k, prints the seconds XLA takes to compile `LocalTrainer.update_programs`'
program of k full batches (B = 64, MNIST-shaped data, the arrays passed as arguments as the simulation does),
and the milliseconds per SGD step when the host calls that program back to back. This picked one step per
call (`LocalTrainer(max_unroll=1)`, what a run uses): run time per step does not fall with k, compile time grows.
Pin it to one core: with forced host devices each client trains on one core.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from fedpsa_jax import local, models

flags.DEFINE_list("models", ["linear", "tiny_mlp", "mnist_cnn"], "models (fedpsa_jax.models.get_model names)")
flags.DEFINE_list("counts", ["1", "2", "4", "8", "16"], "SGD steps per compiled call")
flags.DEFINE_integer("steps", 32, "SGD steps timed per count")
FLAGS = flags.FLAGS

BATCH, SAMPLES = 64, 1024


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  x_all = jnp.asarray(rng.random((4000, 28, 28, 1), np.float32))
  y_all = jnp.asarray(rng.integers(0, 10, 4000))
  row = jnp.arange(SAMPLES)
  print(f"{'model':10s} {'steps/call':>10s} {'compile s':>10s} {'ms/step':>9s}")
  for name in FLAGS.models:
    model = models.get_model(name, 10)
    params = model.init(jax.random.key(0), x_all[:1])
    # epochs = 1 and a fresh order: every timed call reads the first k batches of the same epoch.
    orders = local.epoch_orders(jax.random.key(1), jnp.int32(SAMPLES), SAMPLES, 1)
    state = local.StepState(params=params, anchor=params, lr=jnp.float32(0.01))
    data = local.ClientData(x_all=x_all, y_all=y_all, index_row=row, orders=orders, num_samples=SAMPLES)
    for count in map(int, FLAGS.counts):
      # The epoch's SAMPLES / BATCH full batches in calls of `count` batches: one program, run that many times.
      trainer = local.LocalTrainer(model.apply, BATCH, 1, max_unroll=count)
      (_, fn, args), = trainer.update_programs(state, data)
      start = time.perf_counter()
      compiled = jax.jit(fn).lower(*args).compile()
      compile_seconds = time.perf_counter() - start
      out = jax.block_until_ready(compiled(*args))
      calls = max(2, FLAGS.steps // count)
      start = time.perf_counter()
      for _ in range(calls):
        out = compiled(args[0].replace(params=out), *args[1:])
      jax.block_until_ready(out)
      step_ms = 1e3 * (time.perf_counter() - start) / (calls * count)
      print(f"{name:10s} {count:10d} {compile_seconds:10.2f} {step_ms:9.3f}", flush=True)


if __name__ == "__main__":
  app.run(main)
