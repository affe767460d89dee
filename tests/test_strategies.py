"""Server math of the strategies on hand-made arrivals, against references written out in NumPy.

FedPSA's κ is controlled through the payloads: the test sets the state's `global_sketch` and gives
each arrival a k-vector of its choice, so κ = cos(payload, global_sketch) is known by hand.
"""

from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import seeding, sensitivity, strategies
from fedpsa_jax.compiles import CompileCounter
from fedpsa_jax.models import TinyMLP
from fedpsa_jax.strategies import Arrival
from fedpsa_jax.strategies.fedasync import FedAsync, staleness_weight
from fedpsa_jax.strategies.fedavg import FedAvg
from fedpsa_jax.strategies.fedbuff import FedBuff
from fedpsa_jax.strategies.fedpsa import FedPSA
from helpers import strategy_context
from numerics import assert_close, f32_tolerance

K_SKETCH = 6  # sketch_dim k of the FedPSA tests
NUM_CLASSES = 3
HIDDEN = 5


# --- helpers ----------------------------------------------------------------------------------------


def _calibration():
  rng = np.random.default_rng(11)
  x = rng.normal(size=(8, 4)).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, size=8).astype(np.int32)
  return jnp.asarray(x), jnp.asarray(y)


MODEL = TinyMLP(num_classes=NUM_CLASSES, hidden=HIDDEN)
PARAMS0 = MODEL.init(jax.random.key(3), jnp.zeros((1, 4), jnp.float32))


def _ctx(num_clients=6, sizes=None, concurrency=3, seed=0):
  return strategy_context(MODEL, PARAMS0, num_clients=num_clients, sizes=sizes, concurrency=concurrency,
                          num_classes=NUM_CLASSES, seed=seed, train_batch=_calibration())


def _np_tree(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _flat(tree) -> np.ndarray:
  """Hand ravel of a TinyMLP-shaped (or any nested-dict) tree: keys sorted, each leaf row-major."""
  if isinstance(tree, dict) or hasattr(tree, "keys"):
    return np.concatenate([_flat(tree[k]) for k in sorted(tree.keys())])
  return np.asarray(tree, np.float64).ravel()


def _random_like(tree, rng, scale=1.0):
  return jax.tree.map(lambda x: jnp.asarray(scale * rng.normal(size=np.shape(x)), jnp.float32), tree)


def _arrival(client, delta, payload=(), staleness=0, num_samples=10, start=None):
  start = jax.tree.map(jnp.zeros_like, delta) if start is None else start
  return Arrival(client=client, num_samples=num_samples, staleness=staleness, dispatch_round=0,
                 params_start=start, delta=delta, payload=payload)


# Server updates in float32 against float64 hands: a server update mixes a few arrivals per flush, and up to 25 flushes chain in a test.
AGGREGATION_TOL = f32_tolerance(4, depth=25)
# Sketches R θ (d = 43 parameters per entry) and R s, whose Eq. 8 sensitivity s = |gθ − ½Fθ²| sums the 8
# calibration samples' gradients and then cancels two terms of its own.
RAW_SKETCH_TOL = f32_tolerance(43)
SKETCH_TOL = f32_tolerance(43 * 8, depth=3)


def _close(actual, expected, rel=AGGREGATION_TOL):
  assert_close(actual, expected, rel)


def _cos(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  return e / e.sum()


def _fedpsa(buffer_size=2, queue_length=3, gamma=1.0, delta=0.2, no_temperature=False,
            no_sensitivity=False, seed=0):
  cfg = config_lib.base_config()
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
  strategy = FedPSA(cfg, _ctx(seed=seed))
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


# --- FedBuff ----------------------------------------------------------------------------------------

TINY = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array([[0.25, 3.0]])}


def _tiny_delta(rng):
  return jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), TINY)


def _fedbuff(k=3, server_lr=0.7):
  cfg = config_lib.base_config()
  cfg.method = "fedbuff"
  cfg.fedbuff.buffer_size = k
  cfg.fedbuff.server_lr = server_lr
  strategy = FedBuff(cfg, _ctx())
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


# --- FedAsync ---------------------------------------------------------------------------------------


def _fedasync(kind="polynomial", alpha=0.6, a=0.5, b=4, mu=0.005):
  cfg = config_lib.base_config()
  cfg.method = "fedasync"
  cfg.fedasync.staleness = kind
  cfg.fedasync.alpha = alpha
  cfg.fedasync.a = a  # the polynomial's exponent
  cfg.fedasync.hinge_a, cfg.fedasync.hinge_b = a, b  # the hinge's own a and b (_hand_s uses the same pair)
  cfg.fedasync.prox_mu = mu
  strategy = FedAsync(cfg, _ctx())
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


# --- FedAvg -----------------------------------------------------------------------------------------


def test_fedavg_waits_for_cohort_then_size_weighted_average():
  cfg = config_lib.base_config()
  cfg.method = "fedavg"
  strategy = FedAvg(cfg, _ctx(num_clients=6, concurrency=3))
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
  strategy = FedAvg(cfg, _ctx(num_clients=6, concurrency=4))
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


# --- config validation ------------------------------------------------------------------------------


def _cfg(method):
  cfg = config_lib.base_config()
  cfg.method = method
  return cfg


