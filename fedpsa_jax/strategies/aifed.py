"""AiFed (You et al., IEEE TKDE 2024): layer-wise adaptive uploading (ALMU) and aggregation (AGMA).

A **layer** is one top-level parameter group of the Flax model, `params['params'][name]` (e.g.
`Conv_0` with its kernel and bias): the unit a client uploads or withholds and the server aggregates.
Its **representation** is the output of that module's `__call__` (captured with Flax's
`capture_intermediates`; for a conv or dense layer the pre-activation output). `layer_names(params)`
defines the order (the model's creation order) once for the client and the server.

ALMU, the client (Sec. IV-A, Algorithm 1 part 1), one jitted pure function of arrays (`almu_payload`):
- stimuli: up to `stimuli_per_class` of the client's own training samples per class, chosen at random
  (fixed shapes: C x S slots with a validity mask, picked by `top_k` over random priorities);
- a representational dissimilarity array (RDA) per layer: cosine distances of the layer's
  representations over `num_pairs` stimulus pairs sampled without replacement from the valid pairs
  (the same pairs under both models);
- rc_l = squared Pearson correlation of RDA_l under the received global model and under the trained
  local model (Eq. 8);
- AT = 1 / (1 + exp(-(α_r̂ r̂ + α_acc δ_acc))) (Eq. 9), r̂ the round of the received model;
- the upload rule F (`upload_when`, three readings of the paper, compared in docs/methods.md, 'Which upload
  rule'; nothing is sent when no layer qualifies):
  - `rank` (default; the authors' code's rule, read as a rank): rc_l is ranked among the last W reports
    and layer l is uploaded with probability 1 − (j + 1)/W, j its rank from the least consistent (0) up;
    AT is not used. The only reading that gives the paper's saving;
  - `consistent`: iff rc_l >= AT (Eqs. 8-9 as printed);
  - `changed`: iff rc_l < AT (the prose, "filter out redundant knowledge", fits this reading too).
It sends the chosen layers with its mask, r̂, n and its level of information richness, LIR (below).

The rank rule made asynchronous (the code ranks the m = 8 clients of a synchronous round, all trained from
one model; here updates arrive one by one):
- the group is a window: a client ranks its rc_l among the rc_l of the last W − 1 updates the server
  received (`rank_window` W, default 8 = the code's m), itself the W-th value; j = the number of window
  values strictly below rc_l (ties count in the client's favour: it uploads more readily);
- every update reports its rc [L] to the server (in `payload['sent']`, counted in its bytes, also when no
  layer is sent, then at L × 4 bytes alone); the server keeps the last W − 1 reports in a ring buffer
  (`AiFedState.rc_window`, device state, checkpointed with the rest) and sends it with the model at
  dispatch (the aux of `dispatch`, counted in the download bytes), so the client decides locally, in
  the jitted `almu_payload`, on what it was dispatched with (a job still depends only on its dispatch record);
- until the server has received W − 1 reports there is no full group to rank in, and the client sends
  every layer (the run's first ~2 C updates);
- u_l ~ U[0, 1) comes from the key fold_in(fold_in(key(seed, 'aifed/upload'), client), reports received at
  dispatch), unique per update (a client is re-dispatched only after its own report arrived) and
  independent of the stimuli's key; layer l goes iff u_l >= (j + 1)/W;
- `rank_layers='all'` applies the rule to every layer, each with its own rank (the paper's per-layer F);
  `'largest'` to the largest layer only, the others always sent (the code's choice: its gated dense
  layer is the largest).

AGMA, the server (Sec. IV-B, Algorithm 1 part 2): received (partial) models wait in a queue; an
aggregation (one round) happens when the queue holds `buffer_size` models (`trigger='counter'`) or at
the first arrival at or after each multiple of `period` virtual time units (`trigger='timer'`). With
r the round being formed and r̂_k the round client k started from:
- LIS_k = (e/2)^(-(r - r̂_k)) (Eq. 10);
- LIR_k = the entropy -Σ p_i log2 p_i of its label distribution (IE, Eq. 12) or its number of labels
  (LN, Eq. 13), computed on the client from its data (Eq. 11);
- β_k = (n_k / Σn) (LIS_k / ΣLIS) (LIR_k / ΣLIR) (Eq. 15);
- each layer is updated from the queue's local models θ_{l,k} = params_start_k + Δ_k (Eq. 6). Layers
  no queued client sent keep the global value exactly.

Normalisation of β (the paper's Eq. 6 is inconsistent as printed: its β do not sum to one and the
extra 1/K would shrink the model). Both readings replace 1/K by one normalisation of β:
- `normalisation='lum'` (default, the paper's layer update matrix taken literally, and the authors'
  code's normalisation to one over all queued models): the LUM row of layer l is prefilled with the
  current global layer, so a client that did not send layer l contributes the global value with its
  weight: θ_l ← Σ_k β̂_k LUM_{l,k}, β̂ = β / Σ_k β_k over all K queued models;
- `normalisation='senders'`: β renormalised over the clients that sent layer l only.

Variants (`variant`; the paper's Sec. V-B/C ablations), with `lir` choosing IE or LN:
- `aifed`: ALMU + AGMA (LIS and LIR) — AiFed-IE / AiFed-LN;
- `almu`: ALMU only: partial uploads, β_k = n_k / Σn;
- `agma`: AGMA only (full uploads, LIS and LIR) — AGMA-IE / AGMA-LN;
- `lis`: full uploads, β from n and LIS only;  `lir`: full uploads, β from n and LIR only (LIR-IE/LN).
The data-size factor n_k / Σn of Eq. 15 stays in every variant (it is not what the paper ablates).

Adaptations (where the paper is silent or ambiguous; where the authors' code decides, it is followed and
said so):
- Dissimilarity: cosine distance (the authors' code); the paper names none. Pairs are sampled among all
  valid stimulus pairs (the paper: "randomly sampling 50 pairs"), not the code's first RDM row.
- Stimuli come from the client's own training data (a client holds only its own), so a client with
  k labels has up to k·S stimuli. They and the pairs are fixed per client for the run (key
  fold_in(seed key, client)), like the paper's stimuli "selected and marked in the training dataset".
- rc_l is 0 when an RDA is constant or fewer than two valid pairs exist (no evidence of consistency).
- δ_acc = accuracy of the trained local model minus that of the received global model, by default on
  the client's stimuli (`accuracy_data='stimuli'`: the same forward passes that give the
  representations, so free), or on all its training data (`'local'`: two more passes over its data).
  The paper does not say on which data; a client has only its own. α_r̂ and α_acc are not given in the
  paper: the defaults are chosen here (see `default_config`) and should be swept.
- The server never sees an empty upload: it does not enter the queue or count toward the counter,
  and costs no bytes. Its client still returns to the pool as usual (the clock's contract).
- Timer: the strategy sees time only through `Arrival.arrival_time`, so a tick that passes between
  arrivals fires at the next arrival, aggregating the queue as it stood at the tick (arrivals exactly
  at the tick included, later ones queued for the next tick). Dispatches happen only right after
  arrivals, so the model a client receives is the same as with a free-running timer. The jitted AGMA
  step compiles once per queue length K, so a timer (K varies) compiles a few shapes early in a run.
- What a client sends (`payload['sent']`: mask, r̂, n, LIR) is what `upload_bytes` counts with the
  uploaded layers; `payload['local']` (rc_l, AT, δ_acc) stays on the client for diagnostics.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import seeding
from fedpsa_jax.strategies.base import Arrival, ClientJob, ClientSide, Strategy, register
from fedpsa_jax.strategies.common import buffer_size, section_errors
from fedpsa_jax.tree_util import tree_bytes
from fedpsa_jax.validation import integer, number, one_of

Params = Any
VARIANTS = ("aifed", "almu", "agma", "lis", "lir")
TRIGGERS = ("counter", "timer")
LIR_KINDS = ("entropy", "label_number")
NORMALISATIONS = ("lum", "senders")
ACCURACY_DATA = ("stimuli", "local")
UPLOAD_RULES = ("consistent", "changed", "rank")
RANK_LAYERS = ("all", "largest")
STALENESS_BASE = math.e / 2.0  # Eq. 10


# --- layers -----------------------------------------------------------------------------------------


def layer_names(params: Params) -> tuple[str, ...]:
  """The model's layers: the top-level groups of `params['params']`, in the model's creation order."""
  return tuple(params["params"].keys())


def layer_sizes_bytes(params: Params, names: Sequence[str]) -> np.ndarray:
  """[L] bytes of each layer's parameters (Eq. 4's g(θ_l) × U, read from shapes and dtypes)."""
  return np.array([tree_bytes(params["params"][name]) for name in names], np.int64)


# --- ALMU (client) ----------------------------------------------------------------------------------


def select_stimuli(key: jax.Array, labels: jax.Array, valid: jax.Array, num_classes: int,
                   per_class: int) -> tuple[jax.Array, jax.Array]:
  """Up to `per_class` random samples of each class among the valid positions of a client's row.

  Returns positions [C·S] into the row (slot c·S + s holds class c) and their validity [C·S] (False
  where the client has fewer than S samples of class c). Random priorities + top_k: fixed shapes."""
  priority = jax.random.uniform(key, labels.shape)  # in [0, 1)
  member = (labels[None, :] == jnp.arange(num_classes)[:, None]) & valid[None, :]
  score = jnp.where(member, priority[None, :], -1.0)
  values, positions = jax.lax.top_k(score, per_class)  # [C, S]
  return positions.reshape(-1), (values >= 0.0).reshape(-1)


def sample_pairs(key: jax.Array, stimulus_valid: jax.Array, num_pairs: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`num_pairs` distinct pairs (i < j) of valid stimuli, uniformly without replacement (top_k over random
  priorities of all Q(Q-1)/2 pairs); returns i [P], j [P] and whether each pair is real [P] (fewer valid
  pairs than P leave the rest invalid)."""
  q = stimulus_valid.shape[0]
  first, second = np.triu_indices(q, k=1)
  real = stimulus_valid[first] & stimulus_valid[second]
  score = jnp.where(real, jax.random.uniform(key, first.shape), -1.0)
  values, chosen = jax.lax.top_k(score, min(num_pairs, len(first)))
  return jnp.asarray(first)[chosen], jnp.asarray(second)[chosen], values >= 0.0


