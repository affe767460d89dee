"""Profiling plug-ins: a method's own pieces, profiled beside the generic ones of `fedpsa_jax.profiling`.

The module named after a method (`fedpsa.py` for 'fedpsa') defines
- `profile(profiler, **options)`: adds its rows through the `profiling.Profiler` it is handed (`add`,
  `add_on_batch`, `cost`; its `config`, `params`, `apply_fn` and `sim`, the run built without running it).
  `options` are the method's own, passed through `profiling.profile` (FedPSA's `calibration_sizes`).
`for_method(method)` loads that module by name when the profiled run is of that method; a method without one
has only the generic pieces (one SGD step, a client update, evaluation, the server steps). A plug-in gets all
it needs from the profiler, so it imports neither `profiling` nor the simulator, and `profiling` imports no
method.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable


def for_method(method: str) -> Callable[..., None] | None:
  """`profile(profiler, **options)` of the plug-in named `method`, or None when the method has none."""
  name = f"{__name__}.{method}"
  if not method.isidentifier() or importlib.util.find_spec(name) is None:
    return None
  module: Any = importlib.import_module(name)
  return module.profile
