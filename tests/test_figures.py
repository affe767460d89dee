"""What a reader of the report's figures can rely on (fedpsa_lab/report_lib.py, fedpsa_lab/figures/): one line per
arm under its printed name, a band that says what it is, units on the axes, accuracy in %, one legend below the
panels, one size and font, a colour-blind-safe palette with line styles, a PDF beside every PNG, redrawn byte for
byte; and, for a sweep with a reference arm, each arm's paired difference from it over time.

The figures are inspected as matplotlib Figure objects, caught where every figure ends (`report_lib.save_figure`)."""

from __future__ import annotations

import json
import os
import re

import matplotlib.axes
import numpy as np
import pytest
import scipy.stats

from fedpsa_jax import config as config_lib
from fedpsa_jax import io
from fedpsa_lab import report, report_lib
from fedpsa_lab.figures import aifed

from helpers import ROOT, fake_members

# Shape_step's arms, as its tables print them (configs/results/shape_step.py).
ARMS = {"fedbuff": "FedBuff", "fedbuff_unit": "FedBuff, Σw = 1", "uniform_stale": "Uniform, FedBuff's Σw",
        "uniform_unit": "Uniform, Σw = 1", "fedpsa_stale": "FedPSA, FedBuff's Σw", "fedpsa": "FedPSA"}
# What no reader should meet: a config field (`fedbuff.step`), a `_`-joined identifier (`fedbuff_unit`, `cost_a`).
INTERNAL = re.compile(r"\b[A-Za-z]+_\w+\b|\b[a-z]+\.[a-z_]+\b")
UNIT = re.compile(r"\((%|percentage points|days|MiB)\)$")
DAYS = (0.0, 0.05, 0.1)


def _accuracy(arm: str, alpha: float, seed: int, day: float) -> float:
  """Curves that differ by arm, α, seed and day; the arms further apart in seed 1 than in seed 0."""
  return 0.1 + 6 * day + 0.02 * list(ARMS).index(arm) * (1 + seed) + 0.05 * alpha + 0.03 * seed


@pytest.fixture(scope="module")
def shape_step(tmp_path_factory) -> str:
  """A sweep directory of configs/results/shape_step.py with 2 seeds, its members' records made up (no training)."""
  config = config_lib.load_file(os.path.join(ROOT, "configs", "results", "shape_step.py") + ":seeds=2")
  workdir = str(tmp_path_factory.mktemp("figures") / "shape_step")
  for m, run_dir in fake_members(config, workdir):
    curve = [_accuracy(m.labels["method"], m.labels["alpha"], m.labels["seed"], d) for d in DAYS]
    io.write_json_atomic(os.path.join(run_dir, "summary.json"), {
        "status": "completed", "final_test_accuracy": curve[-1], "aulc_per_day": float(np.mean(curve))})
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps({"day": d, "test_accuracy": a, "bytes_uploaded": int(d * 2**30)}) + "\n"
                   for d, a in zip(DAYS, curve))
  return workdir


@pytest.fixture(scope="module")
def built(shape_step) -> dict:
  """shape_step's report built once for the tests below (a build takes seconds): the files written and their
  bytes, every figure as drawn ({file name: Figure}, left open), and every band ((Axes, low, high))."""
  figures, bands = {}, []
  save, fill_between = report_lib.save_figure, matplotlib.axes.Axes.fill_between
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(report_lib, "save_figure",
                  lambda fig, path: figures.update({os.path.basename(path): fig}) or save(fig, path))
    patch.setattr(matplotlib.axes.Axes, "fill_between",
                  lambda self, x, low, high, **kw: bands.append((self, np.asarray(low), np.asarray(high)))
                  or fill_between(self, x, low, high, **kw))
    written = report.build(shape_step)
  data = {p: open(p, "rb").read() for p in written if p.endswith((".png", ".pdf"))}
  return {"written": written, "bytes": data, "drawn": figures, "bands": bands}


@pytest.fixture
def drawn(monkeypatch) -> dict:
  """{file name: Figure} of every figure drawn, caught before it is saved (and left open to inspect)."""
  figures = {}
  monkeypatch.setattr(report_lib, "save_figure", lambda fig, path: figures.update({os.path.basename(path): fig})
                      or [path])
  return figures


