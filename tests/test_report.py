"""Reports (fedpsa_lab/report.py): the paper-layout table from summaries, the report kinds (generic ones and
the plug-ins'), single-run reports and the figure plug-ins; FedPSA's plug-in (fedpsa_lab/figures/fedpsa.py):
the κ-alignment statistics against scipy.stats on the pairs a real FedPSA run logs (Eqs. 21-22) and the
Fig. 5 overhead tables."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import matplotlib.axes
import numpy as np
import pandas as pd
import pytest
import scipy.stats

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_jax.models import get_model
from fedpsa_jax.sim import runner
from fedpsa_jax.strategies.fedpsa import make_alignment_fn
from fedpsa_lab import figures, paper, report, report_lib, report_stats
from fedpsa_lab import modes as lab_modes
from fedpsa_lab.figures import fedpsa as fedpsa_figures

from helpers import ROOT, fake_members, small_config
from numerics import assert_close, f32_tolerance


def _fake_sweep(tmp_path, accuracies: dict[tuple[str, float, int], float]) -> str:
  """A sweep directory whose members' summary.json hold the given final accuracies (no training)."""
  base = config_lib.base_config()
  config = paper.sweep_config("fake", "Fake table", base,
                              [paper.method_axis(("fedbuff", "fedpac", "fedpsa")),
                               paper.dataset_axis(("mnist", "fashion_mnist"), smoke=True)],
                              [0, 1], {"rows": ["method"], "cols": ["dataset"]},
                              exclude=paper.no_fedpac_on_linear(("mnist", "fashion_mnist")))
  workdir = str(tmp_path / "fake")
  for m, run_dir in fake_members(config, workdir):
    key = (m.labels["method"], m.labels["dataset"], m.labels["seed"])
    io.write_json_atomic(os.path.join(run_dir, "summary.json"),
                         {"status": "completed", "final_test_accuracy": accuracies[key]})
  return workdir


def test_table_cells_are_mean_and_interval_over_seeds_in_the_paper_layout(tmp_path):
  rng = np.random.default_rng(0)
  accs = {(m, d, s): float(rng.uniform(0.2, 0.9)) for m in ("fedbuff", "fedpac", "fedpsa")
          for d in ("mnist", "fashion_mnist") for s in (0, 1)}
  workdir = _fake_sweep(tmp_path, accs)
  written = report.build(workdir)
  assert os.path.join(workdir, "report", "table.md") in written
  means = pd.read_csv(os.path.join(workdir, "report", "table.csv")).set_index("method")
  halves = pd.read_csv(os.path.join(workdir, "report", "table_ci95.csv")).set_index("method")
  counts = pd.read_csv(os.path.join(workdir, "report", "table_n.csv")).set_index("method")
  markdown = open(os.path.join(workdir, "report", "table.md")).read()
  for m in ("fedbuff", "fedpac", "fedpsa"):
    for d, column in (("mnist", "mnist_5k (for MNIST)"), ("fashion_mnist", "mnist_5k (for FMNIST)")):
      if (m, d) == ("fedpac", "fashion_mnist"):
        assert math.isnan(means.loc[m, column])  # left out by the sweep, printed '-'
        continue
      values = 100 * np.array([accs[(m, d, 0)], accs[(m, d, 1)]])
      assert means.loc[m, column] == pytest.approx(values.mean())
      # scipy's t-interval of the mean, an independent reference for report_stats.interval.
      low, high = scipy.stats.t.interval(0.95, 1, loc=values.mean(), scale=scipy.stats.sem(values))
      assert halves.loc[m, column] == pytest.approx((high - low) / 2)
      assert counts.loc[m, column] == 2
      assert f"{values.mean():.2f} ± {(high - low) / 2:.2f}" in markdown
  assert "Mean over 2 seeds ± the half-width of its 95% Student-t interval." in markdown
  fedpac_row = next(line for line in markdown.splitlines() if line.startswith("| FedPAC"))
  assert fedpac_row.endswith("| - |")
  for column in ("mnist_5k (for MNIST)", "mnist_5k (for FMNIST)"):  # the best of each column in bold
    best = means[column].idxmax()
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {paper.DISPLAY_NAMES[best]}"))
    assert f"**{means.loc[best, column]:.2f}" in row


def test_table_markdown_renders_cells_without_computing_any():
  """The rendering half of paper_table on numbers made by hand: every kind of cell, written as documented."""
  cells = report_lib.Cells(
      rows=["method"], row_keys=[("fedpsa",), ("fedbuff",), ("fedpac",)], col_keys=[("mnist",)],
      names=["MNIST", "Avg"], means=np.array([[81.234, 81.234], [79.0, 79.0], [np.nan, np.nan]]),
      half_widths=np.array([[0.456, np.nan], [np.nan, np.nan], [np.nan, np.nan]]),
      counts=np.array([[3], [1], [0]]), marks=np.array([[1], [0], [0]]), excluded=np.array([[False], [False], [True]]),
      bold=np.array([[True, True], [False, False], [False, False]]), paired=None, pooled=None, published={})
  spec = {"display": {"method": "Method", "fedpsa": "FedPSA (Ours)"}, "decimals": 1}  # (names: already text)
  assert report_lib.table_markdown(cells, spec).splitlines() == [
      "| Method | MNIST | Avg |", "|---|---|---|",
      "| FedPSA (Ours) | **81.2 ± 0.5** ▲ | **81.2** |",  # (no interval and no mark in an extra column)
      "| fedbuff | 79.0 | 79.0 |",
      "| fedpac | - | n/a |",  # left out by the sweep; an extra column is not
      "", "Mean over 1-3 seeds ± the half-width of its 95% Student-t interval (none for a cell with one seed)."]


