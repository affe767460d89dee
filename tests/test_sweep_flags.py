"""`--sweep` (fedpsa_jax/cli/sweep_flags.py): the grammar against hand-written grids, the sweep it builds against
the same sweep written as a config file (member names, overrides and run configs), and each bad grid refused in
one line before anything is written (the grid run whole: tests/e2e/test_sweep_runs.py)."""

from __future__ import annotations

import os

import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, sweep
from fedpsa_jax.cli import modes, sweep_flags
from fedpsa_jax.cli.sweep_flags import GridAxis
from helpers import ROOT

DEFAULT = os.path.join(ROOT, "configs", "default.py")


def _axes(*texts: str) -> list[tuple[str, list]]:
  return [(a.name, a.values) for a in sweep_flags.parse(texts)]


def test_the_grammar_reads_axes_values_and_ranges_as_written():
  assert sweep_flags.parse(["method=fedbuff,fedpsa seed=0:3 partition.alpha=0.1,1.0"]) == [
      GridAxis("method", ["fedbuff", "fedpsa"], "method=fedbuff,fedpsa"), GridAxis("seed", [0, 1, 2], "seed=0:3"),
      GridAxis("partition.alpha", [0.1, 1.0], "partition.alpha=0.1,1.0")]
  # Axes over several flags and any whitespace; a range with a step, one counting down, ranges among values.
  assert _axes("  method=fedbuff ", "seed=2:8:3\talpha=1") == [("method", ["fedbuff"]), ("seed", [2, 5]),
                                                                ("alpha", [1])]
  assert _axes("seed=0:2,7 local.epochs=3:0:-1 x=-2:0") == [("seed", [0, 1, 7]), ("local.epochs", [3, 2, 1]),
                                                           ("x", [-2, -1])]
  # Values as after a config file's colon: literals, else text; brackets and quotes keep a comma or a space.
  assert _axes("partition.group_proportions=(0.5, 0.5),(0.3,0.7) data.name='a b',c") == [
      ("partition.group_proportions", [(0.5, 0.5), (0.3, 0.7)]), ("data.name", ["a b", "c"])]
  assert _axes("runtime.progress=True,False local.lr=1e-3,0.1") == [("runtime.progress", [True, False]),
                                                                   ("local.lr", [0.001, 0.1])]
  assert _axes("seed=0:3.5") == [("seed", ["0:3.5"])]  # (not a range: text, which the field then refuses)


def _config_file_sweep(tmp_path, axes: str, seeds: str) -> config_lib.ConfigDict:
  """The same sweep written as a sweep config file, as configs/results/*.py write theirs."""
  path = tmp_path / "grid.py"
  path.write_text(f"""
from fedpsa_jax import config, sweep
from fedpsa_lab import paper

def get_config(arg=None):
  base = config.load_file({DEFAULT!r})
  return paper.sweep_config("grid", "grid", base, {axes}, {seeds}, {{}})
""")
  return config_lib.load_file(str(path))


def test_a_grid_is_the_sweep_its_config_file_would_be(tmp_path):
  base = config_lib.load_file(DEFAULT)
  grid = sweep_flags.grid_sweep(base, ["method=fedbuff,fedpsa seed=0:3", "alpha=0.1,1"], "configs/default.py")
  written = _config_file_sweep(tmp_path, '[sweep.axis("method", ["fedbuff", "fedpsa"]), '
                               'sweep.axis("alpha", [0.1, 1.0], "partition.alpha")]', "[0, 1, 2]")
  ours, theirs = sweep.expand(grid), sweep.expand(written)
  assert [m.name for m in ours] == [m.name for m in theirs] == [
      f"method={m},alpha={a},seed={s}" for m in ("fedbuff", "fedpsa") for a in (0.1, 1.0) for s in (0, 1, 2)]
  assert [m.overrides for m in ours] == [m.overrides for m in theirs]
  assert [io.config_json(m.config) for m in ours] == [io.config_json(m.config) for m in theirs]
  assert set(grid.keys()) == set(written.keys())  # the same sweep config, read by the same sweep mode and report
  assert grid.name == "default-sweep" and sweep_flags.workdir("configs/default.py") == "runs/default-sweep"
  assert dict(grid.report)["rows"] == ["method"] and dict(grid.report)["cols"] == ["alpha"]


def test_without_a_seed_axis_the_members_keep_the_config_s_seed(tmp_path):
  base = config_lib.load_file(DEFAULT + ":seed=7")
  grid = sweep_flags.grid_sweep(base, ["local.lr=0.05,0.1"], "configs/default.py:seed=7")
  written = _config_file_sweep(tmp_path, '[sweep.axis("local.lr", [0.05, 0.1])]', "[0]")
  assert [m.name for m in sweep.expand(grid)] == ["local.lr=0.05,seed=7", "local.lr=0.1,seed=7"]
  assert [m.name for m in sweep.expand(written)] == ["local.lr=0.05,seed=0", "local.lr=0.1,seed=0"]
  assert grid.name == "default-seed-7-sweep" and dict(grid.report)["rows"] == ["local.lr"]


