"""Strategy registry: every module in this package that defines a `Strategy` subclass registers it.

Adding an algorithm = dropping one file here (or calling `register` from a notebook); neither the
runner nor the config code changes.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedpsa_jax.strategies.base import (Arrival, ClientJob, ClientSide, EvalModels, Strategy, StrategyContext,
                                        get_strategy, register, registered)

_LOADED = False


def load_all() -> None:
  """Imports every module of this package once, so their `@register` decorators run."""
  global _LOADED  # an import cache, not run state: importing twice is harmless but slow
  if _LOADED:
    return
  for info in pkgutil.iter_modules(__path__):
    if info.name not in ("base", "common"):
      importlib.import_module(f"{__name__}.{info.name}")
  _LOADED = True


__all__ = ["Arrival", "ClientJob", "ClientSide", "EvalModels", "Strategy", "StrategyContext", "get_strategy",
           "load_all", "register", "registered"]