def test_a_csv_is_the_same_bytes_when_its_floats_differ_in_their_last_bits(tmp_path):
  """A redraw on another CPU (other summation orders) changes statistics in their last bits, as two machines did for
  one partial-correlation table (relative differences up to 4e-14): the CSV must not change with them. Fractional
  floats keep 8 significant digits; whole numbers, also in a float column with gaps (bytes), and labels stay whole."""
  rng = np.random.default_rng(0)
  values = rng.uniform(-1, 1, size=(50, 3)) * 10.0 ** rng.integers(-4, 3, size=(50, 3))
  bits = 1 + rng.uniform(-4e-14, 4e-14, size=values.shape)
  whole = np.where(np.arange(50) % 7 == 3, np.nan, 5_595_576_680.0 + np.arange(50))  # gaps make the column float
  frame = lambda v: pd.DataFrame({"x": v[:, 0], "y": v[:, 1], "z": v[:, 2], "bytes": whole,
                                  "label": [f"method=m{i}" for i in range(50)]})
  first = report_lib.write_csv(frame(values), str(tmp_path / "a.csv"))
  second = report_lib.write_csv(frame(values * bits), str(tmp_path / "b.csv"))
  # (none of these 150 draws lies within 4e-14 of a rounding boundary of its eighth digit: a fixed rng)
  assert open(first).read() == open(second).read()
  read = pd.read_csv(first)
  np.testing.assert_allclose(read[["x", "y", "z"]].to_numpy(), values, rtol=5e-8, atol=0)  # half a unit of the 8th
  digits = lambda text: len(text.split("e")[0].lstrip("-").replace(".", "").lstrip("0"))  # of the mantissa written
  assert max(pd.read_csv(first, dtype=str)[["x", "y", "z"]].stack().map(digits)) == 8
  np.testing.assert_array_equal(read["bytes"].to_numpy(), whole)  # every digit of 5,595,576,680 + i, gaps kept
  assert ",5595576684," in open(first).read() and read["label"][7] == "method=m7"


def test_missing_member_shows_as_not_run_and_bad_workdir_is_an_error(tmp_path):
  accs = {(m, d, s): 0.5 for m in ("fedbuff", "fedpac", "fedpsa") for d in ("mnist", "fashion_mnist") for s in (0, 1)}
  workdir = _fake_sweep(tmp_path, accs)
  for seed in (0, 1):
    os.remove(os.path.join(workdir, "runs", f"method=fedpsa,dataset=mnist,seed={seed}", "summary.json"))
  report.build(workdir)
  row = next(line for line in open(os.path.join(workdir, "report", "table.md")) if line.startswith("| FedPSA"))
  assert "n/a" in row
  with pytest.raises(report.ReportError, match="--workdir"):
    report.build(str(tmp_path))


@pytest.fixture(scope="module")
def alignment_run(tmp_path_factory):
  """A short FedPSA run logging κ and align for every received update (as configs/paper/fig6.py does)."""
  workdir = str(tmp_path_factory.mktemp("fig6") / "run")
  config = small_config("fedpsa", model="linear", days=0.02, output__events=True, fedpsa__log_alignment=True,
                        partition__alpha=0.1, fedpsa__alignment_batch_size=128)
  summary = runner.Simulation(config, workdir).run()
  return workdir, summary


@pytest.mark.slow
def test_kappa_alignment_statistics_equal_scipy_on_the_logged_pairs(alignment_run):
  workdir, summary = alignment_run
  updates = [json.loads(line) for line in open(os.path.join(workdir, "events.jsonl"))
             if json.loads(line)["type"] == "update"]
  assert len(updates) == summary["client_updates"] > 10
  kappa = np.array([u["kappa"] for u in updates])
  align = np.array([u["alignment"] for u in updates])
  assert np.all(np.abs(align) <= 1 + 1e-6) and np.std(align) > 0
  got = fedpsa_figures.alignment_frame([workdir])
  np.testing.assert_array_equal(got["kappa"], kappa)
  np.testing.assert_array_equal(got["alignment"], align)
  np.testing.assert_array_equal(got["time"], [u["arrival_time"] for u in updates])
  stats = fedpsa_figures.alignment_stats(kappa, align, 0.1)
  assert stats["n"] == len(updates)
  assert stats["pearson"] == pytest.approx(scipy.stats.pearsonr(kappa, align).statistic, abs=1e-12)
  assert stats["spearman"] == pytest.approx(scipy.stats.spearmanr(kappa, align).statistic, abs=1e-12)
  # Bins recomputed independently with pandas: counts and mean alignment per [k/10, (k+1)/10).
  frame = pd.DataFrame({"bin": np.floor(kappa * 10).astype(int).clip(max=9), "align": align})
  groups = frame.groupby("bin")["align"].agg(["count", "mean"])
  assert [b["count"] for b in stats["bins"]] == groups["count"].tolist()
  assert [b["mean_alignment"] for b in stats["bins"]] == pytest.approx(groups["mean"].tolist())
  assert sum(b["count"] for b in stats["bins"]) == len(updates)


def test_binned_statistics_equal_scipy_on_many_bins():
  rng = np.random.default_rng(3)
  kappa = np.concatenate([rng.uniform(-0.3, 1.0, 400), [1.0, 0.0]])  # κ = 1 joins the top bin
  align = 0.5 * kappa + rng.normal(0, 0.3, kappa.size)
  stats = fedpsa_figures.alignment_stats(kappa, align, 0.1)
  index = np.minimum(np.floor(kappa / 0.1), 9).astype(int)
  keys = np.unique(index)
  centres = (keys + 0.5) * 0.1
  means = np.array([align[index == k].mean() for k in keys])
  assert [b["count"] for b in stats["bins"]] == [int((index == k).sum()) for k in keys]
  assert stats["bins"][-1]["lo"] == pytest.approx(0.9) and len(stats["bins"]) == 13
  for b, k in zip(stats["bins"], keys):  # each bin mean's 95% interval, against scipy's t-interval
    values = align[index == k]
    if len(values) > 1:
      low, high = scipy.stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=scipy.stats.sem(values))
      assert b["alignment_ci95"] == pytest.approx((high - low) / 2)
    else:
      assert math.isnan(b["alignment_ci95"])
  assert stats["binned_pearson"] == pytest.approx(scipy.stats.pearsonr(centres, means).statistic, abs=1e-12)
  assert stats["binned_spearman"] == pytest.approx(scipy.stats.spearmanr(centres, means).statistic, abs=1e-12)
  assert stats["pearson"] == pytest.approx(scipy.stats.pearsonr(kappa, align).statistic, abs=1e-12)


def test_alignment_is_the_cosine_of_the_two_test_gradients():
  """Eqs. 21-22 on a linear model: compared with gradients taken by hand (softmax − one-hot)."""
  model = get_model("linear", 10)
  x = jax.random.normal(jax.random.key(0), (32, 28, 28, 1))
  y = jax.random.randint(jax.random.key(1), (32,), 0, 10)
  server = model.init(jax.random.key(2), x[:1])
  delta = jax.tree.map(lambda p: 0.05 * jax.random.normal(jax.random.key(3), p.shape), server)
  align = make_alignment_fn(model.apply, x, y)(server, (server, server), (delta, jax.tree.map(jnp.zeros_like, delta)))

  def hand_grad(params):
    w, b = params["params"]["Dense_0"]["kernel"], params["params"]["Dense_0"]["bias"]
    flat = np.asarray(x).reshape(32, -1)
    err = (jax.nn.softmax(flat @ w + b) - jax.nn.one_hot(y, 10)) / 32
    return np.concatenate([np.ravel(flat.T @ err), np.ravel(err.sum(0))])

  client = jax.tree.map(jnp.add, server, delta)
  g_c, g_s = hand_grad(client), hand_grad(server)
  # Cosines of two float32 gradients of 7,850 entries, each a sum over the 32 samples.
  rel = f32_tolerance(7850, depth=2)
  assert_close(float(align[0]), g_c @ g_s / np.linalg.norm(g_c) / np.linalg.norm(g_s), rel)
  assert_close(float(align[1]), 1.0, rel)  # an unchanged client agrees with the server


