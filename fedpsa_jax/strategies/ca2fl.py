"""CA2FL (Wang, Cao, Wu, Chen, Chen, ICLR 2024): buffered asynchronous FL with cached update calibration.

The server keeps, per client i, a cache h_i of the latest update it received from i (0 for a client
never heard from) and h = (1/N) Σ_i h_i over all N clients. In round t (Algorithm 1 of the paper):

  on each arrival of Δ_i:  D ← D + (Δ_i − h_i)    (Δ_i itself the first time, as h_i = 0),
                           h_i ← Δ_i,  S ← S ∪ {i};
  once |S| ≥ K:            v = h + D / |S|         (h as computed at the end of the previous round),
                           w ← w + η v,
                           h ← (1/N) Σ_i h_i       (over all N clients, with the new caches),
                           D ← 0, S ← ∅.

v estimates the average of the latest updates of *all* clients: the stale cached part h plus the
correction of the clients heard from this round, which is why heterogeneous data hurts it less than
a plain buffer (FedBuff).

Adaptation choices (none changes the method's update):
- Arrivals of one event time enter the buffer together, ordered by client id, so a round may hold
  more than K updates (as FedBuff and FedPSA here, after FLGo). A client whose update waits in an
  unflushed buffer is not re-selected (docs/simulation.md), so S never holds a client twice; were it to, both
  arrivals are calibrated against the cache as it stands, which telescopes to the same D.
- No staleness weighting: the paper's algorithm has none (the calibration is its answer to staleness).
- Σ_i h_i is kept as a running sum (updated by Δ_i − h_i on each arrival) rather than re-summed over N
  caches per round; the caches themselves are kept per client (only for clients heard from) so that
  replacing one never copies the others.
- Defaults (docs/methods.md, 'Defaults'): K = 5, η = 1.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections

from fedpsa_jax.strategies.base import Arrival, Strategy, register
from fedpsa_jax.strategies.common import buffer_size, section_errors
from fedpsa_jax.tree_util import squared_norm
from fedpsa_jax.validation import number

Params = Any


@flax.struct.dataclass
class CA2FLState:
  params: Params
  caches: dict  # {client: h_i}, the latest Δ of every client heard from (absent: h_i = 0)
  cache_sum: Params  # Σ_i h_i over all clients
  cache_mean: Params  # h = (1/N) Σ_i h_i as of the end of the last round
  calibrated: Params  # D = Σ_{i ∈ S} (Δ_i − h_i) of the current round
  members: tuple = flax.struct.field(pytree_node=False, default=())  # S: clients of this round (host ints)
  last_update_sq_norm: jax.Array | None = None  # ||η v||² of the last round (diagnostics)


@jax.jit
def _observe(calibrated: Params, cache_sum: Params, delta: Params, cache: Params) -> tuple[Params, Params]:
  """One arrival: D + (Δ_i − h_i) and Σ h + (Δ_i − h_i) (the cache sum after h_i ← Δ_i)."""
  correction = jax.tree.map(jnp.subtract, delta, cache)
  return jax.tree.map(jnp.add, calibrated, correction), jax.tree.map(jnp.add, cache_sum, correction)


@jax.jit
def _flush(params: Params, calibrated: Params, cache_mean: Params, cache_sum: Params, count: jax.Array,
           server_lr: jax.Array, num_clients: jax.Array) -> tuple[Params, Params, jax.Array]:
  """The end of a round: w + η (h + D/|S|), the new h = Σ h_i / N, and ||η v||²."""
  step = jax.tree.map(lambda h, d: server_lr * (h + d / count), cache_mean, calibrated)
  params = jax.tree.map(jnp.add, params, step)
  return params, jax.tree.map(lambda s: s / num_clients, cache_sum), squared_norm(step)


@register("ca2fl")
class CA2FL(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.buffer_size = 5  # K: end the round when updates of at least this many clients were received
    c.server_lr = 1.0  # η, the server step size of w ← w + η v
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    return section_errors(config, "ca2fl", (("buffer_size", buffer_size(config)), ("server_lr", number(gt=0))))

  def init(self, params: Params) -> CA2FLState:
    zeros = jax.tree.map(jnp.zeros_like, params)
    return CA2FLState(params=params, caches={}, cache_sum=zeros, cache_mean=zeros, calibrated=zeros)

  def receive(self, state: CA2FLState, arrivals: Sequence[Arrival]) -> tuple[CA2FLState, bool]:
    caches, calibrated, cache_sum = dict(state.caches), state.calibrated, state.cache_sum
    members = state.members
    for a in arrivals:
      cache = caches.get(a.client)
      if cache is None:  # never heard from: h_i = 0, so the calibrated update is Δ_i itself
        cache = jax.tree.map(jnp.zeros_like, a.delta)
      calibrated, cache_sum = _observe(calibrated, cache_sum, a.delta, cache)
      caches[a.client] = a.delta
      members += (a.client,)
    state = state.replace(caches=caches, calibrated=calibrated, cache_sum=cache_sum, members=members)
    if len(members) < self.hparams.buffer_size:
      return state, False
    params, cache_mean, step_sq = _flush(
        state.params, calibrated, state.cache_mean, cache_sum, jnp.float32(len(members)),
        jnp.float32(self.hparams.server_lr), jnp.float32(self.ctx.num_clients))
    return state.replace(params=params, cache_mean=cache_mean, calibrated=jax.tree.map(jnp.zeros_like, calibrated),
                         members=(), last_update_sq_norm=step_sq), True

  def diagnostics(self, state: CA2FLState) -> dict[str, Any]:
    out: dict[str, Any] = {"cached_clients": len(state.caches)}
    if state.last_update_sq_norm is not None:
      out["update_sq_norm"] = float(state.last_update_sq_norm)
    return out
