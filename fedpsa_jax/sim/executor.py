"""Client execution (docs/performance.md): every job computed once, by the configured backend.

A job's result depends only on (parameters at dispatch, client data, lr, key = fold_in(clients_key,
job_id)), so when, where and beside which other jobs it is computed never changes it (beyond float
reassociation inside a vmapped batch).

Backends (`runtime.execution`):
- `loop`: one jitted client update per job, issued ahead of its arrival (JAX dispatches asynchronously:
  the job trains while the host goes on), and waited for only when the host needs its result. When the
  host asks for a result, that job is issued if it was not yet, then the next jobs to arrive, up to
  `jobs_ahead` issued per client device (`runtime.jobs_ahead`; 0: every job at its dispatch). An issued job
  holds its trained parameters until it arrives: issuing each at its dispatch held one parameter tree per
  in-flight job (10 on the default job), where a few ahead keep the devices as busy. Each job goes to the
  client device given the fewest jobs so far (ties: the first; deterministic, a function of the schedule).
  The payloads and server steps that the server's device runs beside its share of training are not
  counted: the executor cannot see their cost (docs/performance.md, "Host devices"). On a CPU,
  `--xla_force_host_platform_device_count=D` gives D host devices; XLA:CPU runs each convolution on one
  core, so two client devices keep both cores of a 2-core CPU busy. With three or more devices the
  server's device (where the data and the server state live) trains no clients: a device runs its work
  in order, so a server step would otherwise wait behind training.
- `vmap`: lazy. Dispatched jobs are only recorded; when a result is needed, the pending jobs are
  bucketed by step count (rounded up to a power of two), each bucket cut into batches of exactly
  `width` clients (`runtime.vmap_width`; the last one filled with inert 0-sample jobs), and each batch
  runs as one vmapped call of `max steps in the batch` steps; steps past a client's own count are
  masked no-ops. One width for every call: XLA's results change with a batch's size (a linear
  client's bits differed between batches of 1-5 and of 8-16 clients), never with its
  position or its neighbours, so a job's result is a function of its own inputs alone, and a run
  resumed from a checkpoint (which recomputes its in-flight jobs in other company) repeats an
  uninterrupted one bit for bit.
- `sharded`: as `vmap`, with the client axis of each batch split over every local device with
  `shard_map` (the width a multiple of the device count).
- `auto`: `loop`, the fastest measured on a CPU and on a GPU (see `resolve_execution`).

Each backend is a builder registered by name (`register_backend`, as strategies are): `make_executor` builds the
one a config names, and another backend is one `ClientExecutor` subclass and its registered builder.

Padding waste (masked steps / steps run) and the number of batches are kept in `stats`.

Waiting. The executor never waits for a device unless `phase_timing` asks it to (`runtime.phase_timing`):
a result is handed to the server as a not-yet-computed array, and the server step that uses it queues
behind it on the device. With `phase_timing` on, it waits before and after each piece so that training
and client payloads get their own wall-clock seconds (`train_seconds`, `stats.payload_seconds`: the
paper's Fig. 5), at the cost of the overlap of host and device work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpsa_jax import checkpoint, choices, local, strategies
from fedpsa_jax.compiles import CompileCounter
from fedpsa_jax.data.federated import FederatedData
from fedpsa_jax.sim.scheduler import Dispatch
from fedpsa_jax.tree_util import tree_sub

Params = Any
EXECUTIONS = choices.EXECUTIONS  # runtime.execution, built in: defined once, in the config's vocabularies
# A backend's builder: (trainer, fed, strategy, clients_key, *, compiles, phase_timing, width, concurrency,
# jobs_ahead) -> ClientExecutor; each takes the options it uses and leaves the rest (`**_`).
Builder = Callable[..., "ClientExecutor"]
_BACKENDS: dict[str, Builder] = {}


def register_backend(name: str) -> Callable[[Builder], Builder]:
  """Decorator: makes a builder selectable as `config.runtime.execution = name` in this process (as
  `strategies.register` does a strategy). `make_executor` calls it with the run's trainer, federated data,
  strategy and clients key, and the keyword options `compiles` (a CompileCounter or None), `phase_timing`,
  `width` and `concurrency` (the vmap width's inputs) and `jobs_ahead` (the `runtime` section's)."""

  def wrap(build: Builder) -> Builder:
    _BACKENDS[name] = build
    choices.register("runtime.execution", name)  # (what config validation reads: it imports no executor)
    return build

  return wrap


def resolve_execution(execution: str) -> str:
  """The backend `auto` stands for: `loop`, on every platform measured (docs/performance.md, "Why `auto` is `loop`").

  On a CPU vmapped conv training is much slower (grouped convolutions; dense models run about as fast either
  way); on a GPU `loop` was faster than `vmap`, in less device memory (benchmarks/gpu_backends.py). Several GPUs
  are not measured: `loop` spreads the jobs over every device, and `sharded` is `vmap`'s program split over them.
  """
  return "loop" if execution == "auto" else execution


def client_devices(execution: str, home: jax.Device) -> list[jax.Device]:
  """Where client training runs: `loop` uses every local device, but leaves the server's device (`home`)
  to the server when there are three or more (a device runs its work in order: a server step queued
  behind a client's training would hold up the next dispatch). vmap/sharded batches start on `home`."""
  if execution != "loop":
    return [home]
  devices = jax.local_devices()
  return [d for d in devices if d != home] if len(devices) >= 3 else devices


def place_data(data: Any, device: jax.Device) -> Any:
  """`data` (read-only arrays on the server's device) for a client device. Host devices share the host's
  memory: a NumPy view of the arrays, put on `device`, is adopted there without a copy (XLA:CPU takes
  aligned host memory as is; a JAX array's is), so the data exist once however many host devices train
  (the MNIST CNN job: 13.5 MB per device). Elsewhere, a copy on `device`."""
  if device.platform == "cpu":  # (then every local device is a host device, the server's too)
    data = jax.tree.map(np.asarray, data)
  return jax.device_put(data, device)


@checkpoint.register_record
@dataclasses.dataclass(frozen=True)
class Job:
  """A dispatched client update, waiting to be computed or received. A checkpoint holds the jobs in flight
  as they are; their results are not kept, but recomputed on resume (they depend only on these fields)."""

  dispatch: Dispatch
  params_start: Params
  lr: float
  dispatch_round: int
  aux: Any = ()  # the aux of the strategy's `dispatch` (e.g. FedPAC's global prototypes)


@dataclasses.dataclass
class ExecutionStats:
  """What the executor did: batches, jobs and SGD steps (needed vs run, the difference is padding)."""

  batches: int = 0  # batched calls (loop: one per job)
  jobs: int = 0
  steps_needed: int = 0  # Σ each job's own step count
  steps_run: int = 0  # Σ batch size × steps of each batched call (padding jobs and masked steps included)
  samples_needed: int = 0  # Σ epochs × each job's sample count: the rows of real data the SGD steps use
  payload_seconds: float = 0.0  # of the executor's time, computing client payloads (e.g. FedPSA's sketch)
  compile_seconds: float = 0.0  # of the executor's time, compiling (when given a CompileCounter)

  @property
  def padding_waste(self) -> float:
    return 1.0 - self.steps_needed / self.steps_run if self.steps_run else 0.0


_job_keys = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(None, 0)))


