"""Compiled cost and measured time of every jitted piece of a run.

For the configured model and data, each piece is compiled once, then reported with:
- `gflops` and `gbytes` from XLA's cost analysis of the compiled program. XLA counts a loop body
  once, so pieces are costed loop-free: local training as the sum of its unrolled programs
  (`LocalTrainer.update_programs`), evaluation as its number of batches times one batch, a method's
  looped pieces through loop-free twins (FedPSA's factored Fisher: `conv_loop='batched'`, the same matmuls);
- `temp_mb`: the largest temporary buffer allocation of its compiled programs (memory analysis);
- `ms`: the median wall time over `repeats` calls after a warm-up, each ended by `block_until_ready`.

The pieces every method has are profiled here: one SGD step (and the partial batch's), one client update,
evaluation, and each strategy's server step. A method's own pieces come from its plug-in in
`fedpsa_jax/profilers/` (FedPSA's Fisher, sensitivity and sketch: `profilers/fedpsa.py`), loaded by name
when the configured method is that one.

`profile(config)` returns the rows as a list of dicts (a notebook makes a DataFrame of them);
`launch.py --mode=profile` prints them as a table and writes `profile.json`; with a trace directory,
the timed calls run inside `jax.profiler.trace` with one named `TraceAnnotation` per piece.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import local, metrics, profilers, strategies


def compiled_cost(fn: Callable, *args) -> dict[str, float]:
  """FLOPs, bytes accessed and temporary memory of `jax.jit(fn)(*args)` as compiled here."""
  compiled = jax.jit(fn).lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  memory = compiled.memory_analysis()
  return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0)),
          "temp_bytes": float(getattr(memory, "temp_size_in_bytes", 0) or 0)}


def median_seconds(call: Callable[[], Any], repeats: int) -> float:
  """Median wall time of `call()` (ended by block_until_ready) after one warm-up call."""
  jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _row(name: str, cost: dict[str, float], seconds: float, **extra) -> dict[str, Any]:
  return {"piece": name, "gflops": cost["flops"] / 1e9, "gbytes": cost["bytes"] / 1e9,
          "temp_mb": cost["temp_bytes"] / 1e6, "ms": seconds * 1e3, **extra}


def _scaled(cost: dict[str, float], times: float) -> dict[str, float]:
  return {"flops": cost["flops"] * times, "bytes": cost["bytes"] * times, "temp_bytes": cost["temp_bytes"]}


def _summed(costs: Iterable[dict[str, float]]) -> dict[str, float]:
  costs = list(costs)
  return {"flops": sum(c["flops"] for c in costs), "bytes": sum(c["bytes"] for c in costs),
          "temp_bytes": max((c["temp_bytes"] for c in costs), default=0.0)}


class Profiler:
  """Builds one run's pieces (via `Simulation`, without running it) and measures them."""

  def __init__(self, config: ml_collections.ConfigDict, repeats: int = 5, trace: bool = False):
    from fedpsa_jax.sim.runner import Simulation  # here, not at import: runner imports much

    config = ml_collections.ConfigDict(config.to_dict())
    config.runtime.progress = False
    self.sim = Simulation(config, workdir=None)
    self.config, self.repeats, self.trace = config, repeats, trace
    self.params = self.sim.strategy.eval_models(self.sim.state).params
    self.apply_fn = self.sim.model.apply
    self.rows: list[dict[str, Any]] = []

  cost = staticmethod(compiled_cost)  # (for the plug-ins, which do not import this module)

  def _timed(self, name: str, call: Callable[[], Any]) -> float:
    annotation = jax.profiler.TraceAnnotation(name) if self.trace else contextlib.nullcontext()
    with annotation:
      return median_seconds(call, self.repeats)

  def add(self, name: str, cost: dict[str, float], call: Callable[[], Any], **extra) -> dict[str, Any]:
    row = _row(name, cost, self._timed(name, call), **extra)
    self.rows.append(row)
    return row

  # --- the pieces -----------------------------------------------------------------------------------

  def local_training(self) -> None:
    fed, trainer = self.sim.fed, self.sim.executor.trainer
    client = int(np.argsort(fed.client_sizes)[len(fed.client_sizes) // 2])  # the median-sized client
    n, row, key = int(fed.client_sizes[client]), fed.client_indices[client], jax.random.key(0)
    orders = local.epoch_orders(key, jnp.int32(n), row.shape[0], trainer.epochs)
    state = local.StepState(params=self.params, anchor=self.params, lr=jnp.float32(0.01))
    data = local.ClientData(x_all=fed.x_train, y_all=fed.y_train, index_row=row, orders=orders,
                            num_samples=jnp.int32(n))
    one_step = lambda state, data: trainer.sgd_step(state, data, jnp.int32(0)).params
    one_step_jit = jax.jit(one_step)  # (built once: a new wrapper per timed call dispatches slowly)
    self.add("sgd_step", compiled_cost(one_step, state, data), lambda: one_step_jit(state, data),
             batch=trainer.batch_size)
    steps = local.num_local_steps(n, trainer.batch_size, trainer.epochs)
    full, rest = trainer.epoch_plan(n)
    if rest:  # the partial batch of each epoch runs at `rest` rows (see LocalTrainer.epoch_plan)
      slot = full * trainer.batch_size + jnp.arange(rest)
      partial_step = lambda state, data, order: trainer.batch_step(state, data, order, slot).params
      partial_jit = jax.jit(partial_step)
      self.add("sgd_step_partial", compiled_cost(partial_step, state, data, orders[0]),
               lambda: partial_jit(state, data, orders[0]), batch=rest)
    programs = trainer.update_programs(state, data.replace(num_samples=n))
    cost = _summed([_scaled(compiled_cost(fn, *args), times) for times, fn, args in programs])
    self.add("client_update", cost,
             lambda: trainer.train_job(self.params, x_all=fed.x_train, y_all=fed.y_train, index_row=row,
                                       num_samples=n, lr=0.01, clients_key=key, job_id=0),
             steps=steps, samples=n, full_batches=trainer.epochs * full, partial_batches=trainer.epochs * (rest > 0),
             partial_rows=rest)

  def method_pieces(self, **options) -> None:
    """The configured method's own pieces, from its plug-in (`fedpsa_jax/profilers/`; none: nothing to add).
    `options` are the plug-in's (FedPSA's `calibration_sizes`)."""
    plugin = profilers.for_method(self.config.method)
    if plugin is not None:
      plugin(self, **options)
    elif options:
      raise TypeError(f"{self.config.method} has no profiling plug-in to take {', '.join(sorted(options))}")

  def add_on_batch(self, name: str, fn: Callable, x: jax.Array, y: jax.Array, **extra) -> None:
    """Costs and times `fn(params, x, y)`, the batch passed as arguments."""
    self.add(name, compiled_cost(fn, self.params, x, y), functools.partial(jax.jit(fn), self.params, x, y),
             **extra)

  def evaluation(self) -> None:
    fed = self.sim.fed
    n, b = int(fed.x_test.shape[0]), min(self.config.eval.batch_size, int(fed.x_test.shape[0]))
    batches = -(-n // b)
    one = functools.partial(metrics.batch_stats, self.apply_fn)
    cost = compiled_cost(one, self.params, fed.x_test[:b], fed.y_test[:b], jnp.ones((b,), jnp.float32))
    self.add("evaluate", _scaled(cost, batches), lambda: self.sim.evaluate(self.params)["test_accuracy"],
             samples=n, batches=batches)

  def server_steps(self, methods: Sequence[str] | None = None) -> None:
    """Each strategy's server step: one `receive` that completes a round, from real client payloads."""
    fed = self.sim.fed
    registered = strategies.registered()
    for method in sorted(registered) if methods is None else methods:
      config = ml_collections.ConfigDict(self.config.to_dict())
      config.method = method
      if registered[method].validate_config(config):
        continue  # not applicable to this model (FedPAC on the linear model)
      strategy = registered[method](config.get(method, ml_collections.ConfigDict()), self.sim.strategy.ctx)
      state = strategy.init(self.params)
      arrivals = _arrivals_for_a_round(strategy, state, fed)
      count = len(arrivals)
      call = lambda: strategy.receive(state, arrivals)[0]

      def traced_step(s, starts, deltas, payloads, arrivals=arrivals, strategy=strategy):
        # The arrivals' arrays are arguments: closed over as constants, XLA would fold the work.
        rebuilt = [dataclasses.replace(a, params_start=st, delta=d, payload=p)
                   for a, st, d, p in zip(arrivals, starts, deltas, payloads)]
        return strategy.receive(s, rebuilt)[0]

      try:
        cost = compiled_cost(traced_step, state, [a.params_start for a in arrivals], [a.delta for a in arrivals],
                             [a.payload for a in arrivals])
      except (jax.errors.JAXTypeError, jax.errors.ConcretizationTypeError, TypeError):
        # host logic (FedPAC's scipy QP, AiFed's host-side upload check) cannot be traced: timed only
        cost = {"flops": float("nan"), "bytes": float("nan"), "temp_bytes": float("nan")}
      self.add(f"server_step/{method}", cost, call, arrivals=count)


def _arrivals_for_a_round(strategy: strategies.Strategy, state: Any, fed: Any,
                          limit: int = 1000) -> list[strategies.Arrival]:
  """Client updates (the global model plus small noise, with real payloads) that complete one round when
  received together: the fewest, found by receiving them one at a time until the strategy says a round
  happened (so the profiler needs to know no strategy's fields)."""
  arrivals = []
  probe = state
  for i in range(limit):
    client = i % fed.num_clients
    probe, start, aux = strategy.dispatch(probe, client)
    end = jax.tree.map(lambda p, k=i: p + 1e-3 * jax.random.normal(jax.random.key(k), p.shape, p.dtype), start)
    job = strategies.ClientJob(client, local.ClientData(fed.x_train, fed.y_train, fed.client_indices[client], None,
                                                        np.int32(fed.client_sizes[client])), aux)
    payload = strategy.client.payload(start, end, job) if strategy.client.payload is not None else ()
    arrivals.append(strategies.Arrival(
        client=client, num_samples=int(fed.client_sizes[client]), staleness=i % 3, dispatch_round=0,
        params_start=start, delta=jax.tree.map(jnp.subtract, end, start), payload=payload))
    probe, changed = strategy.receive(probe, arrivals[-1:])
    if changed:
      return arrivals
  raise RuntimeError(f"{strategy.name}: no round after {limit} arrivals")


def profile(config: ml_collections.ConfigDict, *, repeats: int = 5, methods: Sequence[str] | None = None,
            trace_dir: str | None = None, **method_options) -> list[dict[str, Any]]:
  """Every piece of the configured run, costed and timed: a list of rows (dicts).

  `methods`: whose server step to profile (default: every registered method that applies).
  `trace_dir`: also write a `jax.profiler` trace there (open it in TensorBoard or Perfetto).
  `method_options`: for the configured method's plug-in (`Profiler.method_pieces`), e.g. FedPSA's
  `calibration_sizes`.
  """
  trace = jax.profiler.trace(trace_dir) if trace_dir else contextlib.nullcontext()
  with trace:
    profiler = Profiler(config, repeats=repeats, trace=trace_dir is not None)
    profiler.local_training()
    profiler.method_pieces(**method_options)
    profiler.evaluation()
    profiler.server_steps(methods)
  rows = profiler.rows
  step_ms = next(r["ms"] for r in rows if r["piece"] == "sgd_step")
  update_ms = next(r["ms"] for r in rows if r["piece"] == "client_update")
  for r in rows:
    r["x_sgd_step"] = r["ms"] / step_ms
    r["x_client_update"] = r["ms"] / update_ms
  return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
  """The rows as a fixed-width text table."""
  header = f"{'piece':<28}{'size':>6}{'GFLOP':>10}{'GB':>9}{'temp MB':>10}{'ms':>10}{'x step':>8}{'x update':>9}"
  lines = [header, "-" * len(header)]
  for r in rows:
    size = r.get("calibration", r.get("steps", r.get("arrivals", r.get("batch", ""))))
    lines.append(f"{r['piece']:<28}{size!s:>6}{r['gflops']:>10.3f}{r['gbytes']:>9.3f}{r['temp_mb']:>10.1f}"
                 f"{r['ms']:>10.1f}{r['x_sgd_step']:>8.2f}{r['x_client_update']:>9.3f}")
  return "\n".join(lines)