def test_log_alignment_needs_events():
  config = small_config("fedpsa", fedpsa__log_alignment=True)
  assert any("fedpsa.log_alignment" in e and "output.events" in e for e in config_lib.config_errors(config))


def test_run_report_and_figure_plugins(alignment_run, tmp_path, monkeypatch):
  workdir, _ = alignment_run
  seen = {}
  plugin = types.SimpleNamespace(
      run_figures=lambda run_dir, out_dir: seen.setdefault("run", []).append(run_dir) or [f"{out_dir}/a.png"],
      group_figures=lambda run_dirs, out_dir, report: seen.setdefault("group", []).append(run_dirs) or [f"{out_dir}/b.png"])
  monkeypatch.setattr(figures, "modules", lambda: [types.SimpleNamespace(), plugin])
  written = report.build(workdir)
  assert written[:2] == [os.path.join(workdir, "report", f"learning_curve.{ext}") for ext in ("png", "pdf")]
  assert os.path.getsize(written[0]) > 5_000
  assert written[2:] == [os.path.join(workdir, "report", "a.png")] and seen == {"run": [workdir]}
  # In a sweep report: run_figures for each member and group_figures once over all of them.
  seen.clear()
  accs = {(m, d, s): 0.5 for m in ("fedbuff", "fedpac", "fedpsa") for d in ("mnist", "fashion_mnist") for s in (0, 1)}
  sweep_dir = _fake_sweep(tmp_path, accs)
  for name in os.listdir(os.path.join(sweep_dir, "runs")):  # give each member a curve to draw
    io.write_json_atomic(os.path.join(sweep_dir, "runs", name, "m.json"), {})
    with open(os.path.join(sweep_dir, "runs", name, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"day": 0.0, "test_accuracy": 0.1}) + "\n" + json.dumps({"day": 0.01, "test_accuracy": 0.5}))
  report.build(sweep_dir)
  assert len(seen["run"]) == 10 and len(seen["group"]) == 1 and sorted(seen["group"][0]) == sorted(seen["run"])
  assert not os.path.exists(os.path.join(sweep_dir, "report", "runs"))  # no plug-in drew: no empty folders


def test_figures_package_loads_its_modules():
  assert all(hasattr(m, "__name__") for m in figures.modules())  # importing every plug-in module works


def _fake_members(tmp_path, name: str, config_file: str, summary_of, events_of=None) -> str:
  """A sweep directory of a paper smoke config whose members hold fabricated summaries (and events)."""
  workdir = str(tmp_path / name)
  for m, run_dir in fake_members(api_config(config_file), workdir):
    io.write_json_atomic(os.path.join(run_dir, "summary.json"), {"status": "completed", **summary_of(m)})
    if events_of:
      with open(os.path.join(run_dir, "events.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events_of(m))
  return workdir


def _report_files(workdir: str, written: list[str]) -> list[str]:
  """The paths `report.build` returned, relative to WORKDIR/report, each checked to exist."""
  assert all(os.path.isfile(p) for p in written), written
  return [os.path.relpath(p, os.path.join(workdir, "report")) for p in written]


def api_config(spec: str):
  """A config file of the repository (path relative to its root) as launch.py loads it."""
  return config_lib.load_file(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), spec))


