"""The federated view of a dataset: the whole train set on device once, plus a client index table.

Local training gathers each batch inside jit from a client's row of `client_indices`, so the training
images cross to the device once per run rather than once per job. Rows are padded with index 0 (a
valid index, so a gather never reads out of bounds); `client_sizes` says how much of each row is real.

Local test splits (personalised evaluation, e.g. CASA's): with `data.client_test_fraction` = f > 0,
`split_client_test` holds out, per client, a simple random share round(f * n_i) of its own samples
(at least one, and at least one left for training; none for a one-sample client), drawn with the host
generator of purpose 'client_test'. The held-out indices (into the train arrays) are in
`client_test_indices`; they never enter `client_indices`, so no client trains on them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedpsa_jax.data.sources import Dataset


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """Device-resident train/test arrays and the per-client sample index table."""

  x_train: jax.Array          # [n, H, W, C] float32
  y_train: jax.Array          # [n] int32
  client_indices: jax.Array   # [N, max_n] int32; row i = client i's indices, padded with 0
  client_sizes: np.ndarray    # [N] int64 host copy: the scheduler and strategies need sizes on host
  x_test: jax.Array
  y_test: jax.Array
  num_classes: int
  # Per client, the indices (into x_train/y_train) of its local test samples; () when off.
  client_test_indices: tuple = ()

  @property
  def home(self) -> jax.Device:
    """The server's device: where the data and the server state live."""
    return next(iter(self.x_train.devices()))

  @property
  def num_clients(self) -> int:
    return int(self.client_sizes.shape[0])


def split_client_test(parts: list[np.ndarray], fraction: float,
                      rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(train parts, test parts): a simple random share round(fraction * n_i) of each client's samples,
  clipped to [1, n_i - 1] (0 for a client with one sample), goes to its local test split."""
  train, test = [], []
  for part in parts:
    part = np.asarray(part, dtype=np.int64)
    n = len(part)
    k = 0 if n < 2 or fraction <= 0 else int(min(max(round(fraction * n), 1), n - 1))
    order = rng.permutation(n)
    test.append(np.sort(part[order[:k]]))
    train.append(part[np.sort(order[k:])])
  return train, test


def build_federated_data(dataset: Dataset, parts: list[np.ndarray],
                         test_parts: list[np.ndarray] | None = None) -> FederatedData:
  """Puts `dataset` on the default device and packs `parts` (one index array per client);
  `test_parts`, if given, are the clients' local test indices (`split_client_test`)."""
  num_train = len(dataset.y_train)
  table, sizes = _index_table(parts, num_train)
  return FederatedData(
      x_train=jnp.asarray(dataset.x_train, dtype=jnp.float32),
      y_train=jnp.asarray(dataset.y_train, dtype=jnp.int32),
      client_indices=jnp.asarray(table),
      client_sizes=sizes,
      x_test=jnp.asarray(dataset.x_test, dtype=jnp.float32),
      y_test=jnp.asarray(dataset.y_test, dtype=jnp.int32),
      num_classes=int(dataset.num_classes),
      client_test_indices=tuple(np.asarray(t, dtype=np.int64) for t in test_parts) if test_parts else (),
  )


def client_label_counts(data: FederatedData | np.ndarray, parts: list[np.ndarray] | None = None,
                        num_classes: int | None = None) -> np.ndarray:
  """[N, num_classes] count of each label on each client.

  Either `client_label_counts(fed)` (labels and index rows from the FederatedData) or
  `client_label_counts(labels, parts, num_classes)` with host labels and per-client index arrays.
  """
  if isinstance(data, FederatedData):
    labels = np.asarray(data.y_train)
    table = np.asarray(data.client_indices)
    parts = [table[i, :size] for i, size in enumerate(data.client_sizes)]
    num_classes = data.num_classes
  else:
    labels = np.asarray(data)
    if parts is None:
      raise ValueError("client_label_counts(labels, parts): parts is required with plain labels")
    if num_classes is None:
      num_classes = int(labels.max()) + 1 if len(labels) else 0
  counts = np.zeros((len(parts), num_classes), dtype=np.int64)
  for i, part in enumerate(parts):
    counts[i] = np.bincount(labels[np.asarray(part, dtype=np.int64)], minlength=num_classes)
  return counts


def _index_table(parts: list[np.ndarray], num_train: int) -> tuple[np.ndarray, np.ndarray]:
  """Pads per-client index arrays into an [N, max_n] int32 table; checks they index the train set."""
  if len(parts) == 0:
    raise ValueError("partition.num_clients must be >= 1, got a partition with no clients")
  arrays = [np.asarray(part, dtype=np.int64).reshape(-1) for part in parts]
  sizes = np.array([len(a) for a in arrays], dtype=np.int64)
  if sizes.min() == 0:
    # A client without data cannot train; this happens only with more clients than samples allow.
    raise ValueError(f"partition.num_clients: client {int(np.argmin(sizes))} got no samples "
                     f"({len(arrays)} clients over {num_train} training samples)")
  for i, a in enumerate(arrays):
    if a.min() < 0 or a.max() >= num_train:
      raise ValueError(f"client {i}'s sample indices fall outside [0, {num_train})")
  table = np.zeros((len(arrays), int(sizes.max())), dtype=np.int32)
  for i, a in enumerate(arrays):
    table[i, : len(a)] = a
  return table, sizes
