"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

Arrivals wait in a buffer; once it holds at least K updates, the global model moves by
w ← w + η (1/|buffer|) Σ_i s(τ_i) Δ_i with s(τ) = (1 + τ)^(-1/2) (not renormalised), then the buffer is
cleared. Arrivals of one event time enter the buffer together, so a flush may hold more than K
(FLGo's behaviour, whose numbers the paper reports).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax
import jax
import ml_collections
import numpy as np

from fedpsa_jax.strategies.base import Arrival, Strategy, register
from fedpsa_jax.strategies.common import buffer_size, section_errors
from fedpsa_jax.tree_util import apply_weighted
from fedpsa_jax.validation import number

Params = Any


@flax.struct.dataclass
class BufferState:
  params: Params
  deltas: tuple = ()  # buffered Δ_i, in arrival order
  staleness: tuple = flax.struct.field(pytree_node=False, default=())  # host ints τ_i
  last_weights: jax.Array | None = None  # weights of the last flush (diagnostics)


@register("fedbuff")
class FedBuff(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.buffer_size = 5  # K: flush when the buffer holds at least this many updates
    c.server_lr = 1.0  # η, the server step size
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    return section_errors(config, "fedbuff", (("buffer_size", buffer_size(config)), ("server_lr", number(gt=0))))

  def init(self, params: Params) -> BufferState:
    return BufferState(params=params)

  def staleness_weight(self, tau: np.ndarray) -> np.ndarray:
    """s(τ) = (1 + τ)^(-1/2), FedBuff's staleness discount (NumPy, on the host); override it to try another."""
    return (1.0 + tau) ** -0.5

  def receive(self, state: BufferState, arrivals: Sequence[Arrival]) -> tuple[BufferState, bool]:
    deltas = state.deltas + tuple(a.delta for a in arrivals)
    staleness = state.staleness + tuple(a.staleness for a in arrivals)
    if len(deltas) < self.hparams.buffer_size:
      return state.replace(deltas=deltas, staleness=staleness), False
    # The weights on the host, which knows the staleness (NumPy: no eager device ops per round).
    weights = (self.hparams.server_lr * self.staleness_weight(np.asarray(staleness, np.float32))
               / np.float32(len(deltas))).astype(np.float32)
    params = apply_weighted(state.params, deltas, weights)
    return BufferState(params=params, last_weights=weights), True

  def diagnostics(self, state: BufferState) -> dict[str, Any]:
    if state.last_weights is None:
      return {}
    return {"weights": [float(w) for w in jax.device_get(state.last_weights)]}
