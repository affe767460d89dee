"""FedAvg's server (strategies/fedavg.py) against a hand computation: it waits for the whole cohort, then
takes the size-weighted average; with a cohort of one, each arrival is a round.
"""

from __future__ import annotations

import jax
import numpy as np

from fedpsa_jax import config as config_lib
from fedpsa_jax.strategies.fedavg import FedAvg
from helpers import _arrival, _close, _ctx, _np_tree, _tiny_delta, TINY


# --- FedAvg -----------------------------------------------------------------------------------------


def test_fedavg_waits_for_cohort_then_size_weighted_average():
  cfg = config_lib.base_config()
  cfg.method = "fedavg"
  strategy = FedAvg(cfg.fedavg, _ctx(num_clients=6, concurrency=3))
  assert strategy.dispatch_mode == "sync"
  state = strategy.init(TINY)
  rng = np.random.default_rng(0)
  w = _np_tree(TINY)
  sizes = [10, 40, 50]
  arrivals = [_arrival(i, _tiny_delta(rng), num_samples=n) for i, n in enumerate(sizes)]
  state, changed = strategy.receive(state, arrivals[:2])
  assert not changed
  _close(state.params, w)
  state, changed = strategy.receive(state, arrivals[2:])
  assert changed
  shares = np.array(sizes) / 100.0
  # Σ n_i w_i / Σ n with w_i = w + Δ_i
  models = [jax.tree.map(lambda x, d: x + d, w, _np_tree(a.delta)) for a in arrivals]
  _close(state.params, jax.tree.map(lambda *ms: sum(s * m for s, m in zip(shares, ms)), *models))
  # The next cohort starts from an empty buffer.
  state2, changed = strategy.receive(state, [arrivals[0]])
  assert not changed
  _close(state2.params, _np_tree(state.params))


def test_fedavg_one_at_a_time():
  cfg = config_lib.base_config()
  cfg.method = "fedavg"
  strategy = FedAvg(cfg.fedavg, _ctx(num_clients=6, concurrency=4))
  state = strategy.init(TINY)
  rng = np.random.default_rng(1)
  sizes = [7, 1, 3, 9]
  arrivals = [_arrival(i, _tiny_delta(rng), num_samples=n) for i, n in enumerate(sizes)]
  for i, a in enumerate(arrivals):
    state, changed = strategy.receive(state, [a])
    assert changed == (i == 3)
  shares = np.array(sizes) / 20.0
  _close(state.params, jax.tree.map(lambda x, *ds: x + sum(s * d for s, d in zip(shares, ds)), _np_tree(TINY),
                                    *[_np_tree(a.delta) for a in arrivals]))