def layer_representations(apply_fn: Callable, params: Params, x: jax.Array,
                          names: Sequence[str]) -> tuple[dict[str, jax.Array], jax.Array]:
  """Each layer's output on `x`, flattened per sample ({name: [Q, D]}), and the logits."""
  logits, state = apply_fn(params, x, capture_intermediates=True, mutable=["intermediates"])
  captured = state["intermediates"]
  return {name: captured[name]["__call__"][-1].reshape(x.shape[0], -1) for name in names}, logits


def dissimilarity_array(representations: jax.Array, first: jax.Array, second: jax.Array) -> jax.Array:
  """RDA: the cosine distance 1 − cos(r_i, r_j) of each sampled pair (i, j) [P]."""
  norms = jnp.linalg.norm(representations, axis=-1, keepdims=True)
  unit = representations / jnp.maximum(norms, jnp.finfo(representations.dtype).tiny)
  return 1.0 - jnp.sum(unit[first] * unit[second], axis=-1)


def representational_consistency(rda_global: jax.Array, rda_local: jax.Array, weights: jax.Array) -> jax.Array:
  """Eq. 8: rc = (Cov(RDA_glo, RDA_loc) / (σ_glo σ_loc))², the squared Pearson correlation over the
  pairs with weight 1 (0 marks padding); 0 if either RDA is constant or fewer than two pairs are real."""
  w = weights.astype(jnp.float32)
  total = jnp.sum(w)
  safe_total = jnp.maximum(total, 1.0)
  a = rda_global - jnp.sum(w * rda_global) / safe_total
  b = rda_local - jnp.sum(w * rda_local) / safe_total
  cov, var_a, var_b = jnp.sum(w * a * b), jnp.sum(w * a * a), jnp.sum(w * b * b)
  tiny = jnp.finfo(jnp.float32).tiny
  ok = (total >= 2.0) & (var_a > tiny) & (var_b > tiny) & (var_a * var_b > tiny)
  rc = cov * cov / jnp.where(ok, var_a * var_b, 1.0)
  return jnp.where(ok, jnp.clip(rc, 0.0, 1.0), 0.0)


