"""Compiled cost and measured time of every jitted piece of a run.

For the configured model and data, each piece is compiled once, then reported with:
- `gflops` and `gbytes` from XLA's cost analysis of the compiled program. XLA counts a loop body
  once, so pieces are costed loop-free: local training as the sum of its unrolled programs
  (`LocalTrainer.update_programs`), evaluation as its number of batches times one batch, a method's
  looped pieces through loop-free twins (FedPSA's factored Fisher: `conv_loop='batched'`, the same matmuls),
  which, never run, compile at LLVM's level 0 (`COST_ONLY_OPTIONS`: the same figures in half the time);
- `temp_mb`: the largest temporary buffer allocation of its compiled programs (memory analysis);
- `compile_s`: the seconds XLA spent compiling the piece's timed call, in its warm-up call (JAX's
  `/jax/core/compile/backend_compile_duration` events, through `jax.monitoring`), or, where the warm-up compiled
  nothing (the costing, or the run's build, had compiled it already), the costing's compile seconds;
- `ms`: the median wall time over `repeats` calls after that warm-up, each ended by `block_until_ready`, and
  `ms_min` / `ms_max`, their spread; `x_sgd_step` and `x_client_update`, `ms` as multiples of those pieces'
  (None where that piece is not profiled).

The pieces every method has are profiled here: one SGD step (and the partial batch's), one client update,
evaluation, and each strategy's server step. A method's own pieces come from its plug-in in
`fedpsa_jax/profilers/` (FedPSA's Fisher, sensitivity and sketch: `profilers/fedpsa.py`), loaded by name
when the configured method is that one.

`profile(config)` returns the rows as a list of dicts (a notebook makes a DataFrame of them);
`launch.py --mode=profile` prints them as a table, with the provenance (`provenance_of`: the code's commit, the
machine, the config), and writes both to `profile.json`. `pieces` (`--profile_pieces`) limits it to the pieces
named (`piece_names`), checked before any work. With a trace directory, once every piece is compiled and timed,
each piece's timed call runs once more (`TRACE_CALLS`) inside one `jax.profiler` trace (`Profiler.trace`): only
those calls, without the Python tracer (compiles and Python calls made even a small run's trace huge), each
piece a `TraceAnnotation` and each call a `StepTraceAnnotation` of that name; TensorBoard's profiler opens the
folder, Perfetto (ui.perfetto.dev) its `perfetto_trace.json.gz` (`perfetto.write_perfetto`), which holds at
most JAX's cap of events (`perfetto.TRACE_EVENT_CAP`): `profile` warns in one line where a piece has no slice.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import errors, local, memory, metrics, perfetto, profilers, provenance, strategies

# JAX's event for the XLA compile of one program (jax/_src/dispatch.py), reported through jax.monitoring.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# The pieces every method has, in the table's order: local training, then (after a method's own, from its plug-in:
# `profilers.pieces_for`) evaluation and the server steps.
LOCAL_PIECES = ("sgd_step", "sgd_step_partial", "client_update")
EVALUATE = "evaluate"
SERVER_STEP = "server_step"  # `server_step/<method>` for each strategy; the name alone selects them all

# XLA's cost and memory analyses read the optimised HLO and its buffers, which LLVM's optimisation level does not
# change: a program compiled for them alone compiles at level 0 in about half the time (the same FLOPs, bytes and
# temporaries on the CNN's loop-free Fisher and update programs).
COST_ONLY_OPTIONS = {"xla_backend_optimization_level": 0}
TRACE_CALLS = 1  # calls of each piece in a trace: one call of the CNN's Fisher at 512 samples is a large share of JAX's event cap


def piece_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The pieces a profile of `config` can have, as `Profiler(pieces=...)` and `--profile_pieces` name them: the
  generic ones, the configured method's plug-in's, `server_step` (every strategy's) and `server_step/<method>`."""
  strategies.load_all()
  return (*LOCAL_PIECES, *profilers.pieces_for(config.method), EVALUATE, SERVER_STEP,
          *(f"{SERVER_STEP}/{method}" for method in sorted(strategies.registered())))


