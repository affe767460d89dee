"""The latency model (sim/latency.py) against its documented laws: uniform draws cover the range, the long
tail is a floored bounded Pareto clustered near `low`, an unknown distribution is refused, and slow devices
multiply a fixed share of the clients' latencies (the default leaves every client as it was).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedpsa_jax.sim import latency as latency_lib
from fedpsa_jax.sim.latency import LatencyModel


N, C, LOW, HIGH = 50, 10, 10, 500


# --- latency ----------------------------------------------------------------------------------------


def test_uniform_draws_cover_range():
  x = latency_lib.draw_response_times("uniform", 200_000, LOW, HIGH, 1.0, np.random.default_rng(0))
  assert x.min() == LOW and x.max() == HIGH
  assert np.issubdtype(x.dtype, np.integer)
  counts = np.bincount(x - LOW, minlength=HIGH - LOW + 1)
  assert len(counts) == HIGH - LOW + 1 and counts.min() > 0
  # Uniform: a chi-square test on the 491 values.
  assert stats.chisquare(counts).pvalue > 1e-3


def _bounded_pareto_cdf(x, low, high, a):
  x = np.clip(x, low, high)
  return (1.0 - (low / x) ** a) / (1.0 - (low / high) ** a)


@pytest.mark.parametrize("shape", [1.0, 2.0, 0.5])
def test_long_tail_is_floored_bounded_pareto(shape):
  n = 100_000
  x = latency_lib.draw_response_times("long_tail", n, LOW, HIGH, shape, np.random.default_rng(1))
  assert np.issubdtype(x.dtype, np.integer)
  assert x.min() >= LOW and x.max() <= HIGH
  # Draws are floored to integers. floor(X) + U(0, 1) has as CDF the linear interpolation of the
  # bounded-Pareto CDF F between integers: P(Y <= y) = F(k) + (F(k+1) - F(k)) (y - k), k = floor(y).
  jitter = x + np.random.default_rng(2).random(n)

  def cdf(y, a=shape):
    k = np.floor(y)
    return _bounded_pareto_cdf(k, LOW, HIGH, a) + (
        _bounded_pareto_cdf(k + 1, LOW, HIGH, a) - _bounded_pareto_cdf(k, LOW, HIGH, a)) * (y - k)

  assert stats.kstest(jitter, cdf).pvalue > 1e-3
  # The test has power: a different shape is rejected.
  assert stats.kstest(jitter, lambda y: cdf(y, a=shape * 1.5)).pvalue < 1e-6
  # Median where the formula puts it: floor of low / (1 - (1 - (low/high)^a) / 2)^(1/a).
  median = np.floor(LOW * (1 - 0.5 * (1 - (LOW / HIGH) ** shape)) ** (-1 / shape))
  assert abs(np.median(x) - median) <= 1


def test_long_tail_default_clusters_near_low():
  x = latency_lib.draw_response_times("long_tail", 50_000, LOW, HIGH, 1.0, np.random.default_rng(3))
  # Documented in latency.py: median about 20, 90% within ~90 units, a tail up to 500.
  assert 15 <= np.median(x) <= 25
  assert np.median(x) < (LOW + HIGH) / 2 / 5
  assert 80 <= np.quantile(x, 0.9) <= 100
  assert x.max() > 400


def test_unknown_distribution_rejected():
  with pytest.raises(ValueError, match="sim.latency.distribution"):
    latency_lib.draw_response_times("gamma", 3, LOW, HIGH, 1.0, np.random.default_rng(0))


def test_slow_devices_multiply_a_fixed_share_and_default_is_unchanged():
  base = LatencyModel(50, "uniform", 10, 500, 1.0, "fixed", np.random.default_rng(7))
  same = LatencyModel(50, "uniform", 10, 500, 1.0, "fixed", np.random.default_rng(7), slow_fraction=0.0)
  assert np.array_equal(base.fixed, same.fixed)
  assert base.rng.bit_generator.state == same.rng.bit_generator.state  # no extra draw when off
  slow = LatencyModel(50, "uniform", 10, 500, 1.0, "fixed", np.random.default_rng(7), slow_fraction=0.3,
                      slow_factor=5.0)
  assert slow.slow.sum() == 15  # round(0.3 · 50)
  np.testing.assert_array_equal(slow.fixed[slow.slow], base.fixed[slow.slow] * 5)
  np.testing.assert_array_equal(slow.fixed[~slow.slow], base.fixed[~slow.slow])
  # per_dispatch: a slow client's draws are multiplied too.
  pd = LatencyModel(4, "uniform", 10, 20, 1.0, "per_dispatch", np.random.default_rng(0), slow_fraction=0.5)
  fast, slowc = int(np.flatnonzero(~pd.slow)[0]), int(np.flatnonzero(pd.slow)[0])
  assert all(10 <= pd.response_time(fast) <= 20 for _ in range(20))
  assert all(50 <= pd.response_time(slowc) <= 100 and pd.response_time(slowc) % 5 == 0 for _ in range(20))
