"""The one small interface every federated algorithm implements (DESIGN §4b).

A strategy owns the server state and the client-side extras of its method. It never sees the clock,
the event heap or the dataset; the runner never looks inside its state. The runner talks to it through:

- `init(params)`: the server state (a pytree) from the initial global parameters;
- `params_for(state, client)`: what a dispatched client starts from (default: the global model);
- `client_aux(state, client)`: extras sent with those parameters at dispatch, a pytree of arrays
  (default `()`; FedPAC: the global class prototypes). The runner keeps it with the job and hands it
  to the local loss and to `client_payload`, so a job's result still depends only on what it was
  dispatched with;
- `regularizer`: an optional extra term of the local loss, `(params, params_start) -> scalar`
  (FedProx/FedAsync's proximal term);
- `local_loss`: an optional replacement of the data term of the local loss,
  `(apply_fn, params, params_start, x, y, mask, aux) -> scalar` on one batch (`mask` marks the real
  samples of a padded batch; `aux` is the job's `client_aux`); `regularizer` is still added to it.
  Both must be the same object for the strategy's whole life (build them once in `__init__`): the
  local trainer is a static jit argument, so a new function object would recompile every chunk;
- `client_payload(params_start, params_end, job)`: the client-side payload sent beside Δ (FedPSA's
  sketch; FedPAC's feature statistics and prototypes, which need the client's data and the job's aux,
  both in `ClientJob`; `job` may be None for payloads that need neither);
- `receive(state, arrivals) -> (state, changed)`: all arrivals of one event time; `changed` says that
  a round happened, the only thing the host loop must know;
- `dispatched(state, client) -> state`: told that `client` was just dispatched (with `params_for`);
  default: the state unchanged (CASA records the client's start round for its buffer pruning);
- `eval_params(state)`: what the test set is evaluated on;
- `personal_models(state) -> (models, assignment)`: for personalised evaluation on each client's local
  test split (`data.client_test_fraction` > 0): a list of parameter trees and, per client, the index
  of the model it is evaluated with. Default: `([eval_params(state)], zeros(N))`; CASA: its cluster
  models and the client-to-cluster assignment;
- `eval_records(state)`: JSON-able extras (lists allowed) added to each metrics.jsonl record at an
  evaluation only (CASA: the cluster assignments); default `{}`;
- `diagnostics(state)` / `event_records(state, arrivals)`: scalars for metrics.jsonl and events.jsonl,
  pulled to the host only when they are written;
- `payload_bytes(payload)`, `upload_bytes(arrival)`, `download_bytes(params, aux)`: communication
  accounting. By default an upload is Δ plus the payload and a download is the dispatched parameters
  plus the aux; a method that sends less (AiFed's partial uploads) overrides them;
- `save_state(state)` / `restore_state(fresh, saved)`: what a checkpoint stores of the state and how
  it is put back. The default stores the state as it is: `fedpsa_jax.checkpoint` handles any tree of
  dicts, tuples, lists, dataclasses (host fields included), scalars and arrays, so a strategy
  overrides these only if its state holds something else (or something rebuilt at `init`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax.local import LocalLoss  # (apply_fn, params, params_start, x, y, mask, aux) -> scalar

Params = Any
State = Any

_REGISTRY: dict[str, type["Strategy"]] = {}


@dataclasses.dataclass(frozen=True)
class StrategyContext:
  """What a strategy may know of the run: the model, the federation's shape and its own randomness."""

  apply_fn: Callable[[Params, jax.Array], jax.Array]
  num_clients: int
  client_sizes: np.ndarray  # [N] local training-set sizes (host)
  concurrency: int  # C: clients in flight at once (the cohort size of synchronous methods)
  num_classes: int
  seed: int
  calibration_batch: Callable[[], tuple[jax.Array, jax.Array]]  # the shared batch D_b, built on demand
  # A fixed held-out batch of the test set, built on demand, for diagnostics that need the test loss's
  # gradient (FedPSA's κ-alignment, paper Eqs. 21-22). The strategy still never sees the dataset.
  alignment_batch: Callable[[], tuple[jax.Array, jax.Array]] | None = None


@dataclasses.dataclass(frozen=True)
class ClientJob:
  """What a client holds while it works: its id, its data and the extras the server sent with the job.

  The data is the run's whole training set on device plus this client's padded index row: the client's
  samples are `x_all[index_row[:num_samples]]` (positions from `num_samples` on are padding).
  """

  client: int
  x_all: jax.Array
  y_all: jax.Array
  index_row: jax.Array
  num_samples: int
  aux: Any = ()  # `client_aux(state, client)` at dispatch


@dataclasses.dataclass(frozen=True)
class Arrival:
  """One client's finished update, as delivered to the server."""

  client: int
  num_samples: int
  staleness: int  # rounds between dispatch and arrival (τ)
  dispatch_round: int
  params_start: Params  # the parameters the client was dispatched with
  delta: Params  # Δ = w_i(after local training) − params_start
  payload: Any  # whatever `client_payload` returned
  arrival_time: int = 0  # virtual time of arrival (for methods with timers or time decay, e.g. AiFed, CASA)


