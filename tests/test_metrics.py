"""Evaluation and the run-level metrics (fedpsa_jax/metrics.py), against hand computations: the test-set
evaluator (padding masked out), the personalised evaluator, AULC, the finiteness check and `summarize`."""

from __future__ import annotations

import math
import types

import jax.numpy as jnp
import numpy as np
import pytest

from fedpsa_jax import metrics


def _linear(params, x):
  return x @ params["w"]


def _log_softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# Five samples, three classes. Class 0 wins wherever x is zero, so a padded (zero) row would count as a
# correct prediction of label 0 if the mask did not drop it.
X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.2, -2.0]], np.float32)
Y = np.array([1, 2, 0, 2, 0], np.int32)
W = np.array([[0.0, 2.0, -1.0], [0.0, -1.0, 3.0]], np.float32)  # logits = x @ W


def _by_hand(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
  logits = x.astype(np.float64) @ w.astype(np.float64)
  accuracy = float(np.mean(np.argmax(logits, -1) == y))
  loss = float(-np.mean(_log_softmax(logits)[np.arange(len(y)), y]))
  return accuracy, loss


@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 64])
def test_the_evaluator_matches_a_hand_computation_for_any_batch_size(batch_size):
  accuracy, loss = _by_hand(X, Y, W)
  assert accuracy == 0.6  # (predictions 1, 2, 2, 2, 1: samples 0, 1 and 3 right, 2 and 4 wrong)
  out = metrics.make_evaluator(_linear, jnp.asarray(X), jnp.asarray(Y), batch_size)({"w": jnp.asarray(W)})
  assert out["test_accuracy"] == pytest.approx(accuracy, abs=1e-7)
  assert out["test_loss"] == pytest.approx(loss, rel=1e-5)  # (float32 sums of five terms of magnitude ~1)


def test_the_personal_evaluator_pools_each_clients_samples_under_its_assigned_model():
  x, y = jnp.asarray(X), jnp.asarray(Y)
  w_good = W
  w_zero = np.zeros_like(W)  # predicts class 0 everywhere: right on samples 2 and 4 only
  tests = [np.array([0, 1]), np.array([2, 3]), np.array([4]), np.array([], np.int64)]
  evaluate = metrics.make_personal_evaluator(_linear, x, y, tests, batch_size=2)
  models = [{"w": jnp.asarray(w_good)}, {"w": jnp.asarray(w_zero)}]
  # Clients 0 and 2 on the good model (samples 0, 1 right; 4 wrong), client 1 on the zero model (sample 2
  # right, 3 wrong), client 3 has no test samples: 3 right of 5.
  assert evaluate(models, np.array([0, 1, 0, 1])) == pytest.approx(3 / 5)
  # All on the good model: the test-set accuracy over the same five samples.
  assert evaluate(models, np.array([0, 0, 0, 0])) == pytest.approx(_by_hand(X, Y, W)[0])
  # All on the zero model: samples 2 and 4 (label 0) are right.
  assert evaluate(models, np.array([1, 1, 1, 1])) == pytest.approx(2 / 5)
  assert math.isnan(metrics.make_personal_evaluator(_linear, x, y, [np.array([], np.int64)], 2)(models, np.array([0])))


def test_aulc_is_the_trapezoid_area_in_accuracy_days():
  # 0.5 day from 0.2 to 0.4 (area 0.15), then 1 day from 0.4 to 0.8 (area 0.6).
  assert metrics.aulc([0.0, 0.5, 1.5], [0.2, 0.4, 0.8]) == pytest.approx(0.75)
  assert metrics.aulc([0.0], [0.9]) == 0.0 and metrics.aulc([], []) == 0.0


def test_tree_is_finite_sees_a_nan_or_inf_in_any_leaf():
  tree = {"a": jnp.ones(3), "b": {"c": jnp.zeros((2, 2))}}
  assert metrics.tree_is_finite(tree)
  assert not metrics.tree_is_finite({**tree, "a": jnp.array([1.0, jnp.nan, 0.0])})
  assert not metrics.tree_is_finite({**tree, "b": {"c": jnp.full((2, 2), jnp.inf)}})


