"""The virtual clock (sim/scheduler.py, docs/simulation.md) driven directly, with a fake buffered "strategy"
and its own bookkeeping: the asynchronous invariants over a long run, resampled and fixed response times,
dispatches before the arrivals of the same time, same-time arrivals popped together, held clients, and the
synchronous (FedAvg) mode.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedpsa_jax.sim.latency import LatencyModel
from fedpsa_jax.sim.scheduler import Scheduler


N, C, LOW, HIGH = 50, 10, 10, 500


def _latency(distribution="uniform", resample="fixed", seed=0, low=LOW, high=HIGH, shape=1.0, n=N):
  return LatencyModel(n, distribution, low, high, shape, resample, np.random.default_rng(seed))


def drive_async(sched: Scheduler, lat: LatencyModel, buffer_size: int, num_events: int):
  """Runs the scheduler as the runner does, with a buffer of K that flushes at >= K, checking every
  invariant of the clock along the way. Returns the log of arrivals and flush times."""
  in_flight: dict[int, tuple[int, int, int]] = {}  # client -> (dispatch_time, dispatch_round, arrival_time)
  buffer: set[int] = set()
  rnd = 0
  last_t = 0
  last_arrival_time = None  # time of the last receive, for the t+1 refill check
  refill_expected_at = None
  dispatch_times, flush_times, arrivals_log = [], [], []
  events = 0
  first = True
  while events < num_events:
    t = sched.next_time()
    assert t is not None
    assert t >= last_t, "events must come in non-decreasing time order"
    last_t = t
    events += 1
    if sched.dispatch_due(t):
      if first:
        assert t == 1, "the first dispatch happens at t = 1"
        first = False
      else:
        assert t == last_arrival_time + 1, "a dispatch only happens one unit after a receive"
      refill_expected_at = None
      idle_unheld = [c for c in range(sched.num_clients) if c not in in_flight and c not in buffer]
      free = C - len(in_flight)
      out = sched.dispatch(t)
      assert len(out) == min(free, len(idle_unheld)), "free slots are filled as far as idle clients allow"
      clients = [d.client for d in out]
      assert len(set(clients)) == len(clients)
      for d in out:
        assert d.client not in in_flight, "a busy client was dispatched again"
        assert d.client not in buffer, "a held (buffered) client was re-dispatched before the flush"
        assert d.dispatch_time == t
        rt = d.arrival_time - d.dispatch_time
        if lat.resample == "fixed":
          assert rt == lat.fixed[d.client]
        assert LOW <= rt <= HIGH
        in_flight[d.client] = (t, rnd, d.arrival_time)
      assert len(in_flight) <= C, "more than C clients in flight"
      dispatch_times.append(t)
      continue
    assert refill_expected_at is None or t < refill_expected_at, "the refill at t + 1 was skipped"
    now, arrived = sched.pop_arrivals()
    assert now == t
    clients = [c for c, _ in arrived]
    assert clients == sorted(clients), "same-time arrivals are ordered by client id"
    # Exactly the in-flight clients due at `now` arrive, all together, and none is overdue.
    due = sorted(c for c, (_, _, at) in in_flight.items() if at == now)
    assert clients == due
    assert all(at > now for c, (_, _, at) in in_flight.items() if c not in due)
    for c in clients:
      dispatch_time, dispatch_round, _ = in_flight.pop(c)
      arrivals_log.append(dict(client=c, dispatch_time=dispatch_time, arrival_time=now,
                               staleness=rnd - dispatch_round))
      buffer.add(c)
    changed = len(buffer) >= buffer_size
    if changed:
      rnd += 1
      buffer.clear()
      flush_times.append(now)
    sched.after_receive(now, clients, changed)
    last_arrival_time = now
    idle_unheld = [c for c in range(sched.num_clients) if c not in in_flight and c not in buffer]
    if idle_unheld and len(in_flight) < C:
      # Slots freed at `now` are refilled at exactly now + 1 (before any arrival at now + 1).
      assert sched.next_time() == now + 1 and sched.dispatch_due(now + 1)
      refill_expected_at = now + 1
  return arrivals_log, flush_times, dispatch_times


@pytest.mark.parametrize("distribution,resample,buffer_size", [
    ("uniform", "fixed", 5),
    ("uniform", "per_dispatch", 5),
    ("long_tail", "fixed", 5),
    ("long_tail", "per_dispatch", 3),
    ("uniform", "fixed", 10),  # K = C: everyone in flight can be held at once
])
def test_async_invariants_long_run(distribution, resample, buffer_size):
  lat = _latency(distribution, resample, seed=1)
  sched = Scheduler(N, C, lat, np.random.default_rng(2), mode="async")
  arrivals, flush_times, dispatch_times = drive_async(sched, lat, buffer_size, num_events=6000)
  assert len(arrivals) > 2000 and len(flush_times) > 100
  # Staleness: the round counter at arrival minus at dispatch equals the number of flushes at times
  # in [dispatch_time, arrival_time): a flush at the dispatch time itself happens *after* the
  # dispatch (FLGo samples before it receives), one at the arrival time is not yet counted.
  flush_times = np.asarray(flush_times)
  for a in arrivals:
    expected = int(np.sum((flush_times >= a["dispatch_time"]) & (flush_times < a["arrival_time"])))
    assert a["staleness"] == expected
  assert max(a["staleness"] for a in arrivals) > 0
  # Everyone gets selected eventually (uniform sampling among idle clients).
  assert len({a["client"] for a in arrivals}) == N


def test_per_dispatch_resamples_response_times():
  lat = _latency("uniform", "per_dispatch", seed=3)
  sched = Scheduler(N, C, lat, np.random.default_rng(4))
  arrivals, _, _ = drive_async(sched, lat, 5, num_events=3000)
  by_client: dict[int, set[int]] = {}
  for a in arrivals:
    by_client.setdefault(a["client"], set()).add(a["arrival_time"] - a["dispatch_time"])
  # With a fresh draw per dispatch, a client that went several times shows different times.
  assert sum(len(v) > 1 for v in by_client.values()) > N // 2


def test_fixed_latency_same_per_client_every_time():
  lat = _latency("long_tail", "fixed", seed=5)
  sched = Scheduler(N, C, lat, np.random.default_rng(6))
  arrivals, _, _ = drive_async(sched, lat, 5, num_events=3000)
  for a in arrivals:
    assert a["arrival_time"] - a["dispatch_time"] == lat.fixed[a["client"]]
  assert all(lat.response_time(c) == lat.fixed[c] for c in range(N) for _ in range(3))


def test_first_dispatch_fills_all_slots_at_t1():
  lat = _latency(seed=7)
  sched = Scheduler(N, C, lat, np.random.default_rng(8))
  assert sched.next_time() == 1 and sched.dispatch_due(1) and not sched.dispatch_due(0)
  out = sched.dispatch(1)
  assert len(out) == C and len({d.client for d in out}) == C
  assert [d.job_id for d in out] == list(range(C))
  assert all(d.arrival_time == 1 + lat.fixed[d.client] for d in out)
  # Nothing more is due until the first arrival.
  assert sched.next_time() == min(d.arrival_time for d in out)
  assert not sched.dispatch_due(sched.next_time())


def _fixed_latency(times):
  lat = _latency(n=len(times), low=1, high=max(times))
  lat.fixed = np.asarray(times, np.int64)
  return lat


def test_dispatch_before_arrivals_at_same_time():
  """N = 2, C = 2, latencies (1, 2), K = 1. t=1: both leave; t=2: client 0 arrives, round 1;
  t=3: the refill is due *and* client 1 arrives. The dispatch comes first, so only client 0 (idle) goes,
  stamped with round 1; client 1 then arrives with τ = 1 and makes round 2."""
  sched = Scheduler(2, 2, _fixed_latency([1, 2]), np.random.default_rng(0))
  assert sched.next_time() == 1
  assert [d.client for d in sched.dispatch(1)] == [0, 1]
  assert sched.next_time() == 2 and not sched.dispatch_due(2)
  assert sched.pop_arrivals() == (2, [(0, 0)])
  sched.after_receive(2, [0], True)
  assert sched.next_time() == 3
  assert sched.heap[0][0] == 3  # an arrival is also waiting at t = 3
  assert sched.dispatch_due(3)  # ...but the dispatch goes first
  out = sched.dispatch(3)
  assert [(d.client, d.dispatch_time, d.arrival_time) for d in out] == [(0, 3, 4)]
  assert sched.next_time() == 3 and not sched.dispatch_due(3)
  assert sched.pop_arrivals() == (3, [(1, 1)])


def test_same_time_arrivals_popped_together_sorted():
  sched = Scheduler(6, 6, _fixed_latency([5, 3, 5, 3, 5, 9]), np.random.default_rng(0))
  sched.dispatch(1)
  assert sched.pop_arrivals() == (4, [(1, 1), (3, 3)])
  assert sched.pop_arrivals() == (6, [(0, 0), (2, 2), (4, 4)])
  assert sched.pop_arrivals() == (10, [(5, 5)])


def test_held_clients_not_redispatched_until_round():
  # N = 3, C = 2: clients 0 and 1 leave; 0 returns and is held (no round), so the refill can only take 2.
  sched = Scheduler(3, 2, _fixed_latency([1, 5, 1]), np.random.default_rng(0))
  first = sched.dispatch(1)
  clients = sorted(d.client for d in first)
  assert len(clients) == 2
  t, arrived = sched.pop_arrivals()
  held = [c for c, _ in arrived]
  sched.after_receive(t, held, False)
  out = sched.dispatch(t + 1)
  idle = sorted(set(range(3)) - set(clients))
  assert [d.client for d in out] == idle  # the held client is not chosen although it is idle
  assert not set(held) & {d.client for d in out}
  # A round releases the held client.
  t2, arrived2 = sched.pop_arrivals()
  sched.after_receive(t2, [c for c, _ in arrived2], True)
  assert sched.held == set()
  assert set(held) <= set(sched.idle_clients())


# --- sync mode (FedAvg) -----------------------------------------------------------------------------


@pytest.mark.parametrize("distribution,resample", [("uniform", "fixed"), ("long_tail", "fixed"),
                                                   ("uniform", "per_dispatch")])
def test_sync_rounds(distribution, resample):
  lat = _latency(distribution, resample, seed=9)
  sched = Scheduler(N, C, lat, np.random.default_rng(10), mode="sync")
  in_flight: dict[int, int] = {}
  held: set[int] = set()
  cohorts = []  # (dispatch_time, [response times])
  last_t = 0
  for _ in range(3000):
    t = sched.next_time()
    assert t is not None and t >= last_t
    last_t = t
    if sched.dispatch_due(t):
      busy_or_held = bool(in_flight or held)
      out = sched.dispatch(t)
      if busy_or_held:
        assert out == [], "sync mode dispatched while a cohort member was in flight or held"
        continue
      assert len(out) == C and len({d.client for d in out}) == C
      assert all(d.dispatch_time == t for d in out)
      cohorts.append((t, [d.arrival_time - t for d in out]))
      for d in out:
        if resample == "fixed":
          assert d.arrival_time - t == lat.fixed[d.client]
        in_flight[d.client] = d.arrival_time
      continue
    now, arrived = sched.pop_arrivals()
    for c, _ in arrived:
      assert in_flight.pop(c) == now
      held.add(c)
    changed = len(held) == C  # FedAvg: aggregate when the whole cohort is in
    if changed:
      held.clear()
    sched.after_receive(now, [c for c, _ in arrived], changed)
  assert len(cohorts) > 20
  for (t0, times), (t1, _) in zip(cohorts, cohorts[1:]):
    assert t1 - t0 == 1 + max(times), "a sync round lasts 1 + the cohort's largest response time"
  assert cohorts[0][0] == 1


def test_sync_no_cohort_while_any_client_held():
  """If the strategy did not aggregate when the whole cohort was in, its clients stay held and no new
  cohort leaves; the round that releases them lets the next cohort go one unit later."""
  sched = Scheduler(4, 2, _fixed_latency([3, 3, 3, 3]), np.random.default_rng(0), mode="sync")
  cohort = sched.dispatch(1)
  assert len(cohort) == 2
  t, arrived = sched.pop_arrivals()
  assert t == 4 and len(arrived) == 2
  sched.after_receive(t, [c for c, _ in arrived], False)
  assert not sched.busy and sched.held
  assert sched.dispatch_due(5) and sched.dispatch(5) == []
  assert sched.next_time() is None  # nothing can happen until a round
  sched.after_receive(9, [], True)
  assert len(sched.dispatch(10)) == 2


def test_invalid_mode_rejected():
  with pytest.raises(ValueError, match="dispatch_mode"):
    Scheduler(N, C, _latency(), np.random.default_rng(0), mode="bogus")
