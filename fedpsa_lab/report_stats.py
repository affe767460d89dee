"""The statistics a report states its uncertainty with: intervals over seeds and paired comparisons.

A sweep repeats each member over seeds 0..K-1, and two methods run with the same seed share the partition,
the clients' response times and the initial model. So a method is compared with a reference method seed by
seed (a paired test, which removes the variation the seeds share), and a cell's own spread is the Student-t
interval of its mean over the seeds. Both need at least two seeds; with one, they are NaN and the report
says it has one seed. A report makes many such comparisons at once (every method and column against the
reference), so beside each p it gives Holm's adjustment over the comparisons of its table (`holm`), and its
verdicts read the adjusted p. Where results are pooled over settings (columns, blocks) that share a seed, the
seed is the unit of analysis (`seed_blocked`): a contrast is computed within each seed, then tested over the
seeds, never over the (seed, setting) pairs as if they were independent. `power_paired_t` and `sd_upper_bound`
size a design from a pilot's spread.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.stats

CONFIDENCE = 0.95  # of every interval a report prints
SIGNIFICANCE = 1.0 - CONFIDENCE  # a paired difference is "larger than the noise" when p < this


@dataclasses.dataclass(frozen=True)
class Interval:
  """The mean of n values and the half-width of its two-sided t-interval (NaN for n < 2)."""

  mean: float
  half_width: float
  n: int


def interval(values: np.ndarray | list[float]) -> Interval:
  """mean ± t_{n-1, 0.975} · s / √n of `values` (s the sample standard deviation)."""
  v = np.asarray(values, float)
  n = len(v)
  if n == 0:
    return Interval(math.nan, math.nan, 0)
  if n == 1:
    return Interval(float(v[0]), math.nan, 1)
  t = scipy.stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)
  return Interval(float(v.mean()), float(t * v.std(ddof=1) / math.sqrt(n)), n)


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """`values − reference` over the seeds both have: its mean and t-interval, the paired t-test's two-sided p
  (NaN for fewer than two pairs, or when every difference is the same), and whether it is significant."""

  diff: Interval
  p_value: float

  @property
  def significant(self) -> bool:
    return bool(self.p_value < SIGNIFICANCE)  # (NaN compares False: too few seeds is never significant)

  @property
  def direction(self) -> int:
    """+1 significantly above the reference, -1 below, 0 within the noise."""
    return int(np.sign(self.diff.mean)) if self.significant else 0


def paired_difference(values: Mapping[int, float], reference: Mapping[int, float]) -> PairedDifference:
  """The paired comparison of `values` with `reference`, both {seed: value}, over their common seeds."""
  seeds = sorted(set(values) & set(reference))
  a = np.array([values[s] for s in seeds], float)
  b = np.array([reference[s] for s in seeds], float)
  diff = interval(a - b)
  p_value = math.nan
  if len(seeds) >= 2 and np.ptp(a - b) > 0:
    p_value = float(scipy.stats.ttest_rel(a, b).pvalue)
  elif len(seeds) >= 2 and diff.mean != 0:  # every pair differs by the same amount: no noise at all
    p_value = 0.0
  return PairedDifference(diff, p_value)


def one_sample(values: Sequence[float]) -> PairedDifference:
  """The mean of `values` (one per independent unit, e.g. a seed's contrast) with its t-interval and the two-sided
  p of the one-sample t-test of mean 0 (`scipy.stats.ttest_1samp`); NaN p for fewer than two values, 0 when every
  value is the same non-zero number (no noise at all)."""
  v = np.asarray(values, float)
  diff = interval(v)
  p_value = math.nan
  # (A spread at the level of float rounding is no spread: the t statistic would be rounding error.)
  if len(v) >= 2 and np.ptp(v) > 1e-12 * max(1.0, float(np.abs(v).max())):
    p_value = float(scipy.stats.ttest_1samp(v, 0.0).pvalue)
  elif len(v) >= 2 and diff.mean != 0:
    p_value = 0.0
  return PairedDifference(diff, p_value)


def seed_contrasts(values: Mapping[str, Mapping[Any, Mapping[int, float]]],
                   weights: Mapping[str, float]) -> dict[int, float]:
  """{seed: Σ_arm weights[arm] · (mean over blocks of values[arm][block][seed])}: a contrast of arms computed
  within each seed, blocks (e.g. the α of a sweep) averaged first. Only seeds present in every block of every
  weighted arm count (a partly finished seed is left out, not half-used)."""
  arms = [a for a, w in weights.items() if w != 0]
  blocks = sorted({b for a in arms for b in values.get(a, {})}, key=str)
  seeds = None
  for a in arms:
    for b in blocks:
      present = set(values.get(a, {}).get(b, {}))
      seeds = present if seeds is None else seeds & present
  return {s: float(sum(weights[a] * np.mean([values[a][b][s] for b in blocks]) for a in arms))
          for s in sorted(seeds or ())}


def seed_blocked(values: Mapping[str, Mapping[Any, Mapping[int, float]]],
                 weights: Mapping[str, float]) -> PairedDifference:
  """A contrast of arms with the seed as the unit of analysis: `seed_contrasts`, then `one_sample` over the seeds.

  Members that share a seed share the data split, the partition, every client's latency and the initial model,
  whatever their arm or block, so their results are not independent replicates: the seed is. For a difference
  of two arms over one block this is the paired t-test; over several blocks it is the paired t-test of the
  seeds' block means, which (balanced, every seed complete) is the test of the contrast in a mixed model with a
  random seed effect and a random seed × contrast effect, with no normality assumed of the blocks."""
  return one_sample(list(seed_contrasts(values, weights).values()))


def power_paired_t(sd: float, n: int, effect: float, level: float = SIGNIFICANCE) -> float:
  """The power of a two-sided one-sample (paired) t-test at `level` to detect a true mean `effect` with n units
  whose values spread with standard deviation `sd`: P(|T| > t_crit) for T noncentral t on n − 1 degrees of freedom
  with noncentrality effect √n / sd. The formula of statsmodels' `TTestPower().power`, which agrees wherever it is
  finite (tests/test_report_stats.py), but is NaN once the noncentrality is large (at SD 0.4, 5 seeds, an effect
  of 1.5), where it takes the lower tail from scipy's `nct.cdf`; this takes both tails as survival functions."""
  dof, nc = n - 1, effect * math.sqrt(n) / sd
  t_crit = scipy.stats.t.ppf(1 - level / 2, dof)
  # P(T < −t) as P(T' > t), T' of noncentrality −nc: scipy's nct.cdf is NaN at points of its far lower tail
  # (e.g. t = −2.78, 4 dof, nc = 8.4), where its sf is not.
  return float(scipy.stats.nct.sf(t_crit, dof, nc) + scipy.stats.nct.sf(t_crit, dof, -nc))


def sd_upper_bound(sd: float, n: int, confidence: float) -> float:
  """The one-sided upper `confidence` bound on a normal standard deviation estimated as `sd` from n values:
  sd · √((n − 1) / χ²_{1 − confidence, n − 1})."""
  return float(sd * math.sqrt((n - 1) / scipy.stats.chi2.ppf(1 - confidence, n - 1)))


def partial_correlation(x: np.ndarray, y: np.ndarray, covariates: np.ndarray,
                        groups: np.ndarray | None = None) -> float:
  """Pearson's correlation of x and y after both are regressed, by least squares, on an intercept per group (one
  for all without `groups`) and the columns of `covariates` ([n, c]): the correlation the covariates (and what
  each group shares) do not explain."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  groups = np.zeros(len(x), int) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
  # Frisch–Waugh–Lovell: the intercepts per group are absorbed by centring every column within its group, so the
  # least squares fit is over the covariates alone (n × c, not n × (groups + c): a bootstrap over many runs of
  # thousands of updates stays cheap).
  counts = np.bincount(groups)
  centre = lambda v: v - (np.bincount(groups, weights=v) / counts)[groups]
  design = np.column_stack([centre(c) for c in np.asarray(covariates, float).reshape(len(x), -1).T]) \
      if np.size(covariates) else np.zeros((len(x), 0))
  residuals = [centre(v) for v in (x, y)]
  if design.shape[1]:
    residuals = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in residuals]
  return float(np.corrcoef(*residuals)[0, 1])


@dataclasses.dataclass(frozen=True)
class CorrelationMean:
  """The mean of n correlations, one per independent unit, with its 95% interval (both on the r scale) and the
  two-sided p of the test of a zero mean (`mean_correlation`)."""

  r: float
  low: float
  high: float
  p_value: float
  n: int


def mean_correlation(values: Sequence[float]) -> CorrelationMean:
  """The mean of `values` (correlations, one per unit: a run) on Fisher's z scale, z = artanh r, with the t-interval
  over the units and the one-sample t-test of z = 0 (`one_sample`), back to r by tanh. On the z scale a correlation's
  sampling spread does not depend on its size and the interval cannot leave (−1, 1). With few units this is the
  honest interval: a bootstrap over n runs draws from n values only and is too narrow for small n."""
  z = np.arctanh(np.asarray(values, float))
  test = one_sample(z)
  mean, half = test.diff.mean, test.diff.half_width
  return CorrelationMean(float(np.tanh(mean)), float(np.tanh(mean - half)), float(np.tanh(mean + half)),
                         test.p_value, len(z))


def cluster_bootstrap(groups: Sequence[Any], statistic: Any, resamples: int, seed: int) -> np.ndarray:
  """[resamples] values of `statistic(chosen)`, each `chosen` a list of `groups` drawn with replacement (as many
  as there are): the bootstrap that resamples whole units (runs), not their rows, since the rows of one run are not
  independent. A percentile interval is `np.nanpercentile(values, [2.5, 97.5])`."""
  rng = np.random.default_rng(seed)
  k = len(groups)
  return np.array([statistic([groups[i] for i in rng.integers(0, k, k)]) for _ in range(resamples)])


def holm(p_values: Sequence[float]) -> np.ndarray:
  """Holm's step-down adjustment of a family of p-values (NaN ones, too few seeds, are left out of the family
  and stay NaN): sorted ascending, the j-th (from 1) becomes max over i ≤ j of min(1, (m − i + 1) p_(i)), m the
  number of p-values. An adjusted p below SIGNIFICANCE keeps the family-wise error rate of all m comparisons
  read together below it, where the plain p bounds each comparison's alone. statsmodels'
  `multipletests(method="holm")` gives the same values (tests/test_report.py holds them equal) but runs a full
  garbage collection on every call, seconds in a process that holds a JAX run; so the few lines here."""
  p = np.asarray(p_values, float)
  adjusted = np.full(p.shape, math.nan)
  present = np.flatnonzero(~np.isnan(p))
  order = present[np.argsort(p[present], kind="stable")]
  m = len(order)
  scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
  adjusted[order] = np.maximum.accumulate(scaled)
  return adjusted


__all__ = ["CONFIDENCE", "CorrelationMean", "Interval", "PairedDifference", "SIGNIFICANCE", "cluster_bootstrap",
           "holm", "interval", "mean_correlation", "one_sample", "paired_difference", "partial_correlation",
           "power_paired_t", "sd_upper_bound", "seed_blocked", "seed_contrasts"]
