"""Per-client response times in integer virtual-time units (DESIGN §3).

- `uniform`: integers uniform on [low, high] (the paper's 10-500 default).
- `long_tail`: a bounded Pareto on [low, high] with shape a, rounded down to an integer. Its inverse CDF
  is x = low * (1 - u (1 - (low/high)^a))^(-1/a); with a = 1, low = 10, high = 500 the median is about
  20 and 90% of clients answer within ~90 units, while a few take up to 500: "most response times
  cluster around" `low`, as the paper's Table 4 describes, with a tail to `high`.
"""

from __future__ import annotations

import numpy as np


def draw_response_times(distribution: str, size: int, low: int, high: int, shape: float,
                        rng: np.random.Generator) -> np.ndarray:
  """`size` response times (int64) in [low, high]."""
  if distribution == "uniform":
    return rng.integers(low, high + 1, size=size)
  if distribution == "long_tail":
    u = rng.random(size)
    x = low * (1.0 - u * (1.0 - (low / high) ** shape)) ** (-1.0 / shape)
    return np.clip(np.floor(x), low, high).astype(np.int64)
  raise ValueError(f"sim.latency.distribution={distribution!r} is invalid; allowed: long_tail, uniform")


class LatencyModel:
  """Each client's response time: drawn once per client (`fixed`) or at every dispatch (`per_dispatch`)."""

  def __init__(self, num_clients: int, distribution: str, low: int, high: int, shape: float,
               resample: str, rng: np.random.Generator):
    self.rng = rng
    self._draw = lambda n: draw_response_times(distribution, n, low, high, shape, rng)
    self.resample = resample
    self.fixed = self._draw(num_clients)

  def response_time(self, client: int) -> int:
    if self.resample == "per_dispatch":
      return int(self._draw(1)[0])
    return int(self.fixed[client])

  def state_dict(self) -> dict:
    """The model's mutable state as JSON-able values: the per-client times and the generator's state
    (which `per_dispatch` advances at every dispatch)."""
    return {"fixed": [int(x) for x in self.fixed], "rng": self.rng.bit_generator.state}

  def load_state_dict(self, state: dict) -> None:
    """Restores what `state_dict` returned, so the next draws are the ones the saved run would make."""
    if len(state["fixed"]) != len(self.fixed):
      raise ValueError(f"saved latency state has {len(state['fixed'])} clients, this run {len(self.fixed)}")
    self.fixed = np.asarray(state["fixed"], dtype=self.fixed.dtype)
    self.rng.bit_generator.state = state["rng"]
