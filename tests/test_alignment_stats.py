"""Fig. 6's uncertainty and its trend control (fedpsa_lab/figures/fedpsa.py): the circular block bootstrap,
the within-run detrended correlation and the autocorrelations, each against an independent reference (a hand
computation, the partial-correlation formula, one least-squares fit, Bartlett's variance of r)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from fedpsa_lab.figures import fedpsa as fig


def _ar1(n: int, phi: float, rng: np.random.Generator) -> np.ndarray:
  """A stationary AR(1) series x_t = φ x_{t-1} + e_t with unit innovations."""
  e = rng.normal(size=n)
  x = np.empty(n)
  x[0] = e[0] / math.sqrt(1 - phi**2)
  for t in range(1, n):
    x[t] = phi * x[t - 1] + e[t]
  return x


def _frame(kappa, align, time=None, run=None) -> pd.DataFrame:
  n = len(kappa)
  return pd.DataFrame({"run": np.zeros(n, int) if run is None else run,
                       "time": np.arange(n, dtype=float) if time is None else time,
                       "kappa": kappa, "alignment": align})


def test_block_indices_stay_in_their_run_and_run_in_consecutive_wrapped_blocks():
  lengths, block = [5, 7, 2], 3
  rng = np.random.default_rng(0)
  for _ in range(50):
    idx = fig.block_bootstrap_indices(lengths, block, rng)
    assert len(idx) == sum(lengths)
    offset = 0
    for n in lengths:
      own = idx[offset:offset + n] - offset
      assert own.min() >= 0 and own.max() < n  # a run is rebuilt from its own rows only
      for start in range(0, n, block):  # within a block, each row follows the one before it, wrapping at n
        chunk = own[start:start + block]
        assert all((b - a) % n == 1 % n for a, b in zip(chunk, chunk[1:]))
      offset += n


def test_circular_blocks_draw_every_row_equally_often():
  # A moving (non-circular) block bootstrap draws the first and last rows less often; the circular one does not.
  n, block, draws = 10, 4, 20000
  rng = np.random.default_rng(1)
  counts = np.bincount(np.concatenate([fig.block_bootstrap_indices([n], block, rng) for _ in range(draws)]),
                       minlength=n)
  share = counts / counts.sum()
  np.testing.assert_allclose(share, 1 / n, atol=0.004)  # the moving version gives row 0 a share of 1/28


def test_block_length_is_the_median_run_length_to_the_third_rounded_up():
  frame = lambda *sizes: pd.DataFrame({"run": np.repeat(np.arange(len(sizes)), sizes)})
  assert fig.block_length(frame(161)) == 6  # 161^(1/3) = 5.44
  assert fig.block_length(frame(100, 161, 1000)) == 6
  assert fig.block_length(frame(1000)) == 10
  assert fig.block_length(frame(1)) == 1


@pytest.mark.slow
def test_block_intervals_widen_with_serial_dependence_as_bartlett_says():
  # Two independent AR(1) series: r has variance (1 + φ²) / (n (1 − φ²)) (Bartlett), 2.9x the 1/n that a
  # pair-by-pair bootstrap assumes at φ = 0.7. Blocks of n^(1/3) recover most of it.
  n, phi = 1000, 0.7
  rng = np.random.default_rng(2)
  frame = _frame(_ar1(n, phi, rng), _ar1(n, phi, rng))
  block = fig.block_length(frame)
  width = lambda b: np.diff(fig.alignment_intervals(frame, 0.1, b, resamples=1000, seed=3)["pearson"])[0]
  independent, blocked = width(1), width(block)
  assert independent == pytest.approx(2 * 1.96 / math.sqrt(n), rel=0.2)
  assert blocked == pytest.approx(2 * 1.96 * math.sqrt((1 + phi**2) / (n * (1 - phi**2))), rel=0.25)
  assert blocked > 1.3 * independent


def test_detrended_pearson_of_one_run_is_the_partial_correlation_given_time():
  rng = np.random.default_rng(4)
  time = np.sort(rng.uniform(0, 100, 300))
  kappa = 0.01 * time + rng.normal(size=300)
  align = -0.02 * time + 0.5 * kappa + rng.normal(size=300)
  r = lambda a, b: scipy.stats.pearsonr(a, b).statistic
  partial = (r(kappa, align) - r(kappa, time) * r(align, time)) / math.sqrt(
      (1 - r(kappa, time)**2) * (1 - r(align, time)**2))
  assert fig.detrended_pearson(kappa, align, time, np.zeros(300)) == pytest.approx(partial, abs=1e-12)


def test_detrended_pearson_of_several_runs_removes_a_line_per_run():
  # Reference: one least-squares fit with an intercept and a slope per run, without the run of 2 updates (which
  # its own line fits exactly).
  rng = np.random.default_rng(5)
  sizes = [40, 60, 2]
  run = np.repeat(np.arange(3), sizes)
  time = np.concatenate([np.sort(rng.uniform(0, 50, s)) for s in sizes])
  kappa = rng.normal(size=run.size) + run * time * 0.05
  align = 0.3 * kappa + rng.normal(size=run.size) - run * time * 0.05
  keep = run < 2
  design = np.column_stack([(run[keep] == k) * c for k in range(2) for c in (np.ones(keep.sum()), time[keep])])
  residual = lambda y: y[keep] - design @ np.linalg.lstsq(design, y[keep], rcond=None)[0]
  expected = scipy.stats.pearsonr(residual(kappa), residual(align)).statistic
  assert fig.detrended_pearson(kappa, align, time, run) == pytest.approx(expected, abs=1e-12)
  two_each = np.repeat(np.arange(50), 2)  # lines through every pair of points: nothing is left to correlate
  assert math.isnan(fig.detrended_pearson(kappa[:100], align[:100], time[:100], two_each))


def test_a_shared_drift_makes_the_raw_correlation_but_not_the_detrended_one():
  rng = np.random.default_rng(6)
  time = np.arange(2000.0)
  kappa = time / 2000 + 0.1 * rng.normal(size=2000)
  align = time / 2000 + 0.1 * rng.normal(size=2000)
  frame = _frame(kappa, align, time)
  assert fig.alignment_stats(kappa, align)["pearson"] > 0.85  # (1/12) / (1/12 + 0.01) = 0.89
  assert abs(fig.detrended_pearson(kappa, align, time, np.zeros(2000))) < 0.05
  low, high = fig.alignment_intervals(frame, 0.1, 13, resamples=300)["detrended_pearson"]
  assert low < 0 < high


def test_autocorrelations_by_hand():
  # One run [1, 2, 3, 4]: centred [-1.5, -0.5, 0.5, 1.5], Σ squares 5; lag 1: 1.25 / 5; lag 2: -1.5 / 5.
  one = _frame(np.array([1.0, 2, 3, 4]), np.zeros(4))
  assert fig.autocorrelations(one, "kappa", 3) == pytest.approx([0.25, -0.3, -0.45])
  # Pooled with a second run [0, 2] (centred [-1, 1]): numerators add (lag 1: 1.25 − 1), and so do the squares.
  two = _frame(np.array([1.0, 2, 3, 4, 0, 2]), np.zeros(6), run=np.array([0, 0, 0, 0, 1, 1]))
  assert fig.autocorrelations(two, "kappa", 2) == pytest.approx([0.25 / 7, -1.5 / 7])
  assert all(math.isnan(v) for v in fig.autocorrelations(one, "alignment", 2))  # a constant series


def test_summary_names_its_block_and_both_sets_of_intervals():
  rng = np.random.default_rng(8)
  kappa = rng.uniform(0, 1, 200)
  frame = _frame(kappa, 0.5 * kappa + rng.normal(0, 0.3, 200), run=np.repeat([0, 1], 100))
  stats = fig.alignment_summary(frame, 0.1, resamples=400)
  assert stats["runs"] == 2 and stats["block_length"] == 5 and stats["n"] == 200
  assert len(stats["autocorrelation"]["kappa"]) == 5
  for name in fig.CORRELATIONS:
    for key in ("intervals", "independent_intervals"):
      low, high = stats[key][name]
      assert low < stats[name] < high
  markdown = fig.alignment_markdown(stats)
  assert "blocks of 5 consecutive updates" in markdown and "detrended within each run" in markdown
  assert fig.alignment_summary(frame, 0.1, block=9, resamples=3)["block_length"] == 9
