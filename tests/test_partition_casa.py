"""CASA's setting: the label_groups partition, slow devices in the latency model, local test splits, and
their config fields (defaults leave existing runs unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.data.federated import split_client_test
from fedpsa_jax.data.partition import label_groups, partition_labels, split_counts
from fedpsa_jax.sim.latency import LatencyModel


def _labels(per_class=60, classes=10, seed=0):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class)).astype(np.int64)


def test_split_counts_by_hand():
  assert split_counts(100, (0.2, 0.2, 0.3, 0.3)).tolist() == [20, 20, 30, 30]
  assert split_counts(10, (0.2, 0.2, 0.3, 0.3)).tolist() == [2, 2, 3, 3]
  # 7 · (0.2, 0.2, 0.3, 0.3) = (1.4, 1.4, 2.1, 2.1): floors (1, 1, 2, 2), the one left to the largest
  # remainder (the first 0.4).
  assert split_counts(7, (0.2, 0.2, 0.3, 0.3)).tolist() == [2, 1, 2, 2]


@pytest.mark.parametrize("num_clients", [100, 23])
def test_label_groups_partition(num_clients):
  labels = _labels()
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
  labels = _labels(classes=3)
  out = label_groups(labels, 10, (0.25, 0.25, 0.25, 0.25), 1.0, np.random.default_rng(0))
  assert [g.tolist() for g in out.group_labels] == [[0], [1], [2]]
  assert np.bincount(out.client_group).tolist() == [4, 3, 3]  # 10 · (1/3, 1/3, 1/3), remainder first
  assert sorted(np.concatenate(out.parts).tolist()) == list(range(len(labels)))


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


def test_client_test_split_is_disjoint_and_sized():
  parts = [np.arange(0, 10), np.arange(10, 11), np.arange(11, 31), np.arange(31, 34)]
  train, test = split_client_test(parts, 0.2, np.random.default_rng(0))
  assert [len(t) for t in test] == [2, 0, 4, 1]  # round(0.2 n), at least 1, none for one sample
  for p, tr, te in zip(parts, train, test):
    assert not set(tr) & set(te) and sorted(np.concatenate([tr, te])) == sorted(p)


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
