"""Image-classification datasets prepared by TensorFlow Datasets in the ArrayRecord format, by name or by folder.

A prepared dataset is a version folder, `<data_dir>/<name>[/<config>]/<version>/`, holding dataset_info.json
(its splits and their lengths), features.json (its feature spec) and the records. Any dataset whose spec has an
`Image` feature of one fixed shape (uint8) and a `ClassLabel` feature can be read; which features those are is
read from the spec (`Layout`): the only one of its kind, else the one named `image` / `label`. Other features
are ignored.

A split is read with `tfds.builder_from_directory(folder).as_data_source(split)` when the folder is known, else
`tfds.data_source(name, ...)` (tfds finds it, or says nothing is there). Both read ArrayRecord without
TensorFlow; nothing is ever downloaded. Records are decoded one by one (`ds[i]`: the batched `__getitems__` is
broken under `tfds.testing.mock_data` in tfds 4.9.10, and decoding, not I/O, dominates anyway) into uint8
images and int32 labels, kept in the decode cache (`data/cache.py`). A split decoded before is served from the
cache without importing tfds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import tempfile
from typing import Any, Iterator, Mapping

import numpy as np

from fedpsa_jax.data import cache, limits
from fedpsa_jax import errors
from fedpsa_jax.errors import DataError

IMAGE_FEATURE = "Image"  # the last component of the spec's pythonClassName
LABEL_FEATURE = "ClassLabel"


class DatasetNotFoundError(DataError):
  """A tfds dataset is not prepared (in a randomly accessible format) where tfds looked."""


class TfdsNotInstalledError(DatasetNotFoundError):
  """tfds itself is missing from this Python: no tfds dataset can be read (a GPU image with its own packages)."""


def _import_tfds(name: str):
  """The tensorflow_datasets module, or TfdsNotInstalledError naming the package to install; imported only when a
  tfds dataset is read (slow to import, and unneeded by the other sources)."""
  try:
    import tensorflow_datasets as tfds
  except ImportError as err:
    raise TfdsNotInstalledError(
        f"tfds dataset {name!r}: reading it needs the tensorflow-datasets package, which this Python "
        f"({sys.executable}) does not have: pip install -r requirements.txt (it pins tensorflow-datasets), or use "
        f"an embedded dataset (data.name='mnist_5k')") from err
  return tfds


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a prepared dataset's spec says: its image and label features and its splits."""

  image: str  # the image feature's name
  label: str  # the label feature's name
  shape: tuple[int, int, int]  # (H, W, C) of every image
  num_classes: int
  splits: tuple[str, ...]  # the prepared splits; () when unknown (tfds.testing.mock_data declares none)


def default_data_dir() -> str:
  """Where tfds looks for prepared datasets when `data.data_dir` is None: `$TFDS_DATA_DIR` or ~/tensorflow_datasets
  (tfds' own rule, restated so that a prepared folder is found without importing tfds)."""
  return os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def _version_key(version: str) -> tuple:
  parts = version.split(".")
  return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()


def version_folder(name: str, data_dir: str | None) -> str | None:
  """The prepared version folder of `name` (`name[/config][:version]`) under the tfds data dir, found without
  importing tfds: the version the name gives, else the highest one prepared; None when there is none."""
  base, _, version = name.partition(":")
  root = os.path.join(data_dir or default_data_dir(), base)
  try:
    versions = [entry.name for entry in os.scandir(root) if entry.is_dir()
                and os.path.isfile(os.path.join(entry.path, "dataset_info.json")) and _version_key(entry.name)]
  except OSError:
    return None
  if version:
    return os.path.join(root, version) if version in versions else None
  return os.path.join(root, max(versions, key=_version_key)) if versions else None


def is_prepared_folder(path: str) -> bool:
  """Whether `path` looks like a prepared tfds version folder (it holds dataset_info.json and features.json)."""
  return all(os.path.isfile(os.path.join(path, f)) for f in ("dataset_info.json", "features.json"))