def _loop(**fields):
  base = dict(status="completed", now=43_200, round=7, client_updates=40, server_seconds=1.5,
              bytes_uploaded=4 * 2 ** 20, bytes_downloaded=2 ** 20, diverged_at=None)
  return types.SimpleNamespace(**{**base, **fields})


HISTORY = [
    {"day": 0.0, "time": 0, "round": 0, "client_updates": 0, "bytes_uploaded": 0, "test_accuracy": 0.1,
     "test_loss": 2.3},
    {"day": 0.25, "time": 21_600, "round": 3, "client_updates": 20, "bytes_uploaded": 2 ** 21, "test_accuracy": 0.7,
     "test_loss": 0.9, "personalized_accuracy": 0.5},
    {"day": 0.5, "time": 43_200, "round": 7, "client_updates": 40, "bytes_uploaded": 2 ** 22, "test_accuracy": 0.6,
     "test_loss": 1.1, "personalized_accuracy": 0.8},
]
ACCOUNTING = {"wall_seconds": 8.0, "train_seconds": 5.0}
RUN = {"method": "fedbuff", "dataset": "mnist_5k", "model": "linear", "seed": 0}


def test_summarize_by_hand():
  s = metrics.summarize(HISTORY, _loop(), RUN, ACCOUNTING, target_accuracy=0.65)
  area = 0.25 * (0.1 + 0.7) / 2 + 0.25 * (0.7 + 0.6) / 2  # 0.2625
  assert s["status"] == "completed" and s["method"] == "fedbuff" and s["seed"] == 0
  assert (s["final_test_accuracy"], s["best_test_accuracy"], s["final_test_loss"]) == (0.6, 0.7, 1.1)
  assert s["aulc"] == pytest.approx(area) and s["aulc_per_day"] == pytest.approx(area / 0.5)
  assert (s["virtual_days"], s["time"], s["rounds"], s["client_updates"]) == (0.5, 43_200, 7, 40)
  assert s["client_updates_per_second"] == 5.0 and s["server_compute_seconds"] == 1.5
  assert s["uploaded_mb"] == 4.0
  assert s["upload_bytes_per_update"] == 4 * 2 ** 20 / 40 and s["download_bytes_per_update"] == 2 ** 20 / 40
  assert s["diverged_at"] is None
  assert (s["final_personalized_accuracy"], s["best_personalized_accuracy"]) == (0.8, 0.8)
  # The first evaluation at or above 0.65: the second (0.7), on test accuracy; the third (0.8) personalised.
  assert s["target_accuracy"] == 0.65
  assert (s["day_to_target"], s["round_to_target"], s["client_updates_to_target"]) == (0.25, 3, 20)
  assert s["bytes_uploaded_to_target"] == 2 ** 21 and s["time_to_target"] == 21_600
  assert (s["personalized_day_to_target"], s["personalized_round_to_target"]) == (0.5, 7)
  assert s["wall_seconds"] == 8.0 and s["train_seconds"] == 5.0  # the accounting, as given


def test_summarize_of_a_target_never_reached_no_target_and_an_empty_or_diverged_run():
  s = metrics.summarize(HISTORY, _loop(), RUN, ACCOUNTING, target_accuracy=0.95)
  assert s["day_to_target"] is None and s["personalized_day_to_target"] is None
  s = metrics.summarize(HISTORY[:1], _loop(), RUN, ACCOUNTING)  # no target, no personalised accuracy
  assert not any(k.endswith("to_target") or "personalized" in k for k in s) and "target_accuracy" not in s
  assert s["aulc"] == 0.0 and s["aulc_per_day"] == 0.0
  s = metrics.summarize([], _loop(status="diverged", diverged_at=0.125, client_updates=0, now=0), RUN,
                        {"wall_seconds": 0.0})
  assert s["final_test_accuracy"] is None and s["best_test_accuracy"] is None and s["final_test_loss"] is None
  assert s["diverged_at"] == 0.125 and s["client_updates_per_second"] == 0.0
  assert s["upload_bytes_per_update"] == 0.0 and s["download_bytes_per_update"] == 0.0
  assert metrics.summarize(HISTORY, _loop(diverged_at=0.3), RUN, ACCOUNTING)["diverged_at"] is None  # completed
