"""Sweeps (fedpsa_jax/sweep/): the lock that keeps a second sweep off a busy sweep directory, the bounds on
seeds and members, sweep.json's contract, a full disk that stops a sweep, the records (--records) kept and
restored, the seed-by-seed order of both executors, and what the Ray executor promises (members no node can take
refused, an interruption, Ray's own output in ray.log, a member Ray lost), against a stand-in for the `ray` module
(the whole sweeps run in tests/e2e/test_sweep_runs.py, on a real Ray instance too).
"""

from __future__ import annotations

import errno
import json
import logging
import lzma
import os
import signal
import subprocess
import sys
import threading
import types

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import errors, io, sweep
from helpers import _tiny_sweep, ROOT


def test_a_second_sweep_on_a_busy_sweep_directory_is_refused(tmp_path, monkeypatch):
  """A sweep holds SWEEP_DIR/.lock from writing sweep.json to its last member: a second sweep on the same
  directory is refused at once, before it writes or runs anything, and runs once the first has ended."""
  workdir = str(tmp_path / "sweep")
  ran, claims = [], []

  def member(config_json, run_dir, compilation_cache=None):
    ran.append(os.path.basename(run_dir))
    try:  # the directory stays claimed while the members run
      with sweep.locked(workdir, "intruder"):
        claims.append("taken")
    except config_lib.ConfigError:
      claims.append("refused")
    return {"status": "completed", "sweep_action": "ran"}

  monkeypatch.setattr(sweep.members, "run_member", member)
  with sweep.locked(workdir, "first"):
    with pytest.raises(config_lib.ConfigError) as err:
      sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)
    assert str(err.value) == (f"--workdir={workdir!r} is in use by another sweep or run (sweep first, pid "
                              f"{os.getpid()}); allowed: a sweep directory no running sweep uses (wait for that "
                              "one to end: rerunning the same command then resumes it), or another --workdir")
    assert ran == [] and os.listdir(workdir) == [sweep.LOCK_FILE]  # nothing written, nothing run
  results = sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)  # released: the next one runs
  assert len(results) == len(ran) == 3 and claims == ["refused"] * 3
  with sweep.locked(workdir):  # and releases it at its end
    pass


def test_seeds_and_members_are_bounded_before_anything_is_expanded(monkeypatch):
  """`seeds=1e9` would expand (and validate) billions of member configs in memory before the first one ran:
  the seed count and the member count are refused first, in one line."""
  import configs.paper.table1 as table1  # (tests/ and the repository root are on the path)

  with pytest.raises(config_lib.ConfigError, match=r"'seeds=1000000000' is invalid; allowed: seeds=<an integer in "
                     r"\[1, 1000\]>"):
    table1.get_config(f"smoke,seeds={10**9}")
  expanded = []
  monkeypatch.setattr(sweep.grid.copy, "deepcopy", lambda x: expanded.append(x) or x)
  grid = table1.get_config("smoke,seeds=1000")  # 42 combinations (3 excluded) x 1,000 seeds
  with pytest.raises(config_lib.ConfigError, match=r"^sweep 'table1-smoke' has 42,000 members \(1000 seeds\); "
                     r"allowed: at most 10,000"):
    sweep.expand(grid)
  assert expanded == []  # refused before any member was built
  grid.seeds = list(range(sweep.MAX_SEEDS + 1))
  with pytest.raises(config_lib.ConfigError, match=r"sweep seeds='\[1001 seeds\]' is invalid; allowed: a list of 1 "
                     r"to 1,000 integers"):
    sweep.expand(grid)


@pytest.mark.parametrize("saved,problem", [
    ({"hello": 1}, "its 'sweep' is not an object with 'name' and a list 'axes'"),
    ({"sweep": {"name": "s", "axes": []}, "members": {"a": 1}}, "its 'members' is not a list of objects"),
    ({"sweep": {"name": "s", "axes": []}, "members": [{"name": "m"}]}, "its 'members' is not a list of objects"),
    ([1, 2], "holds a JSON array, not an object"),
])
def test_a_sweep_json_this_code_did_not_write_is_named_with_its_contract(tmp_path, saved, problem):
  (tmp_path / sweep.SWEEP_FILE).write_text(json.dumps(saved))
  with pytest.raises(errors.DamagedRunFile) as err:
    sweep.read_sweep_json(str(tmp_path))
  assert problem in str(err.value) and "allowed: a sweep.json as --mode=sweep writes it" in str(err.value)


