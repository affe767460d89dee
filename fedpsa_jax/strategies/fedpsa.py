"""FedPSA (Algorithm 1): behavioral staleness from parameter-sensitivity sketches, temperature-scaled.

Client (after local training, at the *trained* parameters θ): the Eq. 8 sensitivity
s = |g ⊙ θ − ½ F ⊙ θ²| on the shared calibration batch D_b (g: mean gradient, F: empirical Fisher
diagonal from per-sample gradients, Eq. 6), sketched as s̃ = R s with one R ∈ R^{k×d}, entries
N(0, 1/k), for the whole run (Eq. 11). It sends (Δ, s̃).

Server (Algorithm 1 as written, per arrival): κ = cos(s̃_i, s̃_g) (Eq. 12), s̃_g the sketch of the current
global model (computed once per round, cached in the state); (Δ, κ) enters the buffer; m = ||Δ||² (Eq. 16) enters
the thermometer queue Q of length L_q (oldest dropped). M0 = mean(Q) when Q first fills;
Temp = (M_cur / M0) γ + δ (Eqs. 17-18). When the buffer holds at least L_s updates:
weights = softmax(κ / Temp) (Eq. 19) — uniform 1/|buffer| while Q has never been full — and
w ← w + Σ weight_i Δ_i (Eq. 20); the buffer is cleared.

How it runs: two jitted calls per round, however many updates arrive. s̃_g changes only at a flush, so every
κ of a round is taken against the same sketch; Q, M0 and Temp are read only at the flush (Temp as left by the
round's last push). So a receive without a flush only appends (Δ_i, s̃_i) to the buffer, with no device work,
and the flush computes, in arrival order, every κ_i and m_i, the queue pushes, M0 if the queue fills this
round, Temp, the weights and the new w (`_aggregate`), then the new w's sketch s̃_g with the clients' sketch
function (`sensitivity.sketch_of`). The sketch is not part of `_aggregate` because that compiles once per buffer
length: with the Fisher pass inside, every length would compile it again; on its own it compiles once, for
clients and server alike (docs/performance.md, "FedPSA's cost").
The aggregation is that of the per-arrival description (same queue, M0 and Temp at each flush); what
differs is what the state shows between flushes: `queue`, `queue_count`, `m0` and `temperature` (and so
`diagnostics`' thermometer) are those of the last flush. `event_records` (events.jsonl only) takes a flush's
κ_i and m_i from the state (`last_kappas`, `last_norms`) and computes those of updates still buffered in
one small call; it and `diagnostics` return device arrays, which the runner reads when it writes them.

Ablations (the paper's Table 6, Sec. 6.4), and how they are read here. The paper names what each removes
but not what replaces it; these readings are ours:
- `no_temperature` ("w/o T"): no thermometer; Temp is fixed and softmax weighting (Eq. 19) applies from
  the first flush (there is no queue whose filling could switch it on). The fixed value is γ + δ (the Temp of
  Eq. 18 at M_cur = M0; 5.5 with the paper's γ = 5, δ = 0.5) unless `fixed_temperature` sets another. At 5.5
  the softmax is nearly uniform: two weights differ by the factor e^((κ_i − κ_j)/5.5), and κ ∈ [−1, 1], so by
  at most e^(2/5.5) ≈ 1.44.
- `no_sensitivity` ("w/o S"): κ from sketches of the raw parameters (R θ) instead of their sensitivities.
  A client's parameters and the global model's are close (||Δ|| ≪ ||θ||), so κ ≈ 1 for every client and
  the weights are nearly uniform at any Temp. "w/o T&S" is both switches, nearly uniform too.
So under this reading all three variants sit near FedBuff's uniform buffer mean (without its staleness
discount), while the paper's Table 6 shows large gaps between them (non-IID, p = 0.1: w/o T 53.30, w/o T&S
44.08). A sharper fixed Temp (e.g. δ or 1) is the other plausible reading of "w/o T":
`configs/paper/table6.py:temps` adds those members beside the paper's, so that one can see which reading
reproduces the gaps.
The projection (not an ablation, an option): `projection='count_sketch'` puts a CountSketch in R's place
(`sensitivity.count_sketch_projection`: one random row and sign per parameter): the same k-dimensional sketch of
the same inner products, unbiased, held in 8 bytes per parameter instead of 4k. The paper's Gaussian R is the
default.
Arrivals of one event time enter the buffer together (so a flush may hold more than L_s, as in FLGo's
FedBuff on which FedPSA builds).

The step (a control, not the paper's): Eq. 20's weights sum to 1, while FedBuff's, (1 + τ_i)^(-1/2) / B, sum to
less once an update is stale, so FedPSA differs from FedBuff both in the shape of its weights (κ) and in the size
of its step. `step='staleness'` scales the Eq. 19 weights to FedBuff's sum for the same buffer,
(1/B) Σ_i (1 + τ_i)^(-1/2), keeping their shape: FedPSA − this variant is the step alone, this variant − FedBuff
the shape alone (docs/methods.md, "Shape and step"). The default, `unit`, is Eq. 20.
The server step (not the paper's, which has none): `server_lr` = η multiplies Eq. 20's update,
w ← w + η Σ_i weight_i Δ_i, as FedBuff's η multiplies its own; a buffer's effective step is η × Σ_i weight_i. The
default, 1.0, is Eq. 20 exactly (the same bits).

κ-alignment (Sec. 6.6, Eqs. 21-22), a diagnostic for the paper's Fig. 6, off by default
(`fedpsa.log_alignment`): for each received update, align = cos(g_client, g_server) with
g = ∇ mean cross-entropy on a fixed held-out test batch (`StrategyContext.sample`, stream 'alignment'), at the
client's trained model w_start + Δ and at the server's global model when the update arrives (before the
flush it may trigger: the model κ compares against). It goes to events.jsonl beside κ; it never changes
the aggregation.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax
import jax
import jax.flatten_util
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedpsa_jax import seeding, sensitivity
from fedpsa_jax.choices import CALIBRATION_KINDS
from fedpsa_jax.data.calibration import gaussian_batch
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.strategies.base import Arrival, ClientSide, Strategy, register
from fedpsa_jax.strategies.common import STEPS, buffer_size, section_errors, staleness_step
from fedpsa_jax.tree_util import squared_norm, tree_add_scaled
from fedpsa_jax.validation import boolean, error, integer, is_number, number, one_of

Params = Any
# Memory bounds, known before any work (an out-of-memory error would come only once the strategy is built or
# the first client returns): D_b is held whole and every client's sensitivity is computed on all of it; R is a
# sketch_dim x d float32 matrix (d: the model's parameters), bounded by MAX_SKETCH_DIM alone and, once the
# model is known (`bound_errors`), by MAX_PROJECTION_BYTES.
MAX_CALIBRATION_SIZE = 65_536
MAX_SKETCH_DIM = 4096
MAX_PROJECTION_BYTES = 2**30
PROJECTIONS = ("gaussian", "count_sketch")  # `projection`: Eq. 11's R, or a CountSketch in its place


@flax.struct.dataclass
class FedPSAState:
  params: Params
  global_sketch: jax.Array  # s̃_g of the current global model (Eq. 11), refreshed after each round
  # The thermometer as of the last flush (the pushes of buffered updates happen at the next one):
  queue: jax.Array  # [L_q] ring buffer of recent ||Δ||² (Eq. 16)
  m0: jax.Array  # M0: the queue's mean when it first filled (0 before)
  temperature: jax.Array  # Temp (Eq. 18) of the last flush (the initial or fixed Temp before one)
  deltas: tuple = ()  # buffered Δ_i
  sketches: tuple = ()  # buffered client sketches s̃_i (their κ is computed at the flush)
  staleness: tuple = flax.struct.field(pytree_node=False, default=())  # host ints τ_i (step='staleness' only)
  queue_count: int = flax.struct.field(pytree_node=False, default=0)  # pushes up to the last flush (host)
  last_kappas: jax.Array | None = None  # κ of the last flush (diagnostics)
  last_weights: jax.Array | None = None  # weights of the last flush (diagnostics)
  last_norms: jax.Array | None = None  # m_i = ||Δ_i||² of the last flush (event records)
  last_alignments: jax.Array | None = None  # align_i of the last receive's arrivals (log_alignment only)


def temperature(queue: jax.Array, m0: jax.Array, gamma: float, delta: float) -> jax.Array:
  """Eqs. 17-18: Temp = (M_cur / M0) γ + δ with M_cur the mean of the (full) queue."""
  return jnp.mean(queue) / jnp.maximum(m0, jnp.finfo(jnp.float32).tiny) * gamma + delta  # M0 = 0 only if every Δ was 0


def fixed_temperature(hparams: ml_collections.ConfigDict) -> float:
  """The Temp of the "w/o T" ablation (`no_temperature`): `fixed_temperature` when > 0, else γ + δ (the value of
  Eq. 18 at M_cur = M0, our reading of the paper; see the module docstring)."""
  fixed = hparams.fixed_temperature
  return float(fixed) if fixed > 0 else float(hparams.gamma + hparams.delta)


def flush_weights(kappas: jax.Array, temp: jax.Array, use_softmax: jax.Array) -> jax.Array:
  """Eq. 19: softmax(κ / Temp) over the buffer, or uniform weights (exactly 1/n: the softmax of zeros) before
  the thermometer is ready. `use_softmax` is traced, so that both phases share one compiled round."""
  return jax.nn.softmax(jnp.where(use_softmax, kappas / temp, 0.0))


def _kappas_and_norms(sketches: Sequence[jax.Array], deltas: Sequence[Params],
                      global_sketch: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[n] κ_i = cos(s̃_i, s̃_g) (Eq. 12) and [n] m_i = ||Δ_i||² (Eq. 16), in arrival order."""
  kappas = sensitivity.cosine_similarity(jnp.stack(sketches), global_sketch)
  return kappas, jnp.stack([squared_norm(d) for d in deltas])


