"""CASA (Liu et al., KDD 2024: "CASA: Clustered Federated Learning with Asynchronous Clients") and CASA+.

Clustered asynchronous FL: the server keeps one model per cluster, K found online. Every received update
is one asynchronous round t (Alg. 1): newcomer assignment (Eq. 15) -> C-phase (buffer-aided similarity,
Eq. 10, and multi-partitioning of the client's cluster, Alg. 3 with the trigger of Eq. 14; buffer upkeep,
Alg. 2) -> A-phase (the client's cluster model mixes in its weights with the bi-level decay, Eqs. 6-9).
A dispatched client starts from its cluster's model (`dispatch`); personalised evaluation uses each
client's cluster model (`eval_models`).

Formulas (t = the asynchronous round, |C_k| = clients assigned to cluster k, τ_i = client i's staleness):
- Ω(t) = (e / 2.8)^(k·t), k = `omega_k` = 0.001 (Appendix A.2.3).
- Cluster-level decay, Eq. 6: α_{c,k}(t) = α0 · Ω(t) / log2(|C_k| + 3), α0 = 2.
- Client-level decay, Eq. 7: α_i = α_{c,k} if τ_i <= r_{c,k}(t), else α_{c,k} / sqrt(τ_i), with the
  threshold of Eq. 8, r_{c,k}(t) = |C_k| · (2 − Ω(t)).
- Aggregation, Eq. 9: w_{g,k} ← α_i · w_i + (1 − α_i) · w_{g,k}, w_i = the client's uploaded weights.
- Similarity, Eq. 10: A_ij = cos(v_i, v_j^{buf_i}) for every item of buf_i, then buf_i is cleared.
- Alg. 3 on the arriving client's cluster: L = I − D^{-1/2} A D^{-1/2} (Eq. 12); λ_1 <= ... the first
  `num_eigenvalues` = 10 eigenvalues; R = argmax_k (λ_{k+1} − λ_k) (Eq. 13); split the cluster into R
  parts by spectral clustering if R >= 2 and α_{c,k} < γ · (λ_{R+1} − λ_R) (Eq. 14), γ = 0.15.
- Newcomer, Eq. 15: rep_k = Σ_{j ∈ buf_i ∩ u_k} (|D_j| / |D_{buf_i ∩ u_k}|) · v_j; join
  argmax_k cos(v_i, rep_k).
- CASA+ (`plus`), Eq. 16: only the entries of m_i are mixed, m_i masking out the S_i fraction of w_i's
  entries of smallest magnitude; Eq. 17: S_i(t) = (S0 / 2)(α_{c,k} − α_i)(1 + cos((t − 1)π / R_end)).
- Ablations: CASA-C (`no_clustering`: one cluster for the whole run, bi-level decay kept), CASA-D
  (`no_decay`: α_i = α_{c,k} = `fixed_alpha` = 0.3, the paper's basic decay coefficient of every
  asynchronous method, also in the trigger of Eq. 14).

Adaptations and readings of the paper (its printed math is garbled or silent here; docs/methods.md names the
readings that matter most):
- log base: "to ensure α_i is strictly less than 1, |C_k| is actually set to |C_k| + 3". That holds
  with log base 2 (log2(|C_k| + 3) >= 2, so α_{c,k} <= α0·Ω/2 = Ω <= 1 with α0 = 2) and not with the
  natural log (2 / ln 4 = 1.44), so log2 is used; with 100 clients in one cluster it gives α = 0.30, the
  paper's "basic decay coefficient α = 0.3". Eq. 8 uses the plain |C_k| (the +3 is stated for α only).
- The round t and the staleness count received updates (Alg. 1: one round per update): t is the
  server's update counter before this update (so Ω = 1 at the first), and τ_i = t − (the counter when
  client i was dispatched, recorded by the `dispatched` hook). The runner's own `staleness` counts event
  times with arrivals, which is coarser. `omega_clock = 'time'` uses the arrival's virtual time instead
  of t in Ω (then choose `omega_k` per time unit).
- All N clients start assigned to cluster 0 (the single global model w_{g,1} of Alg. 1) but count as
  newcomers until their first update arrives; Eq. 15 then picks their cluster. Newcomers take no part
  in the spectral clustering (their similarities are unknown); when a cluster splits they stay with
  the part that keeps its index. So that a newcomer can compare itself with every cluster, an arriving
  update is inserted into the buffers of the clients of its own cluster (Alg. 2, line 1) and into those
  of all newcomers.
- Similarity vectors v: `similarity = 'update'` (default) uses the client's update Δ_i = w_i − w_start,
  `'weights'` the uploaded weights w_i as the paper writes. Models that share an initialisation have
  weight cosines near 1 for every pair, so the largest eigengap stays after λ_1 (R = 1, no split; what the
  smoke run measured is in docs/methods.md). Cosines of updates separate clients with different data (the
  usual CFL choice, e.g. Sattler et al.).
  The cosine can be negative; the affinity graph of Eq. 12 uses max(A, 0) (a Laplacian needs
  non-negative weights), with A_ii = 1.
- Alg. 3 runs on a cluster only once it has at least `num_eigenvalues` (10) seen members, so that "the
  first 10 eigenvalues" (Appendix A.2.3) exist and a few early arrivals cannot split it, and once a
  share `min_computed` (0.8) of its seen members' pairs has a computed similarity (the paper: "we need
  all the pairwise similarities to make clustering decisions"; with the budget and the gap pruning some
  pairs may never be computed, so not all are required). The pairs still missing are filled with the
  mean of the computed ones in that cluster (neutral: no evidence for or against a split).
- Redundant-update pruning (Sec. 4.3): (i) large gap: the update is not inserted into buf_j when
  |start_j − start_i| >= r_b (`gap_rounds`, not given in the paper; 50 updates by default), start =
  the round at dispatch (client j's current job); (ii) recurring: not inserted when buf_j already holds
  an update of client i (the older one is kept, "discards redundant updates without buffering them").
- Prioritised buffer budget (Alg. 2, Eq. 11): M = `buffer_budget` counts stored model vectors, the
  server's storage. An arriving update is stored once and referenced by every buffer it enters, and
  the paper compares its M = 75 with the n = 100 models CFL-Async must store (Sec. 5.3.2); counted as
  (buffer, update) items, 75 could not even hold one update's insertion into 99 buffers. Items are
  ranked by (their pair's similarity never computed first, then the buffer owner's last client-level
  decay α_j ascending, slower clients first; owners that never reported count as α = 0, then newest
  first) and kept greedily while the distinct vectors they reference fit in M; the rest are deleted,
  so the budget holds after every update. The vectors live on the host (M of them: 75 x 6.4 MB for the
  MNIST CNN).
- Spectral clustering (Alg. 3, line 7): the normalised spectral clustering of Ng, Jordan and Weiss on
  the same L: rows of the R eigenvectors of smallest eigenvalue (scipy.linalg.eigh), normalised, then
  k-means (scikit-learn, 10 initialisations, seeded from the run seed). The largest part keeps the
  cluster's index; every new cluster starts from a copy of the split cluster's model (as in CFL).
- CASA+: the mask is applied in the server's aggregation only (Eq. 16), per parameter leaf (exactly
  floor(S_i · size) entries of smallest |w_i| are left out); the client's local training stays dense,
  so the simulated response times do not shrink. R_end = `sparsity_rounds` (the paper's 50,000
  asynchronous rounds); t is clipped to R_end, and S_i to [0, 1).
- Global test accuracy (beside the personalised one) is that of the cluster model holding the most
  training data (ties: the lower index): a clustered method has no single global model.
- Arrivals of one event time are processed one by one in client order; together they make one runner
  round.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import seeding
from fedpsa_jax.strategies.base import Arrival, EvalModels, Strategy, register
from fedpsa_jax.strategies.common import section_errors
from fedpsa_jax.tree_util import tree_add
from fedpsa_jax.validation import boolean, integer, number, one_of

Params = Any
OMEGA_BASE = math.e / 2.8  # Ω(t) = (e / 2.8)^(k·t), Appendix A.2.3
SIMILARITIES = ("update", "weights")
OMEGA_CLOCKS = ("updates", "time")


# --- the formulas (host floats; each against a hand computation in tests/strategies/test_casa.py) -----


def omega(t: float, k: float) -> float:
  """Ω(t) = (e / 2.8)^(k·t), CASA's time-decreasing bound (Appendix A.2.3)."""
  return OMEGA_BASE ** (k * t)