@pytest.mark.slow
def test_heatmap_overhead_and_alignment_reports_of_a_sweep(tmp_path):
  # Fig. 4: each grid cell is its member's accuracy; one heatmap and table per grid.
  acc = lambda m: 0.01 * sum(float(v) for k, v in m.labels.items() if k not in ("part", "seed"))
  workdir = _fake_members(tmp_path, "fig4", "configs/paper/fig4.py:smoke", lambda m: {"final_test_accuracy": acc(m)})
  written = report.build(workdir)
  # The exact files of each layout, in order: what report.py wrote when these kinds were an if-chain inside it.
  # (No plug-in group figure: these members have no metrics.jsonl, so there is no run to draw.)
  assert _report_files(workdir, written) == [
      "members.csv", "heatmap_gamma_delta.png", "heatmap_gamma_delta.pdf", "heatmap_gamma_delta.csv",
      "heatmap_ls_lq.png", "heatmap_ls_lq.pdf", "heatmap_ls_lq.csv", "heatmap.md"]
  grid = pd.read_csv(os.path.join(workdir, "report", "heatmap_ls_lq.csv")).set_index("buffer_size")
  assert grid.loc[2, "L_q=50"] == pytest.approx(100 * 0.01 * (2 + 50))
  # Fig. 5: the accounting fields per method and dataset.
  fields = lambda m: {"client_compute_seconds": 1.0 + len(m.labels["method"]), "server_compute_seconds": 0.5,
                      "bytes_uploaded": 2**20, "bytes_downloaded": 2**21, "upload_bytes_per_update": 1024.0,
                      "download_bytes_per_update": 2048.0, "final_test_accuracy": 0.5}
  workdir = _fake_members(tmp_path, "fig5", "configs/paper/fig5.py:smoke", fields)
  assert _report_files(workdir, report.build(workdir)) == [
      "members.csv", "table.md", "table.csv", "curves.png", "curves.pdf", "overhead.md", "overhead.csv", "overhead.png",
      "overhead.pdf"]
  overhead = pd.read_csv(os.path.join(workdir, "report", "overhead.csv")).set_index("method")
  assert overhead.loc["fedpsa", "client_compute_seconds:mnist_5k (for CIFAR-10)"] == pytest.approx(7.0)
  assert overhead.loc["ca2fl", "bytes_communicated:mnist_5k (for MNIST)"] == pytest.approx(3.0)  # MiB up + down
  assert math.isnan(overhead.loc["fedpac", "upload_bytes_per_update:mnist_5k (for FMNIST)"])
  assert os.path.getsize(os.path.join(workdir, "report", "overhead.png")) > 10_000
  # Fig. 6: pairs pooled over the members' events.jsonl (two seeds), statistics as alignment_stats gives.
  rng = np.random.default_rng(7)
  pairs = {s: rng.uniform(0, 1, (30, 2)) for s in (0, 1)}
  events = lambda m: [{"type": "update", "kappa": k, "alignment": a} for k, a in pairs[m.labels["seed"]]] + [
      {"type": "round", "temperature": 1.0}]
  workdir = _fake_members(tmp_path, "fig6", "configs/paper/fig6.py:smoke,seeds=2", lambda m: {}, events)
  assert _report_files(workdir, report.build(workdir)) == [
      "members.csv", "alignment.md", "alignment_bins.csv", "alignment.json", "alignment.png", "alignment.pdf"]
  saved = json.load(open(os.path.join(workdir, "report", "alignment.json")))
  both = np.concatenate([pairs[0], pairs[1]])
  assert saved["n"] == 60
  assert saved["pearson"] == pytest.approx(scipy.stats.pearsonr(both[:, 0], both[:, 1]).statistic, abs=1e-12)
  intervals, independent = saved.pop("intervals"), saved.pop("independent_intervals")
  assert (saved.pop("runs"), saved.pop("block_length"), len(saved.pop("autocorrelation")["kappa"])) == (2, 4, 4)
  time = np.tile(np.arange(30.0), 2)  # the events carry no arrival_time: each update's position in its run
  assert saved.pop("detrended_pearson") == pytest.approx(
      fedpsa_figures.detrended_pearson(both[:, 0], both[:, 1], time, np.repeat([0, 1], 30)), abs=1e-12)
  assert saved == json.loads(json.dumps(fedpsa_figures.alignment_stats(both[:, 0], both[:, 1], 0.1)))
  # The pair-by-pair bootstrap intervals against scipy's (another random stream, and scipy resamples the pooled
  # pairs where ours resamples each run's: Monte Carlo noise only).
  # (Vectorised over the resamples: Spearman's ρ is Pearson's r of the ranks.)
  pearson = lambda k, a, axis: scipy.stats.pearsonr(k, a, axis=axis).statistic
  spearman = lambda k, a, axis: pearson(scipy.stats.rankdata(k, axis=axis), scipy.stats.rankdata(a, axis=axis), axis)
  for name, fn in (("pearson", pearson), ("spearman", spearman)):
    ref = scipy.stats.bootstrap((both[:, 0], both[:, 1]), fn, paired=True, vectorized=True,
                                n_resamples=2000, method="percentile", rng=np.random.default_rng(1)).confidence_interval
    assert independent[name] == pytest.approx([ref.low, ref.high], abs=0.05)
    assert independent[name][0] < saved[name] < independent[name][1]
  for ci in (intervals, independent):
    assert all(lo <= saved[n] <= hi for n, (lo, hi) in ci.items() if n in saved and not math.isnan(lo))
  assert "95% circular block bootstrap intervals" in open(os.path.join(workdir, "report", "alignment.md")).read()


@pytest.mark.slow
def test_a_sweep_is_redrawn_with_the_layout_of_its_config_and_only_of_its_own(tmp_path):
  # A sweep that ran before its config's layout had the paper's numbers: sweep.json's report section lacks them.
  spec = "configs/results/table1_mnist_5k.py:seeds=1"
  acc = lambda m: {"final_test_accuracy": 0.5 + 0.01 * len(m.labels["method"]), "aulc_per_day": 0.4}
  workdir = _fake_members(tmp_path, "older", spec, acc)
  saved = json.load(open(os.path.join(workdir, "sweep.json")))
  del saved["sweep"]["report"]["published"]
  io.write_json_atomic(os.path.join(workdir, "sweep.json"), saved)
  table = lambda: open(os.path.join(workdir, "report", "table.md")).read()
  report.build(workdir)
  assert "Published" not in table()
  ours = pd.read_csv(os.path.join(workdir, "report", "table.csv"))
  report.build(workdir, io.config_json(api_config(spec)))  # --mode=report --config=SPEC: today's layout
  assert table().count("Published (FedPSA paper, Table 1") == 1
  assert "| FedPSA (Ours) | 98.53 | **98.79** | **98.84** |" in table()  # paper.TABLE1_MNIST
  pd.testing.assert_frame_equal(pd.read_csv(os.path.join(workdir, "report", "table.csv")), ours)  # same results
  # Through the command line's mode: a sweep config is the layout; launch.py's default run config is not.
  assert lab_modes.run_report(workdir, api_config("configs/default.py")) == 0 and "Published" not in table()
  assert lab_modes.run_report(workdir, api_config(spec)) == 0 and "Published" in table()
  with pytest.raises(report.ReportError, match="names sweep 'mnist-full' but .* holds sweep 'table1-mnist-5k'"):
    report.build(workdir, io.config_json(api_config("configs/results/mnist_full.py")))
  run_dir = sweep.member_dir(workdir, sweep.read_sweep_json(workdir)["members"][0]["name"])
  open(os.path.join(run_dir, "metrics.jsonl"), "w").write(json.dumps({"day": 0.0, "test_accuracy": 0.1}) + "\n")
  with pytest.raises(report.ReportError, match="is a run directory"):
    report.build(run_dir, io.config_json(api_config(spec)))


def test_alignment_report_without_pairs_says_so_while_members_run_and_is_an_error_once_all_finished(tmp_path):
  # A sweep in progress (one member still running, no FedPSA pairs yet): the report is written, and says why
  # there is no figure yet; the same sweep with every member finished and still no pair is misconfigured.
  status = lambda m: {"status": "running" if m.labels["seed"] == 1 else "completed"}
  workdir = _fake_members(tmp_path, "running", "configs/paper/fig6.py:smoke,seeds=2", status, lambda m: [])
  assert "alignment.png" not in _report_files(workdir, report.build(workdir))
  text = open(os.path.join(workdir, "report", "alignment.md")).read()
  assert text.startswith("# ")
  assert "No κ-alignment pairs yet: 1 of 2 members have completed, and their events.jsonl files hold none" in text
  running = lambda m: {"status": "running"}
  workdir = _fake_members(tmp_path, "started", "configs/paper/fig6.py:smoke,seeds=2", running, lambda m: [])
  report.build(workdir)
  text = open(os.path.join(workdir, "report", "alignment.md")).read()
  assert "No κ-alignment pairs yet: none of the 2 members has completed. Rerun" in text
  workdir = _fake_members(tmp_path, "finished", "configs/paper/fig6.py:smoke,seeds=2", lambda m: {}, lambda m: [])
  with pytest.raises(report.ReportError, match="no κ-alignment pairs .* fedpsa.log_alignment=True"):
    report.build(workdir)


