"""FedPSA's pieces for `--mode=profile`: the Fisher diagonal (Eq. 6) on both paths and the sensitivity (Eq. 8)
at several calibration sizes, the sketch (Eq. 11), and what a client adds to its update (g, Fisher, Eq. 8 and
the sketch on the configured calibration batch). The paper's claim under test: the sensitivity costs little
beside local training (Sec. 6.5, Fig. 5). Rows and their names: docs/profiling.md.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.flatten_util
import jax.numpy as jnp

from fedpsa_jax import fisher, sensitivity
from fedpsa_jax.strategies.fedpsa import calibration_batch

CALIBRATION_SIZES = (16, 32, 128, 512)
PIECES = ("fisher_per_sample", "fisher_factored", "sensitivity_eq8", "sketch", "sketch_bare_matvec",
          "client_sensitivity_sketch")


def profile(profiler: Any, calibration_sizes: Sequence[int] = CALIBRATION_SIZES) -> None:
  """Adds FedPSA's rows to `profiler` (a `profiling.Profiler`), those it `wants`: per size in
  `calibration_sizes`, `fisher_per_sample`, `fisher_factored` (Flax models) and `sensitivity_eq8`; then `sketch`,
  `sketch_bare_matvec` and `client_sensitivity_sketch`."""
  c, ctx, apply_fn, params = profiler.config, profiler.sim.strategy.ctx, profiler.apply_fn, profiler.params
  chunk = c.runtime.fisher_chunk_size
  for size in calibration_sizes:
    x, y = calibration_batch(ctx, c.fedpsa.calibration, size)
    # The batch is an argument, not a closed-over constant: XLA would constant-fold its im2col.
    if profiler.wants("fisher_per_sample"):
      reference = lambda p, x, y: sensitivity.fisher_diagonal(apply_fn, p, x, y, chunk_size=chunk,
                                                              method="per_sample")
      profiler.add_on_batch("fisher_per_sample", reference, x, y, calibration=size, chunk=chunk)
    if profiler.wants("fisher_factored") and fisher.flax_module_of(apply_fn) is not None:
      add_fisher_factored(profiler, size)
    if profiler.wants("sensitivity_eq8"):
      eq8 = lambda p, x, y: sensitivity.sensitivity(apply_fn, p, x, y, chunk_size=chunk, method=c.runtime.fisher)
      profiler.add_on_batch("sensitivity_eq8", eq8, x, y, calibration=size, note="g + Fisher + Eq. 8")
  # The run's own pieces: its strategy's R (per-leaf blocks) and calibration batch, and the compiled functions
  # the run calls. `sketch` is Eq. 11 alone (`sensitivity.project`) on a sensitivity tree, beside a bare
  # matrix-vector product of the same shape (the memory-bandwidth bound); `client_sensitivity_sketch` is the
  # client's payload as the executor computes it (`sensitivity.sketch_of`, one program; the server's rounds
  # call the same for the global sketch).
  strategy = profiler.sim.strategy
  R, (x, y) = strategy.projection, strategy.calibration
  d = sensitivity.num_params(params)
  # (a CountSketch has no matrix to compare with)
  bare_matvec = profiler.wants("sketch_bare_matvec") and c.fedpsa.projection == "gaussian"
  if profiler.wants("sketch") or bare_matvec:
    # s as one compiled program: run op by op, its Fisher is slower and keeps many small programs in memory.
    s = jax.jit(lambda p, x, y: sensitivity.sensitivity(apply_fn, p, x, y, chunk_size=chunk,
                                                        method=c.runtime.fisher))(params, x, y)
  if profiler.wants("sketch"):
    profiler.add("sketch", profiler.cost(sensitivity.sketch, R, s), functools.partial(sensitivity.project, R, s),
                 k=c.fedpsa.sketch_dim, d=d)
  if bare_matvec:
    flat_R = jnp.concatenate([b.reshape(b.shape[0], -1) for b in jax.tree.leaves(R)], axis=1)
    flat_s = jax.flatten_util.ravel_pytree(s)[0]
    bare = lambda R, v: R @ v
    profiler.add("sketch_bare_matvec", profiler.cost(bare, flat_R, flat_s),
                 functools.partial(jax.jit(bare), flat_R, flat_s), k=c.fedpsa.sketch_dim, d=d)
  if profiler.wants("client_sensitivity_sketch"):
    whole = lambda p, R, x, y: sensitivity.sketch_of(apply_fn, p, R, x, y, **strategy.sketch_options)
    profiler.add("client_sensitivity_sketch", profiler.cost(whole, params, R, x, y),
                 functools.partial(strategy.client.payload, params, params), calibration=c.fedpsa.calibration_size,
                 note=f"Fisher path {sensitivity.resolve_fisher_method(apply_fn, c.runtime.fisher)}")


def add_fisher_factored(profiler: Any, size: int) -> None:
  """The `fisher_factored` row at calibration size `size` (a Flax model's factored Fisher, `fisher.py`): timed on
  the path that runs, costed on its loop-free twin (`conv_loop='batched'`: the same matmuls, unrolled), since XLA
  counts a loop body once."""
  apply_fn, params = profiler.apply_fn, profiler.params
  x, y = calibration_batch(profiler.sim.strategy.ctx, profiler.config.fedpsa.calibration, size)
  factored = lambda p, x, y: fisher.gradient_and_fisher(apply_fn, p, x, y)
  loop_free = lambda p, x, y: fisher.gradient_and_fisher(apply_fn, p, x, y, conv_loop="batched")
  cost = profiler.cost(loop_free, params, x, y, cost_only=True)
  runs = profiler.cost(factored, params, x, y)  # the path that runs: its temporaries, and its compile for compile_s
  cost.update(temp_bytes=runs["temp_bytes"], compile_seconds=runs["compile_seconds"])
  profiler.add("fisher_factored", cost, functools.partial(jax.jit(factored), params, x, y), calibration=size)
