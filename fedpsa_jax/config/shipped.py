"""The config files shipped with the package, found by name from any directory.

The repository's `configs/` folder is installed as the package `fedpsa_configs` (pyproject.toml maps it; an
editable install points it back at the folder). A config named on the command line (`--config=`) or in the
notebook API (`config_from`) is a path that exists, relative to the working directory as ever, or else the name
of a shipped config: `default`, `paper/table1` and `configs/paper/table1.py` (the path as typed in the
repository's root) all name configs/paper/table1.py. Standard library only.
"""

from __future__ import annotations

import importlib.util
import os

PACKAGE = "fedpsa_configs"
_SUFFIX = ".py"
_PREFIX = "configs/"  # a path as typed in the repository's root: what the docs write


def configs_dir() -> str | None:
  """The folder of the shipped configs: the installed package `fedpsa_configs` (in an editable install, the
  repository's configs/), else the configs/ beside this source tree when it is not installed; None without
  either."""
  spec = importlib.util.find_spec(PACKAGE)
  for folder in (spec.submodule_search_locations or []) if spec is not None else []:
    if os.path.isdir(folder):
      return folder
  own = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
  return own if os.path.isfile(os.path.join(own, "__init__.py")) else None


def names() -> list[str]:
  """Every shipped config by the name it is found by (`default`, `paper/table1`), sorted."""
  root = configs_dir()
  found = []
  for folder, _, files in os.walk(root) if root else []:
    for name in files:
      if name.endswith(_SUFFIX) and name != "__init__.py":
        found.append(os.path.relpath(os.path.join(folder, name), root)[:-len(_SUFFIX)].replace(os.sep, "/"))
  return sorted(found)


def locate(path: str) -> str | None:
  """The config file `path` names: itself when it is a file, else the shipped config of that name (`default`,
  `paper/table1`, `default.py`, `configs/paper/table1.py`); None when neither exists."""
  if os.path.isfile(path):
    return path
  root = configs_dir()
  name = path.replace(os.sep, "/").removeprefix("./").removeprefix(_PREFIX).removesuffix(_SUFFIX)
  if root is None or not name or os.path.isabs(path) or ".." in name.split("/") or name.endswith("__init__"):
    return None  # (outside the folder, or the package's own file: not a config)
  shipped = os.path.join(root, *name.split("/")) + _SUFFIX
  return shipped if os.path.isfile(shipped) else None


def locate_spec(spec: str) -> str | None:
  """`locate` for a spec with its `:arg` ('FILE[:arg]'): the located file with the same arg, or None."""
  path, colon, arg = spec.partition(":")
  found = locate(path)
  return None if found is None else found + colon + arg


def not_found(path: str) -> str:
  """Why `path` names no config, saying where it was looked for and what the shipped configs are called."""
  root = configs_dir()
  shipped = (f"nor a config shipped with fedpsa-jax (in {root}: {_grouped(names())})" if root else
             "and no configs are shipped with this installation")
  return f"no such file in {os.getcwd()}, {shipped}"


def _grouped(shipped: list[str]) -> str:
  """'aifed, casa, default, paper/{experiment,fig3}' : the names, one brace group per folder."""
  folders: dict[str, list[str]] = {}
  for name in shipped:
    folder, _, leaf = name.rpartition("/")
    folders.setdefault(folder, []).append(leaf)
  return ", ".join(", ".join(leaves) if not folder else f"{folder}/{{{','.join(leaves)}}}"
                   for folder, leaves in folders.items())
