"""A run's identity (fedpsa_jax/run_identity.py): the shared sections plus the run's own method section.

Every config carries every strategy's section, so before this a field added to CASA's section made every
FedPSA workdir refuse to resume and every finished sweep member train again. Here, for each of the four
places that ask "is this the same run?" (io.check_workdir, the runner's checkpoint check, sweep.is_done,
cli.run_name.resumable_workdir):
- a run written when another method's section had one field fewer (and one unknown field more) is
  still the same run: it resumes, counts as done, is found by --resume;
- a change to a field the run uses (the method's own `fedpsa.gamma`, the shared `local.lr`) still makes
  it another run, and the message names the field.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, run_identity, strategies, sweep
from fedpsa_jax.cli import run_name
from fedpsa_jax.config.fields import ADDED_FIELDS
from fedpsa_jax.cli.run_name import RunName
from fedpsa_jax.sim import runner
from fedpsa_lab import paper
from helpers import small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAYS = 0.01


def _current(method: str = "fedpsa", days: float = DAYS) -> ml_collections.ConfigDict:
  c = small_config(method, days=days)
  c.lock()  # as launch.py hands it over (lock_config=True): the runner must not need to add fields
  return c


def _older(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`c` as an older version of the code wrote it: CASA's section one field short, FedFa's with a field
  this code does not know."""
  old = copy.deepcopy(c)
  old.unlock()
  del old.casa[sorted(old.casa.keys())[0]]
  old.fedfa.knob_of_the_past = 1
  return old


def _changed(c: ml_collections.ConfigDict, fields: dict) -> ml_collections.ConfigDict:
  return config_lib.set_fields(copy.deepcopy(c), fields)


# --- the predicate ------------------------------------------------------------------------------------


def test_identity_leaves_out_other_methods_sections_the_runtime_and_resumable_fields():
  c = io.config_json(_current("fedpsa"))
  identity = run_identity.run_identity(c)
  assert "fedpsa.gamma" in identity and "local.lr" in identity and "fedpsa.sketch_dim" in identity
  assert not any(k.startswith(("casa.", "fedbuff.", "fedfa.", "runtime.")) for k in identity)
  assert not set(run_identity.RESUMABLE_FIELDS) & set(identity)
  old = io.config_json(_older(_current("fedpsa")))
  assert old != c  # the whole configs differ...
  assert run_identity.identity_differences(old, c) == []  # ...the runs do not
  # Every runtime field may change: they never change a result.
  other_runtime = io.config_json(_changed(_current(), {"runtime.execution": "vmap", "runtime.jobs_ahead": 0,
                                                       "runtime.phase_timing": True, "runtime.progress": True}))
  assert run_identity.identity_differences(c, other_runtime) == []


def test_every_section_is_shared_runtime_or_a_methods():
  """The identity names its shared sections (no strategy registry, no JAX): a section added to the schema
  must be added there too, or it would silently leave the identity."""
  c = config_lib.base_config()
  methods = set(strategies.registered())
  assert set(c.keys()) == set(config_lib.SHARED_SECTIONS) | {config_lib.RUNTIME_SECTION} | methods
  assert not set(config_lib.SHARED_SECTIONS) & methods


def test_run_identity_imports_neither_jax_nor_the_strategies():
  code = ("import sys; from fedpsa_jax import io, run_identity, sweep; "
          "assert 'jax' not in sys.modules and 'fedpsa_jax.strategies' not in sys.modules, sorted(sys.modules)")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_identity_names_the_changed_field_of_the_own_section_or_a_shared_one():
  c = io.config_json(_current("fedpsa"))
  assert run_identity.identity_differences(c, io.config_json(_changed(_current(), {"fedpsa.gamma": 2.0}))) == [
      "fedpsa.gamma: 5.0 -> 2.0"]
  assert run_identity.identity_differences(c, io.config_json(_changed(_current(), {"local.lr": 0.02}))) == [
      "local.lr: 0.05 -> 0.02"]
  assert run_identity.identity_differences(c, io.config_json(_changed(_current(), {"casa.gamma": 0.5}))) == []
  # Another method: the method line, not a list of both sections.
  other = run_identity.identity_differences(c, io.config_json(_current("fedbuff")))
  assert other == ["method: 'fedpsa' -> 'fedbuff'"]


