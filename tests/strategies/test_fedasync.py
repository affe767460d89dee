"""FedAsync's server (strategies/fedasync.py): the staleness functions by hand, one arrival's mix and
several same-time arrivals (mixed, then averaged by size, with no new compile), the proximal term, and the
validation of its section.

The staleness functions have their own parameters, at the FedAsync paper's values (Xie et al., Sec. 5.2):
polynomial s(τ) = (τ + 1)^(-a) with a = 0.5; hinge s(τ) = 1 if τ <= b else 1 / (a (τ − b) + 1) with a = 10, b = 4
(`fedasync.hinge_a`, `fedasync.hinge_b`). One arrival of staleness τ mixes w ← (1 − α s(τ)) w + α s(τ) w_i.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.compiles import CompileCounter
from fedpsa_jax.strategies import Arrival, StrategyContext
from fedpsa_jax.strategies.fedasync import FedAsync, staleness_weight
from helpers import (_arrival, _cfg, _close, _ctx, _flat, _np_tree, _tiny_delta, MODEL, PARAMS_KEY0, strategy_context,
                     TINY)
from numerics import assert_close, f32_tolerance


# --- FedAsync ---------------------------------------------------------------------------------------


def _fedasync(kind="polynomial", alpha=0.6, a=0.5, b=4, mu=0.005):
  cfg = config_lib.base_config()
  cfg.method = "fedasync"
  cfg.fedasync.staleness = kind
  cfg.fedasync.alpha = alpha
  cfg.fedasync.a = a  # the polynomial's exponent
  cfg.fedasync.hinge_a, cfg.fedasync.hinge_b = a, b  # the hinge's own a and b (_hand_s uses the same pair)
  cfg.fedasync.prox_mu = mu
  strategy = FedAsync(cfg.fedasync, _ctx())
  return strategy, strategy.init(TINY)


def _hand_s(kind, tau, a, b):
  if kind == "constant":
    return 1.0
  if kind == "polynomial":
    return (tau + 1.0) ** (-a)
  return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


@pytest.mark.parametrize("kind,a,b", [("constant", 0.5, 4), ("polynomial", 0.5, 4), ("polynomial", 1.3, 4),
                                      ("hinge", 10.0, 4), ("hinge", 0.7, 2)])
def test_fedasync_staleness_functions(kind, a, b):
  taus = np.array([0, 1, 2, 3, 4, 5, 7, 20])
  got = np.asarray(staleness_weight(jnp.asarray(taus), kind, a, b))
  np.testing.assert_allclose(got, [_hand_s(kind, t, a, b) for t in taus], rtol=1e-6)


def test_fedasync_hinge_values_spelled_out():
  # a = 10, b = 4: τ <= 4 -> 1; τ = 5 -> 1/11; τ = 7 -> 1/31.
  got = np.asarray(staleness_weight(jnp.asarray([4, 5, 7]), "hinge", 10.0, 4))
  np.testing.assert_allclose(got, [1.0, 1 / 11, 1 / 31], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(staleness_weight(jnp.asarray([3]), "polynomial", 0.5, 4)), [0.5])


@pytest.mark.parametrize("kind,tau", [("constant", 3), ("polynomial", 3), ("polynomial", 0),
                                      ("hinge", 2), ("hinge", 7)])
def test_fedasync_single_arrival_mix(kind, tau):
  alpha, a, b = 0.6, 0.5, 4
  strategy, state = _fedasync(kind, alpha=alpha, a=a, b=b)
  rng = np.random.default_rng(0)
  start = _tiny_delta(rng)  # a stale start, different from the current global model
  delta = _tiny_delta(rng)
  state, changed = strategy.receive(state, [_arrival(0, delta, staleness=tau, start=start)])
  assert changed
  m = alpha * _hand_s(kind, tau, a, b)
  expected = jax.tree.map(lambda w, s0, d: (1 - m) * w + m * (s0 + d), _np_tree(TINY), _np_tree(start),
                          _np_tree(delta))
  _close(state.params, expected)


def test_fedasync_two_same_time_arrivals_mixed_then_averaged_by_size():
  alpha, a = 0.6, 0.5
  strategy, state = _fedasync("polynomial", alpha=alpha, a=a)
  rng = np.random.default_rng(1)
  arrivals = [_arrival(0, _tiny_delta(rng), staleness=0, num_samples=10, start=_tiny_delta(rng)),
              _arrival(1, _tiny_delta(rng), staleness=8, num_samples=30, start=_tiny_delta(rng))]
  state, changed = strategy.receive(state, arrivals)
  assert changed
  w = _np_tree(TINY)
  mixed = []
  for arr in arrivals:
    m = alpha * (arr.staleness + 1.0) ** -a
    mixed.append(jax.tree.map(lambda x, s0, d: (1 - m) * x + m * (s0 + d), w, _np_tree(arr.params_start),
                              _np_tree(arr.delta)))
  _close(state.params, jax.tree.map(lambda p, q: 0.25 * p + 0.75 * q, *mixed))


def test_fedasync_more_same_time_arrivals_compile_nothing_new():
  """Warm with one and two arrivals; 3, 4 and 5 arrivals at one event time then compile nothing (one
  program per arrival, not per count), and 5 arrivals still give the size-weighted mix of each."""
  alpha, a = 0.6, 0.5
  strategy, state = _fedasync("polynomial", alpha=alpha, a=a)
  rng = np.random.default_rng(4)

  def arrivals(n):
    return [_arrival(i, _tiny_delta(rng), staleness=i, num_samples=10 * (i + 1), start=_tiny_delta(rng))
            for i in range(n)]

  for n in (1, 2):
    state, _ = strategy.receive(state, arrivals(n))
  jax.block_until_ready(state.params)
  with CompileCounter() as counter:
    for n in (3, 4):
      state, _ = strategy.receive(state, arrivals(n))
    last = arrivals(5)
    before = _np_tree(state.params)
    state, _ = strategy.receive(state, last)
    jax.block_until_ready(state.params)
  assert counter.count == 0, counter.by_function
  sizes = np.array([arr.num_samples for arr in last], np.float64)
  mixed = []
  for arr in last:
    m = alpha * (arr.staleness + 1.0) ** -a
    mixed.append(jax.tree.map(lambda x, s0, d: (1 - m) * x + m * (s0 + d), before, _np_tree(arr.params_start),
                              _np_tree(arr.delta)))
  _close(state.params, jax.tree.map(lambda *ps: sum(p * s for p, s in zip(ps, sizes / sizes.sum())), *mixed))


def test_fedasync_every_receive_is_a_round():
  strategy, state = _fedasync()
  rng = np.random.default_rng(2)
  for i in range(4):
    state, changed = strategy.receive(state, [_arrival(i, _tiny_delta(rng), staleness=i)])
    assert changed is True


def test_fedasync_proximal_regularizer():
  mu = 0.3
  strategy, _ = _fedasync(mu=mu)
  rng = np.random.default_rng(3)
  p, w0 = _tiny_delta(rng), _tiny_delta(rng)
  expected = mu / 2 * float(np.sum(( _flat(_np_tree(p)) - _flat(_np_tree(w0))) ** 2))
  np.testing.assert_allclose(float(strategy.client.regularizer(p, w0)), expected, rtol=1e-5)
  np.testing.assert_allclose(float(strategy.client.regularizer(p, p)), 0.0, atol=1e-7)
  none, _ = _fedasync(mu=0.0)
  assert none.client.regularizer is None


def test_fedasync_bogus_staleness_rejected():
  cfg = _cfg("fedasync")
  cfg.fedasync.staleness = "bogus"
  errors = config_lib.config_errors(cfg)
  assert len(errors) == 1
  assert "fedasync.staleness" in errors[0] and "bogus" in errors[0]
  with pytest.raises(ValueError, match="fedasync.staleness"):
    config_lib.validate(cfg)


ALPHA = 0.6


def _hinge_ctx() -> StrategyContext:
  return strategy_context(MODEL, PARAMS_KEY0, num_clients=4, sizes=[10, 20, 30, 40], concurrency=2)


def _hinge_config(staleness: str) -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.method = "fedasync"
  c.fedasync.staleness = staleness  # every other field at its default
  return c


def test_defaults_are_the_fedasync_papers():
  f = config_lib.base_config().fedasync
  assert (f.a, f.hinge_a, f.hinge_b) == (0.5, 10.0, 4)
  assert "b" not in f  # the hinge's b is hinge_b now, beside its own hinge_a
  assert FedAsync.staleness_params(_hinge_config("hinge").fedasync) == (10.0, 4.0)
  assert FedAsync.staleness_params(_hinge_config("polynomial").fedasync)[0] == 0.5


# τ -> s(τ) by hand. Hinge, a = 10, b = 4: 1 up to τ = 4, then 1/(10 (τ − 4) + 1): τ = 5 -> 1/11, 7 -> 1/31,
# 12 -> 1/81. (With the polynomial's a = 0.5 the hinge would give 1/1.5, 1/2.5, 1/5.) Polynomial, a = 0.5:
# (τ + 1)^(-1/2): τ = 0 -> 1, 3 -> 1/2, 8 -> 1/3.
BY_HAND = [("hinge", 0, 1.0), ("hinge", 4, 1.0), ("hinge", 5, 1 / 11), ("hinge", 7, 1 / 31), ("hinge", 12, 1 / 81),
           ("polynomial", 0, 1.0), ("polynomial", 3, 1 / 2), ("polynomial", 8, 1 / 3)]


@pytest.mark.parametrize("staleness,tau,s", BY_HAND)
def test_default_staleness_weight_by_hand_through_the_mix(staleness, tau, s):
  strategy = FedAsync(_hinge_config(staleness).fedasync, _hinge_ctx())
  rng = np.random.default_rng(tau)
  w = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), PARAMS_KEY0)
  start = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), PARAMS_KEY0)
  delta = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), PARAMS_KEY0)
  state, changed = strategy.receive(strategy.init(w), [Arrival(client=1, num_samples=20, staleness=tau,
                                                               dispatch_round=0, params_start=start, delta=delta,
                                                               payload=())])
  assert changed
  m = ALPHA * s
  expected = jax.tree.map(lambda w0, s0, d: (1 - m) * np.asarray(w0, np.float64)
                          + m * (np.asarray(s0, np.float64) + np.asarray(d, np.float64)), w, start, delta)
  assert_close(state.params, expected, f32_tolerance(2, depth=2))  # (1 − m) w + m (s + Δ)


@pytest.mark.parametrize("field", ["a", "hinge_a", "hinge_b"])
@pytest.mark.parametrize("bad", [-1.0, -1, math.inf, -math.inf, math.nan, True, False, "10", None])
def test_bad_staleness_parameter_names_the_field(field, bad):
  c = _hinge_config("hinge")
  # A section rebuilt from a dict, as from JSON: ConfigDict would turn True into 1.0 on a float field.
  c.fedasync = ml_collections.ConfigDict({**c.fedasync.to_dict(), field: bad})
  assert type(c.fedasync[field]) is type(bad)
  errors = [e for e in config_lib.config_errors(c) if e.startswith("fedasync.")]
  assert errors == [f"fedasync.{field}={bad!r} is invalid; allowed: a number >= 0"]  # finite: NaN, inf refused
  with pytest.raises(config_lib.ConfigError, match=f"fedasync\\.{field}="):
    config_lib.validate(c)


@pytest.mark.parametrize("field,good", [("a", 0.0), ("a", 2), ("hinge_a", 0.0), ("hinge_a", 3), ("hinge_b", 0),
                                        ("hinge_b", 2.5)])
def test_good_staleness_parameters_pass(field, good):
  c = _hinge_config("hinge")
  c.fedasync = ml_collections.ConfigDict({**c.fedasync.to_dict(), field: good})
  assert config_lib.config_errors(c) == []
