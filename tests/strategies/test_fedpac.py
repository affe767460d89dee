"""FedPAC (strategies/fedpac.py): its quadratic program against brute force and exact solutions, the
client's statistics and local loss by hand and through the trainer, the server's flush by hand, and the refusal
of a model without a feature extractor.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import local
from fedpsa_jax.local import ClientData
from fedpsa_jax.strategies import ClientJob
from fedpsa_jax.strategies.fedpac import AlignmentLoss, FedPAC, collaboration_weights, solve_simplex_qp
from helpers import (_add, _arrival, _close, _np_tree as _np, _random_like, AGGREGATION_TOL, baseline_cfg as _cfg,
                     baseline_ctx as _ctx, HIDDEN, MODEL, NUM_CLASSES, PARAMS0)
from numerics import assert_close, f32_tolerance


# FedPAC's classifier weights come from SLSQP, run on float32 statistics in the code and on float64 ones here;
# the solver stops at its own tolerance (1e-6 on the objective), far above float32 rounding.
QP_TOL = 1e-4


# --- FedPAC: the quadratic program ------------------------------------------------------------------


def _qp_matrix_by_hand(v, h, i):
  """The official code's loops: P = diag(V) + [Σ_k (h_i[k] − h_j1[k])·(h_i[k] − h_j2[k])]_{j1 j2}."""
  m = len(v)
  p = np.zeros((m, m))
  for j1, j2 in itertools.product(range(m), range(m)):
    p[j1, j2] = sum(float(np.dot(h[i][k] - h[j1][k], h[i][k] - h[j2][k])) for k in range(h.shape[1]))
  return p + np.diag(v)


def _simplex_grid(step):
  a = np.arange(0, step + 1)
  a1, a2 = np.meshgrid(a, a, indexing="ij")
  keep = a1 + a2 <= step
  return np.stack([a1[keep], a2[keep], step - a1[keep] - a2[keep]], axis=1) / step


@pytest.mark.parametrize("seed,reference", [(0, 0), (1, 1), (2, 2)])
def test_fedpac_qp_matches_brute_force_on_three_clients(seed, reference):
  rng = np.random.default_rng(seed)
  v = rng.uniform(0.05, 0.6, size=3)
  h = rng.normal(size=(3, NUM_CLASSES, 4)) * np.array([0.3, 0.5, 1.5])[:, None, None]  # client 2 far off
  p = _qp_matrix_by_hand(v, h, reference)
  alpha = solve_simplex_qp(p)
  assert np.all(alpha >= 0) and abs(alpha.sum() - 1) < 1e-12
  grid = _simplex_grid(600)
  values = np.einsum("gi,ij,gj->g", grid, p, grid)
  best = grid[np.argmin(values)]
  assert alpha @ p @ alpha <= values.min() + 1e-12
  np.testing.assert_allclose(alpha, best, atol=2.0 / 600)


def test_fedpac_qp_exact_solutions_and_weight_threshold():
  # Diagonal P (clients with equal statistics but the far one): α_j ∝ 1 / P_jj, so the far client
  # keeps a tiny weight (~5e-4), which the 1e-3 threshold of the official code then zeroes.
  v = np.array([0.2, 0.2, 0.2])
  h = np.zeros((3, 1, 2))
  h[2] = 10.0
  p = _qp_matrix_by_hand(v, h, 0)
  np.testing.assert_allclose(solve_simplex_qp(p), (1 / np.diag(p)) / np.sum(1 / np.diag(p)), atol=1e-8)
  np.testing.assert_allclose(collaboration_weights(v, h)[0], [0.5, 0.5, 0.0], atol=1e-8)
  # Clients on a line, the reference at one end: the KKT solution has α_2 = 0 exactly,
  # α_0 / α_1 = P_11 / P_00 = 1.1 / 0.1.
  h = np.array([[[0.0, 0.0]], [[1.0, 0.0]], [[2.0, 0.0]]])
  np.testing.assert_allclose(solve_simplex_qp(_qp_matrix_by_hand(np.full(3, 0.1), h, 0)), [11 / 12, 1 / 12, 0.0],
                             atol=1e-8)
  # A vertex: (P e_0)_j >= (P e_0)_0 for every j, so e_0 satisfies the KKT conditions.
  p = np.array([[1.0, 1.2, 1.2], [1.2, 4.0, 1.0], [1.2, 1.0, 4.0]])
  assert np.all(np.linalg.eigvalsh(p) >= 0)
  np.testing.assert_allclose(solve_simplex_qp(p), [1.0, 0.0, 0.0], atol=1e-9)
  np.testing.assert_allclose(solve_simplex_qp(np.array([[2.0]])), [1.0])


# --- FedPAC: client side ----------------------------------------------------------------------------


def _features(params, x):
  p = _np(params)["params"]["Dense_0"]
  return np.maximum(np.asarray(x, np.float64) @ p["kernel"] + p["bias"], 0.0)


