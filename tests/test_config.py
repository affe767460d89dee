"""Bad configs are rejected before any work, each with a message naming the field."""

from __future__ import annotations

import os
import sys

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax.sim import runner
from fedpsa_jax.strategies import fedpsa
from fedpsa_jax.validation import MISSING, get_field
import forked_launch
from helpers import small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BAD = [
    ("method", "fedfoo"),
    ("seed", 1.5),
    ("data.name", "Image Net"),  # (a tfds name is lower case: any such name passes here, tfds says if it exists)
    ("data.fingerprint", "not hex"),
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
    ("runtime.loop", "scan"),
    ("sim.virtual_days", 0.0),
    ("sim.concurrency", 0.0),
    ("sim.concurrency", 1.2),
    ("sim.latency.distribution", "gaussian"),
    ("sim.latency.resample", "sometimes"),
    ("sim.latency.low", 0),
    ("sim.latency.shape", 0.0),
    ("fedpsa.calibration", "imagenet"),
    ("fedpsa.calibration_size", 0),
    ("fedpsa.sketch_dim", 0),
    ("fedpsa.projection", "sparse"),
    ("runtime.fisher_chunk_size", 0),
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
    ("runtime.progress", "no"),
    ("checkpoint.every_days", -0.5),
    ("checkpoint.keep", 0),
    # Beyond int64 (a crash in the build, or a wrap-around to a run that never ends).
    ("seed", 2**63),
    ("sim.latency.low", 2**63),
    ("sim.latency.high", 2**63),
    ("sim.latency.high", 2**63 - 2),  # the arrival time (budget + response time) overflows
    ("sim.virtual_days", 1e300),  # x 86,400 units
    ("eval.every_days", 1e300),
    ("checkpoint.every_days", 1e300),
    ("checkpoint.every_days", 1e-9),  # rounds to 0 units, which would mean 'only at the end'
    # Work beyond any client update (epochs visit at least one sample each).
    ("local.epochs", 2**22 + 1),
    # Beyond what memory holds (an out-of-memory error once the run is built or the first client returns).
    ("fedpsa.sketch_dim", 4097),
    ("fedpsa.calibration_size", 65_537),
    # Never a number: a boolean (True == 1 in Python), an infinity.
    ("sim.virtual_days", True),
    ("fedpsa.sketch_dim", True),
    ("local.lr", float("inf")),
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


def _with_data(name, path, fingerprint=None):
  c = config_lib.base_config()
  config_lib.set_fields(c, {"data.name": name, "data.path": path, "data.fingerprint": fingerprint}, typed=False)
  return c


@pytest.mark.parametrize("name,path,fingerprint,expected", [
    ("mnist_5k", "x.npz", None, "are both set; allowed: exactly one of them"),
    (None, None, None, "are both None; allowed: exactly one of them"),
    (None, "/nonexistent/data.npz", None, "data.path='/nonexistent/data.npz' is invalid; allowed: an existing .npz"),
    (None, __file__, None, "is invalid; allowed: an existing .npz file or prepared tfds folder (a file, but not an"),
    (None, os.path.dirname(__file__), None, "allowed: the version folder of a prepared tfds dataset"),
    ("mnist_5k", None, "0123456789abcdef", "data.fingerprint='0123456789abcdef' is invalid; allowed: None without"),
    (None, 5, None, "data.path=5 is invalid; allowed: a non-empty string, or None"),
])
def test_the_data_source_is_exactly_one_usable_name_or_path(name, path, fingerprint, expected):
  with pytest.raises(config_lib.ConfigError) as err:
    config_lib.validate(_with_data(name, path, fingerprint))
  assert expected in str(err.value), str(err.value)


def test_a_tfds_name_or_a_usable_path_passes(tmp_path):
  fixture = os.path.join(ROOT, "tests", "fixtures", "tensorflow_datasets", "colour_digits", "1.0.0")
  (tmp_path / "mine.npz").write_bytes(b"")  # (its content is the loader's to check)
  for name, path in (("kmnist", None), ("emnist/digits", None), ("mnist:3.0.1", None), (None, fixture),
                     (None, str(tmp_path / "mine.npz"))):
    config_lib.validate(_with_data(name, path))


@pytest.mark.parametrize("path,value,method", [
    ("fedbuff.buffer_size", 100, "fedbuff"), ("fedbuff.server_lr", 0.0, "fedbuff"),
    ("fedasync.staleness", "exponential", "fedasync"), ("fedasync.alpha", 0.0, "fedasync"),
    ("fedasync.prox_mu", -1.0, "fedasync"), ("casa.buffer_budget", 2**63, "casa")])
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


@pytest.mark.slow
def test_launch_rejects_bad_config_without_traceback(tmp_path):
  proc = forked_launch.launch("--config=configs/default.py", "--config.partition.alpha=-1",
                              f"--workdir={tmp_path / 'run'}")
  assert proc.returncode != 0
  assert "partition.alpha=-1" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(tmp_path / "run")


def test_int64_bounds_accept_the_largest_values_that_fit():
  c = with_value("seed", 2**63 - 1)
  config_lib.set_fields(c, {"sim.virtual_days": 1e14, "sim.latency.high": 2**63 - 1 - int(1e14) * 86_400 - 1})
  assert config_lib.config_errors(c) == []
  config_lib.set_fields(c, {"sim.latency.slow_fraction": 0.5, "sim.latency.slow_factor": 2.0})
  assert [e.split("=")[0] for e in config_lib.config_errors(c)] == ["sim.latency.slow_factor"]  # x 2 overflows


@pytest.mark.parametrize("high", [500, 10**12, 2**62])
def test_a_slow_factor_that_overflows_int64_is_named_with_the_largest_that_fits(high):
  c = config_lib.set_fields(config_lib.base_config(), {"sim.latency.high": high, "sim.latency.slow_fraction": 0.3,
                                                       "sim.latency.slow_factor": 1e300})
  errors = config_lib.config_errors(c)
  assert len(errors) == 1
  assert errors[0].startswith("sim.latency.slow_factor=1e+300 is invalid; allowed: a number in [1, ")
  assert f"] with sim.latency.high={high} (" in errors[0] and "must fit in int64" in errors[0]
  largest = float(errors[0].split("[1, ")[1].split("]")[0])
  config_lib.set_fields(c, {"sim.latency.slow_factor": largest})  # the bound shown is one that runs
  assert config_lib.config_errors(c) == []
  c.sim.latency.slow_fraction = 0.0  # no slow devices: the factor is never applied
  c.sim.latency.slow_factor = 1e300
  assert config_lib.config_errors(c) == []


def test_sensitivity_sizes_are_bounded_by_memory_and_the_model():
  c = config_lib.set_fields(config_lib.base_config(), {"fedpsa.sketch_dim": 4096,
                                                       "fedpsa.calibration_size": 65_536})
  assert config_lib.config_errors(c) == []  # the bounds themselves are allowed
  c.fedpsa.sketch_dim = 4097
  assert config_lib.config_errors(c) == ["fedpsa.sketch_dim=4097 is invalid; allowed: an integer in [1, 4096] "
                                         "(the rows of the sketch_dim x parameters float32 projection held in "
                                         "memory; default 16)"]
  # The projection R, sketch_dim x parameters float32, within 1 GiB: 161 rows of the MNIST CNN's 1,663,370.
  c.fedpsa.sketch_dim = 161
  assert fedpsa.bound_errors(c.fedpsa, 1_663_370, train_size=4500) == []
  c.fedpsa.sketch_dim = 162
  (message,) = fedpsa.bound_errors(c.fedpsa, 1_663_370, train_size=4500, model="mnist_cnn")
  assert message.startswith("fedpsa.sketch_dim=162 is invalid; allowed: an integer in [1, 161] with model.name='mnist_cnn' "
                            "(1,663,370 parameters")
  c.fedpsa.projection = "count_sketch"  # 8 bytes per parameter whatever k: only the static bound applies
  assert fedpsa.bound_errors(c.fedpsa, 1_663_370, train_size=4500, model="mnist_cnn") == []
  c.fedpsa.projection = "gaussian"
  c.fedpsa.sketch_dim = 4096
  assert fedpsa.bound_errors(c.fedpsa, 7850, train_size=4500) == []  # a small model: the static bound applies
  # A real calibration batch is drawn from the training samples (a gaussian one is not bounded by them).
  c.fedpsa.calibration_size = 4501
  assert fedpsa.bound_errors(c.fedpsa, 7850, train_size=4500) == []
  c.fedpsa.calibration = "real"
  (message,) = fedpsa.bound_errors(c.fedpsa, 7850, train_size=4500)
  assert message.startswith("fedpsa.calibration_size=4501 is invalid; allowed: an integer in [1, 4500] with "
                            "fedpsa.calibration='real'")


@pytest.mark.slow
def test_fedpsa_refuses_bounds_of_the_model_and_data_before_any_training():
  """The bounds only the model and the data show are checked when FedPSA is built, with a one-line
  ConfigError (exit 2), and a method that has no projection never sees them."""
  c = small_config("fedpsa", model="mnist_cnn", fedpsa__sketch_dim=4096)  # the MNIST CNN: at most 161 rows fit in 1 GiB
  with pytest.raises(config_lib.ConfigError, match=r"fedpsa\.sketch_dim=4096 is invalid; allowed: an integer in "
                     r"\[1, 161\]"):
    runner.Simulation(c)
  runner.Simulation(small_config("fedbuff", model="mnist_cnn", fedpsa__sketch_dim=4096)).close()  # not FedBuff's business


def test_a_checkpoint_interval_of_at_least_one_time_unit_or_none():
  """checkpoint.every_days is counted in whole units of 1/86,400 day: 0 is 'only at the end', and an interval
  that would round to 0 units is refused rather than read as that."""
  for days in (0, 1 / 86_400, 0.01):
    assert config_lib.config_errors(with_value("checkpoint.every_days", days)) == []
  (message,) = config_lib.config_errors(with_value("checkpoint.every_days", 0.99 / 86_400))
  assert message.startswith("checkpoint.every_days=1.1458333333333333e-05 is invalid; allowed: 0 (checkpoint only "
                            "at the end) or a number in [1/86,400, 100000000000000]")


def test_the_work_of_a_client_update_is_bounded_by_the_data():
  """A batch of local.batch_size (or eval.batch_size) float32 samples must fit in 1 GiB, and a client update
  visits at most 2**22 samples: local.epochs x the largest client's samples."""
  sizes = config_lib.DataSizes(train=4500, test=500, sample_bytes=28 * 28 * 4)  # MNIST images
  largest_batch = 2**30 // (28 * 28 * 4)  # 342,392
  c = config_lib.set_fields(config_lib.base_config(), {"local.batch_size": largest_batch,
                                                       "eval.batch_size": largest_batch})
  assert config_lib.data_errors(c, sizes) == []
  c.local.batch_size = c.eval.batch_size = largest_batch + 1
  assert config_lib.data_errors(c, sizes) == [
      f"{field}=342393 is invalid; allowed: an integer in [1, 342,392] with data.name='mnist_5k' (a batch of that many "
      "samples of 3,136 bytes each must fit in 1 GiB)" for field in ("local.batch_size", "eval.batch_size")]
  c.local.epochs = 2**22 // 523  # 8,019 epochs of the largest client's 523 samples
  assert config_lib.rules.federation_errors(c, largest_client=523) == []
  c.local.epochs += 1
  assert config_lib.rules.federation_errors(c, largest_client=523) == [
      "local.epochs=8020 is invalid; allowed: an integer in [1, 8,019] with the largest client's 523 samples (its "
      "update visits local.epochs x 523 samples, at most 4,194,304)"]
  with pytest.raises(config_lib.ConfigError, match="invalid config for this dataset:\n  local.epochs=8020"):
    config_lib.validate_data(c, sizes, largest_client=523)


def test_a_moved_or_removed_field_gets_an_error_that_names_where_it_went():
  c = config_lib.base_config()
  for old, new in config_lib.MOVED_FIELDS.items():
    assert get_field(c, new) is not MISSING
    with pytest.raises(config_lib.ConfigError, match=f"config field '{old}' has moved; use '{new}'"):
      config_lib.set_fields(c, {old: 1})
  with pytest.raises(config_lib.ConfigError, match="'local.max_unroll' no longer exists: client updates always"):
    config_lib.set_fields(c, {"local.max_unroll": 2})


def test_a_fedfa_window_is_at_most_the_clients():
  c = config_lib.set_fields(config_lib.base_config(), {"method": "fedfa", "partition.num_clients": 20,
                                                       "fedfa.window_size": 20})
  assert config_lib.config_errors(c) == []
  c.fedfa.window_size = 21
  assert config_lib.config_errors(c) == ["fedfa.window_size=21 is invalid; allowed: an integer in [1, 20] (at most "
                                         "partition.num_clients)"]


SIZES = config_lib.DataSizes(train=4500, test=500, train_per_class=(450,) * 10)


@pytest.mark.parametrize("fields,sizes,expected", [
    ({"partition.num_clients": 4501}, SIZES, "partition.num_clients=4501 is invalid; allowed: an integer in [1, 4500]"),
    ({"data.holdout_fraction": 0.99}, config_lib.DataSizes(0, 5000), "data.holdout_fraction=0.99 is invalid; "
     "allowed: a number in (0, 1) that leaves training samples"),
    ({"data.holdout_fraction": 0.001}, config_lib.DataSizes(5000, 0), "leaves test samples"),
    # label_groups: group 0 holds label 0 only (450 samples) but gets a tenth of 4,600 clients.
    ({"partition.method": "label_groups", "partition.group_proportions": (0.1, 0.9), "partition.num_clients": 4500,
      "data.holdout_fraction": 0.05}, config_lib.DataSizes(4600, 400, (450, *(461,) * 9)),
     "group 0 gets 450 clients but its labels have 450"),
])
def test_data_errors_name_the_field_and_the_range_the_data_allows(fields, sizes, expected):
  c = config_lib.set_fields(config_lib.base_config(), fields)
  errors = config_lib.data_errors(c, sizes)
  if "group 0" in expected:  # (450 clients on 450 samples fit; one client more does not)
    assert errors == []
    c.partition.num_clients = 4510
    errors = config_lib.data_errors(c, sizes)
    expected = "group 0 gets 451 clients but its labels have 450"
  assert len(errors) == 1 and expected in errors[0], errors
  with pytest.raises(config_lib.ConfigError, match="invalid config for this dataset"):
    config_lib.validate_data(c, sizes)
  assert config_lib.data_errors(config_lib.base_config(), SIZES) == []  # the defaults fit


def _uncommented_fields(path: str) -> list[str]:
  """`c.<field> = ...` assignments of a config-building module with no comment on their line or right above
  (the block of comment lines that ends on the line before)."""
  import ast

  source = open(path).read()
  lines = source.splitlines()
  out = []
  for node in ast.walk(ast.parse(source)):
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)):
      continue
    target = ast.unparse(node.targets[0])
    if not target.startswith("c.") or isinstance(node.value, ast.Call) and ast.unparse(node.value.func).endswith(
        ("ConfigDict", "default_config", "runtime_config")):
      continue  # (a section, not a field)
    line = lines[node.end_lineno - 1]
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    if "#" not in line and not above.startswith("#"):
      out.append(f"{os.path.basename(path)}:{node.lineno} {target}")
  return out


