"""Evaluation of the global model and the run-level metrics computed from the logged curve."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = Any


@functools.partial(jax.jit, static_argnums=(0,))
def _batch_stats(apply_fn, params, x, y, mask):
  logits = apply_fn(params, x)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
  correct = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
  return jnp.sum(correct * mask), jnp.sum(losses * mask)


def make_evaluator(apply_fn: Callable, x_test: jax.Array, y_test: jax.Array,
                   batch_size: int) -> Callable[[Params], dict[str, float]]:
  """`evaluate(params) -> {'test_accuracy', 'test_loss'}` over the whole test set.

  The test set is cut into equal batches (the last one padded and masked) so one shape compiles.
  """
  n = int(x_test.shape[0])
  b = min(batch_size, n)
  pad = -n % b
  x = jnp.concatenate([x_test, jnp.zeros((pad, *x_test.shape[1:]), x_test.dtype)])
  y = jnp.concatenate([y_test, jnp.zeros((pad,), y_test.dtype)])
  mask = (jnp.arange(n + pad) < n).astype(jnp.float32)

  def evaluate(params: Params) -> dict[str, float]:
    correct = total_loss = 0.0
    for start in range(0, n + pad, b):
      c, l = _batch_stats(apply_fn, params, x[start:start + b], y[start:start + b], mask[start:start + b])
      correct, total_loss = correct + c, total_loss + l
    return {"test_accuracy": float(correct) / n, "test_loss": float(total_loss) / n}

  return evaluate


def make_personal_evaluator(apply_fn: Callable, x_all: jax.Array, y_all: jax.Array,
                            client_test_indices: Sequence[np.ndarray], batch_size: int
                            ) -> Callable[[Sequence[Params], np.ndarray], float]:
  """`evaluate(models, assignment) -> personalised accuracy`: each client's local test samples
  (`client_test_indices[i]`, indices into `x_all`) classified by `models[assignment[i]]`, pooled over
  all clients, i.e. the per-client accuracies averaged weighted by local test size.

  One pass per distinct model in use, over the pooled samples of the clients assigned to it (not one
  per client); batches have the fixed size `batch_size` (the last padded and masked), so one shape
  compiles.
  """
  tests = [np.asarray(t, dtype=np.int64) for t in client_test_indices]
  total = sum(len(t) for t in tests)
  b = batch_size

  def evaluate(models: Sequence[Params], assignment: np.ndarray) -> float:
    assignment = np.asarray(assignment)
    correct = 0.0
    for m in np.unique(assignment):
      rows = np.concatenate([tests[i] for i in np.flatnonzero(assignment == m)] + [np.zeros(0, np.int64)])
      if len(rows) == 0:
        continue
      pad = -len(rows) % b
      idx = jnp.asarray(np.concatenate([rows, np.zeros(pad, np.int64)]))
      mask = (jnp.arange(len(rows) + pad) < len(rows)).astype(jnp.float32)
      for start in range(0, len(rows) + pad, b):
        c, _ = _batch_stats(apply_fn, models[int(m)], x_all[idx[start:start + b]], y_all[idx[start:start + b]],
                            mask[start:start + b])
        correct += float(c)
    return correct / total if total else float("nan")

  return evaluate


def aulc(days: Sequence[float], accuracies: Sequence[float]) -> float:
  """Area under the learning curve in accuracy-days: the trapezoid integral of test accuracy (a
  fraction) over virtual time in days, over the logged points from time 0 (the paper's Table 3)."""
  d, a = np.asarray(days, float), np.asarray(accuracies, float)
  if d.size < 2:
    return 0.0
  return float(np.sum((d[1:] - d[:-1]) * (a[1:] + a[:-1]) / 2.0))


@jax.jit
def _all_finite(tree: Params) -> jax.Array:
  # One compiled program per model, not one eager isfinite and reduction per leaf shape.
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def tree_is_finite(tree: Params) -> bool:
  """True when every leaf is free of NaN and Inf (one host sync; used only at evaluation)."""
  return bool(jax.device_get(_all_finite(tree)))
