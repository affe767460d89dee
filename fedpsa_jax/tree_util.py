"""Pytree arithmetic shared by the strategies, the executor and local training (after fedjax's
`core/tree_util.py`): one definition each, so that no strategy borrows them from a sibling.

The `jit`-ed ones are the server's and the executor's aggregation steps (one compiled program per
tree structure); the plain ones are for use inside other jitted functions.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Params = Any


def tree_add_scaled(params: Params, deltas: Sequence[Params], weights: jax.Array) -> Params:
  """w + Σ_i weights[i] Δ_i, leaf by leaf (the common form of every buffered update)."""
  return jax.tree.map(
      lambda w, *ds: w + sum(weights[i].astype(w.dtype) * d for i, d in enumerate(ds)), params, *deltas)


@jax.jit
def apply_weighted(params: Params, deltas: Sequence[Params], weights: jax.Array) -> Params:
  """The jitted aggregation step of the buffered methods (FedBuff, FedAvg, FedPAC, FedPSA): w + Σ_i weights_i Δ_i."""
  return tree_add_scaled(params, deltas, weights)

tree_add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
tree_add.__doc__ = "a + b, leaf by leaf (jitted)."
tree_sub = jax.jit(lambda a, b: jax.tree.map(jnp.subtract, a, b))
tree_sub.__doc__ = "a − b, leaf by leaf (jitted)."


def squared_norm(tree: Params) -> jax.Array:
  """Σ over leaves of ||x||² (a scalar array)."""
  return sum(jnp.vdot(x, x).real for x in jax.tree.leaves(tree))


def squared_distance(a: Params, b: Params) -> jax.Array:
  """||a − b||² over all leaves (a scalar array)."""
  return sum(jnp.sum((x - y) ** 2) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def tree_bytes(tree: Any) -> int:
  """Size in bytes of a pytree of arrays, read from shapes and dtypes (no device work, no sync)."""
  return sum(x.size * x.dtype.itemsize if hasattr(x, "dtype") else np.asarray(x).nbytes
             for x in jax.tree.leaves(tree))


def to_host(tree: Any) -> Any:
  """`tree` with every array read to the host at once (one `jax.device_get`) as Python values: 0-d arrays
  and NumPy scalars become numbers, other arrays lists. For records that strategies may fill with device
  values (diagnostics, event records): the host reads them when it writes them, not when they are made."""
  return jax.tree.map(lambda x: x.tolist() if isinstance(x, (np.ndarray, np.generic)) else x, jax.device_get(tree))
