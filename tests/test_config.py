"""Bad configs are rejected before any work, each with a message naming the field."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedpsa_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BAD = [
    ("method", "fedfoo"),
    ("seed", 1.5),
    ("data.name", "imagenet"),
    ("data.test_split", "validation"),
    ("data.holdout_fraction", 0.0),
    ("data.holdout_fraction", 1.5),
    ("data.data_dir", "/nonexistent/tfds"),
    ("partition.method", "pathological"),
    ("partition.alpha", 0.0),
    ("partition.alpha", -1.0),
    ("partition.num_clients", 0),
    ("model.name", "resnet"),
    ("local.epochs", 0),
    ("local.batch_size", 0),
    ("local.lr", -0.01),
    ("local.lr_decay", 1.5),
    ("local.loop", "scan"),
    ("local.max_unroll", 0),
    ("sim.virtual_days", 0.0),
    ("sim.concurrency", 0.0),
    ("sim.concurrency", 1.2),
    ("sim.latency.distribution", "gaussian"),
    ("sim.latency.resample", "sometimes"),
    ("sim.latency.low", 0),
    ("sim.latency.shape", 0.0),
    ("sensitivity.calibration", "imagenet"),
    ("sensitivity.calibration_size", 0),
    ("sensitivity.sketch_dim", 0),
    ("sensitivity.chunk_size", 0),
    ("eval.every_days", 0.0),
    ("eval.batch_size", 0),
    ("fedpsa.buffer_size", 0),
    ("fedpsa.buffer_size", 51),
    ("fedpsa.queue_length", 0),
    ("fedpsa.gamma", -1.0),
    ("seed", -1),
    ("stop_on_nan", "yes"),
    ("sim.virtual_days", -1.0),
    ("sim.latency.high", 5),  # below sim.latency.low = 10: bounds reversed
    ("local.lr", float("nan")),
    ("partition.alpha", float("inf")),
    ("eval.every_round", 1),
    ("output.progress", "no"),
    ("checkpoint.every_days", -0.5),
    ("checkpoint.keep", 0),
]


def with_value(path, value, method=None):
  c = config_lib.base_config()
  if method:
    c.method = method
  return config_lib.set_fields(c, {path: value}, typed=False)  # (wrong types on purpose)


@pytest.mark.parametrize("path,value", BAD)
def test_bad_value_is_rejected_naming_the_field(path, value):
  with pytest.raises(ValueError) as err:
    config_lib.validate(with_value(path, value))
  assert f"{path}=" in str(err.value)
  assert "allowed" in str(err.value)


@pytest.mark.parametrize("path,value,method", [
    ("fedbuff.buffer_size", 100, "fedbuff"), ("fedbuff.server_lr", 0.0, "fedbuff"),
    ("fedasync.staleness", "exponential", "fedasync"), ("fedasync.alpha", 0.0, "fedasync"),
    ("fedasync.prox_mu", -1.0, "fedasync")])
def test_bad_method_field_is_rejected(path, value, method):
  with pytest.raises(ValueError, match=path.replace(".", r"\.") + "="):
    config_lib.validate(with_value(path, value, method))


def test_reversed_latency_bounds_and_official_split_of_embedded_data():
  c = with_value("sim.latency.low", 600)
  assert any(e.startswith("sim.latency.high=") for e in config_lib.config_errors(c))
  c = with_value("data.test_split", "official")
  assert any(e.startswith("data.test_split=") for e in config_lib.config_errors(c))


def test_default_and_paper_configs_validate():
  sys.path.insert(0, ROOT)
  from configs import default
  from configs.paper import experiment
  config_lib.validate(default.get_config())
  for dataset, model in [("mnist", "mnist_cnn"), ("fashion_mnist", "linear"), ("cifar10", "cifar_cnn"),
                         ("cifar100", "cifar_cnn")]:
    c = experiment.get_config(f"method=fedbuff,dataset={dataset},alpha=0.5")
    config_lib.validate(c)
    assert (c.method, c.data.name, c.model.name, c.partition.alpha) == ("fedbuff", dataset, model, 0.5)
    assert c.sim.virtual_days == 10.0
  with pytest.raises(ValueError, match="does not exist"):
    experiment.get_config("bogus_field=1")


def test_launch_rejects_bad_config_without_traceback(tmp_path):
  proc = subprocess.run(
      [sys.executable, "launch.py", "--config=configs/default.py", "--config.partition.alpha=-1",
       f"--workdir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "partition.alpha=-1" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(tmp_path / "run")