def check_pieces(config: ml_collections.ConfigDict, pieces: Iterable[str], what: str = "pieces") -> tuple[str, ...]:
  """`pieces` as a tuple when each is one of `piece_names(config)`; a ConfigError naming `what` (the argument or
  flag) and the allowed names otherwise, or when there are none."""
  pieces, allowed = tuple(pieces), piece_names(config)
  unknown = [p for p in pieces if p not in allowed]
  if unknown or not pieces:
    problem = f"{unknown[0]!r} is not a piece of a {config.method} profile" if unknown else "no piece named"
    raise errors.ConfigError(f"{what}={','.join(pieces)}: {problem}; allowed: a comma-separated list of "
                             f"{', '.join(allowed)}")
  return pieces


def compiled_cost(fn: Callable, *args, cost_only: bool = False) -> dict[str, float]:
  """FLOPs, bytes accessed and temporary memory of `jax.jit(fn)(*args)` as compiled here, and the seconds XLA
  spent compiling it (`compile_seconds`). `cost_only`: a program compiled for these figures alone, never run (a
  loop-free twin): compiled at LLVM's optimisation level 0 (`COST_ONLY_OPTIONS`)."""
  compiled: list[Any] = []
  options = COST_ONLY_OPTIONS if cost_only else None
  seconds = compile_seconds(lambda: compiled.append(jax.jit(fn).lower(*args).compile(compiler_options=options)))
  cost = compiled[0].cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  buffers = compiled[0].memory_analysis()
  return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0)),
          "temp_bytes": float(getattr(buffers, "temp_size_in_bytes", 0) or 0), "compile_seconds": seconds}


def compile_seconds(call: Callable[[], Any]) -> float:
  """Runs `call()` once (ended by block_until_ready) and returns the seconds XLA spent compiling in it (0 when
  everything it runs was compiled before)."""
  spent: list[float] = []

  def listener(event: str, seconds: float, **kwargs: Any) -> None:
    del kwargs
    if event == BACKEND_COMPILE_EVENT:
      spent.append(seconds)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    jax.block_until_ready(call())
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return sum(spent)


