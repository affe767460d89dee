"""Sweeps run whole: the Table 1 smoke sweep and its report through launch.py, a resume after an
interruption that does not redo finished members, a report drawn from a sweep's records alone, the Ray executor
against the local one, and launch.py's one-line refusals (a run config as a sweep, a busy sweep directory).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_jax.sim import runner
from fedpsa_lab import paper
import forked_launch
from helpers import _tiny_sweep, process_of, ROOT


TIMING = set(runner.PROCESS_FIELDS) | {"sweep_action"}


def _launch(*args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *args], capture_output=True, text=True,
                        cwd=ROOT, env=env, timeout=900)


@pytest.mark.ci  # (39 members; a grid from flags runs launch.py's sweep and report in make test)
def test_table1_smoke_sweep_and_report_end_to_end(tmp_path):
  """launch.py --mode=sweep then --mode=report: every cell of Table 1's layout is filled from the runs."""
  workdir = str(tmp_path / "table1")
  done = _launch("--mode=sweep", "--config=configs/paper/table1.py:smoke", f"--workdir={workdir}")
  assert done.returncode == 0, done.stderr[-3000:]
  shown = _launch("--mode=report", f"--workdir={workdir}")
  assert shown.returncode == 0, shown.stderr[-3000:]
  saved = json.load(open(os.path.join(workdir, "sweep.json")))
  assert len(saved["members"]) == 39
  table = pd.read_csv(os.path.join(workdir, "report", "table.csv")).set_index("method")
  assert list(table.index) == list(paper.METHODS)
  # The smoke variant runs both datasets' columns on mnist_5k, and its headings say so.
  heading = {"mnist": "mnist_5k (for MNIST)", "fashion_mnist": "mnist_5k (for FMNIST)"}
  assert list(table.columns) == [f"{heading[d]} α={a}" for d in ("mnist", "fashion_mnist") for a in (0.1, 0.5, 1.0)]
  for m in saved["members"]:  # each cell is that member's own summary.json, × 100
    summary = json.load(open(os.path.join(workdir, "runs", m["name"], "summary.json")))
    assert summary["status"] == "completed"
    column = f"{heading[m['labels']['dataset']]} α={m['labels']['alpha']}"
    assert table.loc[m["labels"]["method"], column] == pytest.approx(100 * summary["final_test_accuracy"])
  filled = table.notna()
  assert filled.values.sum() == 39
  assert not filled.loc["fedpac", [c for c in table.columns if c.startswith(heading["fashion_mnist"])]].any()
  markdown = open(os.path.join(workdir, "report", "table.md")).read()
  assert "n/a" not in markdown and markdown.count("| - |") >= 1
  assert markdown.count("**") >= 2 * 6  # a best value per column
  assert os.path.getsize(os.path.join(workdir, "report", "curves.png")) > 10_000


class Interrupted(BaseException):
  """Stands for Ctrl-C / a kill: not an Exception, so the sweep does not record it as a failed member and
  go on (pytest itself reacts to a real KeyboardInterrupt by stopping the session)."""


def test_interrupted_sweep_resumes_without_redoing_finished_members(tmp_path, monkeypatch):
  workdir = str(tmp_path / "sweep")
  calls, interrupted_once = [], []
  real_run = runner.Simulation.run

  def interrupting_run(self):
    calls.append(self.config.method)
    if len(calls) == 2 and not interrupted_once:  # the user's Ctrl-C in the middle of the second member's run
      interrupted_once.append(True)
      def interrupted(day):
        raise Interrupted
      self.run_until = interrupted
    return real_run(self)

  monkeypatch.setattr(runner.Simulation, "run", interrupting_run)
  with pytest.raises(Interrupted):
    sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)
  first = os.path.join(workdir, "runs", "method=fedbuff,seed=0", "summary.json")
  assert json.load(open(first))["status"] == "completed"
  assert json.load(open(os.path.join(workdir, "runs", "method=fedasync,seed=0", "summary.json")))["status"] == "failed"
  assert not os.path.exists(os.path.join(workdir, "runs", "method=fedpsa,seed=0"))
  first_mtime = os.stat(first).st_mtime_ns

  calls.clear()
  results = sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)
  assert calls == ["fedasync", "fedpsa"]  # the finished member was not run again
  assert os.stat(first).st_mtime_ns == first_mtime
  assert [r["sweep_action"] for r in results.values()] == ["skipped", "ran", "ran"]
  assert all(r["status"] == "completed" for r in results.values())
  calls.clear()
  assert [r["sweep_action"] for r in sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None).values()] == [
      "skipped"] * 3
  assert calls == []
  # A longer budget continues each finished member from its end checkpoint instead of starting over: the
  # lines written before stay byte for byte (a fresh run would rewrite them with other wall_seconds).
  metrics = os.path.join(workdir, "runs", "method=fedbuff,seed=0", "metrics.jsonl")
  before = open(metrics).read()
  longer = _tiny_sweep(("fedbuff",))
  longer.base.sim.virtual_days = 0.0075
  result = sweep.run_local(longer, workdir, log=lambda _: None)["method=fedbuff,seed=0"]
  assert result["sweep_action"] == "ran" and result["virtual_days"] == pytest.approx(0.0075)
  after = open(metrics).read()
  assert after.startswith(before) and len(after) > len(before)
  # A member whose config changed (not only in a field a run may continue with) is not "done".
  changed = _tiny_sweep()
  changed.base.local.lr = 0.01
  assert not sweep.is_done(io.config_json(sweep.expand(changed)[0].config),
                           os.path.join(workdir, "runs", "method=fedbuff,seed=0"))