def test_a_full_disk_stops_the_sweep_instead_of_failing_every_member(tmp_path, monkeypatch):
  """Every member after one that met a full disk would fail alike (each after building its run): the sweep
  stops with that member's OutputWriteError (exit 3), and rerunning resumes it."""
  ran = []

  def member(config_json, run_dir, compilation_cache=None):
    ran.append(os.path.basename(run_dir))
    raise errors.OutputWriteError(errno.ENOSPC, "No space left on device", os.path.join(run_dir, "metrics.jsonl"))

  monkeypatch.setattr(sweep.members, "run_member", member)
  with pytest.raises(errors.OutputWriteError) as err:
    sweep.run_local(_tiny_sweep(), str(tmp_path / "sweep"), log=lambda _: None)
  assert len(ran) == 1 and err.value.filename.endswith(os.path.join(ran[0], "metrics.jsonl"))
  full = OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(io, "write_json_atomic", lambda *args: (_ for _ in ()).throw(full))
  with pytest.raises(errors.OutputWriteError, match=r"cannot write .*sweep.json: No space left on device \(ENOSPC\)"):
    sweep.write_sweep_json(_tiny_sweep(), [], str(tmp_path / "other"))


class _FakeSimulation:
  """Stands in for `runner.Simulation` under the real `sweep.run_member` (and so the real `is_done`): writes
  the files a run leaves (config, summary, metrics, a checkpoint), with the status `fail` gives a method (else
  'completed')."""

  ran: list = []
  fail: dict = {}

  def __init__(self, config, run_dir):
    self.config, self.run_dir = config, run_dir

  def run(self):
    type(self).ran.append(self.config.method)
    os.makedirs(os.path.join(self.run_dir, "checkpoints", "7"), exist_ok=True)
    (open(os.path.join(self.run_dir, "checkpoints", "7", "arrays"), "w")).write("big")
    io.write_json_atomic(os.path.join(self.run_dir, "config.json"), io.config_json(self.config))
    with open(os.path.join(self.run_dir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"day": 0.005, "test_accuracy": 0.5, "method": self.config.method}) + "\n")
    status = self.fail.get(self.config.method, "completed")
    io.write_json_atomic(os.path.join(self.run_dir, "summary.json"), {"status": status, "method": self.config.method})


@pytest.fixture
def fake_runs(monkeypatch):
  from fedpsa_jax.sim import runner

  monkeypatch.setattr(runner, "Simulation", _FakeSimulation)
  monkeypatch.setattr(_FakeSimulation, "ran", [])
  monkeypatch.setattr(_FakeSimulation, "fail", {})
  return _FakeSimulation


def _files(directory):
  """The files (not the folders) in `directory`: {name: bytes}."""
  return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))
          if os.path.isfile(os.path.join(directory, name))}


def _unpacked(directory):
  """`_files` of a record with its compressed files decompressed, under the plain names (what a reader reads)."""
  return {name.removesuffix(".xz"): lzma.decompress(data) if name.endswith(".xz") else data
          for name, data in _files(directory).items()}


def test_records_keep_the_finished_members_and_bring_them_to_a_fresh_machine(tmp_path, fake_runs):
  """--records: each completed member's config, summary and metrics (not its checkpoints, not a failed run) are
  kept byte for byte (metrics compressed); a fresh sweep directory with the same records runs only what is not recorded."""
  first, records = str(tmp_path / "first"), str(tmp_path / "records")
  fake_runs.fail = {"fedasync": "failed"}
  results = sweep.run_local(_tiny_sweep(), first, log=lambda _: None, records_dir=records)
  assert fake_runs.ran == ["fedbuff", "fedasync", "fedpsa"]
  assert [r["status"] for r in results.values()] == ["completed", "failed", "completed"]
  assert sorted(os.listdir(os.path.join(records, "runs"))) == ["method=fedbuff,seed=0", "method=fedpsa,seed=0"]
  for name in ("method=fedbuff,seed=0", "method=fedpsa,seed=0"):
    kept = _unpacked(os.path.join(records, "runs", name))
    assert sorted(os.listdir(os.path.join(records, "runs", name))) == [
        "config.json", "metrics.jsonl.xz", "summary.json"]
    assert kept == {k: v for k, v in _files(os.path.join(first, "runs", name)).items() if k in kept}
  assert _files(records)["sweep.json"] == _files(first)["sweep.json"]

  fresh = str(tmp_path / "fresh")  # another machine: only the records came along
  fake_runs.ran, fake_runs.fail = [], {}
  logged = []
  results = sweep.run_local(_tiny_sweep(), fresh, log=logged.append, records_dir=records)
  assert fake_runs.ran == ["fedasync"]
  assert [r["sweep_action"] for r in results.values()] == ["skipped", "ran", "skipped"]
  assert logged[0] == f"2 finished member(s) restored from the records in {records}"
  assert _files(os.path.join(fresh, "runs", "method=fedbuff,seed=0")) == _unpacked(
      os.path.join(records, "runs", "method=fedbuff,seed=0"))  # (restored plain, byte for byte)
  assert len(os.listdir(os.path.join(records, "runs"))) == 3  # the member finished here is recorded too


