"""FedBuff's server (strategies/fedbuff.py) against a hand computation: a flush of K arrivals, and
same-time arrivals beyond the buffer aggregated at once, the next buffer starting empty.
"""

from __future__ import annotations

import jax
import numpy as np

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
