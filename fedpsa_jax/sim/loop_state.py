"""The host loop's own state: one record, saved into a checkpoint and restored from it as a unit.

Every counter the loop keeps between events lives here, so a new one is one field (with its default),
and a checkpoint, which holds the record itself, can never forget it (big_vision keeps its train state the
same way, one dict saved whole). The strategy's state, the scheduler's clock and the executor's queues have
their own state and are saved beside it.
"""

from __future__ import annotations

import dataclasses

from fedpsa_jax import checkpoint


@checkpoint.register_record
@dataclasses.dataclass
class LoopState:
  """Where the run stands. Times are virtual units (docs/simulation.md, 'Time') unless named `*_seconds`."""

  now: int = 0  # the clock: the time of the last event processed (or the budget reached)
  round: int = 0  # global rounds completed (strategy `receive` calls that changed the model)
  client_updates: int = 0  # client updates received
  next_eval: int = 0  # the time of the next evaluation
  status: str = "running"  # running | completed | diverged | failed
  diverged_at: dict | None = None  # {round, time, day} of the evaluation that found NaN/Inf
  # Accounting (paper Fig. 5): bytes each way and server compute; client compute is the executor's.
  bytes_uploaded: int = 0
  bytes_downloaded: int = 0
  server_seconds: float = 0.0
  # Wall-clock times at the checkpoint (the executor and the clock keep the live values).
  train_seconds: float = 0.0
  wall_seconds: float = 0.0
  last_checkpoint: int = 0  # the virtual time of the last checkpoint (a fresh run counts from 0)
