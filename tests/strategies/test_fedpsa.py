"""FedPSA's server (strategies/fedpsa.py) on hand-made arrivals, against Algorithm 1 written out in NumPy
(`RefFedPSA`): uniform weights until the queue fills, then the softmax of κ / Temp; overflow at one time; the
client's sensitivity sketch; the w/o T and w/o S ablations and the fixed-temperature "w/o T" readings with their
validation; and the server's work per round.

κ is controlled through the payloads: the test sets the state's `global_sketch` and gives each arrival a
k-vector of its choice, so κ = cos(payload, global_sketch) is known by hand (Eq. 19: Weight_i =
exp(κ_i / Temp) / Σ_j exp(κ_j / Temp)).

A round is counted where XLA runs it (`pxla.ExecuteReplicated.__call__`), with JAX's C++ dispatch fast path
turned off for the span (it would run a cached executable without passing through Python), so every jitted
function and every eager op counts: two jitted calls at the flush (the aggregation, the new global model's
sketch), none at the receives before it; a hidden per-arrival op would show.
"""

from __future__ import annotations

import collections
import contextlib
import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax._src import pjit
from jax._src.interpreters import pxla

from fedpsa_jax import config as config_lib
from fedpsa_jax import seeding, sensitivity, checkpoint
from fedpsa_jax.strategies import Arrival
from fedpsa_jax.strategies import fedpsa as fedpsa_lib
from fedpsa_jax.strategies.fedpsa import FedPSA
from helpers import (_arrival, _calibration, _close, _ctx, _flat, _np_tree, _random_like, _readings_ctx, small_config,
                     AGGREGATION_TOL, DELTA, GAMMA, K_SKETCH, NUM_CLASSES, PARAMS0, PARAMS_KEY0)
from numerics import assert_close, f32_tolerance


# Sketches R θ (d = 43 parameters per entry) and R s, whose Eq. 8 sensitivity s = |gθ − ½Fθ²| sums the 8
# calibration samples' gradients and then cancels two terms of its own.
RAW_SKETCH_TOL = f32_tolerance(43)


SKETCH_TOL = f32_tolerance(43 * 8, depth=3)


def _cos(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  return e / e.sum()


def _fedpsa(buffer_size=2, queue_length=3, gamma=1.0, delta=0.2, no_temperature=False,
            no_sensitivity=False, seed=0, projection="gaussian"):
  cfg = config_lib.base_config()
  cfg.fedpsa.projection = projection
  cfg.seed = seed
  cfg.fedpsa.sketch_dim = K_SKETCH
  cfg.runtime.fisher_chunk_size = 4
  cfg.fedpsa.calibration, cfg.fedpsa.calibration_size = "real", 8  # the test's batch (_calibration)
  cfg.fedpsa.buffer_size = buffer_size
  cfg.fedpsa.queue_length = queue_length
  cfg.fedpsa.gamma = gamma
  cfg.fedpsa.delta = delta
  cfg.fedpsa.no_temperature = no_temperature
  cfg.fedpsa.no_sensitivity = no_sensitivity
  strategy = FedPSA(cfg.fedpsa, _ctx(seed=seed, runtime=cfg.runtime))
  return strategy, strategy.init(PARAMS0)


def _projection(seed, d):
  return np.asarray(sensitivity.projection_matrix(seeding.device_key(seed, "fedpsa/projection"), K_SKETCH, d),
                    np.float64)


def _hand_sensitivity_flat(params, x, y) -> np.ndarray:
  """Eq. 8 for TinyMLP, by hand in float64: per-sample gradients of softmax cross-entropy by backprop,
  g = their mean, F = mean of their squares, s = |g θ − ½ F θ²|; raveled with `_flat`'s order."""
  p = _np_tree(params)["params"]
  w1, b1 = p["Dense_0"]["kernel"], p["Dense_0"]["bias"]
  w2, b2 = p["Dense_1"]["kernel"], p["Dense_1"]["bias"]
  x, y = np.asarray(x, np.float64), np.asarray(y)
  grads = []
  for xi, yi in zip(x, y):
    pre = xi @ w1 + b1
    h = np.maximum(pre, 0.0)
    z = h @ w2 + b2
    prob = np.exp(z - z.max())
    prob /= prob.sum()
    dz = prob - np.eye(NUM_CLASSES)[yi]
    dh = (w2 @ dz) * (pre > 0)
    tree = {"params": {"Dense_0": {"kernel": np.outer(xi, dh), "bias": dh},
                       "Dense_1": {"kernel": np.outer(h, dz), "bias": dz}}}
    grads.append(_flat(tree))
  grads = np.stack(grads)
  g, f = grads.mean(0), (grads**2).mean(0)
  theta = _flat(_np_tree(params))
  return np.abs(g * theta - 0.5 * f * theta**2)


class RefFedPSA:
  """Algorithm 1's server, written from the paper (Sec. 5.5) with plain Python/NumPy."""

  def __init__(self, params, buffer_size, queue_length, gamma, delta, no_temperature=False):
    self.params = _np_tree(params)
    self.ls, self.lq, self.gamma, self.delta = buffer_size, queue_length, gamma, delta
    self.no_temperature = no_temperature
    self.queue = collections.deque(maxlen=queue_length)
    self.pushes = 0
    self.m0 = None
    self.temp = gamma + delta
    self.buffer = []  # (Δ as numpy tree, κ, m)
    self.last_weights = self.last_kappas = self.last_norms = None

  def receive(self, arrivals, global_sketch):
    for a in arrivals:
      d = _np_tree(a.delta)
      kappa, m = _cos(a.payload, global_sketch), float(np.sum(_flat(d) ** 2))
      self.buffer.append((d, kappa, m))
      self.queue.append(m)
      self.pushes += 1
      if self.pushes == self.lq:
        self.m0 = float(np.mean(self.queue))
      if self.pushes >= self.lq and not self.no_temperature:
        self.temp = float(np.mean(self.queue)) / self.m0 * self.gamma + self.delta
    if len(self.buffer) < self.ls:
      return False
    kappas = np.array([k for _, k, _ in self.buffer])
    if self.no_temperature or self.pushes >= self.lq:
      weights = _softmax(kappas / self.temp)
    else:
      weights = np.full(len(kappas), 1.0 / len(kappas))
    deltas = [d for d, _, _ in self.buffer]
    self.params = jax.tree.map(lambda w, *ds: w + sum(wt * di for wt, di in zip(weights, ds)),
                               self.params, *deltas)
    self.last_weights, self.last_kappas = weights, kappas
    self.last_norms = np.array([m for _, _, m in self.buffer])
    self.buffer = []
    return True


# --- FedPSA -----------------------------------------------------------------------------------------


def test_fedpsa_uniform_weights_before_queue_full_and_flush_is_mean():
  strategy, state = _fedpsa(buffer_size=2, queue_length=3)
  rng = np.random.default_rng(0)
  g = rng.normal(size=K_SKETCH)
  state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  w = _np_tree(state.params)
  d1, d2 = _random_like(PARAMS0, rng, 0.1), _random_like(PARAMS0, rng, 0.1)
  # Very different κ, so softmax weights would be far from uniform.
  p1, p2 = jnp.asarray(g, jnp.float32), jnp.asarray(-g, jnp.float32)
  state, changed = strategy.receive(state, [_arrival(0, d1, p1)])
  assert not changed
  _close(state.params, w)
  state, changed = strategy.receive(state, [_arrival(1, d2, p2)])
  assert changed
  np.testing.assert_allclose(np.asarray(state.last_weights), [0.5, 0.5], rtol=1e-6)
  _close(state.params, jax.tree.map(lambda a, b, c: a + (b + c) / 2, w, _np_tree(d1), _np_tree(d2)))
  # The recorded κ are the hand cosines (+1 and −1).
  assert_close(state.last_kappas, [1.0, -1.0], f32_tolerance(K_SKETCH))  # cosines of K_SKETCH-vectors


def test_fedpsa_uniform_for_several_flushes_then_softmax_once_queue_full():
  # L_s = 2, L_q = 5: flushes after 2 and 4 pushes are uniform; the one after 6 is softmax.
  gamma, delta = 0.5, 0.1
  strategy, state = _fedpsa(buffer_size=2, queue_length=5, gamma=gamma, delta=delta)
  rng = np.random.default_rng(1)
  g = rng.normal(size=K_SKETCH)
  flush_weights = []
  for step in range(6):
    state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
    payload = jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32)
    state, changed = strategy.receive(state, [_arrival(step, _random_like(PARAMS0, rng, 0.1), payload)])
    assert changed == (step % 2 == 1)
    if changed:
      flush_weights.append(np.asarray(state.last_weights))
  np.testing.assert_allclose(flush_weights[0], [0.5, 0.5], rtol=1e-6)
  np.testing.assert_allclose(flush_weights[1], [0.5, 0.5], rtol=1e-6)
  assert abs(flush_weights[2][0] - 0.5) > 1e-3  # softmax now