def test_a_sweep_run_without_records_is_recorded_by_a_rerun_with_them(tmp_path, fake_runs):
  """The members a sweep finished before --records was given are recorded when it is rerun with it, unrun."""
  workdir, records = str(tmp_path / "sweep"), str(tmp_path / "records")
  sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None)
  fake_runs.ran = []
  results = sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None, records_dir=records)
  assert fake_runs.ran == [] and {r["sweep_action"] for r in results.values()} == {"skipped"}
  assert sorted(os.listdir(os.path.join(records, "runs"))) == sorted(results)


def test_a_record_is_replaced_whole_and_only_by_a_finished_run(tmp_path, fake_runs):
  """A newer completed run replaces the whole record (no file of the old one stays, no half-copied folder from
  an interrupted save is left); a run not finished (interrupted) copies nothing, a diverged one is kept."""
  run_dir, records = str(tmp_path / "run"), str(tmp_path / "records")
  member = sweep.expand(_tiny_sweep(("fedbuff",)))[0]
  old = os.path.join(records, "runs", member.name)
  os.makedirs(old)
  (tmp_path / "records" / "runs" / member.name / "events.jsonl").write_text("old\n")
  os.makedirs(old + ".new")  # what a save killed halfway leaves
  assert not sweep.save_record(run_dir, records, member.name)  # nothing there yet
  _FakeSimulation(member.config, run_dir).run()
  assert sweep.save_record(run_dir, records, member.name)
  assert sorted(os.listdir(os.path.join(records, "runs"))) == [member.name]
  # Kept as a records directory keeps them: metrics (and events) compressed, read back as the run wrote them.
  assert sorted(os.listdir(old)) == ["config.json", "metrics.jsonl.xz", "summary.json"]
  assert {n: c for n, c in _files(old).items() if n != "metrics.jsonl.xz"} == {
      n: c for n, c in _files(run_dir).items() if n != "metrics.jsonl"}
  assert lzma.decompress(_files(old)["metrics.jsonl.xz"]) == _files(run_dir)["metrics.jsonl"]
  for status, kept in (("interrupted", False), ("diverged", True)):  # a divergence is a result the report shows
    _FakeSimulation.fail = {"fedbuff": status}
    _FakeSimulation(member.config, str(tmp_path / status)).run()
    assert sweep.save_record(str(tmp_path / status), str(tmp_path / status / "records"), member.name) is kept


def test_records_of_another_budget_and_runs_already_started_are_left_alone(tmp_path, fake_runs):
  """Restoring never overwrites a run directory that exists (a started run continues itself) and never takes a
  record that is not done for the member's config (another budget)."""
  records, fresh = str(tmp_path / "records"), str(tmp_path / "fresh")
  sweep.run_local(_tiny_sweep(), str(tmp_path / "first"), log=lambda _: None, records_dir=records)
  longer = _tiny_sweep()
  longer.base.sim.virtual_days = 0.0075
  started = os.path.join(fresh, "runs", "method=fedbuff,seed=0")
  os.makedirs(os.path.join(started, "checkpoints"))
  members = sweep.expand(_tiny_sweep())
  os.makedirs(os.path.join(fresh, "runs", "method=fedasync,seed=0.new", "half"))  # an interrupted restore's copy
  assert sweep.restore_records(records, fresh, members) == ["method=fedasync,seed=0", "method=fedpsa,seed=0"]
  assert sorted(os.listdir(os.path.join(fresh, "runs", "method=fedasync,seed=0"))) == [
      "config.json", "metrics.jsonl", "summary.json"]  # (plain again: a run appends to it if extended)
  assert os.listdir(started) == ["checkpoints"]
  assert sweep.restore_records(records, str(tmp_path / "other"), sweep.expand(longer)) == []


def test_a_records_directory_that_cannot_hold_this_sweeps_records_is_refused_before_any_work(tmp_path, fake_runs):
  workdir = str(tmp_path / "sweep")
  (tmp_path / "file").write_text("x")
  other = _tiny_sweep()
  other.name = "another"
  sweep.write_sweep_json(other, [], str(tmp_path / "theirs"))
  for records, message in [
      (workdir, f"--records={workdir!r} is the sweep directory itself; allowed: another directory"),
      (str(tmp_path / "file"), f"--records={str(tmp_path / 'file')!r} is not a directory; allowed: a directory"),
      (str(tmp_path / "theirs"), f"--records={str(tmp_path / 'theirs')!r} holds the records of sweep 'another', "
                                 "not of 'tiny'; allowed: the records directory of this sweep, or a new one")]:
    with pytest.raises(config_lib.ConfigError) as err:
      sweep.run_local(_tiny_sweep(), workdir, log=lambda _: None, records_dir=records)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not os.path.exists(workdir) and fake_runs.ran == []