def _push(queue: jax.Array, m0: jax.Array, norms: jax.Array, start: jax.Array,
          fill_index: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The thermometer after pushing `norms` one by one at ring positions start, start + 1, ... (Eq. 16), and
  M0 = mean(Q) taken right after push number `fill_index` (the L_q-th push of the run; −1: not this round).

  One push at a time (not one scatter): a round may push more than L_q values, whose ring positions repeat,
  and the later must win."""
  length = queue.shape[0]
  for i in range(norms.shape[0]):
    queue = queue.at[(start + i) % length].set(norms[i])
    m0 = jnp.where(fill_index == i, jnp.mean(queue), m0)  # Algorithm 1 line 20: M0 fixed at the first fill
  return queue, m0


@functools.partial(jax.jit, static_argnames=("gamma", "delta"))
def _aggregate(params: Params, deltas: tuple, sketches: tuple, global_sketch: jax.Array, queue: jax.Array,
               m0: jax.Array, temp: jax.Array, start: jax.Array, fill_index: jax.Array, queue_full: jax.Array,
               use_softmax: jax.Array, step: jax.Array, *, gamma: float, delta: float) -> dict[str, Any]:
  """A FedPSA round's aggregation in one compiled call: Eqs. 12 and 16 for every buffered update (in arrival
  order), the queue pushes and M0, Temp (Eq. 18, when `queue_full`; otherwise `temp` stays), the weights
  (Eq. 19, times `step`: 1 for Eq. 20) and the new global model (Eq. 20). (Its sketch s̃_g is the flush's second
  call.)

  The ring position `start`, `fill_index`, the switches and `step` are traced, so the call compiles once per
  buffer length."""
  kappas, norms = _kappas_and_norms(sketches, deltas, global_sketch)
  queue, m0 = _push(queue, m0, norms, start, fill_index)
  temp = jnp.where(queue_full, temperature(queue, m0, gamma, delta), temp)
  weights = flush_weights(kappas, temp, use_softmax) * step
  params = tree_add_scaled(params, deltas, weights)
  return {"params": params, "queue": queue, "m0": m0, "temperature": temp, "last_kappas": kappas,
          "last_weights": weights, "last_norms": norms}


def _entries(vectors: Sequence[jax.Array], count: int) -> tuple[tuple[jax.Array, ...], ...]:
  """The last `count` entries of each 1-D array, as 0-d arrays (one per arrival, for its event record)."""
  return tuple(tuple(v[v.shape[0] - count + i] for i in range(count)) for v in vectors)


_last_entries = jax.jit(_entries, static_argnums=1)


@jax.jit
def _observe(sketches: tuple, deltas: tuple, global_sketch: jax.Array, extra: tuple) -> tuple:
  """κ_i and m_i (Eqs. 12, 16) of updates still in the buffer, with the entries of `extra` (alignments), one 0-d
  array per arrival: what `event_records` reports before the flush that will compute them again."""
  return _entries((*_kappas_and_norms(sketches, deltas, global_sketch), *extra), len(sketches))


def make_alignment_fn(apply_fn, x: jax.Array, y: jax.Array):
  """`align(server_params, params_start, deltas) -> [n]`: Eq. 22's cos(g_client_i, g_server) for each
  client model params_start_i + Δ_i, with Eq. 21's gradients of the mean cross-entropy on (x, y)."""

  def flat_grad(params):
    return jax.flatten_util.ravel_pytree(sensitivity.mean_gradient(apply_fn, params, x, y))[0]

  @jax.jit
  def align(server_params, starts, deltas):
    g_server = flat_grad(server_params)
    return jnp.stack([sensitivity.cosine_similarity(flat_grad(jax.tree.map(jnp.add, s, d)), g_server)
                      for s, d in zip(starts, deltas)])

  return align


