"""Partial correlations of per-update event fields (event_correlations.py) on a fake sweep with events: the
numbers against report_stats on the pooled updates, the groups, the bootstrap over runs, the per-run partial
correlations against the precision-matrix formula and scipy's t-test on Fisher's z, and the file written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.stats

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_lab import event_correlations, paper, report, report_stats

ENTRY = {"x": "kappa", "y": "alignment", "given": ["staleness", "log:delta_sq_norm"],
         "where": {"method": ["fedpsa"]}, "resamples": 200}


def _sweep_with_events(tmp_path, seeds=4):
  base = config_lib.base_config()
  config = paper.sweep_config("ev", "Events", base, [paper.method_axis(("fedbuff", "fedpsa"))], list(range(seeds)),
                              {"rows": ["method"], "partial_correlations": [ENTRY]})
  members = sweep.expand(config)
  workdir = str(tmp_path / "ev")
  sweep.write_sweep_json(config, members, workdir)
  rng = np.random.default_rng(0)
  truth = {}
  for m in members:
    run_dir = sweep.member_dir(workdir, m)
    os.makedirs(run_dir)
    io.write_json_atomic(os.path.join(run_dir, "summary.json"), {"status": "completed", "final_test_accuracy": 0.5})
    tau = rng.integers(0, 6, 60)
    norm = np.exp(rng.normal(-2, 0.5, 60))
    kappa = 0.3 - 0.05 * tau + 0.2 * np.log(norm) + rng.normal(0, 0.1, 60) + rng.normal(0, 0.3)  # a run offset
    align = 0.6 * kappa + 0.1 * tau + rng.normal(0, 0.1, 60)
    truth[m.name] = (kappa, align, tau, norm)
    with open(os.path.join(run_dir, "events.jsonl"), "w") as f:
      f.write(json.dumps({"type": "round", "round": 1}) + "\n")  # not an update: ignored
      for k, a, t, n in zip(kappa, align, tau, norm):
        event = {"type": "update", "kappa": float(k), "staleness": int(t), "delta_sq_norm": float(n)}
        if m.labels["method"] == "fedpsa":
          event["alignment"] = float(a)
        f.write(json.dumps(event) + "\n")
  return workdir, truth


def test_partial_correlation_of_the_pooled_updates_with_run_intercepts(tmp_path):
  workdir, truth = _sweep_with_events(tmp_path)
  _, frame = report.load_members(workdir)
  table = event_correlations.correlation_frame(frame, [ENTRY])
  assert table[["group", "runs", "updates", "given"]].values.tolist() == [
      ["method=fedpsa", 4, 240, "staleness + log:delta_sq_norm"]]
  runs = [truth[f"method=fedpsa,seed={s}"] for s in range(4)]
  k, a, t, n = (np.concatenate(v) for v in zip(*runs))
  groups = np.repeat(np.arange(4), 60)
  row = table.iloc[0]
  assert row.r == pytest.approx(np.corrcoef(k, a)[0, 1], rel=1e-9)
  assert row.partial_r == pytest.approx(report_stats.partial_correlation(k, a, np.column_stack([t, np.log(n)]), groups),
                                        rel=1e-9)
  # The true partial correlation: 0.6 · 0.1² / (0.1 · √(0.6² · 0.1² + 0.1²)) = 0.51 (κ's within-run noise is 0.1).
  assert row.partial_low <= row.partial_r <= row.partial_high and row.partial_low > 0.3 and row.partial_r == pytest.approx(0.51, abs=0.08)
  assert row.r_low <= row.r <= row.r_high
  # Per run: each run's partial correlation by the precision-matrix formula (x, y and the two covariates; the
  # run's intercept is the centring of the correlation matrix), averaged on Fisher's z with scipy's t-interval.
  per_run = []
  for kr, ar, tr, nr in runs:
    precision = np.linalg.inv(np.corrcoef([kr, ar, tr, np.log(nr)]))
    per_run.append(-precision[0, 1] / np.sqrt(precision[0, 0] * precision[1, 1]))
  z = np.arctanh(per_run)
  low, high = np.tanh(scipy.stats.t.interval(0.95, 3, loc=z.mean(), scale=scipy.stats.sem(z)))
  assert (row.run_partial_r, row.run_partial_low, row.run_partial_high) == (
      pytest.approx(np.tanh(z.mean()), rel=1e-9), pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
  assert row.run_partial_p == pytest.approx(scipy.stats.ttest_1samp(z, 0.0).pvalue, rel=1e-9)
  assert row.run_partial_p_holm == row.run_partial_p  # a family of one row
  assert row.run_partial_low < 0.51 < row.run_partial_high


def test_holm_runs_over_the_rows_of_the_table(tmp_path):
  workdir, _ = _sweep_with_events(tmp_path)
  _, frame = report.load_members(workdir)
  unrelated = {"x": "staleness", "y": "kappa", "given": ["log:delta_sq_norm"], "where": {"method": ["fedpsa"]},
               "resamples": 50}
  table = event_correlations.correlation_frame(frame, [ENTRY, unrelated])
  np.testing.assert_allclose(table["run_partial_p_holm"], report_stats.holm(table["run_partial_p"].to_numpy()),
                             rtol=1e-12)
  assert (table["run_partial_p_holm"] >= table["run_partial_p"]).all() and len(table) == 2


def test_the_report_writes_partial_correlations_and_skips_members_without_the_fields(tmp_path):
  workdir, _ = _sweep_with_events(tmp_path)
  written = report.build(workdir)
  path = os.path.join(workdir, "report", "partial_correlations.md")
  assert path in written
  text = open(path).read()
  assert "| kappa | alignment | staleness + log:delta_sq_norm | method=fedpsa | 4 | 240 |" in text
  assert text.splitlines()[-1].endswith("| positive |")  # κ's true partial correlation with alignment is 0.51
  assert "fedbuff" not in text.split("|---|")[1]
  first = open(path).read()
  report.build(workdir)
  assert open(path).read() == first  # the bootstrap is seeded: the report redraws byte for byte
