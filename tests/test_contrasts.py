"""The declared contrasts of a results sweep (contrasts.py) on a fake factorial sweep: the tail endpoint by
hand, every contrast against a loop over seeds and scipy, Holm per family, the verdicts and the files written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.stats

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_lab import contrasts, paper, report, report_stats

ARMS = ("fedbuff", "fedbuff_unit", "uniform_unit", "fedpsa")
CONTRASTS = [["psa − buff", {"fedpsa": 1.0, "fedbuff": -1.0}],
             ["step", {"fedbuff_unit": 0.5, "uniform_unit": 0.0, "fedpsa": 0.5, "fedbuff": -1.0}],
             ["κ − uniform", {"fedpsa": 1.0, "uniform_unit": -1.0}],
             ["discount", {"fedbuff": 1.0, "fedbuff_unit": -1.0}]]
HORIZON = 0.25


def _tail_curve(final: float) -> list[dict]:
  # Evaluations every 0.005 day up to 0.25 (the grid's float sums), accuracy rising to `final`; the last 10% holds
  # the six evaluations at 0.225 ... 0.25, two of them deliberately off the trend.
  days = np.cumsum([0.0] + [0.005] * 50)
  acc = final * days / HORIZON
  acc[-1] += 0.02
  acc[-3] -= 0.01
  return [{"day": float(d), "test_accuracy": float(a)} for d, a in zip(days, acc)]


def _factorial(tmp_path, effect, seeds=range(5), **analysis):
  base = config_lib.base_config()
  base.sim.virtual_days = HORIZON
  arms = ("method", [(a, {"method": "fedbuff" if a != "fedpsa" else "fedpsa"}) for a in ARMS])
  config = paper.sweep_config("fact", "Fake factorial", base, [arms, paper.alpha_axis((0.1, 1.0))], list(seeds),
                              {"rows": ["method"], "cols": ["alpha"]})
  config.analysis = {"unit": "seed", "axis": "method", "blocks": ["alpha"], "primary": "tail_test_accuracy",
                     "tail_fraction": 0.1, "secondary": ["final_test_accuracy"], "scale": 100.0,
                     "contrasts": CONTRASTS, **analysis}
  members = sweep.expand(config)
  workdir = str(tmp_path / "fact")
  sweep.write_sweep_json(config, members, workdir)
  finals = {}
  for m in members:
    run_dir = sweep.member_dir(workdir, m)
    os.makedirs(run_dir)
    key = (m.labels["method"], m.labels["alpha"], m.labels["seed"])
    finals[key] = effect(*key)
    io.write_json_atomic(os.path.join(run_dir, "summary.json"), {"status": "completed",
                                                                "final_test_accuracy": finals[key]})
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in _tail_curve(finals[key]))
  return workdir, finals


def test_tail_accuracy_averages_the_evaluations_of_the_last_tenth_by_hand():
  records = _tail_curve(0.9)
  expected = np.mean([r["test_accuracy"] for r in records[-6:]])  # days 0.225, 0.23, ..., 0.25
  assert contrasts.tail_accuracy(records, HORIZON, 0.1) == pytest.approx(expected, rel=1e-12)
  assert np.isnan(contrasts.tail_accuracy(records[:40], HORIZON, 0.1))  # stopped before the window


def test_every_contrast_is_the_seed_level_t_test_and_holm_is_per_family(tmp_path):
  rng = np.random.default_rng(0)
  seed_offset = rng.normal(0, 0.05, size=5)  # shared by every arm and α of a seed
  shift = {"fedbuff": 0.0, "fedbuff_unit": 0.01, "uniform_unit": 0.012, "fedpsa": 0.02}
  noise = {(a, al, s): rng.normal(0, 0.004) for a in ARMS for al in (0.1, 1.0) for s in range(5)}
  workdir, finals = _factorial(tmp_path, lambda a, al, s: 0.8 + seed_offset[s] + shift[a] + noise[a, al, s])
  sweep_json, frame = report.load_members(workdir)
  table = contrasts.contrast_frame(frame, sweep_json)
  assert set(table["family"]) == {"all blocks", "per block"}
  tail = {k: 100 * contrasts.tail_accuracy(_tail_curve(v), HORIZON, 0.1) for k, v in finals.items()}
  for endpoint, values in (("tail_test_accuracy", tail), ("final_test_accuracy", {k: 100 * v for k, v in finals.items()})):
    rows = table[(table["endpoint"] == endpoint) & (table["family"] == "all blocks")]
    for (name, weights), (_, r) in zip(CONTRASTS, rows.iterrows()):
      per_seed = [sum(w * np.mean([values[a, al, s] for al in (0.1, 1.0)]) for a, w in weights.items())
                  for s in range(5)]
      assert r.difference == pytest.approx(np.mean(per_seed), rel=1e-9) and r.seeds == 5
      assert r.p_value == pytest.approx(scipy.stats.ttest_1samp(per_seed, 0).pvalue, rel=1e-9)
    np.testing.assert_allclose(rows["p_holm"], report_stats.holm(rows["p_value"]))
    per_block = table[(table["endpoint"] == endpoint) & (table["family"] == "per block")]
    assert len(per_block) == len(CONTRASTS) * 2
    np.testing.assert_allclose(per_block["p_holm"], report_stats.holm(per_block["p_value"]))
    # The per-block row of psa − buff at α = 0.1 is the paired t-test over the seeds.
    r = per_block[(per_block["contrast"] == "psa − buff") & (per_block["block"] == "0.1")].iloc[0]
    a, b = [values["fedpsa", 0.1, s] for s in range(5)], [values["fedbuff", 0.1, s] for s in range(5)]
    assert r.p_value == pytest.approx(scipy.stats.ttest_rel(a, b).pvalue, rel=1e-9)
  # Verdicts read Holm's p: +2 points over noise of 0.4 is "higher"; every verdict is Holm's.
  assert (table["verdict"] == np.where(table["p_holm"] < 0.05, np.where(table["difference"] > 0, "higher", "lower"),
                                       "within the noise")).all()
  assert table.query("contrast == 'psa − buff' and family == 'all blocks'")["verdict"].tolist() == ["higher"] * 2


def test_a_seed_missing_one_member_leaves_every_contrast_that_weighs_it(tmp_path):
  workdir, _ = _factorial(tmp_path, lambda a, al, s: 0.5 + 0.01 * s + (0.02 if a == "fedpsa" else 0.0))
  os.remove(os.path.join(sweep.member_dir(workdir, "method=fedpsa,alpha=1.0,seed=4"), "summary.json"))
  sweep_json, frame = report.load_members(workdir)
  table = contrasts.contrast_frame(frame, sweep_json).query("family == 'all blocks'")
  assert table.set_index(["endpoint", "contrast"])["seeds"].to_dict() == {
      (e, c): 5 if c == "discount" else 4 for e in ("tail_test_accuracy", "final_test_accuracy")
      for c, _ in CONTRASTS}


def test_the_report_writes_contrasts_md_with_the_declared_plan(tmp_path):
  workdir, _ = _factorial(tmp_path, lambda a, al, s: 0.5 + 0.01 * s + (0.02 if a == "fedpsa" else 0.0))
  written = report.build(workdir)
  md = os.path.join(workdir, "report", "contrasts.md")
  assert md in written and os.path.join(workdir, "report", "contrasts.csv") in written
  text = open(md).read()
  assert "Unit: the seed" in text and "(primary endpoint)" in text and "mean accuracy over the last 10% of the run" in text
  assert "| psa − buff | +2.00 ± 0.00 | 5 |" in text


def test_a_sweep_without_a_complete_seed_says_so(tmp_path):
  workdir, _ = _factorial(tmp_path, lambda a, al, s: 0.5, seeds=range(2))
  for s in range(2):  # one member of each seed still running
    os.remove(os.path.join(sweep.member_dir(workdir, f"method=fedpsa,alpha=0.1,seed={s}"), "summary.json"))
  sweep_json, frame = report.load_members(workdir)
  table = contrasts.contrast_frame(frame, sweep_json)
  missing = (table["contrast"] != "discount") & (table["block"] != "1.0")  # α = 1.0 alone has both seeds
  assert (table[missing]["verdict"] == "no complete seed yet").all()
  assert (table[~missing]["seeds"] == 2).all()
  assert "| psa − buff | - | 0 | n/a | n/a | no complete seed yet |" in contrasts.contrasts_markdown(table, sweep_json, "# t\n")


def test_the_gain_over_the_last_40_percent_by_hand(tmp_path):
  # _tail_curve rises linearly to `final` at the horizon: the last 10% (days 0.225-0.25) average 0.95 final plus the
  # two off-trend points' (0.02 - 0.01) / 6; the 10% before the last 40% (days 0.125-0.15, six evaluations) 0.55 final.
  records = _tail_curve(0.9)
  assert contrasts.window_accuracy(records, HORIZON, 0.5, 0.6) == pytest.approx(0.55 * 0.9, rel=1e-12)
  assert contrasts.gain(records, HORIZON, 0.1, 0.4) == pytest.approx(0.4 * 0.9 + 0.01 / 6, rel=1e-12)
  finals = lambda a, al, s: 0.5 + 0.01 * s + (0.1 if a == "fedpsa" and al == 0.1 else 0.0)
  workdir, _ = _factorial(tmp_path, finals, gain_fraction=0.4)
  written = report.build(workdir)
  sweep_json, frame = report.load_members(workdir)
  table = contrasts.gain_frame(frame, sweep_json).set_index(["arm", "block"])
  assert len(table) == len(ARMS) * 3  # each α, and both at once
  for arm in ARMS:
    for block, alphas in (("0.1", (0.1,)), ("1.0", (1.0,)), ("all", (0.1, 1.0))):
      per_seed = [100 * np.mean([0.4 * finals(arm, al, s) + 0.01 / 6 for al in alphas]) for s in range(5)]
      r = table.loc[(arm, block)]
      assert r.gain == pytest.approx(np.mean(per_seed), rel=1e-9) and r.seeds == 5
      assert r.ci95_half_width == pytest.approx(scipy.stats.t.ppf(0.975, 4) * scipy.stats.sem(per_seed), rel=1e-9)
  md = os.path.join(workdir, "report", "gain.md")
  assert md in written and os.path.join(workdir, "report", "gain.csv") in written
  # 40 × (0.6 + 0.01 s) + 1/6 over s = 0..4: mean 24.97; SD 0.63, so ± 2.776 × 0.63 / √5 = 0.79
  assert "| fedpsa | 0.1 | +24.97 ± 0.79 | 5 |" in open(md).read()


def test_no_gain_table_unless_the_analysis_declares_its_fraction(tmp_path):
  workdir, _ = _factorial(tmp_path, lambda a, al, s: 0.5)
  assert not any(path.endswith(("gain.md", "gain.csv")) for path in report.build(workdir))
