"""The buffer-weights summary of a sweep (fedpsa_lab/figures/buffer_weights.py), against hand computations."""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest

from fedpsa_lab.figures import buffer_weights


def _run(root, name: str, method: str, records: list[dict], status: str = "completed") -> str:
  """A run directory holding config.json (its method), summary.json (`status`) and metrics.jsonl (`records`)."""
  run_dir = os.path.join(str(root), name)
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    json.dump({"method": method}, f)
  with open(os.path.join(run_dir, "summary.json"), "w") as f:
    json.dump({"status": status, "method": method}, f)
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"day": 0.01 * i, "test_accuracy": 0.5, **r}) + "\n" for i, r in enumerate(records))
  return run_dir


def test_weight_spread_is_the_step_and_the_shape_of_each_flush_by_hand(tmp_path):
  # FedBuff-like: B = 4, weights not summing to 1. Flush 1: [0.1, 0.1, 0.2, 0.2] (Σ 0.6; B·w/Σ: 2/3 .. 4/3);
  # flush 2: uniform 0.25 (Σ 1; shape 1 .. 1). An evaluation with no weights (before any flush) is skipped.
  plain = _run(tmp_path, "plain", "fedbuff", [{}, {"weights": [0.1, 0.1, 0.2, 0.2]}, {"weights": [0.25] * 4}])
  row = buffer_weights.weight_spread(plain)
  assert row["run"] == "plain" and row["method"] == "fedbuff" and row["flushes"] == 2
  assert row["step"] == pytest.approx((0.6 + 1.0) / 2)
  assert row["heaviest"] == pytest.approx((4 / 3 + 1) / 2) and row["lightest"] == pytest.approx((2 / 3 + 1) / 2)
  assert math.isnan(row["temperature_min"]) and math.isnan(row["kappa_spread"])
  # FedPSA-like: softmax weights with Temp and κ logged; B = 2.
  psa = _run(tmp_path, "psa", "fedpsa", [{"weights": [0.5, 0.5], "temperature": 5.5, "kappa": [0.1, 0.4]},
                                         {"weights": [0.6, 0.4], "temperature": 2.0, "kappa": [0.9, 0.3]}])
  row = buffer_weights.weight_spread(psa)
  assert row["step"] == pytest.approx(1.0) and row["heaviest"] == pytest.approx((1 + 1.2) / 2)
  assert row["lightest"] == pytest.approx((1 + 0.8) / 2)
  assert (row["temperature_min"], row["temperature_max"]) == (2.0, 5.5)
  assert row["kappa_spread"] == pytest.approx((0.3 + 0.6) / 2)
  assert buffer_weights.weight_spread(_run(tmp_path, "none", "ca2fl", [{}, {}])) is None


def test_group_figures_writes_a_row_per_run_and_the_mean_per_method(tmp_path):
  runs = [_run(tmp_path, "a", "fedbuff", [{"weights": [0.1, 0.3]}]),
          _run(tmp_path, "b", "fedbuff", [{"weights": [0.2, 0.2]}]),
          _run(tmp_path, "c", "fedpsa", [{"weights": [0.5, 0.5], "temperature": 1.0, "kappa": [0.2, 0.2]}]),
          _run(tmp_path, "d", "ca2fl", [{}]),
          _run(tmp_path, "e", "fedbuff", [{"weights": [0.9, 0.1]}], status="running"),
          _run(tmp_path, "method=fedpsa_uniform,seed=0", "fedpsa", [{"weights": [0.5, 0.5]}])]
  out = str(tmp_path / "report")
  os.makedirs(out)
  written = buffer_weights.group_figures(runs, out)
  assert [os.path.basename(p) for p in written] == ["buffer_weights.md", "buffer_weights.csv"]
  table = pd.read_csv(written[1])
  # No row for the run without weights, nor for the one still going; a sweep member is grouped by its method
  # label, which may name a variant of its config's method.
  assert list(table["run"]) == ["a", "b", "c", "method=fedpsa_uniform,seed=0"]
  assert list(table["method"]) == ["fedbuff", "fedbuff", "fedpsa", "fedpsa_uniform"]
  text = open(written[0]).read()
  # FedBuff's two runs: Σw 0.4 both; heaviest 1.5 and 1.0 → mean 1.25; lightest 0.5 and 1.0 → 0.75.
  assert "| fedbuff | 1 | 0.400 | 1.250 | 0.750 | n/a | n/a | n/a |" in text
  assert "| fedpsa | 1 | 1.000 | 1.000 | 1.000 | 1.00 | 1.00 | 0.000 |" in text
  assert "| a | 1 | 0.400 | 1.500 | 0.500 | n/a | n/a | n/a |" in text
  assert buffer_weights.group_figures([runs[3]], out) == []  # nothing to summarise: no file
