"""FedBuff's server (strategies/fedbuff.py) against a hand computation: a flush of K arrivals, and
same-time arrivals beyond the buffer aggregated at once, the next buffer starting empty; the four arms of its
weights' shape and step.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.strategies.fedbuff import FedBuff
from helpers import _arrival, _close, _ctx, _np_tree, _tiny_delta, TINY


def _fedbuff(k=3, server_lr=0.7):
  cfg = config_lib.base_config()
  cfg.method = "fedbuff"
  cfg.fedbuff.buffer_size = k
  cfg.fedbuff.server_lr = server_lr
  strategy = FedBuff(cfg.fedbuff, _ctx())
  return strategy, strategy.init(TINY)


def test_fedbuff_flush_by_hand():
  strategy, state = _fedbuff(k=3, server_lr=0.7)
  rng = np.random.default_rng(0)
  taus = [0, 1, 3]
  deltas = [_tiny_delta(rng) for _ in taus]
  w = _np_tree(TINY)
  for i, (tau, d) in enumerate(zip(taus, deltas)):
    state, changed = strategy.receive(state, [_arrival(i, d, staleness=tau)])
    assert changed == (i == 2)
    if not changed:
      _close(state.params, w)
  scale = [0.7 / 3 * (1.0 + t) ** -0.5 for t in taus]  # η (1/|buf|) (1+τ)^(-1/2)
  np.testing.assert_allclose(np.asarray(state.last_weights), scale, rtol=1e-6)
  expected = jax.tree.map(lambda a, *ds: a + sum(s * d for s, d in zip(scale, ds)), w,
                          *[_np_tree(d) for d in deltas])
  _close(state.params, expected)
  assert state.deltas == ()


def test_fedbuff_same_time_overflow_and_next_buffer_starts_empty():
  strategy, state = _fedbuff(k=2, server_lr=1.0)
  rng = np.random.default_rng(1)
  taus = [2, 0, 8]
  group = [_arrival(i, _tiny_delta(rng), staleness=t) for i, t in enumerate(taus)]
  w = _np_tree(TINY)
  state, changed = strategy.receive(state, group)
  assert changed
  scale = [(1.0 + t) ** -0.5 / 3 for t in taus]
  w = jax.tree.map(lambda a, *ds: a + sum(s * d for s, d in zip(scale, ds)), w,
                   *[_np_tree(a.delta) for a in group])
  _close(state.params, w)
  # One more arrival alone is below K again: no flush, params unchanged.
  state, changed = strategy.receive(state, [_arrival(5, _tiny_delta(rng), staleness=1)])
  assert not changed
  _close(state.params, w)


def _fedbuff_arm(weighting, step, k=3, server_lr=0.7):
  cfg = config_lib.base_config()
  cfg.method = "fedbuff"
  cfg.fedbuff.update(buffer_size=k, server_lr=server_lr, weighting=weighting, step=step)
  strategy = FedBuff(cfg.fedbuff, _ctx())
  return strategy, strategy.init(TINY)


# The four arms of FedBuff's weights (shape × step), by hand for staleness τ = 0, 1, 3 and η = 0.7:
# s = (1 + τ)^(-1/2) = 1, 0.7071, 0.5; FedBuff's step Σ s / 3 = 0.7357.
_S = np.array([1.0, 2 ** -0.5, 0.5])
_ARMS = {
    ("staleness", "staleness"): 0.7 * _S / 3,  # FedBuff itself
    ("staleness", "unit"): 0.7 * _S / _S.sum(),  # renormalised to sum 1
    ("uniform", "unit"): np.full(3, 0.7 / 3),  # 1/B: FedPSA without κ
    ("uniform", "staleness"): np.full(3, 0.7 * _S.sum() / 9),  # equal, FedBuff's sum
}


@pytest.mark.parametrize("weighting,step", list(_ARMS))
def test_weighting_and_step_arms_by_hand(weighting, step):
  strategy, state = _fedbuff_arm(weighting, step)
  rng = np.random.default_rng(2)
  deltas = [_tiny_delta(rng) for _ in range(3)]
  w = _np_tree(TINY)
  state, changed = strategy.receive(state, [_arrival(i, d, staleness=t) for i, (t, d) in enumerate(zip([0, 1, 3], deltas))])
  assert changed
  expected_weights = _ARMS[(weighting, step)]
  np.testing.assert_allclose(np.asarray(state.last_weights), expected_weights, rtol=1e-6)
  total = {"staleness": 0.7 * _S.mean(), "unit": 0.7}[step]
  np.testing.assert_allclose(np.sum(state.last_weights), total, rtol=1e-6)
  expected = jax.tree.map(lambda a, *ds: a + sum(s * d for s, d in zip(expected_weights, ds)), w,
                          *[_np_tree(d) for d in deltas])
  _close(state.params, expected)


def test_default_arm_is_fedbuff_bit_for_bit():
  # The defaults compute η s(τ_i) / B exactly as FedBuff always has (records and checkpoints stay comparable).
  strategy, _ = _fedbuff_arm("staleness", "staleness", k=4, server_lr=0.3)
  taus = [0, 2, 5, 11]
  old = (0.3 * (1.0 + np.asarray(taus, np.float32)) ** -0.5 / np.float32(4)).astype(np.float32)
  np.testing.assert_array_equal(strategy.flush_weights(taus), old)


@pytest.mark.parametrize("field,bad", [("weighting", "kappa"), ("step", "half"), ("step", "UNIT")])
def test_bad_arm_fields_name_the_field(field, bad):
  cfg = config_lib.base_config()
  cfg.method = "fedbuff"
  cfg.fedbuff[field] = bad
  errors = FedBuff.validate_config(cfg)
  assert len(errors) == 1 and errors[0].startswith(f"fedbuff.{field}={bad!r} is invalid; allowed:"), errors