class Strategy:
  """Base class: the defaults of every hook. Subclasses set `name` and register with `@register`."""

  name: ClassVar[str] = ""
  # 'async': refill free slots whenever clients return; 'sync': dispatch a cohort of C clients only
  # when none is in flight (FedAvg's rounds on the same clock).
  dispatch_mode: ClassVar[str] = "async"

  def __init__(self, config: ml_collections.ConfigDict, ctx: StrategyContext):
    self.config = config  # the whole run config; a strategy reads its own section `config[name]`
    self.hparams = config.get(self.name, ml_collections.ConfigDict())
    self.ctx = ctx

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    """This method's config section (`config.<name>`), every field commented."""
    return ml_collections.ConfigDict()

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    """Messages `'<name>.<field>=<value> is invalid; allowed: ...'` for bad values of this method's
    section, which may depend on the rest of the run config (e.g. a buffer larger than N)."""
    del config
    return []

  def init(self, params: Params) -> State:
    raise NotImplementedError

  def params_for(self, state: State, client: int) -> Params:
    del client
    return state.params

  def client_aux(self, state: State, client: int) -> Any:
    """Extras (a pytree of arrays) sent to a dispatched client beside `params_for`; `()` by default."""
    del state, client
    return ()

  @property
  def regularizer(self) -> Callable[[Params, Params], jax.Array] | None:
    return None

  @property
  def local_loss(self) -> LocalLoss | None:
    """The local loss of one batch, replacing the default masked-mean cross-entropy (None: default)."""
    return None

  def client_payload(self, params_start: Params, params_end: Params, job: ClientJob | None = None) -> Any:
    """The payload a client sends beside Δ (computed on the client, jitted by the strategy); `()`."""
    del params_start, params_end, job
    return ()

  def receive(self, state: State, arrivals: Sequence[Arrival]) -> tuple[State, bool]:
    raise NotImplementedError

  def dispatched(self, state: State, client: int) -> State:
    """The state after `client` is dispatched (called right after `params_for`/`client_aux`)."""
    del client
    return state

  def eval_params(self, state: State) -> Params:
    return state.params

  def personal_models(self, state: State) -> tuple[list[Params], np.ndarray]:
    """(models, assignment[N]): client i's personalised model is `models[assignment[i]]`."""
    return [self.eval_params(state)], np.zeros(self.ctx.num_clients, dtype=np.int64)

  def eval_records(self, state: State) -> dict[str, Any]:
    """JSON-able values written into each evaluation's metrics record (not into events.jsonl)."""
    del state
    return {}

  def diagnostics(self, state: State) -> dict[str, float]:
    del state
    return {}

  def event_records(self, state: State, arrivals: Sequence[Arrival]) -> list[dict[str, float]]:
    """Per-arrival diagnostics (e.g. κ, weight) after `receive`; only called when events are logged."""
    del state
    return [{} for _ in arrivals]

  def save_state(self, state: State) -> Any:
    """What a checkpoint stores of `state` (by default the state itself)."""
    return state

  def restore_state(self, fresh: State, saved: Any) -> State:
    """The state to continue with, from `fresh = init(params)` of the resumed run (after which any
    host-side caches built at `init`, such as FedPSA's sketch function, exist) and what `save_state`
    returned. By default `saved`."""
    del fresh
    return saved

  def payload_bytes(self, payload: Any) -> int:
    """Bytes of the extras a client sends beside Δ (sketch, statistics, masks, scalars)."""
    return tree_bytes(payload)

  def upload_bytes(self, arrival: Arrival) -> int:
    """Bytes one client update sends to the server: the full Δ plus the payload."""
    return tree_bytes(arrival.delta) + self.payload_bytes(arrival.payload)

  def download_bytes(self, params: Params, aux: Any) -> int:
    """Bytes the server sends a dispatched client: its starting parameters plus the aux."""
    return tree_bytes(params) + tree_bytes(aux)


def tree_bytes(tree: Any) -> int:
  """Size in bytes of a pytree of arrays, read from shapes and dtypes (no device work, no sync)."""
  return sum(x.size * x.dtype.itemsize if hasattr(x, "dtype") else np.asarray(x).nbytes
             for x in jax.tree.leaves(tree))


def register(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
  """Class decorator: makes a strategy selectable as `config.method = name`."""

  def wrap(cls: type[Strategy]) -> type[Strategy]:
    cls.name = name
    _REGISTRY[name] = cls
    return cls

  return wrap


def registered() -> dict[str, type[Strategy]]:
  return dict(_REGISTRY)


def get_strategy(name: str) -> type[Strategy]:
  if name not in _REGISTRY:
    raise ValueError(f"method={name!r} is not a known method; allowed: {sorted(_REGISTRY)}")
  return _REGISTRY[name]


def tree_add_scaled(params: Params, deltas: Sequence[Params], weights: jax.Array) -> Params:
  """w + Σ_i weights[i] Δ_i, leaf by leaf (the common form of every buffered update)."""
  return jax.tree.map(
      lambda w, *ds: w + sum(weights[i].astype(w.dtype) * d for i, d in enumerate(ds)), params, *deltas
  )


def squared_norm(tree: Params) -> jax.Array:
  return sum(jnp.vdot(x, x).real for x in jax.tree.leaves(tree))