def test_fedpsa_m0_fixed_at_first_fill_while_queue_rolls():
  # L_s = 2, L_q = 3: the queue first fills in the middle of the second round (push 3 of 4), so M0 is the mean
  # of the first three norms, not of the queue as the round leaves it. The thermometer is updated at flushes.
  lq = 3
  gamma, delta = 2.0, 0.3
  strategy, state = _fedpsa(buffer_size=2, queue_length=lq, gamma=gamma, delta=delta)
  rng = np.random.default_rng(2)
  g = jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32)
  norms = []
  for step in range(9):
    state = state.replace(global_sketch=g)
    d = _random_like(PARAMS0, rng, 0.05 * (step + 1))  # growing norms, so every window differs
    norms.append(float(np.sum(_flat(_np_tree(d)) ** 2)))
    before = state
    state, changed = strategy.receive(state, [_arrival(step, d, jnp.asarray(rng.normal(size=K_SKETCH)))])
    assert changed == (step % 2 == 1)
    if not changed:  # no flush: the thermometer is the last flush's, untouched
      assert state.queue is before.queue and state.m0 is before.m0 and state.temperature is before.temperature
      assert state.queue_count == before.queue_count == 2 * (step // 2)
      continue
    assert state.queue_count == step + 1
    if step + 1 < lq:
      assert float(state.m0) == 0.0
      np.testing.assert_allclose(float(state.temperature), gamma + delta, rtol=1e-6)
      continue
    m0 = np.mean(norms[:lq])
    np.testing.assert_allclose(float(state.m0), m0, rtol=1e-5)
    # The queue holds exactly the last L_q norms (a ring: compare as a multiset).
    np.testing.assert_allclose(np.sort(np.asarray(state.queue)), np.sort(norms[-lq:]), rtol=1e-5)
    m_cur = np.mean(norms[-lq:])
    np.testing.assert_allclose(float(state.temperature), m_cur / m0 * gamma + delta, rtol=1e-5)
  # After 8 pushes the window has moved well away from the first fill.
  assert np.mean(norms[-lq - 1:-1]) > 5 * np.mean(norms[:lq])


def test_fedpsa_softmax_weights_and_params_after_queue_full():
  lq, ls, gamma, delta = 3, 2, 1.0, 0.2
  strategy, state = _fedpsa(buffer_size=ls, queue_length=lq, gamma=gamma, delta=delta)
  rng = np.random.default_rng(3)
  norms = []
  # Fill the queue: 4 pushes (two flushes), norms recorded by hand.
  for step in range(4):
    d = _random_like(PARAMS0, rng, 0.1 + 0.1 * step)
    norms.append(float(np.sum(_flat(_np_tree(d)) ** 2)))
    state, _ = strategy.receive(state, [_arrival(step, d, jnp.asarray(rng.normal(size=K_SKETCH)))])
  # Now a flush with κ known by hand.
  g = rng.normal(size=K_SKETCH)
  state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  w = _np_tree(state.params)
  d1, d2 = _random_like(PARAMS0, rng, 0.02), _random_like(PARAMS0, rng, 0.3)
  p1 = g + 0.3 * rng.normal(size=K_SKETCH)  # well aligned
  p2 = -g + 0.5 * rng.normal(size=K_SKETCH)  # badly aligned
  kappas = np.array([_cos(p1, g), _cos(p2, g)])
  state, changed = strategy.receive(state, [_arrival(7, d1, jnp.asarray(p1, jnp.float32))])
  assert not changed
  norms.append(float(np.sum(_flat(_np_tree(d1)) ** 2)))
  state, changed = strategy.receive(state, [_arrival(8, d2, jnp.asarray(p2, jnp.float32))])
  assert changed
  norms.append(float(np.sum(_flat(_np_tree(d2)) ** 2)))
  m0 = np.mean(norms[:lq])
  temp = np.mean(norms[-lq:]) / m0 * gamma + delta
  weights = _softmax(kappas / temp)
  assert weights[0] > 0.6  # really non-uniform
  np.testing.assert_allclose(float(state.temperature), temp, rtol=1e-5)
  assert_close(state.last_kappas, kappas, f32_tolerance(K_SKETCH))
  np.testing.assert_allclose(np.asarray(state.last_weights), weights, rtol=1e-5)
  expected = jax.tree.map(lambda a, b, c: a + weights[0] * b + weights[1] * c, w, _np_tree(d1), _np_tree(d2))
  _close(state.params, expected)


def test_fedpsa_matches_reference_on_random_sequence():
  # The reference updates its thermometer per arrival; the strategy defers all of it to the flush. Params must
  # agree after every receive (unchanged between flushes) and the thermometer, κ, m and weights at each flush.
  ls, lq, gamma, delta = 3, 4, 0.8, 0.1
  strategy, state = _fedpsa(buffer_size=ls, queue_length=lq, gamma=gamma, delta=delta)
  ref = RefFedPSA(PARAMS0, ls, lq, gamma, delta)
  rng = np.random.default_rng(4)
  g = rng.normal(size=K_SKETCH)
  state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  flushes, filled_at = 0, None
  for step in range(25):
    group = [_arrival(10 * step + j, _random_like(PARAMS0, rng, rng.uniform(0.01, 0.3)),
                      jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32))
             for j in range(int(rng.integers(1, 4)))]
    params_before = state.params
    state, changed = strategy.receive(state, group)
    assert changed == ref.receive(group, g)
    _close(state.params, ref.params)
    if not changed:
      assert state.params is params_before
      continue
    flushes += 1
    filled_at = ref.pushes if filled_at is None and ref.m0 is not None else filled_at
    assert state.queue_count == ref.pushes
    np.testing.assert_allclose(float(state.m0), 0.0 if ref.m0 is None else ref.m0, rtol=1e-5)
    queue = list(ref.queue) + [0.0] * (lq - len(ref.queue))  # (the ring starts as zeros)
    np.testing.assert_allclose(np.sort(np.asarray(state.queue)), np.sort(queue), rtol=1e-5)
    np.testing.assert_allclose(float(state.temperature), ref.temp, rtol=1e-5)
    assert_close(state.last_kappas, ref.last_kappas, f32_tolerance(K_SKETCH))
    np.testing.assert_allclose(np.asarray(state.last_norms), ref.last_norms, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state.last_weights), ref.last_weights, rtol=1e-5)
    g = rng.normal(size=K_SKETCH)  # a new global sketch for the next round, set in both
    state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  assert flushes >= 8
  # The queue first filled inside a round (not at its last push): M0 then differs from the queue's mean at the flush.
  assert filled_at > lq


