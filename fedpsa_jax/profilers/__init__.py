"""Profiling plug-ins: a method's own pieces, profiled beside the generic ones of `fedpsa_jax.profiling`.

The module named after a method (`fedpsa.py` for 'fedpsa') defines
- `profile(profiler, **options)`: adds its rows through the `profiling.Profiler` it is handed (`add`,
  `add_on_batch`, `cost`; its `config`, `params`, `apply_fn` and `sim`, the run built without running it), each
  piece only where `profiler.wants(name)` (`--profile_pieces`). `options` are the method's own, passed through
  `profiling.profile` (FedPSA's `calibration_sizes`);
- `PIECES`: the names of the pieces it can add, so that a selection is checked before any work.
`for_method(method)` and `pieces_for(method)` load that module by name when the profiled run is of that method;
a method without one has only the generic pieces (one SGD step, a client update, evaluation, the server
steps). A plug-in gets all it needs from the profiler, so it imports neither `profiling` nor the simulator, and
`profiling` imports no method.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable


def _plugin(method: str) -> Any:
  """The plug-in module named `method`, or None when the method has none."""
  name = f"{__name__}.{method}"
  if not method.isidentifier() or importlib.util.find_spec(name) is None:
    return None
  return importlib.import_module(name)


def for_method(method: str) -> Callable[..., None] | None:
  """`profile(profiler, **options)` of the plug-in named `method`, or None when the method has none."""
  module = _plugin(method)
  return None if module is None else module.profile


def pieces_for(method: str) -> tuple[str, ...]:
  """The names of the pieces the plug-in named `method` can add (none without a plug-in)."""
  module = _plugin(method)
  return () if module is None else tuple(module.PIECES)