def test_a_field_added_since_is_read_at_the_value_the_runs_before_it_had():
  # R1's records (results/table1_mnist_5k) were written before fedpsa.step, fedpsa.server_lr and FedBuff's weighting
  # and step existed: they are today's runs at the defaults, and another value is another run.
  for method in ("fedpsa", "fedbuff"):
    record = os.path.join(ROOT, "results", "table1_mnist_5k", "runs", f"method={method},alpha=0.1,seed=0")
    saved = io.read_config(record)
    added = {k.split(".", 1)[1]: v for k, v in ADDED_FIELDS.items() if k.startswith(method + ".")}
    assert not set(added) & set(saved[method])  # (written before them)
    current = copy.deepcopy(saved)
    current[method].update(added)
    assert added and run_identity.identity_differences(saved, current) == []
    assert run_identity.identity_differences(current, saved) == []
    field = "fedpsa.server_lr" if method == "fedpsa" else "fedbuff.step"
    current[method][field.split(".")[1]] = 2.0 if method == "fedpsa" else "unit"
    assert run_identity.identity_differences(saved, current) == [
        f"{field}: {ADDED_FIELDS[field]!r} -> {current[method][field.split('.')[1]]!r}"]
  # Each listed value is today's default.
  defaults = config_lib.base_config()
  for dotted, value in ADDED_FIELDS.items():
    section, name = dotted.split(".")
    assert defaults[section][name] == value, dotted


# --- io.check_workdir and the runner's checkpoint check -------------------------------------------------


@pytest.mark.slow
def test_run_of_an_older_config_shape_resumes_and_extends(tmp_path):
  workdir = str(tmp_path / "run")
  old = _older(_current())
  first = runner.Simulation(old, workdir).run()
  saved = io.read_config(workdir)
  assert "knob_of_the_past" in saved["fedfa"] and len(saved["casa"]) == len(_current().casa) - 1

  again = runner.Simulation(_current(), workdir)  # no ConfigError: the same run
  assert again.resumed_from == config_lib.budget_units(old) and again.status == "completed"
  assert {k: v for k, v in again.run().items() if k not in runner.PROCESS_FIELDS} == {
      k: v for k, v in first.items() if k not in runner.PROCESS_FIELDS}

  before = open(os.path.join(workdir, "metrics.jsonl")).read()
  longer = runner.Simulation(_current(days=1.5 * DAYS), workdir)
  assert longer.resumed_from == config_lib.budget_units(old)  # continued from its end, not started over
  summary = longer.run()
  assert summary["status"] == "completed" and summary["virtual_days"] == pytest.approx(1.5 * DAYS)
  # (the summary says which checkpoint its process continued from; None for the process that started the run)
  assert first["provenance"]["resumed_from_day"] is None
  assert summary["provenance"]["resumed_from_day"] == config_lib.budget_units(old) / config_lib.UNITS_PER_DAY
  after = open(os.path.join(workdir, "metrics.jsonl")).read()
  assert after.startswith(before) and len(after) > len(before)


@pytest.mark.slow
@pytest.mark.parametrize("fields,named", [({"fedpsa.gamma": 2.0}, "fedpsa.gamma: 5.0 -> 2.0"),
                                         ({"local.lr": 0.02}, "local.lr: 0.05 -> 0.02")])
def test_a_field_the_run_uses_still_refuses_to_resume(fields, named, tmp_path):
  workdir = str(tmp_path / "run")
  runner.Simulation(_older(_current()), workdir).run()
  with pytest.raises(config_lib.ConfigError, match=named.replace(".", r"\.")) as err:
    runner.Simulation(_changed(_current(), fields), workdir)
  assert "--workdir=" in str(err.value) and "allowed" in str(err.value)
  # The checkpoint's own config is checked the same way (config.json rewritten to pass io.check_workdir).
  changed = _changed(_current(), fields)
  io.write_json_atomic(os.path.join(workdir, "config.json"), io.config_json(changed))
  with pytest.raises(config_lib.ConfigError, match=r"checkpoint .* different config .*" + named.replace(".", r"\.")):
    runner.Simulation(changed, workdir)
  # ...and an older config shape in the checkpoint is no difference there either.
  io.write_json_atomic(os.path.join(workdir, "config.json"), io.config_json(_current()))
  assert runner.Simulation(_current(), workdir).resumed_from is not None


# --- sweep.is_done ---------------------------------------------------------------------------------------