def adaptive_threshold(round_hat: jax.Array, delta_acc: jax.Array, alpha_round: float, alpha_acc: float) -> jax.Array:
  """Eq. 9: AT = 1 / (1 + exp(−(α_r̂ · r̂ + α_acc · δ_acc)))."""
  return jax.nn.sigmoid(alpha_round * jnp.asarray(round_hat, jnp.float32) + alpha_acc * delta_acc)


def rank_upload_mask(rc: jax.Array, window: jax.Array, ready: jax.Array,
                     key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The `rank` reading of F (the authors' code's rule, adapted to arrivals one at a time).

  rc [L] is this client's consistency per layer (Eq. 8), window [W−1, L] the last W − 1 reported rc
  vectors. Per layer, j = #{window values < rc_l} is the client's rank in the group of W (0: the least
  consistent; ties rank it lowest), and the layer is uploaded iff u_l >= (j + 1)/W, u ~ U[0, 1) from
  `key`: P(upload) = 1 − (j + 1)/W. Before the window is full (`ready` False) every layer is uploaded.
  Returns the mask [L] and P(upload) [L]."""
  group = window.shape[0] + 1
  below = jnp.sum(window < rc[None, :], axis=0)
  cut = (below + 1).astype(jnp.float32) / group  # the code's update_prob at this rank
  u = jax.random.uniform(key, rc.shape)
  mask = jnp.where(ready, u >= cut, True)
  return mask, jnp.where(ready, 1.0 - cut, 1.0)


def label_richness(counts: jax.Array, kind: str) -> jax.Array:
  """LIR from a client's label counts [C]: entropy −Σ p_i log2 p_i (IE, Eq. 12, 0 log 0 = 0) or the
  number of labels present (LN, Eq. 13)."""
  counts = counts.astype(jnp.float32)
  if kind == "label_number":
    return jnp.sum(counts > 0).astype(jnp.float32)
  p = counts / jnp.maximum(jnp.sum(counts), 1.0)
  return -jnp.sum(jnp.where(p > 0, p * jnp.log2(jnp.where(p > 0, p, 1.0)), 0.0))


def _masked_accuracy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  hits = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32) * mask
  return jnp.sum(hits) / jnp.maximum(jnp.sum(mask), 1.0)


def _local_accuracy(apply_fn, params, x_all, labels, index_row, valid, batch_size: int) -> jax.Array:
  """Accuracy over all of a client's samples, in chunks of `batch_size` (a Python loop inside jit, as
  FedPAC's statistics: bounded memory and no rolled loop around a conv net)."""
  hits = 0.0
  for start in range(0, index_row.shape[0], batch_size):
    rows = index_row[start:start + batch_size]
    logits = apply_fn(params, jnp.take(x_all, rows, axis=0))
    chunk = slice(start, start + batch_size)
    hits = hits + jnp.sum((jnp.argmax(logits, -1) == labels[chunk]) * valid[chunk])
  return hits / jnp.maximum(jnp.sum(valid), 1.0)


