"""The label partitioners (data/partition.py) against independent statistics and hand-built cases: the
Dirichlet partitions (FLGo's and the common one) and iid; labels_per_client (AiFed's non-IID setting: every
sample exactly once, label counts in [min_labels, max_labels], each label's samples split evenly among its
holders); label_groups (CASA's setting); and the validation of their config fields.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.data import partition
from fedpsa_jax.apportion import split_counts
from fedpsa_jax.data.partition import label_groups, partition_labels


METHODS = partition.PARTITIONERS


def _skewed_labels(n: int, seed: int = 0) -> np.ndarray:
  """Labels over 10 classes with a strongly non-uniform frequency (3:3:2:2:2:1:1:1:1:1)."""
  weights = np.array([3, 3, 2, 2, 2, 1, 1, 1, 1, 1]) / 17
  return np.random.default_rng(seed).choice(10, size=n, p=weights)


def _shares(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
  """[N, C] per-client label distribution, computed by hand from the index lists."""
  return np.array([np.bincount(labels[part], minlength=num_classes) / len(part) for part in parts])


def _dirichlet_variance(concentration: np.ndarray) -> np.ndarray:
  """Var of each coordinate of Dir(a): a_c (a0 - a_c) / (a0^2 (a0 + 1))."""
  a0 = concentration.sum()
  return concentration * (a0 - concentration) / (a0**2 * (a0 + 1))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("num_clients,alpha", [(1, 0.5), (7, 0.05), (50, 0.1), (50, 1.0),
                                               (200, 10.0)])
def test_every_sample_exactly_once(method, num_clients, alpha):
  labels = _skewed_labels(3001)
  parts = partition.partition_labels(labels, num_clients, method, alpha, np.random.default_rng(3))
  assert len(parts) == num_clients
  assert all(part.dtype == np.int64 and part.ndim == 1 for part in parts)
  everything = np.sort(np.concatenate(parts))
  np.testing.assert_array_equal(everything, np.arange(len(labels)))


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_partition_and_different_seed_differs(method):
  labels = _skewed_labels(2000)
  first = partition.partition_labels(labels, 20, method, 0.5, np.random.default_rng(11))
  again = partition.partition_labels(labels, 20, method, 0.5, np.random.default_rng(11))
  other = partition.partition_labels(labels, 20, method, 0.5, np.random.default_rng(12))
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("method", ["dirichlet_flgo", "dirichlet"])
def test_large_alpha_is_near_iid(method):
  labels = _skewed_labels(20000)
  p = np.bincount(labels, minlength=10) / len(labels)
  parts = partition.partition_labels(labels, 20, method, 1000.0, np.random.default_rng(0))
  total_variation = 0.5 * np.abs(_shares(labels, parts, 10) - p).sum(axis=1)
  # 1,000 samples per client alone give a TV of ~0.035 (an iid split); skewed splits give ~0.8.
  assert total_variation.mean() < 0.06


def test_small_alpha_is_concentrated():
  labels = np.repeat(np.arange(10), 1000)
  flgo = _shares(labels, partition.dirichlet_flgo(labels, 100, 0.05, np.random.default_rng(0)), 10)
  assert (flgo.max(axis=1) > 0.8).mean() > 0.8
  common = _shares(labels, partition.dirichlet(labels, 100, 0.05, np.random.default_rng(0)), 10)
  assert (common.max(axis=1) > 0.8).mean() > 0.5
  uniform = _shares(labels, partition.iid(labels, 100, np.random.default_rng(0)), 10)
  assert (uniform.max(axis=1) > 0.8).mean() == 0.0


def test_flgo_draws_have_concentration_alpha_times_p():
  # Many clients so sample moments are tight; the correction loop alters few of them.
  p = np.array([0.5, 0.25, 0.1, 0.1, 0.05])
  alpha = 2.0
  result = partition.flgo_proportions(p, np.full(4000, 30), alpha, np.random.default_rng(0))
  q = result.proportions
  np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-9)
  np.testing.assert_allclose(q.mean(axis=0), p, atol=0.01)
  expected = _dirichlet_variance(alpha * p)       # p_c (1 - p_c) / (alpha + 1)
  wrong = _dirichlet_variance(alpha * np.ones(5))  # the common Dir(alpha * 1): 0.0145 for every c
  np.testing.assert_allclose(q.var(axis=0)[:2], expected[:2], rtol=0.12)
  assert abs(q.var(axis=0)[0] - wrong[0]) > 0.5 * expected[0]


def test_flgo_partition_label_shares_follow_alpha_times_p():
  # End to end: per-client label shares of the final partition have the Dir(alpha * p) spread.
  p = np.array([0.5, 0.25, 0.1, 0.1, 0.05])
  alpha = 2.0
  labels = np.repeat(np.arange(5), (p * 50000).astype(int))
  shares = _shares(labels, partition.dirichlet_flgo(labels, 500, alpha, np.random.default_rng(1)), 5)
  np.testing.assert_allclose(shares.mean(axis=0), p, atol=0.02)
  ratio = shares[:, 0].var() / _dirichlet_variance(alpha * p)[0]
  # Measured 0.92-1.24 over seeds; Dir(alpha * 1) gives ~0.43 here.
  assert 0.75 < ratio < 1.4


def test_common_dirichlet_has_concentration_alpha_per_class():
  labels = np.repeat(np.arange(10), 5000)
  alpha = 1.0
  shares = _shares(labels, partition.dirichlet(labels, 500, alpha, np.random.default_rng(2)), 10)
  ratio = shares.var(axis=0).mean() / _dirichlet_variance(np.full(10, alpha))[0]
  assert 0.85 < ratio < 1.15  # Dir(alpha * p) would be 5.5x wider here


@pytest.mark.parametrize("alpha,num_clients", [(1.0, 50), (0.1, 50), (0.01, 100)])
def test_flgo_mixture_error_ends_below_tolerance(alpha, num_clients):
  p = np.bincount(_skewed_labels(5000)) / 5000
  sizes = np.full(num_clients, 50)
  sizes[:3] += 1
  result = partition.flgo_proportions(p, sizes, alpha, np.random.default_rng(4))
  mixture = (sizes[:, None] * result.proportions).sum(axis=0)
  error = ((mixture / mixture.sum() - p) ** 2).sum()
  assert error == pytest.approx(result.error, rel=1e-9, abs=1e-15)
  assert error <= result.tolerance
  # The tolerance only grows x10 per 500 tries from 1e-6.
  growths = round(np.log10(result.tolerance / 1e-6))
  assert result.tolerance == pytest.approx(1e-6 * 10**growths)
  assert growths <= result.tries // 500


def test_flgo_target_sizes_hold_on_balanced_moderate_alpha():
  # With the mixture matched, the label chunks add up to nearly |D|/N per client.
  labels = np.repeat(np.arange(10), 600)
  parts = partition.dirichlet_flgo(labels, 50, 1.0, np.random.default_rng(5))
  sizes = np.array([len(part) for part in parts])
  assert np.abs(sizes - 120).max() <= 25


@pytest.mark.parametrize("seed", range(4))
def test_min_client_size_at_least_two(seed):
  # Few samples per client and tiny alpha: the chunk split leaves clients with 0 or 1 sample.
  labels = _skewed_labels(400, seed)
  for method in ("dirichlet_flgo", "dirichlet"):
    parts = partition.partition_labels(labels, 60, method, 0.01, np.random.default_rng(seed))
    assert min(len(part) for part in parts) >= 2
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(400))


def test_repair_moves_from_largest_to_smallest():
  parts = [np.array([], dtype=np.int64), np.array([5]), np.arange(6, 16), np.array([1, 2, 3])]
  repaired = partition._repair_min_size(parts)
  assert [len(part) for part in repaired] == [2, 2, 7, 3]
  np.testing.assert_array_equal(np.sort(np.concatenate(repaired)), np.sort(np.concatenate(parts)))
  # Fewer than 2N samples: stops when no move helps, every client keeps at least one sample.
  few = partition.dirichlet_flgo(_skewed_labels(15), 10, 0.01, np.random.default_rng(0))
  assert min(len(part) for part in few) >= 1


def test_iid_sizes_differ_by_at_most_one():
  labels = _skewed_labels(1003)
  parts = partition.iid(labels, 10, np.random.default_rng(0))
  sizes = [len(part) for part in parts]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


class _FlakyGenerator:
  """A generator whose first Dirichlet draw has a NaN row and an all-zero row."""

  def __init__(self, seed: int):
    self._rng = np.random.default_rng(seed)
    self.calls = 0

  def dirichlet(self, alpha, size):
    self.calls += 1
    out = self._rng.dirichlet(alpha, size=size)
    if self.calls == 1:
      out[0] = np.nan
      out[1] = 0.0
    return out


def test_degenerate_dirichlet_rows_are_redrawn():
  flaky = _FlakyGenerator(0)
  q = partition.draw_dirichlet(np.full(4, 0.01), 5, flaky)
  assert flaky.calls == 2
  assert np.isfinite(q).all()
  np.testing.assert_allclose(q.sum(axis=1), 1.0)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_alpha_names_the_field(alpha):
  for method in ("dirichlet_flgo", "dirichlet"):
    with pytest.raises(ValueError, match=r"partition\.alpha"):
      partition.partition_labels(_skewed_labels(100), 5, method, alpha, np.random.default_rng(0))


def test_bad_method_names_the_field_and_choices():
  with pytest.raises(ValueError, match=r"partition\.method.*dirichlet_flgo"):
    partition.partition_labels(_skewed_labels(100), 5, "shards", 0.5, np.random.default_rng(0))


@pytest.mark.parametrize("num_clients", [0, -3, 101, 2.5])
@pytest.mark.parametrize("method", METHODS)
def test_bad_num_clients_names_the_field(method, num_clients):
  with pytest.raises(ValueError, match=r"partition\.num_clients"):
    partition.partition_labels(_skewed_labels(100), num_clients, method, 0.5,
                               np.random.default_rng(0))


def _uniform_labels(n=6000, num_classes=10, seed=0):
  return np.random.default_rng(seed).integers(0, num_classes, size=n)


@pytest.mark.parametrize("num_clients,low,high", [(40, 2, 6), (20, 1, 3), (7, 2, 2), (100, 4, 9)])
def test_every_sample_once_and_label_counts_in_range(num_clients, low, high):
  labels = _uniform_labels()
  parts = partition.partition_labels(labels, num_clients, "labels_per_client", 0.1, np.random.default_rng(1),
                                     min_labels=low, max_labels=high)
  assert len(parts) == num_clients
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
  held = [set(np.unique(labels[p]).tolist()) for p in parts]
  counts = np.array([len(h) for h in held])
  assert counts.min() >= low and counts.max() <= high, counts
  # Each label's samples are split evenly (sizes differ by at most one) among the clients holding it.
  for c in range(10):
    shares = [int(np.sum(labels[p] == c)) for p, h in zip(parts, held) if c in h]
    assert sum(shares) == int(np.sum(labels == c)) and max(shares) - min(shares) <= 1


def test_label_counts_are_spread_over_the_range():
  labels = _uniform_labels()
  counts = []
  for seed in range(5):
    parts = partition.partition_labels(labels, 40, "labels_per_client", 0.1, np.random.default_rng(seed))
    counts += [len(np.unique(labels[p])) for p in parts]
  # k uniform on {2..6}: each value about 1/5 of 200 clients (binomial sd ~5.7).
  histogram = np.bincount(counts, minlength=7)[2:7]
  assert histogram.min() >= 20 and histogram.sum() == 200, histogram


def test_coverage_wins_over_the_bounds_when_few_clients():
  labels = _uniform_labels(n=500)
  parts = partition.partition_labels(labels, 3, "labels_per_client", 0.1, np.random.default_rng(4),
                                     min_labels=2, max_labels=3)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(500))
  assert sum(len(np.unique(labels[p])) for p in parts) == 10  # raised just enough to hold all 10 labels


def test_same_seed_same_partition():
  labels = _uniform_labels()
  a = partition.partition_labels(labels, 40, "labels_per_client", 0.1, np.random.default_rng(3))
  b = partition.partition_labels(labels, 40, "labels_per_client", 0.1, np.random.default_rng(3))
  assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_bounds_are_validated():
  with pytest.raises(ValueError, match=r"partition\.min_labels"):
    partition.partition_labels(_uniform_labels(100), 5, "labels_per_client", 0.1, np.random.default_rng(0),
                               min_labels=4, max_labels=3)
  c = config_lib.base_config()
  c.partition.min_labels, c.partition.max_labels = 0, 1
  errors = "\n".join(config_lib.config_errors(c))
  assert "partition.min_labels=0 is invalid; allowed:" in errors
  c.partition.min_labels, c.partition.max_labels = 3, 2
  errors = "\n".join(config_lib.config_errors(c))
  assert "partition.max_labels=2 is invalid; allowed: an integer >= partition.min_labels (3)" in errors
  c.partition.method, c.partition.min_labels = "labels_per_client", 2
  assert not config_lib.config_errors(c)


def _balanced_labels(per_class=60, classes=10, seed=0):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class)).astype(np.int64)


def test_split_counts_by_hand():
  assert split_counts(100, (0.2, 0.2, 0.3, 0.3)).tolist() == [20, 20, 30, 30]
  assert split_counts(10, (0.2, 0.2, 0.3, 0.3)).tolist() == [2, 2, 3, 3]
  # 7 · (0.2, 0.2, 0.3, 0.3) = (1.4, 1.4, 2.1, 2.1): floors (1, 1, 2, 2), the one left to the largest
  # remainder (the first 0.4).
  assert split_counts(7, (0.2, 0.2, 0.3, 0.3)).tolist() == [2, 1, 2, 2]


@pytest.mark.parametrize("num_clients", [100, 23])
def test_label_groups_partition(num_clients):
  labels = _balanced_labels()
  out = label_groups(labels, num_clients, (0.2, 0.2, 0.3, 0.3), 1.0, np.random.default_rng(1))
  everything = np.concatenate(out.parts)
  assert len(everything) == len(labels) and len(np.unique(everything)) == len(labels)  # each sample once
  # Groups of clients in the proportions; labels split {0,1} {2,3} {4,5,6} {7,8,9}, disjoint.
  assert np.bincount(out.client_group).tolist() == split_counts(num_clients, (0.2, 0.2, 0.3, 0.3)).tolist()
  assert [g.tolist() for g in out.group_labels] == [[0, 1], [2, 3], [4, 5, 6], [7, 8, 9]]
  for client, part in enumerate(out.parts):
    assert set(labels[part]) <= set(out.group_labels[out.client_group[client]].tolist())
  # A group holds all samples of its labels.
  for g, group in enumerate(out.group_labels):
    held = np.concatenate([p for c, p in enumerate(out.parts) if out.client_group[c] == g])
    assert len(held) == np.isin(labels, group).sum()
  # Through the common entry point, same generator state -> same partition.
  again = partition_labels(labels, num_clients, "label_groups", 1.0, np.random.default_rng(1),
                           group_proportions=(0.2, 0.2, 0.3, 0.3))
  assert all(np.array_equal(a, b) for a, b in zip(again, out.parts))


def test_label_groups_with_fewer_labels_than_groups_uses_the_first_groups():
  labels = _balanced_labels(classes=3)
  out = label_groups(labels, 10, (0.25, 0.25, 0.25, 0.25), 1.0, np.random.default_rng(0))
  assert [g.tolist() for g in out.group_labels] == [[0], [1], [2]]
  assert np.bincount(out.client_group).tolist() == [4, 3, 3]  # 10 · (1/3, 1/3, 1/3), remainder first
  assert sorted(np.concatenate(out.parts).tolist()) == list(range(len(labels)))


def test_new_config_fields_validate():
  c = config_lib.base_config()
  assert config_lib.config_errors(c) == []
  c.data.client_test_fraction = 1.0
  c.sim.latency.slow_fraction = 1.5
  c.sim.latency.slow_factor = 0.5
  c.partition.method = "label_groups"
  c.partition.group_proportions = (0.5, -0.5)
  errors = config_lib.config_errors(c)
  assert "data.client_test_fraction=1.0 is invalid; allowed: a number in [0, 1) (0: no local test splits)" in errors
  assert "sim.latency.slow_fraction=1.5 is invalid; allowed: a number in [0, 1] (0: no slow devices)" in errors
  assert "sim.latency.slow_factor=0.5 is invalid; allowed: a number >= 1" in errors
  assert any(e.startswith("partition.group_proportions=(0.5, -0.5) is invalid") for e in errors)
  assert len(errors) == 4
