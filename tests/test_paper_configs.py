"""The paper's experiment configs (configs/paper/): each validates and expands to the members counted by
hand from the paper's tables and figures; their arguments are checked; experiment.py selects the baselines with
the defaults of docs/methods.md; table6.py expands to the paper's 24 members or, with `temps`, to those plus
w/o T and w/o T&S at Temp = 1 and Temp = δ, each member's Temp reaching the strategy.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep
from fedpsa_jax.strategies import fedpsa as fedpsa_lib
from fedpsa_lab import paper
from helpers import _readings_ctx, DELTA, GAMMA, K_SKETCH, PARAMS_KEY0, ROOT


# --- configs/paper/table6.py --------------------------------------------------------------------------

PAPER_VARIANTS = ["no_t", "no_s", "no_ts", "full"]
TEMPS_VARIANTS = ["no_t", "no_t-T1", "no_t-Tdelta", "no_s", "no_ts", "no_ts-T1", "no_ts-Tdelta", "full"]
# variant -> (no_temperature, no_sensitivity, the Temp of its softmax: None where the thermometer sets it)
INTENDED = {"no_t": (True, False, 5.5), "no_t-T1": (True, False, 1.0), "no_t-Tdelta": (True, False, 0.5),
            "no_s": (False, True, None), "no_ts": (True, True, 5.5), "no_ts-T1": (True, True, 1.0),
            "no_ts-Tdelta": (True, True, 0.5), "full": (False, False, None)}


def _table6(arg: str = ""):
  return config_lib.load_file(os.path.join(ROOT, "configs", "paper", "table6.py") + (f":{arg}" if arg else ""))


def _check_members(members, variants):
  cells = {}
  for m in members:
    key = (m.labels["alpha"], m.labels["concurrency"], m.labels["seed"])
    cells.setdefault(key, []).append(m)
    no_t, no_s, temp = INTENDED[m.labels["variant"]]
    f = m.config.fedpsa
    assert (m.config.method, f.no_temperature, f.no_sensitivity) == ("fedpsa", no_t, no_s), m.name
    assert (f.gamma, f.delta) == (GAMMA, DELTA)
    if temp is None:
      assert f.fixed_temperature == 0.0, m.name
    else:
      assert fedpsa_lib.fixed_temperature(f) == temp, m.name
  # Every (α, p, seed) cell holds exactly the intended variants, in the table's row order.
  assert {(a, p) for a, p, _ in cells} == {(a, p) for a in (1.0, 0.1) for p in (0.1, 0.2, 0.3)}
  for ms in cells.values():
    assert [m.labels["variant"] for m in ms] == variants
  return {m.name: m for m in members}


@pytest.mark.slow
@pytest.mark.parametrize("smoke", [False, True])
def test_table6_expands_to_the_paper_members_and_with_temps_to_the_readings(smoke):
  prefix = "smoke," if smoke else ""
  paper_members = _check_members(sweep.expand(_table6(prefix.rstrip(","))), PAPER_VARIANTS)
  assert len(paper_members) == 2 * 4 * 3
  temps = _table6(prefix + "temps")
  temps_members = _check_members(sweep.expand(temps), TEMPS_VARIANTS)
  assert len(temps_members) == 2 * 8 * 3
  # The paper's members keep their names and configs, so `temps` into a finished Table 6 reruns none of them.
  for name, m in paper_members.items():
    assert temps_members[name].config.to_dict() == m.config.to_dict()
  assert temps.report.rows == ["alpha", "variant"] and temps.report.display["no_t-Tdelta"] == "w/o T (Temp=δ=0.5)"
  assert len(sweep.expand(_table6(prefix + "temps,seeds=2"))) == 2 * 2 * 8 * 3


def test_table6_temperature_reaches_the_strategy():
  # Each w/o T reading's member config, built into the strategy, starts its softmax at the intended Temp.
  for m in sweep.expand(_table6("smoke,temps")):
    if m.labels["alpha"] != 0.1 or m.labels["concurrency"] != 0.2 or not m.config.fedpsa.no_temperature:
      continue
    m.config.fedpsa.sketch_dim = K_SKETCH
    m.config.fedpsa.calibration, m.config.fedpsa.calibration_size = "real", 8  # _readings_ctx's batch
    ctx = dataclasses.replace(_readings_ctx(), model_name=m.config.model.name, runtime=m.config.runtime)
    state = fedpsa_lib.FedPSA(m.config.fedpsa, ctx).init(PARAMS_KEY0)
    assert float(state.temperature) == pytest.approx(INTENDED[m.labels["variant"]][2], rel=1e-6), m.name


def test_table6_bad_argument_names_temps():
  with pytest.raises(config_lib.ConfigError,
                     match=r"'tmps' is invalid \(did you mean 'temps'\?\); allowed: smoke, seeds=.*, temps"):
    _table6("tmps")


# Members per paper config, counted by hand from the paper's tables and figures.
EXPECTED_MEMBERS = {
    "table1": 7 * 3 + 6 * 3,  # MNIST: 7 methods × 3 α; FMNIST (linear): no FedPAC
    "table2": 7 * 2 * 3,  # CIFAR-10/100 × 3 α, all 7 methods
    "table3": 7 * 2 * 3,  # the same runs as Table 2
    "table4": 3 * 3 * 2,  # 3 latency ranges × 3 methods × uniform/long-tail
    "table5": 2 * 4 * 2,  # α × calibration size × real/gaussian
    "table6": 2 * 4 * 3,  # α × (w/o T, w/o S, w/o T&S, full) × concurrency
    "fig3": 7 * 2 * 3,
    "fig4": 4 * 4 + 4 * 4,  # γ×δ grid + L_s×L_q grid
    "fig5": 7 * 4 - 1,  # 4 datasets, no FedPAC on FMNIST
    "fig6": 1,
}


EXPECTED_SMOKE = {**EXPECTED_MEMBERS, "fig4": 2 * 2 + 2 * 2}


def _load(name: str, arg: str = ""):
  return config_lib.load_file(os.path.join(ROOT, "configs", "paper", f"{name}.py") + (f":{arg}" if arg else ""))


@pytest.mark.parametrize("name", sorted(EXPECTED_MEMBERS))
def test_every_paper_config_validates_and_expands(name):
  for arg, expected in (("", EXPECTED_MEMBERS[name]), ("smoke", EXPECTED_SMOKE[name]),
                        ("smoke,seeds=2", 2 * EXPECTED_SMOKE[name])):
    members = sweep.expand(_load(name, arg))  # expand validates every member's full config
    assert len(members) == expected, (name, arg)
    assert len({m.name for m in members}) == expected
    for m in members:
      assert config_lib.config_errors(m.config) == []
      assert m.config.seed == m.labels["seed"]
      if arg.startswith("smoke"):
        assert m.config.data.name == "mnist_5k" and m.config.sim.virtual_days <= 0.05
      else:
        assert m.config.sim.virtual_days == 10.0 and m.config.partition.num_clients == 50
        if "dataset" in m.labels:
          assert m.config.data.name == m.labels["dataset"]
          assert m.config.model.name == paper.PAPER_MODELS[m.labels["dataset"]]
      assert not (m.config.method == "fedpac" and m.config.model.name == "linear")
  if name == "table1":  # the paper's Table 1 layout: FedPAC only on MNIST
    members = sweep.expand(_load(name))
    assert sum(m.labels["method"] == "fedpac" for m in members) == 3
    assert {m.config.sim.latency.high for m in members} == {500}


def test_a_smoke_table_names_the_data_its_members_ran_on():
  # Smoke variants run every dataset's column on the embedded mnist_5k: a column headed "FMNIST" would claim
  # results on data that never ran (paper.stand_in_names).
  assert _load("table1", "smoke").report.display["fashion_mnist"] == "mnist_5k (for FMNIST)"
  assert _load("fig5", "smoke").report.display["cifar10"] == "mnist_5k (for CIFAR-10)"
  assert _load("table1").report.display["fashion_mnist"] == "FMNIST"  # the full variant runs FMNIST itself


def test_paper_config_arguments_are_checked():
  with pytest.raises(config_lib.ConfigError, match="allowed: smoke, seeds="):
    _load("table1", "smoek")
  members = sweep.expand(_load("table6", "smoke"))
  by_variant = {m.labels["variant"]: m.config.fedpsa for m in members if m.labels["concurrency"] == 0.2}
  assert (by_variant["no_t"].no_temperature, by_variant["no_t"].no_sensitivity) == (True, False)
  assert (by_variant["no_ts"].no_temperature, by_variant["no_ts"].no_sensitivity) == (True, True)
  assert (by_variant["full"].no_temperature, by_variant["full"].no_sensitivity) == (False, False)
  assert {m.config.sim.concurrency for m in members} == {0.1, 0.2, 0.3}


def _paper_config(arg):
  spec = importlib.util.spec_from_file_location("paper_experiment", os.path.join(ROOT, "configs/paper/experiment.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize("method", ["ca2fl", "fedfa", "fedpac"])
def test_paper_configs_select_the_baselines(method):
  for dataset in ("mnist", "cifar10", "cifar100"):
    cfg = config_lib.validate(_paper_config(f"method={method},dataset={dataset}"))
    assert cfg.method == method
  # The defaults of docs/methods.md, 'Defaults'.
  defaults = {"ca2fl": {"buffer_size": 5, "server_lr": 1.0}, "fedfa": {"window_size": 5},
              "fedpac": {"buffer_size": 5, "lam": 1.0}}[method]
  assert {k: cfg[method][k] for k in defaults} == defaults
  fmnist = _paper_config(f"method={method},dataset=fashion_mnist")
  if method == "fedpac":  # Table 1 has no FedPAC entry for FMNIST: its model is linear
    with pytest.raises(ValueError, match="FedPAC needs a feature extractor"):
      config_lib.validate(fmnist)
  else:
    config_lib.validate(fmnist)