@functools.partial(jax.jit, static_argnums=1)
def _unstack(tree: Params, size: int) -> list[Params]:
  return [jax.tree.map(lambda x: x[i], tree) for i in range(size)]


def _stack(trees: Sequence[Params]) -> Params:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def client_data(x_all: jax.Array, y_all: jax.Array, index_table: jax.Array,
                sizes: Sequence[int]) -> list[local.ClientData]:
  """Each client's `local.ClientData` (row i of `index_table`, its size a host int32, orders None: a job draws
  them), sliced once for a run's every job."""
  return [local.ClientData(x_all, y_all, row, None, np.int32(n)) for row, n in zip(index_table, sizes)]


def vmap_width(requested: int, concurrency: int, devices: int = 1) -> int:
  """Clients per vmapped call (`runtime.vmap_width`): `requested`, or for 0 the in-flight count C rounded up
  to a power of two (every pending job fits one call per step-count bucket); then rounded up to a multiple
  of `devices` (sharded: each device gets the same share)."""
  width = requested if requested > 0 else 1 << max(concurrency - 1, 0).bit_length()
  return -(-width // devices) * devices


class ClientExecutor:
  """What every backend shares, and the protocol the runner uses: `submit(job)` when a job is dispatched,
  `result(job_id) -> (Δ, payload)` when it arrives, `wait_for_home()` before a server step, and the
  accounting (`train_seconds`, `stats`). `make_executor` builds the backend a config names."""

  execution: str = ""

  def __init__(self, trainer: local.LocalTrainer, fed: FederatedData, strategy: strategies.Strategy,
               clients_key: jax.Array, compiles: CompileCounter | None = None, phase_timing: bool = False):
    self.trainer, self.fed, self.strategy, self.clients_key = trainer, fed, strategy, clients_key
    self.compiles = compiles
    self.phase_timing = phase_timing  # wait for the devices to time training and payloads (module docstring)
    self.results: dict[int, tuple[Params, Any]] = {}
    self.train_seconds = 0.0
    self.stats = ExecutionStats()
    self.home = fed.home  # where the data and the server state live
    # Each client's data as the strategy's payloads read it (`ClientJob.data`: the table's own rows), built once:
    # slicing the table per job is an eager gather (host time per job). And the table padded to the width local
    # training compiles for (`training_data`).
    self.client_data = client_data(fed.x_train, fed.y_train, fed.client_indices, fed.client_sizes)
    self.train_table = local.training_rows(fed.client_indices)

  def submit(self, job: Job) -> None:
    raise NotImplementedError

  def result(self, job_id: int) -> tuple[Params, Any]:
    raise NotImplementedError

  @functools.cached_property
  def training_data(self) -> list[local.ClientData]:
    """Each client's data as local training reads it, on the server's device (`train_table`'s rows): what a
    job trained there hands `trainer.train_job`."""
    return client_data(self.fed.x_train, self.fed.y_train, self.train_table, self.fed.client_sizes)

  def wait_for_home(self) -> None:
    """Waits for client training queued on the server's device (none by default)."""

  @contextlib.contextmanager
  def _timed(self):
    """Counts the host's time in here as client compute (train_seconds), and the compiles in it (only
    under `phase_timing`: without its waits, that time would be the host's dispatching, not the clients')."""
    if not self.phase_timing:
      yield
      return
    start = time.perf_counter()
    compile_start = self.compiles.seconds if self.compiles else 0.0
    try:
      yield
    finally:
      self.train_seconds += time.perf_counter() - start
      if self.compiles:
        self.stats.compile_seconds += self.compiles.seconds - compile_start

  def samples_of(self, job: Job) -> int:
    """Epochs × the client's sample count: the rows of real data the job's SGD steps use."""
    return self.trainer.epochs * int(self.fed.client_sizes[job.dispatch.client])

  def steps_of(self, job: Job) -> int:
    return local.num_local_steps(int(self.fed.client_sizes[job.dispatch.client]), self.trainer.batch_size,
                                 self.trainer.epochs)

  def _client_job(self, job: Job) -> strategies.ClientJob:
    return strategies.ClientJob(client=job.dispatch.client, data=self.client_data[job.dispatch.client], aux=job.aux)

  def finish(self, jobs: Sequence[Job], ends: Sequence[Params]) -> None:
    """Every job's payload and Δ from its trained parameters (loop: one job; vmap/sharded: a batch), into
    `results`, on the server's device (where `ends` must be), as every backend hands them over. Under
    `phase_timing` the payloads are issued once the training is done and waited for, so that their time is
    told apart from it; otherwise nothing here waits."""
    if self.phase_timing:
      jax.block_until_ready(ends)
    start = time.perf_counter()
    payload = self.strategy.client.payload
    payloads = [payload(job.params_start, end, self._client_job(job)) if payload is not None else ()
                for job, end in zip(jobs, ends)]
    if self.phase_timing:
      jax.block_until_ready(payloads)
      self.stats.payload_seconds += time.perf_counter() - start
    for job, end, payload in zip(jobs, ends, payloads):
      self.results[job.dispatch.job_id] = (tree_sub(end, job.params_start), payload)


class LoopExecutor(ClientExecutor):
  """`loop`: one jitted client update per job, issued ahead of its arrival (at most `jobs_ahead` per client
  device; 0: at its dispatch) on the client device given the fewest jobs."""

  execution = "loop"

  def __init__(self, trainer: local.LocalTrainer, fed: FederatedData, strategy: strategies.Strategy,
               clients_key: jax.Array, compiles: CompileCounter | None = None, phase_timing: bool = False,
               jobs_ahead: int = 0):
    super().__init__(trainer, fed, strategy, clients_key, compiles, phase_timing)
    self.devices = client_devices("loop", self.home)
    # At most this many jobs issued and not yet received (inf: each issued at its submit). A job asked for
    # before its turn is issued then, and received at once.
    self.max_issued = jobs_ahead * len(self.devices) if jobs_ahead > 0 else math.inf
    self.waiting: dict[int, Job] = {}  # submitted, not yet issued, by job id
    # A heap of (arrival time, client, job id): the scheduler's order of arrivals.
    self.arrival_order: list[tuple[int, int, int]] = []
    self.issued: dict[int, tuple[Job, Params, jax.Device]] = {}  # job id -> (job, trained params, device)
    self.device_jobs = dict.fromkeys(self.devices, 0)  # jobs given to each device so far (`_issue`)
    server_data = (fed.x_train, fed.y_train, self.train_table)
    self.device_data = {d: server_data if d == self.home else place_data(server_data, d) for d in self.devices}
    # Each client's training data on each device, built once (as `client_data`: no gather per job).
    self.device_clients = {d: client_data(*data, fed.client_sizes) for d, data in self.device_data.items()}
    # The clients' key on each device: a job's shuffle is drawn where it trains (fold_in(key, job id)).
    self.device_keys = {d: jax.device_put(clients_key, d) for d in self.devices}

  def submit(self, job: Job) -> None:
    """Issues the job's training now with `jobs_ahead=0`; else queues it, to be issued by `result` once it
    is among the next arrivals (the host does not wait for a job it issues)."""
    d = job.dispatch
    self.waiting[d.job_id] = job
    heapq.heappush(self.arrival_order, (d.arrival_time, d.client, d.job_id))
    if self.max_issued == math.inf:
      with self._timed():
        self._issue_ahead()

  def _issue_ahead(self) -> None:
    """Issues waiting jobs, the next to arrive first, while fewer than `max_issued` are issued."""
    while self.waiting and len(self.issued) < self.max_issued:
      job_id = heapq.heappop(self.arrival_order)[2]
      if job_id in self.waiting:  # (else issued already, in `result`)
        self._issue(self.waiting.pop(job_id))

  def _issue(self, job: Job) -> None:
    """Issues the job's training now, on the client device given the fewest jobs so far."""
    device = min(self.devices, key=self.device_jobs.__getitem__)  # (ties: the first device)
    self.device_jobs[device] += 1
    self.issued[job.dispatch.job_id] = (job, self._loop_one(job, device), device)

  def result(self, job_id: int) -> tuple[Params, Any]:
    """(Δ, payload) of a job, once its training is done. Issues it if it is still waiting, and after it the
    next waiting jobs, up to `max_issued`: before its payload, so that the devices have them queued while
    the server's work on this one runs."""
    with self._timed():
      if job_id in self.waiting:  # (the first result of a run, or a job arriving before those issued ahead)
        self._issue(self.waiting.pop(job_id))
      job, end, device = self.issued.pop(job_id)
      self._issue_ahead()
      if self.phase_timing:
        self._block_home()  # the payload below runs there: its time must not include queued training
      self.finish([job], [end if device == self.home else jax.device_put(end, self.home)])
    return self.results.pop(job_id)

  def wait_for_home(self) -> None:
    """Waits for the training issued on the server's device, if it trains clients too (one or two
    devices), counted as client compute. A device runs its work in order, so a server step issued now
    would wait for that training anyway, and its measured time would be the clients'."""
    with self._timed():
      self._block_home()

  def _block_home(self) -> None:
    if self.home in self.device_jobs:
      jax.block_until_ready([end for _, end, device in self.issued.values() if device == self.home])

  def _loop_one(self, job: Job, device: jax.Device) -> Params:
    """Issues one job's local training on `device` and returns its (not yet computed) parameters."""
    steps = self.steps_of(job)
    params, aux = (job.params_start, job.aux) if device == self.home else \
        jax.device_put((job.params_start, job.aux), device)
    # A copy on another device is this job's own: its first step may consume it (local.py, donation).
    params_end = self.trainer.train_job(params, self.device_clients[device][job.dispatch.client], lr=job.lr,
                                        clients_key=self.device_keys[device], job_id=job.dispatch.job_id, aux=aux,
                                        owned=device != self.home)
    self.stats.batches += 1
    self.stats.jobs += 1
    self.stats.steps_needed += steps
    self.stats.samples_needed += self.samples_of(job)
    self.stats.steps_run += steps
    return params_end


class BatchedExecutor(ClientExecutor):
  """`vmap` (`mesh` None) and `sharded` (the client axis split over `mesh`): lazy, every pending job
  computed in power-of-two vmapped batches when a result is needed."""

  def __init__(self, trainer: local.LocalTrainer, fed: FederatedData, strategy: strategies.Strategy,
               clients_key: jax.Array, compiles: CompileCounter | None = None,
               mesh: jax.sharding.Mesh | None = None, phase_timing: bool = False, width: int = 8):
    super().__init__(trainer, fed, strategy, clients_key, compiles, phase_timing)
    self.execution = "vmap" if mesh is None else "sharded"
    self.mesh = mesh
    if mesh is not None and width % mesh.devices.size:
      raise ValueError(f"width={width} is invalid with {mesh.devices.size} devices; allowed: a multiple of it")
    self.width = width  # clients in every vmapped call (module docstring: why one width)
    self.pending: dict[int, Job] = {}
    self.x_all, self.y_all = fed.x_train, fed.y_train
    if mesh is not None:
      # The data lives on every device once, not copied at every call.
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      self.x_all, self.y_all = jax.device_put((fed.x_train, fed.y_train), replicated)
      self.split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("clients"))

  def submit(self, job: Job) -> None:
    """Records the job for the next batched call."""
    self.pending[job.dispatch.job_id] = job

  def result(self, job_id: int) -> tuple[Params, Any]:
    """(Δ, payload) of a job; every pending job is computed first if this one is not done yet."""
    if job_id not in self.results:
      with self._timed():
        self._compute_pending()
    return self.results.pop(job_id)

  def _compute_pending(self) -> None:
    jobs = [job for _, job in sorted(self.pending.items())]
    self._batched(jobs)
    if self.phase_timing:
      jax.block_until_ready(list(self.results.values()))
    self.pending.clear()

  def _batched(self, jobs: list[Job]) -> None:
    """Buckets by step count (next power of two), then power-of-two batches of similar step counts."""
    steps = {job.dispatch.job_id: self.steps_of(job) for job in jobs}
    buckets: dict[int, list[Job]] = {}
    for job in sorted(jobs, key=lambda j: (steps[j.dispatch.job_id], j.dispatch.job_id)):
      s = steps[job.dispatch.job_id]
      buckets.setdefault(1 << max(s - 1, 0).bit_length(), []).append(job)
    for bucket in buckets.values():
      bucket = bucket[::-1]  # longest first, so each batch holds the most similar step counts
      while bucket:
        batch, bucket = bucket[:self.width], bucket[self.width:]
        self._run_batch(batch, self.width, max(steps[j.dispatch.job_id] for j in batch))
        self.stats.steps_needed += sum(steps[j.dispatch.job_id] for j in batch)
        self.stats.samples_needed += sum(self.samples_of(j) for j in batch)

  def _run_batch(self, batch: list[Job], size: int, total_steps: int) -> None:
    real = len(batch)
    padded = batch + [batch[0]] * (size - real)  # inert copies (0 samples): every call has the same width
    clients = np.array([j.dispatch.client for j in padded])
    sizes = np.array([self.fed.client_sizes[c] for c in clients], np.int32)
    sizes[real:] = 0
    params_start = _stack([j.params_start for j in padded])
    aux = _stack([j.aux for j in padded]) if jax.tree.leaves(batch[0].aux) else batch[0].aux
    keys = _job_keys(self.clients_key, jnp.asarray([j.dispatch.job_id for j in padded], jnp.uint32))
    per_client = (params_start, jnp.take(self.train_table, jnp.asarray(clients), axis=0), jnp.asarray(sizes),
                  jnp.asarray([j.lr for j in padded], jnp.float32), keys, aux)
    if self.mesh is not None:  # each device gets its share of the clients
      per_client = jax.device_put(per_client, self.split)
    params_start, index_rows, sizes, lrs, keys, aux = per_client
    data = local.ClientData(self.x_all, self.y_all, index_rows, None, sizes)  # (J clients: a leading axis)
    params_end = self.trainer.train_batch(params_start, data, lr=lrs, keys=keys, total_steps=total_steps, aux=aux,
                                          mesh=self.mesh, owned=True)  # (`_stack` made them)
    if self.mesh is not None:  # results back on the default device, where the server state lives
      params_end = jax.device_put(params_end, self.home)
    self.finish(batch, _unstack(params_end, real))
    self.stats.batches += 1
    self.stats.jobs += real
    self.stats.steps_run += size * total_steps