def _one_member_sweep() -> ml_collections.ConfigDict:
  base = paper.paper_base(smoke=True)
  base.model.name = "linear"
  base.partition.num_clients = 10
  base.sim.virtual_days = 0.005
  base.eval.every_days = 0.0025
  return paper.sweep_config("identity", "identity", base, [paper.method_axis(("fedpsa",))], [0],
                            {"rows": ["method"], "cols": []})


@pytest.mark.slow
def test_finished_sweep_member_of_an_older_config_shape_is_done(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  first = sweep.run_local(_one_member_sweep(), sweep_dir, log=lambda _: None)
  [(name, summary)] = first.items()
  assert summary["sweep_action"] == "ran"
  run_dir = sweep.member_dir(sweep_dir, name)
  saved = io.read_config(run_dir)
  del saved["casa"][sorted(saved["casa"])[0]]  # as the older code wrote it
  saved["fedfa"]["knob_of_the_past"] = 1
  io.write_json_atomic(os.path.join(run_dir, "config.json"), saved)

  member = sweep.expand(_one_member_sweep())[0]
  assert sweep.is_done(io.config_json(member.config), run_dir)
  again = sweep.run_local(_one_member_sweep(), sweep_dir, log=lambda _: None)
  assert again[name]["sweep_action"] == "skipped"

  for fields in ({"fedpsa.gamma": 2.0}, {"local.lr": 0.02}, {"sim.virtual_days": 0.0075}):
    changed = _one_member_sweep()
    config_lib.set_fields(changed.base, fields)
    assert not sweep.is_done(io.config_json(sweep.expand(changed)[0].config), run_dir), fields
  other_method = _one_member_sweep()
  config_lib.set_fields(other_method.base, {"casa.gamma": 0.5, "fedbuff.buffer_size": 2})
  assert sweep.is_done(io.config_json(sweep.expand(other_method)[0].config), run_dir)


# --- run directory names and --resume (cli.run_name) --------------------------------------------------------

STAMP = datetime.datetime(2024, 1, 2, 3, 4, 5)


@pytest.mark.parametrize("config_path,name", [
    ("configs/default.py", "default-20240102-030405"),
    ("configs/paper/table1.py:smoke,seeds=3", "table1-smoke_seeds-3-20240102-030405"),
    ("configs/my-job.py:method=fed-buff", "my-job-method-fed-buff-20240102-030405"),  # dashes in both parts
])
def test_a_run_name_is_formatted_and_parsed_back(config_path, name):
  formatted = RunName.of(config_path, STAMP)
  assert formatted.format() == name
  assert RunName.parse(name) == formatted
  assert RunName.parse(RunName.parse(name).format()) == formatted


def test_a_directory_that_is_not_a_run_name_parses_to_none():
  for name in ("default", "default-20240102", "20240102-030405", "default-20240102-030405-profile",
               "default-20241302-030405", "default-2024010-0304050", "table1-smoke"):
    assert RunName.parse(name) is None, name


def test_sweep_and_default_workdirs_share_the_stem():
  assert run_name.sweep_workdir("configs/paper/table1.py:smoke") == os.path.join("runs", "table1-smoke")
  made = RunName.parse(os.path.basename(run_name.default_workdir("configs/paper/table1.py:smoke")))
  assert made.stem == "table1-smoke" and made.stamp is not None


def _write_run(path, config_json: dict) -> None:
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config_json, f)


def test_resume_finds_the_run_across_another_methods_section(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  current = _current()
  _write_run("runs/default-20240101-000000", io.config_json(_older(current)))
  _write_run("runs/default-20240102-000000", io.config_json(_changed(current, {"local.lr": 0.02})))  # newer
  _write_run("runs/other-20240103-000000", io.config_json(current))  # another config file's run
  _write_run("runs/default-smoke-20240104-000000", io.config_json(current))  # the same file with an arg
  _write_run("runs/default-20240105-000000-profile", io.config_json(current))  # not a run name
  found = run_name.resumable_workdir("configs/default.py", current)
  assert found == os.path.join("runs", "default-20240101-000000")
  assert run_name.resumable_workdir("configs/default.py:smoke", current) == os.path.join(
      "runs", "default-smoke-20240104-000000")
  with pytest.raises(config_lib.ConfigError, match="--resume found no run of this config under runs/default-"):
    run_name.resumable_workdir("configs/default.py", _changed(current, {"fedpsa.gamma": 2.0}))
