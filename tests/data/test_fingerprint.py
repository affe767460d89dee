"""The content fingerprint of `data.path` (data/fingerprint.py) and its place in a run's identity: the path may
move, the content may not change, and configs written before these fields still resume."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, run_identity
from fedpsa_jax.data import fingerprint
from helpers import ROOT, small_config

COLOUR = os.path.join(ROOT, "tests", "fixtures", "tensorflow_datasets", "colour_digits", "1.0.0")


def _npz(path, seed: int = 0) -> str:
  rng = np.random.default_rng(seed)
  np.savez(path, x_train=rng.integers(0, 255, (20, 4, 4), np.uint8), y_train=np.arange(20) % 2,
           x_test=rng.integers(0, 255, (6, 4, 4), np.uint8), y_test=np.arange(6) % 2)
  return str(path)


def test_an_npz_fingerprint_is_the_sha256_of_its_bytes_wherever_it_lies(tmp_path):
  path = _npz(tmp_path / "a.npz")
  expected = hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]
  assert fingerprint.content_fingerprint(path) == expected
  moved = shutil.copy(path, tmp_path / "elsewhere.npz")
  assert fingerprint.content_fingerprint(moved) == expected
  assert fingerprint.content_fingerprint(_npz(tmp_path / "a.npz", seed=1)) != expected  # other content


def test_a_folder_fingerprint_follows_its_spec_and_files_not_its_place_or_times(tmp_path):
  copy = shutil.copytree(COLOUR, tmp_path / "copy")
  original = fingerprint.content_fingerprint(COLOUR)
  assert fingerprint.content_fingerprint(str(copy)) == original
  os.utime(copy / "features.json", ns=(1, 1))
  assert fingerprint.content_fingerprint(str(copy)) == original
  with open(copy / "colour_digits-train.array_record-00000-of-00001", "ab") as f:
    f.write(b"\0")  # a shard of another size
  assert fingerprint.content_fingerprint(str(copy)) != original


def _config(path: str, pinned: str | None = None):
  c = small_config("fedbuff")
  config_lib.set_fields(c, {"data.name": None, "data.path": path, "data.fingerprint": pinned})
  return c


def test_pinned_sets_the_fingerprint_on_a_copy_and_checks_a_given_one(tmp_path):
  path = _npz(tmp_path / "a.npz")
  c = _config(path)
  out = fingerprint.pinned(c)
  assert out.data.fingerprint == fingerprint.content_fingerprint(path) and c.data.fingerprint is None
  assert fingerprint.pinned(_config(path, out.data.fingerprint)).data.fingerprint == out.data.fingerprint
  with pytest.raises(config_lib.ConfigError, match=r"data\.fingerprint='0000000000000000' is invalid: the content "
                                                   r"of data\.path=.* has the fingerprint"):
    fingerprint.pinned(_config(path, "0" * 16))
  named = small_config("fedbuff")
  assert fingerprint.pinned(named) is named  # no data.path: nothing to pin
  assert fingerprint.pinned_json(io.config_json(c))["data"]["fingerprint"] == out.data.fingerprint


def test_the_identity_holds_the_content_not_the_path(tmp_path):
  path = _npz(tmp_path / "a.npz")
  saved = io.config_json(fingerprint.pinned(_config(path)))
  moved = str(shutil.copy(path, tmp_path / "moved.npz"))
  assert run_identity.identity_differences(saved, fingerprint.pinned_json(io.config_json(_config(moved)))) == []
  _npz(moved, seed=1)
  diffs = run_identity.identity_differences(saved, fingerprint.pinned_json(io.config_json(_config(moved))))
  assert len(diffs) == 1 and diffs[0].startswith("data.fingerprint: ")


def test_a_config_written_before_the_data_path_fields_is_the_same_run():
  current = io.config_json(small_config("fedbuff"))
  older = io.config_json(small_config("fedbuff"))
  del older["data"]["path"], older["data"]["fingerprint"]
  assert run_identity.identity_differences(older, current) == []
  current["data"]["fingerprint"] = "0123456789abcdef"  # set: a difference (as any value against <absent>)
  assert run_identity.identity_differences(older, current) == ["data.fingerprint: '<absent>' -> '0123456789abcdef'"]