def test_fedpsa_changed_only_at_flush_and_state_after_flush():
  strategy, state = _fedpsa(buffer_size=3, queue_length=50)
  rng = np.random.default_rng(5)
  arrivals = [_arrival(i, _random_like(PARAMS0, rng, 0.1), jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32))
              for i in range(3)]
  w = _np_tree(state.params)
  for i, a in enumerate(arrivals):
    state, changed = strategy.receive(state, [a])
    assert changed == (i == 2)
    if not changed:
      assert len(state.deltas) == i + 1 and state.sketches == tuple(a.payload for a in arrivals[:i + 1])
      _close(state.params, w)
  assert state.deltas == () and state.sketches == ()
  new = jax.tree.map(lambda a, *ds: a + sum(ds) / 3, w, *[_np_tree(a.delta) for a in arrivals])
  _close(state.params, new)
  # The global sketch is refreshed: Eq. 8 sensitivity of the new params, sketched with R, by hand.
  x, y = _calibration()
  R = _projection(0, sensitivity.num_params(PARAMS0))
  expected_sketch = R @ _hand_sensitivity_flat(state.params, x, y)
  assert_close(state.global_sketch, expected_sketch, SKETCH_TOL)
  before = R @ _hand_sensitivity_flat(PARAMS0, x, y)
  assert np.linalg.norm(expected_sketch - before) > 1e-3 * np.linalg.norm(before)


def test_fedpsa_client_payload_is_sensitivity_sketch_of_trained_params():
  strategy, state = _fedpsa()
  rng = np.random.default_rng(6)
  start = PARAMS0
  end = jax.tree.map(lambda a, b: a + b, PARAMS0, _random_like(PARAMS0, rng, 0.5))
  x, y = _calibration()
  R = _projection(0, sensitivity.num_params(PARAMS0))
  assert_close(strategy.client.payload(start, end, None), R @ _hand_sensitivity_flat(end, x, y), SKETCH_TOL)
  assert_close(state.global_sketch, R @ _hand_sensitivity_flat(PARAMS0, x, y), SKETCH_TOL)


