"""Imports point one way (docs/architecture.md, "Layers"), and no module reaches into another's private names.

Read from the source with `ast`, so a new module must be given its layer here (and in the docs) to pass, and
an import that climbs (the simulator importing the command line, the report helpers importing the report
driver) fails with the module and the import named. Imports inside functions are the documented plug-in
lookups (the config finding the registered strategies, the report loading its figure plug-ins) and are not
counted.
"""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = "fedpsa_jax"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)

# docs/architecture.md's table, bottom up; a module may import its own layer and those below.
LAYERS = (
    ("foundations", ("errors", "signals", "choices", "validation", "seeding", "tree_util", "compiles", "compilation_cache",
                     "memory", "provenance")),
    ("configuration", ("config",)),
    ("numerics and storage", ("data", "models", "local", "fisher", "sensitivity", "metrics", "checkpoint", "io",
                              "run_identity", "tensorboard")),
    ("algorithms", ("strategies",)),
    ("simulator", ("sim",)),
    ("tools on top", ("api", "sweep", "paper", "report_stats", "report_lib", "figures", "report", "profiling", "profilers", "cli",
                      "__init__")),
)
# Within the top layer, one way too: (importer, what it must not import).
FORBIDDEN = (("report_stats", "report_lib"), ("report_lib", "figures"), ("report_lib", "report"), ("figures", "report"))


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  out = {}
  for folder, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
        out[f"{PACKAGE}.{rel}".removesuffix(".__init__") if rel != "__init__" else PACKAGE] = os.path.join(folder, name)
  return out


def _top(module: str) -> str:
  """The first component below the package (`fedpsa_jax.sim.runner` -> `sim`; the package itself: `__init__`)."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
  top = _top(module)
  for index, (_, members) in enumerate(LAYERS):
    if top in members:
      return index
  raise AssertionError(f"{module} has no layer: add it to LAYERS here and to docs/architecture.md")


def _module_level_imports(path: str, module: str) -> list[str]:
  """The project modules `path` imports at module level (`from fedpsa_jax import x` counts as `fedpsa_jax.x`
  when x is a module, as `fedpsa_jax` when it is a name)."""
  modules = _modules()
  tree = ast.parse(open(path).read())
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  out = []
  for node in tree.body:
    if isinstance(node, ast.Import):
      out += [alias.name for alias in node.names if alias.name.startswith(PACKAGE)]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
      if base.startswith(PACKAGE):
        out += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
  return out


@pytest.mark.slow
def test_every_module_imports_only_its_layer_and_below():
  climbs = []
  for module, path in sorted(_modules().items()):
    for imported in _module_level_imports(path, module):
      if _layer(imported) > _layer(module):
        climbs.append(f"{module} imports {imported} ({LAYERS[_layer(imported)][0]} above "
                      f"{LAYERS[_layer(module)][0]})")
      if (_top(module), _top(imported)) in FORBIDDEN:
        climbs.append(f"{module} imports {imported}")
  assert climbs == [], climbs


def test_no_module_uses_another_modules_private_names():
  modules = _modules()
  uses = []
  for module, path in sorted(modules.items()):
    tree = ast.parse(open(path).read())
    aliases = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
        for alias in node.names:
          if alias.name.startswith("_") and not alias.name.startswith("__"):
            uses.append(f"{module}: from {node.module} import {alias.name}")
          if f"{node.module}.{alias.name}" in modules:
            aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
      elif isinstance(node, ast.Import):
        for alias in node.names:
          if alias.name in modules and alias.asname:
            aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
          and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != module):
        uses.append(f"{module}: {node.value.id}.{node.attr}")
  assert uses == [], uses


def test_the_checker_sees_a_climb_and_a_private_use(tmp_path):
  """The checker itself: it resolves `from fedpsa_jax import x` and relative imports to the modules meant."""
  path = tmp_path / "runner.py"
  path.write_text("from fedpsa_jax import cli, errors\nfrom ..config import schema\nfrom . import build\n")
  imported = _module_level_imports(str(path), "fedpsa_jax.sim.runner")
  assert imported == ["fedpsa_jax.cli", "fedpsa_jax.errors", "fedpsa_jax.config.schema", "fedpsa_jax.sim.build"]
  assert _layer("fedpsa_jax.cli") > _layer("fedpsa_jax.sim.runner") > _layer("fedpsa_jax.errors")