def _texts(fig) -> list:
  """Every text of `fig` a reader sees: titles, axis labels, tick labels, the legends' entries and titles."""
  texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
  texts += [t for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
  texts += [t for legend in fig.legends for t in [legend.get_title(), *legend.get_texts()]]
  return [t for t in texts if t.get_text()]


def _legend(fig) -> list[str]:
  return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


@pytest.mark.slow
def test_every_figure_of_a_sweep_reads_without_the_code(built):
  drawn = built["drawn"]
  assert set(drawn) == {"curves.png", "curves_paired.png", "accuracy_vs_upload.png", "paired.png"}
  for name, fig in drawn.items():
    fig.canvas.draw()  # (lays the figure out: the legend's place is known after)
    words = [t.get_text() for t in _texts(fig)]
    assert not [w for w in words if INTERNAL.search(re.sub(r"\$[^$]*\$", "", w))], (name, words)
    # One legend, below every panel: it hides no line.
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes), name
    top = fig.legends[0].get_window_extent().y1
    assert all(top <= ax.get_window_extent().y0 for ax in fig.axes), name
    # One size and one font for every figure.
    assert fig.get_figwidth() == report_lib.FIGURE_WIDTH, name
    assert {t.get_fontsize() for t in _texts(fig)} == {report_lib.FONT_SIZE}, name
    for ax in fig.axes:
      assert UNIT.search(ax.get_xlabel()), (name, ax.get_xlabel())  # every axis with a quantity has its unit
      assert not ax.get_ylabel() or UNIT.search(ax.get_ylabel()), (name, ax.get_ylabel())
      if "accuracy" in ax.get_ylabel() and "Δ" not in ax.get_ylabel():  # accuracy in %, as the tables print it
        assert ax.get_ylabel().endswith("(%)") and max(max(line.get_ydata()) for line in ax.lines) > 1, name
  names = list(ARMS.values())
  for name in ("curves.png", "accuracy_vs_upload.png"):
    assert _legend(drawn[name]) == names, name  # one line per arm, mean over seeds, under its printed name
    assert [len(ax.lines) for ax in drawn[name].axes] == [6, 6]
  assert _legend(drawn["curves_paired.png"]) == ["FedBuff (the reference)", *names[1:]]
  for name in ("curves.png", "accuracy_vs_upload.png", "curves_paired.png", "paired.png"):
    assert "95% t-interval over seeds" in " ".join([drawn[name].legends[0].get_title().get_text(),
                                                    *_legend(drawn[name])]), name  # the band says what it is
  # Colour-blind-safe colours, and a line style of its own per arm (greyscale print tells them apart too).
  lines = [line for ax in drawn["curves.png"].axes for line in ax.lines]
  assert {line.get_color() for line in lines} <= set(report_lib.OKABE_ITO)
  # (A dash pattern's tuple: get_linestyle names every custom pattern '--'.)
  assert len({str(line._unscaled_dash_pattern) for line in drawn["curves.png"].axes[0].lines}) == 6


@pytest.mark.slow
def test_paired_curves_are_differences_within_each_seed_with_a_band_over_seeds(built):
  drawn, bands = built["drawn"], built["bands"]
  fig = drawn["curves_paired.png"]
  assert [ax.get_title() for ax in fig.axes] == ["α=0.1", "α=1.0"]  # α as panels
  line = next(line for line in fig.axes[0].lines if line.get_label() == "FedPSA")
  # Each seed's FedPSA − FedBuff, at every day: 10 points in seed 0, 20 in seed 1 (whose curves also lie 3 points
  # higher, which the difference within the seed removes): mean 15 ± scipy's t-interval of (10, 20).
  diffs = np.array([100 * 0.02 * 5 * (1 + s) for s in (0, 1)])
  low, high = scipy.stats.t.interval(0.95, 1, loc=diffs.mean(), scale=scipy.stats.sem(diffs))
  np.testing.assert_allclose(line.get_xdata(), DAYS)
  np.testing.assert_allclose(line.get_ydata(), [15.0] * len(DAYS))
  (band_low, band_high), = [(lo, hi) for ax, lo, hi in bands if ax is fig.axes[0]][-1:]
  np.testing.assert_allclose(band_low, [low] * len(DAYS))
  np.testing.assert_allclose(band_high, [high] * len(DAYS))


@pytest.mark.slow
def test_figures_are_png_and_pdf_and_redraw_byte_for_byte(shape_step, built):
  pngs = [p for p in built["written"] if p.endswith(".png")]
  assert pngs and all(os.path.splitext(p)[0] + ".pdf" in built["written"] for p in pngs)
  assert all(data[:4] == b"%PDF" for p, data in built["bytes"].items() if p.endswith(".pdf"))
  report.build(shape_step)
  assert all(open(p, "rb").read() == data for p, data in built["bytes"].items())  # no date, no version in the bytes


def test_accuracy_vs_upload_of_runs_outside_a_sweep_is_one_line_per_method(tmp_path, drawn):
  # A sweep's 39 runs once drew 39 raw-named lines: now one per method, under its printed name, mean over its runs.
  runs = []
  for i, method in enumerate(["fedbuff", "fedpsa", "fedasync"] * 13):
    run_dir = tmp_path / f"run{i}"
    run_dir.mkdir()
    io.write_json_atomic(str(run_dir / "summary.json"), {"status": "completed", "method": method})
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"day": d, "test_accuracy": 0.1 + 0.1 * d * (i % 3), "bytes_uploaded": int(2**20 * d)}) + "\n"
        for d in range(4)))
    runs.append(str(run_dir))
  aifed.group_figures(runs, str(tmp_path / "figs"))
  fig = drawn["accuracy_vs_upload.png"]
  assert _legend(fig) == ["FedBuff (Base)", "FedPSA (Ours)", "FedAsync"] and len(fig.axes[0].lines) == 3
  assert fig.axes[0].get_xlabel() == "accumulated upload (MiB)" and fig.axes[0].get_ylabel() == "test accuracy (%)"
  np.testing.assert_allclose(fig.axes[0].lines[1].get_xdata(), [0, 1, 2, 3])  # MiB
  np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), [10, 20, 30, 40])  # %


def test_no_two_of_the_first_64_arms_look_alike_and_the_first_8_keep_their_styles():
  styles = [report_lib.arm_style(i) for i in range(64)]
  assert len({(s["color"], str(s["linestyle"])) for s in styles}) == 64
  assert styles[:8] == [{"color": c, "linestyle": l} for c, l in zip(report_lib.OKABE_ITO, report_lib.LINE_STYLES)]