def test_fedpac_client_statistics_by_hand():
  strategy = FedPAC(_cfg("fedpac", buffer_size=2, stats_batch_size=4).fedpac, _ctx())
  strategy.init(PARAMS0)
  rng = np.random.default_rng(4)
  x_all = rng.normal(size=(30, 4)).astype(np.float32)
  y_all = np.array([0, 1] * 15, np.int32)  # class 2 absent from this client
  n = 7  # 7 real samples in a row padded to 10 (chunks of 4: 4 + 3 real + 3 padding)
  row = np.concatenate([rng.permutation(30)[:n], np.zeros(3, int)]).astype(np.int32)
  start, end = PARAMS0, _add(_np(PARAMS0), _np(_random_like(PARAMS0, rng, 0.3)))
  job = ClientJob(client=0, data=ClientData(jnp.asarray(x_all), jnp.asarray(y_all), jnp.asarray(row), None, n))
  got = jax.device_get(strategy.client.payload(start, jax.tree.map(jnp.asarray, end), job))
  x, y = x_all[row[:n]], y_all[row[:n]]
  f0, f1 = _features(start, x), _features(end, x)
  counts = np.bincount(y, minlength=NUM_CLASSES)
  np.testing.assert_allclose(got["counts"], counts)
  v, h = 0.0, np.zeros((NUM_CLASSES, HIDDEN))
  for k in range(NUM_CLASSES):
    if counts[k] == 0:
      np.testing.assert_allclose(got["prototypes"][k], 0.0)
      continue
    assert_close(got["prototypes"][k], f1[y == k].mean(0), f32_tolerance(4 * n))  # features: fan-in 4, ≤ n rows
    # statistics_extraction of the official code: p_k tr(F_k^T F_k / n_k) − p_k² ||μ_k||², then / n
    pk, fk = counts[k] / n, f0[y == k]
    h[k] = pk * fk.mean(0)
    v += pk * np.trace(fk.T @ fk / len(fk)) - pk ** 2 * np.sum(fk.mean(0) ** 2)
  assert_close(got["h"], h, f32_tolerance(4 * n))
  np.testing.assert_allclose(float(got["v"]), v / n, rtol=1e-5)


@pytest.mark.slow
def test_fedpac_local_loss_by_hand_and_through_the_trainer():
  lam = 0.7
  loss = AlignmentLoss(lam)
  jitted = jax.jit(loss, static_argnums=0)  # eager op-by-op dispatch would cost seconds
  rng = np.random.default_rng(5)
  x = rng.normal(size=(6, 4)).astype(np.float32)
  y = np.array([0, 1, 2, 1, 0, 2], np.int32)
  mask = np.array([1, 1, 1, 1, 1, 0], np.float32)  # one padding position
  protos = rng.normal(size=(NUM_CLASSES, HIDDEN)).astype(np.float32)
  known = np.array([True, True, False])  # class 2 has no global prototype yet
  got = float(jitted(MODEL.apply, PARAMS0, PARAMS0, x, y, mask, (protos, known)))
  logits = np.asarray(MODEL.apply(PARAMS0, x), np.float64)
  ce = np.log(np.exp(logits).sum(1)) - logits[np.arange(6), y]
  align = np.mean((_features(PARAMS0, x) - protos[y]) ** 2, axis=1) * known[y]
  np.testing.assert_allclose(got, np.sum((ce + lam * align) * mask) / 5, rtol=1e-5)
  # Through LocalTrainer's hook with aux: one full-batch step (n = B = 5) is p − lr ∇loss.
  trainer = local.LocalTrainer(MODEL.apply, batch_size=5, epochs=1, loss=loss)
  row = jnp.arange(5, dtype=jnp.int32)
  data = local.ClientData(jnp.asarray(x), jnp.asarray(y), row, None, 5)
  trained = trainer.train_job(PARAMS0, data, lr=0.1, clients_key=jax.random.key(0), job_id=0,
                              aux=(jnp.asarray(protos), jnp.asarray(known)))
  grads = jax.jit(jax.grad(lambda p: loss(MODEL.apply, p, p, x[:5], y[:5], np.ones(5, np.float32),
                                         (protos, known))))(PARAMS0)
  _close(trained, jax.tree.map(lambda p, g: np.asarray(p, np.float64) - 0.1 * np.asarray(g, np.float64),
                               PARAMS0, grads), rel=f32_tolerance(5 * 4, depth=2))  # one step, batch 5


# --- FedPAC: server side ----------------------------------------------------------------------------


def _fedpac_payload(rng, counts):
  counts = np.asarray(counts, np.float32)
  return {"counts": jnp.asarray(counts),
          "prototypes": jnp.asarray(rng.normal(size=(NUM_CLASSES, HIDDEN)) * (counts > 0)[:, None], jnp.float32),
          "v": jnp.float32(rng.uniform(0.01, 0.2)),
          "h": jnp.asarray(0.3 * rng.normal(size=(NUM_CLASSES, HIDDEN)), jnp.float32)}