def test_records_is_refused_outside_the_sweep_mode():
  from fedpsa_jax.cli import modes

  for mode in ("train", "report", "profile"):
    with pytest.raises(config_lib.ConfigError, match=rf"^--records is only for --mode=sweep, not --mode={mode}; "):
      modes.run_mode(config_lib.base_config(), modes.Options("configs/default.py", mode=mode, records="r"))
  with pytest.raises(config_lib.ConfigError, match=r"^--records= is empty; allowed: a directory, or no --records$"):
    modes.run_mode(_tiny_sweep(), modes.Options("configs/default.py", mode="sweep", records=""))


def test_a_sweep_runs_seed_by_seed_and_answers_in_axis_order(tmp_path, fake_runs):
  """Every member's first seed runs before any second one (a sweep stopped halfway holds whole seeds of every
  method); the summaries come back in the axis order of sweep.json, seeds innermost."""
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  config.seeds = [7, 3]
  ran = []
  fake_runs.ran = ran
  logged = []
  results = sweep.run_local(config, str(tmp_path / "sweep"), log=logged.append)
  assert ran == ["fedbuff", "fedpsa", "fedbuff", "fedpsa"]
  assert [line.split(":")[0] for line in logged] == [
      "[1/4] method=fedbuff,seed=7", "[2/4] method=fedpsa,seed=7", "[3/4] method=fedbuff,seed=3",
      "[4/4] method=fedpsa,seed=3"]
  assert list(results) == [m["name"] for m in sweep.read_sweep_json(str(tmp_path / "sweep"))["members"]] == [
      "method=fedbuff,seed=7", "method=fedbuff,seed=3", "method=fedpsa,seed=7", "method=fedpsa,seed=3"]


_TASK_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_FLAGS")


class _Ref:
  """A finished task's object reference (hashable by identity, as Ray's are)."""

  def __init__(self, value):
    self.value = value


class _RayError(Exception):
  """Stands for `ray.exceptions.RayError`, what Ray raises when it lost a task's process or node."""


class _RayTaskError(_RayError):
  """Stands for `ray.exceptions.RayTaskError`: what a task raised, under the worker's traceback as text."""

  def __init__(self, cause):
    super().__init__(f"ray::run_remote_member() (pid=1, ip=10.0.0.1)\n  File \"x.py\", line 1\n{cause!r}")
    self.cause = cause


class _FakeRay:
  """The part of the `ray` module `ray_executor.run_ray` uses: tasks run at once, in submission order, in this
  process, their environment undone after each, and what a task raised wrapped as Ray wraps it (`lost`: the members
  whose process Ray lost instead); `options` holds what each task asked Ray for, `seen` the environment
  (`_TASK_ENV`) each member ran with. `nodes`: each node's CPUs and GPUs."""

  exceptions = types.SimpleNamespace(RayError=_RayError, RayTaskError=_RayTaskError)

  def __init__(self, gpus=0, nodes=None, lost=()):
    self.submitted, self.options, self.seen, self.cancelled, self.lost = [], [], [], [], set(lost)
    self.node_resources = nodes if nodes is not None else [{"CPU": 2.0, **({"GPU": float(gpus)} if gpus else {})}]

  def is_initialized(self):
    return True

  def nodes(self):
    dead = {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}  # (a node gone: none of its resources count)
    return [{"Alive": True, "Resources": r} for r in self.node_resources] + [dead]

  def cluster_resources(self):
    return {kind: sum(r.get(kind, 0.0) for r in self.node_resources) for kind in ("CPU", "GPU")
            if any(kind in r for r in self.node_resources)}

  def remote(self, **options):
    def wrap(fn):
      class Task:
        @staticmethod
        def remote(*args):
          self.submitted.append(os.path.basename(args[3]))
          self.options.append(options)
          if self.submitted[-1] in self.lost:
            return _Ref(_RayError("The worker died unexpectedly while executing this task. Check "
                                  "python-core-worker-*.log files for more information.\nmore"))
          saved = dict(os.environ)  # (a task's process is its own: its environment must not leak into the suite)
          try:
            value = fn(*args)
          except Exception as err:  # noqa: BLE001 — as Ray does: raised again by `get`, wrapped
            value = _RayTaskError(err)
          finally:
            self.seen.append({k: os.environ.get(k) for k in _TASK_ENV})
            os.environ.clear()
            os.environ.update(saved)
          return _Ref(value)
      return Task
    return wrap

  def wait(self, pending, num_returns, timeout=None):
    return pending[:num_returns], pending[num_returns:]

  def get(self, ref):
    if isinstance(ref.value, Exception):
      raise ref.value
    return ref.value

  def cancel(self, ref, force=False):
    self.cancelled.append((ref, force))


