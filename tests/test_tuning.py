"""The tuning sweep's selection (fedpsa_lab/tuning.py) and its config (configs/results/step_tuning.py).

The rule is checked against hand-made scores (a tie, an edge, a diverged step, a shape still running, the cap on
extensions), through the files a sweep writes (sweep.json, summary.json, metrics.jsonl) with the tail endpoint the
config declares; the config's FedBuff mean step against the committed shape_step records it was measured on.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_lab import report, tuning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "results", "step_tuning.py")


def _config_module():
  spec = importlib.util.spec_from_file_location("step_tuning_config", CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _records(tmp_path, tail: dict[str, list[float]], diverged=(), missing=(), extensions=None, seeds=2):
  """A records directory of the tuning config (`seeds` tuning seeds, `extensions` as EXTENSIONS) whose members
  have a metrics.jsonl giving, for arm a, the tail accuracies tail[a] in the order (α, seed) of the members: each
  member's last-10% evaluations are (v - 0.01, v + 0.01), mean v; a first evaluation at day 0 outside the tail."""
  module = _config_module()
  if extensions:
    module.EXTENSIONS.update(extensions)
  c = module.get_config(f"seeds={seeds}")
  members = sweep.expand(c)
  out = str(tmp_path / "records")
  sweep.write_sweep_json(c, members, out)
  count: dict[str, int] = {}
  for m in members:
    arm = m.labels["method"]
    if (arm, m.labels["alpha"], m.labels["seed"]) in missing:
      continue
    i = count[arm] = count.get(arm, -1) + 1
    v = tail[arm][i]
    run = sweep.member_dir(out, m.name)
    os.makedirs(run)
    status = "diverged" if arm in diverged else "completed"
    io.write_json_atomic(os.path.join(run, "summary.json"), {"status": status, "final_test_accuracy": v})
    days = c.base.sim.virtual_days
    lines = [{"day": 0.0, "test_accuracy": 0.1}, {"day": 0.95 * days, "test_accuracy": v - 0.01},
             {"day": days, "test_accuracy": v + 0.01}]
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
      f.write("".join(json.dumps(line) + "\n" for line in lines))
  return out


def _grid(values: dict[str, float], cells: int = 4) -> dict[str, list[float]]:
  """Each arm's cells all at its value, but the cells spread ±0.02 so that the mean is the value."""
  spread = np.linspace(-0.02, 0.02, cells)
  return {arm: list(v + spread) for arm, v in values.items()}


BASE = {"fedbuff_x1": 0.80, "fedbuff_x1p5": 0.84, "fedbuff_x2p25": 0.82,  # interior best: 1.5
        "uniform_x1": 0.85, "uniform_x1p5": 0.86, "uniform_x2p25": 0.87,  # upper edge: extend to 3.375
        "fedpsa_x1": 0.88, "fedpsa_x1p5": 0.87, "fedpsa_x2p25": 0.86}  # lower edge: extend to 2/3


def test_the_rule_selects_an_interior_best_and_extends_at_an_edge(tmp_path):
  sweep_dir = _records(tmp_path, _grid(BASE))
  saved, frame = report.load_members(sweep_dir)
  picked = tuning.choices(frame, saved)
  assert list(picked) == ["fedbuff", "uniform", "fedpsa"]
  assert (picked["fedbuff"].step, picked["fedbuff"].arm, picked["fedbuff"].extend) == (1.5, "fedbuff_x1p5", None)
  assert picked["uniform"].step is None and picked["uniform"].extend == pytest.approx(2.25 * 1.5)
  assert picked["fedpsa"].step is None and picked["fedpsa"].extend == pytest.approx(1 / 1.5)
  scores = tuning.scores(frame, saved).set_index("arm")
  # The score is the tail endpoint (mean of the last 10%'s evaluations) in %, averaged over the 4 cells.
  for arm, v in BASE.items():
    assert scores.loc[arm, "score"] == pytest.approx(100 * v, abs=1e-9)
    assert scores.loc[arm, "cells"] == scores.loc[arm, "cells_declared"] == 4
  assert scores.loc["fedbuff_x1", "sd"] == pytest.approx(100 * np.std(np.linspace(-0.02, 0.02, 4), ddof=1))
  with pytest.raises(tuning.SelectionPending, match="uniform: extend to 3.375; fedpsa: extend to 0.666667"):
    tuning.selected_steps(sweep_dir)