def almu_payload(apply_fn: Callable, names: tuple[str, ...], num_classes: int, per_class: int, num_pairs: int,
                 alpha_round: float, alpha_acc: float, use_almu: bool, accuracy_data: str, lir_kind: str,
                 batch_size: int, upload_when: str, rank_gated: tuple[bool, ...] | None, params_start: Params,
                 params_end: Params, x_all: jax.Array, y_all: jax.Array, index_row: jax.Array,
                 num_samples: jax.Array, round_hat: jax.Array, key: jax.Array, rc_window: jax.Array | None = None,
                 window_ready: jax.Array | None = None,
                 upload_key: jax.Array | None = None) -> dict[str, dict[str, jax.Array]]:
  """The client's upload decision (ALMU, Algorithm 1 lines 2-9) and LIR (Eq. 11), pure and jittable
  (every argument before `params_start` is static). `payload['sent']` is what goes to the server.

  `upload_when='rank'` needs the server's window of rc reports as dispatched (`rc_window` [W−1, L],
  `window_ready`) and the update's own key (`upload_key`); `rank_gated` [L] marks the layers the rule
  decides (the others are always sent) and the client reports its rc in `sent`."""
  valid = jnp.arange(index_row.shape[0]) < num_samples
  labels = jnp.take(y_all, index_row)
  counts = jnp.sum(jax.nn.one_hot(labels, num_classes, dtype=jnp.float32) * valid[:, None], axis=0)
  lir = label_richness(counts, lir_kind)
  num_layers = len(names)
  if not use_almu:
    mask = jnp.ones((num_layers,), bool)
    local = {"rc": jnp.ones((num_layers,), jnp.float32), "threshold": jnp.float32(0.0),
             "delta_acc": jnp.float32(0.0)}
  else:
    stimulus_key, pair_key = jax.random.split(key)
    positions, stimulus_valid = select_stimuli(stimulus_key, labels, valid, num_classes,
                                               min(per_class, index_row.shape[0]))
    x = jnp.take(x_all, jnp.take(index_row, positions), axis=0)
    y = jnp.take(labels, positions)
    reps_global, logits_global = layer_representations(apply_fn, params_start, x, names)
    reps_local, logits_local = layer_representations(apply_fn, params_end, x, names)
    first, second, pair_valid = sample_pairs(pair_key, stimulus_valid, num_pairs)
    rc = jnp.stack([representational_consistency(dissimilarity_array(reps_global[n], first, second),
                                                 dissimilarity_array(reps_local[n], first, second), pair_valid)
                    for n in names])
    if accuracy_data == "stimuli":
      stimulus_mask = stimulus_valid.astype(jnp.float32)
      delta_acc = (_masked_accuracy(logits_local, y, stimulus_mask)
                   - _masked_accuracy(logits_global, y, stimulus_mask))
    else:
      local_acc = functools.partial(_local_accuracy, apply_fn, x_all=x_all, labels=labels, index_row=index_row,
                                    valid=valid.astype(jnp.float32), batch_size=batch_size)
      delta_acc = local_acc(params_end) - local_acc(params_start)
    threshold = adaptive_threshold(round_hat, delta_acc, alpha_round, alpha_acc)
    local = {"rc": rc, "threshold": threshold, "delta_acc": delta_acc}
    if upload_when == "rank":
      ranked, probability = rank_upload_mask(rc, rc_window, window_ready, upload_key)
      gated = jnp.asarray(rank_gated, bool)
      mask = jnp.where(gated, ranked, True)
      local["upload_probability"] = jnp.where(gated, probability, 1.0)
    else:
      mask = rc >= threshold if upload_when == "consistent" else rc < threshold
  sent = {"mask": mask, "round": jnp.asarray(round_hat, jnp.int32), "num_samples": jnp.asarray(num_samples, jnp.int32),
          "lir": lir}
  if use_almu and upload_when == "rank":
    sent["rc"] = local["rc"]  # the report the server's window is made of
  return {"sent": sent, "local": local}