def _on_ray(ray, monkeypatch, config, workdir, resources=sweep.RayResources(), log=lambda _: None, records=None):
  """`sweep.run_ray` with `ray` (a `_FakeRay`) as the `ray` module."""
  monkeypatch.setitem(sys.modules, "ray", ray)
  return sweep.run_ray(config, str(workdir), resources=resources, log=log, records_dir=records)


def test_the_ray_executor_submits_seed_by_seed_and_keeps_records(tmp_path, fake_runs, monkeypatch):
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  config.seeds = [0, 1]
  ray, records = _FakeRay(), str(tmp_path / "records")
  results = _on_ray(ray, monkeypatch, config, tmp_path / "sweep", records=records)
  assert ray.submitted == ["method=fedbuff,seed=0", "method=fedpsa,seed=0", "method=fedbuff,seed=1",
                           "method=fedpsa,seed=1"]
  assert list(results) == ["method=fedbuff,seed=0", "method=fedbuff,seed=1", "method=fedpsa,seed=0",
                           "method=fedpsa,seed=1"]
  assert sorted(os.listdir(os.path.join(records, "runs"))) == sorted(results)


@pytest.mark.parametrize("asked, cluster_gpus, share", [(None, 0, 0.0), (None, 2, sweep.DEFAULT_GPU_SHARE),
                                                        (0.5, 1, 0.5), (0.0, 1, 0.0)])
