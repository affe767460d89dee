"""FedPAC (Xu, Tong, Huang, ICLR 2023: "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration"), adapted to the asynchronous buffer as the FedPSA paper's baseline.

The model is split into a feature extractor f (every layer but the last) and a classifier g (the last
Dense layer, `models.classifier_layer`). The linear model has no extractor, so FedPAC does not apply to
it (the FedPSA paper's Table 1 has no FedPAC entry for FMNIST): validation rejects it.

Client (dispatched with the global extractor, its own personalised classifier and the global class
prototypes c_k):
- local objective, one batch B:  (1/|B|) Σ_l [ CE(g(f(x_l)), y_l) + λ (1/d) ||f(x_l) − c_{y_l}||² ]
  (the paper's empirical risk plus λ times its feature-alignment regulariser towards the global
  prototypes);
- feature statistics at the parameters it was dispatched with (the paper's classifier-collaboration
  statistics; `statistics_extraction` of the official code), over its n samples with n_k of class k,
  p_k = n_k / n, μ_k the mean feature of class k:
    h[k] = p_k μ_k,   V = (1/n) Σ_k ( p_k E_k||f||² − p_k² ||μ_k||² );
- local prototypes at the trained parameters: ĉ_k = μ_k of the trained extractor, and the counts n_k.
  It uploads (Δ, n_k, ĉ, V, h).

Server, once the buffer holds updates from at least K clients (S the buffered clients, m = |S|):
- extractor: w_f ← w_f + Σ_{j ∈ S} (n_j / Σ_S n) Δ_j,f (the paper's data-size-weighted extractor
  average; in the synchronous paper every Δ starts from the same w_f, where the two are equal);
- global prototypes: c_k = Σ_j n_{j,k} ĉ_{j,k} / Σ_j n_{j,k} for every class seen in S (the official
  `protos_aggregation`);
- classifier collaboration: for each i ∈ S, the combination weights (the official `get_head_agg_weight`)
    α_i = argmin_{α ∈ simplex} α^T (diag(V) + D_i) α,
    (D_i)_{j j'} = Σ_k (h_i[k] − h_j[k])·(h_i[k] − h_j'[k]),
  the estimated test risk of client i's combined classifier (variance term Σ α_j² V_j, bias term
  ||Σ_j α_j (h_i − h_j)||²), solved exactly by SLSQP (`solve_simplex_qp`); weights below 1e-3 are
  zeroed and the rest renormalised (as the official code does), and client i's classifier becomes
  Σ_j α_ij g_j with g_j the trained classifiers of S.
- The global model (what the test set is evaluated on, and the classifier a client without a
  personalised one starts from): the averaged extractor with the data-size-weighted average of the
  personalised classifiers of all clients that have one.

Adaptation choices (the paper is synchronous; FLGo's and the official code are the references):
- Asynchrony: the synchronous cohort becomes the buffer of K arrivals (docs/methods.md, 'Defaults'), flushed like
  FedBuff's (arrivals of one event time enter together, so a flush may hold more than K); extractor
  deltas are applied to the current extractor rather than averaging models that started from
  different extractor versions. No staleness weighting (FedPAC has none).
- The statistics (V, h) of the clients of one flush were computed under slightly different extractor
  versions (those they were dispatched with); the QP uses them as they are.
- Local training is the run's plain SGD over all parameters jointly for E epochs. The official code
  first trains the classifier alone for one epoch (lr 0.1, momentum 0.5), then the extractor alone
  with the alignment term; here every baseline shares the FedPSA paper's one local optimiser (its
  Sec. 6.1: plain SGD, the same lr and epochs), and
  the alignment term's gradient reaches only the extractor anyway (c is a constant).
- The alignment term uses the mean over the d feature dimensions (the official code's `MSELoss`, for
  which λ = 1.0 was chosen), i.e. ||·||²/d. Samples of a class with no global prototype yet contribute
  no alignment term (the official code falls back to the client's own prototype; at the start, before
  any flush, no class has one, so the first jobs train on cross-entropy alone as in its round 0).
  A class's global prototype keeps its last value while no flush holds it.
- diag(V) + D_i is positive semidefinite by construction (V >= 0, D_i a Gram matrix), so the official
  code's eigenvalue clipping (and its fallback to the local classifier for an indefinite matrix) has
  nothing to do; the matrix is only symmetrised against rounding.
- A client that never received a personalised classifier starts from the global one (the official code
  keeps the initial head, then fixes it by its classifier-only epoch, which is not run here).
- Defaults (docs/methods.md, 'Defaults'): K = 5, λ = 1.0.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedpsa_jax import models
from fedpsa_jax.strategies.base import Arrival, ClientJob, ClientSide, Strategy, register
from fedpsa_jax.strategies.common import buffer_size, section_errors
from fedpsa_jax.tree_util import apply_weighted
from fedpsa_jax.validation import integer, number

Params = Any
WEIGHT_EPSILON = 1e-3  # collaboration weights below this are zeroed, as in the official code
NO_EXTRACTOR = "FedPAC needs a feature extractor; the linear model has none, as in the paper"


@flax.struct.dataclass
class FedPACState:
  params: Params  # global extractor + the data-size-weighted classifier (what is evaluated)
  heads: Params  # personalised classifiers, stacked on a leading client axis [N, ...]
  has_head: jax.Array  # [N] bool: the client has received a personalised classifier
  prototypes: jax.Array  # [C, d] global class prototypes c_k
  known: jax.Array  # [C] bool: c_k has been computed at least once
  deltas: tuple = ()  # buffered Δ_j
  heads_trained: tuple = ()  # buffered trained classifiers g_j (classifier of w_dispatch + Δ_j)
  payloads: tuple = ()  # buffered client statistics (dicts of counts, prototypes, v, h)
  clients: tuple = flax.struct.field(pytree_node=False, default=())  # buffered client ids (host)
  sizes: tuple = flax.struct.field(pytree_node=False, default=())  # their n_j (host)
  # Collaboration weights of the last flush, rows per buffered client (host floats; a tuple so that the
  # state's tree structure stays hashable).
  last_alphas: tuple | None = flax.struct.field(pytree_node=False, default=None)


# --- the classifier split ---------------------------------------------------------------------------


def get_head(params: Params, layer: str) -> Params:
  return params["params"][layer]


def with_head(params: Params, layer: str, head: Params) -> Params:
  """`params` with its classifier replaced (the other layers shared, not copied)."""
  return {**params, "params": {**params["params"], layer: head}}


# --- client side ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlignmentLoss:
  """The local objective of one padded batch: masked mean of CE + λ · mean_d (f(x) − c_y)².

  A value, not a closure: runs with the same λ build equal `LocalTrainer`s, whose local training a process
  then compiles once (jit's static arguments are compared by value)."""

  lam: float

  def __call__(self, apply_fn, params, anchor, x, y, mask, aux) -> jax.Array:
    del anchor
    prototypes, known = aux
    features, logits = apply_fn(params, x, return_features=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    align = jnp.mean((features - jnp.take(prototypes, y, axis=0)) ** 2, axis=-1)
    align = align * jnp.take(known, y).astype(align.dtype)  # no prototype for the class yet: no term
    return jnp.sum((ce + self.lam * align) * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def class_feature_sums(apply_fn, params: Params, x_all: jax.Array, y_all: jax.Array, index_row: jax.Array,
                       num_samples: jax.Array, num_classes: int,
                       batch_size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per class over a client's samples: counts n_k, Σ f and Σ ||f||² (padding masked out).

  The padded row is run in chunks of `batch_size` (a Python loop inside jit: bounded memory, and no
  rolled loop around a conv net, which is slow on CPU)."""
  counts = sums = squares = 0.0
  for start in range(0, index_row.shape[0], batch_size):
    rows = index_row[start:start + batch_size]
    real = (start + jnp.arange(rows.shape[0]) < num_samples).astype(jnp.float32)
    features, _ = apply_fn(params, jnp.take(x_all, rows, axis=0), return_features=True)
    onehot = jax.nn.one_hot(jnp.take(y_all, rows), num_classes, dtype=jnp.float32) * real[:, None]
    counts = counts + jnp.sum(onehot, axis=0)
    sums = sums + onehot.T @ features
    squares = squares + onehot.T @ jnp.sum(features ** 2, axis=-1)
  return counts, sums, squares


def client_statistics(apply_fn, params_start: Params, params_end: Params, x_all, y_all, index_row, num_samples,
                      num_classes: int, batch_size: int) -> dict[str, jax.Array]:
  """The upload beside Δ: counts n_k; prototypes ĉ_k at the trained parameters (0 for absent classes);
  V and h (the QP's statistics) at the dispatched parameters (see the module docstring)."""
  stats = functools.partial(class_feature_sums, apply_fn, x_all=x_all, y_all=y_all, index_row=index_row,
                            num_samples=num_samples, num_classes=num_classes, batch_size=batch_size)
  counts, sums0, squares0 = stats(params_start)
  _, sums1, _ = stats(params_end)
  n = jnp.maximum(jnp.sum(counts), 1.0)
  per_class = jnp.maximum(counts, 1.0)[:, None]
  p = counts / n
  mu = sums0 / per_class
  v = (jnp.sum(squares0) / n - jnp.sum(p ** 2 * jnp.sum(mu ** 2, axis=-1))) / n
  return {"counts": counts, "prototypes": sums1 / per_class, "v": v, "h": p[:, None] * mu}


# One compiled program per model, class count and batch size in a process, which all its runs share (a sweep's
# members, a notebook's runs): `apply_fn` is the model's `apply`, equal across runs (models.get_model).
_compiled_statistics = jax.jit(client_statistics, static_argnums=(0,), static_argnames=("num_classes", "batch_size"))


# --- server side ------------------------------------------------------------------------------------


def collaboration_matrix(v: np.ndarray, h: np.ndarray, i: int) -> np.ndarray:
  """diag(V) + D_i with (D_i)_{jj'} = Σ_k (h_i[k] − h_j[k])·(h_i[k] − h_j'[k]) (FedPAC's QP).

  `v`: [m] variance terms; `h`: [m, C, d] the clients' p_k μ_k."""
  h = np.asarray(h, np.float64).reshape(len(v), -1)
  r = h[i][None, :] - h
  return np.diag(np.asarray(v, np.float64)) + r @ r.T


def solve_simplex_qp(p_matrix: np.ndarray) -> np.ndarray:
  """argmin over the probability simplex of α^T P α, P symmetric positive semidefinite.

  A convex QP: scipy's SLSQP from the uniform point (P scaled to max |P| = 1, so its tolerance is
  relative), with the best vertex as a guard, then clipped onto the simplex. Exact up to ~1e-10 on
  the small instances FedPAC solves (m = the buffer size)."""
  p = np.asarray(p_matrix, np.float64)
  p = 0.5 * (p + p.T)
  m = p.shape[0]
  if m == 1:
    return np.ones(1)
  q = p / max(np.max(np.abs(p)), np.finfo(np.float64).tiny)
  ones = np.ones(m)
  import scipy.optimize  # here: every run imports all strategies, and only FedPAC needs it (resident memory)
  result = scipy.optimize.minimize(
      lambda a: a @ q @ a, ones / m, jac=lambda a: 2.0 * q @ a, method="SLSQP", bounds=[(0.0, 1.0)] * m,
      constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: ones}],
      options={"ftol": 1e-16, "maxiter": 500})
  alpha = np.clip(result.x, 0.0, None)
  alpha = alpha / alpha.sum() if alpha.sum() > 0 else ones / m
  vertex = int(np.argmin(np.diag(q)))
  if q[vertex, vertex] < alpha @ q @ alpha:
    alpha = np.eye(m)[vertex]
  return alpha


def collaboration_weights(v: np.ndarray, h: np.ndarray) -> np.ndarray:
  """[m, m]: row i = client i's combination weights over the m buffered classifiers (the QP's
  solution, weights below WEIGHT_EPSILON zeroed, renormalised)."""
  rows = []
  for i in range(len(v)):
    alpha = solve_simplex_qp(collaboration_matrix(v, h, i))
    alpha = np.where(alpha > WEIGHT_EPSILON, alpha, 0.0)
    rows.append(alpha / alpha.sum())
  return np.stack(rows)


@jax.jit
def aggregate_prototypes(prototypes: jax.Array, known: jax.Array, counts: jax.Array,
                         local_prototypes: jax.Array) -> tuple[jax.Array, jax.Array]:
  """c_k = Σ_j n_{j,k} ĉ_{j,k} / Σ_j n_{j,k} for classes seen in the buffer; others kept.
  `counts`: [m, C], `local_prototypes`: [m, C, d]."""
  total = jnp.sum(counts, axis=0)
  fresh = jnp.einsum("jk,jkd->kd", counts, local_prototypes) / jnp.maximum(total, 1.0)[:, None]
  seen = total > 0
  return jnp.where(seen[:, None], fresh, prototypes), known | seen


@jax.jit
def _personalise(heads: Params, has_head: jax.Array, trained: tuple, alphas: jax.Array, clients: jax.Array,
                 client_sizes: jax.Array) -> tuple[Params, jax.Array, Params]:
  """Client i ∈ S gets Σ_j α_ij g_j; returns the new stacked heads, has_head and the global classifier
  (the data-size-weighted average over all clients holding a personalised classifier)."""
  # `clients` holds no duplicate: a client whose update waits in the buffer is not re-dispatched (docs/simulation.md).
  stacked = jax.tree.map(lambda *g: jnp.stack(g), *trained)
  combined = jax.tree.map(lambda g: jnp.tensordot(alphas.astype(g.dtype), g, axes=1), stacked)
  heads = jax.tree.map(lambda hs, c: hs.at[clients].set(c), heads, combined)
  has_head = has_head.at[clients].set(True)
  weights = jnp.where(has_head, client_sizes, 0.0)
  weights = weights / jnp.sum(weights)
  return heads, has_head, jax.tree.map(lambda hs: jnp.tensordot(weights.astype(hs.dtype), hs, axes=1), heads)


@functools.partial(jax.jit, static_argnums=(4,))
def _start_params(params: Params, heads: Params, has_head: jax.Array, client: jax.Array, layer: str) -> Params:
  own = jax.tree.map(lambda hs: hs[client], heads)
  head = jax.tree.map(lambda o, g: jnp.where(has_head[client], o, g), own, get_head(params, layer))
  return with_head(params, layer, head)


@register("fedpac")
class FedPAC(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.buffer_size = 5  # K: aggregate when the buffer holds updates from at least this many clients
    c.lam = 1.0  # λ, weight of the feature-alignment term (FedPAC's default)
    c.stats_batch_size = 500  # samples per forward pass of the clients' feature statistics (memory only)
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    errors = section_errors(config, "fedpac", (("buffer_size", buffer_size(config)), ("lam", number(ge=0)),
                                               ("stats_batch_size", integer(ge=1))))
    if config.model.name not in models.FEATURE_MODELS:
      errors.append(f"model.name={config.model.name!r} is invalid for method=fedpac; allowed: "
                    f"{', '.join(models.FEATURE_MODELS)} ({NO_EXTRACTOR})")
    return errors

  def __init__(self, hparams, ctx):
    super().__init__(hparams, ctx)
    if ctx.model_name not in models.FEATURE_MODELS:
      raise ValueError(f"model.name={ctx.model_name!r} is invalid for method=fedpac: {NO_EXTRACTOR}")
    self._statistics = functools.partial(_compiled_statistics, ctx.apply_fn, num_classes=ctx.num_classes,
                                         batch_size=int(self.hparams.stats_batch_size))
    self.client = ClientSide(loss=AlignmentLoss(float(self.hparams.lam)), payload=self._client_payload)
    self._sizes = jnp.asarray(ctx.client_sizes, jnp.float32)
    self._layer = models.classifier_layer(ctx.params_shape)  # the classifier's name

  def init(self, params: Params) -> FedPACState:
    head = get_head(params, self._layer)
    d = head["kernel"].shape[0]  # the classifier's input: the feature dimension
    n = self.ctx.num_clients
    return FedPACState(
        params=params, heads=jax.tree.map(lambda g: jnp.broadcast_to(g, (n, *g.shape)), head),
        has_head=jnp.zeros((n,), bool), prototypes=jnp.zeros((self.ctx.num_classes, d), jnp.float32),
        known=jnp.zeros((self.ctx.num_classes,), bool))

  def dispatch(self, state: FedPACState, client: int) -> tuple[FedPACState, Params, tuple[jax.Array, jax.Array]]:
    """The global extractor with the client's personalised classifier (the global one if it has none), and
    as aux the global prototypes at dispatch and which classes have one."""
    params = _start_params(state.params, state.heads, state.has_head, jnp.int32(client), self._layer)
    return state, params, (state.prototypes, state.known)

  def _client_payload(self, params_start: Params, params_end: Params, job: ClientJob) -> dict[str, jax.Array]:
    """The client's feature statistics and class prototypes (computed on the client's device)."""
    data = job.data
    return self._statistics(params_start, params_end, data.x_all, data.y_all, data.index_row,
                            jnp.int32(data.num_samples))

  def receive(self, state: FedPACState, arrivals: Sequence[Arrival]) -> tuple[FedPACState, bool]:
    layer = self._layer
    state = state.replace(
        deltas=state.deltas + tuple(a.delta for a in arrivals),
        heads_trained=state.heads_trained + tuple(
            jax.tree.map(jnp.add, get_head(a.params_start, layer), get_head(a.delta, layer)) for a in arrivals),
        payloads=state.payloads + tuple(a.payload for a in arrivals),
        clients=state.clients + tuple(a.client for a in arrivals),
        sizes=state.sizes + tuple(a.num_samples for a in arrivals))
    if len(state.deltas) < self.hparams.buffer_size:
      return state, False
    sizes = np.asarray(state.sizes, np.float64)
    params = apply_weighted(state.params, state.deltas, jnp.asarray(sizes / sizes.sum(), jnp.float32))
    counts = jnp.stack([p["counts"] for p in state.payloads])
    prototypes, known = aggregate_prototypes(state.prototypes, state.known, counts,
                                             jnp.stack([p["prototypes"] for p in state.payloads]))
    v, h = jax.device_get((jnp.stack([p["v"] for p in state.payloads]), jnp.stack([p["h"] for p in state.payloads])))
    alphas = collaboration_weights(v, h)
    heads, has_head, global_head = _personalise(
        state.heads, state.has_head, state.heads_trained, jnp.asarray(alphas, jnp.float32),
        jnp.asarray(state.clients, jnp.int32), self._sizes)
    return FedPACState(params=with_head(params, layer, global_head), heads=heads, has_head=has_head,
                       prototypes=prototypes, known=known,
                       last_alphas=tuple(tuple(float(a) for a in row) for row in alphas)), True

  def diagnostics(self, state: FedPACState) -> dict[str, Any]:
    out: dict[str, Any] = {"known_prototypes": int(jnp.sum(state.known))}
    if state.last_alphas is not None:
      out["self_weight_mean"] = float(np.mean(np.diag(state.last_alphas)))
    return out
