"""The tfds path on the real on-disk format: a folder prepared by tfds (ArrayRecord), read by the code a
user's `data.data_dir` goes through, decoded once and then served from the decode cache.

The fixture (tests/fixtures/tensorflow_datasets/mnist/3.0.1) holds the first 300 training and 100 test records
of MNIST, copied byte for byte from a tfds-prepared copy (tests/fixtures/make_tfds_fixture.py). The reference
values are MNIST's own: its first training labels are 5 0 4 1 9 2 1 3 1 4, its first test labels
7 2 1 0 4 1 4 9 5 9, and its pixels are integers 0..255 with ~19% of them non-zero.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from fedpsa_jax.data import cache, sources
from fedpsa_jax.sim import runner
from helpers import small_config

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tensorflow_datasets")
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
