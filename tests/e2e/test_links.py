"""The tool writes, moves and deletes only inside the folders it is given: through launch.py, a symbolic link among
the entries it would write through (in a run, sweep or records folder, or a report folder) is refused in one line
naming it, exit 2, before any work, and what the link points to is left as it was; a records folder's member file
that is a link is never copied (fedpsa_jax/io.py, `refuse_links`).

Before, each of these wrote outside: `.lock` and `metrics.jsonl` truncated the file they point to,
`summary.json.tmp` overwrote it, a linked `tensorboard/` lost its event files, a linked `checkpoints/` had its
numbered folders moved into checkpoints_corrupt/, the report was drawn over a linked file, a sweep's `.lock` and a
records folder's `sweep.json.tmp` were overwritten, and `--records` copied a linked `events.jsonl`'s target into
the sweep and the records. Each case here is refused before JAX builds anything: a few seconds each.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from fedpsa_jax import io, sweep
from fedpsa_jax.cli import modes
from fedpsa_jax.errors import ConfigError
import forked_launch
from helpers import small_config

RUN = ["--config=configs/default.py", "--config.model.name=linear", "--config.partition.num_clients=10",
       "--config.sim.virtual_days=0.005", "--config.eval.every_days=0.005", "--config.runtime.progress=False",
       "--config.runtime.tensorboard=True"]
TINY_SWEEP = '''
import ml_collections
from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep


def get_config(arg=None):
  base = config_lib.set_fields(config_lib.base_config(), {
      "method": "fedbuff", "data.name": "mnist_5k", "model.name": "linear", "partition.num_clients": 10,
      "sim.virtual_days": 0.005, "eval.every_days": 0.0025, "runtime.progress": False})
  return ml_collections.ConfigDict({"name": "tiny", "description": "one member", "base": base, "seeds": [0],
                                    "axes": [sweep.axis("method", ["fedbuff"])], "report": {"rows": ["method"]}})
'''


launch = forked_launch.launch


def snapshot(folder) -> dict[str, bytes | str | None]:
  """Every path under `folder` with its content: bytes for a file, None for a folder, 'link to X' for a link."""
  out = {}
  for root, dirs, files in os.walk(folder):
    for name in dirs + files:
      path = os.path.join(root, name)
      out[path] = (f"link to {os.readlink(path)}" if os.path.islink(path) else None if name in dirs
                   else open(path, "rb").read())
  return out


@pytest.fixture
def elsewhere(tmp_path):
  """What a link points to: a user's notes, a private key, TensorBoard logs, numbered folders, a picture."""
  out = tmp_path / "elsewhere"
  out.mkdir()
  (out / "notes").write_text("my notes\n")
  (out / "secret").write_text("PRIVATE KEY\n")
  (out / "tb").mkdir()
  (out / "tb" / "events.out.tfevents.1.host").write_text("my logs")
  for step in ("100", "200"):
    (out / "ckpt" / step).mkdir(parents=True)
    (out / "ckpt" / step / "data").write_text(step)
  (out / "rep").mkdir()
  (out / "picture.png").write_text("my picture")
  return out


def _a_run_to_report(run_dir) -> None:
  run_dir.mkdir()
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"day": 0.01 * i, "test_accuracy": 0.1 * i, "time": 864 * i,
                                                             "round": i}) + "\n" for i in range(3)))
  (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "method": "fedbuff"}))


def _tiny_sweep(tmp_path) -> str:
  path = tmp_path / "tiny_sweep.py"
  path.write_text(TINY_SWEEP)
  return str(path)


def _tiny_member(tmp_path) -> sweep.Member:
  """The tiny sweep's one member (its config file written into tmp_path)."""
  _tiny_sweep(tmp_path)
  sys.path.insert(0, str(tmp_path))
  try:
    return sweep.expand(__import__("tiny_sweep").get_config())[0]
  finally:
    sys.path.remove(str(tmp_path))
    sys.modules.pop("tiny_sweep", None)


def _a_record(tmp_path, records) -> str:
  """A finished member's record of the tiny sweep, as --records keeps it: the sweep restores it and runs nothing."""
  member = _tiny_member(tmp_path)
  folder = sweep.member_dir(str(records), member)
  os.makedirs(folder)
  json.dump(io.config_json(member.config), open(os.path.join(folder, "config.json"), "w"))
  json.dump({"status": "completed", "final_test_accuracy": 0.5}, open(os.path.join(folder, "summary.json"), "w"))
  open(os.path.join(folder, "metrics.jsonl"), "w").write(json.dumps({"day": 0.005, "test_accuracy": 0.5}) + "\n")
  return folder