def test_every_config_field_has_a_comment():
  """Every field of the schema and of each strategy's section says what it means, where it is defined."""
  from fedpsa_jax import strategies
  from fedpsa_jax.config import schema

  strategies.load_all()
  paths = [schema.__file__] + sorted({sys.modules[cls.__module__].__file__ for cls in strategies.registered().values()})
  missing = [entry for path in paths for entry in _uncommented_fields(path)]
  assert missing == []


def test_a_data_path_set_over_a_config_replaces_its_data_name_unless_both_are_set(tmp_path):
  """`--config.data.path=X` alone (or `data.path=X` in set_fields, an `:arg`, the notebook API) was refused
  because the config's own data.name='mnist_5k' was still set."""
  (tmp_path / "mine.npz").write_bytes(b"")
  path = str(tmp_path / "mine.npz")
  c = config_lib.set_fields(config_lib.base_config(), {"data.path": path})
  assert (c.data.name, c.data.path) == (None, path)
  config_lib.validate(c)
  both = config_lib.set_fields(config_lib.base_config(), {"data.path": path, "data.name": "mnist_5k"})
  with pytest.raises(config_lib.ConfigError, match="are both set; allowed: exactly one of them"):
    config_lib.validate(both)
  unset = config_lib.set_fields(config_lib.base_config(), {"data.path": None})  # (no path: the name stays)
  assert unset.data.name == "mnist_5k"