def _describe(features: Mapping[str, Any]) -> str:
  return ", ".join(f"{key} ({spec.get('pythonClassName', '?').rsplit('.', 1)[-1]})" for key, spec in features.items())


def _pick(features: Mapping[str, Any], kind: str, preferred: str, where: str) -> str:
  """The one feature of `kind`, else the one of them named `preferred`."""
  found = [key for key, spec in features.items() if spec.get("pythonClassName", "").rsplit(".", 1)[-1] == kind]
  if len(found) == 1:
    return found[0]
  if preferred in found:
    return preferred
  what = (f"no {kind} feature" if not found
          else f"several {kind} features ({', '.join(found)}) and none named {preferred!r}")
  raise DataError(f"{where}: {what} among its features ({_describe(features)}); allowed: a dataset with one Image "
                  "feature of a fixed shape and one ClassLabel feature (or several, one of them named "
                  "'image' / 'label')")


def layout_of(spec: Any, splits: tuple[str, ...], where: str) -> Layout:
  """The `Layout` of a feature spec in features.json's form (a FeaturesDict as JSON); DataError, naming `where`,
  when it has no usable image or label, or one that cannot fit (`limits`: an image beyond a batch, too many
  classes), or is not a spec of that form at all (a list or a number where an object belongs)."""
  try:
    layout = _layout_of(spec, splits, where)
  except DataError:
    raise
  except (AttributeError, TypeError, ValueError, KeyError) as err:
    raise DataError(f"{where}: its features.json is not a tfds feature spec ({type(err).__name__}: {err}); allowed: "
                    "the features.json tfds wrote when it prepared the dataset") from None
  limits.check_image(where, layout.shape)
  limits.check_classes(where, layout.num_classes)
  return layout


def _layout_of(spec: Any, splits: tuple[str, ...], where: str) -> Layout:
  features_dict = spec.get("featuresDict", {})
  features = features_dict.get("features") if isinstance(features_dict, Mapping) else None
  if not isinstance(features, Mapping) or not all(isinstance(f, Mapping) for f in features.values()):
    raise DataError(f"{where}: its features.json holds no feature dictionary; allowed: a dataset with one Image "
                    "feature and one ClassLabel feature")
  image, label = _pick(features, IMAGE_FEATURE, "image", where), _pick(features, LABEL_FEATURE, "label", where)
  image_spec = features[image].get("image", {})
  shape = tuple(int(d) for d in image_spec.get("shape", {}).get("dimensions", []))
  if len(shape) != 3 or min(shape) < 1:
    shown = tuple(None if d < 1 else d for d in shape)
    raise DataError(f"{where}: its images ({image!r}) have no fixed shape ({shown}); allowed: images of one fixed "
                    "H x W x C shape (resize them, e.g. into an .npz for data.path)")
  if image_spec.get("dtype", "uint8") != "uint8":
    raise DataError(f"{where}: its images ({image!r}) are {image_spec['dtype']}; allowed: uint8 images (or an .npz "
                    "for data.path, which takes float images)")
  num_classes = int(features[label].get("classLabel", {}).get("numClasses", 0))
  if num_classes < 1:
    raise DataError(f"{where}: its label {label!r} declares no classes; allowed: a ClassLabel with num_classes >= 1")
  return Layout(image, label, shape, num_classes, splits)


