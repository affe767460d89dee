"""FedFa (Xu, Zhang, Di, Liu, Alharthi, Cao, IJCAI 2024): "a fully asynchronous training paradigm".

Not the 2020 fairness method of the same name. The server keeps a queue (sliding window) of the K most
recent client models w_i = w_dispatch + Δ_i; every arrival is pushed and, when the window already
holds K models, the oldest is dropped. Once the window is full the global model is recomputed at every
arrival as the window's mean,

  w = (1/K) Σ_{j ∈ window} w_j,

so no client ever waits for a buffer to fill: each arrival is one change of the global model, and an
update that arrived K arrivals ago has left the window (the paper's answer to staleness).

Adaptation choices:
- Before the window is first full (the first K − 1 arrivals of the run) the global model does not
  change and no round is counted: the mean of fewer than K models would give the first arrivals
  a weight the method never gives them afterwards. From the K-th arrival on, every arrival changes w.
- Arrivals of one event time are pushed one by one in client-id order (oldest dropped each time) and
  the mean is taken once after the last push: the intermediate means would be seen by nobody (no
  client is dispatched between them), so this equals recomputing at each of them. The host counts
  one round per event time with arrivals, so such a batch advances the round counter (and with it
  staleness and the lr decay) by one, not by its size — the same convention as FedAsync here.
- The mean is unweighted (the paper's queue average), not by data size.
- No staleness weighting and no client-side term. Default K = 5 (docs/methods.md; `fedfa.window_size`); K is at
  most partition.num_clients (a larger window is refused).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax
import jax
import ml_collections

from fedpsa_jax.strategies.base import Arrival, Strategy, register
from fedpsa_jax.strategies.common import buffer_size, section_errors
from fedpsa_jax.tree_util import tree_add

Params = Any


@flax.struct.dataclass
class WindowState:
  params: Params
  window: tuple = ()  # the most recent client models w_i, oldest first (at most K)
  clients: tuple = flax.struct.field(pytree_node=False, default=())  # their client ids (host ints)


@jax.jit
def window_mean(models: tuple) -> Params:
  """(1/K) Σ_j w_j, leaf by leaf."""
  return jax.tree.map(lambda *leaves: sum(leaves) / len(leaves), *models)


@register("fedfa")
class FedFa(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.window_size = 5  # K: the global model is the mean of the K most recent client models
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    # K <= N, like a buffer (the shared `buffer_size` rule): the model first changes once K client models
    # have arrived, and a window of more models than clients only averages several of each client's.
    return section_errors(config, "fedfa", (("window_size", buffer_size(config)),))

  def init(self, params: Params) -> WindowState:
    return WindowState(params=params)

  def receive(self, state: WindowState, arrivals: Sequence[Arrival]) -> tuple[WindowState, bool]:
    k = self.hparams.window_size
    window = state.window + tuple(tree_add(a.params_start, a.delta) for a in arrivals)
    clients = state.clients + tuple(a.client for a in arrivals)
    window, clients = window[-k:], clients[-k:]  # drop the oldest beyond K
    if len(window) < k:
      return state.replace(window=window, clients=clients), False
    return WindowState(params=window_mean(window), window=window, clients=clients), True

  def diagnostics(self, state: WindowState) -> dict[str, Any]:
    return {"window_clients": list(state.clients)}
