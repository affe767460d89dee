"""Local training: plain SGD on one client's data as a pure function of (params, data, lr, key).

Schedule (FLGo/PyTorch DataLoader semantics): E epochs, each a fresh shuffle of the client's n samples
cut into ceil(n / B) batches; the last batch of an epoch is partial and is kept, its loss being the
mean over its real samples (padding positions are masked out, not dropped). The learning rate is a
traced argument, so decaying it never recompiles.

How the steps are looped is a per-backend choice; the measurements behind it: docs/performance.md.

- `unrolled` (`train_job`, one client): a host loop over compiled calls of at most `max_unroll` steps
  (1, what every run uses: one call per SGD step; benchmarks/unroll.py measures larger chunks).
  An epoch is `n // B` full batches, in chunks of `max_unroll` and then powers of two, and then the partial
  batch at its own size, the next power of two >= n mod B (at least 8), masked past n. Compiled programs:
  one per (steps per call, rows per batch), so with max_unroll = 1 at most one per batch size (B, 8, 16,
  32, ...) whatever the clients' sizes.
- `rolled` (`train_job`, one client): the whole job in one compiled call: its shuffle, then per epoch a
  `fori_loop` over the full batches (a traced count) and the partial batch at its own size, so one program
  per partial-batch size whatever the clients' sizes. The faster on a GPU (measured on an H100:
  docs/performance.md, "GPU"), and on a CPU for models without convolutions, whose steps are short enough
  that a call per step costs more than the step.
- Batched execution of many clients (`train_batch`, vmapped) uses t-indexed full-size steps: every step
  knows its global index t, so a client with fewer steps than the batch's longest simply masks the
  rest; chunks of at most `max_unroll` unrolled steps, the remainder in powers of two.

The unrolled schedules are chains of compiled calls, each consuming the parameters the last one made.
Each call donates its input parameters (`donate_argnames`): the host dispatches a whole job's calls at
once (JAX is asynchronous), and without donation each call's output would be a new buffer, held until
the device gets to it; with it a job in flight holds one set of working parameters whatever its step
count (and a CPU's allocator is not asked for a fresh parameter-sized block at every step). The caller's
parameters (the dispatched model, kept for Δ and as the anchor) are never consumed: the chain starts
from a private copy unless the caller hands over its own (`owned`).

The loss of a batch is the masked mean cross-entropy, or a strategy's `loss`
`(apply_fn, params, anchor, x, y, mask, aux) -> scalar` (FedPAC's prototype alignment), plus the optional
`regularizer(params, anchor)`; `anchor` is the dispatched parameters and `aux` the job's extras from the
server (a pytree of arrays, traced like the data, so new values never recompile).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpsa_jax.tree_util import squared_distance

Params = Any
Regularizer = Callable[[Params, Params], jax.Array]
# (apply_fn, params, anchor, x, y, mask, aux) -> the loss of one padded batch (strategies.base.LocalLoss)
LocalLoss = Callable[[Callable[..., Any], Params, Params, jax.Array, jax.Array, jax.Array, Any], jax.Array]


def num_local_steps(num_samples: int, batch_size: int, epochs: int) -> int:
  """E * ceil(n / B): the number of SGD steps of one client update."""
  return epochs * -(-num_samples // batch_size)


def epoch_orders(key: jax.Array, num_samples: jax.Array, max_samples: int, epochs: int) -> jax.Array:
  """[E, max_n] positions into a client's index row: each row a fresh permutation of 0..n-1 followed
  by the padding positions (sorted last), one independent shuffle per epoch."""
  position = jnp.arange(max_samples)

  def one_epoch(k):
    u = jax.random.uniform(k, (max_samples,))
    return jnp.argsort(jnp.where(position < num_samples, u, 2.0 + position))  # padding keeps its order

  return jax.vmap(one_epoch)(jax.random.split(key, epochs))


def training_width(max_samples: int) -> int:
  """The width of the index rows local training reads: the next power of two >= the largest client's size.

  Local training's programs are compiled per row width (the shuffle's and every step's shapes). Rounded up, the
  runs whose largest client differs (another α, seed or dataset size) share them: a sweep's members, a
  notebook's runs and the test suite compile a client update once per width rather than once per partition.
  The width never changes a result: the padding positions sort after the real ones in every epoch's order and
  are masked out of every batch, and the shuffle's draw for a real position does not depend on the row's
  length (JAX's partitionable Threefry, its default, draws element i from counter i)."""
  return 1 << max(int(max_samples) - 1, 0).bit_length()


def training_rows(client_indices: jax.Array) -> jax.Array:
  """The client index table [N, max_n] padded with index 0 to [N, training_width(max_n)]: the rows local training
  reads (a strategy's payloads read the table itself, whose width their own numbers may depend on)."""
  width = training_width(client_indices.shape[1])
  return jnp.pad(client_indices, ((0, 0), (0, width - client_indices.shape[1])))


def _masked_mean_loss(apply_fn, params, x, y, mask):
  losses = optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, x), y)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@flax.struct.dataclass
