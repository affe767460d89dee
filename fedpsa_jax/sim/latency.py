"""Per-client response times in integer virtual-time units (docs/simulation.md, 'Response times').

- `uniform`: integers uniform on [low, high] (the paper's 10-500 default).
- `long_tail`: a bounded Pareto on [low, high] with shape a, rounded down to an integer. Its inverse CDF
  is x = low * (1 - u (1 - (low/high)^a))^(-1/a); with a = 1, low = 10, high = 500 the median is about
  20 and 90% of clients answer within ~90 units, while a few take up to 500: "most response times
  cluster around" `low`, as the paper's Table 4 describes, with a tail to `high`.

Slow devices (CASA's setting, its Appendix A.2.2: 30% of clients at 5x the latency of normal ones):
with `slow_fraction` > 0, a fixed set of round(slow_fraction * N) clients, drawn without replacement
from the latency generator right after the per-client times, has every response time multiplied by
`slow_factor` (rounded to an integer; `per_dispatch` draws are multiplied too). With `slow_fraction`
= 0 no extra draw is made, so every run without slow devices is unchanged bit for bit.
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
               resample: str, rng: np.random.Generator, slow_fraction: float = 0.0, slow_factor: float = 5.0):
    self.rng = rng
    self._draw = lambda n: draw_response_times(distribution, n, low, high, shape, rng)
    self.resample = resample
    self.fixed = self._draw(num_clients)
    self.slow_factor = float(slow_factor)
    self.slow = np.zeros(num_clients, dtype=bool)  # the slow devices (fixed for the run)
    num_slow = int(round(slow_fraction * num_clients))
    if num_slow > 0:  # (no draw when off: runs without slow devices keep their exact latencies)
      self.slow[rng.choice(num_clients, size=num_slow, replace=False)] = True
      self.fixed = self._slowed(self.fixed, self.slow)

  def _slowed(self, times: np.ndarray, slow: np.ndarray) -> np.ndarray:
    """`times` with the entries of slow devices multiplied by `slow_factor` (integers)."""
    return np.where(slow, np.rint(times * self.slow_factor), times).astype(np.int64)

  def response_time(self, client: int) -> int:
    if self.resample == "per_dispatch":
      return int(self._slowed(self._draw(1), self.slow[client:client + 1])[0])
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
