"""The notebook API (fedpsa_jax.api): configs in Python, run/load_run/compare, step-wise exploration, and
a strategy registered from outside the package running through the unchanged runner."""

from __future__ import annotations

import json
import math
import os

import matplotlib

matplotlib.use("Agg")  # no display in tests; set before pyplot is imported anywhere

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

import fedpsa_jax as fj
from fedpsa_jax import api, io
from fedpsa_jax.strategies import base as strategies_base
from fedpsa_jax.strategies.fedbuff import BufferState, FedBuff
from fedpsa_jax.tree_util import apply_weighted

TIMING = ("wall_seconds", "train_seconds", "client_updates_per_second")


def small(method: str = "fedpsa", days: float = 0.02, **fields):
  """A run of a few seconds: embedded MNIST, linear model, 20 clients (as tests/sim/test_runner.py)."""
  return fj.config_from(None, {"method": method, "data.name": "mnist_5k", "model.name": "linear",
                               "partition.num_clients": 20, "partition.alpha": 1.0, "sim.concurrency": 0.5,
                               "local.epochs": 1, "local.lr": 0.05, "sim.virtual_days": days,
                               "eval.every_days": 0.004}, **fields)


def without_timing(frame):
  return frame.drop(columns=[c for c in TIMING if c in frame.columns])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """FedPSA (with events.jsonl) and FedBuff on the same small config, each in its own workdir."""
  root = tmp_path_factory.mktemp("runs")
  fedpsa = fj.run(small("fedpsa", output__events=True), str(root / "fedpsa"), progress=False)
  fedbuff = fj.run(small("fedbuff"), str(root / "fedbuff"), progress=False)
  return fedpsa, fedbuff


def test_every_public_name_is_exported_and_documented():
  for name in fj.__all__:
    obj = getattr(fj, name)
    assert obj.__doc__ and obj.__doc__.strip(), name
    assert name in dir(fj)
  for cls in (fj.RunResult, fj.Explorer):
    for name, member in vars(cls).items():
      if not name.startswith("_") and (callable(member) or isinstance(member, property)):
        assert member.__doc__ and member.__doc__.strip(), f"{cls.__name__}.{name}"
  with pytest.raises(AttributeError):
    fj.no_such_name  # noqa: B018


def test_config_from_defaults_file_dict_keywords_and_copies(tmp_path, monkeypatch):
  defaults = fj.config_from()
  assert defaults.to_dict() == api.config_lib.base_config().to_dict()

  monkeypatch.chdir(tmp_path)  # a relative config path falls back to the repository root
  c = fj.config_from("configs/default.py:method=fedbuff,alpha=0.5", {"sim.virtual_days": 1, "local.lr": 0.1},
                     model="linear", local__epochs=2, num_clients=10)
  assert c.method == "fedbuff" and c.partition.alpha == 0.5  # from the file's arg
  assert c.data.name == "mnist_5k" and c.eval.every_days == 0.01  # from the file itself
  assert c.sim.virtual_days == 1.0 and isinstance(c.sim.virtual_days, float)  # int coerced for a float field
  assert c.local.lr == 0.1 and c.model.name == "linear" and c.local.epochs == 2 and c.partition.num_clients == 10
  assert fj.config_from(None, "method=fedasync,alpha=0.3").partition.alpha == 0.3  # string overrides

  variant = fj.config_from(c, method="fedavg", fedbuff__buffer_size=3)
  assert variant.method == "fedavg" and variant.fedbuff.buffer_size == 3
  assert c.method == "fedbuff" and c.fedbuff.buffer_size == 5  # the source config is copied, not changed

  with pytest.raises(ValueError, match="sim.no_such_field"):
    fj.config_from(None, sim__no_such_field=1)
  with pytest.raises(FileNotFoundError):
    fj.config_from("configs/missing.py")


@pytest.mark.slow
def test_run_history_is_metrics_jsonl_and_summary_agrees(runs):
  fedpsa, _ = runs
  records = io.read_jsonl(os.path.join(fedpsa.workdir, "metrics.jsonl"))
  assert len(fedpsa.history) == len(records) >= 5
  for (_, row), record in zip(fedpsa.history.iterrows(), records):
    for key, value in record.items():
      assert row[key] == value, key  # the DataFrame holds exactly what the file holds
  with open(os.path.join(fedpsa.workdir, "summary.json")) as f:
    assert fedpsa.summary == json.load(f)
  assert fedpsa.summary["status"] == "completed"
  assert fedpsa.summary["final_test_accuracy"] == fedpsa.history.test_accuracy.iloc[-1] > 0.5
  assert fedpsa.summary["rounds"] == fedpsa.history["round"].iloc[-1]
  assert fedpsa.label == "fedpsa" and fedpsa.config.method == "fedpsa"
  assert "temperature" in fedpsa.history and "kappa" in fedpsa.history
  updates = fedpsa.events[fedpsa.events["type"] == "update"]
  assert len(updates) == fedpsa.summary["client_updates"] and updates.kappa.between(-1.0001, 1.0001).all()