@pytest.mark.parametrize("grid, message", [
    ("method=fedbuff,fedpsa nosuch=1,2", "--sweep axis 'nosuch=1,2': config field 'nosuch' does not exist"),
    ("sim.virtal_days=1", "--sweep axis 'sim.virtal_days=1': config field 'sim.virtal_days' does not exist; did you "
                          "mean 'sim.virtual_days'?"),
    ("partition=0.1", "--sweep axis 'partition=0.1': 'partition' is a section of the config, not a field; allowed: "
                      "one of its fields, e.g. partition."),
    ("method=", "--sweep axis 'method=' has no values; allowed: space-separated axes"),
    ("method=,", "--sweep axis 'method=,' has no values"),
    ("method", "--sweep item 'method' is not an axis; allowed:"),
    ("=fedbuff", "--sweep item '=fedbuff' is not an axis"),
    ("", "--sweep names no axis; allowed:"),
    ("seed=3:3", "--sweep axis 'seed=3:3': the range 3:3 holds 0 values; allowed: 1 to 10,000"),
    ("seed=0:3:0", "--sweep axis 'seed=0:3:0': the range 0:3:0 has step 0"),
    ("seed=0:99999999", "--sweep axis 'seed=0:99999999': the range 0:99999999 holds 99,999,999 values"),
    ("alpha=0.1,x", "--sweep axis 'alpha=0.1,x': config field partition.alpha='x' is invalid; allowed: a value of "
                    "type float, like its default 0.1"),
    ("virtual_days=True", "--sweep axis 'virtual_days=True': config field sim.virtual_days=True is invalid"),
    ("seed=0:2.5", "--sweep axis 'seed=0:2.5': config field seed='0:2.5' is invalid; allowed: a value of type int"),
    ("method=fedbuff,fedbuff", "--sweep axis 'method=fedbuff,fedbuff' gives method='fedbuff' twice"),
    ("alpha=1,1.0", "--sweep axis 'alpha=1,1.0' gives partition.alpha=1.0 twice"),
    ("alpha=0.1 partition.alpha=0.5", "--sweep axes 'alpha=0.1' and 'partition.alpha=0.5' both set partition.alpha"),
    # Values the config's validation refuses: named with the member they first appear in.
    ("method=fedbuff,fedbux", "--sweep='method=fedbuff,fedbux': sweep 'default-sweep', member method=fedbux,seed=0: "
                              "invalid config: method='fedbux' is invalid; allowed: "),
    ("seed=0,1 alpha=-1", "--sweep='seed=0,1 alpha=-1': sweep 'default-sweep', member alpha=-1.0,seed=0: invalid "
                          "config: partition.alpha=-1.0 is invalid; allowed: a number > 0"),
    ("seed=-1", "--sweep='seed=-1': sweep seeds=[-1] is invalid; allowed: a list of 1 to 1,000 integers"),
    ("data.name='a b'", "--sweep=\"data.name='a b'\": sweep 'default-sweep': label(s) ['a b'] cannot be part of a "
                        "directory name"),
])
def test_a_bad_grid_is_one_line_naming_its_axis_before_anything_is_written(tmp_path, grid, message):
  workdir = str(tmp_path / "sweep")
  options = modes.Options("configs/default.py", mode="sweep", sweep=(grid,), workdir=workdir)
  with pytest.raises(config_lib.ConfigError) as err:
    modes.run_mode(config_lib.load_file(DEFAULT), options)
  assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
  assert not os.path.exists(workdir)


def test_sweep_is_refused_with_a_sweep_config_and_outside_the_sweep_mode():
  table1 = config_lib.load_file(os.path.join(ROOT, "configs/paper/table1.py:smoke"))
  options = modes.Options("configs/paper/table1.py:smoke", mode="sweep", sweep=("seed=0:2",), workdir="unused")
  with pytest.raises(config_lib.ConfigError, match=r"^--sweep needs a run config, but --config='configs/paper/"
                                                   r"table1.py:smoke' is a sweep config \(it has its own axes\); "):
    modes.run_mode(table1, options)
  for mode in ("train", "profile", "report"):
    with pytest.raises(config_lib.ConfigError, match=rf"^--sweep is only for --mode=sweep, not --mode={mode}; "):
      modes.run_mode(config_lib.base_config(), modes.Options("configs/default.py", mode=mode, sweep=("seed=0:2",)))