def call_seconds(call: Callable[[], Any], repeats: int) -> list[float]:
  """The wall time of each of `repeats` calls of `call()`, each ended by block_until_ready."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return times


def median_seconds(call: Callable[[], Any], repeats: int) -> float:
  """Median wall time of `call()` (ended by block_until_ready) after one warm-up call."""
  jax.block_until_ready(call())
  return statistics.median(call_seconds(call, repeats))


def _row(name: str, cost: dict[str, float], compile_s: float, times: Sequence[float], **extra) -> dict[str, Any]:
  return {"piece": name, "gflops": cost["flops"] / 1e9, "gbytes": cost["bytes"] / 1e9,
          "temp_mb": cost["temp_bytes"] / 1e6, "compile_s": compile_s, "ms": statistics.median(times) * 1e3,
          "ms_min": min(times) * 1e3, "ms_max": max(times) * 1e3, "repeats": len(times), **extra}


def _scaled(cost: dict[str, float], times: float) -> dict[str, float]:
  return {**cost, "flops": cost["flops"] * times, "bytes": cost["bytes"] * times}


def _summed(costs: Iterable[dict[str, float]]) -> dict[str, float]:
  costs = list(costs)
  return {"flops": sum(c["flops"] for c in costs), "bytes": sum(c["bytes"] for c in costs),
          "temp_bytes": max((c["temp_bytes"] for c in costs), default=0.0),
          "compile_seconds": sum(c.get("compile_seconds", 0.0) for c in costs)}


class Profiler:
  """Builds one run's pieces (via `Simulation`, without running it) and measures them."""

  def __init__(self, config: ml_collections.ConfigDict, repeats: int = 5, pieces: Iterable[str] | None = None,
               keep_calls: bool = True):
    """`pieces`: the names of the pieces to profile (`piece_names`; None: every piece), checked here.
    `keep_calls`: keep each piece's timed call (its compiled programs and arguments) for `trace`; without, each
    piece's memory goes once it is measured."""
    from fedpsa_jax.sim.runner import Simulation  # here, not at import: runner imports much

    self.pieces = None if pieces is None else frozenset(check_pieces(config, pieces))
    config = ml_collections.ConfigDict(config.to_dict())
    config.runtime.progress = False
    self.sim = Simulation(config, workdir=None)
    self.config, self.repeats, self.keep_calls = config, repeats, keep_calls
    self.params = self.sim.strategy.eval_models(self.sim.state).params
    self.apply_fn = self.sim.model.apply
    self.rows: list[dict[str, Any]] = []
    self.calls: list[tuple[str, Callable[[], Any]]] = []  # each row's timed call, for `trace`

  cost = staticmethod(compiled_cost)  # (for the plug-ins, which do not import this module)

  def wants(self, name: str) -> bool:
    """Whether piece `name` is to be profiled: every piece, or those `pieces` names (`server_step`: all of them)."""
    if self.pieces is None or name in self.pieces:
      return True
    return name.startswith(SERVER_STEP + "/") and SERVER_STEP in self.pieces

  def add(self, name: str, cost: dict[str, float], call: Callable[[], Any], **extra) -> dict[str, Any]:
    """A row for piece `name`: `cost`, the compile time of `call`'s warm-up, and `repeats` timed calls. A warm-up
    that compiled nothing ran the program `cost` compiled (the same function and arguments): its compile time."""
    warm_up = compile_seconds(call)
    row = _row(name, cost, warm_up or cost.get("compile_seconds", 0.0), call_seconds(call, self.repeats), **extra)
    self.rows.append(row)
    if self.keep_calls:
      self.calls.append((name, call))
    memory.trim_heap()  # (the calls' temporaries back to the OS: the next piece's peak does not sit on them)
    return row

  def trace(self, trace_dir: str, calls: int = TRACE_CALLS) -> perfetto.TraceSummary:
    """`calls` of each piece's timed call inside one `jax.profiler` trace in `trace_dir`, compiled already: no
    compile, no Python tracer (host events of the runtime and the annotations only); each piece a
    `TraceAnnotation` (a named slice in Perfetto), each call a `StepTraceAnnotation` of that name (TensorBoard's
    step view). TensorBoard's profiler opens `trace_dir`, Perfetto the summary's `path`
    (`plugins/profile/*/perfetto_trace.json.gz`), whose `problem` says what Perfetto's file lacks."""
    if not self.keep_calls:
      raise ValueError("this Profiler kept no calls to trace (keep_calls=False)")
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    options.enable_hlo_proto = False  # (the programs' HLO: large, and what --mode=profile costs already)
    # (its Perfetto file written here: jax.profiler's create_perfetto_trace loads the whole trace into Python objects)
    jax.profiler.start_trace(trace_dir, profiler_options=options)
    try:
      for name, call in self.calls:
        with jax.profiler.TraceAnnotation(name):
          for step in range(calls):
            with jax.profiler.StepTraceAnnotation(name, step_num=step):
              jax.block_until_ready(call())
    finally:
      jax.profiler.stop_trace()
    memory.trim_heap()  # (the recorded events, freed once written)
    return perfetto.write_perfetto(perfetto.newest_trace_folder(trace_dir), [name for name, _ in self.calls])

  # --- the pieces -----------------------------------------------------------------------------------

  def local_training(self) -> None:
    fed, trainer = self.sim.fed, self.sim.executor.trainer
    client = int(np.argsort(fed.client_sizes)[len(fed.client_sizes) // 2])  # the median-sized client
    n, row, key = int(fed.client_sizes[client]), self.sim.executor.train_table[client], jax.random.key(0)
    orders = local.epoch_orders(key, jnp.int32(n), row.shape[0], trainer.epochs)
    state = local.StepState(params=self.params, anchor=self.params, lr=jnp.float32(0.01))
    data = local.ClientData(x_all=fed.x_train, y_all=fed.y_train, index_row=row, orders=orders,
                            num_samples=jnp.int32(n))
    if self.wants("sgd_step"):
      one_step = lambda state, data: trainer.sgd_step(state, data, jnp.int32(0)).params
      one_step_jit = jax.jit(one_step)  # (built once: a new wrapper per timed call dispatches slowly)
      self.add("sgd_step", compiled_cost(one_step, state, data), lambda: one_step_jit(state, data),
               batch=trainer.batch_size)
    steps = local.num_local_steps(n, trainer.batch_size, trainer.epochs)
    full, rest = trainer.epoch_plan(n)
    if rest and self.wants("sgd_step_partial"):  # each epoch's partial batch runs at `rest` rows (epoch_plan)
      slot = full * trainer.batch_size + jnp.arange(rest)
      partial_step = lambda state, data, order: trainer.batch_step(state, data, order, slot).params
      partial_jit = jax.jit(partial_step)
      self.add("sgd_step_partial", compiled_cost(partial_step, state, data, orders[0]),
               lambda: partial_jit(state, data, orders[0]), batch=rest)
    if self.wants("client_update"):
      programs = trainer.update_programs(state, data.replace(num_samples=n))
      job_data = data.replace(orders=None, num_samples=n)  # (a job draws its own orders)
      cost = _summed([_scaled(compiled_cost(fn, *args, cost_only=True), times) for times, fn, args in programs])
      self.add("client_update", cost,
               lambda: trainer.train_job(self.params, job_data, lr=0.01, clients_key=key, job_id=0),
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
    if not self.wants(EVALUATE):
      return
    fed = self.sim.fed
    n, b = int(fed.x_test.shape[0]), min(self.config.eval.batch_size, int(fed.x_test.shape[0]))
    batches = -(-n // b)
    one = functools.partial(metrics.batch_stats, self.apply_fn)
    cost = compiled_cost(one, self.params, fed.x_test[:b], fed.y_test[:b], jnp.ones((b,), jnp.float32),
                         cost_only=True)
    self.add(EVALUATE, _scaled(cost, batches), lambda: self.sim.evaluate(self.params)["test_accuracy"],
             samples=n, batches=batches)

  def server_steps(self, methods: Sequence[str] | None = None) -> None:
    """Each strategy's server step: one `receive` that completes a round, from real client payloads."""
    fed = self.sim.fed
    registered = strategies.registered()
    for method in sorted(registered) if methods is None else methods:
      if not self.wants(f"{SERVER_STEP}/{method}"):
        continue
      config = ml_collections.ConfigDict(self.config.to_dict())
      config.method = method
      if registered[method].validate_config(config):
        continue  # not applicable to this model (FedPAC on the linear model)
      # The run's own method: its strategy, built already (a second FedPSA would hold a second R).
      strategy = (self.sim.strategy if method == self.config.method else
                  registered[method](config.get(method, ml_collections.ConfigDict()), self.sim.strategy.ctx))
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


@jax.jit
def _trained_from(start: Any, seed: int) -> tuple[Any, Any]:
  """A stand-in for a client's trained parameters, `start` plus small noise drawn from `seed`, and its delta: one
  program (run op by op, the noise compiled a small program per leaf and operation, the first time)."""
  end = jax.tree.map(lambda p: p + 1e-3 * jax.random.normal(jax.random.key(seed), p.shape, p.dtype), start)
  return end, jax.tree.map(jnp.subtract, end, start)


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
    end, delta = _trained_from(start, i)
    job = strategies.ClientJob(client, local.ClientData(fed.x_train, fed.y_train, fed.client_indices[client], None,
                                                        np.int32(fed.client_sizes[client])), aux)
    payload = strategy.client.payload(start, end, job) if strategy.client.payload is not None else ()
    arrivals.append(strategies.Arrival(
        client=client, num_samples=int(fed.client_sizes[client]), staleness=i % 3, dispatch_round=0,
        params_start=start, delta=delta, payload=payload))
    probe, changed = strategy.receive(probe, arrivals[-1:])
    if changed:
      return arrivals
  raise RuntimeError(f"{strategy.name}: no round after {limit} arrivals")


def profile(config: ml_collections.ConfigDict, *, repeats: int = 5, methods: Sequence[str] | None = None,
            trace_dir: str | None = None, pieces: Iterable[str] | None = None,
            warn: Callable[[str], None] | None = None, **method_options) -> list[dict[str, Any]]:
  """Every piece of the configured run, costed and timed: a list of rows (dicts).

  `methods`: whose server step to profile (default: every registered method that applies).
  `trace_dir`: also write a `jax.profiler` trace there (open it in TensorBoard or Perfetto).
  `pieces`: only these (`piece_names`); the rows' multiples of `sgd_step` and `client_update` are None where that
  piece is not profiled.
  `warn`: gets the one line that says what the trace's Perfetto file lacks, if anything (`TraceSummary.problem`;
  default: `warnings.warn`).
  `method_options`: for the configured method's plug-in (`Profiler.method_pieces`), e.g. FedPSA's
  `calibration_sizes`.
  """
  profiler = Profiler(config, repeats=repeats, pieces=pieces, keep_calls=bool(trace_dir))
  profiler.local_training()
  profiler.method_pieces(**method_options)
  profiler.evaluation()
  profiler.server_steps(methods)
  if trace_dir:
    problem = profiler.trace(trace_dir).problem
    if problem:
      (warn or functools.partial(warnings.warn, stacklevel=2))(problem)
  rows = profiler.rows
  step_ms = next((r["ms"] for r in rows if r["piece"] == "sgd_step"), None)
  update_ms = next((r["ms"] for r in rows if r["piece"] == "client_update"), None)
  for r in rows:
    r["x_sgd_step"] = r["ms"] / step_ms if step_ms else None
    r["x_client_update"] = r["ms"] / update_ms if update_ms else None
  return rows


def provenance_of(config: ml_collections.ConfigDict, repeats: int) -> dict[str, Any]:
  """Where a profile's figures come from: the code's commit, the machine and its devices, the config, repeats."""
  return {"code": provenance.code_version(), "machine": provenance.machine(), "repeats": repeats,
          "config": config.to_dict()}


def _multiple(value: float | None, width: int, digits: int) -> str:
  return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def format_table(rows: Sequence[dict[str, Any]], origin: dict[str, Any] | None = None) -> str:
  """The rows as a fixed-width text table (`origin`: `provenance_of`'s, as a first line)."""
  header = (f"{'piece':<28}{'size':>6}{'GFLOP':>10}{'GB':>9}{'temp MB':>10}{'compile s':>10}{'ms':>10}"
            f"{'min-max ms':>16}{'x step':>8}{'x update':>9}")
  lines = [header, "-" * len(header)]
  if origin is not None:
    code, machine = origin["code"], origin["machine"]
    commit = (code["commit"] or "no git checkout")[:12] + (" (modified)" if code["dirty"] else "")
    lines.insert(0, f"code {commit}; {machine['cpu']}, {machine['cores']} cores; {machine['backend']} "
                    f"{machine['devices']}; jax {machine['jax']}; median of {origin['repeats']} calls after a warm-up")
  for r in rows:
    size = r.get("calibration", r.get("steps", r.get("arrivals", r.get("batch", ""))))
    spread = f"{r['ms_min']:.1f}-{r['ms_max']:.1f}"
    lines.append(f"{r['piece']:<28}{size!s:>6}{r['gflops']:>10.3f}{r['gbytes']:>9.3f}{r['temp_mb']:>10.1f}"
                 f"{r['compile_s']:>10.2f}{r['ms']:>10.1f}{spread:>16}{_multiple(r['x_sgd_step'], 8, 2)}"
                 f"{_multiple(r['x_client_update'], 9, 3)}")
  return "\n".join(lines)
