"""AiFed run whole on the embedded MNIST subset (2-6 labels per client): its upload bytes match the
layers sent, it uploads less than FedBuff and learns, its figure plots accuracy against the accumulated upload,
a run under the rank reading resumes bitwise and counts its bytes, and the full-upload variant on a timer sends
whole models.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from fedpsa_jax import io
from fedpsa_jax.sim import runner
from fedpsa_lab.figures import aifed as aifed_figures
from helpers import small_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """AiFed and FedBuff on the same short run of the embedded MNIST subset (2-6 labels per client)."""
  out = {}
  for method in ("aifed", "fedbuff"):
    workdir = str(tmp_path_factory.mktemp(method))
    sim = runner.Simulation(small_config(method, model="tiny_mlp", days=0.02, partition__method="labels_per_client",
                                         local__epochs=2), workdir)
    out[method] = (sim, sim.finish(), workdir)
  return out


def test_end_to_end_bytes_match_the_layers_sent(runs):
  sim, summary, _ = runs["aifed"]
  state = sim.state
  layer_bytes = [4 * sum(np.size(x) for x in jax.tree.leaves(sim.state.params["params"][name]))
                 for name in sim.strategy.layers]
  uploads = np.asarray(state.layer_uploads)
  non_empty = state.arrivals - state.empty_uploads
  assert summary["client_updates"] == state.arrivals
  num_layers = len(layer_bytes)
  assert sim.config.aifed.upload_when == "rank"  # the default: every update also reports its rc [L] (float32)
  # Per update that sends layers: the mask (L bools), r̂, n, LIR (4 bytes each) and rc; an empty one: rc alone.
  assert summary["bytes_uploaded"] == (int(uploads @ np.asarray(layer_bytes)) + non_empty * (num_layers + 12)
                                       + state.arrivals * 4 * num_layers)
  assert 0 < uploads.sum() < state.arrivals * len(layer_bytes)  # some layers were withheld, some sent


def test_end_to_end_aifed_uploads_less_than_fedbuff_and_learns(runs):
  (_, ai, _), (_, fb, _) = runs["aifed"], runs["fedbuff"]
  assert ai["status"] == "completed" and ai["client_updates"] > 20
  assert ai["upload_bytes_per_update"] < fb["upload_bytes_per_update"]
  assert ai["uploaded_mb"] == ai["bytes_uploaded"] / 2 ** 20  # cost_a of Eq. 17 (MiB)
  assert ai["best_test_accuracy"] > 0.4  # chance is 0.1


def test_figure_plots_accuracy_against_accumulated_upload(runs, tmp_path):
  dirs = [runs[m][2] for m in ("aifed", "fedbuff")]
  paths = aifed_figures.group_figures(dirs, str(tmp_path / "figs"))
  assert [os.path.basename(p) for p in paths] == ["accuracy_vs_upload.png", "accuracy_vs_upload.pdf"]
  assert open(paths[0], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  for method in ("aifed", "fedbuff"):
    sim, summary, workdir = runs[method]
    mb, acc = aifed_figures.accuracy_vs_upload(workdir)
    assert acc == [r["test_accuracy"] for r in sim.history]
    assert mb[0] == 0.0 and mb[-1] == summary["uploaded_mb"] and mb == sorted(mb)


def _rank_run_config():
  c = small_config("aifed", model="tiny_mlp", days=0.03, partition__method="labels_per_client", local__epochs=2)
  c.aifed.upload_when, c.aifed.rank_window = "rank", 4
  c.eval.every_days = 0.005
  c.checkpoint.every_days = 0.02
  c.output.events = True
  return c


def test_rank_run_resumes_bitwise_and_counts_its_bytes(tmp_path):
  """A run under the rank reading stopped after its checkpoint and resumed ends with the same metrics,
  events, summary and state (rc window included) as the uninterrupted run."""
  whole = runner.Simulation(_rank_run_config(), str(tmp_path / "whole"))
  summary = whole.run()
  state = whole.state
  assert state.arrivals > 3 * 3 and np.asarray(state.rc_window).any()  # past the warm-up, reports kept
  # Bytes: the sent layers, each non-empty update's payload (mask, r̂, n, LIR, rc), each empty one's rc.
  layer_bytes = np.array([4 * sum(np.size(x) for x in jax.tree.leaves(state.params["params"][name]))
                          for name in whole.strategy.layers])
  non_empty = state.arrivals - state.empty_uploads
  assert summary["bytes_uploaded"] == (int(np.asarray(state.layer_uploads) @ layer_bytes) + non_empty * (2 + 12 + 8)
                                       + state.empty_uploads * 8)
  assert 0 < sum(state.layer_uploads) < state.arrivals * 2
  first = runner.Simulation(_rank_run_config(), str(tmp_path / "cut"))
  first.run_until(0.025)  # past the checkpoint at 0.02
  first.close()
  resumed = runner.Simulation(_rank_run_config(), str(tmp_path / "cut"))
  assert resumed.resumed_from == int(0.02 * 86400) and np.asarray(resumed.state.rc_window).any()
  resumed.run()
  timing = set(runner.PROCESS_FIELDS)
  for name in ("metrics.jsonl", "events.jsonl"):
    a = [{k: v for k, v in r.items() if k not in timing} for r in io.read_jsonl(str(tmp_path / "whole" / name))]
    b = [{k: v for k, v in r.items() if k not in timing} for r in io.read_jsonl(str(tmp_path / "cut" / name))]
    assert a == b
  assert any("upload_probability" in r for r in io.read_jsonl(str(tmp_path / "whole" / "events.jsonl")))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.state), jax.device_get(state))


def test_full_upload_variant_on_a_timer_sends_whole_models():
  """AGMA-LN (no ALMU) on a timer: every update uploads every layer, and rounds follow the timer."""
  c = small_config("aifed", model="linear", days=0.01, partition__method="labels_per_client")
  c.aifed.variant, c.aifed.lir, c.aifed.trigger, c.aifed.period = "agma", "label_number", "timer", 60
  sim = runner.Simulation(c)
  summary = sim.finish()
  model_bytes = 4 * sum(np.size(x) for x in jax.tree.leaves(sim.state.params))
  assert summary["bytes_uploaded"] == summary["client_updates"] * (model_bytes + 1 + 12)
  assert sim.state.empty_uploads == 0 and summary["client_updates"] > 10
  assert 0 < summary["rounds"] <= sim.loop.now // 60  # at most one round per tick