# One compiled program per model and setting in a process, which all its runs share (a sweep's members, a notebook's
# runs): the arguments before the parameters are static, `apply_fn` the model's `apply`, equal across runs
# (models.get_model).
_compiled_payload = jax.jit(almu_payload, static_argnames=(
    "apply_fn", "names", "num_classes", "per_class", "num_pairs", "alpha_round", "alpha_acc", "use_almu",
    "accuracy_data", "lir_kind", "batch_size", "upload_when", "rank_gated"))


# --- AGMA (server) ----------------------------------------------------------------------------------


def staleness_level(current_round: jax.Array | int, rounds_hat: jax.Array) -> jax.Array:
  """Eq. 10: LIS_k = (e/2)^(−(r − r̂_k))."""
  return STALENESS_BASE ** -(jnp.asarray(current_round, jnp.float32) - jnp.asarray(rounds_hat, jnp.float32))


def _share(values: jax.Array) -> jax.Array:
  """values / Σ values, or uniform if they sum to 0 (e.g. every queued client holds a single label: IE = 0)."""
  total = jnp.sum(values)
  return jnp.where(total > 0, values / jnp.where(total > 0, total, 1.0), 1.0 / values.shape[0])


def aggregation_weights(sizes: jax.Array, lis: jax.Array, lir: jax.Array, use_lis: bool = True,
                        use_lir: bool = True) -> jax.Array:
  """Eq. 15: β_k = (n_k / Σn) (LIS_k / ΣLIS) (LIR_k / ΣLIR); a switched-off factor is left out."""
  beta = _share(jnp.asarray(sizes, jnp.float32))
  if use_lis:
    beta = beta * _share(jnp.asarray(lis, jnp.float32))
  if use_lir:
    beta = beta * _share(jnp.asarray(lir, jnp.float32))
  return beta


@functools.partial(jax.jit, static_argnames=("names", "senders_only"))
def layerwise_update(params: Params, starts: tuple, deltas: tuple, masks: jax.Array, beta: jax.Array,
                     names: tuple[str, ...], senders_only: bool) -> Params:
  """Eq. 6, layer by layer: θ_l ← Σ_k c_{l,k} θ_{l,k} + c_{l,g} θ_l with θ_{l,k} = start_k + Δ_k.

  `masks` [K, L] (1: client k sent layer l), `beta` [K] the Eq. 15 weights. `senders_only=False` (the
  LUM reading): c_{l,k} = m_{kl} β_k / Σβ and c_{l,g} = Σ_k (1 − m_{kl}) β_k / Σβ; True: c_{l,k} =
  m_{kl} β_k / Σ_j m_{jl} β_j, c_{l,g} = 0. A layer no client sent keeps its value exactly."""
  masks = masks.astype(jnp.float32)
  beta = beta.astype(jnp.float32)
  layers = dict(params["params"])
  for index, name in enumerate(names):
    sent = masks[:, index]
    weighted = beta * sent
    if senders_only:
      coeff = weighted / jnp.maximum(jnp.sum(weighted), jnp.finfo(jnp.float32).tiny)
      keep = jnp.float32(0.0)
    else:
      coeff = weighted / jnp.sum(beta)
      keep = jnp.sum(beta * (1.0 - sent)) / jnp.sum(beta)
    anyone = jnp.sum(sent) > 0

    def update(g, *pieces, coeff=coeff, keep=keep, anyone=anyone):
      k = len(pieces) // 2
      mixed = keep * g + sum(coeff[i] * (pieces[i] + pieces[k + i]) for i in range(k))
      return jnp.where(anyone, mixed, g)

    layers[name] = jax.tree.map(update, params["params"][name], *[s["params"][name] for s in starts],
                                *[d["params"][name] for d in deltas])
  return {**params, "params": layers}


@functools.partial(jax.jit, static_argnames=("names", "senders_only", "use_lis", "use_lir"))
def agma_step(params: Params, starts: tuple, deltas: tuple, masks: tuple, lirs: tuple, sizes: jax.Array,
              rounds_hat: jax.Array, current_round: jax.Array, names: tuple[str, ...], senders_only: bool,
              use_lis: bool, use_lir: bool) -> tuple[Params, jax.Array]:
  """One AGMA round on the queue: β (Eqs. 10-15) and the layer-wise update (Eq. 6); returns the new
  parameters and β / Σβ."""
  lis = staleness_level(current_round, rounds_hat)
  beta = aggregation_weights(sizes, lis, jnp.stack(lirs), use_lis, use_lir)
  new = layerwise_update(params, starts, deltas, jnp.stack(masks).astype(jnp.float32), beta, names, senders_only)
  return new, beta / jnp.sum(beta)