def test_extensions_run_then_select_and_stop_at_the_cap(tmp_path):
  values = dict(BASE, uniform_x3p375=0.88, uniform_x5p0625=0.89,  # still rising at the cap: selected there
                fedpsa_x0p666667=0.875)  # the grid's 1 beats its lower neighbour: interior now
  ext = {"uniform": (3.375, 5.0625), "fedpsa": (1 / 1.5,)}
  sweep_dir = _records(tmp_path, _grid(values), extensions=ext)
  assert tuning.selected_steps(sweep_dir) == {"fedbuff": (1.5, False), "uniform": (5.0625, True),
                                              "fedpsa": (1.0, False)}
  written = report.build(sweep_dir)
  text = open(os.path.join(sweep_dir, "report", "tuning.md")).read()
  assert os.path.join(sweep_dir, "report", "tuning.md") in written
  assert "| uniform | selected 5.0625 (at the last allowed rung) |" in text
  assert "| fedbuff | 1.5 | fedbuff_x1p5 | **84.00** |" in text
  assert not os.path.exists(os.path.join(sweep_dir, "report", "contrasts.md"))  # tuning tests nothing


def test_a_tie_goes_to_the_smaller_step_and_a_diverged_step_is_never_selected(tmp_path):
  values = dict(BASE, fedbuff_x1=0.84, fedbuff_x1p5=0.84,  # exact tie of 1 and 1.5 -> 1 is the lower edge
                uniform_x2p25=0.99)  # the best score, but a member diverged
  sweep_dir = _records(tmp_path, _grid(values), diverged={"uniform_x2p25"})
  saved, frame = report.load_members(sweep_dir)
  picked = tuning.choices(frame, saved)
  assert picked["fedbuff"].extend == pytest.approx(1 / 1.5)  # the tie went to 1.0, the grid's lower edge
  assert (picked["uniform"].step, picked["uniform"].extend) == (1.5, None)  # 2.25 diverged: 1.5 is interior


def test_a_shape_with_a_member_still_running_is_not_selected(tmp_path):
  sweep_dir = _records(tmp_path, _grid(BASE), missing={("fedbuff_x1p5", 1.0, 101)})
  saved, frame = report.load_members(sweep_dir)
  picked = tuning.choices(frame, saved)
  assert not picked["fedbuff"].complete and picked["fedbuff"].status == "incomplete"
  assert picked["uniform"].complete


def test_the_config_declares_disjoint_seeds_and_the_grid_it_runs():
  module = _config_module()
  c = module.get_config()
  assert c.seeds == [100, 101, 102] and not set(c.seeds) & set(range(8)) and not set(c.seeds) & set(range(200, 208))
  members = sweep.expand(c)
  assert len(members) == 3 * 3 * 2 * 3
  by_arm = {m.labels["method"]: m.config for m in members}
  for label, shape, e in tuning.selection_arms({"analysis": c.analysis.to_dict()}):
    run = by_arm[label]
    eta = run.fedpsa.server_lr if shape == "fedpsa" else run.fedbuff.server_lr
    mean_sum = tuning.FEDBUFF_MEAN_STEP if shape == "fedbuff" else 1.0
    assert eta * mean_sum == pytest.approx(e, rel=1e-4), label  # effective step = η × mean Σw
    assert run.method == ("fedpsa" if shape == "fedpsa" else "fedbuff")
    if shape == "uniform":
      assert (run.fedbuff.weighting, run.fedbuff.step) == ("uniform", "unit")
    else:
      assert (run.fedbuff.weighting, run.fedbuff.step, run.fedpsa.step) == ("staleness", "staleness", "unit")


def test_fedbuffs_mean_step_is_measured_on_the_shape_step_records():
  runs = sorted(glob.glob(os.path.join(ROOT, "results", "shape_step", "runs", "method=fedbuff,*")))
  assert len(runs) == 16
  assert round(tuning.mean_flush_sum(runs), 4) == tuning.FEDBUFF_MEAN_STEP
  # By hand for one run, from the staleness of the updates each flush took (the update events before its round
  # event): each flush's Σw is (1/B) Σ (1 + τ_i)^(-1/2), FedBuff's step.
  taus, by_hand = [], []
  for event in io.read_events(runs[0]):
    if event["type"] == "update":
      taus.append(event["staleness"])
    else:
      by_hand.append(float(np.mean((1.0 + np.asarray(taus)) ** -0.5)))
      taus = []
  np.testing.assert_allclose(tuning.flush_sums(runs[0]), by_hand, rtol=1e-6)
  assert np.ptp(by_hand) > 0.1  # (the step varies from flush to flush)
  unit = sorted(glob.glob(os.path.join(ROOT, "results", "shape_step", "runs", "method=fedpsa,*")))
  assert tuning.mean_flush_sum(unit) == pytest.approx(1.0, rel=1e-6)  # Eq. 20's weights sum to 1


