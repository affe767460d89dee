"""The host loop: the only place that knows data, models, the clock and the strategy at once.

`Simulation(config, workdir).run()` carries out one run as docs/simulation.md describes; `run_until(day)` lets a
notebook advance it step by step. The run is made of parts that each do one job:
- `sim/build.py`: the checks and the workdir's lock before any building (`prepare`), then everything built
  from the config before the first event (`build_run`: a `Run`, kept whole as `Simulation.parts`);
- `sim/loop_state.py`: the loop's counters, one record saved and restored as a unit (`LoopState`);
- `sim/recorder.py`: the run directory, checkpoints and progress (`Recorder`);
- `metrics.summarize`: the summary, a pure function of the history and the loop state;
- this module: the event loop (`_on_dispatch`, `_on_arrivals`), evaluations, and what a checkpoint holds.

A job's result depends only on (parameters at dispatch, client data, lr, key = fold_in(clients_key, job_id)),
so when it is computed, and beside which other jobs, never changes it.

Checkpoints and resume (with a workdir). At an evaluation at least `checkpoint.every_days` after the
previous checkpoint, and at the end, the run saves (fedpsa_jax/checkpoint.py) everything it needs to
continue exactly: the strategy state, the scheduler (clock, event heap, busy/held clients, both host
generators), every in-flight `Job` as it is (the dispatch record, the parameters, lr, round and aux it was
dispatched with; its result is recomputed on resume: it depends only on those), the clients key, the
`LoopState`, and the output positions. A `Simulation` on a workdir holding a run of the same config
resumes from the newest complete checkpoint, truncating the outputs to the positions it recorded; without
one it starts over. Metrics after a resume are bitwise those of an uninterrupted run on the same backend,
apart from `PROCESS_FIELDS` (wall-clock times, compiles, how the executor batched jobs, and the summary's
`provenance`, which names the machine and devices a process ran on).
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from fedpsa_jax import checkpoint as checkpoint_lib
from fedpsa_jax import config as config_lib
from fedpsa_jax import errors, io, memory, metrics, provenance, run_identity, signals, strategies
from fedpsa_jax.compiles import CompileCounter
from fedpsa_jax.sim.build import Claim, Run, build_run, prepare
from fedpsa_jax.sim.executor import Job
from fedpsa_jax.sim.loop_state import LoopState
from fedpsa_jax.sim.recorder import Recorder
from fedpsa_jax.tree_util import to_host, tree_bytes
from fedpsa_jax.validation import is_number

Params = Any
_log = logging.getLogger(__name__)
# Summary/metrics fields that measure the process rather than the run, so may differ between identical runs:
# wall-clock times; compiles (jit caches are shared by every run of a process); how the executor grouped jobs
# (a resumed run recomputes the jobs in flight at its checkpoint, in other batches); the machine it ran on.
# Everything else is exact.
PROCESS_FIELDS = ("wall_seconds", "train_seconds", "client_updates_per_second", "client_compute_seconds",
                  "server_compute_seconds", "client_payload_seconds", "compiles", "compile_seconds",
                  "padding_waste", "execution_batches", "provenance")
# The host runs ahead of the devices (nothing between evaluations waits for them) by at most this many
# rounds: each round in flight holds its updates' buffers, so an unbounded lead could fill an accelerator's
# memory between two evaluations. Two keep the devices fed: the host's work per round is far below theirs.
ROUNDS_AHEAD = 2
# Event lines wait in memory (with their device values, read once for all) until the next evaluation,
# checkpoint or end, or until this many are pending.
EVENTS_PENDING = 4096


def _build(config: ml_collections.ConfigDict, claim: Claim | None
           ) -> tuple[CompileCounter, memory.HeapTrimmer, Run]:
  """Opens the compile counter and the heap trimmer (the building compiles too) and builds the run. On any
  failure (a Ctrl-C while the data loads, too) both are closed and the workdir is given up (`Claim.abandon`)."""
  compiles = CompileCounter().open()  # every XLA compile of this run (warm-up included)
  # Freed memory back to the OS after compiles, and under runtime.trim_heap at evaluations and once a second
  # of rounds too.
  trimmer = memory.HeapTrimmer(during_rounds=bool(config.runtime.trim_heap)).open()
  try:
    return compiles, trimmer, build_run(config, compiles)
  except BaseException:
    compiles.close()
    trimmer.close()
    if claim is not None:
      claim.abandon()
    raise


class Simulation:
  """One run of one config: build once, then `run()` (or `run_until(day)` repeatedly, then `finish()`).

  `parts` is the built run (`build_run`'s `Run`: strategy, executor, scheduler, evaluators, ...), `state`
  the strategy's state, `loop` the loop's counters (`LoopState`), `history` the metrics records so far."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | None = None):
    """Checks the config and the workdir and takes its lock (`prepare`: refused before any building), builds
    the run, and, when `workdir` holds a run of the same config with a usable checkpoint, restores it."""
    self.config, claim = prepare(config, workdir)
    self.wall_start = time.perf_counter()
    self.compiles, self.trimmer, self.parts = _build(self.config, claim)
    self.recorder = Recorder(claim.rundir if claim else None, self.config)
    self.state, self.loop, self.budget = self.parts.initial_state, LoopState(), config_lib.budget_units(self.config)
    self.jobs: dict[int, Job] = {}  # in flight, by job id
    self.history: list[dict] = []  # metrics.jsonl's records
    self.pending_events: list[dict] = []  # events.jsonl lines not yet written (`_write_events`)
    self.rounds_in_flight: collections.deque = collections.deque()  # recent rounds' states (ROUNDS_AHEAD)
    self.resumed_from: int | None = None  # virtual time of the checkpoint this run continued from
    self._provenance: dict | None = None  # summary.json's `provenance`, found at the first summary
    try:
      restored = self.recorder.open()
      if restored is not None:
        self._restore(restored)
      self.recorder.write_config()
    except BaseException:
      self.close()
      raise

  # --- the parts read from outside (profiling, the notebook API, benchmarks, tests) ------------------

  strategy = property(lambda self: self.parts.strategy)
  fed = property(lambda self: self.parts.fed)
  model = property(lambda self: self.parts.model)
  executor = property(lambda self: self.parts.executor)
  evaluate = property(lambda self: self.parts.evaluate)
  status = property(lambda self: self.loop.status)  # (launch.py)

  @property
  def lr(self) -> float:
    """The client learning rate at the current round: lr0 · decay^round (a job keeps its dispatch's)."""
    return self.config.local.lr * self.config.local.lr_decay ** self.loop.round

  # --- the loop -------------------------------------------------------------------------------------

  def run_until(self, day: float) -> None:
    """Advances virtual time to `day` (capped at the budget: `math.inf` runs to its end; a day already passed
    changes nothing), evaluating when due. ValueError for NaN or a value that is not a number."""
    if not is_number(day, finite=False) or math.isnan(day):
      raise ValueError(f"run_until(day={day!r}) is invalid; allowed: a number of virtual days (capped at the "
                       f"budget, {self.budget / config_lib.UNITS_PER_DAY!r}; math.inf: to its end)")
    loop, scheduler = self.loop, self.parts.scheduler
    units = day * config_lib.UNITS_PER_DAY
    until = max(loop.now, self.budget if units >= self.budget else int(round(units)))
    eval_every = config_lib.eval_every_units(self.config)
    checkpoint_every = int(round(self.config.checkpoint.every_days * config_lib.UNITS_PER_DAY))
    while loop.status == "running":
      signals.stop_if_signalled()
      t = scheduler.next_time()
      while loop.next_eval <= min(until, self.budget) and (t is None or loop.next_eval < t):
        evaluated = loop.next_eval
        self._log_eval(evaluated)
        loop.next_eval += eval_every
        if loop.status != "running":
          return
        if (self.recorder.checkpoints and checkpoint_every > 0 and evaluated < self.budget
            and evaluated - loop.last_checkpoint >= checkpoint_every):
          self.save_checkpoint(evaluated)  # (at the budget, finish() saves the end checkpoint instead)
      if t is None or t > until:
        loop.now = until
        return
      loop.now = t
      if scheduler.dispatch_due(t):
        self._on_dispatch(t)
      else:
        self._on_arrivals(t)

  def _on_dispatch(self, t: int) -> None:
    """Clients go out: each starts from what the strategy gives it, at the current round's lr."""
    run = self.parts
    for d in run.scheduler.dispatch(t):
      self.state, params, aux = run.strategy.dispatch(self.state, d.client)
      job = Job(d, params, self.lr, self.loop.round, aux)
      self.jobs[d.job_id] = job
      run.executor.submit(job)
      self.loop.bytes_downloaded += tree_bytes(params) + tree_bytes(aux)

  def _on_arrivals(self, t: int) -> None:
    """Every update arriving at `t`, received by the strategy together (one `receive`)."""
    loop, run = self.loop, self.parts
    _, arrived = run.scheduler.pop_arrivals()
    jobs = [self.jobs.pop(job_id) for _, job_id in arrived]
    arrivals = []
    for job in jobs:
      client, job_id = job.dispatch.client, job.dispatch.job_id
      delta, payload = run.executor.result(job_id)
      arrivals.append(strategies.Arrival(
          client=client, num_samples=int(run.fed.client_sizes[client]),
          staleness=loop.round - job.dispatch_round, dispatch_round=job.dispatch_round,
          params_start=job.params_start, delta=delta, payload=payload, arrival_time=t))
    if run.executor.phase_timing:  # the server step's own time (server_compute_seconds, paper Fig. 5)
      run.executor.wait_for_home()
      start = time.perf_counter()
      self.state, changed = run.strategy.receive(self.state, arrivals)
      jax.block_until_ready(self.state)
      loop.server_seconds += time.perf_counter() - start
    else:
      self.state, changed = run.strategy.receive(self.state, arrivals)
    loop.client_updates += len(arrivals)
    loop.bytes_uploaded += sum(run.strategy.upload_bytes(a) for a in arrivals)
    if self.recorder.wants_events:
      self._log_events(jobs, arrivals, changed)
    if changed:
      loop.round += 1
      self._bound_lead()
    run.scheduler.after_receive(t, [a.client for a in arrivals], changed)
    if changed and self.config.eval.every_round:
      self._log_eval(t)

  def _bound_lead(self) -> None:
    """After a round: keeps the host at most ROUNDS_AHEAD rounds ahead of the devices (it waits for the
    state of the round that many rounds back: done long ago, unless the devices are the bottleneck), and
    under `runtime.trim_heap` gives the heap's free pages back to the OS at most once a second (memory.py)."""
    self.rounds_in_flight.append(self.state)
    if len(self.rounds_in_flight) > ROUNDS_AHEAD:
      jax.block_until_ready(self.rounds_in_flight.popleft())
    self.trimmer.after_round()

  # --- outputs --------------------------------------------------------------------------------------

  def _log_eval(self, t: int) -> None:
    loop, run = self.loop, self.parts
    if self.history and self.history[-1]["time"] == t:
      return
    self._write_events()
    models = run.strategy.eval_models(self.state)
    params = models.params
    record = {"time": t, "day": t / config_lib.UNITS_PER_DAY, "round": loop.round,
              "client_updates": loop.client_updates, **run.evaluate(params), "lr": self.lr,
              "bytes_uploaded": loop.bytes_uploaded, "bytes_downloaded": loop.bytes_downloaded,
              "wall_seconds": time.perf_counter() - self.wall_start,
              "train_seconds": run.executor.train_seconds if run.executor.phase_timing else None,
              **run.strategy.diagnostics(self.state)}
    if run.personal_evaluate is not None:
      personal = models.personal if models.personal is not None else [params]
      assignment = (models.assignment if models.assignment is not None
                    else np.zeros(run.fed.num_clients, np.int64))
      record["personalized_accuracy"] = run.personal_evaluate(personal, assignment)
    record.update(models.records)
    record = to_host(record)  # (the strategy's values may be device arrays: one read for all)
    self.history.append(record)
    self.recorder.metrics(record)
    self.trimmer.after_evaluation()  # (what the evaluation and the rounds since the last one freed)
    if self.config.stop_on_nan and not (math.isfinite(record["test_loss"]) and metrics.tree_is_finite(params)):
      loop.status = "diverged"
      loop.diverged_at = {"round": loop.round, "time": t, "day": t / config_lib.UNITS_PER_DAY}
      loop.now = max(loop.now, t)  # the run got as far as this evaluation
      _log.warning("the global model or the test loss is NaN/Inf at round %d, time %d (day %.4f): "
                   "stopping (status 'diverged'); set stop_on_nan=False to continue regardless",
                   loop.round, t, t / config_lib.UNITS_PER_DAY)

  def _log_events(self, jobs: list[Job], arrivals: list[strategies.Arrival], changed: bool) -> None:
    """One line per received update and, when a round happened, one line for the round. An update's `lr` is
    the one its job was dispatched (and trained) with. The lines wait in `pending_events`, device values
    and all, until `_write_events` reads them at once: the host does not wait for a device per event."""
    records = self.parts.strategy.event_records(self.state, arrivals)
    lines = [{"type": "update", "client": job.dispatch.client, "job_id": job.dispatch.job_id,
              "dispatch_time": job.dispatch.dispatch_time, "arrival_time": job.dispatch.arrival_time,
              "dispatch_round": arrival.dispatch_round, "staleness": arrival.staleness, "lr": job.lr, **extra}
             for job, arrival, extra in zip(jobs, arrivals, records)]
    if changed:
      lines.append({"type": "round", "time": self.loop.now, "round": self.loop.round + 1,
                    **self.parts.strategy.diagnostics(self.state)})
    self.pending_events += lines
    if len(self.pending_events) >= EVENTS_PENDING:
      self._write_events()

  def _write_events(self) -> None:
    """Writes the pending event lines (one host read of all their device values)."""
    if self.pending_events:
      lines, self.pending_events = to_host(self.pending_events), []
      self.recorder.events(lines)

  def summary(self) -> dict:
    """summary.json of the run so far (`metrics.summarize` of the history and the loop state)."""
    wall = time.perf_counter() - self.wall_start
    executor = self.parts.executor
    stats = executor.stats
    timed = executor.phase_timing  # (else the phases were not timed apart: null, not a misleading host time)
    accounting = {
        "wall_seconds": wall, "train_seconds": executor.train_seconds if timed else None,
        # Client compute = local training plus client payloads (train_seconds).
        "client_compute_seconds": executor.train_seconds if timed else None,
        "server_compute_seconds": self.loop.server_seconds if timed else None,
        # How client updates ran (runtime.execution): the backend, the share of SGD steps that were
        # padding (masked steps of batched jobs), the batched calls, and the XLA compiles of the run.
        "execution": self.parts.execution, "padding_waste": stats.padding_waste, "execution_batches": stats.batches,
        "compiles": self.compiles.count, "client_payload_seconds": stats.payload_seconds if timed else None,
        "compile_seconds": self.compiles.seconds,
    }
    identity = {"method": self.config.method, "dataset": self.parts.dataset.name, "model": self.config.model.name,
                "seed": self.config.seed}
    if self._provenance is None:
      # (with the virtual day of the checkpoint this process continued from; None: it started the run)
      resumed = None if self.resumed_from is None else self.resumed_from / config_lib.UNITS_PER_DAY
      self._provenance = {**provenance.of_run(self.parts.dataset), "resumed_from_day": resumed}
    return {**metrics.summarize(self.history, self.loop, identity, accounting,
                                target_accuracy=self.config.eval.target_accuracy,
                                units_per_day=config_lib.UNITS_PER_DAY),
            "provenance": self._provenance}

  def finish(self) -> dict:
    """Evaluates at the end of the budget (if not done), writes summary.json, closes the outputs."""
    loop = self.loop
    if loop.status == "running":
      self.run_until(self.budget / config_lib.UNITS_PER_DAY)
    signals.stop_if_signalled()
    if loop.status == "running":  # (not after a divergence: its evaluation was the last)
      self._log_eval(self.budget)
      if loop.status == "running":
        loop.status = "completed"
    # The end checkpoint lets a rerun return at once, and a larger sim.virtual_days extend the run.
    if self.recorder.checkpoints and loop.now > loop.last_checkpoint:
      self.save_checkpoint(loop.now)
    self._write_events()
    self.recorder.close_progress()
    summary = self.summary()
    self.recorder.write_summary(summary)
    self.close()
    return summary

  def run(self) -> dict:
    """The whole run. When it stops early, summary.json still says how, then the exception propagates:
    status 'interrupted' after SIGINT/SIGTERM (KeyboardInterrupt, `errors.Interrupted`), 'failed' with its
    `error` otherwise. The last checkpoint stays the newest, so rerunning resumes from it."""
    try:
      return self.finish()
    except BaseException as err:
      # A second Ctrl-C while stopping is dropped: this is already stopping, and a half-written summary
      # (or a traceback from inside this cleanup) would help no one.
      with signals.deferred_signals(deliver=False):
        self._stopped(err)
      raise

  def _stopped(self, err: BaseException) -> None:
    """Records why the run stopped early in summary.json (removed if it cannot be written: an old one must
    not speak for this run) and closes the outputs."""
    interrupted = isinstance(err, KeyboardInterrupt)
    self.loop.status = "interrupted" if interrupted else "failed"
    self.recorder.close_progress()
    try:
      self._write_events()  # (what happened before the stop is kept)
      summary = self.summary()
      if interrupted:
        summary["interrupted_by"] = err.signal_name if isinstance(err, errors.Interrupted) else "SIGINT"
      else:
        summary["error"] = f"{type(err).__name__}: {err}"
      self.recorder.write_summary(summary)
    except errors.OutputWriteError:  # (the disk that stopped the run is full still)
      self.recorder.discard_summary()
    finally:
      self.close()

  def close(self) -> None:
    """Closes the outputs and the checkpoint store (the run can be resumed from its workdir later)."""
    self.compiles.close()
    self.trimmer.close()
    self.recorder.close()

  # --- checkpoints ----------------------------------------------------------------------------------

  def save_checkpoint(self, step: int) -> None:
    """Saves the run at virtual time `step` (an evaluation time, or the end) so it continues exactly."""
    loop = self.loop
    self._write_events()  # (before the positions: the checkpoint counts every line so far)
    loop.train_seconds = self.parts.executor.train_seconds
    loop.wall_seconds = time.perf_counter() - self.wall_start
    loop.last_checkpoint = step
    snapshot = {
        "loop": loop,
        "outputs": self.recorder.positions(len(self.history)),
        "scheduler": self.parts.scheduler.state_dict(),
        "strategy": self.state,
        "jobs": list(self.jobs.values()),  # in dispatch order (their results are recomputed on resume)
        "clients_key": self.parts.executor.clients_key,
    }
    self.recorder.save_checkpoint(step, snapshot)

  def _restore(self, restored: checkpoint_lib.Restored) -> None:
    """Continues from a checkpoint: state, clock, jobs, loop state, and outputs cut back to its positions."""
    diffs = run_identity.identity_differences(restored.config, io.config_json(self.config))
    if diffs:
      raise config_lib.ConfigError(
          f"the checkpoint {restored.step} in {self.recorder.checkpoints.directory} was made with a different "
          f"config ({'; '.join(diffs[:5])}); allowed: the same config (only {run_identity.what_may_change()} "
          "may change)")
    snap, run = restored.snapshot, self.parts
    loop = snap["loop"]
    if loop.now > self.budget:
      raise config_lib.ConfigError(
          f"sim.virtual_days={self.config.sim.virtual_days!r} is invalid for resuming this run; allowed: a "
          f"number >= {loop.now / config_lib.UNITS_PER_DAY!r} (the time of its last checkpoint)")
    self.state = snap["strategy"]
    run.scheduler.load_state_dict(snap["scheduler"])
    run.executor.clients_key = snap["clients_key"]  # (nothing was submitted yet: the executor is fresh)
    for job in snap["jobs"]:
      self.jobs[job.dispatch.job_id] = job
      run.executor.submit(job)
    run.executor.train_seconds = loop.train_seconds
    if loop.status == "completed" and loop.now < self.budget:
      loop.status = "running"  # a finished run given a larger sim.virtual_days goes on
    self.wall_start = time.perf_counter() - loop.wall_seconds
    loop.last_checkpoint = self.resumed_from = restored.step
    self.loop = loop
    self.history = self.recorder.rewind(snap["outputs"])
    _log.info("resumed %s from its checkpoint at day %.4f (round %d)", self.recorder.rundir.path,
              restored.step / config_lib.UNITS_PER_DAY, loop.round)


def summary_line(summary: dict) -> str:
  """One line for the end of a run."""
  return (f"{summary['method']} on {summary['dataset']}: {summary['status']}, final acc "
          f"{summary['final_test_accuracy']:.4f} (best {summary['best_test_accuracy']:.4f}), AULC "
          f"{summary['aulc']:.4f} acc-days ({summary['aulc_per_day']:.4f}/day) over "
          f"{summary['virtual_days']:.3f} days; {summary['rounds']} rounds, {summary['client_updates']} "
          f"client updates in {summary['wall_seconds']:.1f} s "
          f"({summary['client_updates_per_second']:.2f}/s"
          + (f", {summary['train_seconds']:.1f} s training)" if summary.get("train_seconds") is not None else ")"))
