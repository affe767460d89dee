"""FedAsync (Xie et al., 2019): every arrival is mixed into the global model at once.

w ← (1 − α s(τ)) w + α s(τ) w_i with the staleness function s (Xie et al., Sec. 5.2):
  constant: 1;  polynomial: (τ + 1)^(-a);  hinge: 1 if τ <= b else 1 / (a (τ − b) + 1).
The polynomial and the hinge have their own parameters, at the values of the FedAsync paper's experiments:
polynomial a = `fedasync.a` = 0.5; hinge a = `fedasync.hinge_a` = 10 and b = `fedasync.hinge_b` = 4. (They
once shared `a`, so the hinge ran with slope 0.5: a far gentler decay than the paper's.)
Arrivals of one event time are each mixed into the same w and the results averaged by data size,
so one event time is one round. Clients add the proximal term μ/2 ||w − w_dispatch||² to their loss.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import local
from fedpsa_jax.strategies.base import Arrival, ClientSide, Strategy, register
from fedpsa_jax.strategies.common import section_errors
from fedpsa_jax.validation import number, one_of

Params = Any
STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


@flax.struct.dataclass
class AsyncState:
  params: Params


def staleness_weight(tau: jax.Array, kind: str, a: float, b: float) -> jax.Array:
  """s(τ) of FedAsync (Xie et al., Sec. 5.2): `a`, `b` are the chosen function's own parameters (polynomial:
  the exponent a, b unused; hinge: the slope a and the threshold b; `FedAsync.staleness_params` picks them)."""
  tau = jnp.asarray(tau, jnp.float32)
  if kind == "constant":
    return jnp.ones_like(tau)
  if kind == "polynomial":
    return (tau + 1.0) ** (-a)
  if kind == "hinge":
    return jnp.where(tau <= b, 1.0, 1.0 / (a * (tau - b) + 1.0))
  raise ValueError(f"fedasync.staleness={kind!r} is invalid; allowed: {', '.join(STALENESS_FUNCTIONS)}")


# Σ_j p_j [(1 − m_j) w + m_j (start_j + Δ_j)] = (1 − Σ_j p_j m_j) w + Σ_j p_j m_j (start_j + Δ_j), summed
# one arrival at a time: one program per call whatever the number of arrivals sharing an event time (a
# function of the tuple of all of them compiled again for each new count).
@functools.partial(jax.jit, static_argnames="kind")
def accumulate(acc: Params | None, total: jax.Array, start: Params, delta: Params, tau: jax.Array, share: jax.Array,
               alpha: float, a: float, b: float, kind: str) -> tuple[Params, jax.Array]:
  """(acc + p m (start + Δ), total + p m) for one arrival: p its data-size share, m = α s(τ) its mixing
  weight; `acc` None starts the sums."""
  weight = share * alpha * staleness_weight(tau, kind, a, b)
  term = jax.tree.map(lambda s0, d: weight * (s0 + d), start, delta)
  return (term if acc is None else jax.tree.map(jnp.add, acc, term)), total + weight


@jax.jit
def blend(params: Params, acc: Params, total: jax.Array) -> Params:
  """(1 − Σ_j p_j m_j) w + Σ_j p_j m_j (start_j + Δ_j)."""
  return jax.tree.map(lambda w, t: (1 - total) * w + t, params, acc)


@register("fedasync")
class FedAsync(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.alpha = 0.6  # α, the mixing weight of a fresh update
    c.staleness = "polynomial"  # s(τ): constant | polynomial | hinge
    c.a = 0.5  # polynomial only: the exponent a of s(τ) = (τ + 1)^(-a) (the FedAsync paper's 0.5)
    # hinge only: s(τ) = 1 for τ <= b, else 1 / (a (τ − b) + 1), with its own a and b (the FedAsync paper's 10, 4;
    # not the polynomial's a, whose 0.5 would make the hinge's decay 20 times gentler)
    c.hinge_a = 10.0  # the slope a beyond b
    c.hinge_b = 4  # the staleness b tolerated before the decay starts
    c.prox_mu = 0.005  # μ of the clients' proximal term μ/2 ||w − w_dispatch||² (0 disables it)
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    # a, hinge_a and hinge_b are checked whichever function is chosen, so that a bad value is caught before
    # someone switches to it.
    return section_errors(config, "fedasync", (
        ("staleness", one_of(STALENESS_FUNCTIONS)), ("alpha", number(gt=0, le=1)), ("prox_mu", number(ge=0)),
        ("a", number(ge=0)), ("hinge_a", number(ge=0)), ("hinge_b", number(ge=0))))

  def __init__(self, hparams, ctx):
    super().__init__(hparams, ctx)
    # A value (equal for equal μ): the local trainer is a static jit argument, so runs of one μ compile once.
    self.client = ClientSide(regularizer=local.ProximalTerm(self.hparams.prox_mu) if self.hparams.prox_mu > 0
                             else None)
    self._a, self._b = self.staleness_params(self.hparams)

  @staticmethod
  def staleness_params(hparams: ml_collections.ConfigDict) -> tuple[float, float]:
    """(a, b) of the chosen s(τ): the hinge's own (hinge_a, hinge_b), else the polynomial's a (b unused)."""
    if hparams.staleness == "hinge":
      return float(hparams.hinge_a), float(hparams.hinge_b)
    return float(hparams.a), 0.0

  def init(self, params: Params) -> AsyncState:
    return AsyncState(params=params)

  def receive(self, state: AsyncState, arrivals: Sequence[Arrival]) -> tuple[AsyncState, bool]:
    h = self.hparams
    shares = np.array([a.num_samples for a in arrivals], np.float32)
    shares /= shares.sum()  # p_j, on the host, which knows the sizes
    acc, total = None, np.float32(0.0)
    for arrival, share in zip(arrivals, shares):
      acc, total = accumulate(acc, total, arrival.params_start, arrival.delta, np.float32(arrival.staleness), share,
                              h.alpha, self._a, self._b, kind=h.staleness)
    return AsyncState(params=blend(state.params, acc, total)), True
