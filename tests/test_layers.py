"""Imports point one way (docs/architecture.md, "Two packages" and "Layers"), no module imports itself through
others (an import cycle), and no module reaches into another's private names.

Read from the source with `ast`, so a new module must be given its layer here (and in the docs) to pass, and
an import that climbs (the simulator importing the command line, the report helpers importing the report
driver, anything of the simulator `fedpsa_jax` importing the analysis `fedpsa_lab`) fails with the module
and the import named. Imports inside functions count as well: a climb hidden in a function is a climb. The
exceptions are named below: the registry look-ups (`REGISTRY_LOOKUPS`), where a module finds plug-ins
registered above it, and the modules that load their own plug-ins by name (`DYNAMIC_IMPORTS`). A cycle fails
even where each of its imports is allowed (a registry look-up into a module that imports the looker back): in
a cycle, what a module holds while it loads depends on which of the cycle's modules was imported first.
"""

from __future__ import annotations

import ast
import collections
import functools
import os

import pytest

SIMULATOR, ANALYSIS = "fedpsa_jax", "fedpsa_lab"
PACKAGES = (SIMULATOR, ANALYSIS)
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# docs/architecture.md's table, bottom up: (layer, package, its modules, by their first name below the package).
# A module imports only its own layer and those below; the analysis sits above the whole simulator.
LAYERS = (
    ("foundations", SIMULATOR, ("errors", "signals", "choices", "validation", "seeding", "tree_util", "apportion",
                                "compiles", "compilation_cache", "memory", "provenance")),
    ("configuration", SIMULATOR, ("config",)),
    ("numerics and storage", SIMULATOR, ("data", "models", "local", "fisher", "sensitivity", "metrics",
                                         "checkpoint", "io", "run_identity", "tensorboard", "perfetto")),
    ("algorithms", SIMULATOR, ("strategies",)),
    ("simulator", SIMULATOR, ("sim",)),
    ("tools on top", SIMULATOR, ("api", "sweep", "profiling", "profilers", "cli", "__init__")),
    ("analysis: the paper's setup, statistics", ANALYSIS, ("paper", "report_stats")),
    ("analysis: what reports are drawn with", ANALYSIS, ("report_lib", "contrasts", "event_correlations",
                                                        "tuning")),
    ("analysis: figure plug-ins", ANALYSIS, ("figures",)),
    ("analysis: the report driver and launch.py's report mode", ANALYSIS, ("report", "modes", "__init__")),
    ("the command line (fedpsa-jax, launch.py): both packages' modes joined", ANALYSIS, ("launch",)),
)
# Imports that climb on purpose, each a registry look-up inside a function: (importer, imported) -> why.
REGISTRY_LOOKUPS = {
    ("fedpsa_jax.config.schema", "fedpsa_jax.strategies"):
        "the config gathers the registered strategies (their sections, defaults and validation)",
}
# The only modules that may import by a computed name (`importlib.import_module`): each loads its own
# submodules, or its own lazy exports, and nothing else.
DYNAMIC_IMPORTS = {
    "fedpsa_jax": "the notebook API's names, loaded on first use (PEP 562)",
    "fedpsa_jax.strategies": "its own modules, whose @register fills the strategy registry",
    "fedpsa_jax.profilers": "the configured method's profiler plug-in, one of its own modules",
    "fedpsa_lab.figures": "its own figure plug-ins",
}