def calibration_batch(ctx, kind: str, size: int) -> tuple[jax.Array, jax.Array]:
  """The shared calibration batch D_b (Sec. 5.2), drawn once per run from the host stream 'calibration':
  `gaussian` inputs and labels (no client data), or `real` training samples (at most the training set:
  `bound_errors` checks it before any work)."""
  if kind == "real":
    return ctx.sample("train", size, "calibration")
  x, y = gaussian_batch(size, ctx.input_shape, ctx.num_classes, seeding.host_rng(ctx.seed, "calibration"))
  return jnp.asarray(x), jnp.asarray(y)


def bound_errors(hparams: ml_collections.ConfigDict, num_params: int, train_size: int, model: str = "") -> list[str]:
  """The bounds that only the model and the data show: the projection R (`sketch_dim` x `num_params` float32)
  must fit in MAX_PROJECTION_BYTES, and a `real` calibration batch is drawn from the training samples. `model`
  names the model in the message."""
  errors = []
  k, limit = hparams.sketch_dim, max(1, MAX_PROJECTION_BYTES // (4 * num_params))
  if k > limit and hparams.projection == "gaussian":  # (a CountSketch holds 8 bytes per parameter, whatever k)
    errors.append(error("fedpsa.sketch_dim", k, f"an integer in [1, {limit}] with model.name={model!r} "
                        f"({num_params:,} parameters): the projection R of sketch_dim x parameters float32 must fit in "
                        f"{MAX_PROJECTION_BYTES // 2**30} GiB"))
  if hparams.calibration == "real" and hparams.calibration_size > train_size:
    errors.append(error("fedpsa.calibration_size", hparams.calibration_size,
                        f"an integer in [1, {train_size}] with fedpsa.calibration='real' (a batch drawn from the "
                        f"{train_size} training samples)"))
  return errors


@register("fedpsa")
class FedPSA(Strategy):

  @classmethod
  def default_config(cls) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.buffer_size = 5  # L_s: flush when the buffer holds at least this many updates
    c.queue_length = 50  # L_q: length of the training thermometer's queue
    c.gamma = 5.0  # γ of Temp = (M_cur / M0) γ + δ
    c.delta = 0.5  # δ of the same
    # Ablation "w/o T": no thermometer, Temp fixed (at γ + δ = 5.5 by default: a nearly uniform softmax; see the
    # module docstring for this reading and the others)
    c.no_temperature = False
    # The fixed Temp of "w/o T" (only with no_temperature=True): 0 means γ + δ (our reading of the paper); any
    # other value > 0 is used as Temp itself (e.g. δ or 1: the sharper readings in configs/paper/table6.py:temps)
    c.fixed_temperature = 0.0
    # Ablation "w/o S": κ from sketches of the raw parameters (R θ), ≈ 1 for every client, so the weights are
    # nearly uniform; with no_temperature=True this is "w/o T&S"
    c.no_sensitivity = False
    c.calibration = "gaussian"  # the shared calibration batch D_b: gaussian (synthetic) | real (training samples)
    c.calibration_size = 32  # |D_b| (Table 5 tries 16-512)
    c.sketch_dim = 16  # k, rows of the random projection R (Eq. 11)
    # R itself: gaussian (the paper's: k x parameters float32 entries N(0, 1/k), held in memory) | count_sketch
    # (not the paper's: one random row and sign per parameter, 8 bytes per parameter held, an unbiased sketch of
    # the same inner products; docs/performance.md, "FedPSA's cost")
    c.projection = "gaussian"
    # The sum of the weights: unit (1, Eq. 20) | staleness (not the paper's: the Eq. 19 weights scaled to FedBuff's
    # step for the same buffer, (1/B) Σ_i (1 + τ_i)^(-1/2); a control that separates κ's shape from the step)
    c.step = "unit"
    # η, the server step size (not the paper's: Eq. 20 is η = 1): the update is η Σ_i weight_i Δ_i, as in FedBuff,
    # so that two methods' effective steps η × Σ_i weight_i can be matched (docs/methods.md, "Shape and step")
    c.server_lr = 1.0
    # Fig. 6 diagnostic: log align = cos(g_client, g_server) on a held-out test batch (Eqs. 21-22) beside κ
    # in events.jsonl (needs output.events). Costs two gradients on alignment_batch_size samples per
    # received update; does not change training.
    c.log_alignment = False
    # Size of that held-out batch, drawn once per run from the test set (seeded); at most the test set.
    c.alignment_batch_size = 256
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    c = config.fedpsa
    rows = [("buffer_size", buffer_size(config)), ("queue_length", integer(ge=1)), ("gamma", number(ge=0)),
            ("delta", number(ge=0)), ("no_temperature", boolean), ("no_sensitivity", boolean),
            ("log_alignment", boolean),
            ("fixed_temperature", number(ge=0, note="0: Temp = gamma + delta; > 0: the fixed Temp of no_temperature")),
            ("calibration", one_of(CALIBRATION_KINDS)),
            ("calibration_size", integer(ge=1, le=MAX_CALIBRATION_SIZE, note="the batch is held whole and every "
                                         "client's sensitivity is computed on all of it; Table 5: 16-512")),
            ("sketch_dim", integer(ge=1, le=MAX_SKETCH_DIM, note="the rows of the sketch_dim x parameters float32 "
                                   "projection held in memory; default 16")),
            ("projection", one_of(PROJECTIONS)), ("step", one_of(STEPS)), ("server_lr", number(gt=0)),
            ("alignment_batch_size", integer(ge=1))]
    errors = section_errors(config, "fedpsa", rows)
    if c.log_alignment is True and not config.output.events:
      errors.append("fedpsa.log_alignment=True is invalid with output.events=False; allowed: output.events=True "
                    "(the pairs are written to events.jsonl), or log_alignment=False")
    fixed = c.fixed_temperature
    if is_number(fixed) and fixed > 0 and c.no_temperature is not True:
      # Without the switch the thermometer sets Temp: a fixed value would silently do nothing.
      errors.append(f"fedpsa.fixed_temperature={fixed!r} is invalid with fedpsa.no_temperature="
                    f"{c.no_temperature!r}; allowed: 0, or any value > 0 together with fedpsa.no_temperature=True")
    if is_number(c.gamma) and is_number(c.delta) and c.gamma + c.delta <= 0:
      errors.append(f"fedpsa.delta={c.delta!r} is invalid; allowed: gamma + delta > 0 (Temp must be positive)")
    return errors

  def __init__(self, hparams, ctx):
    super().__init__(hparams, ctx)
    h, runtime = self.hparams, ctx.runtime
    errors = bound_errors(h, sensitivity.num_params(ctx.params_shape), ctx.split_sizes.get("train", 0),
                          model=ctx.model_name)
    if errors:  # (before R is drawn: that could be the allocation that fails)
      raise ConfigError("invalid config for this model and data:\n  " + "\n  ".join(errors))
    # R (Eq. 11) in per-leaf blocks (`sensitivity.projection`) and D_b, made once as device arrays and passed to
    # the one compiled sketch function, `sensitivity.sketch_of`, that the clients, `init` and the rounds share (a
    # closed-over R would be baked into the program).
    make_projection = sensitivity.projection if h.projection == "gaussian" else sensitivity.count_sketch_projection
    self.projection = make_projection(seeding.device_key(ctx.seed, "fedpsa/projection"), h.sketch_dim,
                                      ctx.params_shape)
    self.calibration = tuple(map(jnp.asarray, calibration_batch(ctx, h.calibration, h.calibration_size)))
    # The static arguments of `sensitivity.sketch_of` besides the model (the profiler compiles the same call).
    self.sketch_options = dict(chunk_size=runtime.fisher_chunk_size, use_sensitivity=not h.no_sensitivity,
                               method=runtime.fisher)
    self.client = ClientSide(payload=self._client_payload)
    self._alignment_fn = None
    if h.log_alignment:
      x, y = ctx.sample("test", min(h.alignment_batch_size, ctx.split_sizes["test"]), "alignment")
      self._alignment_fn = make_alignment_fn(ctx.apply_fn, x, y)

  def init(self, params: Params) -> FedPSAState:
    q = self.hparams.queue_length
    # Under no_temperature this Temp is never updated (the round skips Eq. 18): it is the ablation's fixed value.
    temp = fixed_temperature(self.hparams) if self.hparams.no_temperature else self.hparams.gamma + self.hparams.delta
    return FedPSAState(params=params, global_sketch=self.sketch(params), queue=jnp.zeros((q,), jnp.float32),
                       m0=jnp.float32(0.0), temperature=jnp.float32(temp))

  def sketch(self, params: Params) -> jax.Array:
    """s̃ = R s(params) on the calibration batch (Eqs. 8, 11; R vec(params) under no_sensitivity): one call of
    the compiled `sensitivity.sketch_of`, the same program for clients and server."""
    return sensitivity.sketch_of(self.ctx.apply_fn, params, self.projection, *self.calibration, **self.sketch_options)

  def _client_payload(self, params_start: Params, params_end: Params, job=None) -> jax.Array:
    """The client's sketch s̃_i = R s(θ_i) at its trained parameters (Algorithm 1, lines 9-10)."""
    del params_start, job
    return self.sketch(params_end)

  def receive(self, state: FedPSAState, arrivals: Sequence[Arrival]) -> tuple[FedPSAState, bool]:
    """Buffers the arrivals (Algorithm 1 line 16, deferred: see the module docstring); a full buffer is one
    round, computed by two jitted calls (the module docstring)."""
    if self._alignment_fn is not None:  # against the global model as it is before this receive's flush
      state = state.replace(last_alignments=self._alignment_fn(
          state.params, tuple(a.params_start for a in arrivals), tuple(a.delta for a in arrivals)))
    state = state.replace(deltas=state.deltas + tuple(a.delta for a in arrivals),
                          sketches=state.sketches + tuple(a.payload for a in arrivals))
    if self.hparams.step == "staleness":  # (kept only where used: the default state is as before)
      state = state.replace(staleness=state.staleness + tuple(a.staleness for a in arrivals))
    if len(state.deltas) < self.hparams.buffer_size:
      return state, False
    return self._flush(state), True

  def _flush(self, state: FedPSAState) -> FedPSAState:
    """Algorithm 1 lines 16-31 for the whole buffer: `_aggregate`, with what the host knows (the ring position,
    which push, if any, fills the queue for the first time, which weighting applies) passed as traced values,
    then the new global model's sketch."""
    h, n, count = self.hparams, len(state.deltas), state.queue_count
    queue_full = count + n >= h.queue_length  # after this round's pushes
    fill_index = h.queue_length - 1 - count if count < h.queue_length <= count + n else -1
    step = staleness_step(state.staleness) if h.step == "staleness" else np.float32(1.0)
    step = np.float32(step * np.float32(h.server_lr))  # η (× 1.0 at the default: the same bits)
    out = _aggregate(state.params, state.deltas, state.sketches, state.global_sketch, state.queue, state.m0,
                     state.temperature, np.int32(count % h.queue_length), np.int32(fill_index),
                     np.bool_(queue_full and not h.no_temperature), np.bool_(queue_full or h.no_temperature),
                     step, gamma=float(h.gamma), delta=float(h.delta))
    return state.replace(**out, global_sketch=self.sketch(out["params"]), deltas=(), sketches=(), staleness=(),
                         queue_count=count + n)

  def diagnostics(self, state: FedPSAState) -> dict[str, Any]:
    """Temp and the κ and weights of the last flush, as device arrays (the host reads them when it writes)."""
    out = {"temperature": state.temperature, "thermometer_ready": state.queue_count >= self.hparams.queue_length}
    if state.last_weights is not None:
      out.update(kappa=state.last_kappas, weights=state.last_weights)
    return out

  def event_records(self, state: FedPSAState, arrivals: Sequence[Arrival]) -> list[dict[str, jax.Array]]:
    """κ_i and m_i = ||Δ_i||² of this receive's arrivals (with align_i under log_alignment), as 0-d device
    arrays: from the flush that ended the receive, or computed now (one small call) if they are still buffered."""
    extra = (state.last_alignments,) if self._alignment_fn is not None and state.last_alignments is not None else ()
    names = ("kappa", "delta_sq_norm", "alignment")[:2 + len(extra)]
    if state.deltas:  # no flush: these arrivals are the last entries of the buffer
      columns = _observe(tuple(a.payload for a in arrivals), tuple(a.delta for a in arrivals),
                         state.global_sketch, extra)
    else:  # the receive ended in a flush, whose last len(arrivals) updates are these
      columns = _last_entries((state.last_kappas, state.last_norms, *extra), len(arrivals))
    return [dict(zip(names, values)) for values in zip(*columns)]
