"""pyproject.toml declares what the package needs, in agreement with requirements.txt's pins: `pip install .`
into a fresh environment gives a package that imports and runs, and `make` keeps installing the exact pins. The
wheel holds every package and the configs (found by name from any directory), the `fedpsa-jax` command, and a
package whose public names are its API; built and installed elsewhere, it runs the README's example."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pins() -> dict[str, str]:
  """requirements.txt: {normalised name: pinned version}."""
  pins = {}
  for line in open(os.path.join(ROOT, "requirements.txt")):
    line = line.split("#")[0].strip()
    if line:
      name, version = line.split("==")
      pins[_name(name)] = version.strip()
  return pins


def _name(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower().strip()


def _project() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]


def test_every_pin_is_declared_by_the_package_and_satisfies_its_range():
  project = _project()
  declared = [Requirement(r) for r in project["dependencies"]]
  for extra in project["optional-dependencies"].values():
    declared += [Requirement(r) for r in extra]
  pins = _pins()
  assert {_name(r.name) for r in declared} == set(pins)  # nothing pinned left out, nothing declared unpinned
  for r in declared:
    assert r.specifier.contains(pins[_name(r.name)]), (str(r), pins[_name(r.name)])


def test_what_the_package_imports_is_a_dependency_and_the_optional_parts_are_extras():
  project = _project()
  core = {_name(Requirement(r).name) for r in project["dependencies"]}
  assert {"jax", "jaxlib", "flax", "optax", "ml-collections", "absl-py", "numpy", "orbax-checkpoint",
          "tensorflow-datasets", "mlxtend", "tqdm", "scipy", "scikit-learn", "tensorboardx", "pandas",
          "matplotlib"} <= core
  extras = {name: {_name(Requirement(r).name) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
  assert set(extras) == {"ray", "notebook", "tensorboard", "test"}
  assert "ray" not in core and "pytest" not in core and "tensorboard" not in core
  assert "ray" in extras["ray"] and "pytest" in extras["test"] and "tensorboard" in extras["tensorboard"]
  assert {"ipykernel", "nbconvert", "ipywidgets"} <= extras["notebook"]  # a kernel, headless execution, the bars


# --- what the wheel holds ----------------------------------------------------------------------------


def _setuptools() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["tool"]["setuptools"]


def test_the_wheel_lists_every_package_of_the_tree_and_the_configs_as_fedpsa_configs():
  """pyproject.toml lists the packages by hand (`find` cannot rename configs/): a package added to the tree and
  not to the list would be missing from every install but an editable one."""
  from setuptools import find_namespace_packages, find_packages

  listed = _setuptools()["packages"]
  code = find_packages(ROOT, include=["fedpsa_jax*", "fedpsa_lab*"])
  configs = ["fedpsa_configs", *(f"fedpsa_configs.{p}" for p in find_namespace_packages(
      os.path.join(ROOT, "configs"), exclude=["*__pycache__*"]))]
  assert sorted(listed) == sorted(code + configs)
  assert len(listed) == len(set(listed)) and {"fedpsa_configs.paper", "fedpsa_configs.results"} <= set(configs)
  assert _setuptools()["package-dir"] == {"fedpsa_configs": "configs"}


def test_the_console_script_is_the_main_that_launch_py_runs():
  from fedpsa_lab import launch

  assert _project()["scripts"] == {"fedpsa-jax": "fedpsa_lab.launch:main"}
  source = open(os.path.join(ROOT, "launch.py")).read()
  assert "from fedpsa_lab import launch" in source and source.rstrip().endswith("launch.main()")
  assert callable(launch.main)


# --- configs by name, from any directory ---------------------------------------------------------------


def test_shipped_configs_are_found_by_name_and_a_path_that_exists_wins(tmp_path, monkeypatch):
  from fedpsa_jax.config import shipped

  monkeypatch.chdir(tmp_path)
  configs = os.path.join(ROOT, "configs")
  assert os.path.samefile(shipped.configs_dir(), configs)
  for name, file in [("default", "default.py"), ("default.py", "default.py"), ("configs/default.py", "default.py"),
                     ("paper/table1", "paper/table1.py"), ("./configs/paper/table1.py", "paper/table1.py"),
                     ("results/horizon", "results/horizon.py")]:
    assert os.path.samefile(shipped.locate(name), os.path.join(configs, file)), name
  assert shipped.locate_spec("paper/table1:smoke,seeds=2").endswith(os.path.join("paper", "table1.py") + ":smoke,seeds=2")
  for missing in ("nope", "paper", "../configs/default", "/configs/default.py", "__init__", ""):
    assert shipped.locate(missing) is None, missing
  names = shipped.names()
  assert {"default", "casa", "aifed", "paper/experiment", "paper/table1", "results/tuned"} <= set(names)
  assert "__init__" not in names and all(shipped.locate(n) for n in names)
  own = tmp_path / "configs" / "default.py"  # a file of that path in the working directory is the one used
  own.parent.mkdir()
  own.write_text("")
  assert shipped.locate("configs/default.py") == "configs/default.py"
  message = shipped.not_found("nope.py")
  assert str(tmp_path) in message and configs in message and "paper/{experiment," in message


def test_config_from_reads_shipped_configs_by_name_from_any_directory(tmp_path, monkeypatch):
  import fedpsa_jax as fj
  from fedpsa_jax import io

  monkeypatch.chdir(tmp_path)
  by_path = fj.config_from(os.path.join(ROOT, "configs/paper/experiment.py:method=fedbuff,dataset=mnist"))
  by_name = fj.config_from("paper/experiment:method=fedbuff,dataset=mnist")
  assert io.config_json(by_name) == io.config_json(by_path) and by_name.method == "fedbuff"
  assert fj.config_from("default", model="linear").model.name == "linear"
  with pytest.raises(FileNotFoundError, match="paper/{experiment,"):
    fj.config_from("paper/nope")


# --- the package's public names ------------------------------------------------------------------------


_EXPORTED = ["config_from", "run", "simulate", "load_run", "compare", "RunResult", "Explorer", "register", "Strategy",
             "register_model", "register_dataset", "register_backend"]  # the notebook API (README, docs)


def test_the_package_shows_its_api_and_version_only():
  import importlib.metadata

  import fedpsa_jax as fj

  assert fj.__all__ == sorted(_EXPORTED)
  assert dir(fj) == sorted([*fj.__all__, "__version__"])
  assert all(callable(getattr(fj, name)) for name in fj.__all__)
  assert fj.__version__ == importlib.metadata.version("fedpsa-jax") == _project()["version"]


def test_the_version_of_a_source_tree_that_is_not_installed_is_its_pyproject_s(monkeypatch):
  import importlib.metadata

  import fedpsa_jax

  def not_installed(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "version", not_installed)
  assert fedpsa_jax.__version__ == _project()["version"] + "+source"


# --- the wheel, installed elsewhere --------------------------------------------------------------------

# The README's notebook example, its run shortened (the linear model, a few hundredths of its virtual days).
_README_SHORTER = {'sim__virtual_days=0.05': 'sim__virtual_days=0.004, model="linear"', "run_until(0.02)": "run_until(0.002)"}
_AFTER_README = """
import json, os
print(json.dumps({"file": fj.__file__, "version": fj.__version__, "dir": dir(fj), "status": result.summary["status"],
                  "files": sorted(os.listdir("runs/fedbuff")), "day": sim.day,
                  "experiment": fj.config_from("paper/experiment:method=fedbuff,dataset=mnist").model.name}))
