"""CA2FL's server (strategies/ca2fl.py): the clients' cached updates and the calibrated update against a
hand computation in NumPy, and the validation of its section.
"""

from __future__ import annotations

import numpy as np

from fedpsa_jax import config as config_lib
from fedpsa_jax.strategies.ca2fl import CA2FL
from helpers import (_add, _arrival, _close, _np_tree as _np, _random_like, baseline_cfg as _cfg, baseline_ctx as _ctx,
                     PARAMS0)


# --- CA2FL ------------------------------------------------------------------------------------------


def test_ca2fl_caches_and_calibrated_update_by_hand():
  """N = 4, K = 2, η = 0.5 over four rounds, the last two with repeat clients and a same-time pair."""
  eta, n = 0.5, 4
  strategy = CA2FL(_cfg("ca2fl", buffer_size=2, server_lr=eta).ca2fl, _ctx(num_clients=n))
  state = strategy.init(PARAMS0)
  rng = np.random.default_rng(0)
  d = {name: _random_like(PARAMS0, rng, 0.1) for name in "abcdefgh"}
  D = {k: _np(v) for k, v in d.items()}
  w0 = _np(PARAMS0)

  # Round 1: c0 sends a, c1 sends b. First arrivals: calibrated = Δ; h (old) = 0.
  state, changed = strategy.receive(state, [_arrival(0, d["a"])])
  assert not changed and state.members == (0,)
  _close(state.params, w0)
  _close(state.calibrated, D["a"])
  state, changed = strategy.receive(state, [_arrival(1, d["b"])])
  assert changed and state.members == ()
  w1 = _add(w0, D["a"], D["b"], scales=[1, eta / 2, eta / 2])  # w + η (D/|S| + 0)
  _close(state.params, w1)
  h1 = _add(D["a"], D["b"], scales=[1 / n, 1 / n])  # never-seen c2, c3 count as 0
  _close(state.cache_mean, h1)
  assert sorted(state.caches) == [0, 1]

  # Round 2: c0 again (calibrated by its cache a), then c2 and c3 at the same time: |S| = 3 > K.
  state, changed = strategy.receive(state, [_arrival(0, d["c"])])
  assert not changed
  _close(state.calibrated, _add(D["c"], D["a"], scales=[1, -1]))
  state, changed = strategy.receive(state, [_arrival(2, d["d"]), _arrival(3, d["e"])])
  assert changed
  calibrated = _add(D["c"], D["a"], D["d"], D["e"], scales=[1, -1, 1, 1])
  w2 = _add(w1, calibrated, h1, scales=[1, eta / 3, eta])  # v uses the h of the previous round
  _close(state.params, w2)
  h2 = _add(D["c"], D["b"], D["d"], D["e"], scales=[1 / n] * 4)
  _close(state.cache_mean, h2)
  _close(state.caches[0], D["c"])

  # Round 3: c1 (cache b) and c2 (cache d).
  state, _ = strategy.receive(state, [_arrival(1, d["f"])])
  state, changed = strategy.receive(state, [_arrival(2, d["g"])])
  assert changed
  calibrated = _add(D["f"], D["b"], D["g"], D["d"], scales=[1, -1, 1, -1])
  w3 = _add(w2, calibrated, h2, scales=[1, eta / 2, eta])
  _close(state.params, w3)
  _close(state.cache_mean, _add(D["c"], D["f"], D["g"], D["e"], scales=[1 / n] * 4))
  _close(state.cache_sum, _add(D["c"], D["f"], D["g"], D["e"]))
  assert strategy.diagnostics(state)["cached_clients"] == 4


def test_ca2fl_config_validation():
  cfg = _cfg("ca2fl", num_clients=4, buffer_size=5)
  assert any("ca2fl.buffer_size=5 is invalid" in e for e in config_lib.config_errors(cfg))
  cfg = _cfg("ca2fl", server_lr=0.0, buffer_size=2)
  assert any("ca2fl.server_lr=0.0 is invalid" in e for e in config_lib.config_errors(cfg))
  assert config_lib.config_errors(_cfg("ca2fl", buffer_size=2)) == []
