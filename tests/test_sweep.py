"""Sweeps (fedpsa_jax/sweep/): the lock that keeps a second sweep off a busy sweep directory, the bounds on
seeds and members, sweep.json's contract, a full disk that stops a sweep, the records (--records) kept and
restored, and the seed-by-seed order of both executors (the whole sweeps run in tests/e2e/test_sweep_runs.py).
"""

from __future__ import annotations

import errno
import json
import lzma
import os
import subprocess
import sys

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import errors, io, sweep
from fedpsa_jax.sweep import ray_executor
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


class _FakeRay:
  """The part of the `ray` module `ray_executor._run_ray_members` uses: tasks run at once, in submission order, in
  this process, their environment undone after each; `options` holds what each task asked Ray for, `seen` the
  environment (`_TASK_ENV`) each member ran with."""

  def __init__(self, gpus=0):
    self.submitted, self.options, self.seen, self.gpus, self.cancelled = [], [], [], gpus, []

  def is_initialized(self):
    return True

  def cluster_resources(self):
    return {"CPU": 2.0, **({"GPU": float(self.gpus)} if self.gpus else {})}

  def remote(self, **options):
    def wrap(fn):
      class Task:
        @staticmethod
        def remote(*args):
          self.submitted.append(os.path.basename(args[3]))
          self.options.append(options)
          saved = dict(os.environ)  # (a task's process is its own: its environment must not leak into the suite)
          try:
            value = fn(*args)
          except Exception as err:  # noqa: BLE001 — as Ray does: raised again by `get`
            value = err
          finally:
            self.seen.append({k: os.environ.get(k) for k in _TASK_ENV})
            os.environ.clear()
            os.environ.update(saved)
          return _Ref(value)
      return Task
    return wrap

  def wait(self, pending, num_returns):
    return pending[:num_returns], pending[num_returns:]

  def get(self, ref):
    if isinstance(ref.value, Exception):
      raise ref.value
    return ref.value

  def cancel(self, ref):
    self.cancelled.append(ref)


def test_the_ray_executor_submits_seed_by_seed_and_keeps_records(tmp_path, fake_runs):
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  config.seeds = [0, 1]
  ray, records = _FakeRay(), str(tmp_path / "records")
  results = ray_executor._run_ray_members(ray, config, sweep.expand(config), str(tmp_path / "sweep"), None,
                                   sweep.RayResources(), lambda _: None, None, records)
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
  results = ray_executor._run_ray_members(ray, config, sweep.expand(config), str(tmp_path / "sweep"), None,
                                   sweep.RayResources(cpus=2, gpus=asked), lambda _: None, None, None)
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
  ray_executor._run_ray_members(ray, _tiny_sweep(("fedbuff",)), sweep.expand(_tiny_sweep(("fedbuff",))),
                         str(tmp_path / "sweep"), None, sweep.RayResources(cpus=2), lambda _: None, None, None)
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
  results = ray_executor._run_ray_members(ray, _tiny_sweep(), sweep.expand(_tiny_sweep()), str(tmp_path / "sweep"), None,
                                   sweep.RayResources(), logged.append, None, None)
  assert [r["sweep_action"] for r in results.values()] == ["ran", "failed", "ran"]
  assert results["method=fedasync,seed=0"]["error"] == "ValueError: broken member" and ray.cancelled == []
  assert [line.split(":")[0] for line in logged[1:]] == ["[1/3] method=fedbuff,seed=0", "[2/3] method=fedasync,seed=0",
                                                          "[3/3] method=fedpsa,seed=0"]

  def full(config_json, run_dir, compilation_cache=None):
    raise errors.OutputWriteError(errno.ENOSPC, "No space left on device", os.path.join(run_dir, "metrics.jsonl"))

  monkeypatch.setattr(sweep.members, "run_member", full)
  ray = _FakeRay()
  with pytest.raises(errors.OutputWriteError):
    ray_executor._run_ray_members(ray, _tiny_sweep(), sweep.expand(_tiny_sweep()), str(tmp_path / "other"), None,
                           sweep.RayResources(), lambda _: None, None, None)
  assert len(ray.cancelled) == 3  # (every task: cancelling a finished one does nothing)


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
