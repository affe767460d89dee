"""FedPSA's calibration batch (data/calibration.py): the Gaussian batch, a real batch drawn from the
training set, and the validation of its arguments.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from fedpsa_jax.data import calibration
from fedpsa_jax.sim import build
from fedpsa_jax.strategies import fedpsa as fedpsa_lib


def test_gaussian_calibration_batch():
  x, y = calibration.gaussian_batch(256, (28, 28, 1), 10, np.random.default_rng(1))
  x2, y2 = calibration.gaussian_batch(256, (28, 28, 1), 10, np.random.default_rng(1))
  assert x.shape == (256, 28, 28, 1) and x.dtype == np.float32
  assert y.shape == (256,) and y.dtype == np.int32
  assert 0 <= y.min() and y.max() < 10 and len(np.unique(y)) == 10
  # 200,704 values: the sample mean and std of N(0, 1) are within ~0.01 of 0 and 1.
  assert abs(x.mean()) < 0.01 and abs(x.std() - 1.0) < 0.01
  assert abs(((x - x.mean()) ** 3).mean()) < 0.05  # symmetric, unlike the image data
  np.testing.assert_array_equal(x, x2)
  np.testing.assert_array_equal(y, y2)


def test_real_calibration_batch_comes_from_the_training_set(synthetic):
  """`StrategyContext.sample` (what FedPSA's real D_b is drawn with): distinct training rows, with their labels,
  in the split's order, the same for the same seed and purpose and not for another purpose."""
  x, y = map(np.asarray, build.sample_split(synthetic, 0, "train", 64, "calibration"))
  assert x.shape == (64, 8, 8, 1) and x.dtype == np.float32 and y.dtype == np.int32
  rows = {row.tobytes(): i for i, row in enumerate(synthetic.x_train)}
  where = np.array([rows[row.tobytes()] for row in x])
  assert len(np.unique(where)) == 64 and np.all(np.diff(where) > 0)  # without replacement, in order
  np.testing.assert_array_equal(y, synthetic.y_train[where])
  again = np.asarray(build.sample_split(synthetic, 0, "train", 64, "calibration")[0])
  other = np.asarray(build.sample_split(synthetic, 0, "train", 64, "alignment")[0])
  np.testing.assert_array_equal(x, again)
  assert not np.array_equal(x, other)
  xt, yt = map(np.asarray, build.sample_split(synthetic, 0, "test", 10, "alignment"))
  test_rows = {row.tobytes() for row in synthetic.x_test}
  assert all(row.tobytes() in test_rows for row in xt)


def test_bad_calibration_arguments_name_the_field(synthetic):
  rng = np.random.default_rng(0)
  for size in (0, -4, 2.5, True):
    with pytest.raises(ValueError, match=r"fedpsa\.calibration_size"):
      calibration.gaussian_batch(size, (8, 8, 1), 4, rng)
  # A real batch larger than the training set is FedPSA's bound, checked before anything is drawn.
  n = len(synthetic.y_train)
  hparams = types.SimpleNamespace(sketch_dim=16, calibration="real", calibration_size=n + 1)
  (message,) = fedpsa_lib.bound_errors(hparams, 1000, train_size=n)
  assert message.startswith(f"fedpsa.calibration_size={n + 1} is invalid; allowed: an integer in [1, {n}]")
