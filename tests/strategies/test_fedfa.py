"""FedFa's server (strategies/fedfa.py): the window of the latest K models, unchanged until it is full and
then their mean, against a hand computation in NumPy; the validation of its section.
"""

from __future__ import annotations

import jax
import numpy as np

from fedpsa_jax import config as config_lib
from fedpsa_jax.strategies.fedfa import FedFa
from helpers import (_add, _arrival, _close, _np_tree as _np, _random_like, baseline_cfg as _cfg, baseline_ctx as _ctx,
                     PARAMS0)


# --- FedFa ------------------------------------------------------------------------------------------


def test_fedfa_window_unchanged_until_full_then_mean_of_latest_k():
  k = 3
  strategy = FedFa(_cfg("fedfa", window_size=k).fedfa, _ctx())
  state = strategy.init(PARAMS0)
  rng = np.random.default_rng(1)
  w0 = _np(PARAMS0)
  arrivals = [_arrival(i % 4, _random_like(PARAMS0, rng, 0.1), start=_random_like(PARAMS0, rng)) for i in range(6)]
  models = [_add(_np(a.params_start), _np(a.delta)) for a in arrivals]
  mean = lambda ms: jax.tree.map(lambda *xs: sum(xs) / len(xs), *ms)
  # Before the window is full: no change, no round.
  for i in range(k - 1):
    state, changed = strategy.receive(state, [arrivals[i]])
    assert not changed
    _close(state.params, w0)
  # Full: every arrival recomputes w as the mean of the K latest client models.
  state, changed = strategy.receive(state, [arrivals[2]])
  assert changed
  _close(state.params, mean(models[0:3]))
  state, changed = strategy.receive(state, [arrivals[3]])
  assert changed and state.clients == (1, 2, 3)  # the oldest (client 0) dropped
  _close(state.params, mean(models[1:4]))
  # Two arrivals at one event time: both pushed, the two oldest dropped, one round.
  state, changed = strategy.receive(state, arrivals[4:6])
  assert changed and len(state.window) == k
  _close(state.params, mean(models[3:6]))


def test_fedfa_config_validation():
  assert any("fedfa.window_size=0 is invalid" in e for e in config_lib.config_errors(_cfg("fedfa", window_size=0)))
  assert config_lib.config_errors(_cfg("fedfa", num_clients=5)) == []  # K = 5 <= N
  assert any("fedfa.window_size=5 is invalid; allowed: an integer in [1, 4]" in e  # K > N = 4
             for e in config_lib.config_errors(_cfg("fedfa")))
  assert config_lib.base_config().fedfa.window_size == 5
