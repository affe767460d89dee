"""Data that cannot be used is one line naming the file and what is wrong (`DataError`, exit 2), found before any
allocation that could not fit (fedpsa_jax/data/limits.py, npz_reader.py, tfds_reader.py).

- .npz: a file cut short; headers declaring more images than memory holds, an image beyond the batch bound, or
  10^12 classes, all refused from the headers alone (the bodies below are a few bytes: reading one would fail);
  images whose size rules out the configured batch sizes, refused before any image is read;
- a tfds folder (copies of tests/fixtures/tensorflow_datasets/colour_digits): a shard cut in half, overwritten or
  deleted, `shardLengths` declaring more records than the shards hold, a features.json with an absurd image shape,
  `featuresDict: []` or 10^12 classes;
- the per-channel statistics of large images are taken a few images at a time, and still equal NumPy's.
"""

from __future__ import annotations

import io as std_io
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.data import sources
from fedpsa_jax.errors import DataError
from fedpsa_jax.sim import build
from helpers import small_config
from test_sources import colour  # noqa: F401  (the fixture: a private copy of the colour_digits folder)

SHARD = "colour_digits-train.array_record-00000-of-00001"


def _arrays() -> dict[str, np.ndarray]:
  x = np.random.default_rng(0).integers(0, 256, (40, 8, 8), dtype=np.uint8)
  y = np.arange(40) % 4
  return {"x_train": x[:30], "y_train": y[:30], "x_test": x[30:], "y_test": y[30:]}


def _npz_declaring(path: str, x_train_shape: tuple[int, ...], **more: np.ndarray) -> str:
  """An .npz whose x_train header declares `x_train_shape` (uint8) over a body of a few bytes: loading it would
  fail (or allocate what the header says); only its header may be read."""
  arrays = {**_arrays(), **more}
  with zipfile.ZipFile(path, "w") as z:
    for key, array in arrays.items():
      buf = std_io.BytesIO()
      if key == "x_train":
        np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": x_train_shape})
        buf.write(b"\0" * 64)
      else:
        np.lib.format.write_array(buf, array)
      z.writestr(key + ".npy", buf.getvalue())
  return path


def _refused(path: str, words: str, **kwargs) -> str:
  with pytest.raises(DataError) as err:
    sources.load_dataset(path=path, rng=np.random.default_rng(0), **kwargs)
  message = str(err.value)
  assert message.startswith(f"data.path={path!r}") and words in message and "\n" not in message, message
  return message


