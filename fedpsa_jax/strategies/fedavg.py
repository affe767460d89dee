"""FedAvg (McMahan et al., 2017) on the asynchronous clock: synchronous rounds.

The scheduler's 'sync' mode dispatches a cohort of m = C clients from the same global model only when
none is in flight; the round ends when the last of them returns (1 + the largest response time after
it started). The server then averages the cohort's models weighted by data size:
w ← Σ_i (n_i / Σ n) w_i = w + Σ_i (n_i / Σ n) Δ_i.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax
import jax.numpy as jnp

from fedpsa_jax.strategies.base import Arrival, Strategy, register
from fedpsa_jax.tree_util import apply_weighted

Params = Any


@flax.struct.dataclass
class CohortState:
  params: Params
  deltas: tuple = ()  # Δ_i of the cohort members received so far
  sizes: tuple = flax.struct.field(pytree_node=False, default=())  # their n_i (host ints)


@register("fedavg")
class FedAvg(Strategy):
  dispatch_mode = "sync"

  def init(self, params: Params) -> CohortState:
    return CohortState(params=params)

  def receive(self, state: CohortState, arrivals: Sequence[Arrival]) -> tuple[CohortState, bool]:
    deltas = state.deltas + tuple(a.delta for a in arrivals)
    sizes = state.sizes + tuple(a.num_samples for a in arrivals)
    if len(deltas) < min(self.ctx.concurrency, self.ctx.num_clients):
      return state.replace(deltas=deltas, sizes=sizes), False
    weights = jnp.asarray(sizes, jnp.float32) / sum(sizes)
    return CohortState(params=apply_weighted(state.params, deltas, weights)), True
