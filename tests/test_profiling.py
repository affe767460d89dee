"""`--mode=profile` and the Python profiler: every piece present, costs consistent with each other."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import subprocess
import sys

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import compiles, perfetto, profilers, profiling, sensitivity, strategies
from fedpsa_jax.profilers import fedpsa as fedpsa_profiler
import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def perfetto_slices(trace_dir) -> tuple[str, list[dict]]:
  """The one Perfetto file of a `jax.profiler` trace folder and its complete events (slices), parsed here."""
  path, = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  return path, [e for e in events if e.get("ph") == "X"]


@pytest.mark.slow
def test_launch_profile_writes_every_piece_and_a_perfetto_slice_of_each(tmp_path):
  workdir = tmp_path / "prof"
  # (the per-sample Fisher in one chunk: at the default 8, its 512-sample row compiles 64 chunks, 8 s of this test)
  proc = forked_launch.launch("--config=configs/default.py", "--mode=profile", "--profile_repeats=1",
                              "--profile_trace", "--config.model.name=linear",
                              "--config.runtime.fisher_chunk_size=512", f"--workdir={workdir}", timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  written = json.load(open(workdir / "profile.json"))
  rows, origin = written["rows"], written["provenance"]
  assert origin["repeats"] == 1 and origin["config"]["model"]["name"] == "linear" and origin["machine"]["cores"]
  pieces = {(r["piece"], r.get("calibration")) for r in rows}
  for size in fedpsa_profiler.CALIBRATION_SIZES:
    for piece in ("fisher_per_sample", "fisher_factored", "sensitivity_eq8"):
      assert (piece, size) in pieces
  names = {r["piece"] for r in rows}
  assert {"sgd_step", "client_update", "sketch", "evaluate", "client_sensitivity_sketch"} <= names
  # FedPAC has no feature extractor on the linear model; every other method's server step is there.
  for method in strategies.registered():
    assert (f"server_step/{method}" in names) == (method != "fedpac"), method
  for r in rows:
    assert r["ms"] > 0, r
    # FedPAC's QP, CASA's clustering and AiFed's "was anything sent?" run on the host: timed, not traced.
    if r["piece"] not in ("server_step/fedpac", "server_step/casa", "server_step/aifed"):
      assert r["gflops"] > 0, r
  assert "client_update" in proc.stdout and "GFLOP" in proc.stdout and "compile s" in proc.stdout
  assert proc.stdout.startswith(f"code {(origin['code']['commit'] or 'no git checkout')[:12]}")
  # Perfetto's file has a slice named after every piece (each size of a sized piece), and no warning was due.
  path, slices = perfetto_slices(workdir / "trace")
  counts = collections.Counter(e["name"] for e in slices)
  for piece in collections.Counter(r["piece"] for r in rows).items():
    assert counts[piece[0]] >= piece[1], piece
  assert "warning" not in proc.stderr and os.path.getsize(path) < 5e6


@pytest.mark.slow
def test_client_update_cost_is_steps_times_one_step():
  c = config_lib.base_config()
  c.model.name = "mnist_cnn"  # (a model whose steps are most of a client update's cost)
  c.method = "fedbuff"  # (local training only: FedPSA's build, R and its sketch program, would add 4 s)
  c.local.epochs = 2  # several full batches and a partial one per epoch; the paper's 5 only repeat them
  profiler = profiling.Profiler(c, repeats=1)
  profiler.local_training()
  rows = {r["piece"]: r for r in profiler.rows}
  update = rows["client_update"]
  assert update["steps"] > 1 and update["full_batches"] + update["partial_batches"] == update["steps"]
  expected = update["full_batches"] * rows["sgd_step"]["gflops"]
  if update["partial_batches"]:  # the partial batch of each epoch runs at fewer rows, at its own cost
    assert rows["sgd_step_partial"]["batch"] == update["partial_rows"] < rows["sgd_step"]["batch"]
    expected += update["partial_batches"] * rows["sgd_step_partial"]["gflops"]
  assert update["gflops"] == pytest.approx(expected, rel=0.05)


@pytest.mark.slow
def test_loop_free_twin_counts_every_sample():
  """XLA counts a loop body once; the factored Fisher's cost must grow with the calibration size."""
  c = config_lib.base_config()
  c.method = "fedpsa"
  profiler = profiling.Profiler(c, repeats=1)
  for size in (4, 16):  # 4x the samples: the smallest sizes that show it (the row alone: the others cost 20 s)
    fedpsa_profiler.add_fisher_factored(profiler, size)
  flops = {r["calibration"]: r["gflops"] for r in profiler.rows if r["piece"] == "fisher_factored"}
  # What does not grow with the batch (parameter-sized sums) is under 1% of either count; the loop path's own
  # count, its body once, grows 3.75x (its one body is 6% of the count at 4 samples).
  assert flops[16] == pytest.approx(4 * flops[4], rel=0.02)


