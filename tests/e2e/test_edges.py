"""The last edges of "bad input is one line; nothing outside the folders given is touched" (docs/runs.md, "Hard
links", "Special files", "Limits"): each case here failed before its fix, as the docstring of each test says.

- a folder replaced by a symbolic link while a run or a sweep goes on: the next write into it fails, exit 3, and
  nothing lands where the link points (before: the checkpoints went into the link's target, exit 0);
- a file rewritten in place that is a hard link: refused before any work, exit 2 (before: the user's other name for
  it was truncated and rewritten);
- a FIFO among a run's or a sweep's files: refused at once, exit 2 (before: --mode=report waited for ever);
- JSON nested 100,000 levels deep in any file a mode reads: one line naming it, exit 2 (before: a RecursionError
  traceback, exit 1);
- a file-size limit (`ulimit -f`) met by a checkpoint: one line, exit 3, as a full disk (before: a 147-line traceback,
  exit 1); met by the first probe file: one line, and nothing left behind (before: the workdir and the probe);
- a config file that exits: one line naming it, exit 2 (before: exit 0, or the file's own code, having run nothing);
- a sweep.json that is a directory: exit 2 naming it, before anything is made (before: exit 3 naming sweep.json.tmp,
  after making runs/);
- an error about a huge value: its start and its size, in one short line (before: a 60,182-byte line).
"""

from __future__ import annotations

import errno
import io as std_io
import json
import os
import resource
import subprocess
import sys

import pytest

from fedpsa_jax import cli, io, sweep
from fedpsa_jax.cli import modes
from fedpsa_jax.config import fields
from fedpsa_jax.errors import ConfigError, OutputWriteError
from fedpsa_jax.sim import recorder
import forked_launch
from helpers import small_config
from test_links import RUN, _a_record, _a_run_to_report, _tiny_member, _tiny_sweep, elsewhere, snapshot  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
launch = forked_launch.launch


def _one_line(proc, code: int) -> str:
  assert proc.returncode == code, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, lines
  return lines[0]


def _run_config(days: float = 0.02):
  c = small_config("fedbuff", days=days)
  c.eval.every_days = 0.0025
  c.checkpoint.every_days = 0.005
  c.runtime.tensorboard = True
  return c


def _train(config, workdir) -> tuple[int, list[str]]:
  """launch.py's train mode in this process: its exit code and stderr lines."""
  stderr = std_io.StringIO()
  code = cli.exit_code_of(lambda: modes.train(config, str(workdir), resume=False), stderr=stderr)
  return code, stderr.getvalue().splitlines()


# --- 1. a folder made a link while the tool runs -------------------------------------------------------------


@pytest.mark.parametrize("folder", ["checkpoints", "tensorboard", "."])
def test_a_folder_made_a_link_during_a_run_fails_the_next_write_exit_3(folder, tmp_path, elsewhere, monkeypatch):
  workdir = tmp_path / "run"
  target = elsewhere / ("ckpt" if folder == "checkpoints" else "tb" if folder == "tensorboard" else "rep")
  original, seen = recorder.Recorder.metrics, {"linked": False}

  def metrics_then_link(self, record):
    original(self, record)
    if not seen["linked"] and os.path.isdir(workdir / "checkpoints"):  # (the folders exist and are the run's own)
      seen["linked"] = True
      moved = workdir.parent / f"moved-{folder.strip('.') or 'run'}"
      os.rename(workdir / folder if folder != "." else workdir, moved)
      os.symlink(target, workdir / folder if folder != "." else workdir)

  monkeypatch.setattr(recorder.Recorder, "metrics", metrics_then_link)
  before = snapshot(elsewhere)
  code, lines = _train(_run_config(), workdir)
  assert code == 3 and len(lines) == 1, lines
  named = os.path.normpath(str(workdir / folder))
  assert lines[0].startswith(f"cannot write {named}: it became a symbolic link while the run went on (ELOOP)"), lines
  assert snapshot(elsewhere) == before  # nothing written where the link points