@pytest.mark.slow
def test_run_copies_the_config_validates_it_and_can_stay_in_memory(tmp_path):
  c = small("fedbuff", days=0.008)
  result = fj.run(c, progress=False, label="buffered")
  assert c.runtime.progress is True  # the caller's config was not changed by progress=False
  assert result.workdir is None and result.label == "buffered" and result.events.empty
  assert result.summary["final_test_accuracy"] == result.history.test_accuracy.iloc[-1]
  with pytest.raises(ValueError, match="partition.alpha"):
    fj.run(fj.config_from(c, alpha=-1.0), progress=False)


@pytest.mark.parametrize("wrong", ["configs/default.py", {"method": "fedbuff"}])
def test_run_and_simulate_of_something_else_than_a_config_name_config_from(wrong, tmp_path):
  for entry in (fj.run, fj.simulate):
    with pytest.raises(TypeError, match=rf"^{entry.__name__}\(config=...\) takes a ConfigDict, not "
                       rf"{type(wrong).__name__} .*allowed: a config built with config_from, e\.g\. "
                       rf"{entry.__name__}\(config_from\('configs/default.py'\)\)$"):
      entry(wrong, str(tmp_path / "run"), progress=False)
  assert not os.path.exists(tmp_path / "run")


def test_run_and_simulate_of_a_sweep_config_say_so_in_one_line(tmp_path):
  sweep_config = fj.config_from("configs/paper/table1.py:smoke")
  for entry in (fj.run, fj.simulate):
    with pytest.raises(api.config_lib.ConfigError) as err:
      entry(sweep_config, str(tmp_path / "run"), progress=False)
    assert str(err.value).startswith(f"{entry.__name__}(config=...) got the sweep config 'table1-smoke' "
                                     "(name, base, axes, seeds), not one run's; allowed: ")
    assert "\n" not in str(err.value)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("name, text, message", [
    ("config.json", '{"method": "fedbuff"}', "not a .py file"),
    ("config.yaml", "method: fedbuff\n", "not a .py file"),
    ("no_function.py", "x = 1\n", "no get_config(arg) function"),
    ("not_a_dict.py", "def get_config(arg=None):\n  return 3\n", "get_config() returned int"),
])
def test_config_from_a_file_that_is_no_config_file_says_so_in_one_line(tmp_path, name, text, message):
  path = tmp_path / name
  path.write_text(text)
  with pytest.raises(api.config_lib.ConfigError) as err:
    fj.config_from(str(path))
  assert str(err.value).startswith(f"config file {str(path)!r}: {message}; ") and "\n" not in str(err.value)
  assert str(err.value).endswith("allowed: a Python config file (.py) that defines get_config(arg) returning a "
                                 "ConfigDict")


def test_an_error_a_config_file_raises_comes_through_as_raised(tmp_path):
  """The loader is ml_collections' (launch.py's --config), which rewraps a file's ValueError with its traceback
  as the message; the API gives back the file's own error."""
  path = tmp_path / "raises.py"
  path.write_text("def get_config(arg=None):\n  raise ValueError(f'arg={arg!r} is bad')\n")
  with pytest.raises(ValueError, match=r"^arg='x' is bad$"):
    fj.config_from(f"{path}:x")


def test_load_run_round_trips(runs, tmp_path):
  fedpsa, _ = runs
  loaded = fj.load_run(fedpsa.workdir)
  assert loaded.history.equals(fedpsa.history)
  assert loaded.summary == fedpsa.summary
  assert loaded.config.method == "fedpsa" and loaded.config.sim.virtual_days == fedpsa.config.sim.virtual_days
  assert loaded.label == "fedpsa" and fj.load_run(fedpsa.workdir, label="x").label == "x"
  assert loaded.events.equals(fedpsa.events)
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
    fj.load_run(str(tmp_path))


def test_load_run_restores_non_finite_values(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write(json.dumps({"time": 0, "day": 0.0, "test_accuracy": 0.1, "test_loss": "nan", "kappa": ["inf", 0.5]}) + "\n")
  loaded = fj.load_run(str(tmp_path))
  assert math.isnan(loaded.history.test_loss[0]) and loaded.history.kappa[0] == [math.inf, 0.5]
  assert loaded.summary == {} and loaded.config is None and loaded.label == "run"


def test_compare_draws_one_labelled_line_per_run(runs):
  fedpsa, fedbuff = runs
  ax = fj.compare([fedpsa, fedbuff])
  lines = ax.get_lines()
  assert [line.get_label() for line in lines] == ["fedpsa", "fedbuff"]
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fedpsa", "fedbuff"]
  np.testing.assert_array_equal(lines[1].get_xdata(), fedbuff.history.day)
  np.testing.assert_array_equal(lines[1].get_ydata(), fedbuff.history.test_accuracy)
  assert ax.get_xlabel() == "virtual day" and ax.get_ylabel() == "test accuracy"

  _, own = plt.subplots()
  ax = fj.compare({"a": fedpsa.workdir, "b": fedbuff}, y="test_loss", ax=own, title="loss")  # dirs load too
  assert ax is own and [line.get_label() for line in ax.get_lines()] == ["a", "b"]
  np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), fedpsa.history.test_loss)
  assert ax.get_title() == "loss"
  with pytest.raises(ValueError, match="no column"):
    fj.compare([fedpsa], y="no_such_metric")
  with pytest.raises(ValueError, match="labels"):
    fj.compare([fedpsa, fedbuff], labels=["only one"])
  plt.close("all")


