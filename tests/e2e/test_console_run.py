"""What a user sees on the console of a whole short run through launch.py: the run's own lines, no absl/JAX
info line unless --verbose asks for them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import forked_launch
from helpers import ROOT

_NO_WORKDIR = ("--workdir is required for --mode=report; allowed: a sweep directory (with sweep.json) or a run "
               "directory (with metrics.jsonl)")


@pytest.mark.slow
def test_the_console_of_a_run_is_the_bar_and_the_result_lines(tmp_path):
  """A whole short run: no absl/JAX info line (they start with 'I' and a date, e.g. JAX's search for a TPU)
  unless --verbose asks for them."""
  base = [sys.executable, "launch.py", "--config=configs/default.py", "--config.model.name=linear",
          "--config.sim.virtual_days=0.002", "--config.runtime.progress=False"]
  quiet = subprocess.run([*base, f"--workdir={tmp_path / 'quiet'}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
  assert quiet.returncode == 0, quiet.stderr
  lines = (quiet.stdout + quiet.stderr).splitlines()
  assert not [line for line in lines if line[:1] == "I" and line[1:5].isdigit()], lines
  assert lines[-2].startswith("fedpsa on mnist_5k: completed") and lines[-1].startswith("outputs in ")
  verbose = subprocess.run([*base, "--verbose", f"--workdir={tmp_path / 'verbose'}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
  assert verbose.returncode == 0 and any(line[:1] == "I" and line[1:5].isdigit()
                                         for line in verbose.stderr.splitlines()), verbose.stderr


def test_launch_started_outside_the_repository_finds_its_default_config(tmp_path):
  """From another working directory, launch.py without --config reads the repository's configs/default.py
  (not a 'no such file' for the relative path): the report mode then asks only for its workdir."""
  done = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), "--mode=report"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  assert (done.returncode, done.stderr.splitlines()) == (2, [_NO_WORKDIR])
  assert os.listdir(tmp_path) == []  # and it wrote nothing there


def test_launch_from_another_directory_finds_a_config_by_its_repository_path_or_its_name(tmp_path):
  """--config=configs/... as typed in the repository's root, or the shipped config's name, from any directory: the
  sweep config loads (its import of fedpsa_lab included), and the report mode asks only for its workdir."""
  for spec in ("configs/paper/table1.py:smoke", "paper/table1:smoke", "default"):
    done = forked_launch.launch("--mode=report", f"--config={spec}", cwd=tmp_path)
    assert (done.returncode, done.stderr.splitlines()) == (2, [_NO_WORKDIR]), spec
  done = forked_launch.launch("--config=configs/nope.py:smoke", cwd=tmp_path)
  (line,) = done.stderr.splitlines()
  assert done.returncode == 2 and line.startswith(f"--config='configs/nope.py:smoke': no such file in {tmp_path}, nor "
                                                  f"a config shipped with fedpsa-jax (in {os.path.join(ROOT, 'configs')}: ")
  assert "paper/{experiment,fig3," in line and line.endswith("allowed: a config file[:arg], or a shipped config by "
                                                             "name[:arg] (default, paper/table1:smoke)")
  assert os.listdir(tmp_path) == []
