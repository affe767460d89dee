"""Whole runs on data the paper did not use (docs/runs.md, "Your own dataset"), each kind from a real fixture: a prepared tfds
dataset tfds does not know by name (tests/fixtures/tensorflow_datasets/colour_digits/1.0.0: MNIST records made
24x28 RGB, under other feature names), opened by its folder (`data.path`) and by its name under `data.data_dir`;
and an .npz of one's own arrays (the MNIST fixture's images, saved by the test). From the command line, the
notebook API and a sweep; every method and every partition; and bad data ending in one line, exit 2, before any
training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow_datasets as tfds

import fedpsa_jax as fj
from fedpsa_jax import choices, io, strategies, sweep
from fedpsa_jax import config as config_lib
from fedpsa_jax.data import cache, fingerprint
from fedpsa_jax.sim import runner
from fedpsa_lab import paper
import forked_launch
from helpers import ROOT, small_config

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tensorflow_datasets")
COLOUR = os.path.join(FIXTURES, "colour_digits", "1.0.0")
strategies.load_all()  # so that the parametrisation below sees every registered strategy


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))  # (inherited by the launched processes)


@pytest.fixture(scope="module")
def digits_npz(tmp_path_factory) -> str:
  """The MNIST fixture's 300 + 100 images as a user would save them: N x 28 x 28 uint8, integer labels."""
  source = tfds.builder_from_directory(os.path.join(FIXTURES, "mnist", "3.0.1"))
  arrays = {}
  for split in ("train", "test"):
    ds = source.as_data_source(split=split)
    arrays[f"x_{split}"] = np.stack([ds[i]["image"][..., 0] for i in range(len(ds))])
    arrays[f"y_{split}"] = np.array([ds[i]["label"] for i in range(len(ds))])
  path = str(tmp_path_factory.mktemp("npz") / "digits.npz")
  np.savez(path, **arrays)
  return path


def _own_data(method: str, path: str, **fields):
  return small_config(method, days=0.01, data__name=None, data__path=path, partition__num_clients=8, **fields)


def launch(*args: str) -> subprocess.CompletedProcess:
  return forked_launch.launch("--config=configs/default.py", "--config.runtime.progress=False",
                              "--config.data.name=None", "--config.partition.num_clients=8",
                              "--config.model.name=tiny_mlp", "--config.sim.virtual_days=0.01", *args, timeout=600)