def test_fedpsa_same_time_overflow_aggregated_at_once():
  strategy, state = _fedpsa(buffer_size=2, queue_length=50)
  rng = np.random.default_rng(7)
  w = _np_tree(state.params)
  first = _arrival(0, _random_like(PARAMS0, rng, 0.1), jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32))
  state, changed = strategy.receive(state, [first])
  assert not changed
  group = [_arrival(i, _random_like(PARAMS0, rng, 0.1), jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32))
           for i in (1, 2, 3)]
  state, changed = strategy.receive(state, group)
  assert changed
  assert np.asarray(state.last_weights).shape == (4,)
  np.testing.assert_allclose(np.asarray(state.last_weights), np.full(4, 0.25), rtol=1e-6)
  deltas = [_np_tree(a.delta) for a in [first, *group]]
  _close(state.params, jax.tree.map(lambda a, *ds: a + sum(ds) / 4, w, *deltas))
  assert state.deltas == () and state.sketches == ()


def test_fedpsa_overflow_with_softmax_weights():
  gamma, delta = 0.3, 0.1
  strategy, state = _fedpsa(buffer_size=2, queue_length=50, gamma=gamma, delta=delta, no_temperature=True)
  rng = np.random.default_rng(8)
  g = rng.normal(size=K_SKETCH)
  state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  w = _np_tree(state.params)
  payloads = [rng.normal(size=K_SKETCH) for _ in range(3)]
  group = [_arrival(i, _random_like(PARAMS0, rng, 0.1), jnp.asarray(p, jnp.float32))
           for i, p in enumerate(payloads)]
  state, changed = strategy.receive(state, group)
  assert changed
  weights = _softmax(np.array([_cos(p, g) for p in payloads]) / (gamma + delta))
  np.testing.assert_allclose(np.asarray(state.last_weights), weights, rtol=1e-5)
  _close(state.params, jax.tree.map(lambda a, *ds: a + sum(wt * d for wt, d in zip(weights, ds)), w,
                                    *[_np_tree(a.delta) for a in group]))


def test_fedpsa_no_temperature_softmax_from_first_flush_and_fixed_temp():
  gamma, delta = 0.4, 0.1
  lq = 3
  strategy, state = _fedpsa(buffer_size=2, queue_length=lq, gamma=gamma, delta=delta, no_temperature=True)
  rng = np.random.default_rng(9)
  for flush in range(4):  # the queue fills and rolls, the temperature must not move
    g = rng.normal(size=K_SKETCH)
    state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
    w = _np_tree(state.params)
    payloads = [g + 0.2 * rng.normal(size=K_SKETCH), -g + 0.2 * rng.normal(size=K_SKETCH)]
    deltas = [_random_like(PARAMS0, rng, 0.1 * (flush + 1)) for _ in payloads]
    for i, (p, d) in enumerate(zip(payloads, deltas)):
      state, changed = strategy.receive(state, [_arrival(i, d, jnp.asarray(p, jnp.float32))])
    assert changed
    weights = _softmax(np.array([_cos(p, g) for p in payloads]) / (gamma + delta))
    assert weights[0] > 0.9
    np.testing.assert_allclose(float(state.temperature), gamma + delta, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.last_weights), weights, rtol=1e-5)
    _close(state.params, jax.tree.map(lambda a, b, c: a + weights[0] * b + weights[1] * c, w,
                                      *[_np_tree(d) for d in deltas]))


@pytest.mark.parametrize("no_temperature", [False, True])
def test_fedpsa_no_sensitivity_sketches_raw_params(no_temperature):
  seed = 5
  strategy, state = _fedpsa(no_sensitivity=True, no_temperature=no_temperature, seed=seed)
  R = _projection(seed, sensitivity.num_params(PARAMS0))
  rng = np.random.default_rng(10)
  end = jax.tree.map(lambda a, b: a + b, PARAMS0, _random_like(PARAMS0, rng, 0.5))
  assert_close(strategy.client.payload(PARAMS0, end, None), R @ _flat(_np_tree(end)), RAW_SKETCH_TOL)
  assert_close(state.global_sketch, R @ _flat(_np_tree(PARAMS0)), RAW_SKETCH_TOL)
  # κ from these sketches drives the flush; after it the global sketch is R θ_new.
  g = R @ _flat(_np_tree(PARAMS0))
  p = [np.asarray(strategy.client.payload(PARAMS0, end, None)), -g]
  deltas = [_random_like(PARAMS0, rng, 0.1), _random_like(PARAMS0, rng, 0.1)]
  w = _np_tree(state.params)
  state, _ = strategy.receive(state, [_arrival(0, deltas[0], jnp.asarray(p[0]))])
  state, changed = strategy.receive(state, [_arrival(1, deltas[1], jnp.asarray(p[1], jnp.float32))])
  assert changed
  kappas = np.array([_cos(p[0], g), _cos(p[1], g)])
  assert_close(state.last_kappas, kappas, RAW_SKETCH_TOL + f32_tolerance(K_SKETCH))
  # With the thermometer (queue of 3 not yet full) weights are uniform; without it, softmax(κ/(γ+δ)).
  weights = _softmax(kappas / (1.0 + 0.2)) if no_temperature else np.array([0.5, 0.5])
  np.testing.assert_allclose(np.asarray(state.last_weights), weights, rtol=1e-5)
  _close(state.params, jax.tree.map(lambda a, b, c: a + weights[0] * b + weights[1] * c, w,
                                    *[_np_tree(d) for d in deltas]))
  assert_close(state.global_sketch, R @ _flat(_np_tree(state.params)), RAW_SKETCH_TOL)