@pytest.mark.slow
def test_a_report_from_the_records_alone_is_the_report_of_the_sweep(tmp_path):
  """--records on real runs: the records directory (no checkpoints) draws the same table as the sweep directory,
  and a fresh sweep directory given those records runs nothing."""
  from fedpsa_lab import report

  workdir, records = str(tmp_path / "sweep"), str(tmp_path / "records")
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  sweep.run_local(config, workdir, log=lambda _: None, records_dir=records)
  assert not any("checkpoints" in dirs for _, dirs, _ in os.walk(records))
  report.build(workdir)
  report.build(records)
  for name in ("table.csv", "members.csv"):
    drawn = [pd.read_csv(os.path.join(d, "report", name)) for d in (workdir, records)]
    pd.testing.assert_frame_equal(drawn[0], drawn[1])
  assert len(drawn[1]) == 2 and set(drawn[1]["status"]) == {"completed"}
  results = sweep.run_local(config, str(tmp_path / "fresh"), log=lambda _: None, records_dir=records)
  assert [r["sweep_action"] for r in results.values()] == ["skipped", "skipped"]


@pytest.fixture(scope="module")
def local_ray():
  """One local Ray instance for this module's Ray tests (2 CPUs, no GPU), on the loopback only: the `ray` module,
  joined; a launch.py started by a test joins it at `ray.get_runtime_context().gcs_address`."""
  ray = pytest.importorskip("ray")
  with pytest.MonkeyPatch.context() as patch:
    # (else a local ray.init() writes an authentication token into ~/.ray and turns it on for this whole process)
    patch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}})
    try:
      yield ray
    finally:
      ray.shutdown()


@pytest.mark.ci  # (a local Ray instance)
def test_ray_executor_gives_the_local_executor_results(tmp_path, local_ray):
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  local = sweep.run_local(config, str(tmp_path / "local"), log=lambda _: None)
  remote = sweep.run_ray(config, str(tmp_path / "ray"), log=lambda _: None, records_dir=str(tmp_path / "records"))
  assert sorted(os.listdir(tmp_path / "records" / "runs")) == sorted(remote)  # kept as each task returned
  assert list(remote) == list(local) == ["method=fedbuff,seed=0", "method=fedpsa,seed=0"]
  for name in local:
    assert remote[name]["sweep_action"] == "ran"
    assert {k: v for k, v in remote[name].items() if k not in TIMING} == {
        k: v for k, v in local[name].items() if k not in TIMING}
    for directory in ("local", "ray"):  # each member left a run directory (docs/runs.md)
      assert {"config.json", "metrics.jsonl", "summary.json"} <= set(os.listdir(tmp_path / directory / "runs" / name))
    lines = [[{k: v for k, v in r.items() if k not in TIMING} for r in io.read_jsonl(tmp_path / d / "runs" / name /
                                                                                      "metrics.jsonl")]
             for d in ("local", "ray")]
    assert lines[0] == lines[1] and len(lines[0]) >= 2
  # Members that no node of this cluster (2 CPUs, no GPU) can take are refused before any runs, not left waiting.
  for resources, flag in ((sweep.RayResources(gpus=0.5), "--ray_gpus_per_member=0.5"),
                          (sweep.RayResources(cpus=3), "--ray_cpus_per_member=3")):
    with pytest.raises(config_lib.ConfigError, match=rf"^{flag} asks for .*, more than any node has \(the Ray "
                       r"cluster has 2 CPU\(s\) and 0 GPU\(s\) on 1 node\(s\)"):
      sweep.run_ray(config, str(tmp_path / "refused"), resources=resources, log=lambda _: None)
    assert not os.path.exists(tmp_path / "refused" / "sweep.json")


