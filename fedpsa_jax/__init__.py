"""fedpsa-jax: asynchronous federated learning in JAX (FedPSA and its baselines on a virtual clock).

The notebook API (`fedpsa_jax.api`), importable from the package itself:

  import fedpsa_jax as fj
  cfg = fj.config_from("default", model="linear", sim__virtual_days=0.05)   # a shipped config, by name
  result = fj.run(cfg)               # .history (pandas DataFrame), .summary, .plot()
  fj.compare([result, fj.run(fj.config_from(cfg, method="fedbuff"))])
  ex = fj.simulate(cfg); ex.run_until(0.02); ex.diagnostics()
  fj.load_run("runs/some-run")

`config_from` takes a config file's path, or the name of a config shipped with the package from any
directory (`"default"`, `"paper/experiment:method=fedbuff,dataset=mnist"`, `"configs/default.py"` as typed in
the repository's root). New algorithms: subclass `fj.Strategy`, decorate with `@fj.register("name")`, set
`method="name"`. Models, datasets and execution backends have registries too: `fj.register_model`,
`fj.register_dataset`, `fj.register_backend` (docs/architecture.md, "Where to add"). `fj.__version__` is the
installed package's version. The command line is `fedpsa-jax` (or `python launch.py` in a clone).

`__all__` and `dir(fedpsa_jax)` are these names. The API is loaded on first use of one of them, so that
importing a submodule (`fedpsa_jax.config`, `fedpsa_jax.io`, ...) does not pull in pandas and the runner.
"""

from __future__ import annotations

import importlib as _importlib

# name -> module that defines it
_EXPORTS = {
    "config_from": "fedpsa_jax.api",
    "run": "fedpsa_jax.api",
    "simulate": "fedpsa_jax.api",
    "load_run": "fedpsa_jax.api",
    "compare": "fedpsa_jax.api",
    "RunResult": "fedpsa_jax.api",
    "Explorer": "fedpsa_jax.api",
    "register": "fedpsa_jax.strategies",
    "Strategy": "fedpsa_jax.strategies",
    "register_model": "fedpsa_jax.models",
    "register_dataset": "fedpsa_jax.data.sources",
    "register_backend": "fedpsa_jax.sim.executor",
}
_DISTRIBUTION = "fedpsa-jax"  # the name pip installs the package under (pyproject.toml)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
  """Loads an API name from its module on first access (PEP 562), and `__version__`."""
  if name in _EXPORTS:
    return getattr(_importlib.import_module(_EXPORTS[name]), name)
  if name == "__version__":
    return _version()
  raise AttributeError(f"module 'fedpsa_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return [*__all__, "__version__"]


def _version() -> str:
  """The installed distribution's version (an editable install's too); for a source tree that is not
  installed, its pyproject.toml's, marked as such ('0.1.0+source'); '0+unknown' without either."""
  import importlib.metadata
  import os
  import tomllib

  try:
    return importlib.metadata.version(_DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    pass
  pyproject = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
  try:
    with open(pyproject, "rb") as f:
      return tomllib.load(f)["project"]["version"] + "+source"
  except (OSError, KeyError, tomllib.TOMLDecodeError):
    return "0+unknown"
