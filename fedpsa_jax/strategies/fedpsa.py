"""FedPSA (Algorithm 1): behavioral staleness from parameter-sensitivity sketches, temperature-scaled.

Client (after local training, at the *trained* parameters θ): the Eq. 8 sensitivity
s = |g ⊙ θ − ½ F ⊙ θ²| on the shared calibration batch D_b (g: mean gradient, F: empirical Fisher
diagonal from per-sample gradients, Eq. 6), sketched as s̃ = R s with one R ∈ R^{k×d}, entries
N(0, 1/k), for the whole run (Eq. 11). It sends (Δ, s̃).

Server, per arrival: κ = cos(s̃_i, s̃_g) (Eq. 12), s̃_g the sketch of the current global model
(computed once per round, cached in the state); (Δ, κ) enters the buffer; m = ||Δ||² (Eq. 16) enters
the thermometer queue Q of length L_q (oldest dropped). M0 = mean(Q) when Q first fills;
Temp = (M_cur / M0) γ + δ (Eqs. 17-18). When the buffer holds at least L_s updates:
weights = softmax(κ / Temp) (Eq. 19) — uniform 1/|buffer| while Q has never been full — and
w ← w + Σ weight_i Δ_i (Eq. 20); the buffer is cleared.

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
Arrivals of one event time enter the buffer together (so a flush may hold more than L_s, as in FLGo's
FedBuff on which FedPSA builds).

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

from fedpsa_jax import seeding, sensitivity
from fedpsa_jax.data.calibration import gaussian_batch
from fedpsa_jax.strategies.base import Arrival, ClientSide, Strategy, register
from fedpsa_jax.strategies.common import buffer_size, section_errors
from fedpsa_jax.tree_util import apply_weighted, squared_norm
from fedpsa_jax.validation import boolean, integer, is_number, number

Params = Any


@flax.struct.dataclass
class FedPSAState:
  params: Params
  global_sketch: jax.Array  # s̃_g of the current global model (Eq. 11), refreshed after each round
  queue: jax.Array  # [L_q] ring buffer of recent ||Δ||² (Eq. 16)
  m0: jax.Array  # M0: the queue's mean when it first filled (0 before)
  temperature: jax.Array  # the latest Temp (Eq. 18)
  deltas: tuple = ()  # buffered Δ_i
  kappas: tuple = ()  # buffered κ_i (device scalars)
  queue_count: int = flax.struct.field(pytree_node=False, default=0)  # pushes so far (host)
  last_kappas: jax.Array | None = None  # κ of the last flush (diagnostics)
  last_weights: jax.Array | None = None  # weights of the last flush (diagnostics)
  last_alignments: jax.Array | None = None  # align_i of the last receive's arrivals (log_alignment only)


@functools.partial(jax.jit, static_argnums=(2, 3))
def temperature(queue: jax.Array, m0: jax.Array, gamma: float, delta: float) -> jax.Array:
  """Eqs. 17-18: Temp = (M_cur / M0) γ + δ with M_cur the mean of the (full) queue."""
  return jnp.mean(queue) / jnp.maximum(m0, jnp.finfo(jnp.float32).tiny) * gamma + delta  # M0 = 0 only if every Δ was 0


def fixed_temperature(hparams: ml_collections.ConfigDict) -> float:
  """The Temp of the "w/o T" ablation (`no_temperature`): `fixed_temperature` when > 0, else γ + δ (the value of
  Eq. 18 at M_cur = M0, our reading of the paper; see the module docstring)."""
  fixed = hparams.get("fixed_temperature", 0.0)
  return float(fixed) if fixed > 0 else float(hparams.gamma + hparams.delta)


@functools.partial(jax.jit, static_argnums=2)
def flush_weights(kappas: jax.Array, temp: jax.Array, use_softmax: bool) -> jax.Array:
  """Eq. 19: softmax(κ / Temp) over the buffer, or uniform weights before the thermometer is ready.

  Uniform weights are written as the softmax of zeros selected from κ's shape (exactly 1/n), so that
  both branches return an array that depends on κ: it then lives, committed or not, where κ does, and
  the aggregation step it feeds compiles once (a constant output would be uncommitted)."""
  return jax.nn.softmax(jnp.where(use_softmax, kappas / temp, 0.0))


@jax.jit
def _observe(queue, position, delta, client_sketch, global_sketch):
  """Per arrival: κ (Eq. 12) and the queue with ||Δ||² written at `position` (Eq. 16)."""
  kappa = sensitivity.cosine_similarity(client_sketch, global_sketch)
  m = squared_norm(delta)
  return kappa, m, queue.at[position].set(m)


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
  `gaussian` inputs and labels (no client data), or `real` training samples."""
  if kind == "real":
    if ctx.sample is None or size > ctx.split_sizes.get("train", 0):
      raise ValueError(f"sensitivity.calibration_size={size!r} is invalid with sensitivity.calibration='real'; "
                       f"allowed: at most the {ctx.split_sizes.get('train', 0)} training samples")
    return ctx.sample("train", size, "calibration")
  x, y = gaussian_batch(size, ctx.input_shape, ctx.num_classes, seeding.host_rng(ctx.seed, "calibration"))
  return jnp.asarray(x), jnp.asarray(y)


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
    # Fig. 6 diagnostic: log align = cos(g_client, g_server) on a held-out test batch (Eqs. 21-22) beside κ
    # in events.jsonl (needs output.events). Costs two gradients on eval.alignment_batch_size samples per
    # received update; does not change training.
    c.log_alignment = False
    return c

  @classmethod
  def validate_config(cls, config: ml_collections.ConfigDict) -> list[str]:
    c = config.fedpsa
    rows = [("buffer_size", buffer_size(config)), ("queue_length", integer(ge=1)), ("gamma", number(ge=0)),
            ("delta", number(ge=0)), ("no_temperature", boolean), ("no_sensitivity", boolean)]
    # A section written before these two fields existed reads as their defaults (False, 0), as `__init__` and
    # `fixed_temperature` read it.
    rows += [(field, validator) for field, validator in (
        ("log_alignment", boolean),
        ("fixed_temperature", number(ge=0, note="0: Temp = gamma + delta; > 0: the fixed Temp of no_temperature")))
             if field in c]
    errors = section_errors(config, "fedpsa", rows)
    if c.get("log_alignment", False) is True and not config.output.events:
      errors.append("fedpsa.log_alignment=True is invalid with output.events=False; allowed: output.events=True "
                    "(the pairs are written to events.jsonl), or log_alignment=False")
    fixed = c.get("fixed_temperature", 0.0)
    if is_number(fixed) and fixed > 0 and c.no_temperature is not True:
      # Without the switch the thermometer sets Temp: a fixed value would silently do nothing.
      errors.append(f"fedpsa.fixed_temperature={fixed!r} is invalid with fedpsa.no_temperature="
                    f"{c.no_temperature!r}; allowed: 0, or any value > 0 together with fedpsa.no_temperature=True")
    if is_number(c.gamma) and is_number(c.delta) and c.gamma + c.delta <= 0:
      errors.append(f"fedpsa.delta={c.delta!r} is invalid; allowed: gamma + delta > 0 (Temp must be positive)")
    return errors

  def __init__(self, config, ctx):
    super().__init__(config, ctx)
    s = config.sensitivity
    R = sensitivity.projection_matrix(seeding.device_key(ctx.seed, "fedpsa/projection"), s.sketch_dim,
                                      sensitivity.num_params(ctx.params_shape))
    self._sketch_fn = sensitivity.make_sketch_fn(
        ctx.apply_fn, *calibration_batch(ctx, s.calibration, s.calibration_size), R, chunk_size=s.chunk_size,
        use_sensitivity=not self.hparams.no_sensitivity, method=s.fisher)
    self.client = ClientSide(payload=self._client_payload)
    self._alignment_fn = None
    if self.hparams.get("log_alignment", False):
      if ctx.sample is None:
        raise ValueError("fedpsa.log_alignment needs StrategyContext.sample (a held-out test batch)")
      x, y = ctx.sample("test", min(config.eval.alignment_batch_size, ctx.split_sizes["test"]), "alignment")
      self._alignment_fn = make_alignment_fn(ctx.apply_fn, x, y)

  def init(self, params: Params) -> FedPSAState:
    q = self.hparams.queue_length
    # Under no_temperature this Temp is never updated (receive skips Eq. 18): it is the ablation's fixed value.
    temp = fixed_temperature(self.hparams) if self.hparams.no_temperature else self.hparams.gamma + self.hparams.delta
    return FedPSAState(params=params, global_sketch=self._sketch_fn(params), queue=jnp.zeros((q,), jnp.float32),
                       m0=jnp.float32(0.0), temperature=jnp.float32(temp))

  def _client_payload(self, params_start: Params, params_end: Params, job=None) -> jax.Array:
    """The client's sketch s̃_i = R s(θ_i) at its trained parameters (Algorithm 1, lines 9-10)."""
    del params_start, job
    return self._sketch_fn(params_end)

  def receive(self, state: FedPSAState, arrivals: Sequence[Arrival]) -> tuple[FedPSAState, bool]:
    h = self.hparams
    queue, m0, count, kappas = state.queue, state.m0, state.queue_count, state.kappas
    temp = state.temperature
    if self._alignment_fn is not None:  # against the global model as it is before this receive's flush
      state = state.replace(last_alignments=self._alignment_fn(
          state.params, tuple(a.params_start for a in arrivals), tuple(a.delta for a in arrivals)))
    for a in arrivals:
      kappa, _, queue = _observe(queue, count % h.queue_length, a.delta, a.payload, state.global_sketch)
      kappas += (kappa,)
      count += 1
      if count == h.queue_length:
        m0 = jnp.mean(queue)  # Algorithm 1 line 20: M0 fixed at the first fill
    # Eq. 18 after this receive's last push (it depends only on the queue and M0: computing it once per
    # receive gives the value a per-arrival update would end at).
    if count >= h.queue_length and not h.no_temperature:
      temp = temperature(queue, m0, float(h.gamma), float(h.delta))
    deltas = state.deltas + tuple(a.delta for a in arrivals)
    state = state.replace(queue=queue, m0=m0, queue_count=count, kappas=kappas, deltas=deltas, temperature=temp)
    if len(deltas) < h.buffer_size:
      return state, False
    use_softmax = h.no_temperature or count >= h.queue_length
    kappa_vec = jnp.stack(kappas)
    weights = flush_weights(kappa_vec, temp, use_softmax)
    params = apply_weighted(state.params, deltas, weights)
    return state.replace(params=params, global_sketch=self._sketch_fn(params), deltas=(), kappas=(),
                         last_kappas=kappa_vec, last_weights=weights), True

  def diagnostics(self, state: FedPSAState) -> dict[str, Any]:
    out = {"temperature": float(state.temperature), "thermometer_ready": state.queue_count >= self.hparams.queue_length}
    if state.last_weights is not None:
      kappas, weights = jax.device_get((state.last_kappas, state.last_weights))
      out.update(kappa=[float(k) for k in kappas], weights=[float(w) for w in weights])
    return out

  def event_records(self, state: FedPSAState, arrivals: Sequence[Arrival]) -> list[dict[str, float]]:
    # The κ of this receive's arrivals are the last len(arrivals) entries pushed: in the buffer, or
    # in last_kappas if the receive ended in a flush.
    pushed = state.kappas if state.kappas else tuple(state.last_kappas)
    kappas = [float(k) for k in jax.device_get(pushed[len(pushed) - len(arrivals):])]
    norms = jax.device_get([squared_norm(a.delta) for a in arrivals])
    records = [{"kappa": k, "delta_sq_norm": float(m)} for k, m in zip(kappas, norms)]
    if self._alignment_fn is not None and state.last_alignments is not None:
      for record, align in zip(records, jax.device_get(state.last_alignments)):
        record["alignment"] = float(align)
    return records