@pytest.mark.parametrize("method", ["fedpsa", "fedbuff", "fedasync", "fedavg"])
def test_base_config_valid(method):
  assert config_lib.config_errors(_cfg(method)) == []


@pytest.mark.parametrize("method,field,value", [
    ("fedpsa", "buffer_size", 0),
    ("fedpsa", "buffer_size", 51),
    ("fedbuff", "buffer_size", 51),
    ("fedbuff", "buffer_size", 0),
])
def test_buffer_size_rejected(method, field, value):
  cfg = _cfg(method)
  assert cfg.partition.num_clients == 50
  cfg[method][field] = value
  errors = config_lib.config_errors(cfg)
  assert len(errors) == 1
  assert f"{method}.{field}" in errors[0] and str(value) in errors[0]


@pytest.mark.parametrize("method", ["fedpsa", "fedbuff"])
def test_buffer_size_equal_to_n_accepted(method):
  cfg = _cfg(method)
  cfg[method].buffer_size = 50
  assert config_lib.config_errors(cfg) == []
  cfg.partition.num_clients = 49
  assert any(f"{method}.buffer_size" in e for e in config_lib.config_errors(cfg))


def test_fedasync_bogus_staleness_rejected():
  cfg = _cfg("fedasync")
  cfg.fedasync.staleness = "bogus"
  errors = config_lib.config_errors(cfg)
  assert len(errors) == 1
  assert "fedasync.staleness" in errors[0] and "bogus" in errors[0]
  with pytest.raises(ValueError, match="fedasync.staleness"):
    config_lib.validate(cfg)


# --- every registered strategy's section, through the shared validators --------------------------------


def _section_fields() -> list[tuple[str, str, object]]:
  """(method, field, default) of every field of every registered strategy's default section: collected from
  the registry, so that a new strategy (or a new field) is covered without editing this file."""
  strategies.load_all()
  return [(name, field, default) for name, cls in sorted(strategies.registered().items())
          for field, default in sorted(cls.default_config().items())]


def _is_numeric(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _with(method: str, field: str, value) -> ml_collections.ConfigDict:
  cfg = _cfg(method)
  # The section rebuilt from a dict, as from JSON: ConfigDict's own type check would turn True into 1.0 on a
  # float field and refuse NaN on an int one, so the strategy's validator would never see them.
  cfg[method] = ml_collections.ConfigDict({**cfg[method].to_dict(), field: value})
  assert type(cfg[method][field]) is type(value)
  return cfg


@pytest.mark.parametrize("method", sorted({m for m, _, _ in _section_fields()} | {"fedavg"}))
def test_every_default_section_validates_clean(method):
  assert config_lib.config_errors(_cfg(method)) == []


NUMERIC_FIELDS = [(m, f) for m, f, d in _section_fields() if _is_numeric(d)]
BOOL_FIELDS = [(m, f) for m, f, d in _section_fields() if isinstance(d, bool)]


def _only_error(cfg, method: str, field: str, value) -> str:
  errors = config_lib.config_errors(cfg)
  assert len(errors) == 1, errors
  assert errors[0].startswith(f"{method}.{field}={value!r} is invalid; allowed: "), errors
  return errors[0]


@pytest.mark.parametrize("bad", [True, math.nan, math.inf], ids=["bool", "nan", "inf"])
@pytest.mark.parametrize("method,field", NUMERIC_FIELDS, ids=[f"{m}.{f}" for m, f in NUMERIC_FIELDS])
def test_numeric_fields_reject_bools_and_non_finite_values(method, field, bad):
  """A bool is not a number (True == 1 would pass a bare isinstance check) and NaN or ±inf is never a
  usable hyperparameter: each is refused with the field named, in the one message shape."""
  _only_error(_with(method, field, bad), method, field, bad)
  with pytest.raises(config_lib.ConfigError, match=f"{method}\\.{field}="):
    config_lib.validate(_with(method, field, bad))


@pytest.mark.parametrize("bad", [1, "True"])
@pytest.mark.parametrize("method,field", BOOL_FIELDS, ids=[f"{m}.{f}" for m, f in BOOL_FIELDS])
def test_switches_reject_anything_but_a_bool(method, field, bad):
  assert _only_error(_with(method, field, bad), method, field, bad).endswith("allowed: True, False")


@pytest.mark.parametrize("method,field,default", _section_fields(),
                         ids=[f"{m}.{f}" for m, f, _ in _section_fields()])
def test_every_section_field_is_validated(method, field, default):
  """None fits no validator: a field that `validate_config` forgets to check passes it and fails here."""
  del default
  _only_error(_with(method, field, None), method, field, None)


def test_buffer_size_is_bounded_by_the_federation():
  assert NUMERIC_FIELDS and BOOL_FIELDS  # the registry was read
  for method in sorted(m for m, f, _ in _section_fields() if f == "buffer_size"):
    cfg = _cfg(method)
    n = cfg.partition.num_clients
    for k, ok in ((1, True), (n, True), (n + 1, False), (0, False)):
      cfg[method].buffer_size = k
      assert (config_lib.config_errors(cfg) == []) == ok, (method, k)
    assert config_lib.config_errors(cfg)[0] == (
        f"{method}.buffer_size=0 is invalid; allowed: an integer in [1, {n}] (at most partition.num_clients)")