def cluster_alpha(alpha0: float, omega_t: float, cluster_size: int, size_offset: int = 3) -> float:
  """Eq. 6: α_{c,k}(t) = α0 · Ω(t) / log2(|C_k| + 3)."""
  return alpha0 * omega_t / math.log2(cluster_size + size_offset)


def staleness_threshold(cluster_size: int, omega_t: float) -> float:
  """Eq. 8: r_{c,k}(t) = |C_k| · (2 − Ω(t))."""
  return cluster_size * (2.0 - omega_t)


def client_alpha(alpha_c: float, staleness: int, threshold: float) -> float:
  """Eq. 7: α_i = α_{c,k} if τ_i <= r_{c,k}(t), else α_{c,k} / sqrt(τ_i)."""
  return alpha_c if staleness <= threshold else alpha_c / math.sqrt(staleness)


def sparsity(s0: float, alpha_c: float, alpha_i: float, t: int, rounds_end: int) -> float:
  """Eq. 17: S_i(t) = (S0 / 2)(α_{c,k} − α_i)(1 + cos((t − 1)π / R_end)), t >= 1 clipped to R_end,
  the result clipped to [0, 1)."""
  t = min(max(t, 1), rounds_end)
  s = s0 / 2.0 * (alpha_c - alpha_i) * (1.0 + math.cos((t - 1) * math.pi / rounds_end))
  return float(min(max(s, 0.0), np.nextafter(1.0, 0.0)))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
  """cos(a, b) (0 when either is zero)."""
  na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
  return float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else 0.0


