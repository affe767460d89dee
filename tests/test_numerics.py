"""The suite's float comparison (tests/numerics.py): it accepts rounding noise, rejects small real errors,
and refuses a tolerance too loose to see them."""

from __future__ import annotations

import numpy as np
import pytest

from numerics import BREAK, EPS32, assert_close, f32_tolerance


def _sum_two_orders(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """64 float32 sums of n products each, forward and reversed: equal in exact arithmetic, not in float32."""
  terms = rng.normal(size=(64, n)).astype(np.float32) * rng.normal(size=(64, n)).astype(np.float32)
  forward = np.zeros(64, np.float32)
  backward = np.zeros(64, np.float32)
  for k in range(n):
    forward += terms[:, k]
    backward += terms[:, n - 1 - k]
  return forward, backward


def test_f32_tolerance_formula():
  assert f32_tolerance(1) == pytest.approx(16 * EPS32)
  assert f32_tolerance(6400) == pytest.approx(16 * EPS32 * 80)
  assert f32_tolerance(100, depth=3) == pytest.approx(3 * f32_tolerance(100))
  with pytest.raises(ValueError):
    f32_tolerance(0)


def test_accepts_two_summation_orders_and_cancellation():
  forward, backward = _sum_two_orders(4096, np.random.default_rng(0))
  assert not np.array_equal(forward, backward)  # the orders really round differently
  assert_close(forward, backward, f32_tolerance(4096))
  # A near-zero element made by cancellation carries the noise of the large terms: an elementwise relative
  # tolerance would reject it, this one does not.
  desired = np.array([1000.0, -1000.0, 0.001], np.float64)
  assert_close(desired + np.array([0.0, 0.0, 1000.0 * 4 * EPS32]), desired, f32_tolerance(4))


@pytest.mark.parametrize("shape", [(), (7,), (3, 5)])
def test_rejects_a_factor_and_one_wrong_element(shape):
  rng = np.random.default_rng(1)
  desired = rng.normal(size=shape) + 0.5
  rel = f32_tolerance(10_000)
  assert_close(desired, desired, rel)
  with pytest.raises(AssertionError, match="not close"):
    assert_close((1 + BREAK) * desired, desired, rel)
  broken = np.array(desired)
  broken.flat[-1] += BREAK * np.sqrt(np.mean(desired**2))
  with pytest.raises(AssertionError, match="not close"):
    assert_close(broken, desired, rel)


def test_refuses_a_tolerance_that_could_not_see_a_one_percent_error():
  desired = np.linspace(1.0, 2.0, 9)
  with pytest.raises(AssertionError, match="too loose"):
    assert_close(desired, desired, 0.02)


def test_pytrees_leaf_by_leaf_and_structure():
  a = {"w": np.ones((2, 2)), "b": np.zeros(2)}
  assert_close(a, {"w": np.ones((2, 2)), "b": np.zeros(2)}, 1e-6)
  with pytest.raises(AssertionError, match="not close"):  # an all-zero leaf must stay exactly zero
    assert_close({"w": np.ones((2, 2)), "b": np.array([0.0, 1e-9])}, a, 1e-6)
  with pytest.raises(AssertionError, match="trees differ"):
    assert_close(a, {"w": np.ones((2, 2))}, 1e-6)
  with pytest.raises(AssertionError, match="shapes differ"):
    assert_close(np.ones(3), np.ones(4), 1e-6)
  with pytest.raises(AssertionError):
    assert_close(np.array([1.0, np.nan]), np.array([1.0, 1.0]), 1e-6)
