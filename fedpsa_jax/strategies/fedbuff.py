"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

Arrivals wait in a buffer; once it holds at least K updates, the global model moves by
w ← w + η (1/|buffer|) Σ_i s(τ_i) Δ_i with s(τ) = (1 + τ)^(-1/2) (not renormalised), then the buffer is
cleared. Arrivals of one event time enter the buffer together, so a flush may hold more than K
(FLGo's behaviour, whose numbers the paper reports).

Two fields vary FedBuff's weights apart from each other (controls for FedPSA, which changes both; defaults are
FedBuff's): `weighting`, the shape of the weights over the buffer (`staleness`: ∝ s(τ_i); `uniform`: all equal),
and `step`, their sum (`staleness`: (1/B) Σ_i s(τ_i), FedBuff's step; `unit`: 1). For B flushed updates,
w_i = η · step · shape_i / Σ_j shape_j, which at the defaults is FedBuff's η s(τ_i) / B, computed as such.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax
import jax
import ml_collections
import numpy as np

from fedpsa_jax.strategies.base import Arrival, Strategy, register
from fedpsa_jax.strategies.common import STEPS, buffer_size, section_errors, staleness_discount
from fedpsa_jax.tree_util import apply_weighted
from fedpsa_jax.validation import number, one_of

WEIGHTINGS = ("staleness", "uniform")  # `weighting`: the shape of the buffer's weights

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
    # The shape of the weights over a flushed buffer: staleness (∝ (1 + τ_i)^(-1/2), FedBuff's) | uniform (equal)
    c.weighting = "staleness"
    # Their sum before η: staleness ((1/B) Σ_i (1 + τ_i)^(-1/2), FedBuff's step) | unit (1, FedPSA's Eq. 20)
    c.step = "staleness"
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    return section_errors(config, "fedbuff", (("buffer_size", buffer_size(config)), ("server_lr", number(gt=0)),
                                              ("weighting", one_of(WEIGHTINGS)), ("step", one_of(STEPS))))

  def init(self, params: Params) -> BufferState:
    return BufferState(params=params)

  def staleness_weight(self, tau: np.ndarray) -> np.ndarray:
    """s(τ) = (1 + τ)^(-1/2), FedBuff's staleness discount (NumPy, on the host); override it to try another."""
    return staleness_discount(tau)

  def flush_weights(self, staleness: Sequence[int]) -> np.ndarray:
    """[B] float32 weights of one flush, w_i = η · step · shape_i / Σ_j shape_j (the module docstring)."""
    h, n = self.hparams, np.float32(len(staleness))
    discount = self.staleness_weight(np.asarray(staleness, np.float32)).astype(np.float32)
    shape = discount if h.weighting == "staleness" else np.ones_like(discount)
    if h.step == "staleness":  # step / Σ shape = (Σ s / B) / Σ shape; at the defaults exactly η s_i / B
      scale = discount.sum() / shape.sum() if h.weighting != "staleness" else np.float32(1.0)
      return (h.server_lr * shape * scale / n).astype(np.float32)
    return (h.server_lr * shape / shape.sum()).astype(np.float32)

  def receive(self, state: BufferState, arrivals: Sequence[Arrival]) -> tuple[BufferState, bool]:
    deltas = state.deltas + tuple(a.delta for a in arrivals)
    staleness = state.staleness + tuple(a.staleness for a in arrivals)
    if len(deltas) < self.hparams.buffer_size:
      return state.replace(deltas=deltas, staleness=staleness), False
    weights = self.flush_weights(staleness)  # on the host, which knows τ (no eager device ops per round)
    params = apply_weighted(state.params, deltas, weights)
    return BufferState(params=params, last_weights=weights), True

  def diagnostics(self, state: BufferState) -> dict[str, Any]:
    if state.last_weights is None:
      return {}
    return {"weights": [float(w) for w in jax.device_get(state.last_weights)]}
