"""How best to use every CPU core for conv training: host devices in one process, or one process per core.

    python benchmarks/cores.py [--steps=40] [--batch=64]

Runs the MNIST CNN's SGD step (B = 64) back to back as independent chains and prints the steps per second
of all chains together for:
  - one process, one host device (XLA runs independent ops of a step on several cores);
  - one process, one host device per core, one chain on each (what `runtime.execution=loop` does);
  - one process per core, unpinned;
  - one process per core, each pinned to its core (`os.sched_setaffinity`).
Each configuration runs in fresh processes started at the same moment. Pinned processes run bare steps
faster than host devices, but whole runs gain little, as the host waits with idle workers for the result it
needs next; so `loop` over host devices stays the CPU default (figures: docs/performance.md, "Host devices").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def chains(devices: int, core: int, steps: int, batch: int) -> dict:
  """In a child: `devices` host devices, one chain of `steps` SGD steps on each; wall and CPU seconds.
  `core` >= 0 pins the process to that core first (XLA then sizes its thread pool to one core)."""
  if core >= 0:
    os.sched_setaffinity(0, {core})
  import jax
  import jax.numpy as jnp
  import optax

  sys.path.insert(0, ROOT)
  from fedpsa_jax import models

  model = models.MnistCNN()
  x, y = jnp.zeros((batch, 28, 28, 1)), jnp.zeros((batch,), jnp.int32)
  params = model.init(jax.random.key(0), x)

  @jax.jit
  def step(p, x, y):
    grads = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean())(p)
    return jax.tree.map(lambda a, g: a - 0.01 * g, p, grads)

  state = [jax.device_put((params, x, y), d) for d in jax.devices()[:devices]]
  current = jax.block_until_ready([step(*s) for s in state])  # compile and warm up on each device
  start, cpu = time.perf_counter(), time.process_time()
  for _ in range(steps):
    current = [step(p, s[1], s[2]) for p, s in zip(current, state)]
  jax.block_until_ready(current)
  return {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu, "steps": steps * devices}


def run(processes: int, devices: int, pin: bool, steps: int, batch: int) -> tuple[float, float]:
  """Starts `processes` children at once; (steps/s of all of them together, cores busy)."""
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
  cores = sorted(os.sched_getaffinity(0))
  children = []
  for i in range(processes):
    core = cores[i % len(cores)] if pin else -1
    argv = [sys.executable, os.path.abspath(__file__), f"--child={devices}", f"--core={core}", f"--steps={steps}",
            f"--batch={batch}"]
    children.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env))
  results = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
  wall = max(r["wall"] for r in results)
  return sum(r["steps"] for r in results) / wall, sum(r["cpu"] for r in results) / wall


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--child", type=int, default=0, help="internal: run chains on this many devices")
  parser.add_argument("--core", type=int, default=-1, help="internal: the child's core (-1: not pinned)")
  args = parser.parse_args()
  if args.child:
    print(json.dumps(chains(args.child, args.core, args.steps, args.batch)))
    return
  n = len(os.sched_getaffinity(0))
  print(f"MNIST CNN SGD steps, B = {args.batch}, {n} cores")
  print(f"{'configuration':44s} {'steps/s':>8s} {'cores busy':>10s}")
  for name, processes, devices, pin in [("one process, one device", 1, 1, False),
                                        (f"one process, {n} devices", 1, n, False),
                                        (f"{n} processes, unpinned", n, 1, False),
                                        (f"{n} processes, each pinned to a core", n, 1, True)]:
    rate, busy = run(processes, devices, pin, args.steps, args.batch)
    print(f"{name:44s} {rate:8.1f} {busy:10.2f}", flush=True)


if __name__ == "__main__":
  main()