# (id, the folder given, the link in it -> what it points to, the command's arguments, the flag naming the folder)
CASES = [
    ("run .lock", "run", ".lock", "notes", lambda t: [*RUN, f"--workdir={t / 'run'}"], "--workdir"),
    ("run metrics.jsonl", "run", "metrics.jsonl", "notes", lambda t: [*RUN, f"--workdir={t / 'run'}"], "--workdir"),
    ("run summary.json.tmp", "run", "summary.json.tmp", "notes", lambda t: [*RUN, f"--workdir={t / 'run'}"],
     "--workdir"),
    ("run tensorboard/", "run", "tensorboard", "tb", lambda t: [*RUN, f"--workdir={t / 'run'}"], "--workdir"),
    ("run checkpoints/", "run", "checkpoints", "ckpt", lambda t: [*RUN, f"--workdir={t / 'run'}"], "--workdir"),
    ("report file", "run", "report/learning_curve.png", "picture.png",
     lambda t: ["--mode=report", f"--workdir={t / 'run'}"], "--workdir"),
    ("sweep .lock", "sweep", ".lock", "notes",
     lambda t: ["--mode=sweep", f"--config={_tiny_sweep(t)}", f"--workdir={t / 'sweep'}"], "--workdir"),
    ("records sweep.json.tmp", "records", "sweep.json.tmp", "notes",
     lambda t: ["--mode=sweep", f"--config={_tiny_sweep(t)}", f"--workdir={t / 'sweep'}", f"--records={t / 'records'}"],
     "--records"),
]


@pytest.mark.parametrize("folder,entry,target,args,flag", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_a_link_the_tool_would_write_through_is_refused_in_one_line(folder, entry, target, args, flag, tmp_path,
                                                                     elsewhere):
  if entry.startswith("report"):
    _a_run_to_report(tmp_path / folder)
  link = tmp_path / folder / entry
  link.parent.mkdir(parents=True, exist_ok=True)
  os.symlink(elsewhere / target, link)
  before = snapshot(elsewhere)
  proc = launch(*args(tmp_path))
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
      f"{flag}={str(tmp_path / folder)!r} holds {entry} as a symbolic link (to {str(elsewhere / target)!r}), which "
      "this tool would follow out of the folder it was given (it writes, moves and deletes only inside it); allowed: "
      f"entries of the folder's own (remove the link {str(link)!r}, or replace it by a copy), or another {flag}"]
  assert snapshot(elsewhere) == before
  assert not os.path.exists(tmp_path / "sweep" / "sweep.json")  # (no work: a sweep writes sweep.json first)


def test_a_records_member_file_that_is_a_link_is_never_copied(tmp_path, elsewhere):
  """A record whose events.jsonl points at a private file: refused before anything is restored or saved, so its
  content reaches neither the sweep nor the records, and the link stays a link."""
  records = tmp_path / "records"
  member = _a_record(tmp_path, records)
  os.symlink(elsewhere / "secret", os.path.join(member, "events.jsonl"))
  proc = launch("--mode=sweep", f"--config={_tiny_sweep(tmp_path)}", f"--workdir={tmp_path / 'sweep'}",
                f"--records={records}")
  assert proc.returncode == 2, proc.stderr[-3000:]
  [line] = proc.stderr.splitlines()
  assert line.startswith(f"--records={str(records)!r} holds runs/{os.path.basename(member)}/events.jsonl as a "
                         "symbolic link")
  copies = [path for path, content in snapshot(tmp_path).items() if content == b"PRIVATE KEY\n"]
  assert copies == [str(elsewhere / "secret")]
  assert os.path.islink(os.path.join(member, "events.jsonl"))


def test_profile_refuses_a_linked_trace_folder(tmp_path, elsewhere):
  """--mode=profile writes WORKDIR/profile.json and, with --profile_trace, WORKDIR/trace/: refused before profiling."""
  workdir = tmp_path / "profile"
  workdir.mkdir()
  os.symlink(elsewhere / "rep", workdir / "trace")
  with pytest.raises(ConfigError, match=r"holds trace as a symbolic link"):
    modes.profile(small_config("fedbuff"), str(workdir), trace=True)
  assert os.listdir(elsewhere / "rep") == [] and os.listdir(workdir) == ["trace"]


def test_copies_of_records_keep_links_as_links(tmp_path, elsewhere):
  """Past the check (a link made while a sweep runs), restoring and saving a record copy a link as a link, never
  the file it points to."""
  records, sweep_dir = tmp_path / "records", tmp_path / "sweep"
  member_folder = _a_record(tmp_path, records)
  name = os.path.basename(member_folder)
  os.symlink(elsewhere / "secret", os.path.join(member_folder, "events.jsonl"))
  assert sweep.restore_records(str(records), str(sweep_dir), [_tiny_member(tmp_path)]) == [name]
  assert os.path.islink(sweep_dir / "runs" / name / "events.jsonl")
  assert sweep.save_record(str(sweep_dir / "runs" / name), str(tmp_path / "kept"), name)
  assert os.path.islink(tmp_path / "kept" / "runs" / name / "events.jsonl")
  copies = [path for path, content in snapshot(tmp_path).items() if content == b"PRIVATE KEY\n"]
  assert copies == [str(elsewhere / "secret")]