# --- report kinds ---------------------------------------------------------------------------------------


def test_report_kinds_are_the_generic_ones_and_the_plugins():
  kinds = report.report_kinds()
  assert sorted(kinds) == ["alignment", "curves", "heatmap", "overhead", "table"]
  assert kinds["overhead"] is fedpsa_figures.overhead_report and kinds["alignment"] is fedpsa_figures.alignment_report
  assert all(kinds[k] is report.GENERIC_KINDS[k] for k in ("table", "curves", "heatmap"))


def _fake_sweep_of_kind(tmp_path, kind: str) -> str:
  accs = {(m, d, s): 0.5 for m in ("fedbuff", "fedpac", "fedpsa") for d in ("mnist", "fashion_mnist") for s in (0, 1)}
  workdir = _fake_sweep(tmp_path, accs)
  path = os.path.join(workdir, sweep.SWEEP_FILE)
  saved = json.load(open(path))
  saved["sweep"]["report"]["kind"] = kind
  io.write_json_atomic(path, saved)
  return workdir


def test_an_unknown_report_kind_is_an_error_naming_the_allowed_ones(tmp_path):
  workdir = _fake_sweep_of_kind(tmp_path, "scatter")
  with pytest.raises(report.ReportError,
                     match=r"report.kind='scatter' is invalid; allowed: alignment, curves, heatmap, overhead, table$"):
    report.build(workdir)
  assert not os.path.exists(os.path.join(workdir, "report"))  # refused before any file is written


def test_sweep_report_dispatches_to_a_plugin_kind(tmp_path, monkeypatch):
  """A plug-in's kind runs after the table, with the sweep's layout, and its paths come back in order."""
  seen = []

  def scatter(r: report.SweepReport) -> list[str]:
    seen.append(r)
    return [report_lib.write_text(r.path("scatter.md"), r.title + "x\n")]

  plugin = types.SimpleNamespace(REPORT_KINDS={"scatter": scatter})
  monkeypatch.setattr(figures, "modules", lambda: [types.SimpleNamespace(), plugin])
  workdir = _fake_sweep_of_kind(tmp_path, "scatter")
  assert _report_files(workdir, report.build(workdir)) == ["members.csv", "table.md", "table.csv", "table_ci95.csv",
                                                           "table_n.csv", "scatter.md"]
  (r,) = seen
  assert (r.sweep_dir, r.out, r.spec["kind"], r.spec["rows"]) == (workdir, os.path.join(workdir, "report"), "scatter",
                                                                  ["method"])
  # members.csv names each run relative to the sweep directory (no path of the machine that ran it).
  listed = pd.read_csv(os.path.join(workdir, "report", "members.csv"))
  assert list(listed["run_dir"]) == [os.path.relpath(d, workdir) for d in r.frame["run_dir"]]
  assert all(not os.path.isabs(d) and os.path.isdir(os.path.join(workdir, d)) for d in listed["run_dir"])
  assert len(r.frame) == 10 and r.title.startswith("# fake: Fake table")
  # Two plug-ins defining one kind, or a plug-in redefining a generic one, is refused, not resolved by order.
  monkeypatch.setattr(figures, "modules", lambda: [plugin, types.SimpleNamespace(__name__="other", REPORT_KINDS={
      "scatter": scatter})])
  with pytest.raises(ValueError, match="report kind 'scatter' is defined twice"):
    report.report_kinds()
  monkeypatch.setattr(figures, "modules", lambda: [types.SimpleNamespace(REPORT_KINDS={"table": scatter})])
  with pytest.raises(report.ReportError, match="redefine the generic report kinds"):
    report.report_kinds()


