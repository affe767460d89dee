"""Integer apportionment: a count split into groups in given proportions (largest remainders).

Below the config and the data both: the config's rules check a `label_groups` partition with the same group
sizes that `data.partition.label_groups` then cuts, so both call this one function.
"""

from __future__ import annotations

import numpy as np


def split_counts(total: int, proportions: tuple[float, ...] | np.ndarray) -> np.ndarray:
  """`total` split into integer counts in the given proportions (largest remainders), each >= 1."""
  p = np.asarray(proportions, dtype=np.float64)
  p = p / p.sum()
  if total < len(p):
    raise ValueError(f"cannot split {total} items into {len(p)} non-empty groups")
  raw = p * total
  counts = np.floor(raw).astype(np.int64)
  for g in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
    counts[g] += 1
  while counts.min() == 0:  # a tiny proportion still gets one item, taken from the largest group
    counts[np.argmax(counts)] -= 1
    counts[np.argmin(counts)] += 1
  return counts
