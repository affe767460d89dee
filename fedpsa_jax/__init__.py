"""fedpsa-jax: asynchronous federated learning in JAX (FedPSA and its baselines on a virtual clock).

The notebook API (`fedpsa_jax.api`), importable from the package itself:

  import fedpsa_jax as fj
  cfg = fj.config_from("configs/default.py", model="linear", sim__virtual_days=0.05)
  result = fj.run(cfg)               # .history (pandas DataFrame), .summary, .plot()
  fj.compare([result, fj.run(fj.config_from(cfg, method="fedbuff"))])
  ex = fj.simulate(cfg); ex.run_until(0.02); ex.diagnostics()
  fj.load_run("runs/some-run")

New algorithms: subclass `fj.Strategy`, decorate with `@fj.register("name")`, set `method="name"`. Models,
datasets and execution backends have registries too: `fj.register_model`, `fj.register_dataset`,
`fj.register_backend` (docs/architecture.md, "Where to add").

The API is loaded on first use of one of its names, so that importing a submodule
(`fedpsa_jax.config`, `fedpsa_jax.io`, ...) does not pull in pandas and the runner.
"""

from __future__ import annotations

import importlib
from typing import Any

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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
  """Loads an API name from its module on first access (PEP 562)."""
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'fedpsa_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
