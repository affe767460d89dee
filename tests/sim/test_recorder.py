"""The recorder (fedpsa_jax/sim/recorder.py) on its own, without a run: what it writes, the output positions a
checkpoint records, cutting the outputs back to them, choosing the newest checkpoint whose positions the files
still reach, and a failed write named by its file."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from fedpsa_jax import checkpoint, errors, io
from fedpsa_jax import config as config_lib
from fedpsa_jax.sim.recorder import Recorder


def _config(**fields):
  c = config_lib.base_config()
  c.runtime.progress = False
  return config_lib.set_fields(c, fields)


def _record(day: float, accuracy: float, round_: int = 0) -> dict:
  return {"day": day, "test_accuracy": accuracy, "round": round_}


def _recorder(path) -> Recorder:
  rundir = io.RunDir(str(path))
  rundir.lock()
  return Recorder(rundir, _config())


def _lines(path, name: str) -> list[dict]:
  with open(os.path.join(path, name)) as f:
    return [json.loads(line) for line in f]


def test_without_a_workdir_nothing_is_written(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  recorder = Recorder(None, _config())
  assert recorder.open() is None and recorder.checkpoints is None and not recorder.wants_events
  recorder.write_config()
  recorder.metrics(_record(0.0, 0.1))
  recorder.events([{"type": "round"}])
  recorder.write_summary({"status": "completed"})
  recorder.discard_summary()
  recorder.close()
  assert os.listdir(tmp_path) == []


def test_it_writes_the_run_files_and_cuts_them_back_to_a_checkpoints_positions(tmp_path):
  recorder = _recorder(tmp_path)
  assert recorder.open() is None  # no checkpoint: a fresh start
  recorder.write_config()
  assert json.load(open(tmp_path / "config.json"))["method"] == recorder.config.method
  first = [_record(0.0, 0.1), _record(0.5, 0.4, 3)]
  for r in first:
    recorder.metrics(r)
  recorder.events([{"type": "update", "client": 1}, {"type": "round", "round": 3}])
  positions = recorder.positions(metrics_lines=2)
  metrics_bytes = sum(len(json.dumps(r, sort_keys=True)) + 1 for r in first)  # one sorted JSON object a line
  assert positions == {"metrics_lines": 2, "metrics_bytes": metrics_bytes,
                       "events_bytes": os.path.getsize(tmp_path / io.EVENTS_FILE)}
  recorder.metrics(_record(1.0, 0.6, 5))  # after the checkpoint: cut by the rewind
  recorder.events([{"type": "round", "round": 5}])
  history = recorder.rewind(positions)
  assert history == first == _lines(tmp_path, io.METRICS_FILE)
  assert _lines(tmp_path, io.EVENTS_FILE) == [{"type": "update", "client": 1}, {"type": "round", "round": 3}]
  recorder.metrics(_record(1.0, 0.7, 5))  # appending goes on after the cut
  assert [r["test_accuracy"] for r in _lines(tmp_path, io.METRICS_FILE)] == [0.1, 0.4, 0.7]
  recorder.write_summary({"status": "completed"})
  assert json.load(open(tmp_path / io.SUMMARY_FILE)) == {"status": "completed"}
  recorder.discard_summary()
  assert not os.path.exists(tmp_path / io.SUMMARY_FILE)
  recorder.close()


def test_open_takes_the_newest_checkpoint_the_files_still_reach(tmp_path):
  recorder = _recorder(tmp_path)
  recorder.open()
  recorder.metrics(_record(0.0, 0.1))
  recorder.save_checkpoint(1, {"outputs": recorder.positions(metrics_lines=1), "w": np.zeros(2)})
  recorder.metrics(_record(0.5, 0.4))
  recorder.save_checkpoint(2, {"outputs": recorder.positions(metrics_lines=2), "w": np.ones(2)})
  recorder.close()

  # metrics.jsonl cut back to its first line (by hand, outside the run): checkpoint 2's positions are out of
  # reach, so it is set aside and checkpoint 1 is the one restored.
  with open(tmp_path / io.METRICS_FILE, "r+b") as f:
    f.truncate(len(json.dumps(_record(0.0, 0.1), sort_keys=True)) + 1)
  recorder = _recorder(tmp_path)
  with pytest.warns(checkpoint.CheckpointWarning, match="does not match the run's files"):
    restored = recorder.open()
  assert restored.step == 1 and restored.snapshot["outputs"]["metrics_lines"] == 1
  assert restored.snapshot["w"].tolist() == [0.0, 0.0]
  assert recorder.rewind(restored.snapshot["outputs"]) == [_record(0.0, 0.1)]
  recorder.close()

  # A damaged first line: no checkpoint fits, the run starts over and the outputs are emptied.
  with open(tmp_path / io.METRICS_FILE, "w") as f:
    f.write("{not json\n")
  recorder = _recorder(tmp_path)
  with pytest.warns(checkpoint.CheckpointWarning) as caught:
    assert recorder.open() is None
  assert "the run starts over from the beginning" in str(caught[-1].message)
  assert os.listdir(tmp_path / io.CHECKPOINTS_DIR) == [] and len(os.listdir(tmp_path / io.CORRUPT_CHECKPOINTS_DIR)) == 2
  assert os.path.getsize(tmp_path / io.METRICS_FILE) == 0
  recorder.close()


def test_a_failed_write_names_its_file(tmp_path, monkeypatch):
  recorder = _recorder(tmp_path)

  def full(name, records):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(recorder.rundir, "append", full)
  with pytest.raises(errors.OutputWriteError) as err:
    recorder.metrics(_record(0.0, 0.1))
  assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / io.METRICS_FILE)
  with pytest.raises(errors.OutputWriteError, match=f"cannot write {tmp_path / io.EVENTS_FILE}"):
    recorder.events([{"type": "round"}])
  recorder.close()