def test_a_sweeps_runs_folder_made_a_link_during_a_sweep_fails_the_next_member_and_record(tmp_path, elsewhere):
  """SWEEP/runs and RECORDS/runs are checked when the sweep starts (test_links.py) and again before each member runs
  and each record is saved: made a link in between, the write fails (OutputWriteError, ELOOP: the sweep stops, exit
  3) and nothing lands where the link points."""
  member = _tiny_member(tmp_path)
  sweep_dir, records = tmp_path / "sweep", tmp_path / "records"
  run_dir = sweep.member_dir(str(sweep_dir), member)
  sweep.run_member(io.config_json(member.config), run_dir)  # (the first member, before the link)
  for folder in (sweep_dir / "runs", records / "runs"):
    folder.mkdir(parents=True, exist_ok=True)
    os.rename(folder, tmp_path / f"moved-{folder.parent.name}")
    os.symlink(elsewhere / "rep", folder)
  before = snapshot(elsewhere)
  with pytest.raises(OutputWriteError) as err:
    sweep.run_member(io.config_json(member.config), run_dir)
  assert (err.value.errno, err.value.filename) == (errno.ELOOP, str(sweep_dir / "runs"))
  with pytest.raises(OutputWriteError) as err:
    sweep.save_record(str(tmp_path / "moved-sweep" / member.name), str(records), member.name)
  assert (err.value.errno, err.value.filename) == (errno.ELOOP, str(records / "runs"))
  assert "it became a symbolic link while the run went on (ELOOP); it is a symbolic link" in str(err.value)
  assert snapshot(elsewhere) == before


# --- 2. hard links --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["metrics.jsonl", "events.jsonl", ".lock"])
def test_a_run_file_rewritten_in_place_that_is_a_hard_link_is_refused(entry, tmp_path, elsewhere):
  workdir = tmp_path / "run"
  workdir.mkdir()
  os.link(elsewhere / "notes", workdir / entry)
  before = snapshot(elsewhere)
  line = _one_line(launch(*RUN, f"--workdir={workdir}"), 2)
  assert line.startswith(f"--workdir={str(workdir)!r} holds {entry} with 2 hard links"), line
  assert snapshot(elsewhere) == before and sorted(os.listdir(workdir)) == [entry]


