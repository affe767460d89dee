"""Kernel gradient of each paper conv: XLA's plain convolution against per-chunk convolutions, summed.

    python benchmarks/conv_weight_grad.py [--batch=64] [--chunks=2,4,8,16,32]

Run it pinned to one core (`taskset -c 0`): with forced host devices each client trains on one core.
Prints, per layer (5x5 SAME, NHWC), milliseconds of the plain kernel gradient and of the chunked one
for each chunk size, and the largest relative difference from the plain one. This picked
`models.CPU_CONV_CHUNK`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from absl import app, flags

flags.DEFINE_integer("batch", 64, "images per batch")
flags.DEFINE_list("chunks", ["2", "4", "8", "16", "32"], "chunk sizes to time")
FLAGS = flags.FLAGS

# (name, input height = width, input channels, output channels) of the paper models' convs.
LAYERS = [("mnist_cnn conv1", 28, 1, 32), ("mnist_cnn conv2", 14, 32, 64), ("cifar_cnn conv1", 32, 3, 64),
          ("cifar_cnn conv2", 16, 64, 64), ("aifed_cnn conv2", 14, 64, 128)]
DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def timed_ms(fn, *args, repeats: int = 10) -> float:
  fn = jax.jit(fn)
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return 1e3 * (time.perf_counter() - start) / repeats


def main(argv):
  del argv
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DIMENSIONS)
  kernel_grad = lambda x, w, g: jax.vjp(lambda w: conv(x, w), w)[1](g)[0]

  def chunked(size):
    def fn(x, w, g):
      parts = [kernel_grad(x[s:s + size], w, g[s:s + size]) for s in range(0, x.shape[0], size)]
      return sum(parts[1:], parts[0])
    return fn

  for name, hw, cin, cout in LAYERS:
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (FLAGS.batch, hw, hw, cin))
    w = jax.random.normal(kw, (5, 5, cin, cout))
    g = jax.random.normal(kg, (FLAGS.batch, hw, hw, cout))
    reference = jax.jit(kernel_grad)(x, w, g)
    row = [f"{name:16s} plain {timed_ms(kernel_grad, x, w, g):7.2f} ms"]
    worst = 0.0
    for size in map(int, FLAGS.chunks):
      fn = chunked(size)
      worst = max(worst, float(jnp.max(jnp.abs(jax.jit(fn)(x, w, g) - reference)) / jnp.max(jnp.abs(reference))))
      row.append(f"chunk {size:2d} {timed_ms(fn, x, w, g):7.2f}")
    print(" | ".join(row) + f" | max rel diff {worst:.0e}", flush=True)


if __name__ == "__main__":
  app.run(main)
