"""Config plumbing: the shared validators (fedpsa_jax/validation.py), the one field setter
(`config.set_fields`), the one `:arg` grammar (`config.parse_arg`) that every config file uses, the one
dataset-to-model table, and the vocabularies of fedpsa_jax/choices.py."""

from __future__ import annotations

import glob
import math
import os
import sys

import numpy as np
import pytest

from fedpsa_jax import choices, sweep
from fedpsa_jax import config as config_lib
from fedpsa_jax.validation import (MISSING, boolean, error, field_errors, get_field, integer, number, one_of,
                                   sequence_of)
from fedpsa_lab import paper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_CONFIGS = ["configs/default.py", "configs/casa.py", "configs/aifed.py", "configs/paper/experiment.py"]
SWEEP_CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs/paper/*.py"))
                       if not p.endswith("experiment.py"))


def _load(spec: str):
  return config_lib.load_file(os.path.join(ROOT, spec))


# --- validators ------------------------------------------------------------------------------------------


def test_numbers_reject_bools_and_non_finite_values():
  assert integer(ge=1)(3) and integer(ge=1)(np.int64(3))
  assert not integer(ge=1)(True) and not integer(ge=1)(0) and not integer(ge=1)(2.0)
  lr = number(gt=0)
  assert lr(0.1) and lr(1) and lr(np.float32(0.5))
  assert not lr(True) and not lr(0.0) and not lr(math.nan) and not lr(math.inf) and not lr("0.1")
  assert number(gt=0, finite=False)(math.inf) and not number(gt=0, finite=False)(math.nan)
  share = number(gt=0, le=1)
  assert share(1.0) and not share(1.0001) and not share(0)
  assert boolean(False) and not boolean(0) and not boolean("True")
  assert one_of(("a", "b"))("a") and not one_of(("a", "b"))("c") and not one_of(("a", "b"))(["a"])
  props = sequence_of(number(gt=0), min_len=1)
  assert props((0.5, 0.5)) and props([1]) and not props(()) and not props((0.5, -1)) and not props(0.5)


def test_allowed_words_and_messages():
  assert integer(ge=1).allowed == "an integer >= 1"
  assert number(gt=0, lt=1).allowed == "a number in (0, 1)"
  assert number(ge=0, le=1, note="0: off").allowed == "a number in [0, 1] (0: off)"
  assert number(gt=0, le=1).allowed == "a number in (0, 1]"
  assert one_of(("vmap", "loop")).allowed == "loop, vmap"
  assert sequence_of(number(gt=0), min_len=1).allowed == "a non-empty tuple of numbers > 0"
  c = {"local": {"lr": -1.0, "epochs": 2}}
  assert get_field(c, "local.lr") == -1.0 and get_field(c, "local.momentum") is MISSING
  assert get_field(c, "local.lr.x") is MISSING
  assert field_errors(c, [("local.lr", number(gt=0)), ("local.epochs", integer(ge=1)),
                          ("local.momentum", number(ge=0))]) == [
      "local.lr=-1.0 is invalid; allowed: a number > 0", "local.momentum is missing; allowed: a number >= 0"]
  assert error("x", True, "a number") == "x=True is invalid; allowed: a number"


def test_an_integer_beyond_int64_is_refused_whatever_its_row_allows():
  """Every config integer reaches NumPy or JAX as int64: `field_errors` refuses one beyond it even where the
  row has no upper bound (CASA's buffer budget, a count), naming the row's own words and the bound."""
  rows = [("budget", integer(ge=0)), ("rate", number(gt=0))]
  assert field_errors({"budget": 2**63 - 1, "rate": 2**63 - 1}, rows) == []
  assert field_errors({"budget": 2**63, "rate": -2**63 - 1}, rows) == [
      "budget=9223372036854775808 is invalid; allowed: an integer >= 0, within int64 (at most 9223372036854775807)",
      "rate=-9223372036854775809 is invalid; allowed: a number > 0"]  # (its own row refuses it first)
  c = config_lib.set_fields(config_lib.base_config(), {"method": "casa", "casa.buffer_budget": 2**63})
  assert config_lib.config_errors(c) == ["casa.buffer_budget=9223372036854775808 is invalid; allowed: an integer >= 0, "
                                         "within int64 (at most 9223372036854775807)"]


def test_config_rules_reject_a_bool_where_a_number_is_wanted():
  c = config_lib.set_fields(config_lib.base_config(), {"local.lr": True, "partition.num_clients": True},
                            typed=False)
  errors = config_lib.config_errors(c)
  assert "local.lr=True is invalid; allowed: a number > 0" in errors
  assert "partition.num_clients=True is invalid; allowed: an integer >= 1" in errors


def test_vocabularies_are_those_of_the_code_that_implements_them():
  from fedpsa_jax import models, sensitivity
  from fedpsa_jax.data import calibration, partition, sources
  from fedpsa_jax.sim import executor

  assert tuple(models.MODELS) == choices.MODELS and models.INITS == choices.INITS
  assert sensitivity.FISHER_METHODS == choices.FISHER_METHODS and partition.PARTITIONERS == choices.PARTITIONERS
  assert sources.DATASETS == choices.DATASETS and sources.TEST_SPLITS == choices.TEST_SPLITS
  assert executor.EXECUTIONS == choices.EXECUTIONS and calibration.CALIBRATION_KINDS == choices.CALIBRATION_KINDS
  # The registries hold the built-in names (and, before any test registers one, only those).
  assert ("auto",) + executor.registered_backends() == choices.EXECUTIONS == choices.allowed("runtime.execution")
  assert tuple(sources.registered_datasets()) == choices.DATASETS and choices.allowed("model.name") == choices.MODELS
  assert {name for name, loader in sources.registered_datasets().items() if loader} == set(choices.EMBEDDED_DATASETS)
  # These two are defined once, in choices.py, not copied.
  assert executor.EXECUTIONS is choices.EXECUTIONS and calibration.CALIBRATION_KINDS is choices.CALIBRATION_KINDS


def test_strategy_section_rows_and_the_buffer_bound():
  from fedpsa_jax.strategies.common import buffer_size, buffer_size_errors, section_errors

  c = {"partition": {"num_clients": 4}, "m": {"buffer_size": 5, "lr": True, "on": 1}}
  assert section_errors(c, "m", (("buffer_size", buffer_size(c)), ("lr", number(gt=0)), ("on", boolean))) == [
      "m.buffer_size=5 is invalid; allowed: an integer in [1, 4] (at most partition.num_clients)",
      "m.lr=True is invalid; allowed: a number > 0", "m.on=1 is invalid; allowed: True, False"]
  assert buffer_size_errors({**c, "m": {"buffer_size": 4}}, "m") == []
  # A bad N is the run config's own error; K is then only checked to be >= 1 (no comparison with a bool).
  bad_n = {"partition": {"num_clients": True}, "m": {"buffer_size": 9}}
  assert buffer_size_errors(bad_n, "m") == []
  assert buffer_size_errors({**bad_n, "m": {"buffer_size": 0}}, "m") == [
      "m.buffer_size=0 is invalid; allowed: an integer >= 1"]


# --- set_fields ------------------------------------------------------------------------------------------


def test_set_fields_sets_dotted_fields_on_a_locked_config():
  c = config_lib.base_config()
  c.lock()
  config_lib.set_fields(c, {"sim.virtual_days": 1, "method": "fedbuff", "sim.latency.high": 700,
                            "partition.group_proportions": [0.5, 0.5]})
  assert c.sim.virtual_days == 1.0 and isinstance(c.sim.virtual_days, float)  # int -> float
  assert (c.method, c.sim.latency.high, c.partition.group_proportions) == ("fedbuff", 700, (0.5, 0.5))
  assert c.is_locked


@pytest.mark.parametrize("path,hint", [("sim.virtul_days", "did you mean 'sim.virtual_days'?"),
                                        ("fedpsa.gama", "did you mean 'fedpsa.gamma'?"),
                                        ("seed.x", "did you mean 'seed'?"), ("nothing_like_it", "allowed: a field of")])
def test_set_fields_names_an_unknown_field(path, hint):
  c = config_lib.base_config()
  with pytest.raises(config_lib.ConfigError, match=f"config field '{path}' does not exist") as err:
    config_lib.set_fields(c, {path: 1.0})
  assert hint in str(err.value)
  assert "virtul_days" not in c.sim and "gama" not in c.fedpsa  # nothing added


def test_set_fields_rejects_a_wrong_type_unless_asked_not_to():
  c = config_lib.base_config()
  with pytest.raises(config_lib.ConfigError, match=r"eval.every_round=1 is invalid; allowed: a value of type bool"):
    config_lib.set_fields(c, {"eval.every_round": 1})
  with pytest.raises(config_lib.ConfigError, match=r"local.lr=True is invalid; allowed: a value of type float"):
    config_lib.set_fields(c, {"local.lr": True})  # (ConfigDict alone would store 1.0)
  with pytest.raises(config_lib.ConfigError, match=r"seed=1.5 is invalid; allowed: a value of type int"):
    config_lib.set_fields(c, {"seed": 1.5})
  config_lib.set_fields(c, {"eval.every_round": 1}, typed=False)
  assert any(e.startswith("eval.every_round=1 ") for e in config_lib.config_errors(c))


# --- the :arg grammar ------------------------------------------------------------------------------------


def test_parse_arg_options_and_overrides_in_any_order():
  spec = {"smoke": False, "seeds": (1, integer(ge=1))}
  for arg in ("smoke,seeds=3,alpha=0.5,local.lr=0.1", "local.lr=0.1,seeds=3,alpha=0.5,smoke",
              " alpha=0.5 , smoke,local.lr=0.1,seeds=3"):
    options, overrides = config_lib.parse_arg(arg, **spec)
    assert (options.smoke, options.seeds) == (True, 3)
    assert overrides == {"partition.alpha": 0.5, "local.lr": 0.1}  # the alias resolved
  options, overrides = config_lib.parse_arg(None, **spec)
  assert (options.smoke, options.seeds, overrides) == (False, 1, {})
  _, overrides = config_lib.parse_arg("partition.group_proportions=(0.5,0.5),method=fedbuff,smoke=False", smoke=False)
  assert overrides == {"partition.group_proportions": (0.5, 0.5), "method": "fedbuff"}


@pytest.mark.parametrize("arg,match", [
    ("smoek", r"'smoek' is invalid \(did you mean 'smoke'\?\); allowed: smoke, seeds=<an integer >= 1>, field=value"),
    ("seeds=0", r"'seeds=0' is invalid; allowed: seeds=<an integer >= 1>"),
    ("seeds=two", r"'seeds=two' is invalid"),
    ("smoke=maybe", r"'smoke=maybe' is invalid; allowed: smoke"),
])
def test_parse_arg_rejects_an_unknown_item_naming_the_allowed_ones(arg, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.parse_arg(arg, smoke=False, seeds=(1, integer(ge=1)))


@pytest.mark.parametrize("spec", RUN_CONFIGS)
def test_every_run_config_takes_field_overrides_and_rejects_unknown_items(spec):
  c = _load(f"{spec}:local.epochs=3,seed=4")
  assert (c.local.epochs, c.seed) == (3, 4) and config_lib.config_errors(c) == []
  with pytest.raises(config_lib.ConfigError, match="config field 'local.epoch' does not exist; did you mean"):
    _load(f"{spec}:local.epoch=3")
  with pytest.raises(config_lib.ConfigError, match="'bogus' is invalid.*allowed: .*field=value"):
    _load(f"{spec}:bogus")


@pytest.mark.parametrize("spec", SWEEP_CONFIGS)
def test_every_sweep_config_takes_the_same_grammar(spec):
  members = sweep.expand(_load(f"{spec}:local.epochs=2,seeds=2,smoke"))
  assert {m.config.local.epochs for m in members} == {2} and {m.config.seed for m in members} == {0, 1}
  assert all(m.config.data.name == "mnist_5k" for m in members)  # smoke, wherever it stands
  with pytest.raises(config_lib.ConfigError, match="'bogus' is invalid.*allowed: smoke, seeds="):
    _load(f"{spec}:smoke,bogus")


@pytest.mark.parametrize("spec", ["configs/casa.py", "configs/aifed.py"])
def test_smoke_may_stand_anywhere(spec):
  a, b = _load(f"{spec}:smoke,local.lr=0.2"), _load(f"{spec}:local.lr=0.2,smoke")
  assert a.to_dict() == b.to_dict() and a.data.name == "mnist_5k" and a.local.lr == 0.2


@pytest.mark.parametrize("spec", RUN_CONFIGS)
def test_run_configs_need_only_the_simulator(spec, monkeypatch):
  """A run config loads where the analysis cannot be imported: a run's inputs come from the simulator alone."""
  for name in [m for m in sys.modules if m == "fedpsa_lab" or m.startswith("fedpsa_lab.")] + ["fedpsa_lab"]:
    monkeypatch.setitem(sys.modules, name, None)  # (None: `import` raises ImportError)
  assert _load(spec).method


def test_one_dataset_to_model_table():
  for dataset, model in paper.PAPER_MODELS.items():
    assert _load(f"configs/paper/experiment.py:dataset={dataset}").model.name == model
  assert _load("configs/casa.py:dataset=cifar10").model.name == paper.PAPER_MODELS["cifar10"]
  assert _load("configs/casa.py:dataset=cifar10,model=linear").model.name == "linear"  # asked for: kept
  assert set(paper.PAPER_MODELS) == set(choices.DATASETS) and paper.PAPER_MODELS is choices.PAPER_MODELS
  for path in RUN_CONFIGS + SWEEP_CONFIGS:  # defined once: no config file has its own copy
    assert "PAPER_MODELS = " not in open(os.path.join(ROOT, path)).read(), path