def read_layout(folder: str, where: str) -> Layout:
  """The `Layout` of a prepared version folder, from its features.json and dataset_info.json (no tfds import)."""
  try:
    with open(os.path.join(folder, "features.json")) as f:
      spec = json.load(f)
    with open(os.path.join(folder, "dataset_info.json")) as f:
      info = json.load(f)
    splits = tuple(s["name"] for s in info["splits"])
  except (OSError, ValueError, KeyError, TypeError) as err:
    raise DataError(f"{where}: its features.json or dataset_info.json cannot be read ({err}); allowed: the version "
                    "folder of a dataset prepared by tfds") from None
  file_format = info.get("fileFormat", "tfrecord")  # (tfds leaves its default unsaid)
  if file_format != "array_record":
    raise DatasetNotFoundError(
        f"{where}: it is prepared in the {file_format} format, which cannot be read without TensorFlow; allowed: "
        f"the array_record format (convert it with TensorFlow installed: tfds convert_format "
        f"--dataset_version_dir={folder} --out_file_format=array_record)")
  if "train" not in splits:
    raise DataError(f"{where}: it has no 'train' split (splits: {', '.join(splits) or 'none'}); allowed: a dataset "
                    "with a 'train' split (and a 'test' split for data.test_split='official')")
  return layout_of(spec, splits, where)


def dataset_name(folder: str) -> str:
  """The name dataset_info.json gives the dataset in `folder` (the folder's parent's name if it gives none)."""
  try:
    with open(os.path.join(folder, "dataset_info.json")) as f:
      return str(json.load(f)["name"])
  except (OSError, ValueError, KeyError, TypeError):
    return os.path.basename(os.path.dirname(os.path.normpath(folder)))