@functools.cache
def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of both packages."""
  out = {}
  for package in PACKAGES:
    root = os.path.join(REPOSITORY, package)
    for folder, _, files in os.walk(root):
      for name in files:
        if name.endswith(".py"):
          rel = os.path.relpath(os.path.join(folder, name), root)[:-3].replace(os.sep, ".")
          out[package if rel == "__init__" else f"{package}.{rel}".removesuffix(".__init__")] = os.path.join(folder, name)
  return out


@functools.cache
def _tree(path: str) -> ast.Module:
  with open(path) as f:
    return ast.parse(f.read())


def _top(module: str) -> tuple[str, str]:
  """(package, first component below it): `fedpsa_jax.sim.runner` -> ('fedpsa_jax', 'sim'); a package itself:
  (package, '__init__')."""
  parts = module.split(".")
  return parts[0], parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
  package, top = _top(module)
  for index, (_, layer_package, members) in enumerate(LAYERS):
    if package == layer_package and top in members:
      return index
  raise AssertionError(f"{module} has no layer: add it to LAYERS here and to docs/architecture.md")


def _imports(path: str, module: str) -> list[tuple[str, int]]:
  """(project module imported, line) for every import in `path`, at module level or inside a function
  (`from fedpsa_jax import x` counts as `fedpsa_jax.x` when x is a module, as `fedpsa_jax` when it is a name)."""
  modules = _modules()
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  out = []
  for node in ast.walk(_tree(path)):
    if isinstance(node, ast.Import):
      out += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] in PACKAGES]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
      if base.split(".")[0] in PACKAGES:
        out += [(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, node.lineno)
                for alias in node.names]
  return out


def _dynamic_imports(path: str) -> list[int]:
  """The lines of `path` that import by a computed name (`importlib.import_module(...)`, `__import__(...)`)."""
  return [node.lineno for node in ast.walk(_tree(path)) if isinstance(node, ast.Call)
          and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
               or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))]


def _violations(modules: dict[str, str]) -> list[str]:
  out = []
  for module, path in sorted(modules.items()):
    for imported, line in _imports(path, module):
      where = f"{os.path.relpath(path, REPOSITORY)}:{line}: {module} imports {imported}"
      if _top(module)[0] == SIMULATOR and _top(imported)[0] == ANALYSIS:
        out.append(f"{where} (the simulator never imports the analysis)")
      elif _layer(imported) > _layer(module) and (module, _registry_key(imported)) not in REGISTRY_LOOKUPS:
        out.append(f"{where} ({LAYERS[_layer(imported)][0]} above {LAYERS[_layer(module)][0]})")
    if _dynamic_imports(path) and module not in DYNAMIC_IMPORTS:
      out.append(f"{os.path.relpath(path, REPOSITORY)}:{_dynamic_imports(path)[0]}: {module} imports by a "
                 "computed name (allowed only in DYNAMIC_IMPORTS)")
  return out


def _registry_key(imported: str) -> str:
  """A registry look-up is named by the package it looks into (`fedpsa_jax.strategies.base` ->
  `fedpsa_jax.strategies`)."""
  package, top = _top(imported)
  return f"{package}.{top}" if top != "__init__" else package


def _import_graph(modules: dict[str, str]) -> dict[str, dict[str, int]]:
  """{module: {module of `modules` it imports: the line of the first such import}}, module-level and
  function-level imports alike (`_imports`). Only the imports written count: that importing `a.b.c` runs
  `a/__init__.py` and `a/b/__init__.py` first is no edge (every package would be a cycle)."""
  graph: dict[str, dict[str, int]] = {module: {} for module in modules}
  for module, path in modules.items():
    for imported, line in _imports(path, module):
      if imported in modules and imported != module:
        graph[module].setdefault(imported, line)
  return graph


def _cycle_from(start: str, graph: dict[str, dict[str, int]]) -> list[str] | None:
  """The modules of the shortest import cycle through `start` (breadth first), from `start`; None: none."""
  came_from: dict[str, str | None] = {start: None}
  queue = collections.deque([start])
  while queue:
    module = queue.popleft()
    for imported in sorted(graph[module]):
      if imported == start:
        path = [module]
        while came_from[path[-1]] is not None:
          path.append(came_from[path[-1]])
        return path[::-1]
      if imported not in came_from:
        came_from[imported] = module
        queue.append(imported)
  return None


def _cycles(modules: dict[str, str]) -> list[str]:
  """Every import cycle among `modules`, one line each naming the file and line of each of its imports: the
  shortest cycle through each module, each cycle once whichever of its modules found it."""
  graph = _import_graph(modules)
  found = {}
  for start in sorted(graph):
    cycle = _cycle_from(start, graph)
    if cycle is not None:
      first = cycle.index(min(cycle))
      cycle = cycle[first:] + cycle[:first]
      found[tuple(cycle)] = " -> ".join(f"{os.path.relpath(modules[m], REPOSITORY)}:{graph[m][n]}: {m} imports {n}"
                                        for m, n in zip(cycle, cycle[1:] + cycle[:1]))
  return [found[key] for key in sorted(found)]


def test_every_module_imports_only_its_layer_and_below():
  violations = _violations(_modules())
  assert violations == [], "\n".join(violations)


def test_no_import_cycles():
  cycles = _cycles(_modules())
  assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_the_allow_lists_name_only_what_exists():
  modules = _modules()
  assert all(importer in modules and imported in modules for importer, imported in REGISTRY_LOOKUPS)
  assert all(module in modules and _dynamic_imports(modules[module]) for module in DYNAMIC_IMPORTS)


def test_no_module_uses_another_modules_private_names():
  modules = _modules()
  uses = []
  for module, path in sorted(modules.items()):
    tree = _tree(path)
    aliases = {}  # local name -> project module it is bound to
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
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


# What configs/ and the analysis import to write and read sweeps: the grid, which must not pull the simulator in.
GRID_MAY_IMPORT = ("configuration", "foundations")


def test_the_sweep_grid_imports_only_the_config_and_below():
  """`fedpsa_jax.sweep.grid` (axis, expand: what a sweep config file calls) imports nothing above the configuration
  layer, inside functions too, and nothing else of its own package: writing a sweep never builds a run
  (tests/test_io.py checks that importing the package loads no JAX)."""
  module = "fedpsa_jax.sweep.grid"
  allowed = [index for index, (name, _, _) in enumerate(LAYERS) if name in GRID_MAY_IMPORT]
  climbs = [f"{imported} (line {line})" for imported, line in _imports(_modules()[module], module)
            if _layer(imported) not in allowed]
  assert climbs == [], f"{module} imports " + ", ".join(climbs)
  assert _imports(_modules()[module], module), "the checker found no import at all"


def test_the_checker_resolves_imports_at_any_depth(tmp_path):
  """The checker itself: it resolves `from fedpsa_jax import x` and relative imports to the modules meant,
  and sees the imports inside functions."""
  path = tmp_path / "runner.py"
  path.write_text("from fedpsa_jax import cli, errors\nfrom ..config import schema\n\n\ndef f():\n"
                  "  from . import build\n  import fedpsa_lab.report\n")
  imported = [name for name, _ in _imports(str(path), "fedpsa_jax.sim.runner")]
  assert imported == ["fedpsa_jax.cli", "fedpsa_jax.errors", "fedpsa_jax.config.schema", "fedpsa_jax.sim.build",
                      "fedpsa_lab.report"]
  assert _layer("fedpsa_lab.report") > _layer("fedpsa_jax.cli") > _layer("fedpsa_jax.sim.runner") > _layer(
      "fedpsa_jax.errors")


@pytest.mark.parametrize("module, source, found", [
    ("fedpsa_jax.config.rules", "def f():\n  from fedpsa_jax.data import partition\n",
     "fedpsa_jax.config.rules imports fedpsa_jax.data.partition (numerics and storage above configuration)"),
    ("fedpsa_jax.checkpoint", "def f():\n  from fedpsa_jax import strategies\n",
     "fedpsa_jax.checkpoint imports fedpsa_jax.strategies (algorithms above numerics and storage)"),
    ("fedpsa_jax.cli.modes", "def f():\n  from fedpsa_lab import report\n",
     "fedpsa_jax.cli.modes imports fedpsa_lab.report (the simulator never imports the analysis)"),
    ("fedpsa_jax.sweep", "import fedpsa_lab\n", "fedpsa_jax.sweep imports fedpsa_lab (the simulator never"),
    ("fedpsa_lab.report_lib", "from fedpsa_lab import figures\n",
     "fedpsa_lab.report_lib imports fedpsa_lab.figures (analysis: figure plug-ins above"),
    ("fedpsa_jax.io", "import importlib\nimportlib.import_module('fedpsa_lab.report')\n",
     "fedpsa_jax.io imports by a computed name"),
])
def test_a_planted_climb_fails(tmp_path, module, source, found):
  """Each kind of climb, planted in a copy of a real module's name, is reported (a function-level one too),
  while the registry look-up the allow-list names is not."""
  path = tmp_path / "planted.py"
  path.write_text(source)
  violations = _violations({module: str(path)})
  assert len(violations) == 1 and found in violations[0], violations
  lookup = tmp_path / "lookup.py"
  lookup.write_text("def f():\n  from fedpsa_jax import strategies\n")
  assert _violations({"fedpsa_jax.config.schema": str(lookup)}) == []


def test_a_planted_cycle_fails(tmp_path):
  """The cycle checker itself: a cycle of three modules, one import inside a function and one relative, planted
  in copies of real modules' names, is reported once, named by every import; without its closing import, none."""
  sources = {"fedpsa_jax.sim.runner": "from fedpsa_jax.sim import build\n",
             "fedpsa_jax.sim.build": "import os\n\n\ndef f():\n  from fedpsa_jax.sim.executor import Job\n",
             "fedpsa_jax.sim.executor": "from . import runner\n"}
  paths = {module: str(tmp_path / f"{module.rpartition('.')[2]}.py") for module in sources}
  for module, source in sources.items():
    with open(paths[module], "w") as f:
      f.write(source)
  (cycle,) = _cycles(paths)
  assert [edge.partition(": ")[2] for edge in cycle.split(" -> ")] == [
      "fedpsa_jax.sim.build imports fedpsa_jax.sim.executor", "fedpsa_jax.sim.executor imports fedpsa_jax.sim.runner",
      "fedpsa_jax.sim.runner imports fedpsa_jax.sim.build"]
  assert "build.py:5:" in cycle and "executor.py:1:" in cycle and "runner.py:1:" in cycle
  broken = tmp_path / "executor_without_the_import.py"
  broken.write_text("import os\n")
  assert _cycles({**paths, "fedpsa_jax.sim.executor": str(broken)}) == []