def test_a_sweeps_lock_that_is_a_hard_link_is_refused_and_records_may_be_hard_links(tmp_path, elsewhere):
  sweep_dir = tmp_path / "sweep"
  sweep_dir.mkdir()
  os.link(elsewhere / "notes", sweep_dir / ".lock")
  line = _one_line(launch("--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={sweep_dir}"), 2)
  assert line.startswith(f"--workdir={str(sweep_dir)!r} holds .lock with 2 hard links"), line
  assert (elsewhere / "notes").read_text() == "my notes\n"
  # A records folder is only copied from and into: its hard links (a `cp -al` backup) are harmless, and kept.
  records, backup = tmp_path / "records", tmp_path / "backup"
  folder = _a_record(tmp_path, backup)
  subprocess.run(["cp", "-al", str(backup), str(records)], check=True)
  os.remove(sweep_dir / ".lock")
  proc = launch("--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={sweep_dir}", f"--records={records}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  kept = os.path.join(records, "runs", os.path.basename(folder), "summary.json")
  assert json.load(open(kept))["status"] == "completed"


# --- 3. special files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl"])
def test_report_refuses_a_fifo_at_once(name, tmp_path):
  run = tmp_path / "run"
  _a_run_to_report(run)
  os.remove(run / name)
  os.mkfifo(run / name)
  line = _one_line(launch("--mode=report", f"--workdir={run}", timeout=60), 2)
  assert line == f"{run / name} is a FIFO (named pipe), not a regular file; allowed: a file as a run writes it"


def test_a_sweep_reader_refuses_a_fifo(tmp_path):
  records = tmp_path / "records"
  folder = _a_record(tmp_path, records)
  os.remove(os.path.join(folder, "summary.json"))
  os.mkfifo(os.path.join(folder, "summary.json"))
  proc = launch("--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={tmp_path / 'sweep'}",
                f"--records={records}", timeout=60)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().endswith("is a FIFO (named pipe), not a regular file; allowed: a file as a run writes it")


def test_readers_never_block_on_special_files(tmp_path):
  """The readers of io (every mode reads through them): a FIFO with no writer is refused without waiting."""
  os.mkfifo(tmp_path / "summary.json")
  for read in (io.read_json, io.read_jsonl):
    with pytest.raises(io.DamagedRunFile, match="is a FIFO"):
      read(tmp_path / "summary.json")
  with pytest.raises(io.DamagedRunFile, match=r"cannot be read \(Is a directory\)"):
    io.read_json(tmp_path)


# --- 4. JSON nested without end ------------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def _deep_run(run) -> None:
  _a_run_to_report(run)


@pytest.mark.parametrize("case", ["run config.json", "report summary.json", "report metrics line", "report sweep.json",
                                  "sweep sweep.json", "sweep record config.json", "sweep record summary.json",
                                  "sweep member summary.json"])
def test_json_nested_without_end_is_one_line_naming_the_file(case, tmp_path):
  mode, name = case.split(" ", 1)
  if mode == "run":
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(DEEP)
    args, path = [*RUN, f"--workdir={workdir}"], workdir / "config.json"
  elif mode == "report" and name != "sweep.json":
    run = tmp_path / "run"
    _a_run_to_report(run)
    path = run / ("metrics.jsonl" if name == "metrics line" else name)
    if name == "metrics line":
      path.write_text(path.read_text() + '{"day": 1, "test_accuracy": ' + DEEP + "}\n" + '{"day": 2, "test_accuracy": 1}\n')
    else:
      path.write_text(DEEP)
    args = ["--mode=report", f"--workdir={run}"]
  elif name in ("sweep.json", "record config.json", "record summary.json"):
    records = tmp_path / "records"
    folder = _a_record(tmp_path, records)
    (records / "sweep.json").write_text(json.dumps({"sweep": {"name": "tiny", "axes": []}, "members": []}))
    path = (records / "sweep.json" if name == "sweep.json" else
            os.path.join(folder, name.split()[1]))
    with open(path, "w") as f:
      f.write(DEEP)
    args = (["--mode=report", f"--workdir={records}"] if mode == "report" else
            ["--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={tmp_path / 'sweep'}",
             f"--records={records}"])
  else:  # a member's own summary.json in the sweep directory: read to decide whether it is done
    member = _tiny_member(tmp_path)
    run_dir = tmp_path / "sweep" / "runs" / member.name
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(io.config_json(member.config)))
    (run_dir / "summary.json").write_text(DEEP)
    args, path = ["--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={tmp_path / 'sweep'}"], \
        run_dir / "summary.json"
  proc = launch(*args)
  line = _one_line(proc, 2) if mode != "sweep" or "member" not in name else None
  if line is None:  # a member that cannot be read fails alone; the sweep goes on and says so in its line
    assert "holds JSON nested deeper than this reader follows" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "RecursionError" not in proc.stdout + proc.stderr
    return
  assert str(path) in line and "JSON nested deeper than this reader follows" in line, line


# --- 5. a file-size limit ------------------------------------------------------------------------------------


def _limited_launch(limit: int, workdir) -> subprocess.CompletedProcess:
  """launch.py in a process whose files may not grow past `limit` bytes (`ulimit -f`)."""
  def limit_files():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  args = [a for a in RUN if not a.startswith(("--config.sim.virtual_days", "--config.eval"))]
  return subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *args, "--config.sim.virtual_days=0.01",
                         "--config.eval.every_days=0.0025", "--config.checkpoint.every_days=0.0025",
                         f"--workdir={workdir}"], cwd=ROOT, preexec_fn=limit_files, capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=240)


