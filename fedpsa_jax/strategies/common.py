"""Validation shared by the buffered strategies (FedBuff, FedPSA, FedPAC, AiFed)."""

from __future__ import annotations

import ml_collections


def buffer_size_errors(config: ml_collections.ConfigDict, section: str) -> list[str]:
  """`<section>.buffer_size` must be an integer from 1 to N (a buffer larger than the federation never
  fills)."""
  k, n = config[section].buffer_size, config.partition.num_clients
  if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= n):
    return [f"{section}.buffer_size={k!r} is invalid; allowed: an integer from 1 to "
            f"partition.num_clients ({n})"]
  return []