def test_fedpsa_sensitivity_sketch_differs_from_param_sketch():
  # The default mode must not silently sketch raw parameters (the ablation switch must matter).
  s_default, _ = _fedpsa(no_sensitivity=False)
  s_ablate, _ = _fedpsa(no_sensitivity=True)
  a = np.asarray(s_default.client.payload(PARAMS0, PARAMS0, None))
  b = np.asarray(s_ablate.client.payload(PARAMS0, PARAMS0, None))
  assert abs(_cos(a, b)) < 0.99


NUM_PARAMS = sum(np.size(x) for x in jax.tree.leaves(PARAMS0))


@contextlib.contextmanager
def count_executions():
  """Yields a Counter of XLA executions by program name ('jit(_aggregate)', 'jit(add)', ...) made inside the
  block. JAX's caches are cleared on entry and exit, so no call inside can take the C++ path."""
  counts: collections.Counter[str] = collections.Counter()
  call, fastpath = pxla.ExecuteReplicated.__call__, pjit._get_fastpath_data

  def counted_call(self, *args):
    counts[self.name] += 1
    return call(self, *args)

  pxla.ExecuteReplicated.__call__ = counted_call
  pjit._get_fastpath_data = lambda *args, **kwargs: None  # no fast-path entry: every call goes through Python
  jax.clear_caches()
  try:
    yield counts
  finally:
    pxla.ExecuteReplicated.__call__, pjit._get_fastpath_data = call, fastpath
    jax.clear_caches()


def _arrivals(rng, n: int, first: int = 0) -> list:
  return [_arrival(first + i, _random_like(PARAMS0, rng, rng.uniform(0.01, 0.3)),
                   jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32)) for i in range(n)]


def _groups(items: list, sizes: tuple[int, ...]) -> list[list]:
  starts = np.cumsum((0, *sizes))
  assert starts[-1] == len(items)
  return [items[a:b] for a, b in zip(starts[:-1], starts[1:])]


def test_counter_sees_eager_ops_and_the_fast_path():
  # The counter itself: an eager op and a warm jitted function (cached, so normally on the C++ path) count.
  f = jax.jit(lambda x: x * 2)
  x = jnp.arange(3.0)
  f(x), f(x)
  with count_executions() as counts:
    f(x), f(x), x + 1, x[1]
  assert counts["jit(<lambda>)"] == 2 and sum(counts.values()) >= 4, counts


@pytest.mark.slow
@pytest.mark.parametrize("buffer_size,sizes", [(3, (1, 1, 1)), (9, (1,) * 9), (9, (2, 3, 4)), (3, (1, 3))])
def test_a_round_is_two_jitted_calls_however_many_arrivals(buffer_size, sizes):
  strategy, state = _fedpsa(buffer_size=buffer_size, queue_length=4)
  rng = np.random.default_rng(0)
  # Two rounds: the queue (L_q = 4) fills during the first or the second, and both are counted.
  rounds = [_groups(_arrivals(rng, sum(sizes), 100 * r), sizes) for r in range(2)]
  for groups in rounds:
    for group in groups[:-1]:
      with count_executions() as counts:
        state, changed = strategy.receive(state, group)
      assert not changed and sum(counts.values()) == 0, counts  # no device work before the flush
    with count_executions() as counts:
      state, changed = strategy.receive(state, groups[-1])
    # (The aggregation, then the new global model's sketch: sensitivity.sketch_of, one program.)
    assert changed and counts == {"jit(_aggregate)": 1, "jit(sketch_of)": 1}, counts
    with count_executions() as counts:
      diagnostics = strategy.diagnostics(state)
    assert sum(counts.values()) == 0, counts
    assert isinstance(diagnostics["temperature"], jax.Array) and diagnostics["kappa"].shape == (sum(sizes),)
  assert state.queue_count == 2 * sum(sizes) >= 4 and float(state.m0) > 0


@pytest.mark.slow
def test_event_records_hold_kappa_and_norm_of_each_arrival_at_and_between_flushes():
  strategy, state = _fedpsa(buffer_size=3, queue_length=4)
  # A stand-in for the Fig. 6 alignment (the test's context has no test split): known values per arrival.
  strategy._alignment_fn = jax.jit(lambda server, starts, deltas: 0.25 + jnp.arange(len(deltas), dtype=jnp.float32))
  rng = np.random.default_rng(1)
  g = rng.normal(size=K_SKETCH)
  state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  # Receives of 1 and 1 arrival (buffered), then 3 at once (a flush of 5, overflowing L_s = 3), then 2 (buffered
  # against the new global sketch).
  for group, flush in ((_arrivals(rng, 1), False), (_arrivals(rng, 1, 10), False), (_arrivals(rng, 3, 20), True),
                       (_arrivals(rng, 2, 30), False)):
    sketch = np.asarray(state.global_sketch, np.float64)  # what κ compares against: the sketch before the flush
    state, changed = strategy.receive(state, group)
    assert changed == flush
    with count_executions() as counts:
      records = strategy.event_records(state, group)
    assert sum(counts.values()) == 1, counts  # one small call: computed now, or picked from the flush's vectors
    records = jax.device_get(records)
    assert [set(r) for r in records] == [{"kappa", "delta_sq_norm", "alignment"}] * len(group)
    kappas = [_cos(a.payload, sketch) for a in group]
    norms = [float(np.sum(_flat(_np_tree(a.delta)) ** 2)) for a in group]
    assert_close([r["kappa"] for r in records], kappas, f32_tolerance(K_SKETCH))
    assert_close([r["delta_sq_norm"] for r in records], norms, f32_tolerance(NUM_PARAMS))
    np.testing.assert_array_equal([r["alignment"] for r in records], 0.25 + np.arange(len(group)))
    if flush:  # the flush's own vectors: the buffered 2 first, then these 3
      assert_close(state.last_norms[-3:], norms, f32_tolerance(NUM_PARAMS))
      assert state.last_kappas.shape == state.last_norms.shape == (5,)