def _member_killed_once_running(run_dir: str, killed: list, done: threading.Event) -> None:
  """Kills (SIGKILL) the worker process of the member in `run_dir` once it holds its run directory, as a lost
  node loses it; its pid goes into `killed`. Gives up once `done` is set."""
  while not done.is_set() and not killed:
    pid = process_of(run_dir)
    if pid and pid != os.getpid() and os.path.exists(f"/proc/{pid}"):
      os.kill(pid, signal.SIGKILL)
      killed.append(pid)
    time.sleep(0.2)


@pytest.mark.ci  # (a local Ray instance)
def test_a_member_lost_on_every_try_fails_in_one_line(tmp_path, local_ray, monkeypatch):
  """A member whose worker dies on each of its tries (here its only one) fails as one line naming it, the sweep
  goes on and ends (exit 1 on the command line), and rerunning continues it."""
  monkeypatch.setattr(sweep.ray_executor, "MEMBER_RETRIES", 0)
  config = _tiny_sweep(("fedbuff",))
  config.base.sim.virtual_days = 0.05  # (long enough to be running when it is killed)
  workdir, logged, killed, done = str(tmp_path / "sweep"), [], [], threading.Event()
  killer = threading.Thread(target=_member_killed_once_running,
                            args=(sweep.member_dir(workdir, "method=fedbuff,seed=0"), killed, done), daemon=True)
  killer.start()
  try:
    results = sweep.run_ray(config, workdir, log=logged.append)
  finally:
    done.set()
    killer.join(timeout=30)
  assert killed, "the member finished before it could be killed"
  assert results["method=fedbuff,seed=0"]["sweep_action"] == "failed"
  assert logged[1:] == [logged[-1]] and logged[-1].startswith(
      "[1/1] method=fedbuff,seed=0: failed (MemberLost: Ray lost its process or node (WorkerCrashedError: The worker "
      "died unexpectedly while executing this task"), logged
  assert ("and gave up after 1 try; rerun the same command to continue it from its last checkpoint (what Ray saw: "
          "ray.log)) (") in logged[-1] and "\n" not in logged[-1]


SIGNAL_SWEEP = '''
import ml_collections
from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep


def get_config(arg=None):
  base = config_lib.set_fields(config_lib.base_config(), {
      "method": "fedbuff", "data.name": "mnist_5k", "model.name": "linear", "partition.num_clients": 10,
      "eval.every_days": 0.0025, "checkpoint.every_days": 0.0025, "runtime.progress": False})
  return ml_collections.ConfigDict({"name": "two", "base": base, "seeds": [0], "report": {"rows": ["days"]},
                                    "axes": [sweep.axis("days", [0.005, 0.1], "sim.virtual_days")]})
'''


@pytest.mark.ci  # (a local Ray instance)
def test_sigterm_stops_a_ray_sweep_as_it_stops_a_local_one_and_a_rerun_resumes_it(tmp_path, local_ray):
  """launch.py --executor=ray joining a running cluster, SIGTERM once the short member is done and the long one
  has a checkpoint: the command's one line and exit code 143, as a local sweep's, nothing of Ray's on the console
  (its log in WORKDIR/ray.log); the long member stopped as an interrupted run. Rerunning skips the finished member
  and continues the interrupted one from its checkpoint."""
  config_path, workdir = tmp_path / "two.py", str(tmp_path / "sweep")
  config_path.write_text(SIGNAL_SWEEP)
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "RAY_AUTH_MODE": "disabled"}
  command = [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep", f"--config={config_path}",
             f"--workdir={workdir}", "--executor=ray", f"--ray_address={local_ray.get_runtime_context().gcs_address}"]
  child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  lines, errors = [], []  # (read as they come: a full pipe would stop the child)
  readers = [threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True),
             threading.Thread(target=lambda: errors.extend(child.stderr), daemon=True)]
  for reader in readers:
    reader.start()
  long_run = sweep.member_dir(workdir, "days=0.1,seed=0")
  deadline = time.monotonic() + 300
  while not (any(line.startswith("[1/2] days=0.005,seed=0: ran") for line in lines)
             and os.path.isdir(os.path.join(long_run, "checkpoints"))
             and any(s.isdigit() for s in os.listdir(os.path.join(long_run, "checkpoints")))):
    assert child.poll() is None and time.monotonic() < deadline, (lines, errors[-30:])
    time.sleep(0.2)
  # (20 times the short member's days: on a loaded machine the two may still run at different speeds)
  assert not os.path.exists(os.path.join(long_run, "summary.json")) or io.read_summary(long_run)["status"] != "completed"
  child.send_signal(signal.SIGTERM)
  assert child.wait(timeout=120) == 143, errors[-30:]
  for reader in readers:
    reader.join(timeout=30)
  assert errors == ["interrupted by SIGTERM: stopped (status 'interrupted'); rerun the same command to resume from "
                    "the last checkpoint\n"], errors[-30:]
  assert [line.split(":")[0] for line in lines] == ["2 members submitted, each asking for 1 CPU(s); Ray's own log",
                                                    "[1/2] days=0.005,seed=0"], lines
  assert "Connecting to existing Ray cluster" in open(os.path.join(workdir, sweep.RAY_LOG)).read()
  assert io.read_summary(long_run)["status"] == "interrupted"

  again = sweep.run_ray(config_lib.load_file(str(config_path)), workdir, log=lambda _: None)  # (the same sweep)
  assert [r["sweep_action"] for r in again.values()] == ["skipped", "ran"]
  assert again["days=0.1,seed=0"]["status"] == "completed"
  assert again["days=0.1,seed=0"]["provenance"]["resumed_from_day"] is not None


