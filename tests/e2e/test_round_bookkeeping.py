"""End to end: every job's dispatch round and learning rate, and every arrival's staleness, recomputed from
events.jsonl alone and compared with what a real run logged, handed to its strategy and trained with.

The clock's contract (docs/simulation.md): a round is one aggregation, at most one per event time; at one virtual time
the dispatches happen before that time's arrivals are received (FLGo samples before it receives); a job is
trained with lr0 · decay^r, r the round at its dispatch; an arrival's staleness is the round when it is
received (before the round it may trigger) minus its dispatch round. So from the log's round times alone:

  dispatch round = #rounds at times < its dispatch time,  round at arrival = #rounds at times < its arrival time.

Three things are checked against that recomputation: what the runner logged (dispatch_round, staleness, lr
of each update line; round and lr of each metrics line), what the strategy was handed (its `receive` wrapped;
for FedBuff also the flush weights (1 + τ)^(-1/2) / |buffer| in the round lines, which only the τ it used
gives), and the lr local training actually ran with (LocalTrainer.train_job / train_batch wrapped, each call
matched to its job by its key fold_in(clients_key, job_id)), so a runner that logs right but trains wrong is
caught too. The scheduler's own test (test_scheduler.py) checks a copy of this bookkeeping, not the runner's.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses

import jax
import numpy as np
import pytest

from fedpsa_jax import io, local, seeding
from fedpsa_jax.sim import runner
from helpers import small_config

LR0 = 0.05
DECAY = 0.95  # far from 1, so an lr one round off differs by 5%, not by float noise
BUFFER = 3  # FedBuff's K: rounds are not one per arrival


def _config(method: str, execution: str):
  # Short response times (5-60 units): ~80 FedBuff rounds in 0.01 day, many stale arrivals, and many dispatches
  # at the very time of a round (where "dispatch before the arrivals of its time" matters).
  return small_config(method, days=0.01, output__events=True, local__lr=LR0, local__lr_decay=DECAY,
                      runtime__execution=execution, fedbuff__buffer_size=BUFFER, sim__latency__low=5,
                      sim__latency__high=60)


def _key_bits(keys: jax.Array) -> np.ndarray:
  """The raw bits of a key (shape [2]) or of a stack of keys ([J, 2]), comparable across devices."""
  return np.asarray(jax.random.key_data(keys)).reshape(-1, 2)


@dataclasses.dataclass
class Observed:
  """What a run logged, handed to its strategy and trained with."""

  updates: list[dict]  # events.jsonl update lines, in file order
  rounds: list[dict]  # events.jsonl round lines
  events: list[dict]  # every events.jsonl line, in file order
  metrics: list[dict]  # metrics.jsonl
  received: dict[tuple[int, int], tuple[int, int]]  # (client, arrival time) -> (dispatch round, staleness) given
  trained_lr: dict[int, list[float]]  # job id -> the lr of each local training run for it


def _run(method: str, execution: str, workdir, monkeypatch) -> Observed:
  config = _config(method, execution)
  trained: list[tuple[tuple[int, int], float]] = []  # (key bits, lr) of every batched local training call
  trained_ids: list[tuple[int, float]] = []  # (job id, lr) of every loop training call
  train_batch = local.LocalTrainer.train_batch
  train_job = local.LocalTrainer.train_job

  def spy_train_job(self, params, data, **kwargs):
    # (The loop executor trains each job with one train_job call, its shuffle from fold_in(clients key, job id).)
    clients_key = kwargs["clients_key"]
    assert _key_bits(clients_key)[0].tolist() == _key_bits(seeding.device_key(config.seed, "clients"))[0].tolist()
    trained_ids.append((int(kwargs["job_id"]), float(kwargs["lr"])))
    return train_job(self, params, data, **kwargs)

  def spy_train_batch(self, params, data, **kwargs):
    for bits, rate, n in zip(_key_bits(kwargs["keys"]), np.asarray(kwargs["lr"]), np.asarray(data.num_samples)):
      if n > 0:  # (0 samples: an inert padding copy)
        trained.append((tuple(bits), float(rate)))
    return train_batch(self, params, data, **kwargs)

  monkeypatch.setattr(local.LocalTrainer, "train_job", spy_train_job)
  monkeypatch.setattr(local.LocalTrainer, "train_batch", spy_train_batch)
  sim = runner.Simulation(config, str(workdir))
  assert sim.parts.execution == execution
  received: dict[tuple[int, int], tuple[int, int]] = {}
  receive = sim.strategy.receive

  def spy_receive(state, arrivals):
    for a in arrivals:
      received[(a.client, a.arrival_time)] = (a.dispatch_round, a.staleness)
    return receive(state, arrivals)

  monkeypatch.setattr(sim.strategy, "receive", spy_receive)
  summary = sim.run()
  assert summary["status"] == "completed"
  # Job ids from keys, as the run derives them: fold_in(clients key of the seed, job id).
  clients_key = seeding.device_key(config.seed, "clients")
  job_of = {tuple(_key_bits(jax.random.fold_in(clients_key, j))[0]): j for j in range(sim.parts.scheduler.next_job_id)}
  trained_lr: dict[int, list[float]] = collections.defaultdict(list)
  for bits, rate in trained:
    trained_lr[job_of[bits]].append(rate)
  for job_id, rate in trained_ids:
    trained_lr[job_id].append(rate)
  events = io.read_jsonl(str(workdir / "events.jsonl"))
  return Observed(updates=[e for e in events if e["type"] == "update"],
                  rounds=[e for e in events if e["type"] == "round"], events=events,
                  metrics=io.read_jsonl(str(workdir / "metrics.jsonl")), received=received, trained_lr=dict(trained_lr))


def _recompute(updates: list[dict], round_times: list[int]) -> dict[int, tuple[int, int, float]]:
  """From the log's times alone: job id -> (dispatch round, staleness, lr)."""
  out = {}
  for u in updates:
    dispatch_round = bisect.bisect_left(round_times, u["dispatch_time"])  # rounds strictly before the dispatch
    arrival_round = bisect.bisect_left(round_times, u["arrival_time"])  # rounds before it was received
    out[u["job_id"]] = (dispatch_round, arrival_round - dispatch_round, LR0 * DECAY ** dispatch_round)
  return out


