"""The federated index table (data/federated.py): it round-trips, it rejects empty clients and bad
indices, and a client's local test split is disjoint from its training part and of the asked size.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedpsa_jax.data import federated, partition
from fedpsa_jax.data.federated import split_client_test


def test_client_test_split_is_disjoint_and_sized():
  parts = [np.arange(0, 10), np.arange(10, 11), np.arange(11, 31), np.arange(31, 34)]
  train, test = split_client_test(parts, 0.2, np.random.default_rng(0))
  assert [len(t) for t in test] == [2, 0, 4, 1]  # round(0.2 n), at least 1, none for one sample
  for p, tr, te in zip(parts, train, test):
    assert not set(tr) & set(te) and sorted(np.concatenate([tr, te])) == sorted(p)


def test_federated_index_table_round_trips(synthetic):
  parts = partition.dirichlet_flgo(synthetic.y_train, 12, 0.3, np.random.default_rng(0))
  fed = federated.build_federated_data(synthetic, parts)
  table = np.asarray(fed.client_indices)
  assert fed.num_clients == 12 and table.dtype == np.int32
  assert table.shape[1] == max(len(part) for part in parts)  # padded to the largest client
  np.testing.assert_array_equal(fed.client_sizes, [len(part) for part in parts])
  for i, part in enumerate(parts):
    np.testing.assert_array_equal(table[i, : len(part)], part)
    assert (table[i, len(part):] == 0).all()
  np.testing.assert_array_equal(np.asarray(fed.x_train), synthetic.x_train)
  np.testing.assert_array_equal(np.asarray(fed.y_test), synthetic.y_test)
  assert fed.num_classes == 10
  # Label counts against a hand count.
  by_hand = np.zeros((12, 10), dtype=np.int64)
  for i, part in enumerate(parts):
    for label in synthetic.y_train[part]:
      by_hand[i, label] += 1
  np.testing.assert_array_equal(federated.client_label_counts(fed), by_hand)
  np.testing.assert_array_equal(
      federated.client_label_counts(synthetic.y_train, parts, num_classes=10), by_hand)


def test_federated_rejects_empty_clients_and_bad_indices(synthetic):
  n = len(synthetic.y_train)
  with pytest.raises(ValueError, match=r"partition\.num_clients"):
    federated.build_federated_data(synthetic, [np.arange(n), np.array([], dtype=np.int64)])
  with pytest.raises(ValueError, match="outside"):
    federated.build_federated_data(synthetic, [np.array([0, n])])