@pytest.mark.slow
def test_report_and_its_plugins_need_no_jax():
  code = ("import sys\n"
          "import fedpsa_lab.report as report, fedpsa_lab.figures.fedpsa\n"
          "assert sorted(report.report_kinds()) == ['alignment', 'curves', 'heatmap', 'overhead', 'table']\n"
          "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'fedpsa_jax.sim', "
          "'fedpsa_jax.strategies'))))\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_plugins_and_report_lib_do_not_import_the_report_driver():
  """Reports import one way: report_lib <- figures/ <- report, so a plug-in can never loop back into the driver."""
  code = ("import sys\n"
          "import fedpsa_lab.report_lib, fedpsa_lab.figures as figures\n"
          "figures.modules()\n"
          "print('fedpsa_lab.report' in sys.modules)\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "False"


# --- uncertainty: intervals, paired comparisons with a reference, bands, provenance ------------------


def test_interval_and_paired_difference_agree_with_scipy():
  from fedpsa_lab import report_stats

  values = np.array([91.0, 93.5, 92.25, 95.0])
  got = report_stats.interval(values)
  low, high = scipy.stats.t.interval(0.95, 3, loc=values.mean(), scale=scipy.stats.sem(values))
  assert (got.mean, got.n) == (pytest.approx(values.mean()), 4) and got.half_width == pytest.approx((high - low) / 2)
  one = report_stats.interval([0.5])
  assert one.mean == 0.5 and math.isnan(one.half_width)
  a, b = {0: 90.0, 1: 92.0, 2: 91.0, 7: 50.0}, {0: 88.0, 1: 91.5, 2: 88.0, 3: 10.0}  # seeds 7 and 3 have no pair
  d = report_stats.paired_difference(a, b)
  diffs = np.array([2.0, 0.5, 3.0])
  t = diffs.mean() / (diffs.std(ddof=1) / math.sqrt(3))  # by hand: the paired t statistic, two-sided p
  assert d.diff.n == 3 and d.diff.mean == pytest.approx(diffs.mean())
  assert d.p_value == pytest.approx(2 * scipy.stats.t.sf(abs(t), 2))
  assert report_stats.paired_difference({0: 1.0}, {0: 0.0}).direction == 0  # one pair: never significant
  assert report_stats.paired_difference({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}).direction == 1  # a constant gap


def test_holm_agrees_with_a_hand_computation_and_with_the_step_down_rule():
  from fedpsa_lab import report_stats

  # Sorted: 0.005 × 4 = 0.02, 0.01 × 3 = 0.03, 0.03 × 2 = 0.06, 0.04 × 1 = 0.04, raised to the running max 0.06.
  got = report_stats.holm([0.01, 0.04, math.nan, 0.03, 0.005])
  np.testing.assert_allclose(got, [0.03, 0.06, math.nan, 0.06, 0.02])
  assert report_stats.holm([0.6, 0.9]).tolist() == [1.0, 1.0] and report_stats.holm([]).size == 0
  rng = np.random.default_rng(0)
  for _ in range(200):  # Holm's rule as stated: reject the i-th smallest iff every j ≤ i has p_(j) ≤ α / (m − j + 1)
    p = rng.uniform(0, 0.2, rng.integers(1, 12))
    p[rng.uniform(size=p.size) < 0.2] = math.nan
    present = np.flatnonzero(~np.isnan(p))
    order, m = present[np.argsort(p[present])], len(present)
    adjusted = report_stats.holm(p)
    for alpha in (0.01, 0.05, 0.1):
      rejected, still = set(), True
      for j, i in enumerate(order):
        still = still and p[i] <= alpha / (m - j)
        if still:
          rejected.add(int(i))
      assert set(np.flatnonzero(adjusted <= alpha).tolist()) == rejected


def test_holm_agrees_with_statsmodels(monkeypatch):
  import gc

  from statsmodels.stats.multitest import multipletests
  from fedpsa_lab import report_stats

  # statsmodels' Holm calls gc.collect() each time (seconds in a worker that holds JAX runs); its values do not
  # depend on it.
  monkeypatch.setattr(gc, "collect", lambda *args: 0)
  rng = np.random.default_rng(1)
  for _ in range(200):
    p = rng.uniform(0, 0.3, rng.integers(1, 12))
    p[rng.uniform(size=p.size) < 0.3] *= 1e-3  # some far below the thresholds
    np.testing.assert_allclose(report_stats.holm(p), multipletests(p, method="holm")[1], rtol=1e-12, atol=0)


PUBLISHED = {"source": "Paper, Table 9", "metric": "final_test_accuracy",
             "values": [["fedbuff", "0.1", 98.0], ["fedbuff", "1.0", 97.0], ["fedasync", "0.1", 95.0],
                        ["fedasync", "1.0", 97.5], ["fedpsa", "0.1", 98.5]]}  # FedAsync > FedBuff at α = 1.0: reversed


def _reference_sweep(tmp_path, accuracy_of) -> str:
  """A table1-like fake sweep (methods × α × 3 seeds) with a FedBuff reference and a second metric."""
  base = config_lib.base_config()
  config = paper.sweep_config("ref", "Reference table", base,
                              [paper.method_axis(("fedbuff", "fedasync", "fedpsa")), paper.alpha_axis((0.1, 1.0))],
                              [0, 1, 2], {"rows": ["method"], "cols": ["alpha"], "reference": {"method": "fedbuff"},
                                          "more_metrics": ["aulc_per_day"], "published": PUBLISHED})
  workdir = str(tmp_path / "ref")
  for m, run_dir in fake_members(config, workdir):
    acc = accuracy_of(m.labels["method"], m.labels["alpha"], m.labels["seed"])
    io.write_json_atomic(os.path.join(run_dir, "summary.json"), {
        "status": "completed", "final_test_accuracy": acc, "aulc_per_day": acc / 2, "wall_seconds": 1800.0,
        "provenance": {"code": {"commit": "abc" if m.labels["seed"] < 2 else "def", "dirty": False},
                       "data": {"name": "mnist_5k", "fingerprint": "f00"},
                       "machine": {"cpu": "CPU X", "cores": 2, "backend": "cpu", "devices": "1 × cpu", "jax": "0.1",
                                   # seed 0 from before vector_isa was recorded; seed 2 with XLA held to AVX2
                                   **({} if m.labels["seed"] == 0 else {"vector_isa": "AVX-512", "xla_flags": (
                                       "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=2"
                                       if m.labels["seed"] == 2 else "--xla_force_host_platform_device_count=2")})}}})
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      for day, scale in ((0.0, 0.2), (0.1, 1.0)):
        f.write(json.dumps({"day": day, "test_accuracy": acc * scale}) + "\n")
  return workdir


@pytest.mark.slow
def test_reference_marks_only_differences_larger_than_the_noise(tmp_path):
  seed_effect = {0: 0.0, 1: 0.05, 2: -0.04}  # shared by every method of a seed: what pairing removes
  gap = {"fedbuff": {0: 0.0, 1: 0.0, 2: 0.0}, "fedasync": {0: -0.031, 1: -0.029, 2: -0.030},  # always lower
         "fedpsa": {0: 0.02, 1: -0.03, 2: 0.01}}  # as often above as below: noise

  workdir = _reference_sweep(tmp_path, lambda m, a, s: 0.8 + seed_effect[s] + gap[m][s] + (0.01 if a == 1.0 else 0))
  written = _report_files(workdir, report.build(workdir))
  assert {"paired.md", "paired.csv", "table_aulc_per_day.csv", "table_aulc_per_day_ci95.csv", "paired_over_columns.csv",
          "paired.png"} <= set(written)
  assert os.path.getsize(os.path.join(workdir, "report", "paired.png")) > 10_000
  markdown = open(os.path.join(workdir, "report", "table.md")).read()
  rows = {}  # each method's rows of both tables
  for line in markdown.splitlines():
    if line.startswith("| Fed"):
      rows[line.split(" | ")[0][2:]] = rows.get(line.split(" | ")[0][2:], "") + line
  assert rows["FedAsync"].count("▼") == 4 and "▲" not in rows["FedAsync"]  # 2 columns × 2 metrics
  assert "▼" not in rows["FedPSA (Ours)"] and "▲" not in rows["FedPSA (Ours)"]
  assert "▲" not in rows["FedBuff (Base)"] and "▼" not in rows["FedBuff (Base)"]
  assert "## AULC per virtual day" in markdown and "paired t-test over the same seeds" in markdown
  paired = pd.read_csv(os.path.join(workdir, "report", "paired.csv"))
  row = paired[(paired.method == "fedpsa") & (paired.column == "α=0.1") & (paired.metric == "final_test_accuracy")]
  diffs = 100 * np.array([0.02, -0.03, 0.01])
  assert row.difference.item() == pytest.approx(diffs.mean())
  assert row.p_value.item() == pytest.approx(scipy.stats.ttest_rel(diffs, np.zeros(3)).pvalue)
  for _, rows in paired.groupby("metric"):  # Holm over each metric's table: the smallest p times their number
    first = rows.p_value.idxmin()
    assert rows.p_holm[first] == pytest.approx(min(1.0, rows.p_value.notna().sum() * rows.p_value[first]))
    assert (rows.p_holm >= rows.p_value).all()
  paired_md = open(os.path.join(workdir, "report", "paired.md")).read()
  assert "within the noise" in paired_md and "| p (unadjusted) | p (Holm) | seeds | verdict |" in paired_md
  for text in (markdown, paired_md):  # the title, one blank line, then the first section
    assert text.startswith("# ") and "\n\n\n" not in text and text.split("\n")[1] == ""
  # Beside the published Δ: FedAsync's significant drop holds at α = 0.1 and reverses the paper at α = 1.0;
  # FedPSA's noise resolves nothing; the published table sits under ours, only in the accuracy's section.
  line = lambda method, column: next(l for l in paired_md.splitlines() if l.startswith(f"| {method} | {column} |"))
  assert line("FedAsync", "α=0.1").endswith("| lower | -3.00 | holds |")
  assert line("FedAsync", "α=1.0").endswith("| lower | +0.50 | reversed |")
  assert line("FedPSA (Ours)", "α=0.1").endswith("| +0.50 | not resolved |")
  assert line("FedPSA (Ours)", "α=1.0").endswith("| within the noise | - | - |")  # no published value
  assert markdown.count("Published (Paper, Table 9):") == 1
  assert "| FedBuff (Base) | 98.00 | 97.00 |" in markdown and "| FedPSA (Ours) | **98.50** | - |" in markdown
  # Provenance: both commits with their member counts, one data fingerprint, the summed wall time.
  assert "commit abc (12 members); commit def (6 members)" in markdown
  # Machines told apart by their vector instruction set and XLA's cap on it (one model name covers both).
  assert ("- Machine: CPU X (2 cores), cpu: 1 × cpu, jax 0.1 (6 members); CPU X, AVX-512 (2 cores), cpu: 1 × cpu, "
          "jax 0.1 (6 members); CPU X, AVX-512 (XLA held to AVX2) (2 cores), cpu: 1 × cpu, jax 0.1 (6 members)\n"
          in markdown)
  # Over both columns at once, the seed as the unit: FedAsync's seeds differ by −3.1, −2.9, −3.0 points in both
  # columns (the α offset cancels in the pairs), so its seed means are those three: a one-sample t-test on 2
  # degrees of freedom, SE = 0.1 / √3 (not the 6 pairs as if independent).
  over = pd.read_csv(os.path.join(workdir, "report", "paired_over_columns.csv"))
  fedasync = over[(over.method == "fedasync") & (over.metric == "final_test_accuracy")]
  assert fedasync[["n_columns", "seeds", "pairs", "above", "below"]].to_numpy().tolist() == [[2, 3, 6, 0, 6]]
  assert fedasync.difference.item() == pytest.approx(-3.0)
  assert fedasync.p_value.item() == pytest.approx(2 * scipy.stats.t.sf(3.0 / (0.1 / math.sqrt(3)), 2))
  assert fedasync.p_value.item() == pytest.approx(scipy.stats.ttest_1samp([-3.1, -2.9, -3.0], 0).pvalue)
  for _, rows in over.groupby("metric"):  # Holm over each metric's rows
    np.testing.assert_allclose(rows.p_holm, report_stats.holm(rows.p_value.to_numpy()))
  assert "### Over all columns at once" in paired_md
  pooled_line = lambda method: next(l for l in paired_md.split("### Over all columns at once")[1].splitlines()
                                    if l.startswith(f"| {method} | 2 |"))
  assert pooled_line("FedAsync").endswith("| 3 | 0 / 6 | lower | -1.25 | holds |")  # published: (−3 + 0.5) / 2
  assert "| 3 | 4 / 2 | within the noise | - | - |" in pooled_line("FedPSA (Ours)")  # +2, −3, +1 twice; no α=1.0 paper
  assert "mnist_5k f00 (18 members)" in markdown and "9.00 h of wall time" in markdown


@pytest.mark.slow
def test_one_seed_says_so_and_curves_get_a_band_with_several(tmp_path):
  workdir = _reference_sweep(tmp_path, lambda m, a, s: 0.5 + 0.01 * s)
  frame = report.load_members(workdir)[1]
  curves = report_lib._seed_curves(frame[frame["label:method"] == "fedpsa"].iloc[:3])["test_accuracy"]
  # [day, seed] of fedpsa's three seeds at α = 0.1: the table each curve's mean and band are drawn from
  assert list(curves.index) == [0.0, 0.1] and list(curves.columns) == [0, 1, 2]
  assert curves.loc[0.1].tolist() == pytest.approx([0.5, 0.51, 0.52])
  for name in os.listdir(os.path.join(workdir, "runs")):
    if not name.endswith("seed=0"):
      os.remove(os.path.join(workdir, "runs", name, "summary.json"))
  report.build(workdir)
  markdown = open(os.path.join(workdir, "report", "table.md")).read()
  assert "One seed per cell: no interval and no significance can be stated." in markdown
  assert "±" not in markdown and "▲" not in markdown and "▼" not in markdown


@pytest.mark.slow
def test_curve_bands_stay_within_what_an_accuracy_can_be(tmp_path, monkeypatch):
  spread = {0: 0.1, 1: 0.55, 2: 0.99}  # three seeds this far apart: a t-interval reaching past 0 and 100
  workdir = _reference_sweep(tmp_path, lambda m, a, s: spread[s] if m == "fedpsa" else 0.5 + 0.01 * s)
  bands = []
  monkeypatch.setattr(matplotlib.axes.Axes, "fill_between",
                      lambda self, x, low, high, **kw: bands.append((np.asarray(low), np.asarray(high))))
  sweep_config, frame = report.load_members(workdir)  # curves.png alone (the paired curves have bands of their own)
  report_lib.curves_figure(sweep_config, frame, sweep_config["report"], ["alpha"], "method", str(tmp_path / "c.png"))
  finals = 100 * np.array(list(spread.values()))
  mean, half = finals.mean(), report_stats_half(finals)
  assert mean - half < 0 and mean + half > 100  # the unclipped band would leave the axis' range
  assert len(bands) == 6 and all(low.min() >= 0 and high.max() <= 100 for low, high in bands)
  assert sum(low[1] == 0 and high[1] == 100 for low, high in bands) == 2  # FedPSA at both α, clipped both ways
  fedbuff = 100 * np.array([0.5, 0.51, 0.52])  # unclipped where it fits: mean ± half, as before
  assert any(low[1] == pytest.approx(fedbuff.mean() - report_stats_half(fedbuff)) for low, _ in bands)


def report_stats_half(values: np.ndarray) -> float:
  low, high = scipy.stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=scipy.stats.sem(values))
  return (high - low) / 2


# --- what the report cannot read or write: one line, exit 2 or 3 ------------------------------------------


def _run_dir(tmp_path, metrics: str) -> str:
  """A run directory holding a summary, a config and this metrics.jsonl text (no training)."""
  run_dir = str(tmp_path / "run")
  rundir = io.RunDir(run_dir)
  rundir.write_config(small_config("fedbuff"))
  rundir.write_summary({"status": "completed", "method": "fedbuff", "dataset": "mnist_5k"})
  rundir.close()
  (tmp_path / "run" / "metrics.jsonl").write_text(metrics)
  return run_dir


GOOD_METRICS = '{"day": 0.0, "test_accuracy": 0.1}\n{"day": 0.01, "test_accuracy": 0.3}\n'


def _report_as_launch(workdir: str) -> tuple[int, list[str]]:
  """What `launch.py --mode=report --workdir=WORKDIR` does: its exit code and its lines on stderr."""
  import io as std_io

  from fedpsa_jax import cli

  stderr = std_io.StringIO()
  return cli.exit_code_of(lambda: lab_modes.run_report(workdir), stderr=stderr), stderr.getvalue().splitlines()


def _foreign_sweep(tmp_path) -> str:
  (tmp_path / "sweep.json").write_text('{"hello": "world"}')
  return str(tmp_path)


def _metrics(text):
  return lambda tmp_path: _run_dir(tmp_path, text)


def _summary_list(tmp_path) -> str:
  run_dir = _run_dir(tmp_path, GOOD_METRICS)
  with open(os.path.join(run_dir, "summary.json"), "w") as f:
    f.write("[1]")
  return run_dir


@pytest.mark.parametrize("make,expected", [
    (_foreign_sweep, "sweep.json: its 'sweep' is not an object with 'name' and a list 'axes'; allowed: a sweep.json as "
     "--mode=sweep writes it"),
    (_metrics('[1, 2]\n[3, 4]\n'), "metrics.jsonl: line 1 is a JSON array, not an object; allowed: one JSON object "
     "per line with the fields day, test_accuracy"),
    (_metrics('{"x": 1}\n{"x": 2}\n'), "metrics.jsonl: line 1 lacks the field(s) day, test_accuracy"),
    (_summary_list, "summary.json holds a JSON array, not an object; allowed: a run's summary"),
], ids=["a foreign sweep.json", "metrics lines that are not objects", "metrics lines without the fields",
        "a summary that is not an object"])
def test_report_on_what_it_cannot_read_is_one_line_exit_2(tmp_path, make, expected):
  code, lines = _report_as_launch(make(tmp_path))
  assert code == 2 and len(lines) == 1 and expected in lines[0], lines


@pytest.mark.parametrize("err,advice", [
    (OSError(30, "Read-only file system"), "(EROFS); the file system is read-only; allowed: a --workdir on a "
     "writable file system"),
    (OSError(28, "No space left on device"), "(ENOSPC); make room and rerun the same command"),
], ids=["read-only", "full"])
def test_report_that_cannot_be_written_is_one_line_exit_3(tmp_path, monkeypatch, err, advice):
  """A read-only run directory (a copy from a colleague's mount) or a full disk: the report's first write
  fails; one line naming the path and the cause, exit 3."""
  run_dir = _run_dir(tmp_path, GOOD_METRICS)
  out = os.path.join(run_dir, report.REPORT_DIR)
  real_makedirs = os.makedirs

  def refuse(path, *args, **kwargs):
    if os.path.abspath(path) == out:
      raise type(err)(err.errno, err.strerror, path)
    return real_makedirs(path, *args, **kwargs)

  monkeypatch.setattr(os, "makedirs", refuse)
  code, lines = _report_as_launch(run_dir)
  assert code == 3 and len(lines) == 1 and lines[0].startswith(f"cannot write {out}: {err.strerror} {advice}"), lines


def test_markers_and_verdicts_read_holms_p_not_the_unadjusted_one(tmp_path):
  # FedPSA at α = 0.1 is above FedBuff by 1.0, 1.4, 0.7 points: paired p = 0.036 alone, but the third smallest
  # of the table's four comparisons, so Holm's p = 2 × 0.036 = 0.073: no ▲, and 'within the noise'.
  gap = {"fedbuff": [0.0] * 3, "fedasync": [-0.031, -0.029, -0.030], "fedpsa": [0.010, 0.014, 0.007]}
  noise = {"fedbuff": [0.0] * 3, "fedasync": [0.0] * 3, "fedpsa": [0.002, -0.003, 0.004]}
  workdir = _reference_sweep(tmp_path, lambda m, a, s: 0.8 + (gap[m][s] if a == 0.1 or m != "fedpsa" else noise[m][s]))
  report.build(workdir)
  paired = pd.read_csv(os.path.join(workdir, "report", "paired.csv")).query("metric == 'final_test_accuracy'")
  cell = paired[(paired.method == "fedpsa") & (paired.column == "α=0.1")].iloc[0]
  assert cell.p_value == pytest.approx(scipy.stats.ttest_1samp([1.0, 1.4, 0.7], 0).pvalue, rel=1e-6)
  assert cell.p_value < 0.05 < cell.p_holm == pytest.approx(2 * cell.p_value, rel=1e-6)
  table = open(os.path.join(workdir, "report", "table.md")).read().split("## AULC")[0]
  fedpsa_row = next(l for l in table.splitlines() if l.startswith("| FedPSA"))
  assert "▲" not in fedpsa_row and "▼" not in fedpsa_row
  assert next(l for l in table.splitlines() if l.startswith("| FedAsync")).count("▼") == 2
  paired_md = open(os.path.join(workdir, "report", "paired.md")).read()
  assert next(l for l in paired_md.splitlines() if l.startswith("| FedPSA (Ours) | α=0.1 |")).count("within the noise") == 1


def test_a_report_title_says_what_the_members_ran():
  # The smoke variant of Table 1 keeps the paper's description ("after 10 days") but runs 0.01 virtual day.
  smoke = io.config_json(config_lib.load_file(os.path.join(ROOT, "configs", "paper", "table1.py") + ":smoke"))
  assert "10 days" in smoke["description"] and report._as_run(smoke) == " (as run: 0.01 virtual days)"
  one_day = {"base": {"sim": {"virtual_days": 1.0}, "data": {"name": "mnist_5k"}}, "axes": [["method", [["a", {}]]]]}
  assert report._as_run(one_day) == " (as run: 1 virtual day on mnist_5k)"
  varied = {**one_day, "axes": [["dataset", [["m", {"data.name": "mnist"}], ["f", {"data.name": "fashion_mnist"}]]]]}
  assert report._as_run(varied) == " (as run: 1 virtual day)"  # the data differs between members: not named