# --- the confirmation config, built from the selection (configs/results/tuned.py) -------------------------------

TUNED = os.path.join(ROOT, "configs", "results", "tuned.py")


def test_the_confirmation_reads_the_selected_steps(tmp_path):
  values = dict(BASE, uniform_x3p375=0.88, uniform_x5p0625=0.89, fedpsa_x0p666667=0.875)
  records = _records(tmp_path, _grid(values), extensions={"uniform": (3.375, 5.0625), "fedpsa": (1 / 1.5,)})
  c = config_lib.load_file(f"{TUNED}:tuning={records}")
  members = sweep.expand(c)
  assert len(members) == 4 * 2 * 12 and c.seeds == list(range(200, 212))
  runs = {m.labels["method"]: m.config for m in members}
  assert runs["fedbuff"].fedbuff.server_lr == 1.0 and runs["fedbuff"].method == "fedbuff"
  assert runs["fedbuff_tuned"].fedbuff.server_lr == round(1.5 / 0.6556, 4)  # mean effective step 1.5
  assert runs["uniform_tuned"].fedbuff.server_lr == 5.0625
  assert (runs["uniform_tuned"].fedbuff.weighting, runs["uniform_tuned"].fedbuff.step) == ("uniform", "unit")
  assert runs["fedpsa_tuned"].fedpsa.server_lr == 1.0 and runs["fedpsa_tuned"].method == "fedpsa"
  assert [name for name, _ in c.analysis.contrasts] == [
      "FedPSA − FedBuff (both tuned)", "κ − uniform (both tuned)", "uniform − FedBuff (both tuned)",
      "tuning: FedBuff tuned − FedBuff η = 1"]
  assert c.report.display["uniform_tuned"] == "Uniform, tuned (step 5.0625, at the grid edge)"
  horizon = config_lib.load_file(f"{TUNED}:horizon,tuning={records}")
  members = sweep.expand(horizon)
  assert len(members) == 3 * 5 and {m.labels["alpha"] for m in members} == {0.1}
  assert horizon.base.sim.virtual_days == 1.0 and len(horizon.analysis.contrasts) == 3
  assert horizon.name != c.name


def test_the_confirmation_is_refused_in_one_line_until_every_shape_is_selected(tmp_path):
  records = _records(tmp_path, _grid(BASE))
  with pytest.raises(config_lib.ConfigError) as err:
    config_lib.load_file(f"{TUNED}:tuning={records}")
  assert "\n" not in str(err.value) and "uniform: extend to 3.375; fedpsa: extend to 0.666667" in str(err.value)
  with pytest.raises(config_lib.ConfigError, match="no tuning records in"):
    config_lib.load_file(f"{TUNED}:tuning={tmp_path / 'nothing'}")


def test_the_confirmation_power_statement():
  # configs/results/tuned.py's docstring: seed-level SDs implied by shape_step's intervals (h √n / t), and the power
  # of the test actually read, at Holm's first threshold over four contrasts.
  import pandas as pd
  from scipy import stats
  from fedpsa_lab import report_stats
  table = pd.read_csv(os.path.join(ROOT, "results", "shape_step", "report", "contrasts.csv"))
  rows = table[(table.endpoint == "tail_test_accuracy") & (table.family == "all blocks")].set_index("contrast")
  sd = {k: rows.loc[k, "ci95_half_width"] * np.sqrt(8) / stats.t.ppf(0.975, 7) for k in rows.index}
  psa, kappa, step = (sd["FedPSA − FedBuff (all of it)"], sd["shape: κ − uniform"], sd["step: Σw = 1 − FedBuff's Σw"])
  assert (round(psa, 2), round(kappa, 2), round(step, 2)) == (0.82, 0.22, 0.66)
  level = 0.05 / 4
  assert round(100 * report_stats.power_paired_t(psa, 12, 1.0, level)) == 86
  assert round(100 * report_stats.power_paired_t(psa, 8, 1.0, level)) == 57
  assert round(100 * report_stats.power_paired_t(step, 12, 1.0, level)) == 97

  def smallest(sd_, n, lvl):  # the smallest effect (0.01 steps) with 80% power
    return next(e / 100 for e in range(1, 1000) if report_stats.power_paired_t(sd_, n, e / 100, lvl) >= 0.8)

  assert smallest(psa, 12, level) == 0.93 and smallest(kappa, 12, level) == 0.25
  assert (smallest(0.19, 5, 0.05 / 3), smallest(0.27, 5, 0.05 / 3)) == (0.44, 0.62)
