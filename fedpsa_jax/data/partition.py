"""Label partitions: which training samples each client holds.

Every partitioner takes the training labels and returns one int64 array of sample indices per client,
with every sample assigned exactly once overall. Randomness comes only from the `np.random.Generator`
passed in, so the same generator state gives the same partition.

- `dirichlet_flgo`: FLGo's DirichletPartitioner, which produced the paper's numbers. Client i's label
  mix is q_i ~ Dir(alpha * p) with p the global label frequencies, so the per-class concentration is
  alpha * p_c (alpha / C on balanced data): far more skewed than the usual Dir(alpha * 1). Draws are
  then corrected until the size-weighted mixture of the q_i matches p.
- `dirichlet`: the common per-client Dir(alpha * 1) label mix, without the mixture correction.
- `iid`: a shuffle split into nearly equal parts.
- `label_groups`: CASA's label-skew grouped partition (its Appendix A.2.4, after ICFL): clients form
  groups with the given client proportions (default {0.2, 0.2, 0.3, 0.3}), the labels are split into
  disjoint sets in the same proportions (label c goes to one group only), and inside each group the
  group's samples are spread over its clients with the common Dir(alpha * 1) label mix (`dirichlet`).
- `labels_per_client`: AiFed's non-IID setting (Sec. V-A, Table III): each client holds a few labels
  (k_i uniform in [min_labels, max_labels]); each label's samples are split evenly among its holders.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedpsa_jax.apportion import split_counts
from fedpsa_jax.choices import PARTITIONERS  # partition.method
DEFAULT_GROUP_PROPORTIONS = (0.2, 0.2, 0.3, 0.3)  # CASA's Appendix A.2.4

# FLGo multiplies the mixture tolerance by 10 after this many unsuccessful correction tries.
_TRIES_PER_TOLERANCE = 500
# Re-draws allowed for Dirichlet rows that come back NaN or all zero before giving up loudly.
_MAX_REDRAWS = 1000


def partition_labels(labels: np.ndarray, num_clients: int, method: str, alpha: float,
                     rng: np.random.Generator,
                     group_proportions: tuple[float, ...] = DEFAULT_GROUP_PROPORTIONS, min_labels: int = 2,
                     max_labels: int = 6) -> list[np.ndarray]:
  """Partitions sample indices among `num_clients` clients with the named method.

  `alpha` is the Dirichlet concentration scale of the Dirichlet methods (within each group for
  `label_groups`); `iid` and `labels_per_client` ignore it. `group_proportions` is used by
  `label_groups` only, `min_labels`/`max_labels` (the labels per client) by `labels_per_client` only.
  """
  if method not in PARTITIONERS:
    raise ValueError(f"partition.method must be one of {PARTITIONERS}, got {method!r}")
  if method == "iid":
    return iid(labels, num_clients, rng)
  if method == "label_groups":
    return label_groups(labels, num_clients, group_proportions, alpha, rng).parts
  if method == "labels_per_client":
    return labels_per_client(labels, num_clients, min_labels, max_labels, rng)
  if method == "dirichlet":
    return dirichlet(labels, num_clients, alpha, rng)
  return dirichlet_flgo(labels, num_clients, alpha, rng)


def dirichlet_flgo(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                   error_bar: float = 1e-6) -> list[np.ndarray]:
  """FLGo's DirichletPartitioner (the partition behind the paper's numbers).

  1. Target client sizes s_i = |D| // N, the remainder one each to the first clients.
  2. p = global label frequencies (over the labels present); each client draws q_i ~ Dir(alpha * p).
     The concentration is alpha * p, i.e. alpha / C per class on balanced data, far more skewed than
     the common Dir(alpha * 1) (`dirichlet`): at alpha = 0.1 with 10 classes most clients hold
     essentially one label.
  3. While ||sum_i s_i q_i / sum_i s_i - p||^2 > tolerance (starting at `error_bar`, x10 every 500
     tries), take the next client in turn, draw N candidate proportions and adopt the candidate that
     lowers the error most, if any does (see `flgo_proportions`).
  4. Split each label's indices, in index order, into consecutive chunks in proportion to
     q_i[label] * s_i; shuffle each client's list.
  5. While the smallest client holds <= 1 sample, move one sample from the largest to it.
  """
  labels = _check_labels(labels, num_clients)
  _check_alpha(alpha)
  classes, label_ids = np.unique(labels, return_inverse=True)
  p = np.bincount(label_ids, minlength=len(classes)) / len(labels)
  sizes = _target_sizes(len(labels), num_clients)
  q = flgo_proportions(p, sizes, alpha, rng, error_bar).proportions
  return _split_by_proportions(label_ids, q, sizes, rng)


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float,
              rng: np.random.Generator) -> list[np.ndarray]:
  """The common Dirichlet label partition: q_i ~ Dir(alpha * 1) per client.

  Unlike `dirichlet_flgo`, the concentration does not scale with the global label frequencies (each
  class gets alpha, not alpha * p_c) and the draws are not corrected toward the global mixture, so
  client sizes drift further from |D|/N. Size targets, the consecutive-chunk split and the min-size
  repair are the same as in `dirichlet_flgo`.
  """
  labels = _check_labels(labels, num_clients)
  _check_alpha(alpha)
  classes, label_ids = np.unique(labels, return_inverse=True)
  sizes = _target_sizes(len(labels), num_clients)
  q = draw_dirichlet(np.full(len(classes), float(alpha)), num_clients, rng)
  return _split_by_proportions(label_ids, q, sizes, rng)


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
  """A uniform shuffle split into `num_clients` parts whose sizes differ by at most one."""
  labels = _check_labels(labels, num_clients)
  order = rng.permutation(len(labels)).astype(np.int64)
  return [part.copy() for part in np.array_split(order, num_clients)]


def labels_per_client(labels: np.ndarray, num_clients: int, min_labels: int, max_labels: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
  """AiFed's non-IID partition (Sec. V-A, Table III: "2-6 labels" and uneven sizes per client).

  1. Each client draws its label count k_i uniformly from the integers [min_labels, max_labels]
     (both clipped to the C labels present).
  2. If the clients could not hold every label (sum k_i < C), random clients' k_i are raised by one,
     first up to max_labels, then beyond it (only when N * max_labels < C), until sum k_i = C: every
     sample must belong to a client (the partitioners' contract), so coverage wins over the bounds.
  3. Each client draws k_i distinct labels uniformly at random. While some label has no holder, a
     random client that holds a label shared with another client swaps it (chosen at random) for the
     uncovered label; k_i never changes and covered labels stay covered, so this ends.
  4. Each label's samples are shuffled and split evenly (sizes differ by at most one) among its
     holders; client sizes therefore vary with k_i and with how popular their labels are (the paper's
     1,000-2,000 samples per client on MNIST). Each client's list is shuffled, and the min-size repair
     of the other partitioners runs last (a no-op unless some label has fewer samples than holders).
  """
  labels = _check_labels(labels, num_clients)
  if not (_is_integer(min_labels) and _is_integer(max_labels) and 1 <= min_labels <= max_labels):
    raise ValueError(f"partition.min_labels={min_labels!r}, partition.max_labels={max_labels!r} are invalid; "
                     "allowed: integers with 1 <= min_labels <= max_labels")
  classes, label_ids = np.unique(labels, return_inverse=True)
  num_classes = len(classes)
  low, high = min(min_labels, num_classes), min(max_labels, num_classes)
  counts = rng.integers(low, high + 1, size=num_clients)
  while counts.sum() < num_classes:
    below = np.flatnonzero(counts < high)
    if not len(below):
      below = np.flatnonzero(counts < num_classes)
    counts[rng.choice(below)] += 1
  held = [set(rng.choice(num_classes, size=int(k), replace=False).tolist()) for k in counts]
  holders = np.zeros(num_classes, np.int64)
  for s in held:
    holders[list(s)] += 1
  for uncovered in np.flatnonzero(holders == 0):
    donors = [i for i, s in enumerate(held) if any(holders[c] >= 2 for c in s)]
    i = int(rng.choice(donors))
    shared = sorted(c for c in held[i] if holders[c] >= 2)
    give = int(rng.choice(shared))
    held[i].remove(give)
    held[i].add(int(uncovered))
    holders[give] -= 1
    holders[uncovered] += 1
  pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for c in range(num_classes):
    owners = [i for i, s in enumerate(held) if c in s]
    members = rng.permutation(np.flatnonzero(label_ids == c))
    for i, chunk in zip(owners, np.array_split(members, len(owners))):
      pieces[i].append(chunk)
  parts = [rng.permutation(np.concatenate(chunks)).astype(np.int64) for chunks in pieces]
  return _repair_min_size(parts)


@dataclasses.dataclass(frozen=True)
class LabelGroups:
  """A `label_groups` partition: the per-client index arrays and the planted structure behind them."""

  parts: list[np.ndarray]  # one index array per client
  client_group: np.ndarray  # [N] the group of each client
  group_labels: list[np.ndarray]  # the label values of each group (disjoint)


def label_groups(labels: np.ndarray, num_clients: int, group_proportions: tuple[float, ...], alpha: float,
                 rng: np.random.Generator) -> LabelGroups:
  """CASA's grouped label-skew partition (Appendix A.2.4).

  1. Clients 0..N-1 are cut, in order, into G groups of sizes `split_counts(N, proportions)`.
  2. The sorted label values are cut, in order, into G disjoint sets of sizes
     `split_counts(#labels, proportions)` (10 labels, {0.2, 0.2, 0.3, 0.3} -> {0,1}, {2,3}, {4,5,6},
     {7,8,9}: "label 0 and label 1 are only held by group 0").
  3. Inside each group, the samples of its labels are divided among its clients by `dirichlet`
     (q_i ~ Dir(alpha * 1) per client, sizes |D_g| / N_g), so every sample is assigned exactly once.
  With fewer clients or labels than groups, only the first min(N, #labels) proportions are used.
  """
  labels = _check_labels(labels, num_clients)
  _check_alpha(alpha)
  classes = np.unique(labels)
  # With fewer clients or labels than groups, only the first groups can exist (config validation
  # rejects such a run; this keeps the partitioner total for any 1 <= num_clients, as the others are).
  group_proportions = tuple(group_proportions)[: min(num_clients, len(classes))]
  client_counts = split_counts(num_clients, group_proportions)
  label_counts = split_counts(len(classes), group_proportions)
  client_group = np.repeat(np.arange(len(client_counts)), client_counts)
  group_labels = np.split(classes, np.cumsum(label_counts)[:-1])
  parts: list[np.ndarray] = []
  for g, members in enumerate(np.split(np.arange(num_clients), np.cumsum(client_counts)[:-1])):
    rows = np.flatnonzero(np.isin(labels, group_labels[g]))
    inner = dirichlet(labels[rows], len(members), alpha, rng)
    parts += [rows[part] for part in inner]
  return LabelGroups(parts=parts, client_group=client_group, group_labels=list(group_labels))


@dataclasses.dataclass(frozen=True)
class FlgoProportions:
  """The outcome of FLGo's proportion search: q [N, C], the final mixture error and tolerance."""

  proportions: np.ndarray
  error: float
  tolerance: float
  tries: int


def flgo_proportions(p: np.ndarray, sizes: np.ndarray, alpha: float, rng: np.random.Generator,
                     error_bar: float = 1e-6) -> FlgoProportions:
  """Steps 2-3 of `dirichlet_flgo`: per-client label proportions q_i ~ Dir(alpha * p), corrected.

  Each try re-draws one client's proportion (cycling through clients) from a set of N fresh
  candidates, FLGo style, keeping the candidate with the lowest mixture error if it beats the
  current one. The tolerance starts at `error_bar` and grows x10 every 500 tries, so the loop always
  ends, even when near-one-hot draws (tiny alpha) cannot match p closely.
  """
  p = np.asarray(p, dtype=np.float64)
  sizes = np.asarray(sizes, dtype=np.float64)
  num_clients = len(sizes)
  concentration = alpha * p
  q = draw_dirichlet(concentration, num_clients, rng)
  # The size-weighted mixture is kept as a running sum so each try costs O(N * C), not O(N^2 * C).
  total = sizes @ q
  error = _mixture_error(total, p)
  tolerance, tries, since_growth, client = float(error_bar), 0, 0, 0
  while error > tolerance:
    if since_growth >= _TRIES_PER_TOLERANCE:
      tolerance *= 10.0
      since_growth = 0
      continue
    candidates = draw_dirichlet(concentration, num_clients, rng)
    rest = total - sizes[client] * q[client]
    mixtures = rest[None, :] + sizes[client] * candidates
    errors = _mixture_error(mixtures, p)
    best = int(np.argmin(errors))
    if errors[best] < error:
      q[client] = candidates[best]
      total = rest + sizes[client] * q[client]
      error = float(errors[best])
    client = (client + 1) % num_clients
    tries += 1
    since_growth += 1
  return FlgoProportions(q, float(error), tolerance, tries)


def draw_dirichlet(concentration: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """`size` rows from Dir(concentration), re-drawing any row that is NaN or sums to zero.

  With tiny concentrations the gamma variables behind a Dirichlet can underflow, giving NaN or
  all-zero rows on some NumPy versions; FLGo re-draws NaN, and a zero row would make a client's
  label mix undefined, so both are re-drawn (only the bad rows, to stay fast).
  """
  concentration = np.asarray(concentration, dtype=np.float64)
  q = rng.dirichlet(concentration, size=size)
  for _ in range(_MAX_REDRAWS):
    bad = ~np.isfinite(q).all(axis=1) | (q.sum(axis=1) <= 0.0)
    if not bad.any():
      return q
    q[bad] = rng.dirichlet(concentration, size=int(bad.sum()))
  raise ValueError(f"partition.alpha: Dirichlet draws with concentration {concentration} stayed "
                   f"degenerate after {_MAX_REDRAWS} re-draws; use a larger alpha")


def _mixture_error(weighted_sum: np.ndarray, p: np.ndarray) -> np.ndarray | float:
  """||m / sum(m) - p||^2 along the last axis: how far a size-weighted mixture is from p."""
  mixture = weighted_sum / weighted_sum.sum(axis=-1, keepdims=True)
  return ((mixture - p) ** 2).sum(axis=-1)


def _target_sizes(num_samples: int, num_clients: int) -> np.ndarray:
  """|D| // N samples per client, the remainder one each to the first clients (as FLGo)."""
  sizes = np.full(num_clients, num_samples // num_clients, dtype=np.int64)
  sizes[: num_samples % num_clients] += 1
  return sizes


def _split_by_proportions(label_ids: np.ndarray, q: np.ndarray, sizes: np.ndarray,
                          rng: np.random.Generator) -> list[np.ndarray]:
  """Steps 4-5: consecutive per-label chunks in proportion to q_i[c] * s_i, shuffle, repair."""
  num_clients = len(sizes)
  pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for c in range(q.shape[1]):
    members = np.flatnonzero(label_ids == c)
    weights = q[:, c] * sizes
    if weights.sum() <= 0.0:
      # No client drew any mass for this label (possible only with extreme alpha once the tolerance
      # has grown large); spread it by size rather than drop it, so every sample is still assigned.
      weights = sizes.astype(np.float64)
    cuts = (np.cumsum(weights / weights.sum()) * len(members)).astype(int)[:-1]
    for i, chunk in enumerate(np.split(members, cuts)):
      pieces[i].append(chunk)
  parts = [rng.permutation(np.concatenate(chunks)).astype(np.int64) for chunks in pieces]
  return _repair_min_size(parts)


def _repair_min_size(parts: list[np.ndarray]) -> list[np.ndarray]:
  """While the smallest client holds <= 1 sample, move one sample from the largest to it.

  The loop also stops once the largest holds fewer than two more samples than the smallest: with
  fewer than 2N samples no move can lift the smallest above one, and moving would only cycle.
  """
  parts = [part.copy() for part in parts]
  sizes = np.array([len(part) for part in parts])
  while True:
    small, large = int(np.argmin(sizes)), int(np.argmax(sizes))
    if sizes[small] > 1 or sizes[large] - sizes[small] < 2:
      return parts
    parts[small] = np.append(parts[small], parts[large][-1])
    parts[large] = parts[large][:-1]
    sizes[small] += 1
    sizes[large] -= 1


def _check_labels(labels: np.ndarray, num_clients: int) -> np.ndarray:
  """Labels as a 1-D integer array; 1 <= num_clients <= number of samples."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} "
                     f"dtype {labels.dtype}")
  if not _is_integer(num_clients) or not 1 <= num_clients <= len(labels):
    raise ValueError(f"partition.num_clients must be an integer in [1, {len(labels)}] "
                     f"(the number of training samples), got {num_clients!r}")
  return labels


def _check_alpha(alpha: float) -> None:
  """alpha must be a finite number > 0 (a Dirichlet concentration scale)."""
  is_number = _is_integer(alpha) or isinstance(alpha, (float, np.floating))
  if not is_number or not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f"partition.alpha must be a finite number > 0, got {alpha!r}")


def _is_integer(value: object) -> bool:
  """An int or NumPy integer, but not a bool (True would otherwise pass as 1)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
