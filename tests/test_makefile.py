"""The Makefile's set-up (`make -n`: what it would run, nothing installed), on a copy of it in a temporary folder:

- the CPU set-up runs exactly the commands it always did, and a CPU venv already set up is not set up again;
- `GPU=cuda12` installs the same requirements plus JAX's own `cuda12` extra at requirements.txt's jax version, with
  a stamp of its own, and is remembered: later commands without GPU= use the GPU venv as it is;
- a GPU value JAX has no extra for fails in one line (exit 2); an environment variable GPU is ignored.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")

CPU_COMMANDS = [
    "test -x .venv/bin/python || python3 -m venv .venv",
    ".venv/bin/python -m pip install --quiet --upgrade pip",
    ".venv/bin/python -m pip install --quiet -r requirements.txt",
    ".venv/bin/python -m pip install --quiet --no-deps -e .",
    "touch .venv/.installed",
]


def jax_version() -> str:
  return re.search(r"^jax==([\w.]+)", open(os.path.join(ROOT, "requirements.txt")).read(), re.M).group(1)


@pytest.fixture
def project(tmp_path):
  for name in ("Makefile", "requirements.txt", "pyproject.toml"):
    shutil.copy(os.path.join(ROOT, name), tmp_path / name)
  return tmp_path


def make(project, *args, env=None) -> subprocess.CompletedProcess:
  environ = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "GPU"}
  return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=project, capture_output=True, text=True,
                        env={**environ, **(env or {})})


def set_up(project, *stamps: str, gpu: str | None = None) -> None:
  """A venv as a finished set-up leaves it: its stamps newer than requirements.txt and pyproject.toml."""
  venv = project / ".venv"
  venv.mkdir()
  if gpu:
    (venv / ".gpu").write_text(gpu + "\n")
  later = time.time() + 10
  for stamp in stamps:
    (venv / stamp).touch()
    os.utime(venv / stamp, (later, later))


def test_the_cpu_set_up_is_what_it_always_was(project):
  out = make(project, "setup")
  assert out.returncode == 0, out.stderr
  assert out.stdout.splitlines() == CPU_COMMANDS


def test_a_cpu_venv_already_set_up_is_left_alone(project):
  set_up(project, ".installed")
  out = make(project, "setup")
  assert out.returncode == 0 and "pip" not in out.stdout, out.stdout


def test_gpu_cuda12_adds_jax_own_extra_at_the_pinned_version(project):
  out = make(project, "setup", "GPU=cuda12")
  assert out.returncode == 0, out.stderr
  assert out.stdout.splitlines() == [
      CPU_COMMANDS[0], CPU_COMMANDS[1],
      f'.venv/bin/python -m pip install --quiet -r requirements.txt "jax[cuda12]=={jax_version()}"',
      CPU_COMMANDS[3], "echo cuda12 > .venv/.gpu", "touch .venv/.installed-cuda12"]


def test_a_gpu_venv_is_remembered_and_not_set_up_again(project):
  set_up(project, ".installed-cuda12", gpu="cuda12")
  out = make(project, "setup")
  assert out.returncode == 0 and "pip" not in out.stdout, out.stdout
  # A CPU venv turned into a GPU one: its CPU stamp does not count for the GPU build.
  (project / ".venv" / ".installed-cuda12").unlink()
  (project / ".venv" / ".installed").touch()
  assert '"jax[cuda12]==' in make(project, "setup").stdout


def test_a_requirements_change_sets_the_gpu_venv_up_again_with_its_extra(project):
  set_up(project, ".installed-cuda12", gpu="cuda12")
  later = time.time() + 20
  os.utime(project / "requirements.txt", (later, later))
  assert '"jax[cuda12]==' in make(project, "setup").stdout


def test_an_unknown_gpu_build_fails_in_one_line(project):
  out = make(project, "setup", "GPU=cuda11")
  assert out.returncode == 2 and not out.stdout
  assert "GPU=cuda11 is invalid; allowed: cuda12 cuda13 (JAX's CUDA builds), or none for the CPU build" in out.stderr


def test_an_environment_variable_gpu_is_not_the_make_variable(project):
  out = make(project, "setup", env={"GPU": "0"})
  assert out.returncode == 0 and out.stdout.splitlines() == CPU_COMMANDS
