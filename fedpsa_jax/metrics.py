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
def batch_stats(apply_fn: Callable, params: Params, x: jax.Array, y: jax.Array,
                mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(correct predictions, summed cross-entropy) over the real samples (`mask`) of one padded test batch."""
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
      c, l = batch_stats(apply_fn, params, x[start:start + b], y[start:start + b], mask[start:start + b])
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
        c, _ = batch_stats(apply_fn, models[int(m)], x_all[idx[start:start + b]], y_all[idx[start:start + b]],
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


def _personalized(history: Sequence[dict]) -> dict[str, Any]:
  """Final and best personalised accuracy, when the run evaluates on local test splits."""
  accs = [r["personalized_accuracy"] for r in history if "personalized_accuracy" in r]
  if not accs:
    return {}
  return {"final_personalized_accuracy": accs[-1], "best_personalized_accuracy": max(accs)}


def _to_target(history: Sequence[dict], target: float | None) -> dict[str, Any]:
  """The first evaluation at or above `target` (time-to-accuracy; None if never reached), on test accuracy
  and, when the run has it, on personalised accuracy."""
  if not target:
    return {}
  fields = ("day", "time", "round", "client_updates", "bytes_uploaded")
  hit = next((r for r in history if r["test_accuracy"] >= target), None)
  out = {"target_accuracy": target, **{f"{k}_to_target": hit[k] if hit else None for k in fields}}
  if any("personalized_accuracy" in r for r in history):
    hit = next((r for r in history if r.get("personalized_accuracy", -1.0) >= target), None)
    out.update({f"personalized_{k}_to_target": hit[k] if hit else None for k in fields})
  return out


def summarize(history: Sequence[dict], loop: Any, run: dict[str, Any], accounting: dict[str, Any],
              target_accuracy: float | None = None, units_per_day: int = 86_400) -> dict[str, Any]:
  """A run's summary.json, a pure function of its metrics history, its loop state (`LoopState`), what run
  it is (`run`: method, dataset, model, seed) and the host's accounting (`accounting`: wall and compute
  seconds, the executor's statistics, compiles)."""
  accs = [r["test_accuracy"] for r in history]
  days = [r["day"] for r in history]
  area = aulc(days, accs)
  wall = accounting["wall_seconds"]
  updates = loop.client_updates
  return {
      "status": loop.status, **run,
      "final_test_accuracy": accs[-1] if accs else None,
      "best_test_accuracy": max(accs) if accs else None,
      "final_test_loss": history[-1]["test_loss"] if history else None,
      "aulc": area, "aulc_per_day": area / days[-1] if days and days[-1] > 0 else 0.0,
      "virtual_days": loop.now / units_per_day, "time": loop.now, "rounds": loop.round,
      "client_updates": updates, "client_updates_per_second": updates / wall if wall > 0 else 0.0,
      # Accounting: client compute = local training plus client payloads (train_seconds);
      # server compute = the strategy's receive steps; bytes as the strategy counts them.
      "server_compute_seconds": loop.server_seconds,
      "bytes_uploaded": loop.bytes_uploaded, "bytes_downloaded": loop.bytes_downloaded,
      # Accumulated upload in MiB (2^20 bytes), e.g. AiFed's cost_a (its Eq. 17).
      "uploaded_mb": loop.bytes_uploaded / 2 ** 20,
      "upload_bytes_per_update": loop.bytes_uploaded / updates if updates else 0.0,
      "download_bytes_per_update": loop.bytes_downloaded / updates if updates else 0.0,
      "diverged_at": loop.diverged_at if loop.status == "diverged" else None,
      **_personalized(history),
      **_to_target(history, target_accuracy),
      **accounting,
  }
