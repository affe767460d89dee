"""The run directory's reader and JSON codec (fedpsa_jax/io.py), and the import layering below it.

- non-finite numbers are written as "nan"/"inf"/"-inf" and read back as floats at any depth;
- `read_run` gives back what `RunDir` wrote (config in JSON form, summary, metrics, events);
- `io`, `sweep` and `report` import without JAX (and without the simulator);
- `claim`, the one directory claim of runs and sweeps: refused while held, naming the holder; free once closed.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from fedpsa_jax import errors, io
from fedpsa_jax.errors import ConfigError
import forked_launch
from helpers import small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_codec_round_trips_non_finite_numbers_at_any_depth():
  record = {"loss": math.inf, "kappa": [0.5, math.nan, -math.inf], "nested": {"m0": math.nan, "xs": [[math.inf]]},
            "acc": np.float32(0.25), "step": np.int64(3), "name": "fedpsa", "pair": (1, 2)}
  written = json.loads(json.dumps(io.to_json(record)))  # what a file holds: valid JSON, strings for NaN/Inf
  assert written["kappa"] == [0.5, "nan", "-inf"] and written["nested"] == {"m0": "nan", "xs": [["inf"]]}
  assert written["acc"] == 0.25 and written["step"] == 3 and written["pair"] == [1, 2]
  back = io.from_json(written)
  assert back["loss"] == math.inf and back["kappa"][0] == 0.5 and math.isnan(back["kappa"][1])
  assert back["kappa"][2] == -math.inf and math.isnan(back["nested"]["m0"]) and back["nested"]["xs"] == [[math.inf]]
  assert back["name"] == "fedpsa"  # other strings are left alone


def test_read_run_gives_back_what_the_run_directory_wrote(tmp_path):
  c = small_config("fedpsa")
  rundir = io.RunDir(str(tmp_path))
  rundir.write_config(c)
  rundir.append("metrics.jsonl", [{"day": 0.0, "test_accuracy": 0.1, "kappa": [math.nan, 0.5]},
                                  {"day": 0.01, "test_accuracy": 0.2, "temperature": math.inf}])
  rundir.append("events.jsonl", [{"type": "update", "kappa": -math.inf}])
  rundir.write_summary({"status": "completed", "aulc": math.nan, "time_to_target": {"day": math.inf}})
  rundir.close()
  record = io.read_run(str(tmp_path))
  assert record.config == io.config_json(c)  # JSON form, comparable with config_json
  assert record.summary["status"] == "completed" and math.isnan(record.summary["aulc"])
  assert record.summary["time_to_target"] == {"day": math.inf}
  assert [m["day"] for m in record.metrics] == [0.0, 0.01] and math.isnan(record.metrics[0]["kappa"][0])
  assert record.metrics[1]["temperature"] == math.inf and record.events == [{"type": "update", "kappa": -math.inf}]
  assert io.read_run(str(tmp_path), events=False).events == []
  assert io.read_summary(str(tmp_path)) == record.summary and io.read_config(str(tmp_path)) == record.config
  empty = io.read_run(str(tmp_path / "nothing"))
  assert (empty.config, empty.summary, empty.metrics, empty.events) == (None, None, [], [])


def test_unreadable_config_json_is_a_config_error_naming_the_workdir(tmp_path):
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ValueError):
    io.read_config(str(tmp_path))
  with pytest.raises(ConfigError, match=r"--workdir=.* holds an unreadable config.json.*allowed"):
    io.check_workdir(str(tmp_path), small_config("fedpsa"))


def test_config_error_is_the_same_class_everywhere():
  from fedpsa_jax import config as config_lib
  from fedpsa_jax import errors

  assert config_lib.ConfigError is errors.ConfigError and issubclass(errors.ConfigError, ValueError)


def test_a_claim_is_refused_while_held_naming_the_holder_and_free_once_released(tmp_path):
  lock = str(tmp_path / io.LOCK_FILE)
  held = io.claim(lock, "sweep first, pid 1", lambda holder: f"unused {holder}")
  with pytest.raises(ConfigError, match=r"^in use by \(sweep first, pid 1\)$"):
    io.claim(lock, "pid 2", lambda holder: f"in use by ({holder})")  # a second open file: flock refuses it too
  assert open(lock).read() == "sweep first, pid 1\n"  # the refused claimant wrote nothing
  held.close()
  again = io.claim(lock, "pid 2", lambda holder: f"unused {holder}")
  assert open(lock).read() == "pid 2\n"  # the new owner replaces the old one's text
  again.close()


@pytest.mark.slow
def test_io_sweep_and_report_import_without_jax():
  """What a config file, a report and a sweep's start import loads neither JAX nor the simulator, nor Ray (imported
  only when a sweep runs on it)."""
  code = ("import sys\n"
          "import fedpsa_jax.io, fedpsa_jax.sweep.grid, fedpsa_jax.sweep, fedpsa_lab.report, fedpsa_lab.paper\n"
          "import fedpsa_jax.config, fedpsa_lab.figures.aifed, fedpsa_lab.figures.casa\n"
          "bad = sorted(m for m in sys.modules if m in ('jax', 'ray') or m.startswith(('jax.', 'ray.', "
          "'fedpsa_jax.sim', 'fedpsa_jax.strategies', 'fedpsa_jax.models')))\n"
          "print(bad)\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "[]"


# --- torn lines -------------------------------------------------------------------------------------------


def write_run(tmp_path, metrics_text: str) -> str:
  """A run directory holding config.json, summary.json and this metrics.jsonl text."""
  rundir = io.RunDir(str(tmp_path))
  rundir.write_config(small_config("fedpsa"))
  rundir.write_summary({"status": "interrupted", "method": "fedpsa"})
  rundir.close()
  (tmp_path / "metrics.jsonl").write_text(metrics_text)
  return str(tmp_path)


LINES = ['{"day": 0.0, "test_accuracy": 0.1, "time": 0}\n', '{"day": 0.01, "test_accuracy": 0.2, "time": 864}\n']


def test_readers_skip_a_torn_last_line_with_a_warning(tmp_path):
  run_dir = write_run(tmp_path, "".join(LINES) + '{"day": 0.02, "test_acc')  # a run stopped mid-write
  with pytest.warns(io.TornLineWarning, match=r"metrics.jsonl: its last line \(line 3\) is incomplete"):
    assert [r["day"] for r in io.read_metrics(run_dir)] == [0.0, 0.01]
  (tmp_path / "events.jsonl").write_text('{"type": "update"}\n{"type": "upd\n')  # (torn, then a newline)
  with pytest.warns(io.TornLineWarning, match="events.jsonl"):
    assert io.read_events(run_dir) == [{"type": "update"}]
  from fedpsa_jax import api  # the notebook API reads through io
  with pytest.warns(io.TornLineWarning):
    assert list(api.load_run(run_dir).history["day"]) == [0.0, 0.01]


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
  run_dir = write_run(tmp_path, LINES[0] + "not json\n" + LINES[1])
  with pytest.raises(errors.DamagedRunFile, match=r"metrics.jsonl: line 2 is not valid JSON"):
    io.read_metrics(run_dir)
  assert issubclass(errors.DamagedRunFile, errors.UserError) and issubclass(errors.DamagedRunFile, ValueError)


@pytest.mark.slow
def test_report_mode_reads_a_run_with_a_torn_last_line(tmp_path):
  run_dir = write_run(tmp_path, "".join(LINES) + '{"day": 0.02, "te')
  done = forked_launch.launch(f"--workdir={run_dir}", "--mode=report")
  assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert "TornLineWarning" in done.stderr and "report written" in done.stdout
  (tmp_path / "metrics.jsonl").write_text(LINES[0] + "{bad\n" + LINES[1])
  done = forked_launch.launch(f"--workdir={run_dir}", "--mode=report")
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert "metrics.jsonl: line 2 is not valid JSON" in done.stderr


def test_a_run_directory_of_an_older_schema_is_refused_naming_the_moved_fields(tmp_path):
  """A config.json written before fields moved (here local.jobs_ahead, now runtime.jobs_ahead) is not resumed
  (its identity cannot be compared field for field), and the one line says why and what to do."""
  config = small_config("fedbuff")
  saved = io.config_json(config)
  saved["local"]["jobs_ahead"] = saved.pop("runtime")["jobs_ahead"]
  os.makedirs(tmp_path / "old")
  (tmp_path / "old" / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ConfigError, match=r"older version of this code.*local\.jobs_ahead -> runtime\.jobs_ahead.*"
                     r"allowed: another --workdir"):
    io.check_workdir(str(tmp_path / "old"), config)
  (tmp_path / "new").mkdir()
  (tmp_path / "new" / "config.json").write_text(json.dumps(io.config_json(config)))
  io.check_workdir(str(tmp_path / "new"), config)  # the same config of this version: resumable


# --- what a run directory must hold, and of which kind -------------------------------------------------------


@pytest.mark.parametrize("text,problem", [
    ('[0.0, 0.1]\n', "line 2 is a JSON array, not an object"),
    ('{"day": 0.01}\n', "line 2 lacks the field(s) test_accuracy"),
    ('{"test_accuracy": 0.2}\n', "line 2 lacks the field(s) day"),
    ('{"day": "later", "test_accuracy": 0.2}\n', "line 2 has day='later', a value of the wrong type"),
])
def test_metrics_lines_that_are_json_but_not_what_a_run_writes_are_named(tmp_path, text, problem):
  """Every reader (reports, figures, the notebook API, resume) draws a learning curve from metrics.jsonl: a
  line that is JSON but not an evaluation record is damage, named with its file and line (not a TypeError or
  KeyError in whoever reads it next)."""
  run_dir = write_run(tmp_path, LINES[0] + text + LINES[1])
  with pytest.raises(errors.DamagedRunFile) as err:
    io.read_metrics(run_dir)
  assert str(err.value).startswith(f"{tmp_path / 'metrics.jsonl'}: {problem}"), err.value
  assert "allowed: one JSON object per line with the fields day, test_accuracy" in str(err.value)
  (tmp_path / "metrics.jsonl").write_text("".join(LINES) + text)  # the last line too: JSON is never torn
  with pytest.raises(errors.DamagedRunFile, match="line 3"):
    io.read_metrics(run_dir)


def test_a_summary_or_config_that_is_not_an_object_and_an_unreadable_file_are_named(tmp_path):
  run_dir = write_run(tmp_path, "".join(LINES))
  (tmp_path / "summary.json").write_text("[1, 2]")
  with pytest.raises(errors.DamagedRunFile, match=r"summary.json holds a JSON array, not an object; allowed: a run's"):
    io.read_summary(run_dir)
  (tmp_path / "config.json").write_text('"fedpsa"')
  with pytest.raises(errors.DamagedRunFile, match=r"config.json holds a JSON string, not an object"):
    io.read_config(run_dir)
  os.remove(tmp_path / "metrics.jsonl")
  os.mkdir(tmp_path / "metrics.jsonl")
  with pytest.raises(errors.DamagedRunFile, match=r"metrics.jsonl cannot be read \(Is a directory\)"):
    io.read_metrics(run_dir)


RUN_ENTRIES = [(name, "file") for name in io.RUN_FILES] + [(name, "directory") for name in io.RUN_DIRS]


@pytest.mark.parametrize("name,kind", RUN_ENTRIES)
def test_a_run_entry_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, name, kind):
  """A directory where a run writes a file, or a file where it keeps a directory, would make a rerun start over
  beside it or fail half-way: `check_workdir` refuses it first, naming it; nothing in the directory changes."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / name).mkdir() if kind == "file" else (workdir / name).write_text("")
  before = sorted(os.listdir(workdir))
  other = "a directory" if kind == "file" else "a file"
  with pytest.raises(ConfigError) as err:
    io.check_workdir(str(workdir), small_config("fedbuff"))
  assert str(err.value) == (f"--workdir={str(workdir)!r} holds {name} as {other}, where a run keeps a {kind}; "
                            f"allowed: a run directory as a run leaves it (move {str(workdir / name)!r} away), or "
                            "another --workdir")
  assert sorted(os.listdir(workdir)) == before