@pytest.mark.ci  # (the full disk's exit 3 and resume stay in make test)
def test_a_file_size_limit_is_one_line_exit_3_and_the_run_resumes(tmp_path):
  workdir = tmp_path / "run"
  line = _one_line(_limited_launch(10_000, workdir), 3)  # (metrics and config fit; a checkpoint's arrays do not)
  assert line.startswith(f"cannot write {workdir / 'checkpoints'}") and "File too large (EFBIG)" in line, line
  assert "raise the limit and rerun the same command" in line
  resumed = _limited_launch(resource.RLIM_INFINITY, workdir)  # (the same command, no limit now: it goes on)
  assert resumed.returncode == 0 and io.read_summary(workdir)["status"] == "completed", resumed.stderr[-3000:]


def test_a_file_size_limit_at_the_first_probe_leaves_nothing(tmp_path):
  line = _one_line(_limited_launch(0, tmp_path / "new" / "run"), 3)
  assert line.startswith(f"cannot write {tmp_path / 'new' / 'run'}: File too large (EFBIG)"), line
  assert os.listdir(tmp_path) == []


# --- 7. a config file that exits, 8. sweep.json a directory, 9. a huge value --------------------------------------


@pytest.mark.parametrize("body,code", [("import sys\n\ndef get_config(arg=None):\n  sys.exit(0)\n", 0),
                                       ("import sys\nsys.exit(5)\n", 5),
                                       ("def get_config(arg=None):\n  raise SystemExit('bye')\n", "bye")])
def test_a_config_file_that_exits_is_one_line_exit_2(body, code, tmp_path):
  path = tmp_path / "exits.py"
  path.write_text(body)
  line = _one_line(launch(f"--config={path}", f"--workdir={tmp_path / 'run'}"), 2)
  assert line == (f"--config={path}: the config file exited (sys.exit({code!r})) while it was loaded; allowed: a "
                  "config file whose get_config(arg) returns a ConfigDict")
  assert not os.path.exists(tmp_path / "run")
  with pytest.raises(ConfigError, match=rf"config file {str(path)!r} exited \(sys.exit\({code!r}\)\)"):
    fields.load_file(str(path))  # (the notebook API alike)


def test_a_config_file_that_returns_none_is_one_line_without_log_lines(tmp_path):
  path = tmp_path / "none.py"
  path.write_text("def get_config(arg=None):\n  return None\n")
  line = _one_line(launch(f"--config={path}", f"--workdir={tmp_path / 'run'}"), 2)
  assert line.startswith(f"--config={path}: get_config() returned NoneType"), line


@pytest.mark.parametrize("where", ["--workdir", "--records"])
def test_a_sweep_json_that_is_a_directory_is_refused_before_anything_is_made(where, tmp_path):
  folder = tmp_path / ("sweep" if where == "--workdir" else "records")
  (folder / "sweep.json").mkdir(parents=True)
  args = ["--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={tmp_path / 'sweep'}"]
  line = _one_line(launch(*args, *([f"--records={folder}"] if where == "--records" else [])), 2)
  assert line.startswith(f"{where}={str(folder)!r} holds sweep.json as a directory, where a sweep keeps a file"), line
  assert sorted(os.listdir(folder)) == ["sweep.json"] and not os.path.exists(tmp_path / "sweep" / "runs")


def test_an_error_about_a_huge_value_shows_its_start_and_its_size(tmp_path):
  path = tmp_path / "huge.py"
  path.write_text("from fedpsa_jax import config\n\ndef get_config(arg=None):\n  c = config.base_config()\n"
                  "  c.partition.method = 'label_groups'\n  c.partition.group_proportions = (0.1,) * 20_000\n"
                  "  return c\n")
  proc = launch(f"--config={path}", f"--workdir={tmp_path / 'run'}")
  assert proc.returncode == 2 and len(proc.stderr) < 1_000, len(proc.stderr)
  assert "partition.group_proportions=(0.1, 0.1," in proc.stderr and "(20,000 items, 100,000 characters)" in proc.stderr
  # The last resort for a library's message that echoes a value: no printed line is longer than cli.MAX_LINE.
  line = cli.one_line("flag --x=" + "7" * 100_000 + ": bad value; allowed: a number")
  assert len(line) < cli.MAX_LINE + 100 and line.endswith("bad value; allowed: a number") and "characters left out" in line
