"""FedAsync's staleness functions have their own parameters, at the FedAsync paper's values (Xie et al., Sec. 5.2):
polynomial s(τ) = (τ + 1)^(-a) with a = 0.5; hinge s(τ) = 1 if τ <= b else 1 / (a (τ − b) + 1) with a = 10, b = 4
(`fedasync.hinge_a`, `fedasync.hinge_b`), no longer the polynomial's a. Each is validated, naming the field.

The strategy is checked through what it does: one arrival of staleness τ mixes w ← (1 − α s(τ)) w + α s(τ) w_i.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.models import TinyMLP
from fedpsa_jax.strategies import Arrival, StrategyContext
from fedpsa_jax.strategies.fedasync import FedAsync
from helpers import strategy_context
from numerics import assert_close, f32_tolerance

MODEL = TinyMLP(num_classes=3, hidden=5)
PARAMS0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 4), jnp.float32))
ALPHA = 0.6


def _ctx() -> StrategyContext:
  return strategy_context(MODEL, PARAMS0, num_clients=4, sizes=[10, 20, 30, 40], concurrency=2)


def _config(staleness: str) -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.method = "fedasync"
  c.fedasync.staleness = staleness  # every other field at its default
  return c


def test_defaults_are_the_fedasync_papers():
  f = config_lib.base_config().fedasync
  assert (f.a, f.hinge_a, f.hinge_b) == (0.5, 10.0, 4)
  assert "b" not in f  # the hinge's b is hinge_b now, beside its own hinge_a
  assert FedAsync.staleness_params(_config("hinge").fedasync) == (10.0, 4.0)
  assert FedAsync.staleness_params(_config("polynomial").fedasync)[0] == 0.5


# τ -> s(τ) by hand. Hinge, a = 10, b = 4: 1 up to τ = 4, then 1/(10 (τ − 4) + 1): τ = 5 -> 1/11, 7 -> 1/31,
# 12 -> 1/81. (With the polynomial's a = 0.5 the hinge would give 1/1.5, 1/2.5, 1/5.) Polynomial, a = 0.5:
# (τ + 1)^(-1/2): τ = 0 -> 1, 3 -> 1/2, 8 -> 1/3.
BY_HAND = [("hinge", 0, 1.0), ("hinge", 4, 1.0), ("hinge", 5, 1 / 11), ("hinge", 7, 1 / 31), ("hinge", 12, 1 / 81),
           ("polynomial", 0, 1.0), ("polynomial", 3, 1 / 2), ("polynomial", 8, 1 / 3)]


@pytest.mark.parametrize("staleness,tau,s", BY_HAND)
def test_default_staleness_weight_by_hand_through_the_mix(staleness, tau, s):
  strategy = FedAsync(_config(staleness), _ctx())
  rng = np.random.default_rng(tau)
  w = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), PARAMS0)
  start = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), PARAMS0)
  delta = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), PARAMS0)
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
  c = _config("hinge")
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
  c = _config("hinge")
  c.fedasync = ml_collections.ConfigDict({**c.fedasync.to_dict(), field: good})
  assert config_lib.config_errors(c) == []
