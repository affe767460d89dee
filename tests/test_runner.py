"""End to end on the embedded real MNIST subset: learning, determinism and the run directory."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, metrics
from fedpsa_jax.sim import runner
from helpers import small_config


@pytest.mark.parametrize("method", ["fedpsa", "fedbuff", "fedasync", "fedavg"])
def test_accuracy_rises_well_above_chance(method, tmp_path):
  summary = runner.Simulation(small_config(method), str(tmp_path)).run()
  assert summary["status"] == "completed"
  assert summary["client_updates"] > 20
  assert summary["final_test_accuracy"] > 0.6, summary  # chance is 0.1
  history = io.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert history[0]["time"] == 0 and history[0]["client_updates"] == 0
  assert history[-1]["test_accuracy"] > history[0]["test_accuracy"] + 0.4


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


def test_aulc_formula():
  assert metrics.aulc([0, 1, 2], [0.0, 0.5, 1.0]) == pytest.approx(1.0)
  assert metrics.aulc([0, 10], [0.6, 0.6]) == pytest.approx(6.0)


def test_failed_run_keeps_metrics_and_writes_summary(tmp_path, monkeypatch):
  c = small_config("fedbuff", days=0.02)
  sim = runner.Simulation(c, str(tmp_path))
  calls = {"n": 0}
  original = sim.strategy.receive

  def failing_receive(state, arrivals):
    calls["n"] += 1
    if calls["n"] == 30:
      raise RuntimeError("injected failure")
    return original(state, arrivals)

  monkeypatch.setattr(sim.strategy, "receive", failing_receive)
  with pytest.raises(RuntimeError, match="injected"):
    sim.run()
  assert json.load(open(tmp_path / "summary.json"))["status"] == "failed"
  assert len(io.read_jsonl(str(tmp_path / "metrics.jsonl"))) >= 1


@pytest.mark.parametrize("method", ["fedbuff", "fedpsa"])
def test_summary_accounts_bytes_and_compute(method):
  """Every update uploads Δ (the model's size) plus the payload; every dispatch downloads the model. Under
  runtime.phase_timing the compute phases have their seconds; without it they are null (not timed)."""
  untimed = runner.Simulation(small_config(method, days=0.01)).run()
  sim = runner.Simulation(small_config(method, days=0.01, runtime__phase_timing=True))
  summary = sim.run()
  assert {k: v for k, v in summary.items() if k not in runner.TIMING_FIELDS} == {
      k: v for k, v in untimed.items() if k not in runner.TIMING_FIELDS}  # timing changes nothing else
  phases = ("server_compute_seconds", "client_compute_seconds", "client_payload_seconds", "train_seconds")
  assert all(untimed[k] is None for k in phases)
  assert summary["client_payload_seconds"] >= 0 and summary["train_seconds"] == summary["client_compute_seconds"]
  if method == "fedpsa":
    assert summary["client_payload_seconds"] > 0
  model_bytes = sum(x.size * 4 for x in jax.tree.leaves(sim.state.params))  # float32 parameters
  extra = 0 if method == "fedbuff" else 4 * sim.config.fedpsa.sketch_dim  # FedPSA: the float32 sketch
  assert summary["client_updates"] > 0
  assert summary["bytes_uploaded"] == summary["client_updates"] * summary["upload_bytes_per_update"]
  assert summary["upload_bytes_per_update"] == model_bytes + extra
  # Downloads: one model per dispatch, and every received update was dispatched (some still in flight).
  assert summary["bytes_downloaded"] % model_bytes == 0
  assert summary["bytes_downloaded"] // model_bytes >= summary["client_updates"]
  assert summary["server_compute_seconds"] > 0 and summary["client_compute_seconds"] > 0


def test_time_to_target_is_the_first_evaluation_reaching_it():
  # (Flax's init: the linear model passes 0.5 within these 0.01 days, PyTorch's init not yet.)
  sim = runner.Simulation(small_config("fedbuff", days=0.01, eval__target_accuracy=0.5, model__init="flax"))
  summary = sim.run()
  first = next(r for r in sim.history if r["test_accuracy"] >= 0.5)
  assert all(r["test_accuracy"] < 0.5 for r in sim.history if r["time"] < first["time"])
  assert summary["day_to_target"] == first["day"] and summary["round_to_target"] == first["round"]
  assert summary["client_updates_to_target"] == first["client_updates"] > 0
  assert 0 < summary["bytes_uploaded_to_target"] <= summary["bytes_uploaded"]
  sim = runner.Simulation(small_config("fedbuff", days=0.002, eval__target_accuracy=0.999))
  assert sim.run()["day_to_target"] is None


@pytest.mark.parametrize("batch_size", [10, 37, 1000])
def test_evaluation_equals_a_per_sample_reference(batch_size):
  """The evaluator (equal batches, the last padded and masked) gives the accuracy and mean cross-entropy of
  a per-sample NumPy reference on 37 test rows, whatever the batch (10: 3 padded rows; 37: one batch; 1000:
  capped at the set)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(37, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=37).astype(np.int32)
  params = {"w": rng.normal(size=(5, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
  apply_fn = lambda p, xb: xb @ p["w"] + p["b"]
  logits = x.astype(np.float64) @ params["w"] + params["b"]
  log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1, keepdims=True)) \
      - logits.max(1, keepdims=True)
  ref_accuracy = float(np.mean(np.argmax(logits, 1) == y))
  ref_loss = float(-np.mean(log_probs[np.arange(37), y]))
  evaluate = metrics.make_evaluator(apply_fn, jax.numpy.asarray(x), jax.numpy.asarray(y), batch_size)
  result = evaluate(jax.tree.map(jax.numpy.asarray, params))
  assert result["test_accuracy"] == pytest.approx(ref_accuracy, abs=1e-12)
  assert result["test_loss"] == pytest.approx(ref_loss, rel=1e-5)