class ClientData:
  """The samples one client update reads, traced like every array (new values never recompile): the whole
  training set (shared by every client), the client's padded index row, its epoch orders and its size n.
  Batched (`train_batch`), every field but `x_all`/`y_all` has a leading client axis."""

  x_all: jax.Array  # [N, ...] every client's samples
  y_all: jax.Array  # [N] their labels
  index_row: jax.Array  # [max_n] the client's sample indices (padded past n)
  orders: jax.Array | None  # [E, max_n] positions into index_row (`epoch_orders`); None until drawn in the job
  num_samples: jax.Array  # n, int32


@flax.struct.dataclass
class StepState:
  """What an SGD step reads besides the data: the working parameters, the anchor (the dispatched parameters,
  read by FedProx's term and FedPAC's loss; () when no step reads them) and the learning rate. At the jit
  boundaries of the donating chains the parameters travel apart from the rest: only they are donated."""

  params: Params
  anchor: Params
  lr: jax.Array


@dataclasses.dataclass(frozen=True)
class LocalTrainer:
  """Runs one client's local SGD. Hashable (jit-static) except for arrays passed at call time.

  Two entry points: `train_job` (one client, the loop executor) and `train_batch` (J clients at once, the
  vmap and sharded executors). `sgd_step`/`batch_step` are one step as a pure function of (StepState,
  ClientData) -> StepState; `epoch_plan`, `epoch_calls` and `chunk_sizes` are the schedule, in host ints.
  """

  apply_fn: Callable[[Params, jax.Array], jax.Array]
  batch_size: int
  epochs: int
  regularizer: Regularizer | None = None
  loop: str = "unrolled"  # 'unrolled' | 'rolled' (see module docstring)
  # Steps per compiled call of the unrolled loops: 1, one call per SGD step, is what runs use (more compiles
  # longer and runs no faster: docs/performance.md); larger only for benchmarks/unroll.py.
  max_unroll: int = 1
  loss: LocalLoss | None = None  # replaces the masked mean cross-entropy when given

  # --- entry points ---------------------------------------------------------------------------------

  def train_job(self, params: Params, data: ClientData, *, lr: float | jax.Array, clients_key: jax.Array,
                job_id: int, aux: Any = (), owned: bool = False) -> Params:
    """Job `job_id`'s client update: E epochs of SGD from `params` on the client's samples
    `data.index_row[:data.num_samples]`, shuffled under the key fold_in(clients_key, job_id) (`epoch_orders`).

    `data.num_samples` is a host integer (the host knows each client's size) and `data.orders` None (they are
    drawn here); the arrays may be on device, `clients_key` on theirs. `aux` is handed to `loss` at every step.
    `owned`: `params` is the caller's to give up (a buffer nobody else holds, e.g. just copied to the client's
    device), so the first step may consume it rather than a copy (module docstring). Rolled, the shuffle and
    every epoch are one compiled call (where a dense model's steps are short, each call's dispatch is a large
    part of a job's host time); unrolled, the shuffle is one call and then each chunk of steps one more.
    """
    # NumPy scalars, not jnp.asarray: jit's C++ dispatch takes them directly, where an eager conversion costs
    # host time per call (benchmarks/host_overhead.py).
    n, job = np.int32(data.num_samples), np.uint32(job_id)
    lr = np.float32(lr) if not isinstance(lr, jax.Array) else lr
    if self.loop == "rolled":  # (one call: nothing in flight between steps to save)
      full, rest = self.epoch_plan(n)
      return _run_job(params, params if self.uses_anchor else (), lr, data.replace(num_samples=n), clients_key, job,
                      np.int32(full), aux, trainer=self, rest=rest)
    orders = _job_orders(clients_key, job, n, max_samples=data.index_row.shape[0], epochs=self.epochs)
    params, anchor = self._working_copy(params, owned)
    data = data.replace(orders=orders, num_samples=n)
    calls = self.epoch_calls(n)
    for epoch in range(self.epochs):
      for start, count, rows in calls:  # Python ints: traced (start, epoch) or static (count, rows)
        params = _run_batches(params, anchor, lr, data, epoch, start, aux, trainer=self, count=count, rows=rows)
    return params

  def train_batch(self, params: Params, data: ClientData, *, lr: jax.Array, keys: jax.Array, total_steps: int,
                  aux: Any = (), mesh: jax.sharding.Mesh | None = None, owned: bool = False) -> Params:
    """J client updates at once: every argument and field of `data` but `x_all`/`y_all` has a leading client
    axis of size J (`data.orders` None: drawn here), and client j's samples are shuffled under `keys[j]` itself.

    Each client runs `total_steps` steps (a host int, at least every client's own step count); steps
    past a client's own count are masked no-ops, so client j's result equals one client's training on its
    slice up to float reassociation. With `mesh` (one axis, 'clients'), the client axis is split over the
    mesh's devices with `shard_map` (J must be a multiple of the device count); without it the J
    clients are vmapped on the default device. `owned` as in `train_job`.
    """
    data = data.replace(orders=_epoch_orders_batch(keys, data.num_samples, data.index_row.shape[1], self.epochs))
    params, anchor = self._working_copy(params, owned)
    if self.loop == "rolled":
      return _run_batch(params, anchor, lr, data, jnp.int32(0), jnp.int32(total_steps), aux, trainer=self,
                        mesh=mesh, count=None)
    t0 = 0
    for count in self.chunk_sizes(total_steps):
      params = _run_batch(params, anchor, lr, data, jnp.int32(t0), None, aux, trainer=self, mesh=mesh, count=count)
      t0 += count
    return params

  # --- one step --------------------------------------------------------------------------------------

  def sgd_step(self, state: StepState, data: ClientData, t: jax.Array, aux: Any = ()) -> StepState:
    """Step t of the client's schedule (a no-op once t >= its own step count), on a batch of B rows."""
    b, n = self.batch_size, data.num_samples
    steps_per_epoch = jnp.maximum((n + b - 1) // b, 1)  # (>= 1: a 0-sample padding job is inert)
    epoch = jnp.minimum(t // steps_per_epoch, self.epochs - 1)
    slot = (t % steps_per_epoch) * b + jnp.arange(b)
    active = (t < self.epochs * steps_per_epoch) & (n > 0)
    return self.batch_step(state, data, data.orders[epoch], slot, active, aux)

  def batch_step(self, state: StepState, data: ClientData, order: jax.Array, slot: jax.Array,
                 active: bool | jax.Array = True, aux: Any = ()) -> StepState:
    """One SGD step on the samples at positions `slot` of a shuffled epoch `order` (positions >= n are
    masked out of the mean loss); `active` False leaves the parameters untouched."""
    mask = (slot < data.num_samples).astype(jnp.float32)
    sample = jnp.take(data.index_row, jnp.take(order, jnp.minimum(slot, order.shape[0] - 1)))
    x, y = jnp.take(data.x_all, sample, axis=0), jnp.take(data.y_all, sample, axis=0)

    def loss_fn(p):
      if self.loss is None:
        loss = _masked_mean_loss(self.apply_fn, p, x, y, mask)
      else:
        loss = self.loss(self.apply_fn, p, state.anchor, x, y, mask, aux)
      if self.regularizer is not None:
        loss = loss + self.regularizer(p, state.anchor)
      return loss

    grads = jax.grad(loss_fn)(state.params)
    # `where`, not lr = 0: a masked step must leave the parameters untouched even if its gradient is inf.
    lr = state.lr
    return state.replace(params=jax.tree.map(lambda p, g: jnp.where(active, p - lr.astype(p.dtype) * g, p),
                                             state.params, grads))

  # --- the schedule (host ints) ------------------------------------------------------------------------

  def epoch_plan(self, num_samples: int) -> tuple[int, int]:
    """(full, rest): an epoch of `num_samples` samples is `full` batches of B rows, then (when rest > 0)
    the partial batch at `rest` rows, the next power of two >= n mod B (at least 8, at most B), masked
    past n (padded to B, the default job's partial batches were a large share of all step work)."""
    full, remainder = divmod(int(num_samples), self.batch_size)
    rest = min(self.batch_size, max(8, 1 << (remainder - 1).bit_length())) if remainder else 0
    return full, rest

  def epoch_calls(self, num_samples: int) -> list[tuple[int, int, int]]:
    """The compiled calls of one epoch of the unrolled schedule as (start, count, rows): the full
    batches in chunks (`chunk_sizes`), then the partial batch."""
    full, rest = self.epoch_plan(num_samples)
    calls, start = [], 0
    for count in self.chunk_sizes(full):
      calls.append((start, count, self.batch_size))
      start += count * self.batch_size
    return calls + ([(start, 1, rest)] if rest else [])

  def chunk_sizes(self, total_steps: int) -> list[int]:
    """The unrolled chunks covering `total_steps`: full `max_unroll` chunks, then powers of two."""
    chunks = [self.max_unroll] * (total_steps // self.max_unroll)
    rest = total_steps % self.max_unroll
    power = 1 << max(rest.bit_length() - 1, 0)
    while rest:
      if rest >= power:
        chunks.append(power)
        rest -= power
      power >>= 1
    return chunks

  def update_programs(self, state: StepState, data: ClientData,
                      aux: Any = ()) -> list[tuple[int, Callable[..., Params], tuple]]:
    """One client update (`data.num_samples` a host int) as loop-free programs: (times run, fn, args), where
    `jax.jit(fn)(*args)` is one program that returns the trained parameters. For cost analysis (profiling.py):
    XLA counts a loop body once, so an update's cost is the sum over these of times x the program's. Rolled,
    its steps are costed as the batched path's t-indexed steps, in `chunk_sizes`."""
    n = int(data.num_samples)
    data = data.replace(num_samples=jnp.int32(n))
    if self.loop == "rolled":
      chunks = self.chunk_sizes(num_local_steps(n, self.batch_size, self.epochs))

      def steps(state, data, t0, count):
        return self._steps(state, data, t0, count=count, aux=aux).params

      return [(chunks.count(c), functools.partial(steps, count=c), (state, data, jnp.int32(0)))
              for c in sorted(set(chunks), reverse=True)]

    def batches(state, data, epoch, start, count, rows):
      return self._batches(state, data, epoch, start, count=count, rows=rows, aux=aux).params

    shapes = [(count, rows) for _, count, rows in self.epoch_calls(n)]
    return [(self.epochs * shapes.count(shape), functools.partial(batches, count=shape[0], rows=shape[1]),
             (state, data, jnp.int32(0), jnp.int32(0))) for shape in dict.fromkeys(shapes)]

  @property
  def uses_anchor(self) -> bool:
    """Whether a step reads the dispatched parameters (FedProx's term, FedPAC's loss)."""
    return self.regularizer is not None or self.loss is not None

  # --- the loops (traced; the jitted wrappers below call them) ----------------------------------------

  def _batches(self, state: StepState, data: ClientData, epoch: jax.Array, start: jax.Array, *, count: int,
               rows: int, aux: Any = ()) -> StepState:
    """`count` consecutive batches of `rows` positions each of epoch `epoch`'s shuffled order, from
    position `start` (positions >= n are masked out), unrolled. `count` and `rows` are static; `epoch`
    and `start` are traced, so every call of the same shape shares one compiled program."""
    order = data.orders[epoch]
    for s in range(count):
      state = self.batch_step(state, data, order, start + s * rows + jnp.arange(rows), aux=aux)
    return state

  def _steps(self, state: StepState, data: ClientData, t0: jax.Array, *, count: int | jax.Array,
             aux: Any = ()) -> StepState:
    """`count` consecutive steps from t0, unrolled (count static) or rolled (count traced)."""
    if self.loop == "rolled":
      params = jax.lax.fori_loop(
          0, count, lambda i, p: self.sgd_step(state.replace(params=p), data, t0 + i, aux).params, state.params)
      return state.replace(params=params)
    for i in range(count):
      state = self.sgd_step(state, data, t0 + i, aux)
    return state

  def _epochs(self, state: StepState, data: ClientData, full: jax.Array, *, rest: int, aux: Any = ()) -> StepState:
    """Every epoch of one client, rolled: per epoch a `fori_loop` over its `full` batches of B rows (traced,
    so one program serves every client size), then the partial batch at `rest` rows (static; 0: none),
    masked past n: the unrolled schedule's batches (`epoch_plan`) inside one compiled program."""
    b = self.batch_size

    def step(params, order, slot):
      return self.batch_step(state.replace(params=params), data, order, slot, aux=aux).params

    def epoch(e, params):
      order = data.orders[e]
      params = jax.lax.fori_loop(0, full, lambda s, p: step(p, order, s * b + jnp.arange(b)), params)
      return step(params, order, full * b + jnp.arange(rest)) if rest else params

    return state.replace(params=jax.lax.fori_loop(0, self.epochs, epoch, state.params))

  def _working_copy(self, params: Params, owned: bool) -> tuple[Params, Params]:
    """(the parameters the donating chain may consume, the anchor): the caller's own `params` when it hands
    them over and no step reads the anchor, else a private copy (module docstring)."""
    anchor = params if self.uses_anchor else ()
    return (params if owned and not self.uses_anchor else _copy(params)), anchor


@functools.partial(jax.jit, static_argnames=("max_samples", "epochs"))
def _job_orders(clients_key, job_id, num_samples, *, max_samples, epochs):
  """The epoch orders of job `job_id` (`epoch_orders` under the key fold_in(clients_key, job_id)) in one
  compiled call: the executor's per-job key and shuffle cost the host one dispatch, not two."""
  return epoch_orders(jax.random.fold_in(clients_key, job_id), num_samples, max_samples, epochs)


_epoch_orders_batch = jax.jit(jax.vmap(epoch_orders, in_axes=(0, 0, None, None)), static_argnums=(2, 3))


# A private copy of a parameter tree (one compiled call; under jit, `copy` is a real copy, never the input).
_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


# The jitted wrappers take the parameters apart from the rest of the StepState (anchor, lr): the calls of a
# job's chain donate their input `params` (module docstring: why), and never the anchor or the lr.
@functools.partial(jax.jit, static_argnames=("trainer", "mesh", "count"), donate_argnames=("params",))
def _run_batch(params, anchor, lr, data, t0, total, aux=(), *, trainer, mesh, count):
  """`count` unrolled steps (or `total` rolled steps) of J clients, vmapped, optionally sharded over `mesh`."""

  def clients(params, anchor, lr, data, t0, total, aux):
    def one(params, anchor, lr, data, aux):
      steps = total if count is None else count
      return trainer._steps(StepState(params, anchor, lr), data, t0, count=steps, aux=aux).params

    # The data are shared by every client; the rest has a leading client axis.
    per_client = ClientData(x_all=None, y_all=None, index_row=0, orders=0, num_samples=0)
    return jax.vmap(one, in_axes=(0, 0, 0, per_client, 0))(params, anchor, lr, data, aux)

  args = (params, anchor, lr, data, t0, total, aux)
  if mesh is None:
    return clients(*args)
  split, whole = jax.sharding.PartitionSpec("clients"), jax.sharding.PartitionSpec()
  # The data and the step counters are replicated on every device; every per-client argument is split.
  specs = (split, split, split, ClientData(whole, whole, split, split, split), whole, whole, split)
  return jax.shard_map(clients, mesh=mesh, in_specs=specs, out_specs=split, check_vma=False)(*args)


@functools.partial(jax.jit, static_argnames=("trainer", "count", "rows"), donate_argnames=("params",))
def _run_batches(params, anchor, lr, data, epoch, start, aux=(), *, trainer, count, rows):
  return trainer._batches(StepState(params, anchor, lr), data, epoch, start, count=count, rows=rows, aux=aux).params


@functools.partial(jax.jit, static_argnames=("trainer", "rest"))
def _run_job(params, anchor, lr, data, clients_key, job_id, full, aux=(), *, trainer, rest):
  """Job `job_id`'s every epoch, rolled, under its shuffle (`_job_orders`), drawn inside the same program."""
  orders = epoch_orders(jax.random.fold_in(clients_key, job_id), data.num_samples, data.index_row.shape[0],
                        trainer.epochs)
  return _run_epochs(params, anchor, lr, data.replace(orders=orders), full, aux, trainer=trainer, rest=rest)


@functools.partial(jax.jit, static_argnames=("trainer", "rest"))
def _run_epochs(params, anchor, lr, data, full, aux=(), *, trainer, rest):
  return trainer._epochs(StepState(params, anchor, lr), data, full, rest=rest, aux=aux).params


def resolve_loop(loop: str, platform: str | None = None, convolutional: bool = True) -> str:
  """What 'auto' stands for (docs/performance.md has the measurements): 'rolled' off the CPU; on a CPU
  'unrolled' for a model with convolutions (XLA:CPU runs a convolution inside a loop body far slower) and
  'rolled' for one without (a dense model's steps are short: one call per job instead of one per step saves
  the host's dispatches, with the same bits)."""
  if loop != "auto":
    return loop
  platform = platform or jax.default_backend()
  return "unrolled" if platform == "cpu" and convolutional else "rolled"


@dataclasses.dataclass(frozen=True)
class ProximalTerm:
  """FedProx's μ/2 ||w − w_dispatch||², the local regulariser FedAsync's clients use.

  A value, not a closure: two runs with the same μ build equal `LocalTrainer`s, so a process compiles their
  local training once (jit's static arguments are compared by value)."""

  mu: float

  def __call__(self, params: Params, anchor: Params) -> jax.Array:
    return 0.5 * self.mu * squared_distance(params, anchor)