@pytest.mark.slow
def test_checkpoint_mid_buffer_then_continuing_gives_the_same_params_bit_for_bit(tmp_path):
  lq, ls, gamma, delta = 4, 3, 0.8, 0.1
  strategy, state = _fedpsa(buffer_size=ls, queue_length=lq, gamma=gamma, delta=delta)
  ref = RefFedPSA(PARAMS0, ls, lq, gamma, delta)
  rng = np.random.default_rng(2)
  g = np.asarray(state.global_sketch, np.float64)
  before, after = _groups(_arrivals(rng, 5), (2, 1, 2)), _groups(_arrivals(rng, 7, 50), (1, 2, 1, 3))
  for group in before:  # one flush (at the 3rd arrival), then 2 arrivals buffered
    state, changed = strategy.receive(state, group)
    assert changed == ref.receive(group, g)
    g = np.asarray(state.global_sketch, np.float64)  # (changed at a flush only, in both)
  assert len(state.sketches) == 2 and state.queue_count == 3
  store = checkpoint.CheckpointStore(str(tmp_path / "checkpoints"), keep=1)
  store.save(1, {"state": state}, {"seed": 0})
  restored = store.restore_latest().snapshot["state"]
  store.close()
  assert type(restored) is type(state) and restored.queue_count == 3 and len(restored.sketches) == 2
  states = [state, restored]
  for group in after:  # three more flushes: the queue fills inside the first
    results = [strategy.receive(s, group) for s in states]
    states = [s for s, _ in results]
    assert [c for _, c in results] == [ref.receive(group, g)] * 2
    g = np.asarray(states[0].global_sketch, np.float64)
  assert ref.m0 is not None and states[0].queue_count == 12
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  assert_close(states[0].params, ref.params, f32_tolerance(4, depth=3))


def _readings_config(fixed: float, no_temperature: bool = True, no_sensitivity: bool = False, buffer_size: int = 3):
  c = config_lib.base_config()
  c.fedpsa.sketch_dim = K_SKETCH
  c.fedpsa.calibration, c.fedpsa.calibration_size = "real", 8  # _readings_ctx's batch
  c.fedpsa.buffer_size = buffer_size
  c.fedpsa.queue_length = 2  # fills at the first flush: under no_temperature Temp must still not move
  c.fedpsa.gamma, c.fedpsa.delta = GAMMA, DELTA
  c.fedpsa.no_temperature = no_temperature
  c.fedpsa.no_sensitivity = no_sensitivity
  c.fedpsa.fixed_temperature = fixed
  return c


def _hand_weights(payloads: np.ndarray, g: np.ndarray, temp: float) -> np.ndarray:
  """Eq. 19 in float64: softmax of κ_i / Temp, κ_i = cos(payload_i, g)."""
  kappa = payloads @ g / (np.linalg.norm(payloads, axis=1) * np.linalg.norm(g))
  e = np.exp(kappa / temp)
  return e / e.sum()


@pytest.mark.parametrize("fixed,temp", [(0.0, GAMMA + DELTA), (1.0, 1.0), (DELTA, DELTA), (0.2, 0.2)])
def test_fixed_temperature_is_the_softmax_temperature(fixed, temp):
  strategy = fedpsa_lib.FedPSA(_readings_config(fixed).fedpsa, _readings_ctx())
  state = strategy.init(PARAMS_KEY0)
  assert float(state.temperature) == pytest.approx(temp, rel=1e-6)
  rng = np.random.default_rng(2)
  for flush in range(3):  # the queue fills and rolls: the fixed Temp must hold at every flush
    g = rng.normal(size=K_SKETCH)
    state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
    # κ spread over [-1, 1]: aligned, orthogonal-ish and opposed payloads.
    payloads = np.stack([g + 0.3 * rng.normal(size=K_SKETCH), rng.normal(size=K_SKETCH), -g + 0.3 * rng.normal(size=K_SKETCH)])
    deltas = [jax.tree.map(lambda x: jnp.asarray(0.01 * rng.normal(size=x.shape), jnp.float32), PARAMS_KEY0)
              for _ in payloads]
    before = jax.tree.map(np.asarray, state.params)
    arrivals = [Arrival(client=i, num_samples=10, staleness=0, dispatch_round=0, params_start=PARAMS_KEY0, delta=d,
                        payload=jnp.asarray(p, jnp.float32)) for i, (p, d) in enumerate(zip(payloads, deltas))]
    state, changed = strategy.receive(state, arrivals)
    assert changed
    want = _hand_weights(payloads, g, temp)
    np.testing.assert_allclose(np.asarray(state.last_weights), want, rtol=1e-5)
    # The test tells temperatures apart: at this κ spread the weights at γ + δ and at Temp differ.
    if temp != GAMMA + DELTA:
      assert np.abs(want - _hand_weights(payloads, g, GAMMA + DELTA)).max() > 0.05
    assert float(state.temperature) == pytest.approx(temp, rel=1e-6)
    # Eq. 20 with those weights.
    expected = jax.tree.map(lambda w0, *ds: np.asarray(w0, np.float64) + sum(
        wt * np.asarray(d, np.float64) for wt, d in zip(want, ds)), before, *deltas)
    assert_close(state.params, expected, f32_tolerance(len(deltas) + 1))