def _report(bad: list[str], total: int, what: str) -> str:
  return f"{len(bad)} of {total} {what}; first: " + "; ".join(bad[:4])


def _check(obs: Observed) -> dict[int, tuple[int, int, float]]:
  """Every check shared by the methods; returns the recomputation."""
  round_times = [r["time"] for r in obs.rounds]
  assert all(a < b for a, b in zip(round_times, round_times[1:])), "at most one round per event time, in order"
  assert [r["round"] for r in obs.rounds] == list(range(1, len(obs.rounds) + 1))
  expected = _recompute(obs.updates, round_times)

  bad = [f"job {u['job_id']} (dispatched at {u['dispatch_time']}): logged {u['dispatch_round']}, recomputed "
         f"{expected[u['job_id']][0]}" for u in obs.updates if u["dispatch_round"] != expected[u["job_id"]][0]]
  assert not bad, _report(bad, len(obs.updates), "logged dispatch rounds are wrong")
  bad = [f"job {u['job_id']} ({u['dispatch_time']} -> {u['arrival_time']}): logged {u['staleness']}, recomputed "
         f"{expected[u['job_id']][1]}" for u in obs.updates if u["staleness"] != expected[u["job_id"]][1]]
  assert not bad, _report(bad, len(obs.updates), "logged stalenesses are wrong")
  bad = [f"job {u['job_id']}: logged {u['lr']!r}, lr0·decay^{expected[u['job_id']][0]} = {expected[u['job_id']][2]!r}"
         for u in obs.updates if u["lr"] != pytest.approx(expected[u["job_id"]][2], rel=1e-12)]
  assert not bad, _report(bad, len(obs.updates), "logged lrs are wrong")

  # What the strategy was handed: the same arrivals, with the recomputed dispatch round and staleness.
  assert set(obs.received) == {(u["client"], u["arrival_time"]) for u in obs.updates}
  bad = [f"client {u['client']} at {u['arrival_time']}: (dispatch round, staleness) handed "
         f"{obs.received[(u['client'], u['arrival_time'])]}, recomputed {expected[u['job_id']][:2]}"
         for u in obs.updates if obs.received[(u["client"], u["arrival_time"])] != expected[u["job_id"]][:2]]
  assert not bad, _report(bad, len(obs.updates), "arrivals reached the strategy with a wrong dispatch round/staleness")

  # What local training ran with: each received job trained once, at lr0 · decay^(its dispatch round).
  bad = [f"job {j}: trained at lr {obs.trained_lr.get(j, [])}, expected once at lr0·decay^{d} = {lr!r}"
         for j, (d, _, lr) in expected.items()
         if len(obs.trained_lr.get(j, [])) != 1 or obs.trained_lr[j][0] != pytest.approx(lr, rel=1e-6)]
  assert not bad, _report(bad, len(expected), "jobs trained with a wrong lr")

  # Each evaluation sees every round up to its time (events at an evaluation's time come first) and that lr.
  for m in obs.metrics:
    assert m["round"] == bisect.bisect_right(round_times, m["time"]), m
    assert m["lr"] == pytest.approx(LR0 * DECAY ** m["round"], rel=1e-12), m

  # The run must exercise what is checked: stale arrivals, an lr that changes, dispatches at a round's time.
  stalenesses = [s for _, s, _ in expected.values()]
  assert min(stalenesses) == 0 and max(stalenesses) >= 2
  assert len({d for d, _, _ in expected.values()}) >= 10
  assert sum(u["dispatch_time"] in set(round_times) for u in obs.updates) >= 5
  return expected


@pytest.mark.parametrize("execution", ["loop", "vmap"])  # loop trains at dispatch; vmap lazily, at an arrival
def test_fedbuff_dispatch_round_lr_and_staleness_from_the_event_log(execution, tmp_path, monkeypatch):
  obs = _run("fedbuff", execution, tmp_path, monkeypatch)
  expected = _check(obs)
  assert len(obs.rounds) < len(obs.updates) / 2  # buffered: a round per >= K = 3 arrivals
  # The flush weights show the τ the strategy used: η (1 + τ_i)^(-1/2) / |buffer| over the updates logged since
  # the previous round (η = 1), τ recomputed from the log.
  buffer: list[int] = []
  for e in obs.events:
    if e["type"] == "update":
      buffer.append(expected[e["job_id"]][1])
    elif e["type"] == "round":
      assert len(buffer) >= BUFFER
      np.testing.assert_allclose(e["weights"], [(1 + tau) ** -0.5 / len(buffer) for tau in buffer], rtol=1e-6)
      buffer = []


def test_fedasync_one_round_per_arrival_time(tmp_path, monkeypatch):
  obs = _run("fedasync", "loop", tmp_path, monkeypatch)
  _check(obs)
  # One round per event time with arrivals: the round times are exactly the arrival times.
  assert [r["time"] for r in obs.rounds] == sorted({u["arrival_time"] for u in obs.updates})