def test_fedpac_flush_by_hand():
  """Extractor, prototypes, personalised classifiers and the evaluated classifier over two flushes."""
  sizes = np.array([10, 30, 20, 40])
  strategy = FedPAC(_cfg("fedpac", buffer_size=3).fedpac, _ctx(num_clients=4, sizes=sizes))
  state = strategy.init(PARAMS0)
  rng = np.random.default_rng(6)
  w = _np(PARAMS0)
  # Before any flush: clients start from the global model; no prototype is known.
  _, start2, (protos, known) = strategy.dispatch(state, 2)
  _close(start2, w)
  assert not np.any(np.asarray(known))

  expected_heads: dict[int, dict] = {}
  protos_ref, known_ref = np.zeros((NUM_CLASSES, HIDDEN)), np.zeros(NUM_CLASSES, bool)
  # Flush 1: clients 0, 1, 2 (class 1 unseen by two of them); flush 2: 3, 0, 1 (class 2 unseen by all,
  # so its prototype keeps its flush-1 value; clients 0 and 1 start from their personalised heads).
  for clients, counts in [((0, 1, 2), [[3, 0, 7], [0, 30, 0], [5, 5, 10]]),
                          ((3, 0, 1), [[0, 40, 0], [2, 8, 0], [30, 0, 0]])]:
    starts = [strategy.dispatch(state, c)[1] for c in clients]
    arrivals = [_arrival(c, _random_like(PARAMS0, rng, 0.1), start=s, num_samples=int(sizes[c]),
                         payload=_fedpac_payload(rng, cnt)) for c, s, cnt in zip(clients, starts, counts)]
    state, changed = strategy.receive(state, [arrivals[0]])
    assert not changed
    state, changed = strategy.receive(state, arrivals[1:])  # a same-time pair completes the buffer
    assert changed
    # Extractor: w + Σ_j (n_j / Σ n) Δ_j.
    shares = sizes[list(clients)] / sizes[list(clients)].sum()
    w = _add(w, *[_np(a.delta) for a in arrivals], scales=[1.0, *shares])
    _close(state.params["params"]["Dense_0"], w["params"]["Dense_0"])
    # Prototypes: count-weighted per class; unseen classes unchanged.
    c = np.array(counts, np.float64)
    ps = np.stack([np.asarray(a.payload["prototypes"], np.float64) for a in arrivals])
    for k in range(NUM_CLASSES):
      if c[:, k].sum() > 0:
        protos_ref[k] = (c[:, k, None] * ps[:, k]).sum(0) / c[:, k].sum()
        known_ref[k] = True
    assert_close(state.prototypes, protos_ref, AGGREGATION_TOL)
    np.testing.assert_array_equal(np.asarray(state.known), known_ref)
    # Classifier collaboration: α_i from the QP on the hand matrix, small weights zeroed.
    v = np.array([float(a.payload["v"]) for a in arrivals])
    h = np.stack([np.asarray(a.payload["h"], np.float64) for a in arrivals])
    trained = [_add(_np(a.params_start)["params"]["Dense_1"], _np(a.delta)["params"]["Dense_1"]) for a in arrivals]
    for i, client in enumerate(clients):
      alpha = solve_simplex_qp(_qp_matrix_by_hand(v, h, i))
      alpha = np.where(alpha > 1e-3, alpha, 0.0)
      alpha /= alpha.sum()
      assert_close(state.last_alphas[i], alpha, QP_TOL)
      expected_heads[client] = _add(*trained, scales=list(alpha))
      _close(strategy.dispatch(state, client)[1]["params"]["Dense_1"], expected_heads[client], rel=QP_TOL)
    # Evaluated: the averaged extractor with the data-size-weighted personalised classifiers.
    total = sum(sizes[c] for c in expected_heads)
    global_head = _add(*expected_heads.values(), scales=[sizes[c] / total for c in expected_heads])
    _close(strategy.eval_models(state).params["params"]["Dense_1"], global_head, rel=QP_TOL)
    _close(strategy.eval_models(state).params["params"]["Dense_0"], w["params"]["Dense_0"])
    # A client without a personalised classifier starts from the global one; the aux is c.
    if 3 not in expected_heads:
      _close(strategy.dispatch(state, 3)[1]["params"]["Dense_1"], global_head, rel=QP_TOL)
    assert_close(strategy.dispatch(state, 3)[2][0], protos_ref, AGGREGATION_TOL)
  assert max(abs(a - 1.0) for row in state.last_alphas for a in row) > 0.05  # some real collaboration


def test_fedpac_rejects_the_linear_model():
  cfg = _cfg("fedpac", buffer_size=2)
  cfg.model.name = "linear"
  with pytest.raises(ValueError, match="model.name='linear'.*FedPAC needs a feature extractor"):
    config_lib.validate(cfg)
  with pytest.raises(ValueError, match="the linear model has none, as in the paper"):
    FedPAC(cfg.fedpac, _ctx(model_name=cfg.model.name))
  for name in ("mnist_cnn", "cifar_cnn", "tiny_mlp"):
    cfg.model.name = name
    assert config_lib.config_errors(cfg) == []