def test_each_member_asks_ray_for_its_share_in_a_process_of_its_own(tmp_path, fake_runs, monkeypatch, asked,
                                                                     cluster_gpus, share):
  """Every task asks for the CPUs and GPU share given (the default share only on a cluster with GPUs: elsewhere
  a task asking for one would never start), a worker process used for this one task (`max_calls=1`), retries
  when its node is lost; its member runs with JAX's memory capped to GPU_MEMORY_OF_SHARE of its share, not
  preallocated, and with one host device per CPU."""
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
  for name in _TASK_ENV[:2]:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")  # (a user's cap under the old name)
  ray = _FakeRay(gpus=cluster_gpus)
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  results = _on_ray(ray, monkeypatch, config, tmp_path / "sweep", sweep.RayResources(cpus=2, gpus=asked))
  assert [r["status"] for r in results.values()] == ["completed", "completed"]
  assert ray.options == [{"num_cpus": 2, "num_gpus": share, "max_calls": 1, "max_retries": sweep.MEMBER_RETRIES}] * 2
  # (with a share, the old name goes: jaxlib refuses both names at once; without one, the user's cap stays)
  capped = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_CLIENT_MEM_FRACTION": str(round(0.9 * share, 4)),
            "XLA_PYTHON_CLIENT_MEM_FRACTION": None} if share else {
            "XLA_PYTHON_CLIENT_PREALLOCATE": None, "XLA_CLIENT_MEM_FRACTION": None,
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  assert ray.seen == [{**capped, "XLA_FLAGS": "--xla_backend_optimization_level=0 "
                       "--xla_force_host_platform_device_count=2"}] * 2
  assert os.environ["XLA_FLAGS"] == "--xla_backend_optimization_level=0"  # (the fake undid it)


def test_a_host_device_count_already_in_xla_flags_wins(tmp_path, fake_runs, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
  ray = _FakeRay()
  _on_ray(ray, monkeypatch, _tiny_sweep(("fedbuff",)), tmp_path / "sweep", sweep.RayResources(cpus=2))
  assert ray.seen[0]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"


@pytest.mark.parametrize("flags, message", [
    ({"ray_gpus_per_member": 1.5}, "--ray_gpus_per_member=1.5 is invalid; allowed: a number from 0 to 1 (each "
                                   "member's share of one GPU; 0: no GPU)"),
    ({"ray_gpus_per_member": -0.25}, "--ray_gpus_per_member=-0.25 is invalid; allowed: a number from 0 to 1"),
    ({"ray_gpus_per_member": float("nan")}, "--ray_gpus_per_member=nan is invalid"),
    ({"ray_cpus_per_member": 0}, "--ray_cpus_per_member=0 is invalid; allowed: an integer >= 1 (the CPUs Ray "
                                 "reserves for each member, and its host devices"),
    ({"ray_cpus_per_member": 2, "executor": "local"}, "--ray_cpus_per_member is only for --mode=sweep "
                                                      "--executor=ray; allowed: those, or no --ray_cpus_per_member"),
    ({"ray_gpus_per_member": 0.5, "mode": "train"}, "--ray_gpus_per_member is only for --mode=sweep --executor=ray"),
])
def test_bad_ray_resource_flags_are_refused_before_any_work(tmp_path, fake_runs, flags, message):
  from fedpsa_jax.cli import modes

  options = modes.Options("configs/paper/table1.py", **{"mode": "sweep", "executor": "ray",
                                                        "workdir": str(tmp_path / "sweep"), **flags})
  with pytest.raises(config_lib.ConfigError) as err:
    modes.run_mode(_tiny_sweep(), options)
  assert str(err.value).startswith(message) and "\n" not in str(err.value)
  assert not os.path.exists(tmp_path / "sweep") and fake_runs.ran == []


def test_the_ray_executor_shares_the_member_loop_failures_and_a_full_disk(tmp_path, monkeypatch):
  """A member failing on Ray is recorded as failed and the sweep goes on; one that met a full disk cancels the
  members still running and stops the sweep with its OutputWriteError, as the local executor does."""
  def member(config_json, run_dir, compilation_cache=None):
    if config_json["method"] == "fedasync":
      raise ValueError("broken member")
    return {"status": "completed", "sweep_action": "ran"}

  monkeypatch.setattr(sweep.members, "run_member", member)
  ray, logged = _FakeRay(), []
  results = _on_ray(ray, monkeypatch, _tiny_sweep(), tmp_path / "sweep", log=logged.append)
  assert [r["sweep_action"] for r in results.values()] == ["ran", "failed", "ran"]
  assert results["method=fedasync,seed=0"]["error"] == "ValueError: broken member" and ray.cancelled == []
  assert [line.split(":")[0] for line in logged[1:]] == ["[1/3] method=fedbuff,seed=0", "[2/3] method=fedasync,seed=0",
                                                          "[3/3] method=fedpsa,seed=0"]

  def full(config_json, run_dir, compilation_cache=None):
    raise errors.OutputWriteError(errno.ENOSPC, "No space left on device", os.path.join(run_dir, "metrics.jsonl"))

  monkeypatch.setattr(sweep.members, "run_member", full)
  ray = _FakeRay()
  with pytest.raises(errors.OutputWriteError):
    _on_ray(ray, monkeypatch, _tiny_sweep(), tmp_path / "other")
  assert [force for _, force in ray.cancelled] == [False] * 3  # (every task: cancelling a finished one does nothing)


def test_a_member_whose_process_ray_lost_every_time_fails_in_one_line_and_the_sweep_goes_on(tmp_path, fake_runs,
                                                                                          monkeypatch):
  """Ray gives up on a member after losing its process or node on every try: that member fails in one line naming
  it and saying how to continue it; the members before and after it run."""
  ray, logged = _FakeRay(lost={"method=fedasync,seed=0"}), []
  results = _on_ray(ray, monkeypatch, _tiny_sweep(), tmp_path / "sweep", log=logged.append)
  assert [r["sweep_action"] for r in results.values()] == ["ran", "failed", "ran"]
  assert fake_runs.ran == ["fedbuff", "fedpsa"]
  lost = [line for line in logged if "method=fedasync" in line]
  assert lost == [lost[0]] and "\n" not in lost[0] and lost[0].startswith(
      "[2/3] method=fedasync,seed=0: failed (MemberLost: Ray lost its process or node (_RayError: The worker died "
      "unexpectedly while executing this task. Check python-core-worker-*.log files for more information.) and gave "
      f"up after {sweep.MEMBER_RETRIES + 1} tries; rerun the same command to continue it from its last checkpoint")


@pytest.mark.parametrize("resources, nodes, message", [
    (sweep.RayResources(gpus=0.5), [{"CPU": 2.0}], "--ray_gpus_per_member=0.5 asks for 0.5 of a GPU for each member, "
     "more than any node has (the Ray cluster has 2 CPU(s) and 0 GPU(s) on 1 node(s), at most 2 CPU(s) and 0 GPU(s) "
     "on one); allowed: --ray_gpus_per_member=0 (no GPU), or a cluster with GPUs"),
    (sweep.RayResources(cpus=3), [{"CPU": 2.0}], "--ray_cpus_per_member=3 asks for 3 CPU(s) for each member, more than "
     "any node has (the Ray cluster has 2 CPU(s) and 0 GPU(s) on 1 node(s), at most 2 CPU(s) and 0 GPU(s) on one); "
     "allowed: --ray_cpus_per_member=2 or fewer, or a cluster with larger nodes"),
    (sweep.RayResources(cpus=2), [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}], "--ray_cpus_per_member=2 asks for 2 CPU(s) "
     "for each member, more than any node has (the Ray cluster has 2 CPU(s) and 1 GPU(s) on 2 node(s), at most 1 "
     "CPU(s) and 1 GPU(s) on one)"),  # (the cluster's 2 CPUs, but no node's)
])
def test_members_no_node_can_take_are_refused_before_any_member_runs(tmp_path, fake_runs, monkeypatch, resources,
                                                                     nodes, message):
  """Ray would keep such members waiting for ever (a GPU share on a cluster without GPUs, more CPUs than a node
  has): refused in one line naming the flag, what it asks and what the cluster has, before sweep.json or a member."""
  ray = _FakeRay(nodes=nodes)
  with pytest.raises(config_lib.ConfigError) as err:
    _on_ray(ray, monkeypatch, _tiny_sweep(), tmp_path / "sweep", resources)
  assert str(err.value).startswith(message) and "\n" not in str(err.value)
  assert ray.submitted == [] and not os.path.exists(tmp_path / "sweep" / "sweep.json")
  fits = sweep.RayResources(cpus=2, gpus=1.0)
  assert sweep.unplaceable(fits, 1.0, {"CPU": 3.0, "GPU": 1.0}, [{"CPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}]) is None


class _InterruptedRay(_FakeRay):
  """A `_FakeRay` whose first wait is cut by Ctrl-C (or SIGTERM under the command line), and whose members are
  still running: `running` of them still are after the wait that gives them time to stop."""

  def __init__(self, running):
    super().__init__()
    self.running, self.waits = running, []

  def remote(self, **options):
    return lambda fn: type("Task", (), {"remote": staticmethod(lambda *args: _Ref(None))})

  def wait(self, pending, num_returns, timeout=None):
    self.waits.append((len(pending), num_returns, timeout))
    if len(self.waits) == 1:
      raise KeyboardInterrupt
    return pending[:len(pending) - self.running], pending[len(pending) - self.running:]


@pytest.mark.parametrize("running", [0, 1])
def test_an_interrupted_ray_sweep_stops_its_members_as_interrupted_runs(tmp_path, monkeypatch, running):
  """Ctrl-C (or SIGTERM) while members run: every member is cancelled (a running one gets a KeyboardInterrupt and
  stops as an interrupted run, resumable), the sweep waits STOP_SECONDS for them, kills those still running, and
  stops with the interruption, which the command line turns into its one line and exit code."""
  ray = _InterruptedRay(running)
  with pytest.raises(KeyboardInterrupt):
    _on_ray(ray, monkeypatch, _tiny_sweep(), tmp_path / "sweep")
  assert ray.waits == [(3, 1, None), (3, 3, sweep.STOP_SECONDS)]
  assert [force for _, force in ray.cancelled] == [False] * 3 + [True] * running


def test_rays_own_output_goes_to_ray_log_and_the_console_keeps_the_sweeps_lines(tmp_path, fake_runs, monkeypatch,
                                                                               capsys):
  """What Ray's threads print (a worker's death, a retry) and what its logger says go to SWEEP_DIR/ray.log; the
  sweep's lines (the main thread's) to the console; both streams and the logger are as before afterwards."""
  class Chatty(_FakeRay):
    def wait(self, pending, num_returns, timeout=None):
      def ray_thread():
        print("(raylet) A worker died or was killed while executing a task")
        print("(raylet) Task failed. There are 2 retries remaining", file=sys.stderr)
      thread = threading.Thread(target=ray_thread)
      thread.start()
      thread.join()
      logging.getLogger("ray.worker").warning("a warning of Ray's")
      return super().wait(pending, num_returns, timeout)

  before = (logging.getLogger("ray").handlers[:], sys.stdout, sys.stderr)
  _on_ray(Chatty(), monkeypatch, _tiny_sweep(("fedbuff",)), tmp_path / "sweep", log=print)
  console = capsys.readouterr()
  assert console.err == "" and [line.split(":")[0] for line in console.out.splitlines()] == [
      "1 members submitted, each asking for 1 CPU(s); Ray's own log", "[1/1] method=fedbuff,seed=0"]
  kept = (tmp_path / "sweep" / "ray.log").read_text()
  assert "A worker died" in kept and "2 retries remaining" in kept and "a warning of Ray's" in kept
  assert (logging.getLogger("ray").handlers, sys.stdout, sys.stderr) == before


def test_joining_ray_keeps_the_processs_signal_handlers_and_a_missing_cluster_is_named(tmp_path, fake_runs,
                                                                                        monkeypatch):
  """`ray.init` installs a SIGTERM handler that exits at once (and under it a crash handler that dumps a stack): the
  sweep keeps its own, so SIGTERM stops it cleanly; a Ray it joined it leaves at its end. No cluster at the address
  given: one line naming --ray_address."""
  class Unjoined(_FakeRay):
    joined, left = [], []

    def is_initialized(self):
      return bool(self.joined) and not self.left

    def init(self, address, **options):
      signal.signal(signal.SIGTERM, lambda *_: sys.exit(signal.SIGTERM))
      if address == "nowhere:1":
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the one to connect to.")
      self.joined.append(address)

    def shutdown(self):
      self.left.append(True)

  mine = lambda *_: None  # noqa: E731
  previous = signal.signal(signal.SIGTERM, mine)
  try:
    ray = Unjoined()
    _on_ray(ray, monkeypatch, _tiny_sweep(("fedbuff",)), tmp_path / "sweep")
    assert signal.getsignal(signal.SIGTERM) is mine and ray.joined == [None] and ray.left == [True]
    monkeypatch.setitem(sys.modules, "ray", Unjoined())
    Unjoined.joined, Unjoined.left = [], []
    with pytest.raises(config_lib.ConfigError) as err:
      sweep.run_ray(_tiny_sweep(("fedbuff",)), str(tmp_path / "other"), address="nowhere:1")
    assert str(err.value) == (
        "--ray_address='nowhere:1': no Ray cluster to join there (Could not find any running Ray instance.); allowed: "
        "the address of a running cluster's head node (`ray start --head` prints it), 'auto' for the cluster this "
        "node belongs to, or no --ray_address for a local Ray instance")
    assert signal.getsignal(signal.SIGTERM) is mine
  finally:
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("kind", ["link", "folder"])
def test_a_ray_log_the_sweep_cannot_append_to_is_refused_before_any_work(tmp_path, fake_runs, monkeypatch, kind):
  """SWEEP_DIR/ray.log as a symbolic link (appending would write where it points) or as a folder: one line naming
  it, before Ray is joined or anything written."""
  workdir, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
  workdir.mkdir()
  if kind == "link":
    (workdir / "ray.log").symlink_to(elsewhere)
  else:
    (workdir / "ray.log").mkdir()
  ray = _FakeRay()
  with pytest.raises(config_lib.ConfigError, match=r"holds ray.log as (a symbolic link|a directory, where a sweep "
                     r"keeps a file)"):
    _on_ray(ray, monkeypatch, _tiny_sweep(("fedbuff",)), workdir)
  assert ray.submitted == [] and sorted(os.listdir(workdir)) == ["ray.log"] and not elsewhere.exists()


def test_a_finished_member_is_skipped_without_starting_jax(tmp_path):
  """On Ray every member, finished or not, is a fresh process: skipping a finished one must not cost JAX's start."""
  member = sweep.expand(_tiny_sweep(("fedbuff",)))[0]
  run_dir = str(tmp_path / "run")
  os.makedirs(run_dir)
  config_json = io.config_json(member.config)
  io.write_json_atomic(os.path.join(run_dir, "config.json"), config_json)
  io.write_json_atomic(os.path.join(run_dir, "summary.json"), {"status": "completed"})
  io.write_json_atomic(str(tmp_path / "member.json"), config_json)
  code = ("import json, sys; from fedpsa_jax import sweep; "
          f"r = sweep.run_member(json.load(open({str(tmp_path / 'member.json')!r})), {run_dir!r}); "
          "print(r['sweep_action'], 'jax' in sys.modules)")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                        env={**os.environ, "PYTHONPATH": ROOT})
  assert done.stdout.split() == ["skipped", "False"], done.stderr[-2000:]


@pytest.mark.parametrize("given", [None, "mine"])
def test_a_compilation_cache_that_is_a_file_is_refused_in_one_line_before_any_member(tmp_path, given):
  """A file named jax_cache in a sweep folder (the default cache) failed every member, with nothing on stderr."""
  import io as std_io

  from fedpsa_jax import cli
  from fedpsa_jax.cli import modes
  workdir = tmp_path / "sweep"
  workdir.mkdir()
  cache = workdir / "jax_cache" if given is None else tmp_path / given
  cache.write_text("not a directory")
  stderr = std_io.StringIO()
  code = cli.exit_code_of(lambda: modes.run_sweep(_tiny_sweep(), modes.Options(
      "tiny", mode="sweep", workdir=str(workdir), compilation_cache=None if given is None else str(cache))),
                          stderr=stderr)
  assert code == 2 and stderr.getvalue() == (
      f"--compilation_cache={str(cache)!r} is not a directory (default: WORKDIR/jax_cache); allowed: a directory "
      "(made if missing), another --compilation_cache, or --compilation_cache='' for none\n")
  assert os.listdir(workdir) == (["jax_cache"] if given is None else [])  # no member, no sweep.json