def test_near_uniform_readings():
  """The documented readings: at γ + δ = 5.5 even κ = ±1 give weights within e^(2/5.5) ≈ 1.44 of each other."""
  w = _hand_weights(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([1.0, 0.0]), GAMMA + DELTA)
  assert w[0] / w[1] == pytest.approx(math.exp(2 / 5.5))
  strategy = fedpsa_lib.FedPSA(_readings_config(0.0).fedpsa, _readings_ctx())
  assert fedpsa_lib.fixed_temperature(strategy.hparams) == GAMMA + DELTA


def _errors(c) -> list[str]:
  return [e for e in config_lib.config_errors(c) if "fixed_temperature" in e]


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan, True, "1.0", None])
def test_fixed_temperature_bad_values_name_the_field(bad):
  c = _readings_config(0.0)
  # A section rebuilt from a dict, as from JSON: ConfigDict would turn True into 1.0 on a float field.
  c.fedpsa = ml_collections.ConfigDict({**c.fedpsa.to_dict(), "fixed_temperature": bad})
  assert type(c.fedpsa.fixed_temperature) is type(bad)
  errors = _errors(c)
  assert len(errors) == 1 and errors[0].startswith(f"fedpsa.fixed_temperature={bad!r} is invalid; allowed:"), errors
  with pytest.raises(config_lib.ConfigError, match="fedpsa.fixed_temperature"):
    config_lib.validate(c)


def test_fixed_temperature_needs_no_temperature():
  # Without the switch the thermometer sets Temp: a fixed value would silently do nothing, so it is refused.
  errors = _errors(_readings_config(1.0, no_temperature=False))
  assert len(errors) == 1 and "fedpsa.no_temperature=True" in errors[0], errors
  assert _errors(_readings_config(0.0, no_temperature=False)) == []
  assert _errors(_readings_config(1.0)) == [] and _errors(_readings_config(0.0)) == []
  assert config_lib.base_config().fedpsa.fixed_temperature == 0.0  # the default: γ + δ, the paper's reading


@pytest.mark.slow
def test_count_sketch_projection_is_held_and_used_for_clients_and_server():
  """With fedpsa.projection='count_sketch' the strategy holds `count_sketch_projection`'s blocks for the run's
  key (no k x d matrix), and a client's sketch and the server's global sketch are S s(θ) (S s(w) at init), κ
  their cosine (Eq. 12 unchanged)."""
  strategy, state = _fedpsa(buffer_size=1, projection="count_sketch")
  blocks = jax.tree.leaves(strategy.projection, is_leaf=lambda b: isinstance(b, sensitivity.CountSketchBlock))
  assert all(isinstance(b, sensitivity.CountSketchBlock) and b.k == K_SKETCH for b in blocks)
  expected = sensitivity.count_sketch_projection(seeding.device_key(strategy.ctx.seed, "fedpsa/projection"),
                                                 K_SKETCH, PARAMS0)
  for got, want in zip(blocks, jax.tree.leaves(expected, is_leaf=lambda b: isinstance(b, sensitivity.CountSketchBlock))):
    assert np.array_equal(got.order, want.order) and np.array_equal(got.signs, want.signs)
  options = strategy.sketch_options
  s_of = lambda params: sensitivity.sensitivity(strategy.ctx.apply_fn, params, *strategy.calibration,
                                                chunk_size=options["chunk_size"], method=options["method"])
  np.testing.assert_allclose(state.global_sketch, sensitivity.project(expected, s_of(PARAMS0)), rtol=1e-5, atol=1e-7)
  end = _random_like(PARAMS0, np.random.default_rng(8))
  payload = strategy.client.payload(PARAMS0, end, None)
  np.testing.assert_allclose(payload, sensitivity.project(expected, s_of(end)), rtol=1e-5, atol=1e-7)
  state, flushed = strategy.receive(state, [_arrival(0, jax.tree.map(jnp.subtract, end, PARAMS0), payload=payload)])
  assert flushed
  np.testing.assert_allclose(float(state.last_kappas[0]), _cos(payload, sensitivity.project(expected, s_of(PARAMS0))),
                             rtol=1e-5)


def _old_path_sketch(strategy, params):
  """An independent reference for the sketch, Eq. 11 as printed: the sensitivity (Eq. 8),
  then the whole R (`projection_matrix`, the same key) times ravel_pytree(s) in one product (Eq. 11)."""
  h, ctx = strategy.hparams, strategy.ctx
  R = sensitivity.projection_matrix(seeding.device_key(ctx.seed, "fedpsa/projection"), h.sketch_dim,
                                    sensitivity.num_params(params))
  options = strategy.sketch_options
  tree = (sensitivity.sensitivity(ctx.apply_fn, params, *strategy.calibration, chunk_size=options["chunk_size"],
                                  method=options["method"]) if options["use_sensitivity"] else params)
  return jnp.dot(R, jax.flatten_util.ravel_pytree(tree)[0], precision=jax.lax.Precision.HIGHEST)


def _recorded_run(monkeypatch, old_path: bool) -> list[dict]:
  """A short FedPSA run on the linear model (the thermometer fills, so softmax weights are used), with every
  round's client sketches, κ, weights, new global sketch and parameters recorded."""
  from fedpsa_jax.sim import runner

  if old_path:
    old_sketch = jax.jit(_old_path_sketch, static_argnums=0)
    monkeypatch.setattr(FedPSA, "sketch", lambda self, params: old_sketch(self, params))
  sim = runner.Simulation(small_config("fedpsa", days=0.02, fedpsa__queue_length=10))
  rounds, receive = [], sim.strategy.receive

  def recorded(state, arrivals):
    sketches = state.sketches + tuple(a.payload for a in arrivals)
    state, changed = receive(state, arrivals)
    if changed:
      rounds.append({"sketches": np.stack(sketches), "kappa": state.last_kappas, "weights": state.last_weights,
                     "global_sketch": state.global_sketch, "params": _flat(state.params)})
    return state, changed

  sim.strategy.receive = recorded
  sim.run_until(0.02)
  monkeypatch.undo()
  return [jax.tree.map(np.asarray, r) for r in rounds]


