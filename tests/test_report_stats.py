"""The seed-blocked statistics (report_stats): one-sample tests, contrasts of arms within a seed, power and the
upper bound of a spread, against scipy, brute-force loops, a least-squares fit and simulation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from fedpsa_lab import report_stats


def test_one_sample_is_scipys_t_test_and_interval():
  v = [0.7, 1.13, 0.33, -0.2, 1.9]
  d = report_stats.one_sample(v)
  assert d.p_value == pytest.approx(scipy.stats.ttest_1samp(v, 0.0).pvalue, rel=1e-12)
  half = scipy.stats.t.ppf(0.975, 4) * np.std(v, ddof=1) / math.sqrt(5)
  assert (d.diff.mean, d.diff.half_width, d.diff.n) == (pytest.approx(np.mean(v)), pytest.approx(half), 5)
  assert math.isnan(report_stats.one_sample([1.0]).p_value)
  assert report_stats.one_sample([0.5, 0.5, 0.5]).p_value == 0.0


def _values(rng, arms=("a", "b", "c"), blocks=(0.1, 1.0), seeds=range(6)):
  return {a: {b: {s: float(rng.normal(i, 1.0)) for s in seeds} for b in blocks} for i, a in enumerate(arms)}


def test_seed_contrasts_by_a_loop_and_an_incomplete_seed_left_out():
  rng = np.random.default_rng(0)
  values = _values(rng)
  del values["b"][1.0][4]  # seed 4 lacks one cell of a weighted arm: it must not count at all
  values["c"][0.1].pop(5)  # seed 5 lacks a cell of an arm weighted 0: it still counts
  weights = {"a": 0.5, "b": 0.5, "c": 0.0}
  weights_ab = {"a": 1.0, "b": -1.0}
  got = report_stats.seed_contrasts(values, weights_ab)
  expected = {}
  for s in range(6):
    if s == 4:
      continue
    per_block = [values["a"][b][s] - values["b"][b][s] for b in (0.1, 1.0)]
    expected[s] = sum(per_block) / 2
  assert got.keys() == expected.keys() and all(got[s] == pytest.approx(expected[s]) for s in got)
  assert set(report_stats.seed_contrasts(values, weights)) == {0, 1, 2, 3, 5}


def test_seed_blocked_two_arms_is_the_paired_test_of_seed_means_and_a_fit_with_seed_effects():
  rng = np.random.default_rng(1)
  values = _values(rng, arms=("a", "b"), seeds=range(8))
  d = report_stats.seed_blocked(values, {"a": 1.0, "b": -1.0})
  mean_a = [np.mean([values["a"][b][s] for b in (0.1, 1.0)]) for s in range(8)]
  mean_b = [np.mean([values["b"][b][s] for b in (0.1, 1.0)]) for s in range(8)]
  assert d.p_value == pytest.approx(scipy.stats.ttest_rel(mean_a, mean_b).pvalue, rel=1e-10)
  # The same test as least squares with a fixed effect per seed, y = μ_s + β [arm = a] + e (the seed as a block):
  y = np.array(mean_a + mean_b)
  x = np.zeros((16, 9))
  x[np.arange(16), np.tile(np.arange(8), 2)] = 1.0
  x[:8, 8] = 1.0
  beta, residual, *_ = np.linalg.lstsq(x, y, rcond=None)
  sigma2 = residual[0] / (16 - 9)
  se = math.sqrt(sigma2 * np.linalg.inv(x.T @ x)[8, 8])
  assert d.diff.mean == pytest.approx(beta[8])
  assert d.p_value == pytest.approx(2 * scipy.stats.t.sf(abs(beta[8]) / se, 7), rel=1e-8)
  assert d.diff.half_width == pytest.approx(scipy.stats.t.ppf(0.975, 7) * se, rel=1e-8)


def test_seed_blocked_is_blind_to_what_a_seed_shares_and_pooling_pairs_is_not():
  # Three blocks whose differences share each seed's offset: the seed-blocked test sees 4 units, not 12 pairs,
  # and its p is the one-sample p of the 4 seed means, larger than a test treating the 12 pairs as independent.
  offsets = [0.9, -0.4, 1.6, 0.2]
  values = {"a": {b: {s: 1.0 + offsets[s] + 0.01 * b for s in range(4)} for b in range(3)},
            "b": {b: {s: 0.0 for s in range(4)} for b in range(3)}}
  d = report_stats.seed_blocked(values, {"a": 1.0, "b": -1.0})
  seed_means = [1.0 + o + 0.01 for o in offsets]
  assert d.diff.n == 4 and d.p_value == pytest.approx(scipy.stats.ttest_1samp(seed_means, 0).pvalue)
  pairs = [1.0 + o + 0.01 * b for b in range(3) for o in offsets]
  assert scipy.stats.ttest_1samp(pairs, 0).pvalue < d.p_value / 10


@pytest.mark.parametrize("sd,n,effect", [(1.0, 8, 1.0), (0.88, 8, 1.0), (1.22, 12, 1.0), (1.0, 5, 0.0)])
def test_power_agrees_with_simulated_t_tests(sd, n, effect):
  rng = np.random.default_rng(2)
  samples = rng.normal(effect, sd, size=(40_000, n))
  p = scipy.stats.ttest_1samp(samples, 0.0, axis=1).pvalue
  simulated = float(np.mean(p < 0.05))
  assert report_stats.power_paired_t(sd, n, effect) == pytest.approx(simulated, abs=0.01)  # MC s.e. <= 0.0025


def test_power_is_a_probability_wherever_the_noncentrality_is_large():
  # Both tails summed: at nc = 8.4 the lower tail is ~1e-20, where scipy's nct.cdf gives NaN; the power must still be
  # the upper tail (and 1 in the limit), rising with the effect and symmetric in its sign.
  effects = np.linspace(0.0, 6.0, 121)
  power = np.array([report_stats.power_paired_t(0.4, 5, e) for e in effects])
  assert np.isfinite(power).all() and (np.diff(power) >= 0).all() and power[-1] == pytest.approx(1.0)
  assert report_stats.power_paired_t(0.4, 5, 1.5) == pytest.approx(scipy.stats.nct.sf(
      scipy.stats.t.ppf(0.975, 4), 4, 1.5 * math.sqrt(5) / 0.4), abs=1e-15)
  assert report_stats.power_paired_t(0.4, 5, -1.0) == pytest.approx(report_stats.power_paired_t(0.4, 5, 1.0))
  assert report_stats.power_paired_t(0.4, 5, 0.0) == pytest.approx(0.05, rel=1e-9)  # the level, at no effect


def test_power_agrees_with_statsmodels_wherever_statsmodels_is_finite():
  # statsmodels' TTestPower is the reference formula; it is NaN where the noncentrality is large (its lower tail
  # from nct.cdf), which is where power_paired_t must still be finite (the test above).
  from statsmodels.stats.power import TTestPower

  finite = 0
  for sd, n, effect, level in itertools.product((0.2, 0.4, 0.82, 1.5), (3, 5, 8, 12), (0.0, 0.25, 1.0, 2.0),
                                                (0.05, 0.0125)):
    reference = TTestPower().power(effect_size=effect / sd, nobs=n, alpha=level, alternative="two-sided")
    if np.isfinite(reference):
      finite += 1
      assert report_stats.power_paired_t(sd, n, effect, level) == pytest.approx(reference, rel=1e-9, abs=1e-12)
  assert finite > 100  # most of the 256 points: the comparison is not vacuous
  assert np.isnan(TTestPower().power(effect_size=1.5 / 0.4, nobs=5, alpha=0.05, alternative="two-sided"))


@pytest.mark.slow
def test_sd_upper_bound_covers_the_true_sd_at_its_confidence():
  rng = np.random.default_rng(3)
  samples = rng.normal(0.0, 2.0, size=(40_000, 3))
  bounds = np.array([report_stats.sd_upper_bound(s, 3, 0.8) for s in samples.std(axis=1, ddof=1)])
  assert float(np.mean(bounds >= 2.0)) == pytest.approx(0.8, abs=0.01)


def test_the_shape_step_power_statement():
  # configs/results/shape_step.py's docstring: SD 0.40 over 3 seeds, its 80% upper bound 0.85; 8 seeds have 80%
  # power for one point up to SD 0.86, 0.81 at 0.85.
  assert report_stats.sd_upper_bound(0.40, 3, 0.8) == pytest.approx(0.85, abs=0.005)
  assert report_stats.power_paired_t(0.86, 8, 1.0) == pytest.approx(0.80, abs=0.005)
  assert report_stats.power_paired_t(0.85, 8, 1.0) == pytest.approx(0.81, abs=0.005)
  assert report_stats.power_paired_t(0.40, 8, 1.0) > 0.99


def test_the_horizon_power_statement():
  # docs/results.md, Q2: five seeds, 80% power for 0.67 points at SD 0.40 and 1.43 at 0.85; one point: 98%, 52%.
  assert report_stats.power_paired_t(0.40, 5, 0.67) == pytest.approx(0.80, abs=0.005)
  assert report_stats.power_paired_t(0.85, 5, 1.43) == pytest.approx(0.80, abs=0.005)
  assert report_stats.power_paired_t(0.40, 5, 1.0) == pytest.approx(0.98, abs=0.005)
  assert report_stats.power_paired_t(0.85, 5, 1.0) == pytest.approx(0.52, abs=0.005)


def test_mean_correlation_is_scipys_t_test_and_interval_on_fishers_z():
  r = [0.12, 0.31, 0.05, 0.22, 0.18]
  z = np.arctanh(r)
  got = report_stats.mean_correlation(r)
  low, high = scipy.stats.t.interval(0.95, 4, loc=np.mean(z), scale=scipy.stats.sem(z))
  assert (got.r, got.low, got.high, got.n) == (pytest.approx(math.tanh(np.mean(z)), rel=1e-12),
                                               pytest.approx(math.tanh(low), rel=1e-12),
                                               pytest.approx(math.tanh(high), rel=1e-12), 5)
  assert got.p_value == pytest.approx(scipy.stats.ttest_1samp(z, 0.0).pvalue, rel=1e-12)
  # Correlations near 1 with a wide spread: on the r scale a t-interval would pass 1; on z it cannot.
  near_one = report_stats.mean_correlation([0.99, 0.5, 0.95])
  assert -1 < near_one.low < near_one.r < near_one.high < 1
  assert float(np.mean([0.99, 0.5, 0.95]) + scipy.stats.t.ppf(0.975, 2) * scipy.stats.sem([0.99, 0.5, 0.95])) > 1
  one = report_stats.mean_correlation([0.3])
  assert one.r == pytest.approx(0.3) and math.isnan(one.low) and math.isnan(one.p_value)


def test_partial_correlation_is_the_precision_matrix_formula_and_group_intercepts_are_removed():
  rng = np.random.default_rng(4)
  n = 400
  z = rng.normal(size=(n, 2))
  x = z @ [0.8, -0.3] + rng.normal(size=n)
  y = 0.5 * x + z @ [-0.4, 0.9] + rng.normal(size=n)
  precision = np.linalg.inv(np.corrcoef(np.column_stack([x, y, z]).T))
  expected = -precision[0, 1] / math.sqrt(precision[0, 0] * precision[1, 1])
  assert report_stats.partial_correlation(x, y, z) == pytest.approx(expected, rel=1e-9)
  # One covariate: the textbook (r_xy − r_xz r_yz) / √((1 − r_xz²)(1 − r_yz²)).
  r = np.corrcoef([x, y, z[:, 0]])
  one = (r[0, 1] - r[0, 2] * r[1, 2]) / math.sqrt((1 - r[0, 2] ** 2) * (1 - r[1, 2] ** 2))
  assert report_stats.partial_correlation(x, y, z[:, :1]) == pytest.approx(one, rel=1e-9)
  # Offsets shared within each of 4 groups (runs) are removed: the same value as with the offsets absent.
  groups = np.repeat(np.arange(4), n // 4)
  offset = np.array([5.0, -3.0, 8.0, 1.0])[groups]
  assert report_stats.partial_correlation(x + offset, y + 2 * offset, z, groups) == pytest.approx(
      report_stats.partial_correlation(x - _group_means(x, groups), y - _group_means(y, groups), z, groups), rel=1e-9)
  assert abs(report_stats.partial_correlation(x + offset, y + 2 * offset, z)) > 0.7 > abs(
      report_stats.partial_correlation(x + offset, y + 2 * offset, z, groups))


def test_partial_correlation_with_groups_is_least_squares_on_explicit_group_dummies():
  # The reference: x and y regressed on one indicator column per group plus the covariates, by lstsq, the
  # residuals correlated. Groups of unequal sizes whose covariates differ in mean, so centring has work to do.
  rng = np.random.default_rng(6)
  groups = np.repeat(np.arange(5), [30, 80, 45, 120, 25])
  z = rng.normal(size=(len(groups), 2)) + rng.normal(size=(5, 2))[groups] * 3
  x = z @ [0.6, 0.2] + rng.normal(size=len(groups)) + rng.normal(size=5)[groups] * 4
  y = 0.3 * x - z @ [0.5, 0.1] + rng.normal(size=len(groups)) + rng.normal(size=5)[groups] * 4
  design = np.column_stack([np.eye(5)[groups], z])
  residuals = [v - design @ np.linalg.lstsq(design, v, rcond=None)[0] for v in (x, y)]
  expected = np.corrcoef(*residuals)[0, 1]
  assert report_stats.partial_correlation(x, y, z, groups) == pytest.approx(expected, rel=1e-9)
  no_covariates = [v - _group_means(v, groups) for v in (x, y)]
  assert report_stats.partial_correlation(x, y, np.zeros((len(x), 0)), groups) == pytest.approx(
      np.corrcoef(*no_covariates)[0, 1], rel=1e-9)


def _group_means(v, groups):
  return np.array([v[groups == g].mean() for g in groups])


def test_cluster_bootstrap_resamples_whole_runs():
  # 10 runs of 50 identical rows each: resampling runs gives the spread of a mean of 10 run means (σ/√10);
  # resampling rows would give almost none.
  rng = np.random.default_rng(5)
  runs = [np.full(50, v) for v in rng.normal(0.0, 1.0, 10)]
  values = report_stats.cluster_bootstrap(runs, lambda chosen: np.concatenate(chosen).mean(), 4000, seed=0)
  expected = np.std([r[0] for r in runs]) / math.sqrt(10)  # the bootstrap's own (plug-in) standard error
  assert np.std(values) == pytest.approx(expected, rel=0.06)
  np.testing.assert_array_equal(values, report_stats.cluster_bootstrap(runs, lambda c: np.concatenate(c).mean(),
                                                                       4000, seed=0))  # seeded
