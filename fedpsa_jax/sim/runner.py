"""The host loop: the only place that knows data, models, the clock and the strategy at once.

`Simulation(config, workdir).run()` carries out one run as DESIGN §2 describes; `run_until(day)` lets a
notebook advance it step by step. Client results are computed lazily by `ClientExecutor`: a dispatched
job is only recorded, and its local training runs when its arrival is processed. A job's result
depends only on (parameters at dispatch, client data, lr, key = fold_in(clients_key, job_id)), so
when it is computed, and beside which other jobs, never changes it.

Checkpoints and resume (with a workdir). At an evaluation at least `checkpoint.every_days` after the
previous checkpoint, and at the end, the run saves (fedpsa_jax/checkpoint.py) everything it needs to
continue exactly: the strategy state, the scheduler (clock, event heap, busy/held clients, both host
generators), every in-flight job's dispatch record with the parameters, lr, round and aux it was
dispatched with (its result is recomputed on resume: it depends only on those), the clients key, the
loop's counters, and the byte positions of metrics.jsonl/events.jsonl. A `Simulation` on a workdir
holding a run of the same config resumes from the newest complete checkpoint, truncating the outputs
to the positions it recorded; without one it starts over. Metrics after a resume are bitwise those of
an uninterrupted run on the same backend, apart from the timing fields (`wall_seconds`,
`train_seconds`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm.auto as tqdm

from fedpsa_jax import checkpoint as checkpoint_lib
from fedpsa_jax import config as config_lib
from fedpsa_jax import io, local, metrics, seeding, strategies
from fedpsa_jax.compiles import CompileCounter
from fedpsa_jax.data.calibration import make_calibration_batch
from fedpsa_jax.data.federated import FederatedData, build_federated_data, split_client_test
from fedpsa_jax.data.partition import partition_labels
from fedpsa_jax.data.sources import Dataset, load_dataset
from fedpsa_jax.models import get_model
from fedpsa_jax.sim.executor import ClientExecutor, Job, resolve_execution
from fedpsa_jax.sim.latency import LatencyModel
from fedpsa_jax.sim.scheduler import Dispatch, Scheduler

Params = Any
_log = logging.getLogger(__name__)
# Summary/metrics fields that may differ between identical runs: wall-clock times; compiles (jit caches are
# shared by every run of a process); and how the executor grouped jobs (a resumed run recomputes the jobs
# in flight at its checkpoint, in other batches). Everything else is exact.
TIMING_FIELDS = ("wall_seconds", "train_seconds", "client_updates_per_second", "client_compute_seconds",
                 "server_compute_seconds", "client_payload_seconds", "compiles", "compile_seconds",
                 "padding_waste", "execution_batches")


def build_data(config: ml_collections.ConfigDict) -> tuple[Dataset, FederatedData]:
  dataset = load_dataset(config.data.name, test_split=config.data.test_split,
                         holdout_fraction=config.data.holdout_fraction,
                         rng=seeding.host_rng(config.seed, "data"), data_dir=config.data.data_dir)
  parts = partition_labels(dataset.y_train, config.partition.num_clients, config.partition.method,
                           config.partition.alpha, seeding.host_rng(config.seed, "partition"),
                           group_proportions=tuple(config.partition.group_proportions),
                           min_labels=config.partition.min_labels, max_labels=config.partition.max_labels)
  test_parts = None
  if config.data.client_test_fraction > 0:  # (no draw when off: existing runs are unchanged)
    parts, test_parts = split_client_test(parts, config.data.client_test_fraction,
                                          seeding.host_rng(config.seed, "client_test"))
  return dataset, build_federated_data(dataset, parts, test_parts)


class Simulation:
  """One run of one config: build once, then `run()` (or `run_until(day)` repeatedly, then `finish()`)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | None = None):
    """Validates `config` and `workdir` (ConfigError before any work), builds the run, and, when
    `workdir` holds a run of the same config with a usable checkpoint, restores it."""
    self.config = config = config_lib.validate(config)
    self.wall_start = time.perf_counter()
    self.compiles = CompileCounter().open()  # every XLA compile of this run (warm-up included)
    created = io.check_workdir(workdir, config) if workdir else False
    try:
      self.dataset, self.fed = build_data(config)
    except Exception:
      self.compiles.close()
      if created and not os.listdir(workdir):
        os.rmdir(workdir)  # bad input (e.g. missing data) leaves no empty run directory behind
      raise
    self.model = get_model(config.model.name, self.dataset.num_classes, config.model.init)
    init_x = jnp.zeros((1, *self.dataset.input_shape), jnp.float32)
    # Jitted: one compile for the whole init instead of one per initializer and shape (same values).
    params = jax.jit(self.model.init)(seeding.device_key(config.seed, "init"), init_x)
    self.num_concurrent = config_lib.concurrency(config)

    def calibration_batch():
      x, y = make_calibration_batch(config.sensitivity.calibration, config.sensitivity.calibration_size,
                                    self.dataset, seeding.host_rng(config.seed, "calibration"))
      return jnp.asarray(x), jnp.asarray(y)

    def alignment_batch():
      # `eval.alignment_batch_size` test samples drawn once (seeded by purpose), in their original order.
      n = len(self.dataset.y_test)
      rng = seeding.host_rng(config.seed, "alignment")
      idx = np.sort(rng.choice(n, size=min(config.eval.alignment_batch_size, n), replace=False))
      return jnp.asarray(self.dataset.x_test[idx]), jnp.asarray(self.dataset.y_test[idx])

    ctx = strategies.StrategyContext(
        apply_fn=self.model.apply, num_clients=self.fed.num_clients, client_sizes=self.fed.client_sizes,
        concurrency=self.num_concurrent, num_classes=self.dataset.num_classes, seed=config.seed,
        calibration_batch=calibration_batch, alignment_batch=alignment_batch)
    self.strategy = strategies.get_strategy(config.method)(config, ctx)
    # Committed to the server's device from the start: jit caches a program per committed/uncommitted
    # input, and every later state (outputs of jitted steps on committed inputs) is committed, so an
    # uncommitted initial state compiled each server function twice (measured: ~5 s of a default run).
    home = self.fed.home
    self.state = jax.tree.map(lambda x: jax.device_put(x, home) if isinstance(x, jax.Array) else x,
                              self.strategy.init(jax.device_put(params, home)))
    trainer = local.LocalTrainer(
        apply_fn=self.model.apply, batch_size=config.local.batch_size, epochs=config.local.epochs,
        regularizer=self.strategy.regularizer, loop=local.resolve_loop(config.local.loop),
        max_unroll=config.local.max_unroll, loss=self.strategy.local_loss)
    self.execution = resolve_execution(config.local.execution)
    self.executor = ClientExecutor(trainer, self.fed, self.strategy, seeding.device_key(config.seed, "clients"),
                                   self.execution, self.compiles)
    lat = config.sim.latency
    latency = LatencyModel(self.fed.num_clients, lat.distribution, lat.low, lat.high, lat.shape,
                           lat.resample, seeding.host_rng(config.seed, "latency"),
                           slow_fraction=lat.slow_fraction, slow_factor=lat.slow_factor)
    self.scheduler = Scheduler(self.fed.num_clients, self.num_concurrent, latency,
                               seeding.host_rng(config.seed, "selection"), mode=self.strategy.dispatch_mode)
    self.evaluate = metrics.make_evaluator(self.model.apply, self.fed.x_test, self.fed.y_test,
                                           config.eval.batch_size)
    self.personal_evaluate = (metrics.make_personal_evaluator(
        self.model.apply, self.fed.x_train, self.fed.y_train, self.fed.client_test_indices, config.eval.batch_size)
        if self.fed.client_test_indices else None)
    self.budget = config_lib.budget_units(config)
    self.eval_every = config_lib.eval_every_units(config)
    self.jobs: dict[int, Job] = {}
    self.now = 0
    self.round = 0
    self.client_updates = 0
    # Accounting (paper Fig. 5): bytes each way and server compute; client compute is train_seconds.
    self.bytes_uploaded = 0
    self.bytes_downloaded = 0
    self.server_seconds = 0.0
    self.next_eval = 0
    self.history: list[dict] = []
    self.status = "running"
    self.diverged_at: dict | None = None
    self.checkpoint_every = int(round(config.checkpoint.every_days * config_lib.UNITS_PER_DAY))
    self.last_checkpoint = 0  # virtual time of the last checkpoint (a fresh run counts from 0)
    self.progress = tqdm.tqdm(total=round(config.sim.virtual_days, 4), unit="day", leave=True,
                              disable=not config.output.progress,
                              bar_format="{l_bar}{bar}| {n:.3f}/{total:.3f} days [{elapsed}<{remaining}{postfix}]")
    self.rundir: io.RunDir | None = None
    self.checkpoints: checkpoint_lib.CheckpointStore | None = None
    self.resumed_from: int | None = None  # virtual time of the checkpoint this run continued from
    if workdir:
      try:
        self._open_workdir(workdir)
      except BaseException:
        self.progress.close()
        self.close()
        raise

  def _open_workdir(self, workdir: str) -> None:
    """Claims the workdir, then continues from its newest usable checkpoint or starts it afresh."""
    self.rundir = io.RunDir(workdir)
    self.rundir.lock()  # before anything in the workdir is read, cut back or written
    self.checkpoints = checkpoint_lib.CheckpointStore(self.rundir.file("checkpoints"), self.config.checkpoint.keep)
    restored = self.checkpoints.restore_latest()
    if restored:
      self._restore(restored)
    else:
      # No usable checkpoint: whatever an earlier attempt wrote is replaced by this fresh start.
      self.rundir.truncate("metrics.jsonl", 0)
      self.rundir.truncate("events.jsonl", 0)
    self.rundir.write_config(self.config)

  # --- the loop -------------------------------------------------------------------------------------

  @property
  def lr(self) -> float:
    return self.config.local.lr * self.config.local.lr_decay ** self.round

  def run_until(self, day: float) -> None:
    """Advances virtual time to `day` (capped at the budget), evaluating when due."""
    until = min(int(round(day * config_lib.UNITS_PER_DAY)), self.budget)
    while self.status == "running":
      t = self.scheduler.next_time()
      while self.next_eval <= min(until, self.budget) and (t is None or self.next_eval < t):
        evaluated = self.next_eval
        self._log_eval(evaluated)
        self.next_eval += self.eval_every
        if self.status != "running":
          return
        if (self.checkpoints and self.checkpoint_every > 0 and evaluated < self.budget
            and evaluated - self.last_checkpoint >= self.checkpoint_every):
          self.save_checkpoint(evaluated)  # (at the budget, finish() saves the end checkpoint instead)
      if t is None or t > until:
        self.now = until
        return
      self._process(t)

  def _process(self, t: int) -> None:
    self.now = t
    if self.scheduler.dispatch_due(t):
      for d in self.scheduler.dispatch(t):
        job = Job(d, self.strategy.params_for(self.state, d.client), self.lr, self.round,
                  self.strategy.client_aux(self.state, d.client))
        self.jobs[d.job_id] = job
        self.executor.submit(job)
        self.bytes_downloaded += self.strategy.download_bytes(job.params_start, job.aux)
        self.state = self.strategy.dispatched(self.state, d.client)
      return
    _, arrived = self.scheduler.pop_arrivals()
    jobs = [self.jobs.pop(job_id) for _, job_id in arrived]
    arrivals = []
    for job in jobs:
      client, job_id = job.dispatch.client, job.dispatch.job_id
      delta, payload = self.executor.result(job_id)
      arrivals.append(strategies.Arrival(
          client=client, num_samples=int(self.fed.client_sizes[client]),
          staleness=self.round - job.dispatch_round, dispatch_round=job.dispatch_round,
          params_start=job.params_start, delta=delta, payload=payload, arrival_time=t))
    self.executor.wait_for_home()  # (so that the server step's time below is its own)
    start = time.perf_counter()
    self.state, changed = self.strategy.receive(self.state, arrivals)
    # The server step's own time (summary: server_compute_seconds, paper Fig. 5) needs this wait; it costs
    # only the overlap of the server step with the host's bookkeeping of this event.
    jax.block_until_ready(self.state)
    self.server_seconds += time.perf_counter() - start
    self.client_updates += len(arrivals)
    self.bytes_uploaded += sum(self.strategy.upload_bytes(a) for a in arrivals)
    if self.rundir and self.config.output.events:
      self._log_events(jobs, arrivals, changed)
    if changed:
      self.round += 1
    self.scheduler.after_receive(t, [a.client for a in arrivals], changed)
    if changed and self.config.eval.every_round:
      self._log_eval(t)

  # --- outputs --------------------------------------------------------------------------------------

  def _log_eval(self, t: int) -> None:
    if self.history and self.history[-1]["time"] == t:
      return
    params = self.strategy.eval_params(self.state)
    record = {"time": t, "day": t / config_lib.UNITS_PER_DAY, "round": self.round,
              "client_updates": self.client_updates, **self.evaluate(params), "lr": self.lr,
              "bytes_uploaded": self.bytes_uploaded, "bytes_downloaded": self.bytes_downloaded,
              "wall_seconds": time.perf_counter() - self.wall_start,
              "train_seconds": self.executor.train_seconds,
              **self.strategy.diagnostics(self.state)}
    if self.personal_evaluate is not None:
      record["personalized_accuracy"] = self.personal_evaluate(*self.strategy.personal_models(self.state))
    record.update(self.strategy.eval_records(self.state))
    self.history.append(record)
    if self.rundir:
      self.rundir.append("metrics.jsonl", [record])
    self.progress.set_postfix(acc=f"{record['test_accuracy']:.4f}", round=self.round, refresh=False)
    self.progress.update(round(record["day"] - self.progress.n, 6))
    if self.config.stop_on_nan and not (math.isfinite(record["test_loss"]) and metrics.tree_is_finite(params)):
      self.status = "diverged"
      self.diverged_at = {"round": self.round, "time": t, "day": t / config_lib.UNITS_PER_DAY}
      self.now = max(self.now, t)  # the run got as far as this evaluation
      _log.warning("the global model or the test loss is NaN/Inf at round %d, time %d (day %.4f): "
                   "stopping (status 'diverged'); set stop_on_nan=False to continue regardless",
                   self.round, t, t / config_lib.UNITS_PER_DAY)

  def _log_events(self, jobs: list[Job], arrivals: list[strategies.Arrival], changed: bool) -> None:
    """One line per received update and, when a round happened, one line for the round. An update's `lr` is
    the one its job was dispatched (and trained) with."""
    records = self.strategy.event_records(self.state, arrivals)
    lines = [{"type": "update", "client": job.dispatch.client, "job_id": job.dispatch.job_id,
              "dispatch_time": job.dispatch.dispatch_time, "arrival_time": job.dispatch.arrival_time,
              "dispatch_round": arrival.dispatch_round, "staleness": arrival.staleness, "lr": job.lr, **extra}
             for job, arrival, extra in zip(jobs, arrivals, records)]
    if changed:
      lines.append({"type": "round", "time": self.now, "round": self.round + 1,
                    **self.strategy.diagnostics(self.state)})
    self.rundir.append("events.jsonl", lines)

  def summary(self) -> dict:
    accs = [r["test_accuracy"] for r in self.history]
    days = [r["day"] for r in self.history]
    wall = time.perf_counter() - self.wall_start
    area = metrics.aulc(days, accs)
    return {
        "status": self.status, "method": self.config.method, "dataset": self.config.data.name,
        "model": self.config.model.name, "seed": self.config.seed,
        "final_test_accuracy": accs[-1] if accs else None,
        "best_test_accuracy": max(accs) if accs else None,
        "final_test_loss": self.history[-1]["test_loss"] if self.history else None,
        "aulc": area, "aulc_per_day": area / days[-1] if days and days[-1] > 0 else 0.0,
        "virtual_days": self.now / config_lib.UNITS_PER_DAY, "time": self.now, "rounds": self.round,
        "client_updates": self.client_updates, "wall_seconds": wall,
        "train_seconds": self.executor.train_seconds,
        "client_updates_per_second": self.client_updates / wall if wall > 0 else 0.0,
        # Accounting: client compute = local training plus client payloads (train_seconds);
        # server compute = the strategy's receive steps; bytes as the strategy counts them.
        "client_compute_seconds": self.executor.train_seconds,
        "server_compute_seconds": self.server_seconds,
        "bytes_uploaded": self.bytes_uploaded, "bytes_downloaded": self.bytes_downloaded,
        # Accumulated upload in MiB (2^20 bytes): AiFed's cost_a (Eq. 17: 4 bytes per parameter / 1024²).
        "uploaded_mb": self.bytes_uploaded / 2 ** 20,
        "upload_bytes_per_update": self.bytes_uploaded / self.client_updates if self.client_updates else 0.0,
        "download_bytes_per_update": (self.bytes_downloaded / self.client_updates
                                      if self.client_updates else 0.0),
        "diverged_at": self.diverged_at if self.status == "diverged" else None,
        **self._personalized(),
        **self._to_target(),
        # How client updates ran (local.execution): the backend, the share of SGD steps that were
        # padding (masked steps of batched jobs), the batched calls, and the XLA compiles of the run.
        "execution": self.execution, "padding_waste": self.executor.stats.padding_waste,
        "execution_batches": self.executor.stats.batches, "compiles": self.compiles.count,
        "client_payload_seconds": self.executor.stats.payload_seconds,  # (part of client_compute_seconds)
        "compile_seconds": self.compiles.seconds,
    }

  def _personalized(self) -> dict:
    """Final and best personalised accuracy, when the run evaluates on local test splits."""
    accs = [r["personalized_accuracy"] for r in self.history if "personalized_accuracy" in r]
    if not accs:
      return {}
    return {"final_personalized_accuracy": accs[-1], "best_personalized_accuracy": max(accs)}

  def _to_target(self) -> dict:
    """The first evaluation at or above `eval.target_accuracy` (time-to-accuracy; None if never reached)."""
    target = self.config.eval.target_accuracy
    if not target:
      return {}
    hit = next((r for r in self.history if r["test_accuracy"] >= target), None)
    out = {"target_accuracy": target,
           **{f"{k}_to_target": hit[k] if hit else None
              for k in ("day", "time", "round", "client_updates", "bytes_uploaded")}}
    if any("personalized_accuracy" in r for r in self.history):
      # The same target on personalised accuracy (CASA reports time to target on it).
      hit = next((r for r in self.history if r.get("personalized_accuracy", -1.0) >= target), None)
      out.update({f"personalized_{k}_to_target": hit[k] if hit else None
                  for k in ("day", "time", "round", "client_updates", "bytes_uploaded")})
    return out

  def finish(self) -> dict:
    """Evaluates at the end of the budget (if not done), writes summary.json, closes the outputs."""
    if self.status == "running":
      self.run_until(self.budget / config_lib.UNITS_PER_DAY)
    if self.status == "running":  # (not after a divergence: its evaluation was the last)
      self._log_eval(self.budget)
      if self.status == "running":
        self.status = "completed"
    # The end checkpoint lets a rerun return at once, and a larger sim.virtual_days extend the run.
    if self.checkpoints and self.now > self.last_checkpoint:
      self.save_checkpoint(self.now)
    self.progress.close()
    summary = self.summary()
    if self.rundir:
      self.rundir.write_summary(summary)
    self.close()
    return summary

  def run(self) -> dict:
    """The whole run; on an exception the summary is written with status 'failed', then it re-raises."""
    try:
      return self.finish()
    except BaseException:
      self.status = "failed"
      self.progress.close()
      if self.rundir:
        self.rundir.write_summary(self.summary())
      self.close()
      raise

  def close(self) -> None:
    """Closes the outputs and the checkpoint store (the run can be resumed from its workdir later)."""
    self.compiles.close()
    if self.rundir:
      self.rundir.close()
    if self.checkpoints:
      self.checkpoints.close()

  # --- checkpoints ----------------------------------------------------------------------------------

  def save_checkpoint(self, step: int) -> None:
    """Saves the run at virtual time `step` (an evaluation time, or the end) so it continues exactly."""
    self.rundir.sync()  # the positions recorded below must be on disk before the checkpoint exists
    snapshot = {
        "loop": {"now": self.now, "round": self.round, "client_updates": self.client_updates,
                 "next_eval": self.next_eval, "status": self.status, "diverged_at": self.diverged_at,
                 "wall_seconds": time.perf_counter() - self.wall_start,
                 "train_seconds": self.executor.train_seconds, "server_seconds": self.server_seconds,
                 "bytes_uploaded": self.bytes_uploaded, "bytes_downloaded": self.bytes_downloaded,
                 "metrics_lines": len(self.history), "metrics_bytes": self.rundir.size("metrics.jsonl"),
                 "events_bytes": self.rundir.size("events.jsonl")},
        "scheduler": self.scheduler.state_dict(),
        "strategy": self.strategy.save_state(self.state),
        # In-flight jobs by job id, as plain dicts (the format does not depend on where Job lives).
        # Results already computed are not stored: they are recomputed on resume, identically.
        "jobs": [{**dataclasses.asdict(job.dispatch), "params_start": job.params_start, "lr": job.lr,
                  "dispatch_round": job.dispatch_round, "aux": job.aux} for _, job in sorted(self.jobs.items())],
        "clients_key": self.executor.clients_key,
    }
    self.checkpoints.save(step, snapshot, io.config_json(self.config))
    self.last_checkpoint = step

  def _restore(self, restored: checkpoint_lib.Restored) -> None:
    """Continues from a checkpoint: state, clock, jobs, counters, and outputs cut back to its positions."""
    diffs = config_lib.config_differences(restored.config, io.config_json(self.config))
    if diffs:
      raise config_lib.ConfigError(
          f"the checkpoint {restored.step} in {self.checkpoints.directory} was made with a different config "
          f"({'; '.join(diffs[:5])}); allowed: the same config (only {', '.join(config_lib.RESUMABLE_FIELDS)} "
          "may change)")
    snap = restored.snapshot
    loop = snap["loop"]
    if loop["now"] > self.budget:
      raise config_lib.ConfigError(
          f"sim.virtual_days={self.config.sim.virtual_days!r} is invalid for resuming this run; allowed: a "
          f"number >= {loop['now'] / config_lib.UNITS_PER_DAY!r} (the time of its last checkpoint)")
    self.state = self.strategy.restore_state(self.state, snap["strategy"])
    self.scheduler.load_state_dict(snap["scheduler"])
    self.executor.clients_key = snap["clients_key"]  # (nothing was submitted yet: the executor is fresh)
    for j in snap["jobs"]:
      job = Job(Dispatch(j["job_id"], j["client"], j["dispatch_time"], j["arrival_time"]), j["params_start"],
                j["lr"], j["dispatch_round"], j["aux"])
      self.jobs[job.dispatch.job_id] = job
      self.executor.submit(job)
    self.executor.train_seconds = loop["train_seconds"]
    self.server_seconds = loop.get("server_seconds", 0.0)
    self.bytes_uploaded, self.bytes_downloaded = loop.get("bytes_uploaded", 0), loop.get("bytes_downloaded", 0)
    self.now, self.round, self.client_updates = loop["now"], loop["round"], loop["client_updates"]
    self.next_eval, self.status, self.diverged_at = loop["next_eval"], loop["status"], loop["diverged_at"]
    if self.status == "completed" and self.now < self.budget:
      self.status = "running"  # a finished run given a larger sim.virtual_days goes on
    self.wall_start = time.perf_counter() - loop["wall_seconds"]
    self.last_checkpoint = self.resumed_from = restored.step
    self.rundir.truncate("metrics.jsonl", loop["metrics_bytes"])
    self.rundir.truncate("events.jsonl", loop["events_bytes"])
    self.history = [io.restore_nonfinite(r) for r in io.read_jsonl(self.rundir.file("metrics.jsonl"))]
    if len(self.history) != loop["metrics_lines"]:
      raise RuntimeError(f"{self.rundir.file('metrics.jsonl')} holds {len(self.history)} lines where the "
                         f"checkpoint recorded {loop['metrics_lines']}; it cannot continue exactly")
    if self.history:
      self.progress.update(round(self.history[-1]["day"], 6))
    _log.info("resumed %s from its checkpoint at day %.4f (round %d)", self.rundir.path,
              restored.step / config_lib.UNITS_PER_DAY, self.round)


def summary_line(summary: dict) -> str:
  """One line for the end of a run."""
  return (f"{summary['method']} on {summary['dataset']}: {summary['status']}, final acc "
          f"{summary['final_test_accuracy']:.4f} (best {summary['best_test_accuracy']:.4f}), AULC "
          f"{summary['aulc']:.4f} acc-days ({summary['aulc_per_day']:.4f}/day) over "
          f"{summary['virtual_days']:.3f} days; {summary['rounds']} rounds, {summary['client_updates']} "
          f"client updates in {summary['wall_seconds']:.1f} s "
          f"({summary['client_updates_per_second']:.2f}/s, {summary['train_seconds']:.1f} s training)")
