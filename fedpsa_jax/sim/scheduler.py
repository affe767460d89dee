"""The virtual clock of an asynchronous run (docs/simulation.md): which client trains when, and when it returns.

It knows clients only by id and time; it never sees a model. The runner asks it for the next thing
that happens (`next_time`), lets it dispatch clients (`dispatch`), and hands back arrivals
(`pop_arrivals`) and the strategy's verdict (`after_receive`).

Semantics (FLGo's, so numbers compare with the paper):
- Time is an integer; the first dispatch happens at t = 1.
- At most C clients are in flight. A client's result arrives exactly its response time after dispatch.
- Slots freed by arrivals at t are refilled at t + 1, by uniform sampling without replacement among
  idle clients that are not *held*: a client whose received update waits in an unflushed buffer is
  held until the next round.
- At one time, dispatch happens before the arrivals of that time are received (FLGo samples before it
  receives).
- All arrivals with the same time are delivered together, ordered by client id.
- mode 'sync' (FedAvg): a cohort of C clients is dispatched only when none is in flight and none is
  held; the round then lasts 1 + the cohort's largest response time.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from fedpsa_jax import checkpoint
from fedpsa_jax.sim.latency import LatencyModel


@checkpoint.register_record  # (held by each in-flight `Job` a checkpoint saves)
@dataclasses.dataclass(frozen=True)
class Dispatch:
  """One client sent off: its job id, when it left and when its result will arrive."""

  job_id: int
  client: int
  dispatch_time: int
  arrival_time: int


class Scheduler:
  """Event heap of arrivals, the concurrency cap and client selection."""

  def __init__(self, num_clients: int, concurrency: int, latency: LatencyModel, rng: np.random.Generator,
               mode: str = "async"):
    if mode not in ("async", "sync"):
      raise ValueError(f"dispatch_mode={mode!r} is invalid; allowed: async, sync")
    self.num_clients = num_clients
    self.concurrency = concurrency
    self.latency = latency
    self.rng = rng
    self.mode = mode
    self.heap: list[tuple[int, int, int]] = []  # (arrival_time, client, job_id)
    self.busy: set[int] = set()
    self.held: set[int] = set()
    self.next_dispatch_time: int | None = 1
    self.next_job_id = 0

  def idle_clients(self) -> list[int]:
    return [c for c in range(self.num_clients) if c not in self.busy and c not in self.held]

  def next_time(self) -> int | None:
    """The time of the next dispatch or arrival (dispatch wins ties); None when nothing can happen."""
    times = [t for t in (self.next_dispatch_time, self.heap[0][0] if self.heap else None) if t is not None]
    return min(times) if times else None

  def dispatch_due(self, now: int) -> bool:
    return self.next_dispatch_time is not None and self.next_dispatch_time <= now

  def dispatch(self, now: int) -> list[Dispatch]:
    """Fills free slots at `now` with idle, unheld clients (sampled uniformly without replacement)."""
    self.next_dispatch_time = None
    if self.mode == "sync" and (self.busy or self.held):
      return []
    free = self.concurrency - len(self.busy)
    idle = self.idle_clients()
    if free <= 0 or not idle:
      return []
    chosen = self.rng.choice(np.asarray(idle), size=min(free, len(idle)), replace=False)
    out = []
    for client in sorted(int(c) for c in chosen):
      arrival = now + self.latency.response_time(client)
      out.append(Dispatch(self.next_job_id, client, now, arrival))
      heapq.heappush(self.heap, (arrival, client, self.next_job_id))
      self.busy.add(client)
      self.next_job_id += 1
    return out

  def pop_arrivals(self) -> tuple[int, list[tuple[int, int]]]:
    """All arrivals at the earliest arrival time: (time, [(client, job_id), ...] by client id)."""
    now = self.heap[0][0]
    arrived = []
    while self.heap and self.heap[0][0] == now:
      _, client, job_id = heapq.heappop(self.heap)
      arrived.append((client, job_id))
      self.busy.discard(client)
    return now, sorted(arrived)

  def after_receive(self, now: int, clients: list[int], round_happened: bool) -> None:
    """Records the strategy's verdict on the arrivals at `now`: a round releases every held client;
    otherwise the arrived clients wait, held, in the buffer. Free slots are refilled at now + 1."""
    if round_happened:
      self.held.clear()
    else:
      self.held.update(clients)
    self.next_dispatch_time = now + 1

  def state_dict(self) -> dict:
    """The clock's whole state as JSON-able values: the event heap (in-flight jobs, in heap order),
    busy and held clients, the next dispatch time and job id, and both generators' states."""
    return {"heap": [list(e) for e in self.heap], "busy": sorted(self.busy), "held": sorted(self.held),
            "next_dispatch_time": self.next_dispatch_time, "next_job_id": self.next_job_id,
            "rng": self.rng.bit_generator.state, "latency": self.latency.state_dict(), "mode": self.mode,
            "num_clients": self.num_clients, "concurrency": self.concurrency}

  def load_state_dict(self, state: dict) -> None:
    """Restores what `state_dict` returned; the shape of the federation must be the same."""
    for name in ("mode", "num_clients", "concurrency"):
      if state[name] != getattr(self, name):
        raise ValueError(f"saved scheduler has {name}={state[name]!r}, this run {getattr(self, name)!r}")
    # The list is kept in its saved order, which is a valid heap, so later pops are the same.
    self.heap = [(int(t), int(c), int(j)) for t, c, j in state["heap"]]
    self.busy, self.held = set(state["busy"]), set(state["held"])
    self.next_dispatch_time = state["next_dispatch_time"]
    self.next_job_id = state["next_job_id"]
    self.rng.bit_generator.state = state["rng"]
    self.latency.load_state_dict(state["latency"])