"""


def _readme_example() -> str:
  text = open(os.path.join(ROOT, "README.md")).read()
  code = text.split("## Notebooks", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
  for old, new in _README_SHORTER.items():
    assert old in code, f"README's notebook example no longer says {old}"
    code = code.replace(old, new)
  return code + _AFTER_README


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(the wheel, a fresh venv's python with it installed, the environment to run it in): the wheel built from
  this tree with the test environment's setuptools (no build isolation: nothing downloaded), installed without
  its dependencies into a venv that sees the test environment's packages through a .pth file."""
  root = tmp_path_factory.mktemp("wheel")
  source = root / "source"  # (a copy: building in the tree would leave build/ and .egg-info there)
  for part in ("fedpsa_jax", "fedpsa_lab", "configs"):
    shutil.copytree(os.path.join(ROOT, part), source / part, ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), source)
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                  "-w", str(root / "dist"), str(source)], check=True, capture_output=True, timeout=300)
  (wheel,) = (root / "dist").glob("fedpsa_jax-*.whl")
  venv = root / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
  python = str(venv / "bin" / "python")
  site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                        capture_output=True, text=True).stdout.strip()
  ours = {sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")}
  (pathlib.Path(site) / "test_environment.pth").write_text("\n".join(sorted(ours)) + "\n")
  subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True,
                 capture_output=True, timeout=300)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # (nothing of the clone on the path)
  return wheel, venv, env


@pytest.mark.ci  # (a wheel built and installed in a new venv)
def test_the_installed_wheel_runs_the_readme_example_and_the_command_from_outside_the_clone(installed, tmp_path):
  wheel, venv, env = installed
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
  assert {"fedpsa_configs/default.py", "fedpsa_configs/paper/table1.py", "fedpsa_configs/results/tuned.py",
          "fedpsa_lab/launch.py", "fedpsa_lab/paper.py", "fedpsa_jax/config/shipped.py"} <= names
  assert "fedpsa-jax = fedpsa_lab.launch:main" in entry_points
  command = str(venv / "bin" / "fedpsa-jax")  # two commands beside the example: the machine's cores both busy
  helped = subprocess.Popen([command, "--helpshort"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  refused = subprocess.Popen([command, "--mode=report", "--config=paper/table1:smoke"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  example = subprocess.run([str(venv / "bin" / "python"), "-c", _readme_example()], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
  assert example.returncode == 0, example.stderr[-3000:]
  seen = json.loads(example.stdout.splitlines()[-1])
  assert seen["file"].startswith(str(venv)) and seen["version"] == _project()["version"]
  assert seen["dir"] == sorted(["__version__", *_EXPORTED]) and seen["status"] == "completed"
  assert {"config.json", "metrics.jsonl", "summary.json"} <= set(seen["files"]) and seen["day"] >= 0.002
  assert seen["experiment"] == "mnist_cnn"  # configs/paper/experiment.py, found by name, its dataset's model
  out, err = helped.communicate(timeout=300)
  # (absl ends its --help with exit code 1, launch.py's as well)
  assert helped.returncode == 1 and out.startswith("fedpsa-jax --config=FILE[:arg]") and "--sweep" in out, err
  out, err = refused.communicate(timeout=300)
  # The shipped sweep config loaded (it imports fedpsa_lab.paper): the report mode then asks for its workdir.
  assert (refused.returncode, err.splitlines()) == (2, [
      "--workdir is required for --mode=report; allowed: a sweep directory (with sweep.json) or a run directory "
      "(with metrics.jsonl)"])
  assert sorted(os.listdir(tmp_path)) == ["runs"]