@flax.struct.dataclass
class AiFedState:
  params: Params
  starts: tuple = ()  # queued θ_start_k (the global model client k started from)
  deltas: tuple = ()  # queued Δ_k (only the layers in its mask are used)
  masks: tuple = ()  # queued upload masks [L] (device bools)
  lirs: tuple = ()  # queued LIR_k (device scalars)
  last_weights: jax.Array | None = None  # β / Σβ of the last aggregation (diagnostics)
  # upload_when='rank': the last W − 1 reported rc vectors [W−1, L], a ring buffer (report i at row
  # i mod (W − 1)); None under the other rules.
  rc_window: jax.Array | None = None
  # Host fields: the queue's metadata and the run's upload counts.
  rounds_hat: tuple = flax.struct.field(pytree_node=False, default=())  # r̂_k
  sizes: tuple = flax.struct.field(pytree_node=False, default=())  # n_k
  round: int = flax.struct.field(pytree_node=False, default=0)  # aggregations so far (= the runner's round)
  next_tick: int = flax.struct.field(pytree_node=False, default=0)  # timer: the next aggregation time
  arrivals: int = flax.struct.field(pytree_node=False, default=0)  # updates received (empty ones included)
  empty_uploads: int = flax.struct.field(pytree_node=False, default=0)  # clients that sent no layer
  layer_uploads: tuple = flax.struct.field(pytree_node=False, default=())  # per layer: times it was sent