def test_result_plot_draws_its_learning_curve(runs):
  fedpsa, _ = runs
  ax = fedpsa.plot(y="round")
  (line,) = ax.get_lines()
  assert line.get_label() == "fedpsa"
  np.testing.assert_array_equal(line.get_ydata(), fedpsa.history["round"])
  plt.close("all")


@pytest.mark.slow
def test_simulate_steps_exposes_state_and_finishes_like_run(runs):
  fedpsa, _ = runs
  ex = fj.simulate(small("fedpsa", output__events=True), progress=False)
  assert ex.day == 0 and ex.round == 0 and ex.history.empty
  ex.run_until(0.006)
  assert ex.day == pytest.approx(0.006, abs=1 / 86400) and ex.history.day.max() <= 0.006
  assert ex.round >= ex.history["round"].iloc[-1] and ex.round > 0  # rounds since the last evaluation count too
  diag = ex.diagnostics()
  assert diag["temperature"] == pytest.approx(float(ex.state.temperature))
  assert len(diag["kappa"]) == len(diag["weights"]) and sum(diag["weights"]) == pytest.approx(1.0, abs=1e-5)
  # The global parameters: the strategy's evaluation parameters, with the model's structure.
  assert jax.tree.structure(ex.params) == jax.tree.structure(ex.state.params)
  assert ex.evaluate()["test_accuracy"] > 0.2
  assert "Explorer('fedpsa'" in repr(ex.run_until(0.012))
  assert ex.day == pytest.approx(0.012, abs=1 / 86400) and ex.history.day.max() <= 0.012
  ex.run_until(0.001)  # a day already passed: the clock never goes back
  assert ex.day == pytest.approx(0.012, abs=1 / 86400)
  with pytest.raises(ValueError, match=r"run_until\(day=nan\) is invalid; allowed: a number of virtual days \(capped "
                     r"at the budget, 0\.02; math\.inf: to its end\)"):
    ex.run_until(math.nan)
  ex.run_until(math.inf)  # capped at the budget, as the docstring says
  assert ex.day == 0.02  # (the evaluation at the budget itself is finish()'s)
  result = ex.finish()
  assert ex.finish() is result and result.summary["status"] == "completed"
  # Stepping changes nothing: the same numbers as one uninterrupted run of the same config.
  assert without_timing(result.history).equals(without_timing(fedpsa.history))


class FedBuffConstant(FedBuff):
  """FedBuff without a staleness discount: every buffered update weighs η / |buffer|."""

  @classmethod
  def default_config(cls):
    c = super().default_config()
    c.scale = 1.0  # an extra hyperparameter, to check that the section reaches the strategy
    return c

  @classmethod
  def validate_config(cls, config):
    return []

  def receive(self, state, arrivals):
    deltas = state.deltas + tuple(a.delta for a in arrivals)
    staleness = state.staleness + tuple(a.staleness for a in arrivals)
    if len(deltas) < self.hparams.buffer_size:
      return state.replace(deltas=deltas, staleness=staleness), False
    weights = jnp.full((len(deltas),), self.hparams.scale * self.hparams.server_lr / len(deltas))
    return BufferState(params=apply_weighted(state.params, deltas, weights), last_weights=weights), True


@pytest.mark.slow
def test_strategy_registered_outside_the_package_runs_through_run(runs, monkeypatch):
  _, fedbuff = runs
  # A private copy of the registry: the test's strategy disappears with the test.
  monkeypatch.setattr(strategies_base, "_REGISTRY", dict(strategies_base._REGISTRY))
  config = small("fedbuff")  # built before the strategy exists: run() adds the new section
  fj.register("test_fedbuff_constant")(FedBuffConstant)
  assert "test_fedbuff_constant" not in config
  result = fj.run(fj.config_from(config, method="test_fedbuff_constant"), progress=False)
  assert result.summary["status"] == "completed" and result.summary["method"] == "test_fedbuff_constant"
  assert result.history.day.tolist() == fedbuff.history.day.tolist()
  assert result.history.client_updates.iloc[-1] > 20
  # Constant weights: each flush's weights are equal, unlike FedBuff's staleness-discounted ones.
  flushed = result.history.weights.dropna()
  assert all(len(set(w)) == 1 for w in flushed)
  assert any(len(set(w)) > 1 for w in fedbuff.history.weights.dropna())
  assert result.history.test_accuracy.tolist() != fedbuff.history.test_accuracy.tolist()
  # Its own section was added with the defaults and is read by the strategy.
  frozen = fj.run(fj.config_from(config, method="test_fedbuff_constant", test_fedbuff_constant__scale=0.0),
                  progress=False)
  assert frozen.history.test_accuracy.nunique() == 1  # scale 0: the model never moves
