"""pyproject.toml declares what the package needs, in agreement with requirements.txt's pins: `pip install .`
into a fresh environment gives a package that imports and runs, and `make` keeps installing the exact pins."""

from __future__ import annotations

import os
import re
import tomllib

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
  extras = project["optional-dependencies"]
  assert set(extras) == {"ray", "notebook", "test"}
  assert "ray" not in core and "pytest" not in core
  assert any(Requirement(r).name == "ray" for r in extras["ray"])
  assert any(Requirement(r).name == "pytest" for r in extras["test"])
