"""Fixtures of the data tests: the synthetic dataset, loaded once per module."""

from __future__ import annotations

import numpy as np
import pytest

from fedpsa_jax.data import sources


@pytest.fixture(scope="module")
def synthetic():
  return sources.load_dataset("synthetic", rng=np.random.default_rng(0))
