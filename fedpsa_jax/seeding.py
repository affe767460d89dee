"""Randomness split by purpose.

Every random quantity in a run comes from the run seed and a *purpose* name, never from a global
generator. Deriving each stream independently (rather than splitting one key in sequence) means that
adding or removing one use of randomness never shifts another: the partition stays the same when the
model's initialisation changes, the latencies stay the same when the calibration batch changes.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np


def purpose_id(purpose: str) -> int:
  """A stable 31-bit integer for a purpose name (crc32, identical across processes and machines)."""
  return zlib.crc32(purpose.encode("utf-8")) & 0x7FFFFFFF


def device_key(seed: int, purpose: str) -> jax.Array:
  """A JAX key for one purpose: `fold_in(key(seed), crc32(purpose))`."""
  return jax.random.fold_in(jax.random.key(seed), purpose_id(purpose))


def host_rng(seed: int, purpose: str) -> np.random.Generator:
  """A NumPy generator for host-side randomness (partitions, latencies, client sampling)."""
  return np.random.default_rng([int(seed), purpose_id(purpose)])