def test_launch_sweep_rejects_a_run_config(tmp_path):
  done = forked_launch.launch("--mode=sweep", "--config=configs/default.py", f"--workdir={tmp_path / 'x'}")
  assert done.returncode == 2
  assert "--config" in done.stderr and "not a sweep config" in done.stderr and "configs/paper/table1.py" in done.stderr
  done = forked_launch.launch("--mode=report")
  assert done.returncode == 2 and "--workdir is required" in done.stderr
  done = forked_launch.launch("--mode=sweep", "--config=configs/paper/table9.py", f"--workdir={tmp_path / 'y'}")
  assert done.returncode == 2 and "no such file" in done.stderr and ",table1," in done.stderr  # (the shipped names)
  done = forked_launch.launch("--mode=sweep", "--config=configs/paper/table1.py:smoke",
                              f"--workdir={tmp_path / 'z'}", "--executor=ray", "--ray_gpus_per_member=2")
  assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
      "--ray_gpus_per_member=2.0 is invalid; allowed: a number from 0 to 1 (each member's share of one GPU; 0: no GPU)")
  assert not any(os.path.exists(tmp_path / name) for name in ("x", "y", "z"))


@pytest.mark.slow
def test_launch_refuses_a_second_sweep_on_the_same_workdir_in_one_line(tmp_path):
  workdir = str(tmp_path / "sweep")
  with sweep.locked(workdir, "table1"):
    done = forked_launch.launch("--mode=sweep", "--config=configs/paper/table1.py:smoke", f"--workdir={workdir}")
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
  absl_log = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # (INFO lines of JAX and absl)
  lines = [line for line in done.stderr.splitlines() if line.strip() and not absl_log.match(line)]
  assert lines == [f"--workdir={workdir!r} is in use by another sweep or run (sweep table1, pid {os.getpid()}); "
                   "allowed: a sweep directory no running sweep uses (wait for that one to end: rerunning the "
                   "same command then resumes it), or another --workdir"], done.stderr
  assert os.listdir(workdir) == [sweep.LOCK_FILE]


def test_a_grid_from_flags_runs_resumes_and_reports_as_a_sweep_config_does(tmp_path):
  """`--sweep` over a run config: the members of the grid run into WORKDIR/runs/<member>, a rerun of the same
  command skips them, and the report draws the grid's table."""
  from fedpsa_lab import report

  workdir = str(tmp_path / "grid")
  command = ("--mode=sweep", "--config=configs/default.py:model=linear,num_clients=10,virtual_days=0.005",
             "--config.eval.every_days=0.0025", "--config.runtime.progress=False", "--sweep=method=fedbuff,fedasync",
             f"--workdir={workdir}")
  done = forked_launch.launch(*command)
  assert done.returncode == 0, done.stderr[-3000:]
  names = ["method=fedbuff,seed=0", "method=fedasync,seed=0"]
  saved = json.load(open(os.path.join(workdir, "sweep.json")))
  assert [m["name"] for m in saved["members"]] == names and saved["sweep"]["name"] == "default-model-linear_num_" \
      "clients-10_virtual_days-0.005-sweep"
  assert done.stdout.splitlines()[-2].startswith(f"sweep {saved['sweep']['name']}: 2/2 members done in {workdir}")
  for name in names:
    summary = json.load(open(os.path.join(workdir, "runs", name, "summary.json")))
    assert summary["status"] == "completed" and summary["method"] == name.split(",")[0].split("=")[1]
  again = forked_launch.launch(*command)
  assert again.returncode == 0 and again.stdout.count(": skipped, completed") == 2, again.stdout
  report.build(workdir)
  table = pd.read_csv(os.path.join(workdir, "report", "table.csv")).set_index("method")
  assert list(table.index) == ["fedbuff", "fedasync"] and table.notna().all().all()
