"""The labels_per_client partition (AiFed's non-IID setting): every sample exactly once, label counts in
[min_labels, max_labels], each label's samples split evenly among its holders; config validation."""

from __future__ import annotations

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.data import partition


def _labels(n=6000, num_classes=10, seed=0):
  return np.random.default_rng(seed).integers(0, num_classes, size=n)


@pytest.mark.parametrize("num_clients,low,high", [(40, 2, 6), (20, 1, 3), (7, 2, 2), (100, 4, 9)])
def test_every_sample_once_and_label_counts_in_range(num_clients, low, high):
  labels = _labels()
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
  labels = _labels()
  counts = []
  for seed in range(5):
    parts = partition.partition_labels(labels, 40, "labels_per_client", 0.1, np.random.default_rng(seed))
    counts += [len(np.unique(labels[p])) for p in parts]
  # k uniform on {2..6}: each value about 1/5 of 200 clients (binomial sd ~5.7).
  histogram = np.bincount(counts, minlength=7)[2:7]
  assert histogram.min() >= 20 and histogram.sum() == 200, histogram


def test_coverage_wins_over_the_bounds_when_few_clients():
  labels = _labels(n=500)
  parts = partition.partition_labels(labels, 3, "labels_per_client", 0.1, np.random.default_rng(4),
                                     min_labels=2, max_labels=3)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(500))
  assert sum(len(np.unique(labels[p])) for p in parts) == 10  # raised just enough to hold all 10 labels


def test_same_seed_same_partition():
  labels = _labels()
  a = partition.partition_labels(labels, 40, "labels_per_client", 0.1, np.random.default_rng(3))
  b = partition.partition_labels(labels, 40, "labels_per_client", 0.1, np.random.default_rng(3))
  assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_bounds_are_validated():
  with pytest.raises(ValueError, match=r"partition\.min_labels"):
    partition.partition_labels(_labels(100), 5, "labels_per_client", 0.1, np.random.default_rng(0),
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
