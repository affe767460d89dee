"""One's own arrays as a dataset: an .npz file (`numpy.savez`) with `x_train`, `y_train`, `x_test`, `y_test`.

Images are N x H x W x C or N x H x W (one channel), uint8 (pixels 0..255) or float (any finite values); both
splits share one image shape and one dtype. Labels are integers, one per image (shape N or N x 1), in
[0, num_classes): `num_classes` is an optional scalar in the file, else the largest label plus one. Anything
else is refused with one line naming the file, the array and what is allowed (`DataError`), before any work.
Pickled (object) arrays are never loaded. The arrays' shapes and dtypes are read from their headers first, and
data that could not fit (`data/limits.py`: in memory, an image in a batch, the number of classes) is refused
before any array is read.
"""

from __future__ import annotations

import dataclasses
import math
import zipfile
from typing import Callable, Sequence

import numpy as np

from fedpsa_jax.data import limits
from fedpsa_jax.errors import DataError, UserError

REQUIRED_KEYS = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL_KEYS = ("num_classes",)


@dataclasses.dataclass(frozen=True)
class Arrays:
  """A checked .npz: NHWC images (uint8, or float32) and int32 labels in [0, num_classes)."""

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int


def _allowed_keys() -> str:
  return f"an .npz with {', '.join(REQUIRED_KEYS)} (and optionally {', '.join(OPTIONAL_KEYS)})"


def _headers(f: np.lib.npyio.NpzFile) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{key: (shape, dtype)} of every array of an open .npz, from the .npy headers alone (no array is read)."""
  out = {}
  for key in f.files:
    with f.zip.open(key + ".npy") as member:
      read = (np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(member) == (1, 0)
              else np.lib.format.read_array_header_2_0)
      shape, _, dtype = read(member)
    out[key] = (tuple(int(d) for d in shape), dtype)
  return out


def _check_headers(headers: dict[str, tuple[tuple[int, ...], np.dtype]], where: str,
                   on_image_shape: Callable[[Sequence[int]], None] | None) -> None:
  """DataError, before any array is read, for an object (pickled) array or data that cannot fit (`limits`)."""
  for key, (_, dtype) in headers.items():
    if dtype.hasobject:
      raise DataError(f"{where} cannot be read as an .npz of numeric arrays ({key} holds Python objects, which "
                      f"only pickle would load); allowed: a file written by numpy.savez or savez_compressed, "
                      f"{_allowed_keys()}")
  image_shape = headers.get("x_train", ((),))[0][1:]
  if len(image_shape) in (2, 3) and min(image_shape) >= 1:
    limits.check_image(where, image_shape if len(image_shape) == 3 else (*image_shape, 1))
    if on_image_shape is not None:
      on_image_shape(image_shape if len(image_shape) == 3 else (*image_shape, 1))
  stored = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
  pixels = sum(math.prod(headers[key][0]) for key in ("x_train", "x_test") if key in headers)
  limits.check_fits_memory(where, "its arrays", stored, pixels)


def read_npz(path: str, on_image_shape: Callable[[Sequence[int]], None] | None = None) -> Arrays:
  """The checked arrays of the .npz at `path`; DataError naming the file and what is wrong. `on_image_shape(shape)`
  is called with the (H, W, C) of the images, from the file's header, before any array is read (a caller's own
  bounds, raising to refuse them)."""
  where = f"data.path={path!r}"
  try:
    with np.load(path, allow_pickle=False) as f:
      keys = tuple(f.files)
      unknown = sorted(set(keys) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
      if unknown:
        raise DataError(f"{where} holds {', '.join(map(repr, unknown))}, which this reader does not know; "
                        f"allowed: {_allowed_keys()}")
      missing = [key for key in REQUIRED_KEYS if key not in keys]
      if missing:
        raise DataError(f"{where} has no {', '.join(missing)} (it holds {', '.join(keys) or 'nothing'}); "
                        f"allowed: {_allowed_keys()}")
      _check_headers(_headers(f), where, on_image_shape)
      arrays = {key: f[key] for key in keys}
  except UserError:  # (a DataError, or the caller's ConfigError from `on_image_shape`)
    raise
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:  # (not a zip, cut short, a damaged member)
    raise DataError(f"{where} cannot be read as an .npz of numeric arrays ({err}); allowed: a file written by "
                    f"numpy.savez or savez_compressed, {_allowed_keys()}") from None
  x_train, x_test = (_images(arrays[key], key, where) for key in ("x_train", "x_test"))
  if x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype:
    raise DataError(f"{where}: x_train holds {_kind(x_train)} images but x_test {_kind(x_test)}; allowed: one "
                    "image shape and one dtype for both splits")
  y_train, y_test = (_labels(arrays[y], len(arrays[x]), y, x, where)
                     for x, y in (("x_train", "y_train"), ("x_test", "y_test")))
  largest = max(int(y_train.max()), int(y_test.max()))
  num_classes = _num_classes(arrays.get("num_classes"), largest, where)
  for key, labels in (("y_train", y_train), ("y_test", y_test)):
    if labels.min() < 0 or labels.max() >= num_classes:
      bad = labels[(labels < 0) | (labels >= num_classes)][0]
      raise DataError(f"{where}: {key} holds the label {int(bad)}, outside the classes [0, {num_classes}); "
                      "allowed: integer labels 0 .. num_classes - 1")
  return Arrays(x_train, y_train.astype(np.int32), x_test, y_test.astype(np.int32), num_classes)


def _kind(x: np.ndarray) -> str:
  return f"{'x'.join(str(d) for d in x.shape[1:])} {x.dtype}"


def _images(x: np.ndarray, key: str, where: str) -> np.ndarray:
  """`x` as NHWC (a channel axis added to N x H x W), uint8 kept, floats as float32."""
  if x.ndim not in (3, 4) or x.shape[0] == 0 or min(x.shape[1:]) < 1:
    raise DataError(f"{where}: {key} has shape {x.shape}; allowed: at least one image, as N x H x W x C or "
                    "N x H x W")
  if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
    raise DataError(f"{where}: {key} has dtype {x.dtype}; allowed: uint8 (pixels 0..255) or float")
  if x.dtype != np.uint8:
    if not np.isfinite(x).all():
      raise DataError(f"{where}: {key} holds NaN or infinite values; allowed: finite values")
    x = x.astype(np.float32, copy=False)
  return x[..., None] if x.ndim == 3 else x


def _labels(y: np.ndarray, count: int, key: str, images: str, where: str) -> np.ndarray:
  """`y` as int64 of shape (count,) (int32 once its range is checked)."""
  if not np.issubdtype(y.dtype, np.integer):
    raise DataError(f"{where}: {key} has dtype {y.dtype}; allowed: integer labels")
  if y.ndim == 2 and y.shape[1] == 1:
    y = y[:, 0]
  if y.ndim != 1 or len(y) != count:
    raise DataError(f"{where}: {key} has shape {y.shape} for {count} images in {images}; allowed: one label per "
                    f"image, shape ({count},) or ({count}, 1)")
  return y.astype(np.int64)


def _num_classes(value: np.ndarray | None, largest: int, where: str) -> int:
  """The file's `num_classes`, checked; else the largest label plus one."""
  if value is None:
    limits.check_classes(where, largest + 1)
    return largest + 1
  if value.shape != () or not np.issubdtype(value.dtype, np.integer) or int(value) < 1:
    raise DataError(f"{where}: num_classes is {value!r}; allowed: one integer >= 1 (or no num_classes: the largest "
                    "label plus one)")
  limits.check_classes(where, int(value))
  return int(value)