@register("aifed")
class AiFed(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.variant = "aifed"  # aifed (ALMU + AGMA) | almu (ALMU only) | agma (LIS + LIR) | lis | lir (LIS or LIR only)
    c.lir = "entropy"  # LIR function: entropy (IE, Eq. 12) | label_number (LN, Eq. 13)
    c.stimuli_per_class = 5  # S: stimuli per class from the client's training data (paper: 5 on 10 classes)
    c.num_pairs = 50  # stimulus pairs sampled for each RDA (paper: 50)
    # Eq. 9's coefficients (the paper gives no values): AT = sigmoid(α_r̂ r̂ + α_acc δ_acc). With 0 and 0,
    # AT = 0.5; α_r̂ > 0 raises the bar as rounds pass (fewer uploads late: AT ≈ 0.6 at round 100 and
    # ≈ 0.85 at the paper's round 400 when δ_acc = 0), α_acc < 0 lowers it for a client whose training
    # gained accuracy (its news is worth sending). The rc_l the smoke run saw: docs/methods.md.
    c.alpha_round = 0.005
    c.alpha_acc = -1.0  # α_acc of the same (negative: a client that gained accuracy sends sooner)
    # Which layers a client uploads (F): rank (the authors' code: with probability 1 − (j+1)/W, j the rank of
    # rc_l among the last W reports, 0 = least consistent; AT unused; the reading that gives the paper's saving)
    # | consistent (rc_l >= AT, Eqs. 8-9 as printed) | changed (rc_l < AT). docs/methods.md compares them.
    c.upload_when = "rank"
    c.rank_window = 8  # rank: W, the group rc_l is ranked in (the code's m = 8 clients of a round, 40 × 0.2)
    c.rank_layers = "all"  # rank: the layers it decides: all (each by its own rank) | largest (the code's; others sent)
    c.accuracy_data = "stimuli"  # δ_acc measured on: stimuli (free) | local (all the client's training data)
    c.accuracy_batch_size = 500  # accuracy_data=local: samples per forward pass (memory only)
    c.trigger = "counter"  # aggregate on a counter (buffer_size models queued) | timer (every `period` units)
    c.buffer_size = 5  # counter: K, models in the queue that trigger an aggregation
    c.period = 100  # timer: virtual time units between aggregations
    c.normalisation = "lum"  # β in Eq. 6: lum (non-senders contribute the global layer) | senders
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    options = (("variant", VARIANTS), ("lir", LIR_KINDS), ("trigger", TRIGGERS), ("normalisation", NORMALISATIONS),
               ("accuracy_data", ACCURACY_DATA), ("upload_when", UPLOAD_RULES), ("rank_layers", RANK_LAYERS))
    counts = ("stimuli_per_class", "num_pairs", "period", "accuracy_batch_size")
    return section_errors(config, "aifed", (
        *((field, one_of(allowed)) for field, allowed in options), *((field, integer(ge=1)) for field in counts),
        # A group of one has no rank (every client would be the most consistent).
        ("rank_window", integer(ge=2)),
        ("alpha_round", number()), ("alpha_acc", number()),  # Eq. 9's coefficients: any sign, finite
        ("buffer_size", buffer_size(config))))

  def __init__(self, hparams, ctx):
    super().__init__(hparams, ctx)
    h = self.hparams
    self.use_almu = h.variant in ("aifed", "almu")
    self.use_lis = h.variant in ("aifed", "agma", "lis")
    self.use_lir = h.variant in ("aifed", "agma", "lir")
    self._key = seeding.device_key(ctx.seed, "aifed/stimuli")
    # The rank rule's coin flips: their own stream, so that they never move the stimuli or pairs.
    self._upload_key = seeding.device_key(ctx.seed, "aifed/upload")
    self.ranked = self.use_almu and h.upload_when == "rank"
    params = ctx.params_shape
    if set(params) != {"params"}:
      raise ValueError(f"AiFed aggregates the 'params' collection layer by layer; this model also has "
                       f"{sorted(set(params) - {'params'})}")
    self._names = layer_names(params)
    self._layer_bytes = layer_sizes_bytes(params, self._names)
    gated = None
    if self.ranked:
      largest = int(np.argmax(self._layer_bytes))
      gated = tuple(h.rank_layers == "all" or l == largest for l in range(len(self._names)))
    self._payload = functools.partial(
        _compiled_payload, self.ctx.apply_fn, self._names, self.ctx.num_classes, int(h.stimuli_per_class),
        int(h.num_pairs), float(h.alpha_round), float(h.alpha_acc), self.use_almu, h.accuracy_data, h.lir,
        int(h.accuracy_batch_size), h.upload_when, gated)
    self.client = ClientSide(payload=self._client_payload)

  def init(self, params: Params) -> AiFedState:
    h = self.hparams
    window = jnp.zeros((int(h.rank_window) - 1, len(self._names)), jnp.float32) if self.ranked else None
    return AiFedState(params=params, next_tick=int(h.period), layer_uploads=(0,) * len(self._names),
                      rc_window=window)

  @property
  def layers(self) -> tuple[str, ...]:
    """The layer names, in the order of the masks."""
    return self._names

  def dispatch(self, state: AiFedState, client: int) -> tuple[AiFedState, Params, Any]:
    """The global model and, as aux, r̂: the round of the global model the client is dispatched with
    (Algorithm 1 sends it back). The rank reading also sends the server's window of rc reports and how many
    reports it has received (which says whether the window is full and makes the update's key unique)."""
    del client
    if not self.ranked:
      return state, state.params, jnp.int32(state.round)
    return state, state.params, {"round": jnp.int32(state.round), "rc_window": state.rc_window,
                                 "reports": jnp.int32(state.arrivals)}

  def _client_payload(self, params_start: Params, params_end: Params, job: ClientJob | None = None) -> dict:
    if job is None:
      raise ValueError("AiFed's client payload needs the client's data (a ClientJob)")
    aux = job.aux
    rank_args = ()
    if self.ranked:
      if not isinstance(aux, dict):  # (dispatched without the window, e.g. a hand-made job: send everything)
        aux = {"round": jnp.int32(0) if isinstance(aux, tuple) else aux,
               "rc_window": jnp.zeros((int(self.hparams.rank_window) - 1, len(self._names)), jnp.float32),
               "reports": jnp.int32(0)}
      reports = jnp.asarray(aux["reports"], jnp.int32)
      rank_args = (aux["rc_window"], reports >= aux["rc_window"].shape[0],
                   jax.random.fold_in(jax.random.fold_in(self._upload_key, job.client), reports))
      round_hat = aux["round"]
    else:
      round_hat = aux if not isinstance(aux, tuple) else jnp.int32(0)
    data = job.data
    return self._payload(params_start, params_end, data.x_all, data.y_all, data.index_row, jnp.int32(data.num_samples),
                         round_hat, jax.random.fold_in(self._key, job.client), *rank_args)

  # --- server ---------------------------------------------------------------------------------------

  def _enqueue(self, state: AiFedState, arrivals: Sequence[Arrival]) -> AiFedState:
    starts, deltas, masks, lirs = list(state.starts), list(state.deltas), list(state.masks), list(state.lirs)
    rounds_hat, sizes = list(state.rounds_hat), list(state.sizes)
    uploads, empty = list(state.layer_uploads), state.empty_uploads
    window = state.rc_window
    for index, a in enumerate(arrivals):
      if self.ranked:  # every update reports its rc, sent layers or not: the next dispatches rank against it
        window = window.at[(state.arrivals + index) % window.shape[0]].set(a.payload["sent"]["rc"])
      mask = a.payload["sent"]["mask"]
      host_mask = np.asarray(jax.device_get(mask), bool)  # the host decides: is anything sent at all?
      uploads = [u + int(m) for u, m in zip(uploads, host_mask)]
      if not host_mask.any():
        empty += 1  # nothing was sent: the server never sees this update
        continue
      starts.append(a.params_start)
      deltas.append(a.delta)
      masks.append(mask)
      lirs.append(a.payload["sent"]["lir"])
      rounds_hat.append(a.dispatch_round)
      sizes.append(a.num_samples)
    return state.replace(starts=tuple(starts), deltas=tuple(deltas), masks=tuple(masks), lirs=tuple(lirs),
                         rounds_hat=tuple(rounds_hat), sizes=tuple(sizes), layer_uploads=tuple(uploads),
                         empty_uploads=empty, arrivals=state.arrivals + len(arrivals), rc_window=window)

  def aggregate(self, state: AiFedState) -> AiFedState:
    """One round of AGMA on the whole queue (Algorithm 1 part 2, lines 4-11); the queue is emptied."""
    current = state.round + 1  # "increasing the global round to r" comes first
    params, weights = agma_step(
        state.params, state.starts, state.deltas, state.masks, state.lirs, jnp.asarray(state.sizes, jnp.float32),
        jnp.asarray(state.rounds_hat, jnp.float32), jnp.float32(current), names=self._names,
        senders_only=self.hparams.normalisation == "senders", use_lis=self.use_lis, use_lir=self.use_lir)
    return state.replace(params=params, starts=(), deltas=(), masks=(), lirs=(), rounds_hat=(), sizes=(),
                         round=current, last_weights=weights)

  def receive(self, state: AiFedState, arrivals: Sequence[Arrival]) -> tuple[AiFedState, bool]:
    h = self.hparams
    if h.trigger == "counter":
      state = self._enqueue(state, arrivals)
      if len(state.starts) >= h.buffer_size:
        return self.aggregate(state), True
      return state, False
    # Timer: arrivals share one time t; the tick at or before t fires on the queue as it stood then.
    t = arrivals[0].arrival_time if arrivals else 0
    if t < state.next_tick:
      return self._enqueue(state, arrivals), False
    next_tick = (t // h.period + 1) * h.period
    if t == state.next_tick:
      state = self._enqueue(state, arrivals)
      if not state.starts:
        return state.replace(next_tick=next_tick), False
      return self.aggregate(state).replace(next_tick=next_tick), True
    changed = bool(state.starts)
    if changed:
      state = self.aggregate(state)
    return self._enqueue(state, arrivals).replace(next_tick=next_tick), changed

  # --- accounting and diagnostics -------------------------------------------------------------------

  def upload_bytes(self, arrival: Arrival) -> int:
    """The layers in the client's mask plus what it sends beside them (mask, r̂, n and LIR, not the local
    diagnostics); 0 when it sent no layer (Eq. 4 with F), or
    under the rank reading only its rc report."""
    mask = np.asarray(jax.device_get(arrival.payload["sent"]["mask"]), bool)
    if not mask.any():
      return tree_bytes(arrival.payload["sent"]["rc"]) if self.ranked else 0
    return int(self._layer_bytes[mask].sum()) + tree_bytes(arrival.payload["sent"])

  def diagnostics(self, state: AiFedState) -> dict[str, Any]:
    sent = np.asarray(state.layer_uploads, np.float64)
    out: dict[str, Any] = {"queue": len(state.starts), "empty_uploads": state.empty_uploads}
    if state.arrivals:
      out["layer_upload_fraction"] = float(sent.sum() / (state.arrivals * len(sent)))
      out["byte_upload_fraction"] = float(sent @ self._layer_bytes / (state.arrivals * self._layer_bytes.sum()))
      out["layer_upload_rate"] = {name: float(s / state.arrivals) for name, s in zip(self._names, sent)}
    if state.last_weights is not None:
      out["weights"] = [float(w) for w in jax.device_get(state.last_weights)]
    return out

  def event_records(self, state: AiFedState, arrivals: Sequence[Arrival]) -> list[dict[str, Any]]:
    out = []
    for a in arrivals:
      payload = jax.device_get(a.payload)
      out.append({"rc": [float(r) for r in payload["local"]["rc"]], "threshold": float(payload["local"]["threshold"]),
                  "delta_acc": float(payload["local"]["delta_acc"]),
                  "mask": [bool(m) for m in payload["sent"]["mask"]], "lir": float(payload["sent"]["lir"]),
                  "upload_bytes": self.upload_bytes(a)})
      if "upload_probability" in payload["local"]:
        out[-1]["upload_probability"] = [float(p) for p in payload["local"]["upload_probability"]]
    return out
