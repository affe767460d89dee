"""AiFed (strategies/aifed.py): ALMU's consistency (Eq. 8) against scipy, its threshold (Eq. 9) and upload
mask on hand-made inputs, the rank reading of the upload rule (the authors' code's) against a brute-force NumPy
ranking, AGMA's weights (Eqs. 10-15) and layer-wise update (Eq. 6) against hand computations in NumPy, the
queue's counter and timer, the byte accounting of partial uploads, and config validation (its whole runs are in
tests/e2e/test_aifed_runs.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.spatial.distance
import scipy.stats

from fedpsa_jax import config as config_lib
from fedpsa_jax import seeding
from fedpsa_jax.models import TinyMLP
from fedpsa_jax.local import ClientData
from fedpsa_jax.strategies import Arrival, ClientJob, aifed
from fedpsa_jax.strategies.aifed import AiFed
from helpers import strategy_context
from numerics import assert_close, f32_tolerance


NUM_CLASSES = 3


MODEL = TinyMLP(num_classes=NUM_CLASSES, hidden=6)


PARAMS0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 4), jnp.float32))


NAMES = ("Dense_0", "Dense_1")


def _ctx(num_clients=6):
  return strategy_context(MODEL, PARAMS0, num_clients=num_clients, sizes=np.full(num_clients, 10), concurrency=2,
                          num_classes=NUM_CLASSES)


def _cfg(num_clients=6, **section):
  cfg = config_lib.base_config()
  cfg.method = "aifed"
  cfg.model.name = "tiny_mlp"
  cfg.partition.num_clients = num_clients
  cfg.aifed.upload_when = "consistent"  # the threshold rule of Eq. 8-9 (the rank default has its own tests)
  for key, value in section.items():
    cfg.aifed[key] = value
  return cfg


def _strategy(**section):
  strategy = AiFed(_cfg(**section).aifed, _ctx())
  return strategy, strategy.init(PARAMS0)


def _np(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _random_like(tree, rng, scale=1.0):
  return jax.tree.map(lambda x: jnp.asarray(scale * rng.normal(size=np.shape(x)), jnp.float32), tree)


def _payload(mask, lir=1.0, round_hat=0, n=10):
  return {"sent": {"mask": jnp.asarray(mask, bool), "round": jnp.int32(round_hat), "num_samples": jnp.int32(n),
                   "lir": jnp.float32(lir)},
          "local": {"rc": jnp.ones(len(mask)), "threshold": jnp.float32(0.5), "delta_acc": jnp.float32(0.0)}}


def _arrival(client, start, delta, mask, n=10, lir=1.0, dispatch_round=0, time=0, staleness=0):
  return Arrival(client=client, num_samples=n, staleness=staleness, dispatch_round=dispatch_round,
                 params_start=start, delta=delta, payload=_payload(mask, lir, dispatch_round, n), arrival_time=time)


# --- ALMU: Eq. 8 against scipy ----------------------------------------------------------------------


def test_consistency_is_squared_pearson_of_cosine_rdas_like_scipy():
  rng = np.random.default_rng(0)
  reps_glo = rng.normal(size=(12, 7)).astype(np.float32)
  reps_loc = (reps_glo + 0.6 * rng.normal(size=(12, 7))).astype(np.float32)
  first = np.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 9])
  second = np.array([1, 5, 3, 11, 4, 10, 7, 8, 9, 11, 6, 10])
  weights = np.array([1] * 10 + [0, 0], bool)  # the last two pairs are padding
  rda_glo = aifed.dissimilarity_array(jnp.asarray(reps_glo), jnp.asarray(first), jnp.asarray(second))
  rda_loc = aifed.dissimilarity_array(jnp.asarray(reps_loc), jnp.asarray(first), jnp.asarray(second))
  ref_glo = np.array([scipy.spatial.distance.cosine(reps_glo[i], reps_glo[j]) for i, j in zip(first, second)])
  ref_loc = np.array([scipy.spatial.distance.cosine(reps_loc[i], reps_loc[j]) for i, j in zip(first, second)])
  assert_close(rda_glo, ref_glo, f32_tolerance(7))  # cosine distances of 7-vectors
  assert_close(rda_loc, ref_loc, f32_tolerance(7))
  expected = scipy.stats.pearsonr(ref_glo[weights], ref_loc[weights])[0] ** 2
  assert 0.05 < expected < 0.95
  np.testing.assert_allclose(float(aifed.representational_consistency(rda_glo, rda_loc, jnp.asarray(weights))),
                             expected, rtol=1e-4)
  # Padding must not count: off-trend values there change nothing (but would change an unweighted r²).
  outliers = rda_loc.at[10:].set(jnp.array([1.9, 0.0]) * jnp.sign(rda_glo[10:] - 1.0))
  np.testing.assert_allclose(float(aifed.representational_consistency(rda_glo, outliers, jnp.asarray(weights))),
                             expected, rtol=1e-4)
  assert abs(scipy.stats.pearsonr(ref_glo, np.asarray(outliers))[0] ** 2 - expected) > 1e-2


def test_consistency_is_zero_for_constant_rda_or_too_few_pairs():
  flat = jnp.ones(6)
  varied = jnp.arange(6.0)
  assert float(aifed.representational_consistency(flat, varied, jnp.ones(6, bool))) == 0.0
  assert float(aifed.representational_consistency(varied, varied, jnp.array([1, 0, 0, 0, 0, 0], bool))) == 0.0
  np.testing.assert_allclose(float(aifed.representational_consistency(varied, 3 * varied + 1, jnp.ones(6, bool))),
                             1.0, rtol=1e-6)


def test_stimuli_are_up_to_s_per_class_from_the_clients_valid_samples():
  labels = jnp.array([0, 1, 1, 0, 2, 1, 1, 0, 1, 2, 2, 0])
  valid = jnp.arange(12) < 10  # the last two positions are padding (labels 2, 0 there must not be used)
  positions, ok = aifed.select_stimuli(jax.random.key(1), labels, valid, num_classes=4, per_class=3)
  positions, ok = np.asarray(positions).reshape(4, 3), np.asarray(ok).reshape(4, 3)
  np.testing.assert_array_equal(ok.sum(axis=1), [3, 3, 2, 0])  # class 0: 3 of 3 valid; 2: two valid; 3: none
  for c in range(4):
    chosen = positions[c][ok[c]]
    assert len(set(chosen)) == len(chosen)
    assert np.all(np.asarray(labels)[chosen] == c) and np.all(chosen < 10)


def test_pairs_are_distinct_valid_and_as_many_as_exist():
  valid = jnp.array([1, 0, 1, 1, 0, 1], bool)  # 4 valid stimuli: 6 valid pairs
  first, second, real = aifed.sample_pairs(jax.random.key(2), valid, num_pairs=10)
  first, second, real = map(np.asarray, (first, second, real))
  assert real.sum() == 6
  pairs = {(int(i), int(j)) for i, j, r in zip(first, second, real) if r}
  assert pairs == {(i, j) for i in (0, 2, 3, 5) for j in (0, 2, 3, 5) if i < j}
  first, second, real = map(np.asarray, aifed.sample_pairs(jax.random.key(2), valid, num_pairs=4))
  assert real.all() and len({(int(i), int(j)) for i, j in zip(first, second)}) == 4


# --- ALMU: Eq. 9 and the mask -----------------------------------------------------------------------


@pytest.mark.parametrize("round_hat,delta_acc,a_r,a_acc", [(0, 0.0, 0.3, -1.0), (7, 0.25, 0.1, -2.0),
                                                           (3, -0.5, -0.2, 1.5)])
def test_threshold_is_the_logistic_of_eq9(round_hat, delta_acc, a_r, a_acc):
  at = aifed.adaptive_threshold(jnp.int32(round_hat), jnp.float32(delta_acc), a_r, a_acc)
  np.testing.assert_allclose(float(at), 1.0 / (1.0 + math.exp(-(a_r * round_hat + a_acc * delta_acc))), rtol=1e-6)


def _client_data(rng, n=24, padded=30):
  x_all = jnp.asarray(rng.normal(size=(40, 4)), jnp.float32)
  y_all = jnp.asarray(rng.integers(0, 2, size=40), jnp.int32)  # the client holds labels 0 and 1 only
  row = np.zeros(padded, np.int32)
  row[:n] = rng.permutation(40)[:n]
  return x_all, y_all, jnp.asarray(row), n


def _tiny_mlp_reps(params, x):
  p = _np(params)["params"]
  h = x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]
  return {"Dense_0": h, "Dense_1": np.maximum(h, 0) @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]}


@pytest.mark.slow
def test_upload_mask_follows_rc_against_the_threshold_on_a_hand_made_client():
  """Dense_0 unchanged (rc = 1 up to rounding), Dense_1 scrambled (rc low): with AT = 0.9 the client sends
  Dense_0 only. rc, δ_acc and AT are checked against NumPy/scipy recomputations."""
  rng = np.random.default_rng(5)
  x_all, y_all, row, n = _client_data(rng)
  start = _random_like(PARAMS0, rng)  # nonzero biases: no representation is the zero vector
  end = {"params": {"Dense_0": start["params"]["Dense_0"],
                    "Dense_1": _random_like(PARAMS0["params"]["Dense_1"], rng, scale=2.0)}}
  a_r = math.log(0.9 / 0.1) / 4  # AT = 0.9 at r̂ = 4 when δ_acc contributes nothing (α_acc = 0)
  strategy, state = _strategy(alpha_round=a_r, alpha_acc=0.0, accuracy_data="local", stimuli_per_class=4,
                              num_pairs=12)
  job = ClientJob(client=3, data=ClientData(x_all, y_all, row, None, n), aux=jnp.int32(4))
  payload = jax.device_get(strategy.client.payload(start, end, job))
  # The same stimuli and pairs as the client (same key), representations and rc recomputed by hand.
  key = jax.random.fold_in(strategy._key, 3)
  k_stim, k_pair = jax.random.split(key)
  valid = np.arange(30) < n
  labels = np.asarray(y_all)[np.asarray(row)]
  positions, ok = aifed.select_stimuli(k_stim, jnp.asarray(labels), jnp.asarray(valid), NUM_CLASSES, 4)
  first, second, real = map(np.asarray, aifed.sample_pairs(k_pair, ok, 12))
  x = np.asarray(x_all)[np.asarray(row)[np.asarray(positions)]]
  glo, loc = _tiny_mlp_reps(start, x), _tiny_mlp_reps(end, x)
  for index, name in enumerate(NAMES):
    rda = [np.array([scipy.spatial.distance.cosine(r[name][i], r[name][j])
                     for i, j, ok_ in zip(first, second, real) if ok_]) for r in (glo, loc)]
    np.testing.assert_allclose(payload["local"]["rc"][index], scipy.stats.pearsonr(*rda)[0] ** 2, rtol=1e-3,
                               atol=1e-5)
  assert payload["local"]["rc"][0] > 0.999 and payload["local"]["rc"][1] < 0.9
  # δ_acc on the client's whole data (accuracy_data='local'), by hand.
  xs, ys = np.asarray(x_all)[np.asarray(row)[:n]], labels[:n]
  acc = lambda params: np.mean(np.argmax(_tiny_mlp_reps(params, xs)["Dense_1"], -1) == ys)
  np.testing.assert_allclose(payload["local"]["delta_acc"], acc(end) - acc(start), atol=1e-6)
  np.testing.assert_allclose(payload["local"]["threshold"], 0.9, rtol=1e-5)
  np.testing.assert_array_equal(payload["sent"]["mask"], [True, False])
  assert int(payload["sent"]["round"]) == 4 and int(payload["sent"]["num_samples"]) == n


@pytest.mark.slow
def test_threshold_uses_delta_acc_and_variants_without_almu_send_everything():
  rng = np.random.default_rng(6)
  x_all, y_all, row, n = _client_data(rng)
  end = _random_like(PARAMS0, rng)
  job = ClientJob(client=1, data=ClientData(x_all, y_all, row, None, n), aux=jnp.int32(2))
  strategy, _ = _strategy(alpha_round=0.4, alpha_acc=-3.0, accuracy_data="local")
  payload = jax.device_get(strategy.client.payload(PARAMS0, end, job))
  local = payload["local"]
  assert local["delta_acc"] != 0.0
  np.testing.assert_allclose(local["threshold"], 1 / (1 + math.exp(-(0.4 * 2 - 3.0 * local["delta_acc"]))), rtol=1e-5)
  np.testing.assert_array_equal(payload["sent"]["mask"], local["rc"] >= local["threshold"])
  strategy, _ = _strategy(alpha_round=0.4, alpha_acc=-3.0, accuracy_data="local", upload_when="changed")
  np.testing.assert_array_equal(strategy.client.payload(PARAMS0, end, job)["sent"]["mask"],
                                local["rc"] < local["threshold"])
  for variant in ("agma", "lis", "lir"):
    strategy, _ = _strategy(variant=variant)
    assert np.asarray(strategy.client.payload(PARAMS0, end, job)["sent"]["mask"]).all()


@pytest.mark.slow
def test_client_payload_vmaps_over_a_leading_client_axis():
  """The ALMU function is pure in arrays: vmapped over three clients it equals three separate calls."""
  rng = np.random.default_rng(11)
  x_all, y_all, _, _ = _client_data(rng)
  rows = jnp.asarray(np.stack([rng.permutation(40)[:30] for _ in range(3)]), jnp.int32)
  sizes = jnp.array([30, 12, 21], jnp.int32)
  ends = [_random_like(PARAMS0, rng, 0.3) for _ in range(3)]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *ends)
  strategy, _ = _strategy(accuracy_data="local", accuracy_batch_size=8)
  keys = jnp.stack([jax.random.fold_in(strategy._key, c) for c in range(3)])
  rounds = jnp.array([0, 3, 9], jnp.int32)
  batched = jax.vmap(strategy._payload, in_axes=(None, 0, None, None, 0, 0, 0, 0))(
      PARAMS0, stacked, x_all, y_all, rows, sizes, rounds, keys)
  for c in range(3):
    job = ClientJob(client=c, data=ClientData(x_all, y_all, rows[c], None, int(sizes[c])), aux=rounds[c])
    single = strategy.client.payload(PARAMS0, ends[c], job)
    # vmapped and single programs sum in other orders: representations of the 30-sample rows, then r².
    assert_close(jax.tree.map(lambda b: b[c], batched), single, f32_tolerance(30 * 16, depth=2))


# --- ALMU: the rank reading (upload_when='rank') ------------------------------------------------------


def _reference_ranks(rc, window):
  """Brute force: per layer, sort the group {rc_l} ∪ window[:, l] with the client first (a stable sort
  puts it before equal values) and read its position: 0 = least consistent."""
  ranks = []
  for l in range(len(rc)):
    group = np.concatenate([[rc[l]], window[:, l]])
    order = np.argsort(group, kind="stable")
    ranks.append(int(np.nonzero(order == 0)[0][0]))
  return np.array(ranks)


def test_rank_rule_probabilities_by_hand_and_mask_against_numpy():
  rc = np.array([0.9, 0.2, 0.5, 0.5, 0.99], np.float32)
  window = np.array([[0.1, 0.3, 0.5, 0.7, 0.4],
                     [0.95, 0.25, 0.4, 0.6, 0.8],
                     [0.5, 0.1, 0.6, 0.5, 0.2]], np.float32)  # W = 4
  # By hand: values below rc_l per layer are {0.1, 0.5}, {0.1}, {0.4} (0.5 ties), {} (0.5 ties), all three.
  ranks = np.array([2, 1, 1, 0, 3])
  np.testing.assert_array_equal(_reference_ranks(rc, window), ranks)
  expected_p = 1.0 - (ranks + 1) / 4.0  # [0.25, 0.5, 0.5, 0.75, 0]
  for seed in range(20):
    key = jax.random.key(seed)
    mask, p = aifed.rank_upload_mask(jnp.asarray(rc), jnp.asarray(window), jnp.bool_(True), key)
    np.testing.assert_allclose(p, expected_p, rtol=1e-6)
    u = np.asarray(jax.random.uniform(key, (5,)))  # the documented draw: one u per layer from the key
    np.testing.assert_array_equal(mask, u >= (ranks + 1) / 4.0)
    assert not bool(mask[4])  # the most consistent of the group never uploads (the code's p = m/m)
  # Until the window is full, everything is sent.
  mask, p = aifed.rank_upload_mask(jnp.asarray(rc), jnp.asarray(window), jnp.bool_(False), jax.random.key(0))
  assert np.asarray(mask).all() and np.all(np.asarray(p) == 1.0)


@pytest.mark.slow
def test_rank_rule_upload_rates_match_the_rank_probabilities():
  """Over many keys each layer goes at its rate 1 − (j+1)/W; random groups average (W−1)/(2W)."""
  rng = np.random.default_rng(3)
  window = rng.uniform(size=(7, 8)).astype(np.float32)  # W = 8, the code's m
  rc = np.sort(rng.uniform(size=8)).astype(np.float32)
  ranks = _reference_ranks(rc, window)
  keys = jax.random.split(jax.random.key(4), 4000)
  masks, _ = jax.vmap(aifed.rank_upload_mask, in_axes=(None, None, None, 0))(
      jnp.asarray(rc), jnp.asarray(window), jnp.bool_(True), keys)
  rate, p = np.asarray(masks).mean(axis=0), 1.0 - (ranks + 1) / 8.0
  assert np.all(np.abs(rate - p) <= 4 * np.sqrt(p * (1 - p) / 4000) + 1e-9)  # 4 sigma
  groups = rng.uniform(size=(3000, 8, 4)).astype(np.float32)  # exchangeable groups: the rank is uniform
  masks, _ = jax.vmap(aifed.rank_upload_mask, in_axes=(0, 0, None, 0))(
      jnp.asarray(groups[:, 0]), jnp.asarray(groups[:, 1:]), jnp.bool_(True), jax.random.split(jax.random.key(5), 3000))
  assert abs(float(np.asarray(masks).mean()) - 7 / 16) < 0.02


def _rank_job(rng, client=2, reports=9, window_rows=3):
  x_all, y_all, row, n = _client_data(rng)
  window = jnp.asarray(rng.uniform(size=(window_rows, 2)), jnp.float32)
  aux = {"round": jnp.int32(3), "rc_window": window, "reports": jnp.int32(reports)}
  return ClientJob(client=client, data=ClientData(x_all, y_all, row, None, n), aux=aux)


@pytest.mark.slow
@pytest.mark.parametrize("rank_layers", ["all", "largest"])
def test_rank_payload_uses_its_own_key_reports_rc_and_is_deterministic(rank_layers):
  rng = np.random.default_rng(12)
  job = _rank_job(rng)
  end = _random_like(PARAMS0, rng, 0.5)
  strategy, _ = _strategy(upload_when="rank", rank_window=4, rank_layers=rank_layers)
  payload = jax.device_get(strategy.client.payload(PARAMS0, end, job))
  rc = payload["local"]["rc"]
  np.testing.assert_array_equal(payload["sent"]["rc"], rc)  # the report the server ranks against
  key = jax.random.fold_in(jax.random.fold_in(seeding.device_key(0, "aifed/upload"), 2), 9)
  mask, p = aifed.rank_upload_mask(jnp.asarray(rc), job.aux["rc_window"], jnp.bool_(True), key)
  gated = np.array([True, rank_layers == "all"])  # Dense_0 (30 parameters) is TinyMLP's largest layer
  np.testing.assert_array_equal(payload["sent"]["mask"], np.where(gated, mask, True))
  np.testing.assert_allclose(payload["local"]["upload_probability"], np.where(gated, p, 1.0))
  np.testing.assert_allclose(p, 1.0 - (_reference_ranks(rc, np.asarray(job.aux["rc_window"])) + 1) / 4.0)
  assert int(payload["sent"]["round"]) == 3
  # Deterministic: a second strategy from the same config decides the same, bit for bit.
  again, _ = _strategy(upload_when="rank", rank_window=4, rank_layers=rank_layers)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(again.client.payload(PARAMS0, end, job)), payload)
  # Fewer than W − 1 reports at dispatch: no full group yet, every layer is sent.
  early = _rank_job(np.random.default_rng(12), reports=2)
  assert np.asarray(strategy.client.payload(PARAMS0, end, early)["sent"]["mask"]).all()


@pytest.mark.slow
def test_rank_coin_flips_differ_between_updates_and_leave_the_stimuli_alone():
  """The u of an update come from (client, reports at dispatch): another update of the same client
  draws anew, while its stimuli, pairs and rc (the 'aifed/stimuli' stream) stay the same."""
  rng = np.random.default_rng(13)
  end = _random_like(PARAMS0, rng, 0.5)
  strategy, _ = _strategy(upload_when="rank", rank_window=2)
  window = jnp.full((1, 2), 2.0)  # above any rc: rank 0 of 2, P(upload) = 1/2 for both layers
  masks, rcs = [], []
  for reports in range(1, 41):
    job = _rank_job(np.random.default_rng(13), reports=reports, window_rows=1)
    job = dataclasses.replace(job, aux={**job.aux, "rc_window": window})
    payload = jax.device_get(strategy.client.payload(PARAMS0, end, job))
    masks.append(payload["sent"]["mask"])
    rcs.append(payload["local"]["rc"])
  assert all(np.array_equal(r, rcs[0]) for r in rcs)
  assert 10 < np.asarray(masks).sum() < 70  # 80 fair coins, not one repeated draw
  consistent, _ = _strategy()
  job = _rank_job(np.random.default_rng(13))
  plain = dataclasses.replace(job, aux=jnp.int32(3))
  np.testing.assert_array_equal(consistent.client.payload(PARAMS0, end, plain)["local"]["rc"], rcs[0])


def test_rank_server_keeps_the_last_reports_and_sends_them_at_dispatch():
  rng = np.random.default_rng(14)
  strategy, state = _strategy(upload_when="rank", rank_window=3, buffer_size=5)
  assert state.rc_window.shape == (2, 2) and not np.asarray(state.rc_window).any()
  delta = jax.tree.map(jnp.zeros_like, PARAMS0)
  reports = [np.array([0.1, 0.2]), np.array([0.3, 0.4]), np.array([0.5, 0.6])]
  masks = [[1, 0], [0, 0], [1, 1]]  # the second sends no layer: its rc still counts
  for i, (rc, mask) in enumerate(zip(reports, masks)):
    arrival = _arrival(i, PARAMS0, delta, mask)
    arrival.payload["sent"]["rc"] = jnp.asarray(rc, jnp.float32)
    state, _ = strategy.receive(state, [arrival])
    if not any(mask):
      assert strategy.upload_bytes(arrival) == 4 * 2  # an empty update costs its report (2 floats) only
  # Ring of W − 1 = 2 rows: report 2 overwrote report 0 (row 0), report 1 is in row 1.
  np.testing.assert_allclose(state.rc_window, [reports[2], reports[1]], rtol=1e-7)
  assert state.arrivals == 3 and state.empty_uploads == 1 and len(state.starts) == 2
  aux = strategy.dispatch(state, 4)[2]
  assert int(aux["round"]) == 0 and int(aux["reports"]) == 3
  np.testing.assert_array_equal(aux["rc_window"], state.rc_window)
  # The threshold readings keep their state, dispatch and payload as they were: no window, no report.
  plain, plain_state = _strategy()
  x_all, y_all, row, n = _client_data(rng)
  job = ClientJob(client=0, data=ClientData(x_all, y_all, row, None, n), aux=jnp.int32(0))
  assert plain_state.rc_window is None and int(plain.dispatch(plain_state, 0)[2]) == 0
  assert "rc" not in plain.client.payload(PARAMS0, PARAMS0, job)["sent"]


def test_lir_is_entropy_in_bits_or_label_number():
  counts = jnp.array([5.0, 0.0, 3.0, 2.0])
  np.testing.assert_allclose(float(aifed.label_richness(counts, "entropy")),
                             scipy.stats.entropy([5, 3, 2], base=2), rtol=1e-6)
  assert float(aifed.label_richness(counts, "label_number")) == 3.0
  assert float(aifed.label_richness(jnp.array([0.0, 7.0, 0.0]), "entropy")) == 0.0


# --- AGMA: Eqs. 10-15 and Eq. 6 ---------------------------------------------------------------------


def test_weights_are_eq15_products_of_shares():
  sizes, rounds_hat, lirs, r = np.array([10.0, 30.0, 20.0]), np.array([4, 2, 5]), np.array([1.0, 2.0, 0.5]), 6
  lis = (math.e / 2) ** -(r - rounds_hat)
  np.testing.assert_allclose(aifed.staleness_level(r, jnp.asarray(rounds_hat)), lis, rtol=1e-6)
  full = sizes / 60 * lis / lis.sum() * lirs / 3.5
  np.testing.assert_allclose(aifed.aggregation_weights(sizes, lis, lirs), full, rtol=1e-5)
  np.testing.assert_allclose(aifed.aggregation_weights(sizes, lis, lirs, use_lir=False), sizes / 60 * lis / lis.sum(),
                             rtol=1e-5)
  np.testing.assert_allclose(aifed.aggregation_weights(sizes, lis, lirs, use_lis=False), sizes / 60 * lirs / 3.5,
                             rtol=1e-5)
  # Every client single-labelled (IE = 0): the LIR factor is uniform, not 0/0.
  np.testing.assert_allclose(aifed.aggregation_weights(sizes, lis, np.zeros(3), use_lis=False), sizes / 60 / 3,
                             rtol=1e-6)


def _hand_update(params, starts, deltas, masks, beta, senders_only):
  """Eq. 6 by hand: per layer, the LUM row prefilled with the global layer (or senders only)."""
  out = _np(params)
  for l, name in enumerate(NAMES):
    for leaf in ("kernel", "bias"):
      g = out["params"][name][leaf]
      local = [np.asarray(s["params"][name][leaf], np.float64) + np.asarray(d["params"][name][leaf], np.float64)
               for s, d in zip(starts, deltas)]
      sent = [k for k in range(len(starts)) if masks[k][l]]
      if not sent:
        continue
      if senders_only:
        total = sum(beta[k] for k in sent)
        out["params"][name][leaf] = sum(beta[k] / total * local[k] for k in sent)
      else:
        lum = [local[k] if masks[k][l] else g for k in range(len(starts))]
        out["params"][name][leaf] = sum(beta[k] / sum(beta) * lum[k] for k in range(len(starts)))
  return out


@pytest.mark.parametrize("senders_only", [False, True])
def test_layerwise_update_by_hand_and_unsent_layer_kept_exactly(senders_only):
  rng = np.random.default_rng(7)
  params = _random_like(PARAMS0, rng)
  starts = [_random_like(PARAMS0, rng) for _ in range(3)]
  deltas = [_random_like(PARAMS0, rng, 0.1) for _ in range(3)]
  beta = np.array([0.2, 0.05, 0.1])
  for masks in ([[1, 0], [0, 0], [1, 0]], [[1, 1], [0, 1], [1, 0]]):
    new = aifed.layerwise_update(params, tuple(starts), tuple(deltas), jnp.asarray(masks, jnp.float32),
                                 jnp.asarray(beta, jnp.float32), NAMES, senders_only)
    assert_close(new, _hand_update(params, starts, deltas, masks, beta, senders_only), f32_tolerance(3, depth=2))
    if not any(m[1] for m in masks):  # no client sent Dense_1: bit-for-bit the global layer
      jax.tree.map(np.testing.assert_array_equal, new["params"]["Dense_1"], params["params"]["Dense_1"])


def test_counter_aggregates_queue_with_eq15_weights_and_skips_empty_uploads():
  rng = np.random.default_rng(8)
  strategy, state = _strategy(buffer_size=3)
  state = state.replace(round=5)
  starts = [_random_like(PARAMS0, rng) for _ in range(4)]
  deltas = [_random_like(PARAMS0, rng, 0.1) for _ in range(4)]
  a = [_arrival(0, starts[0], deltas[0], [1, 0], n=10, lir=1.0, dispatch_round=4),
       _arrival(1, starts[1], deltas[1], [0, 0], n=50, lir=2.0, dispatch_round=5)]  # sends nothing
  state, changed = strategy.receive(state, a)
  assert not changed and len(state.starts) == 1 and state.empty_uploads == 1
  b = [_arrival(2, starts[2], deltas[2], [1, 1], n=30, lir=2.0, dispatch_round=2),
       _arrival(3, starts[3], deltas[3], [0, 1], n=20, lir=0.5, dispatch_round=5)]
  new, changed = strategy.receive(state, b)
  assert changed and new.round == 6 and new.starts == () and new.arrivals == 4
  sizes, rounds_hat, lirs = np.array([10.0, 30, 20]), np.array([4, 2, 5]), np.array([1.0, 2.0, 0.5])
  lis = (math.e / 2) ** -(6 - rounds_hat)
  beta = sizes / sizes.sum() * lis / lis.sum() * lirs / lirs.sum()
  np.testing.assert_allclose(strategy.diagnostics(new)["weights"], beta / beta.sum(), rtol=1e-5)
  expected = _hand_update(PARAMS0, [starts[0], starts[2], starts[3]], [deltas[0], deltas[2], deltas[3]],
                          [[1, 0], [1, 1], [0, 1]], beta, senders_only=False)
  assert_close(new.params, expected, f32_tolerance(3, depth=2))  # three clients mixed, then added
  assert new.layer_uploads == (2, 2)


def test_timer_fires_on_the_queue_as_it_stood_at_the_tick():
  rng = np.random.default_rng(9)
  strategy, state = _strategy(trigger="timer", period=100)
  d = [_random_like(PARAMS0, rng, 0.1) for _ in range(4)]
  state, changed = strategy.receive(state, [_arrival(0, PARAMS0, d[0], [1, 1], time=40)])
  assert not changed
  state, changed = strategy.receive(state, [_arrival(1, PARAMS0, d[1], [1, 1], time=100)])  # at the tick: included
  assert changed and state.round == 1 and state.starts == () and state.next_tick == 200
  state, changed = strategy.receive(state, [_arrival(2, PARAMS0, d[2], [1, 1], time=150)])
  assert not changed
  before = state.params
  state, changed = strategy.receive(state, [_arrival(3, PARAMS0, d[3], [1, 1], time=320)])  # after: next tick
  assert changed and state.round == 2 and len(state.starts) == 1 and state.next_tick == 400
  # The round used client 2's model alone (LIS/LIR/size shares of one client are all 1).
  expected = jax.tree.map(lambda s, dd: np.asarray(s, np.float64) + np.asarray(dd, np.float64), PARAMS0, d[2])
  assert_close(state.params, expected, f32_tolerance(1))  # one client's model: s + Δ
  assert not jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), before, state.params))
  state, changed = strategy.receive(state, [_arrival(4, PARAMS0, d[0], [0, 0], time=400)])  # only an empty one
  assert changed and state.round == 3  # the tick still aggregates client 3's queued model


# --- accounting -------------------------------------------------------------------------------------


def test_upload_bytes_are_the_sent_layers_plus_the_small_payload():
  strategy, _ = _strategy()
  sizes = {name: sum(4 * np.size(x) for x in jax.tree.leaves(PARAMS0["params"][name])) for name in NAMES}
  extra = 2 * 1 + 4 + 4 + 4  # mask (2 bools), r̂, n, LIR
  delta = jax.tree.map(jnp.zeros_like, PARAMS0)
  for mask, expected in (([1, 1], sizes["Dense_0"] + sizes["Dense_1"] + extra), ([0, 1], sizes["Dense_1"] + extra),
                         ([1, 0], sizes["Dense_0"] + extra), ([0, 0], 0)):
    assert strategy.upload_bytes(_arrival(0, PARAMS0, delta, mask)) == expected


# --- config -----------------------------------------------------------------------------------------


def test_validation_names_each_bad_field():
  cfg = _cfg(variant="both", lir="gini", trigger="clock", normalisation="none", accuracy_data="test",
             upload_when="never", stimuli_per_class=0, num_pairs=-2, period=0, alpha_round=float("nan"),
             alpha_acc=float("inf"), buffer_size=99, rank_window=1, rank_layers="some")
  errors = "\n".join(config_lib.config_errors(cfg))
  for field, value in (("variant", "'both'"), ("lir", "'gini'"), ("trigger", "'clock'"), ("normalisation", "'none'"),
                       ("accuracy_data", "'test'"), ("upload_when", "'never'"), ("stimuli_per_class", "0"),
                       ("num_pairs", "-2"), ("period", "0"),
                       ("alpha_round", "nan"), ("alpha_acc", "inf"), ("buffer_size", "99"), ("rank_window", "1"),
                       ("rank_layers", "'some'")):
    assert f"aifed.{field}={value} is invalid; allowed:" in errors, field
  assert "upload_when" in "\n".join(config_lib.config_errors(_cfg(upload_when="rank ")))
  for rule in aifed.UPLOAD_RULES:
    assert not config_lib.config_errors(_cfg(upload_when=rule)), rule
  assert not config_lib.config_errors(_cfg(upload_when="rank", rank_window=2, rank_layers="largest"))
  assert not config_lib.config_errors(_cfg())