@register_backend("loop")
def _loop(trainer, fed, strategy, clients_key, *, compiles, phase_timing, jobs_ahead, **_) -> ClientExecutor:
  return LoopExecutor(trainer, fed, strategy, clients_key, compiles, phase_timing, jobs_ahead)


@register_backend("vmap")
def _vmap(trainer, fed, strategy, clients_key, *, compiles, phase_timing, width, concurrency, **_) -> ClientExecutor:
  return BatchedExecutor(trainer, fed, strategy, clients_key, compiles, phase_timing=phase_timing,
                         width=vmap_width(width, concurrency))


@register_backend("sharded")
def _sharded(trainer, fed, strategy, clients_key, *, compiles, phase_timing, width, concurrency,
             **_) -> ClientExecutor:
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), ("clients",))
  return BatchedExecutor(trainer, fed, strategy, clients_key, compiles, mesh=mesh, phase_timing=phase_timing,
                         width=vmap_width(width, concurrency, mesh.devices.size))


def registered_backends() -> tuple[str, ...]:
  """The `runtime.execution` names `make_executor` builds (`auto` is resolved before)."""
  return tuple(_BACKENDS)


def make_executor(execution: str, trainer: local.LocalTrainer, fed: FederatedData, strategy: strategies.Strategy,
                  clients_key: jax.Array, compiles: CompileCounter | None = None,
                  phase_timing: bool = False, width: int = 0, concurrency: int = 1,
                  jobs_ahead: int = 0) -> ClientExecutor:
  """The backend `execution` names (`register_backend`: `loop`, `vmap`, `sharded` or one registered; resolve
  `auto` first); `width` and `concurrency` give vmap/sharded's clients per call (`vmap_width`), `jobs_ahead`
  loop's jobs issued ahead per client device (0: each at its dispatch)."""
  if execution not in _BACKENDS:
    raise ValueError(f"runtime.execution={execution!r} is invalid; allowed: {', '.join(_BACKENDS)}")
  return _BACKENDS[execution](trainer, fed, strategy, clients_key, compiles=compiles, phase_timing=phase_timing,
                              width=width, concurrency=concurrency, jobs_ahead=jobs_ahead)