def test_a_run_entry_this_user_cannot_read_and_write_is_refused(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text("".join(LINES))
  real_access = os.access
  monkeypatch.setattr(os, "access", lambda path, mode: not str(path).endswith("metrics.jsonl")
                      and real_access(path, mode))  # (as a user other than the file's owner; root reads all)
  with pytest.raises(ConfigError, match=r"holds metrics.jsonl, which this user cannot read and write; allowed: a "
                     r"run directory this user can read and write"):
    io.check_workdir(str(workdir), small_config("fedbuff"))


def test_an_output_that_cannot_be_synced_is_named(tmp_path, monkeypatch):
  """RunDir.sync (before a checkpoint records the outputs' positions) names the output that fails, not the
  first one (an events.jsonl that could not be synced was reported as metrics.jsonl)."""
  rundir = io.RunDir(str(tmp_path))
  rundir.append(io.METRICS_FILE, [{"day": 0.0, "test_accuracy": 0.1}])
  rundir.append(io.EVENTS_FILE, [{"type": "update"}])
  events_fd = rundir._files[io.EVENTS_FILE].fileno()
  real_fsync = os.fsync

  def fsync(fd):
    if fd == events_fd:
      raise OSError(errno.EIO, "Input/output error")
    real_fsync(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  with pytest.raises(errors.OutputWriteError, match=rf"^cannot write {tmp_path / 'events.jsonl'}: Input/output error "
                     r"\(EIO\)"):
    rundir.sync()
  rundir.close()


# --- files of the right syntax but the wrong shape, and symbolic links ----------------------------------------


@pytest.mark.parametrize("summary,shown", [
    ({"status": "completed", "final_test_accuracy": "high"}, "final_test_accuracy='high'"),
    ({"status": 1, "final_test_accuracy": 0.5}, "status=1"),
    ({"status": "completed", "aulc": "nan", "rounds": "3"}, "rounds='3'")])
def test_a_summary_with_a_value_of_the_wrong_type_is_named(tmp_path, summary, shown):
  """Text where tables and sweeps compute with a number reached them ('Unknown format code f', 'could not convert
  string to float'); a number where text belongs likewise. "nan" is a number (the codec's), not text."""
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  with pytest.raises(errors.DamagedRunFile) as err:
    io.read_summary(str(tmp_path))
  assert str(err.value).startswith(f"{tmp_path / 'summary.json'} has {shown}, a value of the wrong type; allowed: ")
  assert "\n" not in str(err.value)


def test_a_summary_as_a_run_writes_it_reads_back(tmp_path):
  summary = {"status": "interrupted", "final_test_accuracy": math.nan, "diverged_at": None, "method": "fedpsa",
             "interrupted_by": "SIGTERM", "provenance": {"code": {"commit": "abc"}}, "rounds": 3, "error": "x"}
  io.write_json_atomic(str(tmp_path / "summary.json"), summary)
  back = io.read_summary(str(tmp_path))
  assert math.isnan(back.pop("final_test_accuracy")) and back == {k: v for k, v in summary.items()
                                                                  if k != "final_test_accuracy"}


@pytest.mark.parametrize("config,problem", [
    ({"sim": 5, "method": ["fedpsa"]}, "its 'method' is a JSON array, not a string"),
    ({"sim": 5, "method": "fedpsa"}, "its section 'sim' is a JSON number, not an object"),
    ({"method": "fedpsa", "fedpsa": [1]}, "its section 'fedpsa' is a JSON array, not an object")])
def test_a_config_json_of_the_wrong_shape_is_one_line_naming_it(tmp_path, config, problem):
  """{"sim": 5, "method": ["fedpsa"]} was a TypeError (unhashable type: 'list') in the run-identity comparison."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(config))
  with pytest.raises(errors.DamagedRunFile, match=re.escape(f"{workdir / 'config.json'}: {problem}; allowed: ")):
    io.read_config(str(workdir))
  with pytest.raises(ConfigError) as err:  # (what a rerun into it meets: one line, before any work)
    io.check_workdir(str(workdir), small_config("fedbuff"))
  assert problem in str(err.value) and "\n" not in str(err.value)


# Every entry a run writes, moves or deletes (docs/runs.md, "What a run writes"), and files inside its folders.
LINKED_ENTRIES = ["config.json", "summary.json", "metrics.jsonl", "events.jsonl", ".lock", "config.json.tmp",
                  "summary.json.tmp", "checkpoints", "checkpoints_corrupt", "tensorboard", "checkpoints/864/meta",
                  "tensorboard/events.out.tfevents.1.h"]


@pytest.mark.parametrize("name", LINKED_ENTRIES)
def test_a_run_entry_that_is_a_symbolic_link_is_refused_before_anything_is_written(tmp_path, name):
  """Every entry a run writes through, and anything inside its folders; the target is left as it was."""
  workdir, target = tmp_path / "run", tmp_path / "elsewhere"
  target.write_text("someone's notes\n")
  (workdir / name).parent.mkdir(parents=True)
  os.symlink(target, workdir / name)
  with pytest.raises(ConfigError) as err:
    io.check_workdir(str(workdir), small_config("fedbuff"))
  assert str(err.value).startswith(f"--workdir={str(workdir)!r} holds {name} as a symbolic link (to {str(target)!r})")
  assert target.read_text() == "someone's notes\n" and "\n" not in str(err.value)


def test_what_a_run_writes_is_never_written_through_a_link_made_while_it_runs(tmp_path):
  """A link that appears after the checks: the write fails (ELOOP) and the file it points to is unchanged."""
  target = tmp_path / "elsewhere"
  target.write_text("someone's notes\n")
  rundir = io.RunDir(str(tmp_path / "run"))
  for name in ("metrics.jsonl", "summary.json.tmp", ".lock"):
    os.symlink(target, tmp_path / "run" / name)
  with pytest.raises(OSError) as err:
    rundir.append("metrics.jsonl", [{"day": 0.0, "test_accuracy": 0.1}])
  assert err.value.errno == errno.ELOOP
  with pytest.raises(OSError):
    rundir.write_summary({"status": "completed"})
  with pytest.raises(OSError):
    rundir.lock()
  assert target.read_text() == "someone's notes\n"
  rundir.close()


def test_a_workdir_that_cannot_be_made_leaves_no_folders_behind(tmp_path):
  """A --workdir whose last name is too long for the file system used to leave the 20 folders above it."""
  top = tmp_path / "top"
  workdir = os.path.join(top, *["d" * 200] * 20, "x" * 300)  # (names of at most 255 bytes, then one longer)
  with pytest.raises(ConfigError, match=r"is not writable \(File name too long\)"):
    io.check_workdir(workdir, small_config("fedbuff"))
  assert not os.path.exists(top)
  (tmp_path / "kept").mkdir()  # what existed before stays
  with pytest.raises(ConfigError):
    io.check_workdir(os.path.join(tmp_path, "kept", "a", "x" * 300), small_config("fedbuff"))
  assert os.listdir(tmp_path / "kept") == []


def test_a_tensorboard_file_is_refused_before_the_data_is_built_when_the_run_writes_tensorboard(tmp_path):
  """runtime.tensorboard=True over a file named `tensorboard` failed once the data was built (and only
  then); a run without it never touches that name."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "tensorboard").write_text("notes")
  with pytest.raises(ConfigError, match=r"holds tensorboard as a file, where a run keeps a directory"):
    io.check_workdir(str(workdir), small_config("fedbuff", runtime__tensorboard=True))
  io.check_workdir(str(workdir), small_config("fedbuff"))


def test_a_checkpoint_file_this_user_cannot_read_is_refused_naming_it(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "40" / "arrays").mkdir(parents=True)
  (workdir / "checkpoints" / "40" / "arrays" / "data").write_bytes(b"x")
  real_access = os.access
  monkeypatch.setattr(os, "access", lambda path, mode: not str(path).endswith("data") and real_access(path, mode))
  with pytest.raises(ConfigError, match=r"holds checkpoints/40/arrays/data, which this user cannot read and write"):
    io.check_workdir(str(workdir), small_config("fedbuff"))