@pytest.mark.parametrize("kind", ["folder", "npz"])
def test_a_command_line_run_on_a_tfds_folder_and_on_an_npz(kind, digits_npz, tmp_path):
  path = COLOUR if kind == "folder" else digits_npz
  proc = launch(f"--config.data.path={path}", f"--workdir={tmp_path / 'run'}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = json.load(open(tmp_path / "run" / "summary.json"))
  assert summary["status"] == "completed" and summary["dataset"] == ("colour_digits" if kind == "folder" else "digits")
  assert summary["client_updates"] > 0
  saved = io.read_config(str(tmp_path / "run"))["data"]
  assert saved["name"] is None and saved["path"] == path
  assert saved["fingerprint"] == fingerprint.content_fingerprint(path)
  assert f"on {summary['dataset']}: completed" in proc.stdout


def test_bad_data_is_one_line_and_exit_2_before_any_training(digits_npz, tmp_path):
  with np.load(digits_npz) as f:
    arrays = dict(f)
  bad = str(tmp_path / "bad.npz")
  np.savez(bad, **{**arrays, "y_test": arrays["y_test"].astype(np.float32)})
  small = str(tmp_path / "small.npz")  # 7x7 images: too small for CifarCNN's unpadded convs
  np.savez(small, **{**arrays, "x_train": arrays["x_train"][:, ::4, ::4], "x_test": arrays["x_test"][:, ::4, ::4]})
  for args, line in [
      ((f"--config.data.path={bad}",), f"data.path={bad!r}: y_test has dtype float32; allowed: integer labels"),
      ((f"--config.data.path={small}", "--config.model.name=cifar_cnn"),
       f"model.name='cifar_cnn' is invalid; allowed: a model that takes the 7x7x1 images of data.path={small!r}: "
       "mnist_cnn, linear, tiny_mlp, aifed_cnn"),
      (("--config.data.name=mnist_5k", f"--config.data.path={digits_npz}"),
       f"invalid config:\n  data.name='mnist_5k' and data.path={digits_npz!r} are both set; allowed: exactly one of "
       "them (with data.path, set data.name=None)")]:
    proc = launch(*args, f"--workdir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stderr.strip() == line, proc.stderr
    assert not os.path.exists(tmp_path / "run")  # nothing trained, no empty run directory left behind


@pytest.mark.parametrize("method", sorted(strategies.registered()))
def test_every_method_runs_on_a_tfds_folder(method, tmp_path):
  summary = runner.Simulation(_own_data(method, COLOUR, model="tiny_mlp"), str(tmp_path / "run")).run()
  assert summary["status"] == "completed" and summary["client_updates"] > 0 and summary["dataset"] == "colour_digits"


@pytest.mark.parametrize("partition", choices.PARTITIONERS)
@pytest.mark.parametrize("calibration", ["gaussian", "real"])
def test_every_partition_and_calibration_runs_on_an_npz(partition, calibration, digits_npz, tmp_path):
  c = _own_data("fedpsa", digits_npz, model="tiny_mlp", partition__method=partition, fedpsa__calibration=calibration,
                fedpsa__calibration_size=16, partition__group_proportions=(0.5, 0.5))
  summary = runner.Simulation(c, str(tmp_path / "run")).run()
  assert summary["status"] == "completed" and summary["client_updates"] > 0


def test_a_tfds_name_under_data_dir_and_the_notebook_api(tmp_path):
  result = fj.run(fj.config_from(_own_data("fedbuff", COLOUR), {"data.path": None, "data.name": "colour_digits",
                                                                "data.data_dir": FIXTURES}))
  assert result.summary["dataset"] == "colour_digits" and result.summary["status"] == "completed"


def test_a_moved_file_resumes_and_changed_content_is_another_run(digits_npz, tmp_path):
  first = str(shutil.copy(digits_npz, tmp_path / "a.npz"))
  runner.Simulation(_own_data("fedbuff", first), str(tmp_path / "run")).run()
  moved = str(shutil.move(first, tmp_path / "moved.npz"))
  longer = _own_data("fedbuff", moved, sim__virtual_days=0.015)
  assert runner.Simulation(longer, str(tmp_path / "run")).run()["virtual_days"] == pytest.approx(0.015)
  with np.load(moved) as f:
    arrays = dict(f)
  np.savez(moved, **{**arrays, "y_train": arrays["y_train"][::-1].copy()})
  with pytest.raises(config_lib.ConfigError, match=r"holds a run of a different config \(data\.fingerprint: "):
    runner.Simulation(_own_data("fedbuff", moved, sim__virtual_days=0.015), str(tmp_path / "run"))


def test_a_sweep_over_data_paths_skips_done_members_until_the_content_changes(digits_npz, tmp_path):
  own = str(shutil.copy(digits_npz, tmp_path / "own.npz"))
  base = _own_data("fedbuff", own, model="tiny_mlp")
  axis = ("data", [("folder", {"data.path": COLOUR}), ("npz", {"data.path": own})])
  make = lambda: paper.sweep_config("own", "own", base, [axis], [0], {"rows": ["data"], "cols": []})
  first = sweep.run_local(make(), str(tmp_path / "sweep"), log=lambda _: None)
  assert sorted(s["sweep_action"] for s in first.values()) == ["ran", "ran"]
  assert sorted(s["dataset"] for s in first.values()) == ["colour_digits", "own"]
  again = sweep.run_local(make(), str(tmp_path / "sweep"), log=lambda _: None)
  assert sorted(s["sweep_action"] for s in again.values()) == ["skipped", "skipped"]
  with np.load(own) as f:
    arrays = dict(f)
  np.savez(own, **{**arrays, "y_train": arrays["y_train"][::-1].copy()})  # other content, same path
  member = next(m for m in sweep.expand(make()) if m.labels["data"] == "npz")
  assert not sweep.is_done(io.config_json(member.config), sweep.member_dir(str(tmp_path / "sweep"), member))


def test_a_data_path_alone_on_the_command_line_replaces_the_configs_data_name(digits_npz, tmp_path):
  """`--config.data.path=X` alone was refused: "data.name='mnist_5k' and data.path=... are both set"."""
  with np.load(digits_npz) as f:
    arrays = dict(f)
  bad = str(tmp_path / "bad.npz")  # (refused once loaded: the path was taken, without a run)
  np.savez(bad, **{**arrays, "y_test": arrays["y_test"].astype(np.float32)})
  proc = forked_launch.launch("--config=configs/default.py", f"--config.data.path={bad}",
                              f"--workdir={tmp_path / 'run'}")
  assert proc.returncode == 2 and proc.stderr.strip() == (
      f"data.path={bad!r}: y_test has dtype float32; allowed: integer labels"), proc.stderr