@pytest.mark.slow
def test_kappas_sketches_and_weights_match_the_old_sketch_path(monkeypatch):
  """On a fixed job, the per-leaf projection in one program (`sensitivity.sketch_of`) gives the sketches, κ, weights and models
  of the old path (`_old_path_sketch`) to float tolerance, round after round, through the softmax phase."""
  new, old = _recorded_run(monkeypatch, False), _recorded_run(monkeypatch, True)
  assert len(new) == len(old) >= 4 and any(not np.allclose(r["weights"], r["weights"][0]) for r in new)
  d = old[0]["params"].size
  for r_new, r_old in zip(new, old):
    # Each sketch entry sums d products in another order; κ and the weights follow the sketches.
    assert_close(r_new["sketches"], r_old["sketches"], f32_tolerance(d, depth=4))
    assert_close(r_new["global_sketch"], r_old["global_sketch"], f32_tolerance(d, depth=4))
    np.testing.assert_allclose(r_new["kappa"], r_old["kappa"], atol=1e-5)
    np.testing.assert_allclose(r_new["weights"], r_old["weights"], rtol=1e-5)
    assert_close(r_new["params"], r_old["params"], AGGREGATION_TOL)


def _stale_arrivals(seed: int, taus: list[int]) -> tuple[list, list]:
  """Random updates Δ_i (and sketches) arriving with staleness `taus`: (the Δ_i, their Arrivals)."""
  rng = np.random.default_rng(seed)
  deltas = [_random_like(PARAMS0, rng, 0.1) for _ in taus]
  sketches = [jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32) for _ in taus]
  return deltas, [_arrival(i, d, s, staleness=t) for i, (t, d, s) in enumerate(zip(taus, deltas, sketches))]


@pytest.mark.parametrize("queue_length", [50, 1])  # uniform phase (queue not full), softmax from the first flush
def test_step_staleness_scales_the_eq19_weights_to_fedbuffs_sum(queue_length):
  # Same arrivals into FedPSA with step='unit' (Eq. 20) and step='staleness': the same κ and Temp, so the weights'
  # shape is the same and only their sum differs, FedBuff's (1/B) Σ (1 + τ_i)^(-1/2) for this buffer.
  taus = [0, 1, 3]
  deltas, arrivals = _stale_arrivals(11, taus)
  weights = {}
  for step in ("unit", "staleness"):
    strategy, state = _fedpsa(buffer_size=3, queue_length=queue_length)
    strategy.hparams.step = step
    w = _np_tree(state.params)
    state, changed = strategy.receive(state, arrivals)
    assert changed and state.staleness == ()
    weights[step] = np.asarray(state.last_weights, np.float64)
    expected = jax.tree.map(lambda a, *ds: a + sum(c * d for c, d in zip(weights[step], ds)), w,
                            *[_np_tree(d) for d in deltas])
    _close(state.params, expected)
  step = np.mean((1.0 + np.asarray(taus)) ** -0.5)  # 0.7357
  np.testing.assert_allclose(weights["unit"].sum(), 1.0, rtol=1e-6)
  np.testing.assert_allclose(weights["staleness"], weights["unit"] * step, rtol=1e-6)
  if queue_length == 1:
    assert np.ptp(weights["unit"]) > 1e-3  # the softmax really weighs (not the uniform phase)


def test_step_bad_value_names_the_field():
  cfg = config_lib.base_config()
  cfg.fedpsa.step = "fedbuff"
  errors = FedPSA.validate_config(cfg)
  assert len(errors) == 1 and errors[0].startswith("fedpsa.step='fedbuff' is invalid; allowed:"), errors


@pytest.mark.parametrize("step", ["unit", "staleness"])
def test_server_lr_multiplies_the_eq20_update(step):
  # η = 1.7 and η = 1 on the same arrivals: the same κ and Temp, so the weights are η times those at η = 1, and the
  # new model is w + η Σ weight_i Δ_i (a hand computation in float64); η = 1 is bit for bit the default.
  taus = [0, 2, 5]
  deltas, arrivals = _stale_arrivals(12, taus)
  out = {}
  for eta in (None, 1.0, 1.7):
    strategy, state = _fedpsa(buffer_size=3, queue_length=1)
    strategy.hparams.step = step
    if eta is not None:
      strategy.hparams.server_lr = eta
    w = _np_tree(state.params)
    state, changed = strategy.receive(state, arrivals)
    assert changed
    out[eta] = state
    weights = np.asarray(state.last_weights, np.float64)
    _close(state.params, jax.tree.map(lambda a, *ds: a + sum(c * d for c, d in zip(weights, ds)), w,
                                      *[_np_tree(d) for d in deltas]))
  base = np.asarray(out[1.0].last_weights, np.float64)
  assert np.ptp(base) > 1e-3  # the softmax weighs (queue_length=1)
  np.testing.assert_allclose(np.asarray(out[1.7].last_weights, np.float64), 1.7 * base, rtol=1e-6)
  sum_w = 1.0 if step == "unit" else np.mean((1.0 + np.asarray(taus)) ** -0.5)
  np.testing.assert_allclose(np.asarray(out[1.7].last_weights).sum(), 1.7 * sum_w, rtol=1e-6)  # η × Σw
  for a, b in zip(jax.tree.leaves(out[None].params), jax.tree.leaves(out[1.0].params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the default is η = 1 exactly


def test_server_lr_must_be_positive():
  cfg = config_lib.base_config()
  cfg.fedpsa.server_lr = 0.0
  errors = FedPSA.validate_config(cfg)
  assert len(errors) == 1 and errors[0].startswith("fedpsa.server_lr=0.0 is invalid; allowed:"), errors
