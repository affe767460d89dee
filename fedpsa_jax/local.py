"""Local training: plain SGD on one client's data as a pure function of (params, data, lr, key).

Schedule (FLGo/PyTorch DataLoader semantics): E epochs, each a fresh shuffle of the client's n samples
cut into ceil(n / B) batches; the last batch of an epoch is partial and is kept, its loss being the
mean over its real samples (padding positions are masked out, not dropped). The learning rate is a
traced argument, so decaying it never recompiles.

How the steps are looped is a per-backend choice; the measurements behind it: docs/performance.md.

- `unrolled` (`train`, one client): a host loop over compiled calls of at most `max_unroll` steps
  (default 1: one call per SGD step). An epoch is `n // B` full batches, in chunks of `max_unroll` and
  then powers of two, and then the partial batch at its own size, the next power of two >= n mod B (at
  least 8), masked past n. Compiled programs: one per (steps per call, rows per batch), so with
  max_unroll = 1 at most one per batch size (B, 8, 16, 32, ...) whatever the clients' sizes.
- `rolled` (`train_job`, one client): the whole job in one compiled call: its shuffle, then per epoch a
  `fori_loop` over the full batches (a traced count) and the partial batch at its own size, so one program
  per partial-batch size whatever the clients' sizes. The natural choice on GPU, and on a CPU for models
  without convolutions, whose steps are short enough that a call per step costs more than the step.
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

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def _masked_mean_loss(apply_fn, params, x, y, mask):
  losses = optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, x), y)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@dataclasses.dataclass(frozen=True)
class LocalTrainer:
  """Runs one client's local SGD. Hashable (jit-static) except for arrays passed at call time."""

  apply_fn: Callable[[Params, jax.Array], jax.Array]
  batch_size: int
  epochs: int
  regularizer: Regularizer | None = None
  loop: str = "unrolled"  # 'unrolled' | 'rolled' (see module docstring)
  max_unroll: int = 16
  loss: LocalLoss | None = None  # replaces the masked mean cross-entropy when given

  def sgd_step(self, params, anchor, x_all, y_all, index_row, orders, num_samples, lr, t, aux=()):
    """Step t of the client's schedule (a no-op once t >= its own step count), on a batch of B rows."""
    b = self.batch_size
    steps_per_epoch = jnp.maximum((num_samples + b - 1) // b, 1)  # (>= 1: a 0-sample padding job is inert)
    epoch = jnp.minimum(t // steps_per_epoch, self.epochs - 1)
    slot = (t % steps_per_epoch) * b + jnp.arange(b)
    active = (t < self.epochs * steps_per_epoch) & (num_samples > 0)
    return self.batch_step(params, anchor, x_all, y_all, index_row, orders[epoch], slot, num_samples, lr, active,
                           aux)

  def batch_step(self, params, anchor, x_all, y_all, index_row, order, slot, num_samples, lr, active=True, aux=()):
    """One SGD step on the samples at positions `slot` of a shuffled epoch `order` (positions >= n are
    masked out of the mean loss); `active` False leaves the parameters untouched."""
    mask = (slot < num_samples).astype(jnp.float32)
    sample = jnp.take(index_row, jnp.take(order, jnp.minimum(slot, order.shape[0] - 1)))
    x, y = jnp.take(x_all, sample, axis=0), jnp.take(y_all, sample, axis=0)

    def loss_fn(p):
      if self.loss is None:
        loss = _masked_mean_loss(self.apply_fn, p, x, y, mask)
      else:
        loss = self.loss(self.apply_fn, p, anchor, x, y, mask, aux)
      if self.regularizer is not None:
        loss = loss + self.regularizer(p, anchor)
      return loss

    grads = jax.grad(loss_fn)(params)
    # `where`, not lr = 0: a masked step must leave the parameters untouched even if its gradient is inf.
    return jax.tree.map(lambda p, g: jnp.where(active, p - lr.astype(p.dtype) * g, p), params, grads)

  def run_batches(self, params, anchor, x_all, y_all, index_row, orders, num_samples, lr, epoch, start, count, rows,
                  aux=()):
    """`count` consecutive batches of `rows` positions each of epoch `epoch`'s shuffled order, from
    position `start` (positions >= n are masked out), unrolled. `count` and `rows` are static; `epoch`
    and `start` are traced, so every call of the same shape shares one compiled program."""
    order = orders[epoch]
    for s in range(count):
      params = self.batch_step(params, anchor, x_all, y_all, index_row, order, start + s * rows + jnp.arange(rows),
                               num_samples, lr, aux=aux)
    return params

  def epoch_plan(self, num_samples: int) -> tuple[int, int]:
    """(full, rest): an epoch of `num_samples` samples is `full` batches of B rows, then (when rest > 0)
    the partial batch at `rest` rows, the next power of two >= n mod B (at least 8, at most B), masked
    past n: on the default job (n ~ 80, B = 64) a partial batch padded to B was ~30% of all step work."""
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

  def run_steps(self, params, anchor, x_all, y_all, index_row, orders, num_samples, lr, t0, count, aux=()):
    """`count` consecutive steps from t0, unrolled (count static) or rolled (count traced)."""
    step = functools.partial(self.sgd_step, anchor=anchor, x_all=x_all, y_all=y_all, index_row=index_row,
                             orders=orders, num_samples=num_samples, lr=lr, aux=aux)
    if self.loop == "rolled":
      return jax.lax.fori_loop(0, count, lambda i, p: step(p, t=t0 + i), params)
    for i in range(count):
      params = step(params, t=t0 + i)
    return params

  def run_epochs(self, params, anchor, x_all, y_all, index_row, orders, num_samples, lr, full, rest, aux=()):
    """Every epoch of one client, rolled: per epoch a `fori_loop` over its `full` batches of B rows (traced,
    so one program serves every client size), then the partial batch at `rest` rows (static; 0: none),
    masked past n: the unrolled schedule's batches (`epoch_plan`) inside one compiled program."""
    b = self.batch_size
    step = functools.partial(self.batch_step, anchor=anchor, x_all=x_all, y_all=y_all, index_row=index_row,
                             num_samples=num_samples, lr=lr, aux=aux)

    def epoch(e, params):
      order = orders[e]
      params = jax.lax.fori_loop(0, full, lambda s, p: step(p, order=order, slot=s * b + jnp.arange(b)), params)
      return step(params, order=order, slot=full * b + jnp.arange(rest)) if rest else params

    return jax.lax.fori_loop(0, self.epochs, epoch, params)

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

  def train(self, params: Params, x_all: jax.Array, y_all: jax.Array, index_row: jax.Array,
            num_samples: int, lr: float | jax.Array, key: jax.Array, aux: Any = ()) -> Params:
    """One client update from `params`: E epochs of SGD on the samples `index_row[:num_samples]`.

    `num_samples` is a host integer (the host knows each client's size); everything else may be on
    device. `aux` is handed to `loss` at every step. Returns the trained parameters.
    """
    orders = _epoch_orders_jit(key, np.int32(num_samples), index_row.shape[0], self.epochs)
    return self.train_in_order(params, x_all, y_all, index_row, num_samples, lr, orders, aux)

  def job_orders(self, clients_key: jax.Array, job_id: int, num_samples: int, max_samples: int) -> jax.Array:
    """The epoch orders of job `job_id` (`epoch_orders` under the key fold_in(clients_key, job_id)) in one
    compiled call: the executor's per-job key and shuffle cost the host one dispatch, not two."""
    return _job_orders(clients_key, np.uint32(job_id), np.int32(num_samples), max_samples, self.epochs)

  def train_job(self, params: Params, x_all: jax.Array, y_all: jax.Array, index_row: jax.Array, num_samples: int,
                lr: float | jax.Array, clients_key: jax.Array, job_id: int, aux: Any = (),
                owned: bool = False) -> Params:
    """Job `job_id`'s client update: `train_in_order` under its `job_orders`. Rolled, the shuffle and every
    epoch are one compiled call (where a dense model's steps are short, each call's dispatch is a large
    part of a job's host time); `clients_key` must be on the device of the other arguments."""
    if self.loop != "rolled":
      orders = self.job_orders(clients_key, job_id, num_samples, index_row.shape[0])
      return self.train_in_order(params, x_all, y_all, index_row, num_samples, lr, orders, aux, owned)
    anchor, n, lr, full, rest = self._rolled_args(params, num_samples, lr)
    return _run_job(self, params, anchor, x_all, y_all, index_row, clients_key, np.uint32(job_id), n, lr, full,
                    rest, aux)

  def _rolled_args(self, params: Params, num_samples: int, lr: float | jax.Array) -> tuple:
    """(anchor, n, lr, full batches, partial rows) of a rolled call. NumPy scalars, not jnp.asarray: jit's C++
    dispatch takes them directly, where an eager conversion costs ~0.1 ms of host time each
    (benchmarks/host_overhead.py)."""
    full, rest = self.epoch_plan(num_samples)
    lr = np.float32(lr) if not isinstance(lr, jax.Array) else lr
    return params if self.uses_anchor else (), np.int32(num_samples), lr, np.int32(full), rest

  @property
  def uses_anchor(self) -> bool:
    """Whether a step reads the dispatched parameters (FedProx's term, FedPAC's loss)."""
    return self.regularizer is not None or self.loss is not None

  def _working_copy(self, params: Params, owned: bool) -> tuple[Params, Params]:
    """(the parameters the donating chain may consume, the anchor): the caller's own `params` when it hands
    them over and no step reads the anchor, else a private copy (module docstring)."""
    anchor = params if self.uses_anchor else ()
    return (params if owned and not self.uses_anchor else _copy(params)), anchor

  def train_in_order(self, params: Params, x_all: jax.Array, y_all: jax.Array, index_row: jax.Array,
                     num_samples: int, lr: float | jax.Array, orders: jax.Array, aux: Any = (),
                     owned: bool = False) -> Params:
    """`train` given the job's epoch orders (`epoch_orders`, e.g. from `job_orders`) instead of its key.
    `owned`: `params` is the caller's to give up (a buffer nobody else holds, e.g. just copied to the
    client's device), so the first step may consume it rather than a copy."""
    if self.loop == "rolled":  # (one call: nothing in flight between steps to save)
      anchor, n, lr, full, rest = self._rolled_args(params, num_samples, lr)
      return _run_epochs(self, params, anchor, x_all, y_all, index_row, orders, n, lr, full, rest, aux)
    n = np.int32(num_samples)  # (NumPy scalars for jit's C++ dispatch: `_rolled_args`)
    lr = np.float32(lr) if not isinstance(lr, jax.Array) else lr
    params, anchor = self._working_copy(params, owned)
    calls = self.epoch_calls(num_samples)
    for epoch in range(self.epochs):
      for start, count, rows in calls:  # Python ints: traced (start, epoch) or static (count, rows)
        params = _run_batches(self, params, anchor, x_all, y_all, index_row, orders, n, lr, epoch, start, count,
                              rows, aux)
    return params

  def train_batch(self, params: Params, x_all: jax.Array, y_all: jax.Array, index_rows: jax.Array,
                  num_samples: jax.Array, lr: jax.Array, keys: jax.Array, total_steps: int, aux: Any = (),
                  mesh: jax.sharding.Mesh | None = None, owned: bool = False) -> Params:
    """J client updates at once: every argument but x_all/y_all has a leading client axis of size J.

    Each client runs `total_steps` steps (a host int, at least every client's own step count); steps
    past a client's own count are masked no-ops, so client j's result equals `train` on its slice up
    to float reassociation. With `mesh` (one axis, 'clients'), the client axis is split over the
    mesh's devices with `shard_map` (J must be a multiple of the device count); without it the J
    clients are vmapped on the default device. `owned` as in `train_in_order`.
    """
    orders = _epoch_orders_batch(keys, num_samples, index_rows.shape[1], self.epochs)
    params, anchor = self._working_copy(params, owned)
    if self.loop == "rolled":
      return _run_batch(self, mesh, params, anchor, x_all, y_all, index_rows, orders, num_samples, lr,
                        jnp.int32(0), jnp.int32(total_steps), None, aux)
    t0 = 0
    for count in self.chunk_sizes(total_steps):
      params = _run_batch(self, mesh, params, anchor, x_all, y_all, index_rows, orders, num_samples, lr,
                          jnp.int32(t0), None, count, aux)
      t0 += count
    return params


_epoch_orders_jit = jax.jit(epoch_orders, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=(3, 4))
def _job_orders(clients_key, job_id, num_samples, max_samples, epochs):
  return epoch_orders(jax.random.fold_in(clients_key, job_id), num_samples, max_samples, epochs)


_epoch_orders_batch = jax.jit(jax.vmap(epoch_orders, in_axes=(0, 0, None, None)), static_argnums=(2, 3))


# A private copy of a parameter tree (one compiled call; under jit, `copy` is a real copy, never the input).
_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


# The calls of a job's chain donate their input `params` (module docstring: why).
@functools.partial(jax.jit, static_argnums=(0, 1, 12), donate_argnames=("params",))
def _run_batch(trainer, mesh, params, anchor, x_all, y_all, index_rows, orders, n, lr, t0, total, count, aux=()):
  """`count` unrolled steps (or `total` rolled steps) of J clients, vmapped, optionally sharded over `mesh`."""

  def clients(params, anchor, x_all, y_all, index_rows, orders, n, lr, t0, total, aux):
    def one(params, anchor, index_row, orders, n, lr, aux):
      steps = total if count is None else count
      return trainer.run_steps(params, anchor, x_all, y_all, index_row, orders, n, lr, t0, steps, aux)

    return jax.vmap(one)(params, anchor, index_rows, orders, n, lr, aux)

  args = (params, anchor, x_all, y_all, index_rows, orders, n, lr, t0, total, aux)
  if mesh is None:
    return clients(*args)
  split, whole = jax.sharding.PartitionSpec("clients"), jax.sharding.PartitionSpec()
  # The data and the step counters are replicated on every device; every per-client argument is split.
  specs = (split, split, whole, whole, split, split, split, split, whole, whole, split)
  return jax.shard_map(clients, mesh=mesh, in_specs=specs, out_specs=split, check_vma=False)(*args)


@functools.partial(jax.jit, static_argnums=(0, 11, 12), donate_argnames=("params",))
def _run_batches(trainer, params, anchor, x_all, y_all, index_row, orders, n, lr, epoch, start, count, rows, aux=()):
  return trainer.run_batches(params, anchor, x_all, y_all, index_row, orders, n, lr, epoch, start, count, rows, aux)


@functools.partial(jax.jit, static_argnums=(0, 10))
def _run_epochs(trainer, params, anchor, x_all, y_all, index_row, orders, n, lr, full, rest, aux=()):
  return trainer.run_epochs(params, anchor, x_all, y_all, index_row, orders, n, lr, full, rest, aux)


@functools.partial(jax.jit, static_argnums=(0, 11))
def _run_job(trainer, params, anchor, x_all, y_all, index_row, clients_key, job_id, n, lr, full, rest, aux=()):
  """`_run_epochs` under job `job_id`'s shuffle (`job_orders`), drawn inside the same program."""
  orders = epoch_orders(jax.random.fold_in(clients_key, job_id), n, index_row.shape[0], trainer.epochs)
  return _run_epochs(trainer, params, anchor, x_all, y_all, index_row, orders, n, lr, full, rest, aux)


def resolve_loop(loop: str, platform: str | None = None, convolutional: bool = True) -> str:
  """What 'auto' stands for (docs/performance.md has the measurements): 'rolled' off the CPU; on a CPU
  'unrolled' for a model with convolutions (XLA:CPU runs a convolution inside a loop body ~28x slower) and
  'rolled' for one without (a dense model's steps are short, and one call per job instead of one per step
  made FedBuff on the linear model ~30% faster, with the same bits)."""
  if loop != "auto":
    return loop
  platform = platform or jax.default_backend()
  return "unrolled" if platform == "cpu" and convolutional else "rolled"


def proximal_term(mu: float) -> Regularizer:
  """FedProx's μ/2 ||w − w_dispatch||², the local regulariser FedAsync's clients use."""

  def term(params: Params, anchor: Params) -> jax.Array:
    sq = sum(jnp.sum((p - a) ** 2) for p, a in zip(jax.tree.leaves(params), jax.tree.leaves(anchor)))
    return 0.5 * mu * sq

  return term
