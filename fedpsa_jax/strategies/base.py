"""The one small interface every federated algorithm implements (docs/architecture.md, 'The strategy interface').

A strategy owns the server state and the client-side extras of its method. It never sees the clock,
the event heap or the dataset; the runner never looks inside its state. Everything it needs is built
once, in `__init__(hparams, ctx)`, from its config section (`self.hparams`) and the run's
`StrategyContext` (the model and its name, the parameter shapes, the federation's shape, its seed, the
`runtime` section), never from the whole run config; after that, its methods are functions of their
arguments:

- `init(params) -> state`: the server state (a pytree; `flax.struct.dataclass` with host fields marked
  `pytree_node=False`) from the initial global parameters. Pure: nothing is stored on `self`, so a
  checkpoint of the state is all a resumed run needs;
- `dispatch(state, client) -> (state, params, aux)`: what a dispatched client starts from (default: the
  global model), extras sent with it (a pytree of arrays, default `()`; FedPAC: the global class
  prototypes), and the state after the dispatch (default: unchanged; CASA records the start round);
- `client`: a `ClientSide` built once in `__init__`, what runs on the client beside SGD: a replacement
  of the per-batch loss, a regulariser added to it, and the payload sent beside Δ. (The local trainer
  is a static jit argument, so these functions must keep their identity for the strategy's life:
  building them once makes it so.);
- `receive(state, arrivals) -> (state, changed)`: all arrivals of one event time; `changed` says that
  a round happened, the only thing the host loop must know;
- `eval_models(state) -> EvalModels`: the global model the test set is evaluated on, and for
  personalised evaluation (`data.client_test_fraction` > 0) each client's model; extra JSON-able
  records for the evaluation's metrics line (CASA: the cluster assignment);
- `diagnostics(state)` / `event_records(state, arrivals)`: values for metrics.jsonl and round lines of
  events.jsonl / one dict per arrival for events.jsonl, pulled to the host only when written;
- `upload_bytes(arrival)`: communication accounting of one update: by default Δ plus the payload; a
  method that sends less (AiFed's partial uploads) overrides it.

`default_config()` and `validate_config(config)` (class methods) declare the method's config section.
Pytree arithmetic shared by the methods is in `fedpsa_jax.tree_util`; buffer validation in
`strategies.common`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, ClassVar, Sequence

import jax
import ml_collections
import numpy as np

from fedpsa_jax import checkpoint
from fedpsa_jax.local import ClientData, LocalLoss, Regularizer
from fedpsa_jax.tree_util import tree_bytes

Params = Any
State = Any

_REGISTRY: dict[str, type["Strategy"]] = {}


@dataclasses.dataclass(frozen=True)
class StrategyContext:
  """What a strategy may know of the run: the model, the federation's shape and its own randomness."""

  apply_fn: Callable[[Params, jax.Array], jax.Array]
  params_shape: Any  # the global parameters' tree of jax.ShapeDtypeStruct (known before `init`)
  num_clients: int
  client_sizes: np.ndarray  # [N] local training-set sizes (host)
  concurrency: int  # C: clients in flight at once (the cohort size of synchronous methods)
  num_classes: int
  input_shape: tuple[int, ...]  # one sample's shape (H, W, C)
  seed: int
  # `sample(split, size, purpose) -> (x, y)`: `size` samples of the 'train' or 'test' split, drawn without
  # replacement once with the host stream `purpose` and kept in the split's order (FedPSA's real calibration
  # batch and its held-out alignment batch); never a client's data.
  sample: Callable[[str, int, str], tuple[jax.Array, jax.Array]] | None = None
  split_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # {'train': n, 'test': n}
  model_name: str = ""  # the run's model.name (FedPAC needs one with a feature extractor)
  # The run's `runtime` section: how to compute, never what (FedPSA's Fisher path and chunk size). Required: its
  # defaults are config.schema's, and config.schema looks up the strategies (a default from there is an import
  # cycle); the run passes its own (sim/build.py).
  runtime: ml_collections.ConfigDict = dataclasses.field(kw_only=True)


@dataclasses.dataclass(frozen=True)
class ClientJob:
  """What a client holds while it works: its id, its data and the extras the server sent with the job.

  The data (`local.ClientData`, as local training reads it) is the run's whole training set on device plus
  this client's padded index row: the client's samples are `x_all[index_row[:num_samples]]` (positions from
  `num_samples` on are padding); its `orders` are None here (the epoch orders are drawn inside the job).
  """

  client: int
  data: ClientData
  aux: Any = ()  # the aux of `dispatch(state, client)`