def laplacian_spectrum(affinity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Eq. 12: eigenvalues (ascending) and eigenvectors of L = I − D^{-1/2} A D^{-1/2}, A >= 0 symmetric."""
  a = np.asarray(affinity, np.float64)
  d = a.sum(axis=1)
  inv_sqrt = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)
  lap = np.eye(len(a)) - inv_sqrt[:, None] * a * inv_sqrt[None, :]
  import scipy.linalg  # here: every run imports all strategies, and only CASA needs it (resident memory)
  return scipy.linalg.eigh((lap + lap.T) / 2.0)


def eigengap(eigenvalues: np.ndarray, num_eigenvalues: int = 10) -> tuple[int, float]:
  """Eq. 13: (R, λ_{R+1} − λ_R) with R = argmax_k (λ_{k+1} − λ_k) over the first `num_eigenvalues`
  eigenvalues (1-based R; the first maximum on ties). Needs at least two eigenvalues."""
  lam = np.sort(np.asarray(eigenvalues, np.float64))[:num_eigenvalues]
  gaps = np.diff(lam)
  r = int(np.argmax(gaps))
  return r + 1, float(gaps[r])


def should_split(alpha_c: float, gap: float, num_parts: int, gamma: float) -> bool:
  """Eq. 14: split into R >= 2 parts only when α_{c,k} < (λ_{R+1} − λ_R) · γ."""
  return num_parts >= 2 and alpha_c < gap * gamma


def cluster_affinity(similarity: np.ndarray, computed: np.ndarray) -> np.ndarray | None:
  """The affinity of Alg. 3 for one cluster: max(A, 0), the never-computed pairs filled with the mean of
  the computed ones, 1 on the diagonal; None when no pair has been computed."""
  n = len(similarity)
  off = computed & ~np.eye(n, dtype=bool)
  if not off.any():
    return None
  a = np.where(off, np.maximum(similarity, 0.0), np.maximum(similarity[off], 0.0).mean())
  np.fill_diagonal(a, 1.0)
  return a


def spectral_partition(affinity: np.ndarray, num_eigenvalues: int, gamma: float, alpha_c: float,
                       seed: int) -> tuple[np.ndarray | None, int, float]:
  """Alg. 3, lines 3-8, on one cluster's affinity: (labels in 0..R-1 or None when Eq. 14 does not
  fire, R, the eigengap). Labels come from Ng-Jordan-Weiss spectral clustering on the same L."""
  values, vectors = laplacian_spectrum(affinity)
  if len(values) < 3:
    return None, 1, 0.0
  r, gap = eigengap(values, num_eigenvalues)
  if not should_split(alpha_c, gap, r, gamma):
    return None, r, gap
  embedding = vectors[:, :r]
  embedding = embedding / np.maximum(np.linalg.norm(embedding, axis=1, keepdims=True), 1e-12)
  import sklearn.cluster  # here: a slow import that every process would otherwise pay for CASA alone

  labels = sklearn.cluster.KMeans(n_clusters=r, n_init=10, random_state=seed).fit(embedding).labels_
  return labels.astype(np.int64), r, gap


def newcomer_cluster(v_i: np.ndarray, candidates: Sequence[tuple[int, int, np.ndarray]]) -> int | None:
  """Eq. 15: the cluster whose representative rep_k = Σ_j (|D_j| / Σ|D|) v_j over the buffered items
  (cluster k, |D_j|, v_j) of that cluster is most similar (cosine) to v_i; None without items."""
  clusters = sorted({k for k, _, _ in candidates})
  if not clusters:
    return None
  best, best_sim = None, -np.inf
  for k in clusters:
    items = [(n, v) for c, n, v in candidates if c == k]
    total = float(sum(n for n, _ in items))
    rep = sum((n / total) * v for n, v in items)
    sim = cosine(v_i, rep)
    if sim > best_sim:
      best, best_sim = k, sim
  return best


def prune_buffer(items: Sequence[dict], computed: np.ndarray, owner_alpha: np.ndarray,
                 budget: int) -> list[dict]:
  """Alg. 2, lines 4-8 (Eq. 11): items (dicts with owner, source, inserted and key, the stored vector
  they point to) ranked by (pair (owner, source) not yet computed first, owner's α ascending, newest
  first) and kept greedily while the distinct vectors they hold number at most `budget` (an item whose
  vector is already kept costs nothing). Returned in rank order."""
  ranked = sorted(items, key=lambda it: (bool(computed[it["owner"], it["source"]]),
                                         float(owner_alpha[it["owner"]]), -it["inserted"]))
  kept, keys = [], set()
  for it in ranked:
    if it["key"] in keys or len(keys) < budget:
      kept.append(it)
      keys.add(it["key"])
  return kept


@jax.jit
def mix(model: Params, w_i: Params, alpha: jax.Array) -> Params:
  """Eq. 9: α_i · w_i + (1 − α_i) · w_{g,k}."""
  return jax.tree.map(lambda g, w: alpha * w + (1.0 - alpha) * g, model, w_i)


def magnitude_mask(x: jax.Array, fraction: jax.Array) -> jax.Array:
  """CASA+'s m_i for one leaf: False on exactly floor(fraction · size) entries of smallest |x|
  (ties by position), True elsewhere."""
  flat = jnp.abs(x).ravel()
  drop = jnp.floor(fraction * flat.size).astype(jnp.int32)
  ranks = jnp.zeros(flat.size, jnp.int32).at[jnp.argsort(flat, stable=True)].set(jnp.arange(flat.size))
  return (ranks >= drop).reshape(x.shape)


@jax.jit
def masked_mix(model: Params, w_i: Params, alpha: jax.Array, fraction: jax.Array) -> Params:
  """Eq. 16: the entries kept by m_i become α_i w_i + (1 − α_i) w_{g,k}; the others keep w_{g,k}."""
  def leaf(g, w):
    return jnp.where(magnitude_mask(w, fraction), alpha * w + (1.0 - alpha) * g, g)
  return jax.tree.map(leaf, model, w_i)


_ravel = jax.jit(lambda tree: jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(tree)]))


# --- the strategy ----------------------------------------------------------------------------------


@flax.struct.dataclass
class CASAState:
  """Cluster models (device) and the clustering bookkeeping (host NumPy arrays and ints; every field
  round-trips through a checkpoint as it is)."""

  models: tuple  # w_{g,k}, one parameter tree per cluster
  assign: np.ndarray  # [N] int64: each client's cluster
  seen: np.ndarray  # [N] bool: the client's first update has arrived (not a newcomer any more)
  similarity: np.ndarray  # [N, N] float64: A (Eq. 10)
  computed: np.ndarray  # [N, N] bool: A_ij has been computed at least once
  start: np.ndarray  # [N] int64: the round t at the client's latest dispatch
  last_alpha: np.ndarray  # [N] float64: each client's last client-level decay α_i (0 before any)
  items: tuple  # buffer items: dicts {owner, source, start, inserted, key}
  vectors: dict  # key -> similarity vector v (host float32), shared by the items holding it
  t: int = 0  # received updates so far (the asynchronous round)
  next_key: int = 0  # next vector key
  splits: int = 0  # clusterings that fired (Eq. 14)
  last: dict = flax.struct.field(default_factory=dict)  # diagnostics of the last update (host floats)
  events: tuple = ()  # per-arrival records of the last receive (host dicts)


@dataclasses.dataclass(frozen=True)
class Update:
  """One received update as the steps of a round see it (host side)."""

  client: int
  weights: Params  # w_i = w_start + Δ_i, the uploaded weights
  vector: np.ndarray  # v_i: Δ_i or w_i (`similarity`), raveled, host float32
  clock: float  # the t of Ω(t): received updates so far, or the arrival's virtual time (`omega_clock`)
  newcomer: bool  # the client's first update (not yet in any cluster's spectral clustering)


@register("casa")
class CASA(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.alpha0 = 2.0  # α0 of the cluster-level decay (Eq. 6; Appendix A.2.3)
    c.omega_k = 0.001  # k of Ω(t) = (e / 2.8)^(k·t) (Appendix A.2.3)
    c.omega_clock = "updates"  # t in Ω: updates = received updates (the paper's rounds) | time = virtual time
    c.size_offset = 3  # α uses log2(|C_k| + size_offset), keeping α_i < 1 (Appendix A.2.3)
    c.gamma = 0.15  # γ of the clustering trigger α_{c,k} < γ (λ_{R+1} − λ_R) (Eq. 14)
    c.num_eigenvalues = 10  # eigenvalues of L searched for the largest gap (Eq. 13; Appendix A.2.3)
    c.buffer_budget = 75  # M: most model-sized vectors stored for the buffers (Alg. 2; the paper's Fig. 9a: 75)
    c.gap_rounds = 50  # r_b: no buffering across start rounds this far apart (large-gap pruning)
    # Alg. 3 runs on a cluster only once this share of its members' pairs has a computed similarity
    # ("we need all the pairwise similarities to make clustering decisions", Sec. 4.3).
    c.min_computed = 0.8
    c.similarity = "update"  # vectors compared by cosine: update (Δ_i) | weights (w_i, as the paper writes)
    c.plus = False  # CASA+: magnitude-masked aggregation with the sparsity schedule (Eqs. 16-17)
    c.sparsity_s0 = 0.5  # S0 of CASA+'s sparsity schedule (Eq. 17)
    c.sparsity_rounds = 50_000  # R_end of Eq. 17: the run's planned rounds (the paper's 50,000)
    c.no_clustering = False  # CASA-C ablation: never split (one cluster), bi-level decay kept
    c.no_decay = False  # CASA-D ablation: α_i = fixed_alpha for every update (no bi-level decay)
    c.fixed_alpha = 0.3  # CASA-D's constant α (the paper's basic decay coefficient of async methods)
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    return section_errors(config, "casa", (
        ("alpha0", number(gt=0)), ("omega_k", number(ge=0, note="0: Ω = 1")), ("omega_clock", one_of(OMEGA_CLOCKS)),
        ("size_offset", integer(ge=1)), ("gamma", number(gt=0)), ("num_eigenvalues", integer(ge=3)),
        ("buffer_budget", integer(ge=0)), ("gap_rounds", integer(ge=1)), ("min_computed", number(ge=0, le=1)),
        ("similarity", one_of(SIMILARITIES)), ("plus", boolean), ("no_clustering", boolean), ("no_decay", boolean),
        ("sparsity_s0", number(ge=0, le=2)), ("sparsity_rounds", integer(ge=1)), ("fixed_alpha", number(gt=0, le=1))))

  def __init__(self, hparams, ctx):
    super().__init__(hparams, ctx)
    # One k-means seed for the run, from its own stream (changing it shifts no other randomness).
    self.kmeans_seed = int(seeding.host_rng(ctx.seed, "casa_clustering").integers(2**31 - 1))

  def init(self, params: Params) -> CASAState:
    n = self.ctx.num_clients
    return CASAState(models=(params,), assign=np.zeros(n, np.int64), seen=np.zeros(n, bool),
                     similarity=np.eye(n), computed=np.eye(n, dtype=bool), start=np.zeros(n, np.int64),
                     last_alpha=np.zeros(n), items=(), vectors={})

  # --- dispatch and evaluation ---------------------------------------------------------------------

  def dispatch(self, state: CASAState, client: int) -> tuple[CASAState, Params, tuple]:
    """The client's cluster model; its start round is recorded (for buffer pruning)."""
    start = state.start.copy()
    start[client] = state.t
    return state.replace(start=start), state.models[int(state.assign[client])], ()

  def eval_models(self, state: CASAState) -> EvalModels:
    """The test set on the cluster model holding the most training data; each client on its cluster's
    model; the cluster assignment written with the evaluation."""
    data = np.bincount(state.assign, weights=self.ctx.client_sizes, minlength=len(state.models))
    return EvalModels(params=state.models[int(np.argmax(data))], personal=list(state.models),
                      assignment=state.assign.copy(), records={"clusters": [int(k) for k in state.assign]})

  def diagnostics(self, state: CASAState) -> dict[str, Any]:
    return {"num_clusters": len(state.models), "splits": state.splits, "buffer_items": len(state.items),
            **state.last}

  def event_records(self, state: CASAState, arrivals: Sequence[Arrival]) -> list[dict[str, float]]:
    """The records `receive` kept, one per arrival of that call (the runner asks right after it)."""
    if len(state.events) != len(arrivals):
      raise ValueError(f"CASA.event_records is for the {len(state.events)} arrivals of the last receive, "
                       f"not {len(arrivals)}")
    return list(state.events)

  # --- the server ----------------------------------------------------------------------------------

  def alphas(self, state: CASAState, cluster: int, staleness: int, now: float) -> tuple[float, float, float]:
    """(Ω, α_{c,k}, α_i) of an update of `staleness` to `cluster` at clock `now` (Eqs. 6-8)."""
    h = self.hparams
    om = omega(now, h.omega_k)
    if h.no_decay:
      return om, h.fixed_alpha, h.fixed_alpha
    size = int(np.sum(state.assign == cluster))
    a_c = cluster_alpha(h.alpha0, om, size, h.size_offset)
    return om, a_c, client_alpha(a_c, staleness, staleness_threshold(size, om))

  def receive(self, state: CASAState, arrivals: Sequence[Arrival]) -> tuple[CASAState, bool]:
    """One asynchronous round per arrival (Alg. 1), in client order; each step copies the host arrays it
    changes, so a state handed out earlier is never changed."""
    events = []
    for a in arrivals:
      state, record = self._receive_one(state, a)
      events.append(record)
    return state.replace(events=tuple(events)), bool(arrivals)

  def _receive_one(self, state: CASAState, a: Arrival) -> tuple[CASAState, dict]:
    """Alg. 1's round t for one update: newcomer assignment, C-phase, A-phase, buffer upkeep."""
    update = self._update(state, a)
    state = self._assign_newcomer(state, update)
    state, clustering = self._c_phase(state, update)
    state, decay = self._a_phase(state, update)
    state = self._buffer(state, update)
    record = {**decay, "newcomer": float(update.newcomer), **clustering}
    return state.replace(last={k: float(v) for k, v in record.items()}), record

  def _update(self, state: CASAState, a: Arrival) -> Update:
    """What the steps need of an arrival: w_i, the similarity vector v_i, the clock of Ω, newcomer or not."""
    w_i = tree_add(a.params_start, a.delta)
    v_i = np.asarray(jax.device_get(_ravel(a.delta if self.hparams.similarity == "update" else w_i)), np.float32)
    clock = a.arrival_time if self.hparams.omega_clock == "time" else state.t
    return Update(a.client, w_i, v_i, clock, newcomer=not state.seen[a.client])

  def _assign_newcomer(self, state: CASAState, u: Update) -> CASAState:
    """Eq. 15: a newcomer joins the cluster whose representative (of the updates in its buffer from clients
    already seen) is most like v_i, when there is more than one cluster; the client is seen from now on."""
    assign = state.assign
    if u.newcomer and len(state.models) > 1 and not self.hparams.no_clustering:
      k = newcomer_cluster(u.vector, [(int(state.assign[it["source"]]), int(self.ctx.client_sizes[it["source"]]),
                                       state.vectors[it["key"]])
                                      for it in state.items if it["owner"] == u.client and state.seen[it["source"]]])
      if k is not None:
        assign = assign.copy()
        assign[u.client] = k
    seen = state.seen.copy()
    seen[u.client] = True
    return state.replace(assign=assign, seen=seen)

  def _c_phase(self, state: CASAState, u: Update) -> tuple[CASAState, dict]:
    """C-phase: A_ij = cos(v_i, v_j) for every item j of buf_i (Eq. 10), buf_i cleared, then Alg. 3 on the
    client's cluster (which may split it); the clustering's record (eigengap, split) for events.jsonl."""
    i = u.client
    similarity, computed = state.similarity.copy(), state.computed.copy()
    for it in state.items:
      if it["owner"] == i:
        j = it["source"]
        similarity[i, j] = similarity[j, i] = cosine(u.vector, state.vectors[it["key"]])
        computed[i, j] = computed[j, i] = True
    state = state.replace(similarity=similarity, computed=computed,
                          items=tuple(it for it in state.items if it["owner"] != i))
    if self.hparams.no_clustering:
      return state, {}
    k = int(state.assign[i])
    _, a_c, _ = self.alphas(state, k, 0, u.clock)
    return self._cluster(state, k, a_c)

  def _a_phase(self, state: CASAState, u: Update) -> tuple[CASAState, dict]:
    """A-phase: the bi-level decay α_i of the update (Eqs. 6-8) and the client's cluster model mixed with
    w_i (Eq. 9, or Eq. 16 with CASA+'s sparsity of Eq. 17); the decay's record for events.jsonl."""
    h, i, t = self.hparams, u.client, state.t
    k = int(state.assign[i])
    tau = max(t - int(state.start[i]), 0)
    om, a_c, a_i = self.alphas(state, k, tau, u.clock)
    s_i = sparsity(h.sparsity_s0, a_c, a_i, t + 1, h.sparsity_rounds) if h.plus else 0.0
    if s_i > 0:
      new_model = masked_mix(state.models[k], u.weights, jnp.float32(a_i), jnp.float32(s_i))
    else:
      new_model = mix(state.models[k], u.weights, jnp.float32(a_i))
    last_alpha = state.last_alpha.copy()
    last_alpha[i] = a_i
    state = state.replace(models=state.models[:k] + (new_model,) + state.models[k + 1:], last_alpha=last_alpha)
    return state, {"cluster": k, "alpha": a_i, "cluster_alpha": a_c, "omega": om, "tau": tau, "sparsity": s_i}

  def _buffer(self, state: CASAState, u: Update) -> CASAState:
    """Alg. 2: v_i goes into the buffers of the client's cluster mates and of the newcomers, unless
    redundant (recurring, or a large gap in start rounds), then the budget M is kept (Eq. 11); the round
    counter t advances."""
    h, i, t, key = self.hparams, u.client, state.t, state.next_key
    items = list(state.items)
    holders = {it["owner"] for it in items if it["source"] == i}
    mates = (state.assign == state.assign[i]) | ~state.seen
    for j in np.flatnonzero(mates & (np.arange(len(state.seen)) != i)):
      if int(j) in holders or abs(int(state.start[j]) - int(state.start[i])) >= h.gap_rounds:
        continue  # recurring / large gap
      items.append({"owner": int(j), "source": i, "start": int(state.start[i]), "inserted": t, "key": key})
    items = prune_buffer(items, state.computed, state.last_alpha, h.buffer_budget)
    live = {it["key"] for it in items}
    vectors = {kk: v for kk, v in state.vectors.items() if kk in live}
    if key in live:
      vectors[key] = u.vector
    return state.replace(items=tuple(items), vectors=vectors, t=t + 1, next_key=key + 1)

  def _cluster(self, state: CASAState, k: int, alpha_c: float) -> tuple[CASAState, dict]:
    """Alg. 3 on cluster k's seen members: split it into R clusters when Eq. 14 fires."""
    members = np.flatnonzero((state.assign == k) & state.seen)
    if len(members) < self.hparams.num_eigenvalues:  # (the first num_eigenvalues must exist)
      return state, {}
    computed = state.computed[np.ix_(members, members)]
    share = (computed.sum() - len(members)) / (len(members) * (len(members) - 1))
    affinity = cluster_affinity(state.similarity[np.ix_(members, members)], computed)
    if affinity is None or share < self.hparams.min_computed:
      return state, {}
    labels, r, gap = spectral_partition(affinity, self.hparams.num_eigenvalues, self.hparams.gamma, alpha_c,
                                        self.kmeans_seed)
    record = {"eigengap": gap, "eigengap_parts": r}
    if labels is None:
      return state, record
    # The largest part keeps index k (and the newcomers still in k); the others become new clusters.
    counts = np.bincount(labels, minlength=r)
    order = [int(p) for p in np.argsort(-counts, kind="stable")]
    models, assign = state.models, state.assign.copy()
    for p in order[1:]:
      assign[members[labels == p]] = len(models)
      models = models + (state.models[k],)
    return state.replace(models=models, assign=assign, splits=state.splits + 1), {**record, "split": 1.0}
