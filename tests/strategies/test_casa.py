"""CASA (strategies/casa.py): every formula against a hand computation, the eigengap trigger on hand-made
similarity matrices, the buffer budget, the newcomer step and the strategy's server step against NumPy, and
config validation (its whole runs are in tests/e2e/test_casa_runs.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fedpsa_jax import config as config_lib
from fedpsa_jax.models import TinyMLP
from fedpsa_jax.strategies import Arrival, casa
from helpers import strategy_context
from numerics import assert_close, f32_tolerance


MODEL = TinyMLP(num_classes=3, hidden=4)


PARAMS0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 5), jnp.float32))


# --- formulas ---------------------------------------------------------------------------------------


def test_omega_and_bilevel_decay_by_hand():
  # Ω(t) = (e / 2.8)^(0.001 t): Ω(0) = 1, Ω(1000) = e / 2.8.
  assert casa.omega(0, 0.001) == 1.0
  assert casa.omega(1000, 0.001) == pytest.approx(math.e / 2.8, rel=1e-12)
  assert casa.omega(2000, 0.001) == pytest.approx((math.e / 2.8) ** 2, rel=1e-12)
  # Eq. 6 with |C_k| + 3 and log2: |C| = 5 -> log2(8) = 3 -> α = 2 · 1 / 3; |C| = 1 -> exactly Ω.
  assert casa.cluster_alpha(2.0, 1.0, 5) == pytest.approx(2.0 / 3.0)
  assert casa.cluster_alpha(2.0, 0.5, 1) == pytest.approx(0.5)
  assert casa.cluster_alpha(2.0, 1.0, 100) == pytest.approx(2.0 / math.log2(103))  # ≈ 0.30, the paper's α
  # Eq. 8: r = |C| (2 − Ω) = 10 · 1.25.
  assert casa.staleness_threshold(10, 0.75) == pytest.approx(12.5)
  # Eq. 7: no extra decay up to the threshold, α_c / sqrt(τ) beyond it.
  assert casa.client_alpha(0.4, 12, 12.5) == 0.4
  assert casa.client_alpha(0.4, 16, 12.5) == pytest.approx(0.1)


def test_sparsity_schedule_by_hand():
  # Eq. 17 at t = 1: (S0/2)(α_c − α_i)(1 + cos 0) = S0 (α_c − α_i).
  assert casa.sparsity(0.5, 0.4, 0.1, 1, 100) == pytest.approx(0.5 * 0.3)
  # Half way, t − 1 = R_end / 2: cos(π/2) = 0 -> half of that.
  assert casa.sparsity(0.5, 0.4, 0.1, 51, 100) == pytest.approx(0.25 * 0.3)
  # At the end the schedule reaches 0; a client with no extra decay gets no sparsity.
  assert casa.sparsity(0.5, 0.4, 0.1, 101, 100) == pytest.approx(0.5 / 2 * 0.3 * (1 + math.cos(math.pi * 99 / 100)))
  assert casa.sparsity(0.5, 0.4, 0.4, 1, 100) == 0.0


def _np(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def test_mix_and_masked_mix_against_numpy():
  rng = np.random.default_rng(0)
  g = {"a": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32), "b": jnp.asarray(rng.normal(size=7), jnp.float32)}
  w = {"a": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32), "b": jnp.asarray(rng.normal(size=7), jnp.float32)}
  out = casa.mix(g, w, jnp.float32(0.3))
  for k in g:  # Eq. 9
    assert_close(out[k], 0.3 * np.asarray(w[k], np.float64) + 0.7 * np.asarray(g[k], np.float64), f32_tolerance(2))
  out = casa.masked_mix(g, w, jnp.float32(0.3), jnp.float32(0.4))
  for k in g:  # Eq. 16: floor(0.4 · size) entries of smallest |w| keep g; the rest are mixed
    wk, gk = np.asarray(w[k], np.float64).ravel(), np.asarray(g[k], np.float64).ravel()
    dropped = np.argsort(np.abs(wk), kind="stable")[: int(np.floor(0.4 * wk.size))]
    expected = 0.3 * wk + 0.7 * gk
    expected[dropped] = gk[dropped]
    assert_close(np.asarray(out[k]).ravel(), expected, f32_tolerance(2))
  # S = 0 is plain Eq. 9.
  zero = casa.masked_mix(g, w, jnp.float32(0.3), jnp.float32(0.0))
  assert_close(zero, casa.mix(g, w, jnp.float32(0.3)), f32_tolerance(2))


# --- eigengap trigger and clustering ----------------------------------------------------------------


def _blocks(sizes, within=1.0, across=0.0):
  labels = np.repeat(np.arange(len(sizes)), sizes)
  return np.where(labels[:, None] == labels[None, :], within, across), labels


def test_laplacian_eigenvalues_of_block_matrices_by_hand():
  # Two all-ones blocks (3 and 4): each block is K_n with self-loops, L = I − 11ᵀ/n with eigenvalues 0
  # and 1 (n − 1 times): spectrum {0, 0, 1 × 5}; the largest gap is after λ_2, R = 2, gap 1.
  a, _ = _blocks([3, 4])
  values, _ = casa.laplacian_spectrum(a)
  np.testing.assert_allclose(values, [0, 0, 1, 1, 1, 1, 1], atol=1e-12)
  assert casa.eigengap(values, 10) == (2, pytest.approx(1.0))
  # Against a brute-force Laplacian with NumPy on a random symmetric affinity.
  rng = np.random.default_rng(1)
  m = rng.random((6, 6))
  m = (m + m.T) / 2
  d = m.sum(1)
  lap = np.eye(6) - m / np.sqrt(np.outer(d, d))
  np.testing.assert_allclose(casa.laplacian_spectrum(m)[0], np.sort(np.linalg.eigvals(lap).real), atol=1e-10)


def test_eigengap_trigger_fires_and_does_not_fire():
  a, labels = _blocks([4, 3, 5], within=0.9, across=0.05)
  values, _ = casa.laplacian_spectrum(a)
  r, gap = casa.eigengap(values, 10)
  assert r == 3
  # Hand check of Eq. 14 at the computed gap: fires when α_c < γ · gap, not otherwise.
  assert casa.should_split(0.99 * 0.15 * gap, gap, r, 0.15)
  assert not casa.should_split(1.01 * 0.15 * gap, gap, r, 0.15)
  parts, r2, gap2 = casa.spectral_partition(a, 10, 0.15, 0.5 * 0.15 * gap, seed=0)
  assert r2 == 3 and gap2 == pytest.approx(gap)
  assert adjusted_rand_score(labels, parts) == 1.0
  # Same matrix, α_c too large for the gap: no split.
  parts, _, _ = casa.spectral_partition(a, 10, 0.15, 0.3, seed=0)
  assert parts is None  # gap ≤ 1.x, γ · gap < 0.3
  # A homogeneous cluster has its largest gap after λ_1 (R = 1): never split, whatever α.
  uniform = np.full((8, 8), 0.8) + 0.2 * np.eye(8)
  parts, r, _ = casa.spectral_partition(uniform, 10, 0.15, 1e-9, seed=0)
  assert parts is None and r == 1


def test_cluster_affinity_fills_missing_pairs_with_the_mean():
  sim = np.array([[1.0, 0.5, 9.0], [0.5, 1.0, -0.3], [9.0, -0.3, 1.0]])
  done = np.array([[True, True, False], [True, True, True], [False, True, True]])
  a = casa.cluster_affinity(sim, done)
  # computed off-diagonal pairs: 0.5 and max(−0.3, 0) = 0 -> mean 0.25 fills (0, 2); diagonal 1.
  np.testing.assert_allclose(a, [[1, 0.5, 0.25], [0.5, 1, 0], [0.25, 0, 1]])
  assert casa.cluster_affinity(sim, np.eye(3, dtype=bool)) is None


def test_newcomer_assignment_by_hand():
  v1, v2, v3 = np.array([1.0, 0, 0]), np.array([0.0, 1, 0]), np.array([1.0, 1, 0])
  # Cluster 0: items v1 (|D| 30) and v3 (|D| 10): rep_0 = 0.75 v1 + 0.25 v3 = (1, 0.25, 0).
  # Cluster 1: item v2: rep_1 = (0, 1, 0). For v_i = (0.3, 1, 0): cos with rep_0 = (0.3 + 0.25) /
  # (1.0308 · 1.0440) ≈ 0.511, with rep_1 = 1 / 1.0440 ≈ 0.958 -> cluster 1.
  items = [(0, 30, v1), (1, 5, v2), (0, 10, v3)]
  assert casa.newcomer_cluster(np.array([0.3, 1.0, 0]), items) == 1
  # For v_i = (1, 0.2, 0): cos with rep_0 ≈ 0.9989 > with rep_1 ≈ 0.196 -> cluster 0.
  assert casa.newcomer_cluster(np.array([1.0, 0.2, 0]), items) == 0
  assert casa.newcomer_cluster(v1, []) is None


def test_prune_buffer_priority_by_hand():
  computed = np.zeros((4, 4), bool)
  computed[0, 1] = computed[1, 0] = True
  alpha = np.array([0.3, 0.1, 0.2, 0.0])
  items = [{"owner": 0, "source": 1, "inserted": 5, "key": 50}, {"owner": 0, "source": 2, "inserted": 1, "key": 10},
           {"owner": 1, "source": 2, "inserted": 2, "key": 20}, {"owner": 2, "source": 3, "inserted": 3, "key": 30},
           {"owner": 2, "source": 0, "inserted": 4, "key": 40}]
  # Rank: uncomputed pairs first (all but (0, 1)); among them by owner α: owner 1 (0.1), owner 2 (0.2;
  # newest first: inserted 4 then 3), owner 0 (0.3); then the computed (0, 1).
  kept = casa.prune_buffer(items, computed, alpha, 3)
  assert [(it["owner"], it["source"]) for it in kept] == [(1, 2), (2, 0), (2, 3)]  # vectors 20, 40, 30
  # Two items sharing one vector cost one slot: (0, 2) holds vector 20 as well, so it stays.
  items[1]["key"] = 20
  kept = casa.prune_buffer(items, computed, alpha, 3)
  assert [(it["owner"], it["source"]) for it in kept] == [(1, 2), (2, 0), (2, 3), (0, 2)]
  assert len(casa.prune_buffer(items, computed, alpha, 10)) == 5


# --- the strategy's server step ---------------------------------------------------------------------


def _strategy(n=6, **section):
  cfg = config_lib.base_config()
  cfg.method = "casa"
  cfg.model.name = "tiny_mlp"
  cfg.partition.num_clients = n
  for k, v in section.items():
    cfg.casa[k] = v
  assert config_lib.config_errors(cfg) == []
  ctx = strategy_context(MODEL, PARAMS0, num_clients=n, concurrency=2)
  return casa.CASA(cfg.casa, ctx)


def _delta(rng, scale=0.1):
  return jax.tree.map(lambda x: jnp.asarray(scale * rng.normal(size=x.shape), jnp.float32), PARAMS0)


def _flat(tree):
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def test_receive_applies_bilevel_decay_and_buffers_by_hand():
  s = _strategy(n=6, buffer_budget=100)
  state = s.init(PARAMS0)
  rng = np.random.default_rng(0)
  for c in range(6):  # all dispatched at round 0
    state = s.dispatch(state, c)[0]
  deltas = [_delta(rng) for _ in range(3)]
  # Client 0 arrives at t = 0, τ = 0: α = α0 Ω(0) / log2(6 + 3) (Eq. 6, all 6 clients in cluster 0).
  state, changed = s.receive(state, [Arrival(0, 10, 0, 0, PARAMS0, deltas[0], ())])
  assert changed
  a0 = 2.0 / math.log2(9)
  expected = jax.tree.map(lambda g, d: g + a0 * d, _np(PARAMS0), _np(deltas[0]))  # α w_i + (1−α) g
  assert_close(state.models[0], expected, f32_tolerance(2, depth=2))  # α w + (1 − α) g of g + Δ
  # Its update went into the buffers of the 5 others (same cluster, start rounds 0 apart).
  assert sorted(it["owner"] for it in state.items) == [1, 2, 3, 4, 5]
  # Client 1 arrives at t = 1 (τ = 1 − 0 = 1 <= r = 6 (2 − Ω)): similarity with client 0 = cos(Δ_1, Δ_0).
  model_before = _np(state.models[0])
  state, _ = s.receive(state, [Arrival(1, 20, 0, 0, PARAMS0, deltas[1], ())])
  f0, f1 = _flat(deltas[0]), _flat(deltas[1])
  cos = float(f1 @ f0 / np.linalg.norm(f1) / np.linalg.norm(f0))
  assert state.similarity[1, 0] == pytest.approx(cos, rel=1e-5) and state.computed[0, 1]
  assert not any(it["owner"] == 1 for it in state.items)  # buf_1 was cleared
  a1 = 2.0 * casa.omega(1, 0.001) / math.log2(9)
  w1 = jax.tree.map(lambda p, d: p + d, _np(PARAMS0), _np(deltas[1]))
  expected = jax.tree.map(lambda g, w: a1 * w + (1 - a1) * g, model_before, w1)
  assert_close(state.models[0], expected, f32_tolerance(2, depth=2))  # α w + (1 − α) g of g + Δ
  # A straggler: client 2 dispatched at round 0 arrives at t = 20 > r = 6 (2 − Ω(20)) ≈ 6.0035: α_c / sqrt(20).
  state = state.replace(t=20)
  state, _ = s.receive(state, [Arrival(2, 30, 0, 0, PARAMS0, deltas[2], ())])
  om = casa.omega(20, 0.001)
  assert state.last["alpha"] == pytest.approx(2.0 * om / math.log2(9) / math.sqrt(20))
  assert state.last["tau"] == 20
  # Recurring: buf_3 already holds client 0's first update, so its second one is not added there.
  n_before = sum(1 for it in state.items if it["owner"] == 3 and it["source"] == 0)
  state = s.dispatch(state, 0)[0]
  state, _ = s.receive(state, [Arrival(0, 10, 0, 20, PARAMS0, deltas[0], ())])
  assert sum(1 for it in state.items if it["owner"] == 3 and it["source"] == 0) == n_before == 1


def test_newcomer_step_joins_the_nearest_cluster_of_seen_clients_by_hand():
  s = _strategy(n=4)
  v1, v2, v_i = np.array([1.0, 0, 0], np.float32), np.array([0.0, 1, 0], np.float32), np.array([0.9, 1, 0], np.float32)
  # Two clusters; client 0 (a newcomer) holds in its buffer updates of client 1 (cluster 0, seen), client 2
  # (cluster 1, seen) and client 3 (in cluster 0 but itself a newcomer, so left out of Eq. 15).
  state = s.init(PARAMS0).replace(
      models=(PARAMS0, PARAMS0), assign=np.array([0, 0, 1, 0]), seen=np.array([False, True, True, False]),
      items=tuple({"owner": 0, "source": j, "key": j} for j in (1, 2, 3)),
      vectors={1: v1, 2: v2, 3: v_i})
  update = casa.Update(client=0, weights=PARAMS0, vector=v_i, clock=0, newcomer=True)
  # rep_0 = v1, rep_1 = v2: cos(v_i, v1) = 0.9 / 1.345 ≈ 0.669 < cos(v_i, v2) = 1 / 1.345 ≈ 0.743 -> cluster 1.
  # (Counting client 3, rep_0 = (20 v1 + 40 v_i) / 60 would give cos ≈ 0.977 and cluster 0.)
  after = s._assign_newcomer(state, update)
  assert after.assign.tolist() == [1, 0, 1, 0] and after.seen.tolist() == [True, True, True, False]
  assert state.assign.tolist() == [0, 0, 1, 0] and not state.seen[0]  # the given state is unchanged
  # A client already seen keeps its cluster.
  seen = state.replace(seen=np.array([True, True, True, False]))
  assert s._assign_newcomer(seen, dataclasses.replace(update, newcomer=False)).assign.tolist() == [0, 0, 1, 0]


def test_receive_leaves_the_given_state_unchanged_and_event_records_match_its_arrivals():
  s = _strategy(n=12, gamma=1e6, num_eigenvalues=3, min_computed=0.0)  # a trigger that splits at once
  state = s.init(PARAMS0)
  rng = np.random.default_rng(6)
  for step in range(30):
    arrivals = [Arrival(c, 10, 0, 0, PARAMS0, _delta(rng), ()) for c in sorted({step % 12, (5 * step + 1) % 12})]
    before = {f: np.copy(getattr(state, f))
              for f in ("assign", "seen", "similarity", "computed", "start", "last_alpha")}
    items, vectors, models = state.items, dict(state.vectors), state.models
    new, _ = s.receive(state, arrivals)
    for f, value in before.items():
      np.testing.assert_array_equal(getattr(state, f), value, err_msg=f)
    assert state.items is items and state.vectors == vectors and state.models is models
    records = s.event_records(new, arrivals)  # one per arrival, the last one's also the diagnostics' `last`
    assert len(records) == len(arrivals) and new.last == {k: float(v) for k, v in records[-1].items()}
    assert records[-1]["cluster"] == new.assign[arrivals[-1].client]
    state = new
    for a in arrivals:
      state = s.dispatch(state, a.client)[0]
  assert state.splits > 0  # the steps that split a cluster were exercised too
  with pytest.raises(ValueError, match="arrivals of the last receive"):
    s.event_records(state, arrivals[:1] * 3)


def test_large_gap_pruning_and_budget_never_exceeded():
  s = _strategy(n=8, buffer_budget=3, gap_rounds=5)
  state = s.init(PARAMS0)
  rng = np.random.default_rng(3)
  for c in range(8):
    state = s.dispatch(state, c)[0]
  state = state.replace(t=10)
  state = s.dispatch(state, 7)[0]  # client 7 starts at round 10, the others at 0
  state, _ = s.receive(state, [Arrival(0, 10, 0, 0, PARAMS0, _delta(rng), ())])
  assert 7 not in {it["owner"] for it in state.items}  # |10 − 0| >= r_b = 5: large gap
  full = 0
  for step in range(60):  # random arrivals: the budget of Alg. 2 holds after every update
    c = int(rng.integers(8))
    state = s.dispatch(state, c)[0]
    state, _ = s.receive(state, [Arrival(c, 10, 0, 0, PARAMS0, _delta(rng), ())])
    assert len(state.vectors) <= 3
    assert set(state.vectors) == {it["key"] for it in state.items}  # no vector kept without an item
    full += len(state.vectors) == 3
  assert full > 30  # the budget was binding, not idle


def test_ablations_casa_d_fixed_alpha_and_casa_c_never_splits():
  rng = np.random.default_rng(4)
  d = _strategy(n=4, no_decay=True, fixed_alpha=0.25)
  state = d.init(PARAMS0)
  state = state.replace(t=500)
  state, _ = d.receive(state, [Arrival(1, 10, 0, 0, PARAMS0, _delta(rng), ())])
  assert state.last["alpha"] == 0.25 and state.last["cluster_alpha"] == 0.25
  # CASA-C with a trigger that would fire on any gap: still one cluster.
  c = _strategy(n=12, no_clustering=True, gamma=1e6, num_eigenvalues=3, min_computed=0.0)
  state = c.init(PARAMS0)
  for step in range(40):
    k = step % 12
    state = c.dispatch(state, k)[0]
    state, _ = c.receive(state, [Arrival(k, 10, 0, 0, PARAMS0, _delta(rng), ())])
  assert len(state.models) == 1 and state.splits == 0


def test_weight_similarity_and_time_clock():
  rng = np.random.default_rng(5)
  s = _strategy(n=3, similarity="weights", omega_clock="time", omega_k=0.01)
  state = s.init(PARAMS0)
  d0, d1 = _delta(rng), _delta(rng)
  state, _ = s.receive(state, [Arrival(0, 10, 0, 0, PARAMS0, d0, (), arrival_time=300)])
  assert state.last["omega"] == pytest.approx((math.e / 2.8) ** (0.01 * 300))  # Ω of the arrival time
  start1 = jax.tree.map(lambda x: x + 1.0, PARAMS0)
  state, _ = s.receive(state, [Arrival(1, 10, 0, 0, start1, d1, (), arrival_time=400)])
  w0 = _flat(PARAMS0) + _flat(d0)
  w1 = _flat(start1) + _flat(d1)
  assert state.similarity[0, 1] == pytest.approx(float(w0 @ w1 / np.linalg.norm(w0) / np.linalg.norm(w1)), rel=1e-5)


def test_casa_config_validation_messages():
  cfg = config_lib.base_config()
  cfg.method = "casa"
  cfg.casa.gamma = -1.0
  cfg.casa.similarity = "grads"
  cfg.casa.num_eigenvalues = 2
  errors = config_lib.config_errors(cfg)
  assert "casa.gamma=-1.0 is invalid; allowed: a number > 0" in errors
  assert "casa.similarity='grads' is invalid; allowed: update, weights" in errors
  assert "casa.num_eigenvalues=2 is invalid; allowed: an integer >= 3" in errors
  assert len(errors) == 3