@dataclasses.dataclass(frozen=True)
class ClientSide:
  """What a strategy runs on the client beside plain SGD; each field None for the default.

  - `loss`: the loss of one batch, `(apply_fn, params, params_start, x, y, mask, aux) -> scalar`, replacing
    the masked-mean cross-entropy (`mask` marks the real samples of a padded batch; `aux` is the job's);
  - `regularizer`: `(params, params_start) -> scalar`, added to the loss (FedProx/FedAsync's proximal term);
  - `payload`: `(params_start, params_end, job: ClientJob) -> pytree`, what the client sends beside Δ
    (FedPSA's sketch; FedPAC's statistics; AiFed's upload decision), computed on the server's device,
    where the data it may read lives.
  """

  loss: LocalLoss | None = None
  regularizer: Regularizer | None = None
  payload: Callable[[Params, Params, ClientJob], Any] | None = None


@dataclasses.dataclass(frozen=True)
class EvalModels:
  """What an evaluation measures: `params` on the test set and, for personalised evaluation, client i's
  model `personal[assignment[i]]` on its local test split (None: the global model for every client);
  `records` are JSON-able values written into the evaluation's metrics line."""

  params: Params
  personal: list[Params] | None = None
  assignment: np.ndarray | None = None
  records: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Arrival:
  """One client's finished update, as delivered to the server."""

  client: int
  num_samples: int
  staleness: int  # rounds between dispatch and arrival (τ)
  dispatch_round: int
  params_start: Params  # the parameters the client was dispatched with
  delta: Params  # Δ = w_i(after local training) − params_start
  payload: Any  # what `client.payload` returned (`()` without one)
  arrival_time: int = 0  # virtual time of arrival (for methods with timers or time decay, e.g. AiFed, CASA)


class Strategy:
  """Base class: the defaults of every hook. Subclasses set `name` and register with `@register`."""

  name: ClassVar[str] = ""
  # 'async': refill free slots whenever clients return; 'sync': dispatch a cohort of C clients only
  # when none is in flight (FedAvg's rounds on the same clock).
  dispatch_mode: ClassVar[str] = "async"
  client: ClientSide = ClientSide()  # set in `__init__` by methods with client-side work

  def __init__(self, hparams: ml_collections.ConfigDict, ctx: StrategyContext):
    """`hparams`: this method's own config section (`config[name]`, see `default_config`); `ctx`: what it may
    know of the run. Never the whole run config: what a method needs beyond its section is in `ctx`."""
    self.hparams = hparams
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

  def dispatch(self, state: State, client: int) -> tuple[State, Params, Any]:
    """(state after the dispatch, the client's starting parameters, the aux sent with them)."""
    del client
    return state, state.params, ()

  def receive(self, state: State, arrivals: Sequence[Arrival]) -> tuple[State, bool]:
    raise NotImplementedError

  def eval_models(self, state: State) -> EvalModels:
    return EvalModels(params=state.params)

  def diagnostics(self, state: State) -> dict[str, Any]:
    """Values for each evaluation's metrics line and each round line of events.jsonl."""
    del state
    return {}

  def event_records(self, state: State, arrivals: Sequence[Arrival]) -> list[dict[str, Any]]:
    """Per-arrival diagnostics (e.g. κ, weight) after `receive`; only called when events are logged."""
    del state
    return [{} for _ in arrivals]

  def upload_bytes(self, arrival: Arrival) -> int:
    """Bytes one client update sends to the server: the full Δ plus the payload."""
    return tree_bytes(arrival.delta) + tree_bytes(arrival.payload)


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


@checkpoint.register_record_source
def strategy_records() -> list[type]:
  """The records (dataclasses, named tuples) defined in the module of each registered strategy and of the
  strategies it derives from: its state classes, which its checkpoints hold (`checkpoint.allowed_records`
  calls this each time a checkpoint is read, so a strategy registered later counts too)."""
  out = []
  for strategy in _REGISTRY.values():
    for cls in strategy.__mro__:
      module = sys.modules.get(cls.__module__)
      if module is None or not issubclass(cls, Strategy) or cls is Strategy:
        continue
      out += [obj for obj in vars(module).values() if checkpoint.is_record(obj) and obj.__module__ == module.__name__]
  return out