def _split_length(folder: str, split: str) -> int | None:
  """The number of records of `split` that the folder's dataset_info.json declares (None: unreadable)."""
  try:
    with open(os.path.join(folder, "dataset_info.json")) as f:
      splits = {s["name"]: s for s in json.load(f)["splits"]}
    return sum(int(n) for n in splits[split]["shardLengths"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _cache_path(folder: str, name: str, split: str) -> str | None:
  """The decode cache's file for the split prepared in `folder` (None: the folder holds no such split)."""
  key = cache.split_fingerprint(folder, split)
  return None if key is None else cache.cache_file("tfds", name, split, key)


def _cached(path: str | None, expected: int | None,
            shape: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray] | None:
  """The cached arrays at `path`: `expected` records of images of `shape` (None: no entry can be trusted)."""
  if path is None or expected is None:
    return None
  return cache.read_arrays(path, lambda x, y: x.ndim == 4 and len(y) == expected
                           and (shape is None or x.shape[1:] == shape))


def read_split(name: str, split: str, data_dir: str | None, folder: str | None,
               layout: Layout | None) -> tuple[np.ndarray, np.ndarray, Layout]:
  """One split as (uint8 NHWC images, int32 labels, the dataset's Layout), read-only: from the decode cache when
  this prepared split was decoded before on this machine, else decoded record by record and cached.

  `folder` is the dataset's version folder (its `layout` already read), or None for tfds to find `name` under
  `data_dir` (the layout is then read from what tfds opened)."""
  with errors.absl_warnings_held():  # (tfds' warnings: what goes wrong is one DataError line)
    return _read_split(name, split, data_dir, folder, layout)


def _read_split(name: str, split: str, data_dir: str | None, folder: str | None,
                layout: Layout | None) -> tuple[np.ndarray, np.ndarray, Layout]:
  if folder is not None:
    cached = _cached(_cache_path(folder, name, split), _split_length(folder, split), layout.shape)
    if cached is None:
      where = f"data.path={folder!r}"
      with _unreadable_records(where, split):
        source = _open_folder_split(folder, split)
        _check_fits(source, layout, where, split)
        cached = _decode(source, layout, where, split)
      _store(_cache_path(folder, name, split), cached)
  else:
    source = _open_named_split(name, split, data_dir)
    layout = _layout_of_source(source, name)
    path = _cache_path(str(source.dataset_info.data_dir), name, split)
    cached = _cached(path, len(source), layout.shape)
    if cached is None:
      where = f"tfds dataset {name!r} ({source.dataset_info.data_dir})"
      with _unreadable_records(where, split):
        _check_fits(source, layout, where, split)
        cached = _decode(source, layout, where, split)
      _store(path, cached)
  for array in cached:
    array.flags.writeable = False
  return cached[0], cached[1], layout


def _store(path: str | None, arrays: tuple[np.ndarray, np.ndarray]) -> None:
  """Caches the split at `path`, in place of the entries of its place decoded from earlier preparations."""
  if path is not None:
    name = os.path.basename(path)
    cache.write_arrays(path, *arrays, replaces=name[:name.rindex("-") + 1])  # (the key's <files> digest follows)


def _layout_of_source(source, name: str) -> Layout:
  """The `Layout` of a split tfds opened by name (its features as features.json would hold them)."""
  from google.protobuf import json_format  # (a tfds dependency)

  info = source.dataset_info
  spec = json_format.MessageToDict(info.features.to_proto())
  return layout_of(spec, tuple(info.splits), f"tfds dataset {name!r}")


def _open_folder_split(folder: str, split: str):
  """tfds' random-access source of one split of a prepared version folder."""
  tfds = _import_tfds(dataset_name(folder))
  return tfds.builder_from_directory(folder).as_data_source(split=split)


def _open_named_split(name: str, split: str, data_dir: str | None):
  """tfds' random-access source of one prepared split of `name`; DatasetNotFoundError saying how to prepare it."""
  tfds = _import_tfds(name)

  try:
    with _tfds_scratch():
      source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except (KeyError, NotImplementedError, tfds.core.registered.DatasetNotFoundError) as err:
    # What tfds 4.9 raises offline when nothing usable is on disk: KeyError ("splits is empty") when
    # data_dir is None; NotImplementedError ("file format TFRECORD is not supported") when data_dir is
    # given but empty, or when the dataset was prepared as TFRecord, which needs TensorFlow to read;
    # DatasetNotFoundError for a name tfds does not know with nothing prepared under it.
    raise DatasetNotFoundError(not_found_message(name, data_dir)) from err
  if len(source) == 0:
    raise DatasetNotFoundError(f"tfds dataset {name!r} split {split!r} is empty under data.data_dir={data_dir!r}")
  return source


@contextlib.contextmanager
def _tfds_scratch() -> Iterator[None]:
  """Keeps what tfds writes to the system's temporary folder inside one folder of its own, removed after the call.

  tfds (4.9) makes an empty `tmp*tfds` folder there, and never removes it, each time it builds a dataset that is
  not prepared (`DatasetInfo.initialize_from_bucket`): one per missing dataset a user names. Data is read in the
  main thread before any run starts, so redirecting `tempfile` for the length of the call is safe."""
  with tempfile.TemporaryDirectory(prefix="fedpsa-jax-tfds-") as scratch:
    previous, tempfile.tempdir = tempfile.tempdir, scratch
    try:
      yield
    finally:
      tempfile.tempdir = previous


@contextlib.contextmanager
def _unreadable_records(where: str, split: str) -> Iterator[None]:
  """Turns a failure to open or decode a split's records (a shard cut short, overwritten or deleted, or fewer
  records than dataset_info.json's `shardLengths` declare) into a DataError naming the folder and the split."""
  try:
    yield
  except DataError:
    raise
  except Exception as err:  # noqa: BLE001 — whatever tfds or ArrayRecord raise on damaged records: unusable data
    detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    raise DataError(f"{where}: the records of its {split!r} split cannot be read ({type(err).__name__}: {detail}); "
                    "allowed: the version folder as tfds prepared it, its shards whole and as many records as "
                    "dataset_info.json declares (prepare it again)") from None


def _check_fits(source, layout: Layout, where: str, split: str) -> None:
  """DataError when the records a split declares cannot fit in memory (`limits.check_fits_memory`): before
  `_decode` allocates them."""
  n = len(source)
  pixels = n * math.prod(layout.shape)
  limits.check_fits_memory(where, f"the {n:,} images of its {split!r} split", pixels, pixels)


def _decode(source, layout: Layout, where: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Every record of a tfds source, decoded one by one: the layout's image and label features. DataError naming
  the record when its image is not of the declared shape (assigned as it came, a grey image would be broadcast
  over the three channels that features.json declares, silently)."""
  _check_channels(source, layout, where, split)
  n = len(source)
  images = np.empty((n, *layout.shape), dtype=np.uint8)
  labels = np.empty(n, dtype=np.int32)
  for i in range(n):
    record = source[i]
    image = np.asarray(record[layout.image])
    if image.shape != layout.shape:
      raise DataError(f"{where}: record {i} of its {split!r} split holds an image of shape {image.shape}, where its "
                      f"features.json declares {layout.shape} for {layout.image!r}; allowed: records of the declared "
                      "shape (prepare the folder again, or correct features.json)")
    images[i] = image
    labels[i] = record[layout.label]
  return images, labels


def _check_channels(source, layout: Layout, where: str, split: str) -> None:
  """DataError when the first record's encoded image has another number of channels than features.json declares:
  tfds decodes a grey PNG declared as 3 channels into three copies of its grey, and the mismatch would pass unseen.
  The header is read with PIL (what tfds decodes with); an image PIL cannot tell, or a palette image (whose
  channels the declared shape decides), is left to the decoder."""
  import tensorflow_datasets as tfds
  from PIL import Image

  try:
    raw = source.dataset_info.features.deserialize_example_np(
        source.data_source[0], decoders={layout.image: tfds.decode.SkipDecoding()})[layout.image]
    mode = Image.open(io.BytesIO(raw)).mode
  except Exception:  # noqa: BLE001 — not an encoded image this check can read: the decoder speaks for it
    return
  channels = {"1": 1, "L": 1, "I": 1, "F": 1, "I;16": 1, "LA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
              "RGBA": 4, "CMYK": 4}.get(mode)
  if channels is not None and channels != layout.shape[-1]:
    raise DataError(f"{where}: the images of its {split!r} split are encoded with {channels} channel(s) (PIL mode "
                    f"{mode!r}), where its features.json declares {layout.shape[-1]} for {layout.image!r} "
                    f"(shape {layout.shape}); allowed: a features.json that declares the records' own shape "
                    "(prepare the folder again)")


def not_found_message(name: str, data_dir: str | None) -> str:
  """Where tfds looked for `name` and how to put a readable copy there."""
  import tensorflow_datasets as tfds

  base = name.partition(":")[0]
  known = True
  try:
    with _tfds_scratch():
      looked = str(tfds.builder(name, data_dir=data_dir).data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    known, looked = False, os.path.join(data_dir or default_data_dir(), base)
  except Exception:  # The message must not fail; fall back to the root directory.
    looked = os.path.join(data_dir or default_data_dir(), base)
  root = data_dir or default_data_dir()
  where = f"data.data_dir={data_dir!r}" if data_dir else "the tfds default data dir"
  if not known:
    return (f"data.name={name!r}: no dataset of that name is prepared in {looked} ({where}), and tfds knows no "
            f"dataset of that name; allowed: a name from the tfds catalog (tensorflow.org/datasets/catalog) "
            f"prepared in array_record under {root}, or data.path=FOLDER for a prepared dataset of any name")
  tfrecord = os.path.exists(os.path.join(looked, "dataset_info.json"))
  reason = ("is prepared there in the TFRecord format, which cannot be read without TensorFlow"
            if tfrecord else "is not prepared there")
  return (
      f"tfds dataset {name!r} {reason}: looked in {looked} ({where}, root {root}).\n"
      f"This code never downloads. To get it, on a machine with internet run\n"
      f"  pip install tensorflow tensorflow-datasets\n"
      f"  python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}', data_dir='DIR')"
      f".download_and_prepare(file_format='array_record')\"\n"
      f"then copy the prepared DIR/{base} folder to {root} here, or anywhere and pass "
      f"--config.data.data_dir=THAT_DIR. A copy already prepared as TFRecord (the tfds default) can "
      f"be converted with TensorFlow installed:\n"
      f"  tfds convert_format --dataset_version_dir={looked} --out_file_format=array_record")