def test_a_truncated_npz_is_one_line(tmp_path):
  path = str(tmp_path / "cut.npz")
  np.savez(path, **_arrays())
  whole = open(path, "rb").read()
  open(path, "wb").write(whole[:len(whole) // 2])  # (was zipfile.BadZipFile, a traceback)
  _refused(path, "cannot be read as an .npz of numeric arrays (File is not a zip file)")


def test_a_header_declaring_a_billion_images_is_refused_before_any_allocation(tmp_path):
  """numpy would allocate the 730 GiB the header declares (a MemoryError after a long wait, or the machine)."""
  path = _npz_declaring(str(tmp_path / "huge.npz"), (10**9, 28, 28))
  need = (10**9 * 784 * 5 + 8 * 40) / 2**30  # (as stored, uint8, and as float32, plus the small arrays)
  message = _refused(path, f"its arrays need {need:,.1f} GiB in memory (as stored and as float32), more than this "
                           f"machine's {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:,.1f} GiB")
  assert "allowed: data whose images fit in memory" in message


def test_an_image_beyond_the_batch_bound_is_refused_from_the_header(tmp_path):
  path = _npz_declaring(str(tmp_path / "wide.npz"), (30, 20000, 20000))
  _refused(path, "its images are 20000x20000x1, 1.5 GiB each as float32; allowed: images of at most 1 GiB")


def test_images_that_rule_out_the_batch_sizes_are_refused_before_they_are_read(tmp_path):
  """70 images of 3000 x 3000: 36 MB each as float32, so at most 29 in a 1 GiB batch, and eval.batch_size is 1000.
  The header says so: the images (here a few bytes that could not be read as them) are never read, and neither
  are their float64 statistics taken (4 GiB after 24 s, before)."""
  path = _npz_declaring(str(tmp_path / "large.npz"), (70, 3000, 3000))
  config = config_lib.set_fields(small_config("fedbuff"), {"data.name": None, "data.path": path,
                                                                   "local.batch_size": 16})
  with pytest.raises(config_lib.ConfigError) as err:
    build.build_data(config)
  assert str(err.value) == ("invalid config for this dataset:\n  eval.batch_size=1000 is invalid; allowed: an integer "
                            f"in [1, 29] with data.path={path!r} (a batch of that many samples of 36,000,000 bytes "
                            "each must fit in 1 GiB)")


@pytest.mark.parametrize("more,words", [
    ({"num_classes": np.int64(10**12)}, "it declares 1,000,000,000,000 classes; allowed: 1 to 1,048,576 classes"),
    ({"y_test": np.full(10, 10**12)}, "it declares 1,000,000,000,001 classes")])
def test_a_class_count_beyond_the_bound_is_refused(tmp_path, more, words):
  """np.bincount(minlength=10**12) tried to allocate 7.28 TiB."""
  path = str(tmp_path / "classes.npz")
  np.savez(path, **{**_arrays(), **more})
  _refused(path, words)


def test_channel_statistics_of_large_images_are_taken_a_few_at_a_time_and_equal_numpys():
  x = np.random.default_rng(1).integers(0, 256, (7, 30, 20, 3), dtype=np.uint8)
  mean, std = sources.channel_stats(x, 255.0, block_values=2 * x[0].size)  # two images a block
  reference = x.reshape(-1, 3).astype(np.float64) / 255
  np.testing.assert_allclose(mean, reference.mean(axis=0), rtol=1e-12)
  np.testing.assert_allclose(std, reference.std(axis=0), rtol=1e-12)


def _cut(folder: str) -> None:
  whole = open(os.path.join(folder, SHARD), "rb").read()
  open(os.path.join(folder, SHARD), "wb").write(whole[:len(whole) // 2])


def _overwrite(folder: str) -> None:
  size = os.path.getsize(os.path.join(folder, SHARD))
  open(os.path.join(folder, SHARD), "wb").write(np.random.default_rng(2).bytes(size))


def _edit(name: str, edit):
  def apply(folder: str) -> None:
    path = os.path.join(folder, name)
    spec = json.load(open(path))
    edit(spec)
    json.dump(spec, open(path, "w"))
  return apply


def _lie(info: dict) -> None:
  info["splits"][0]["shardLengths"] = [str(int(info["splits"][0]["shardLengths"][0]) + 100)]


def _image_shape(dimensions: list[str]):
  return lambda spec: spec["featuresDict"]["features"]["picture"]["image"]["shape"].update(dimensions=dimensions)


RECORDS = "the records of its 'train' split cannot be read"
TFDS_DEFECTS = [  # (id, damage, the words of the one line)
    ("shard cut in half", _cut, f"{RECORDS} (RuntimeError: Corrupted Riegeli/records file"),
    ("shard overwritten", _overwrite, f"{RECORDS} (RuntimeError: Corrupted Riegeli/records file"),
    ("shard deleted", lambda f: os.remove(os.path.join(f, SHARD)), f"{RECORDS} (RuntimeError: open() failed"),
    ("shardLengths that lie", _edit("dataset_info.json", _lie), f"{RECORDS} (RuntimeError: index 160 out of bound 160)"),
    ("absurd image shape", _edit("features.json", _image_shape(["100000", "100000", "3"])),
     "its images are 100000x100000x3, 111.8 GiB each as float32; allowed: images of at most 1 GiB"),
    ("featuresDict []", _edit("features.json", lambda s: s.update(featuresDict=[])),
     "its features.json holds no feature dictionary"),
    ("a feature that is a list", _edit("features.json", lambda s: s["featuresDict"]["features"].update(picture=[])),
     "its features.json holds no feature dictionary"),
    ("a shape that is not a number", _edit("features.json", _image_shape(["a", "28", "3"])),
     "its features.json is not a tfds feature spec (ValueError: invalid literal for int()"),
    ("10^12 classes", _edit("features.json",
                            lambda s: s["featuresDict"]["features"]["digit"]["classLabel"].update(numClasses=str(10**12))),
     "it declares 1,000,000,000,000 classes"),
]


@pytest.mark.parametrize("damage,words", [pytest.param(d, w, id=i) for i, d, w in TFDS_DEFECTS])
def test_a_damaged_tfds_folder_is_one_line_naming_it(colour, damage, words):
  damage(colour)
  message = _refused(colour, words)
  assert "Traceback" not in message


@pytest.mark.parametrize("channels,encoded", [("3", "1 channel(s) (PIL mode 'L')"), ("1", None)])
def test_features_json_that_declares_other_channels_than_the_records_is_refused(channels, encoded, colour, tmp_path,
                                                                                  monkeypatch):
  # tfds decodes a grey PNG declared as 3 channels into three copies of its grey (and a colour one declared as 1
  # fails to broadcast): the declared channels and the encoded ones must agree. The grey folder: the mnist fixture.
  folder = colour
  if channels == "3":
    folder = str(tmp_path / "grey" / "mnist" / "3.0.1")
    shutil.copytree(os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "tensorflow_datasets",
                                 "mnist", "3.0.1"), folder)
    feature = "image"
  else:
    feature = "picture"

  def declare(spec):
    spec["featuresDict"]["features"][feature]["image"]["shape"]["dimensions"][-1] = channels
  _edit("features.json", declare)(folder)
  if encoded:
    message = _refused(folder, f"the images of its 'train' split are encoded with {encoded}, where its features.json "
                               f"declares {channels} for {feature!r}")
  else:
    message = _refused(folder, "the images of its 'train' split are encoded with 3 channel(s) (PIL mode 'RGB'), where "
                               "its features.json declares 1")
  assert "Traceback" not in message
