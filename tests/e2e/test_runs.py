"""Whole runs on the embedded MNIST subset: the same seed gives identical metrics, the run directory holds
what docs/runs.md lists (with the AULC), and FedPSA runs with the paper's CNN.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedpsa_jax import io, provenance
from fedpsa_jax import config as config_lib
from fedpsa_jax.data import sources
from fedpsa_jax.sim import runner
from helpers import small_config


def test_same_seed_gives_identical_metrics(tmp_path):
  drop = {"wall_seconds", "train_seconds"}
  runs = []
  for name in ("a", "b"):
    runner.Simulation(small_config("fedpsa", days=0.01), str(tmp_path / name)).run()
    runs.append([{k: v for k, v in r.items() if k not in drop}
                 for r in io.read_jsonl(str(tmp_path / name / "metrics.jsonl"))])
  assert runs[0] == runs[1]
  other = small_config("fedpsa", days=0.01)
  other.seed = 1
  runner.Simulation(other, str(tmp_path / "c")).run()
  third = [{k: v for k, v in r.items() if k not in drop} for r in io.read_jsonl(str(tmp_path / "c" / "metrics.jsonl"))]
  assert third != runs[0]


def test_run_directory_contents_and_aulc(tmp_path):
  c = small_config("fedpsa", days=0.012)
  c.output.events = True
  summary = runner.Simulation(c, str(tmp_path)).run()
  assert json.load(open(tmp_path / "config.json"))["method"] == "fedpsa"
  on_disk = json.load(open(tmp_path / "summary.json"))
  for key in ("status", "method", "dataset", "final_test_accuracy", "best_test_accuracy", "aulc",
              "virtual_days", "rounds", "client_updates", "wall_seconds", "train_seconds"):
    assert key in on_disk, key
  history = io.read_jsonl(str(tmp_path / "metrics.jsonl"))
  every = config_lib.eval_every_units(c)
  budget = config_lib.budget_units(c)
  # Evaluations at 0, every interval, and at the end of the budget.
  assert [r["time"] for r in history] == sorted(set(list(range(0, budget + 1, every)) + [budget]))
  days = np.array([r["time"] for r in history]) / 86400
  accs = np.array([r["test_accuracy"] for r in history])
  hand = sum((days[i + 1] - days[i]) * (accs[i + 1] + accs[i]) / 2 for i in range(len(days) - 1))
  assert on_disk["aulc"] == pytest.approx(hand, rel=1e-9)
  assert on_disk["final_test_accuracy"] == history[-1]["test_accuracy"]
  assert on_disk["rounds"] == history[-1]["round"]
  # Provenance: the data's fingerprint is the examples' (any seed's holdout of them), the code's commit this checkout's.
  dataset = sources.load_dataset(c.data.name, rng=np.random.default_rng(123))
  assert on_disk["provenance"]["data"] == {"name": c.data.name, "fingerprint": provenance.data_fingerprint(
      dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test)}
  assert on_disk["provenance"]["code"] == provenance.code_version()
  events = io.read_jsonl(str(tmp_path / "events.jsonl"))
  updates = [e for e in events if e["type"] == "update"]
  rounds = [e for e in events if e["type"] == "round"]
  assert len(updates) == summary["client_updates"]
  assert len(rounds) == summary["rounds"]
  for e in updates:
    assert -1.0 - 1e-6 <= e["kappa"] <= 1.0 + 1e-6
    assert e["delta_sq_norm"] > 0
    assert e["arrival_time"] > e["dispatch_time"]
  for r in rounds:
    assert sum(r["weights"]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_fedpsa_runs_with_the_paper_cnn(tmp_path):
  """The default model path (conv net, Fisher on the CNN, unrolled chunks) on a very short budget."""
  c = small_config("fedpsa", model="mnist_cnn", days=0.004)
  c.partition.num_clients = 10
  summary = runner.Simulation(c, str(tmp_path)).run()
  assert summary["status"] == "completed"
  assert summary["rounds"] >= 1
  history = io.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert history[-1]["test_loss"] < history[0]["test_loss"]