@pytest.mark.slow
def test_method_pieces_come_from_the_methods_plugin_only():
  """FedPSA's pieces are its plug-in's, loaded by the method's name; a method without a plug-in adds none."""
  assert profilers.for_method("fedpsa") is fedpsa_profiler.profile
  for method in strategies.registered():
    if method != "fedpsa":
      assert profilers.for_method(method) is None, method

  # The generic profiler imports no method: FedPSA (and its sensitivity) load only with its plug-in.
  names = ("strategies.fedpsa", "sensitivity", "profilers.fedpsa")
  check = f"import sys, fedpsa_jax.profiling; print(sorted(m for m in sys.modules if m.endswith({names})))"
  proc = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_fedpsa_pieces_with_a_count_sketch_time_its_product_and_skip_the_matrix_row():
  """Under fedpsa.projection='count_sketch' the profile times the run's CountSketch product and the client piece,
  and has no bare matrix-vector row (there is no matrix)."""
  c = config_lib.base_config()
  c.method, c.model.name, c.fedpsa.projection = "fedpsa", "linear", "count_sketch"
  profiler = profiling.Profiler(c, repeats=1)
  profiler.method_pieces(calibration_sizes=(4,))
  names = {r["piece"] for r in profiler.rows}
  assert {"sketch", "client_sensitivity_sketch"} <= names and "sketch_bare_matvec" not in names, names


@pytest.mark.slow
def test_fedpsa_pieces_run_the_runs_compiled_sketch(monkeypatch):
  """The profile's client piece and FedPSA's server step call the run's own compiled sketch
  (`sensitivity.sketch_of`, compiled once by the run's `init`), and compile it no second time."""
  c = config_lib.base_config()
  c.method, c.model.name = "fedpsa", "linear"
  profiler = profiling.Profiler(c, repeats=2)
  calls = []
  run_sketch = sensitivity.sketch_of

  def counted(*args, **kwargs):
    calls.append(kwargs)
    return run_sketch(*args, **kwargs)

  monkeypatch.setattr(sensitivity, "sketch_of", counted)
  with compiles.CompileCounter() as counter:
    profiler.method_pieces(calibration_sizes=(4,))
    assert len(calls) >= 3  # the client piece: a warm-up and two timed calls
    del calls[:]
    profiler.server_steps(["fedpsa"])
    assert len(calls) >= 3  # each round's global sketch (and the probe's payloads)
  names = {r["piece"] for r in profiler.rows}
  assert {"sketch", "sketch_bare_matvec", "client_sensitivity_sketch", "server_step/fedpsa"} <= names
  assert counter.count > 0 and counter.by_function["jit(sketch_of)"] == 0, counter.by_function


def test_compile_seconds_count_the_xla_compile_of_a_call_and_nothing_once_compiled():
  import random

  import jax
  import jax.numpy as jnp
  k = random.random()  # (a program no compilation cache holds)
  f = jax.jit(lambda x: jnp.sin(x) * k)
  assert profiling.compile_seconds(lambda: f(jnp.ones(3))) > 0
  assert profiling.compile_seconds(lambda: f(jnp.ones(3))) == 0


