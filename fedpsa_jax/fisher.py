"""The exact empirical Fisher diagonal (Eq. 6) without materialising per-sample dense-layer gradients.

For a dense layer out = A W + b applied to one sample's input row a_k, the per-sample gradient of the
loss ℓ_k is a_k ⊗ δ_k with δ_k = ∂ℓ_k/∂out_k. Hence, exactly,

    Σ_k (∂ℓ_k/∂W)² = (A ∘ A)ᵀ (Δ ∘ Δ),        Σ_k (∂ℓ_k/∂b)² = Σ_k δ_k ∘ δ_k,

and one batched backward pass provides both A (the layer's inputs) and Δ (the gradients w.r.t. its
outputs, per sample, since out_k only reaches ℓ_k). The same pass gives the mean gradient g of Eq. 8.
For the MNIST CNN the dense layers hold 1.6M of its 1.66M parameters, so the B×d per-sample gradient
tensor that `vmap(grad)` builds (424 MB at B = 64) shrinks to B×(conv parameters).

A convolution's per-sample kernel gradient is P_kᵀ Δ_k, P_k the sample's im2col patches [positions,
kh·kw·C_in] and Δ_k its output gradient [positions, C_out]: one batched matmul gives all B of them
([B, kh·kw·C_in, C_out], 1.6M floats for the MNIST CNN's second conv at B = 32), squared and summed.

Any other layer (a dense layer called twice or on more than a flat [B, in] input, a grouped or
input-dilated convolution, a norm layer's scale...) keeps per-sample gradients by `vmap(grad)` for its
parameters only, `chunk_size` samples at a time.

Works for any Flax Linen module whose `apply` is passed as `apply_fn`: dense and conv layers are found
with `nn.intercept_methods`, which records their inputs (`sow`) and adds a zero perturbation to their
outputs whose gradient is Δ (`perturb`).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

Params = Any
ApplyFn = Callable[[Params, jax.Array], jax.Array]
_INPUTS, _PERTURB = "fisher_inputs", "perturbations"


def flax_module_of(apply_fn: ApplyFn) -> nn.Module | None:
  """The Linen module whose bound `apply` is `apply_fn`, or None (then only the reference path works)."""
  module = getattr(apply_fn, "__self__", None)
  if isinstance(module, nn.Module) and getattr(apply_fn, "__func__", None) is type(module).apply:
    return module
  return None


def _make_interceptor(layers: dict[tuple[str, ...], nn.Module]):
  """An interceptor that records dense/conv inputs and perturbs their outputs; `layers` collects the
  intercepted modules by parameter path (trace-time metadata: their conv settings)."""

  def interceptor(next_fun, args, kwargs, context):
    if isinstance(context.module, (nn.Dense, nn.Conv)) and context.method_name == "__call__":
      layers[tuple(context.module.path)] = context.module
      context.module.sow(_INPUTS, "x", args[0])
      return context.module.perturb("out", next_fun(*args, **kwargs), collection=_PERTURB)
    return next_fun(*args, **kwargs)

  return interceptor


def _weights(mask: jax.Array | None, batch: int) -> tuple[jax.Array, jax.Array]:
  w = jnp.ones((batch,), jnp.float32) if mask is None else jnp.asarray(mask).astype(jnp.float32)
  return w, jnp.maximum(jnp.sum(w), 1.0)


def gradient_and_fisher(apply_fn: ApplyFn, params: Params, x: jax.Array, y: jax.Array,
                        mask: jax.Array | None = None, *, chunk_size: int | None = None,
                        conv_loop: str = "fori") -> tuple[Params, Params]:
  """(g, F): the mean gradient and the exact empirical Fisher diagonal (Eq. 6) over the valid samples.

  Requires `flax_module_of(apply_fn)`; `params` is the variables dict (`{'params': ...}`).
  `conv_loop`: 'fori' (one sample at a time, bounded memory, fastest on CPU) or 'batched' (all samples'
  patches at once, no loop: the same FLOPs, which XLA's cost analysis then counts in full; profiling
  uses it, since XLA counts a loop body once).
  """
  module = flax_module_of(apply_fn)
  if module is None:
    raise ValueError("the factored Fisher needs a Flax module's apply as apply_fn")
  w, m = _weights(mask, x.shape[0])
  # Masked rows are zeroed first: their δ is 0, but 0 · NaN padding would still poison the products.
  x = jnp.where(w.reshape((-1,) + (1,) * (x.ndim - 1)) > 0, x, jnp.zeros((), x.dtype))
  layers: dict[tuple[str, ...], nn.Module] = {}
  interceptor = _make_interceptor(layers)

  def traced(variables, perturbations, xs):
    with nn.intercept_methods(interceptor):
      return module.apply({**variables, _PERTURB: perturbations}, xs, mutable=[_INPUTS])

  def perturbation_shapes(variables):
    with nn.intercept_methods(interceptor):
      return module.apply(variables, x, mutable=[_PERTURB, _INPUTS])[1][_PERTURB]

  zero_perturb = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(perturbation_shapes, params))

  def weighted_loss_sum(variables, perturbations):
    logits, state = traced(variables, perturbations, x)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.sum(jnp.where(w > 0, w * losses, 0.0)), state[_INPUTS]

  (g_sum, out_grads), inputs = jax.grad(weighted_loss_sum, argnums=(0, 1), has_aux=True)(params, zero_perturb)
  mean_grad = jax.tree.map(lambda t: t / m, g_sum)

  flat_params = traverse_util.flatten_dict(params["params"])
  flat_inputs = traverse_util.flatten_dict(inputs)
  flat_out_grads = traverse_util.flatten_dict(out_grads)
  fisher = {}
  factored = set()
  for (*path, _), captured in flat_inputs.items():
    path = tuple(path)
    delta = flat_out_grads[path + ("out",)]
    if len(captured) != 1 or (path + ("kernel",)) not in flat_params:
      continue  # a layer called twice: its per-sample gradient is a sum over calls, not factorable
    a, kernel = captured[0], flat_params[path + ("kernel",)]
    # δ_k is already w_k ∂ℓ_k/∂out_k; with 0/1 weights (w δ)² = w δ², so masked samples drop out.
    if a.ndim == 2 and kernel.ndim == 2:  # dense on [B, in]
      fisher[path + ("kernel",)] = (a * a).T @ (delta * delta) / m
    elif (conv_fisher := _conv_kernel_fisher(layers.get(path), a, delta, kernel.shape, conv_loop)) is not None:
      fisher[path + ("kernel",)] = conv_fisher / m
    else:
      continue
    factored.add(path + ("kernel",))
    if path + ("bias",) in flat_params:
      bias_grad = delta.reshape(delta.shape[0], -1, delta.shape[-1]).sum(axis=1)  # [B, C_out]
      fisher[path + ("bias",)] = jnp.sum(bias_grad * bias_grad, axis=0) / m
      factored.add(path + ("bias",))

  rest = {k: v for k, v in flat_params.items() if k not in factored}
  if rest:
    fisher.update(_per_sample_fisher(module, params, flat_params, rest, x, y, w, m, chunk_size))
  fisher_tree = {"params": traverse_util.unflatten_dict({k: fisher[k] for k in flat_params})}
  return mean_grad, {**params, **fisher_tree}


def _conv_kernel_fisher(conv: Any, x: jax.Array, delta: jax.Array, kernel_shape: tuple[int, ...],
                        conv_loop: str = "fori") -> jax.Array | None:
  """Σ_k (P_kᵀ Δ_k)² for a conv layer (kernel layout (kh, kw, C_in, C_out)), or None when the layer is
  not a plain 2-D convolution this method covers (then its parameters take the per-sample path).

  One sample at a time in a `fori_loop`: its im2col patches P_k [positions, kh·kw·C_in] are built
  inside the loop, so memory stays one sample's patches whatever the batch size. (The loop body holds
  only slices and a matmul; the CPU while-loop slowdown of local.py concerns convolutions.)
  """
  if not isinstance(conv, nn.Conv) or x.ndim != 4 or len(kernel_shape) != 4:
    return None
  kh, kw, c_in, c_out = kernel_shape
  pair = lambda v, default: default if v is None else ((v, v) if isinstance(v, int) else tuple(v))
  strides, dilation = pair(conv.strides, (1, 1)), pair(conv.kernel_dilation, (1, 1))
  if conv.feature_group_count != 1 or pair(conv.input_dilation, (1, 1)) != (1, 1) or c_in != x.shape[3]:
    return None
  padding = conv.padding
  if isinstance(padding, str):
    if padding not in ("SAME", "VALID"):
      return None
    pads = jax.lax.padtype_to_pads(x.shape[1:3], ((kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1),
                                   strides, padding)
  elif isinstance(padding, int):
    pads = [(padding, padding)] * 2
  else:
    pads = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
  xp = jnp.pad(x, ((0, 0), tuple(pads[0]), tuple(pads[1]), (0, 0)))
  out_h, out_w = delta.shape[1], delta.shape[2]
  deltas = delta.reshape(delta.shape[0], out_h * out_w, c_out)

  def patches_of(sample):  # [positions, kh*kw*C_in] in the kernel's (kh, kw, C_in) order
    cols = [sample[i * dilation[0]: i * dilation[0] + (out_h - 1) * strides[0] + 1: strides[0],
                   j * dilation[1]: j * dilation[1] + (out_w - 1) * strides[1] + 1: strides[1], :]
            for i in range(kh) for j in range(kw)]
    return jnp.stack(cols, axis=2).reshape(out_h * out_w, kh * kw * c_in)

  def add_sample(k, total):
    g = patches_of(xp[k]).T @ deltas[k]
    return total + g * g

  if conv_loop == "batched":
    g = jnp.einsum("bqp,bqc->bpc", jax.vmap(patches_of)(xp), deltas)
    return jnp.sum(g * g, axis=0).reshape(kernel_shape)

  total = jax.lax.fori_loop(0, x.shape[0], add_sample, jnp.zeros((kh * kw * c_in, c_out), delta.dtype))
  return total.reshape(kernel_shape)


def _per_sample_fisher(module, params, flat_params, rest, x, y, w, m, chunk_size):
  """Σ_k w_k (∂ℓ_k/∂θ)² / m for the parameters in `rest` only, by vmap(grad) in chunks."""

  def sample_loss(rest_params, xk, yk):
    merged = traverse_util.unflatten_dict({**flat_params, **rest_params})
    logits = module.apply({**params, "params": merged}, xk[None])
    return optax.softmax_cross_entropy_with_integer_labels(logits, yk[None])[0]

  per_sample_grad = jax.vmap(jax.grad(sample_loss), in_axes=(None, 0, 0))
  total = jax.tree.map(jnp.zeros_like, rest)
  size = chunk_size or x.shape[0]
  for start in range(0, x.shape[0], size):  # a Python loop: unrolled, see local.py on CPU while-loops
    grads = per_sample_grad(rest, x[start:start + size], y[start:start + size])
    wc = w[start:start + size]
    total = jax.tree.map(
        lambda t, gr: t + jnp.tensordot(wc, jnp.where(wc.reshape((-1,) + (1,) * (gr.ndim - 1)) > 0, gr * gr, 0.0), 1),
        total, grads)
  return {k: v / m for k, v in total.items()}
