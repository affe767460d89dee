"""A stop at any moment of a run's first seconds is clean: SIGTERM (what batch schedulers send, at any moment),
and SIGINT followed by SIGTERM (a Ctrl-C, then the scheduler), while the libraries load, while the data and the
run are built, and while XLA compiles the first client updates (with no compilation cache: real compiles).
Each ends with the first signal's exit code and one line on stderr, and rerunning the same command completes
the run to the metrics of an uninterrupted one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fedpsa_jax import io
from fedpsa_jax.sim import runner
import forked_launch
from helpers import once_per_session, ROOT, set_fields
from test_checkpoint import outputs

# The paper's CNN (its client update is the longest compile of a run), small: the first evaluation, then the
# first client updates compile; a checkpoint every evaluation, two client updates and a server round (a FedPSA
# buffer of 2). One local epoch of a small client (40 clients of ~112 samples, 2 of them in flight): the programs
# that compile are the same (a CNN's client update on a CPU is one compiled SGD step, called once per batch), and
# each update is two SGD steps; the rerun and the uninterrupted run are mostly those steps, slow at the suite's
# compiler level (docs/testing.md).
OVERRIDES = {"partition.num_clients": 40, "sim.concurrency": 0.05, "sim.virtual_days": 0.005,
             "eval.every_days": 0.0025, "checkpoint.every_days": 0.0025, "runtime.progress": False,
             "output.events": True, "local.epochs": 1, "fedpsa.buffer_size": 2}
ARGS = ["--config=configs/default.py", *(f"--config.{k}={v}" for k, v in OVERRIDES.items())]  # launch.py's
STOPPED = "stopped (status 'interrupted'); rerun the same command to resume from the last checkpoint"


def run_config():
  sys.path.insert(0, ROOT)
  from configs import default
  return set_fields(default.get_config(), OVERRIDES)


def launch(workdir) -> subprocess.Popen:
  """launch.py on the config above, a process of its own without the session's compilation cache: the compiles
  a signal must meet are real ones, and the libraries load in it (the rerun, with the cache, is a child of
  tests/forked_launch.py's server)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  return subprocess.Popen([sys.executable, "launch.py", *ARGS, f"--workdir={workdir}"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  def run() -> dict:
    path = tmp_path_factory.mktemp("whole") / "run"
    runner.Simulation(run_config(), str(path)).run()
    return outputs(path)
  return once_per_session(tmp_path_factory, "stop_anytime_uninterrupted", run)


def _metrics_lines(workdir) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  return open(path).read().count("\n") if os.path.exists(path) else 0


def _catches_sigterm(pid: int) -> bool:
  """Whether process `pid` has a SIGTERM handler (Linux's /proc): Python installs none of its own, so
  launch.py has run its first line, `signals.exit_while_starting()`, and is importing the libraries, whatever
  the machine's speed."""
  with open(f"/proc/{pid}/status") as status:
    caught = next(line for line in status if line.startswith("SigCgt:"))
  return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


# When the first signal goes: `ready(workdir, pid)` true, then `delay` seconds more.
MOMENTS = {
    "importing": (lambda w, pid: _catches_sigterm(pid), 0.0),  # the start's handler is in, the libraries load
    "building": (lambda w, pid: os.path.exists(os.path.join(w, ".lock")), 0.0),  # the workdir is taken, data loads
    "compiling": (lambda w, pid: _metrics_lines(w) >= 1, 0.5),  # after the first evaluation: updates compile
    "compiling later": (lambda w, pid: _metrics_lines(w) >= 1, 2.0),
}
# Each moment once, and the compiles twice: SIGTERM alone, and a Ctrl-C with the scheduler's SIGTERM after it.
# (The moments after the first evaluation but one, and the data's loading, run in CI only: `ci`.)
CASES = [
    ("importing", [signal.SIGINT, signal.SIGTERM], ()),
    ("building", [signal.SIGTERM], pytest.mark.ci),
    ("compiling", [signal.SIGINT, signal.SIGTERM], ()),
    ("compiling later", [signal.SIGTERM], pytest.mark.ci),
]


@pytest.mark.parametrize("moment,sent", [pytest.param(m, s, id=f"{m}-{'-'.join(x.name for x in s)}", marks=marks)
                                         for m, s, marks in CASES])
def test_a_stop_at_any_moment_is_one_line_its_code_and_a_rerun_completes_the_run(moment, sent, tmp_path,
                                                                                uninterrupted):
  assert uninterrupted["summary"]["rounds"] >= 1  # (what the rerun must reach includes a server round)
  workdir = tmp_path / "run"
  ready, delay = MOMENTS[moment]
  if moment == "importing" and not os.path.exists(f"/proc/{os.getpid()}/status"):
    pytest.skip("the moment the libraries load is read from Linux's /proc")
  proc = launch(workdir)
  deadline = time.monotonic() + 240
  while not ready(workdir, proc.pid) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.005)
  time.sleep(delay)
  assert proc.poll() is None, "the run ended before the signal"
  for i, signum in enumerate(sent):
    if i:
      time.sleep(0.3)  # (the second signal while the first one stops the run)
    proc.send_signal(signum)
  _, stderr = proc.communicate(timeout=240)
  first = sent[0]
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert proc.returncode == 128 + first, stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith(f"interrupted by {first.name}"), lines[-40:]
  if moment == "importing":
    assert lines[0] == f"interrupted by {first.name} while starting: nothing was run or written"
    assert not os.path.exists(workdir)  # (so a rerun is a new run)
    return
  assert lines[0] == f"interrupted by {first.name}: {STOPPED}"
  if os.path.exists(workdir / "summary.json"):
    assert io.read_summary(workdir)["status"] == "interrupted"
  rerun = forked_launch.launch(*ARGS, f"--workdir={workdir}", timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert outputs(workdir) == uninterrupted


# --- streams and files a finished or starting run meets -------------------------------------------------------

TINY = ["--config.model.name=linear", "--config.partition.num_clients=10", "--config.sim.virtual_days=0.005",
        "--config.runtime.progress=False"]


@pytest.mark.parametrize("stdout", ["closed by its reader", "ASCII only"])
def test_a_completed_run_exits_0_whatever_its_stdout_can_take(stdout, tmp_path):
  """`launch.py ... | head -c 0`, and a non-ASCII --workdir printed to an ASCII stdout, ended a completed run in
  a traceback and exit 1."""
  workdir = tmp_path / ("r\u00fcn" if stdout == "ASCII only" else "run")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **({"PYTHONIOENCODING": "ascii"} if stdout == "ASCII only" else {})}
  proc = subprocess.Popen([sys.executable, "launch.py", *TINY, f"--workdir={workdir}"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  if stdout == "closed by its reader":
    proc.stdout.close()
    out = b""
  else:
    out = proc.stdout.read()
  stderr = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 0, stderr[-3000:]
  assert "Traceback" not in stderr and io.read_summary(workdir)["status"] == "completed"
  if stdout == "ASCII only":
    assert out.decode("ascii").splitlines()[-1] == f"outputs in {tmp_path}/r\\xfcn"


def test_an_unreadable_newest_checkpoint_is_one_line_and_exit_2(tmp_path):
  """Seen by a user who may not read it (root without its override of file permissions): it was an 85-line
  PermissionError from orbax, after a `checkpoints_corrupt/` was made for it."""
  setpriv = shutil.which("setpriv")
  if setpriv is None or os.geteuid() != 0:
    pytest.skip("needs root and setpriv (to drop root's permission override), or a user who is not root")
  workdir = tmp_path / "run"
  done = forked_launch.launch(*TINY, f"--workdir={workdir}", timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  newest = max((workdir / "checkpoints").iterdir(), key=lambda p: int(p.name))
  os.chmod(newest, 0)
  try:
    proc = subprocess.run([setpriv, "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "launch.py",
                           *TINY, f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
  finally:
    os.chmod(newest, 0o755)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip() == (
      f"--workdir={str(workdir)!r} holds checkpoints/{newest.name}, which this user cannot read and write; allowed: "
      f"a run directory this user can read and write (give it access to {str(newest)!r}), or another --workdir")
  assert sorted(os.listdir(workdir)) == sorted(["checkpoints", "config.json", "metrics.jsonl", "summary.json",
                                                ".lock"])