@pytest.mark.slow
def test_the_trace_holds_only_the_timed_calls_each_named_without_python_or_compiles(tmp_path):
  """The trace used to wrap the whole profile: every compile and, with the Python tracer on, every Python call
  (860 MB for a small run, 15 GB of memory; Perfetto's view cut at 1M events, 98% Python calls)."""
  c = config_lib.base_config()
  c.method, c.model.name = "fedbuff", "linear"
  profiler = profiling.Profiler(c, repeats=2)
  profiler.local_training()
  rows = {r["piece"]: r for r in profiler.rows}
  for r in rows.values():
    assert r["repeats"] == 2 and r["ms_min"] <= r["ms"] <= r["ms_max"] and r["compile_s"] >= 0, r
  summary = profiler.trace(str(tmp_path / "trace"), calls=2)
  path, slices = perfetto_slices(tmp_path / "trace")
  assert glob.glob(str(tmp_path / "trace" / "plugins" / "profile" / "*" / "*.xplane.pb"))  # (what TensorBoard opens)
  names = [e["name"] for e in slices]
  for piece in rows:
    assert names.count(piece) == 1 + 2, piece  # the piece, and each of its 2 calls (the step annotations)
  assert not [n for n in names if n.startswith("$")]  # the Python tracer's events
  assert not [n for n in names if "compile" in n.lower()], sorted({n for n in names if "compile" in n.lower()})
  assert os.path.getsize(path) < 5e6
  assert summary.path == path and summary.missing == () and summary.problem is None
  assert 0 < len(slices) <= summary.events < summary.cap == perfetto.TRACE_EVENT_CAP

  # Past JAX's cap on the events it converts, Perfetto's file keeps the earliest ones: one line says so.
  # The cap halfway between the first sgd_step slice and the first client_update one: a second trace of the same
  # calls differs by a few runtime events (buffers allocated once, the host's timing), never by half that gap.
  def position(piece):
    return len([e for e in slices if e["ts"] < min(e["ts"] for e in slices if e["name"] == piece)])
  assert position("client_update") - position("sgd_step") > 20
  cap = (position("sgd_step") + position("client_update")) // 2
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(perfetto.TRACE_EVENT_CAP_VARIABLE, str(cap))
    summary = profiler.trace(str(tmp_path / "capped"), calls=2)
  _, kept = perfetto_slices(tmp_path / "capped")
  assert "client_update" not in {e["name"] for e in kept} and "sgd_step" in {e["name"] for e in kept}
  assert summary.missing == ("client_update",) and summary.events >= summary.cap == cap  # (ties at the cut stay)
  assert "\n" not in summary.problem and f"{perfetto.TRACE_EVENT_CAP_VARIABLE}={cap:,}" in summary.problem
  assert "client_update missing" in summary.problem and "--profile_pieces" in summary.problem


@pytest.mark.slow
def test_profile_pieces_profiles_only_those_and_warns_of_a_cut_trace_in_one_line(tmp_path, monkeypatch, capsys):
  """--mode=profile --profile_pieces: only the named pieces (`server_step`: each method's), nothing for a piece
  not named; a step-less profile has no multiples of a step. A trace cut at JAX's cap: one warning line."""
  from fedpsa_jax.cli import modes
  c = config_lib.base_config()
  c.method, c.model.name = "fedbuff", "linear"
  monkeypatch.setenv(perfetto.TRACE_EVENT_CAP_VARIABLE, "3")
  pieces = ("client_update", "server_step", "server_step/fedpac")  # (FedPAC does not apply to the linear model)
  assert modes.profile(c, str(tmp_path), trace=True, repeats=1, pieces=pieces) == 0
  out, err = capsys.readouterr()
  rows = json.load(open(tmp_path / "profile.json"))["rows"]
  assert [r["piece"] for r in rows] == ["client_update"] + [f"server_step/{m}" for m in sorted(strategies.registered())
                                                          if m != "fedpac"]
  assert all(r["x_sgd_step"] is None and r["x_client_update"] > 0 for r in rows)
  assert "not in this run: server_step/fedpac (" in out
  assert next(line for line in out.splitlines() if line.startswith("client_update")).split()[-2:] == ["-", "1.000"]
  warnings = [line for line in err.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and "TF_PROFILER_TRACE_VIEWER_MAX_EVENTS=3" in warnings[0], err


def test_profile_pieces_are_checked_against_the_methods_pieces_before_any_work(tmp_path):
  c = config_lib.base_config()
  c.method = "fedbuff"
  assert profiling.piece_names(c)[:4] == ("sgd_step", "sgd_step_partial", "client_update", "evaluate")
  assert "sketch" not in profiling.piece_names(c) and "server_step/fedpsa" in profiling.piece_names(c)
  c.method = "fedpsa"
  assert set(fedpsa_profiler.PIECES) <= set(profiling.piece_names(c))
  with pytest.raises(config_lib.ConfigError) as err:
    profiling.Profiler(c, pieces=["sgd_step", "local_sgd"])  # (refused before the run is built)
  message = str(err.value)
  assert message.startswith("pieces=sgd_step,local_sgd: 'local_sgd' is not a piece of a fedpsa profile; allowed: ")
  assert "\n" not in message and message.endswith(", ".join(profiling.piece_names(c)))
