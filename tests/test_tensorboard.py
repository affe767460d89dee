"""`runtime.tensorboard` (fedpsa_jax/tensorboard.py, sim/recorder.py): metrics records as TensorBoard scalars,
read back with an independent parser of the event files (tests/tensorboard_events.py).

- `scalars` names every numeric field by its metrics.jsonl path and leaves the rest out;
- `EventLog` writes one event per record at step = virtual time, float32 values; `restart` leaves exactly the
  given history in one file, whatever event files were there; TensorBoard's own reader sees the same scalars;
- the recorder keeps the events equal to metrics.jsonl: a resume cut back to a checkpoint's positions drops the
  events written after it, and turning the option on at a resume writes the whole kept history.
(Whole runs, a kill and a resume: tests/e2e/test_tensorboard_runs.py.)
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, tensorboard
from fedpsa_jax.sim import recorder as recorder_lib
from tensorboard_events import event_files, scalars_by_step, wall_times


def record(t: int, acc: float, **extra) -> dict:
  return {"time": t, "day": t / 86_400, "round": t // 10, "test_accuracy": acc, "test_loss": 1.0 - acc,
          "wall_seconds": 2.0 + t / 100, "train_seconds": None, **extra}


def test_scalars_names_every_numeric_field_by_its_path():
  rec = {"time": 864, "day": 0.01, "round": 3, "test_accuracy": 0.5, "thermometer_ready": True,
         "temperature": np.float32(0.25), "kappa": [0.1, 0.2], "weights": np.array([0.75, 0.25]),
         "layer_upload_rate": {"conv": 0.5, "dense": {"kernel": 1}}, "clusters": [[0, 1], [2]],
         "train_seconds": None, "status": "running", "note": ["a", 2]}
  assert tensorboard.scalars(rec) == {
      "clusters/0/0": 0.0, "clusters/0/1": 1.0, "clusters/1/0": 2.0, "day": 0.01, "kappa/0": 0.1, "kappa/1": 0.2,
      "layer_upload_rate/conv": 0.5, "layer_upload_rate/dense/kernel": 1.0, "note/1": 2.0, "round": 3.0,
      "temperature": 0.25, "test_accuracy": 0.5, "thermometer_ready": 1.0, "weights/0": 0.75, "weights/1": 0.25}
  assert list(tensorboard.scalars(rec)) == sorted(tensorboard.scalars(rec))  # one tag order in every event


def test_event_log_writes_each_record_at_its_virtual_time_as_float32(tmp_path):
  log = tensorboard.EventLog(str(tmp_path / "tb"))
  history = [record(0, 0.1), record(864, 0.3, kappa=[0.5, 1.0 / 3])]
  log.restart(history)
  log.write(record(1728, 0.7, kappa=[2.0 / 3, 0.25]))
  log.close()
  read = scalars_by_step(str(tmp_path / "tb"))
  assert list(read) == [0, 864, 1728]
  assert read[864] == {"day": np.float32(0.01), "round": 86.0, "test_accuracy": np.float32(0.3),
                       "test_loss": np.float32(0.7), "wall_seconds": np.float32(10.64), "kappa/0": 0.5,
                       "kappa/1": np.float32(1.0 / 3)}
  assert read[1728]["kappa/0"] == np.float32(2.0 / 3) and read[1728]["test_accuracy"] == np.float32(0.7)
  assert len(event_files(str(tmp_path / "tb"))) == 1
  # Rewritten lines keep the run's spacing in wall time (their wall_seconds apart).
  times = wall_times(str(tmp_path / "tb"))
  assert times[864] - times[0] == pytest.approx(8.64, abs=1e-3)


def test_restart_leaves_exactly_the_given_history(tmp_path):
  logdir = tmp_path / "tb"
  log = tensorboard.EventLog(str(logdir))
  log.restart([record(0, 0.1)])
  for t in (864, 1728, 2592):
    log.write(record(t, t / 5000))
  log.close()  # (as a run killed after the evaluation at 2592 leaves it)
  (logdir / "events.out.tfevents.1.elsewhere").write_bytes(b"\x00" * 7)  # another attempt's file, even torn
  (logdir / "notes.txt").write_text("kept")
  log.restart([record(0, 0.1), record(864, 864 / 5000)])  # resumed from a checkpoint at 864
  log.write(record(1728, 0.9))
  log.close()
  read = scalars_by_step(str(logdir))
  assert list(read) == [0, 864, 1728] and read[1728]["test_accuracy"] == np.float32(0.9)
  assert len(event_files(str(logdir))) == 1 and (logdir / "notes.txt").read_text() == "kept"


def test_tensorboard_itself_reads_the_events(tmp_path):
  """TensorBoard's own reader (the `[tensorboard]` extra, what `tensorboard --logdir` loads with) sees every
  scalar at its step, as the independent parser above does."""
  from tensorboard.backend.event_processing import event_accumulator

  log = tensorboard.EventLog(str(tmp_path / "tb"))
  log.restart([record(0, 0.1, kappa=[0.5, 0.25])])
  log.write(record(864, 0.3, kappa=[0.75, 1.0 / 3]))
  log.close()
  board = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
  board.Reload()
  ours = scalars_by_step(str(tmp_path / "tb"))
  assert sorted(board.Tags()["scalars"]) == sorted(ours[0])
  for tag in ours[0]:
    assert [(e.step, np.float32(e.value)) for e in board.Scalars(tag)] == [(t, ours[t][tag]) for t in (0, 864)], tag


def recorder(workdir: str, on: bool = True) -> recorder_lib.Recorder:
  c = config_lib.base_config()
  c.runtime.progress = False
  c.runtime.tensorboard = on
  return recorder_lib.Recorder(io.RunDir(workdir), c)


def test_the_recorder_cuts_the_events_back_with_metrics_jsonl(tmp_path):
  workdir = str(tmp_path / "run")
  first = recorder(workdir)
  assert first.open() is None  # no checkpoint: a fresh start
  first.metrics(record(0, 0.1))
  first.metrics(record(864, 0.2))
  positions = first.positions(2)  # what a checkpoint at 864 records
  first.metrics(record(1728, 0.3))  # then killed before the next checkpoint
  first.close()
  tb = os.path.join(workdir, recorder_lib.TENSORBOARD_DIR)
  assert list(scalars_by_step(tb)) == [0, 864, 1728]

  resumed = recorder(workdir)
  history = resumed.rewind(positions)
  assert [r["time"] for r in history] == [0, 864]
  assert list(scalars_by_step(tb)) == [0, 864]
  resumed.metrics(record(1728, 0.35))  # the step evaluated again
  resumed.close()
  read = scalars_by_step(tb)
  assert list(read) == [0, 864, 1728] and read[1728]["test_accuracy"] == np.float32(0.35)
  assert [r["time"] for r in io.read_metrics(workdir)] == list(read)


def test_turned_on_at_a_resume_it_writes_the_whole_kept_history(tmp_path):
  workdir = str(tmp_path / "run")
  first = recorder(workdir, on=False)
  first.open()
  for t in (0, 864):
    first.metrics(record(t, t / 1000))
  positions = first.positions(2)
  first.close()
  assert not os.path.exists(os.path.join(workdir, recorder_lib.TENSORBOARD_DIR))
  resumed = recorder(workdir, on=True)
  resumed.rewind(positions)
  resumed.close()
  read = scalars_by_step(os.path.join(workdir, recorder_lib.TENSORBOARD_DIR))
  assert {t: v["test_accuracy"] for t, v in read.items()} == {0: 0.0, 864: np.float32(0.864)}


def test_without_a_workdir_or_switched_off_nothing_is_written(tmp_path):
  c = config_lib.base_config()
  c.runtime.tensorboard = True
  c.runtime.progress = False
  assert recorder_lib.Recorder(None, c).tensorboard is None
  off = recorder(str(tmp_path / "off"), on=False)
  off.open()
  off.metrics(record(0, 0.5))
  off.close()
  assert recorder_lib.TENSORBOARD_DIR not in os.listdir(tmp_path / "off")
