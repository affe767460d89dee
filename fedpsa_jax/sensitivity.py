"""Parameter sensitivity and its random-projection sketch (FedPSA, Sec. 5.2 and 5.4).

A client's behaviour is summarised by how much the loss on a shared calibration batch would change
if each parameter were zeroed (Eq. 3). That is approximated to second order with the gradient and
the empirical Fisher diagonal (Eqs. 6-8), projected to k dimensions with one random matrix R shared
by the whole run (Eq. 11), and compared by cosine similarity (Eqs. 10, 12).

Every function is pure over pytrees and jit-compatible when `apply_fn` is closed over or static.
`apply_fn(params, x)` returns logits `[B, C]`; labels `y` are integer classes `[B]`. A `mask`
(`[B]`, bool or 0/1 float, None = all valid) marks the real samples of a padded batch: masked
samples contribute nothing and every mean divides by the number of valid samples. Padding should be
finite (zeros or copies of real samples): the Fisher diagonal drops even non-finite padded samples,
but `batch_loss`/`mean_gradient` (and so `sensitivity`) differentiate through the whole batch.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from fedpsa_jax import choices, fisher

Params = Any
ApplyFn = Callable[[Params, jax.Array], jax.Array]


def per_example_loss(apply_fn: ApplyFn, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
  """Softmax cross-entropy of every sample, `[B]` (the per-sample losses F_k of Eq. 6)."""
  logits = apply_fn(params, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def _weights(mask: jax.Array | None, batch: int) -> tuple[jax.Array, jax.Array]:
  """Per-sample weights `[B]` and their sum (the number of valid samples m, at least 1)."""
  if mask is None:
    w = jnp.ones((batch,), jnp.float32)
  else:
    w = jnp.asarray(mask).astype(jnp.float32)
  # An all-masked batch gives zeros rather than NaNs (0 / 1 instead of 0 / 0).
  return w, jnp.maximum(jnp.sum(w), 1.0)


def batch_loss(
    apply_fn: ApplyFn, params: Params, x: jax.Array, y: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
  """The loss F(Θ) of Eq. 3: mean cross-entropy over the valid samples of the batch."""
  losses = per_example_loss(apply_fn, params, x, y)
  w, m = _weights(mask, losses.shape[0])
  # `where` rather than `w * losses`, so a non-finite loss on a padded sample cannot leak in.
  return jnp.sum(jnp.where(w > 0, w * losses, 0.0)) / m


def mean_gradient(
    apply_fn: ApplyFn, params: Params, x: jax.Array, y: jax.Array, mask: jax.Array | None = None
) -> Params:
  """∇F(Θ), the gradient of `batch_loss` (the g of Eqs. 4-8)."""
  return jax.grad(lambda p: batch_loss(apply_fn, p, x, y, mask))(params)


def _per_sample_grads(apply_fn: ApplyFn, params: Params, x: jax.Array, y: jax.Array) -> Params:
  """∇F_k(Θ) for every sample k, stacked on a leading axis (`vmap` of one sample's `grad`)."""

  def one(p: Params, xi: jax.Array, yi: jax.Array) -> jax.Array:
    return per_example_loss(apply_fn, p, xi[None], yi[None])[0]

  return jax.vmap(jax.grad(one), in_axes=(None, 0, 0))(params, x, y)


def _sum_squared_grads(
    apply_fn: ApplyFn,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    mask: jax.Array | None,
    chunk_size: int | None,
) -> tuple[Params, jax.Array]:
  """Σ_k w_k (∇F_k)² over the batch (per-sample gradients squared), and m = Σ_k w_k.

  The batch is cut into static chunks of at most `chunk_size` samples by a Python loop, so the
  traced program is unrolled: on CPU a rolled loop around conv computations runs far slower, while unrolling
  only costs compile time (docs/profiling.md, "Why the sensitivity code has the shape it has"). Only one
  chunk's per-sample gradients need to be live at a time, bounding memory by chunk_size x |Θ|.
  """
  batch = x.shape[0]
  w, m = _weights(mask, batch)
  step = batch if chunk_size is None else int(chunk_size)
  if step < 1:
    raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
  total = jax.tree.map(jnp.zeros_like, params)
  for start in range(0, batch, step):
    stop = min(start + step, batch)
    grads = _per_sample_grads(apply_fn, params, x[start:stop], y[start:stop])
    for j in range(stop - start):
      # One elementwise update per sample rather than one `sum(axis=0)` over the stacked squares: XLA:CPU
      # then fuses the dense layers' per-sample outer products away (docs/profiling.md).
      wj = w[start + j]
      # `where`, not a product alone: a NaN gradient of a masked sample times 0 would still be NaN.
      total = jax.tree.map(
          lambda t, g: t + jnp.where(wj > 0, wj * g[j] ** 2, 0.0).astype(t.dtype), total, grads
      )
  return total, m


FISHER_METHODS = choices.FISHER_METHODS  # runtime.fisher


def resolve_fisher_method(apply_fn: ApplyFn, method: str) -> str:
  """'auto' -> 'factored' when `apply_fn` is a Flax module's apply (see fisher.py), else 'per_sample'."""
  if method not in FISHER_METHODS:
    raise ValueError(f"runtime.fisher={method!r} is invalid; allowed: {', '.join(FISHER_METHODS)}")
  if method == "auto":
    return "factored" if fisher.flax_module_of(apply_fn) is not None else "per_sample"
  return method


def fisher_diagonal(
    apply_fn: ApplyFn,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    mask: jax.Array | None = None,
    *,
    chunk_size: int | None = None,
    method: str = "auto",
) -> Params:
  """Empirical Fisher diagonal, Eq. 6: F_ii = (1/m) Σ_k (∂F_k/∂θ_i)² over the m valid samples.

  Squares of *per-sample* gradients, not the square of the mean gradient (which would be
  (1/m²)(Σ_k ∂F_k/∂θ_i)², a different and much smaller quantity once samples disagree).
  `chunk_size` bounds memory to chunk_size per-sample gradients at a time (`_sum_squared_grads`).
  On CPU it is also the speed knob: chunks of 4-8 let XLA fuse each dense layer's per-sample outer
  products into the accumulation, while unchunked (None) materialises them all (docs/profiling.md).

  `method`: 'per_sample' is the textbook `vmap(grad)` path above (the reference); 'factored' is the
  exact path of `fisher.py`, which never materialises per-sample dense or conv gradients; 'auto'
  takes 'factored' whenever the model allows it. Both agree to float tolerance (tests).
  """
  if resolve_fisher_method(apply_fn, method) == "factored":
    return fisher.gradient_and_fisher(apply_fn, params, x, y, mask, chunk_size=chunk_size)[1]
  sum_g2, m = _sum_squared_grads(apply_fn, params, x, y, mask, chunk_size)
  return jax.tree.map(lambda s: s / m, sum_g2)


def sensitivity(
    apply_fn: ApplyFn,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    mask: jax.Array | None = None,
    *,
    chunk_size: int | None = None,
    method: str = "auto",
) -> Params:
  """Second-order sensitivity, Eq. 8: s_i = | g_i θ_i − ½ F_ii θ_i² |.

  g (the mean gradient) and F (the Fisher diagonal, Eq. 6) are both evaluated at `params` on the
  same calibration batch, as the paper prescribes. g comes from one batched backward pass rather
  than from the per-sample gradients already at hand: accumulating both sums from them doubles the
  consumers of each per-sample gradient, which stops XLA:CPU from fusing them away (docs/profiling.md).
  The factored path (`method`, see
  `fisher_diagonal`) yields g and F from its single backward pass.
  """
  if resolve_fisher_method(apply_fn, method) == "factored":
    g, f = fisher.gradient_and_fisher(apply_fn, params, x, y, mask, chunk_size=chunk_size)
  else:
    g = mean_gradient(apply_fn, params, x, y, mask)
    f = fisher_diagonal(apply_fn, params, x, y, mask, chunk_size=chunk_size, method="per_sample")
  return jax.tree.map(lambda t, gi, fi: jnp.abs(gi * t - 0.5 * fi * t**2), params, g, f)


def exact_sensitivity(
    apply_fn: ApplyFn,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    mask: jax.Array | None = None,
    *,
    batch_size: int = 256,
) -> Params:
  """Eq. 3 by brute force: s_i = |F(Θ) − F(Θ − θ_i e_i)| for every coordinate i.

  One forward pass per parameter (in groups of `batch_size` coordinates via `lax.map`), so only for
  tiny models: tests and notebooks that check how well Eq. 8 approximates it.
  """
  flat, unravel = ravel_pytree(params)
  loss = lambda v: batch_loss(apply_fn, unravel(v), x, y, mask)
  base = loss(flat)
  zeroed = lambda i: loss(flat.at[i].set(0.0))  # Θ − θ_i e_i zeroes exactly coordinate i.
  others = jax.lax.map(zeroed, jnp.arange(flat.shape[0]), batch_size=batch_size)
  return unravel(jnp.abs(base - others))


# R is drawn by programs compiled with XLA's default optimisation whatever XLA_FLAGS asks for: its bits then do not
# depend on those flags (the test suite compiles at level 0, tests/conftest.py, where the normal draw gives other
# bits in their last places), and a large R is not drawn by unoptimised code (docs/testing.md has the times).
_DEFAULT_OPTIMISATION = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}


def _draw(key: jax.Array, k: int, d: int, dtype: Any) -> jax.Array:
  return (jax.random.normal(key, (k, d), dtype) / np.sqrt(k)).astype(dtype)


_draw_matrix = jax.jit(_draw, static_argnums=(1, 2, 3), compiler_options=_DEFAULT_OPTIMISATION)


def projection_matrix(key: jax.Array, k: int, d: int, dtype: Any = jnp.float32) -> jax.Array:
  """The shared random projection R ∈ R^{k×d} of Eq. 11, entries i.i.d. N(0, 1/k).

  Variance 1/k makes E||Rv||² = ||v||², so sketch norms stay on the scale of the originals (only
  directions matter for κ, but the scale keeps sketches readable in logs).
  """
  if isinstance(key, jax.core.Tracer):  # inside a caller's trace the draw is part of the caller's program
    return _draw(key, k, d, dtype)
  return _draw_matrix(key, k, d, jnp.dtype(dtype))


def _leaf_shape(leaf: Any) -> tuple[int, ...]:
  """The shape of a leaf given as an array or as a shape (`jax.ShapeDtypeStruct`)."""
  return tuple(getattr(leaf, "shape", None) or np.shape(leaf))


def split_projection(R: jax.Array, tree: Params) -> Params:
  """R [k, d] cut into one block per leaf of `tree` (arrays or shapes): the block of a leaf of shape S holds
  R's columns of that leaf in `ravel_pytree` order, shaped [k, *S], so that R vec(tree) = Σ_leaves
  ⟨block, leaf⟩ (`sketch`)."""
  leaves, treedef = jax.tree.flatten(tree)
  shapes = [_leaf_shape(leaf) for leaf in leaves]
  offsets = np.cumsum([0] + [int(np.prod(shape)) for shape in shapes])
  if offsets[-1] != R.shape[1]:
    raise ValueError(f"R has {R.shape[1]} columns but the tree has {offsets[-1]} entries")
  k = R.shape[0]
  return treedef.unflatten([R[:, a:b].reshape((k, *shape)) for a, b, shape in zip(offsets[:-1], offsets[1:], shapes)])


def projection(key: jax.Array, k: int, tree: Params, dtype: Any = jnp.float32) -> Params:
  """Eq. 11's R for the parameters of `tree`'s structure, as `sketch` takes it: the entries of
  `projection_matrix(key, k, num_params(tree))` (the paper's N(0, 1/k)), cut into per-leaf blocks
  (`split_projection`), drawn and cut by one program."""
  if isinstance(key, jax.core.Tracer):
    return split_projection(projection_matrix(key, k, num_params(tree), dtype), tree)
  leaves, treedef = jax.tree.flatten(tree)
  return treedef.unflatten(_draw_blocks(key, k, tuple(_leaf_shape(leaf) for leaf in leaves), jnp.dtype(dtype)))


@functools.partial(jax.jit, static_argnums=(1, 2, 3), compiler_options=_DEFAULT_OPTIMISATION)
def _draw_blocks(key: jax.Array, k: int, shapes: tuple[tuple[int, ...], ...], dtype: Any) -> list[jax.Array]:
  R = _draw(key, k, sum(math.prod(shape) for shape in shapes), dtype)
  return split_projection(R, [jax.ShapeDtypeStruct(shape, dtype) for shape in shapes])


@flax.struct.dataclass
class CountSketchBlock:
  """One leaf's part of a CountSketch projection (`count_sketch_projection`), for a leaf of n coordinates and
  m = ⌈n / k⌉: `order` (int32 [k·m]) holds row r's coordinates at positions [r·m, (r+1)·m), ascending (so that
  the gather reads memory in order), the padding as n (read as 0); `signs` (±1 float32 [k·m]) the sign of the
  coordinate at each position; `k` the rows."""
  order: jax.Array
  signs: jax.Array
  k: int = flax.struct.field(pytree_node=False)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _count_sketch_draws(key: jax.Array, k: int, sizes: tuple[int, ...]) -> list[tuple[jax.Array, jax.Array]]:
  """(order, signs) of each leaf of `sizes` coordinates (`count_sketch_projection`), drawn in one compiled program:
  as separate eager operations each would compile and keep its own program and buffers."""
  draws = []
  for i, n in enumerate(sizes):
    m = -(-n // k)
    order_key, sign_key = jax.random.split(jax.random.fold_in(key, i))
    rows = jnp.pad(jax.random.permutation(order_key, n).astype(jnp.int32), (0, k * m - n), constant_values=n)
    draws.append((jnp.sort(rows.reshape(k, m), axis=1).reshape(-1), jax.random.rademacher(sign_key, (k * m,), jnp.float32)))
  return draws


def count_sketch_projection(key: jax.Array, k: int, tree: Params) -> Params:
  """A CountSketch (Charikar, Chen and Farach-Colton 2002) in place of Eq. 11's Gaussian R, per leaf of `tree`
  (arrays or shapes): each coordinate of a leaf gets a sign σ = ±1 and one of the k rows, the rows of a leaf
  taking equal shares of a random permutation of its coordinates (row r: the permutation's positions
  [r·m, (r+1)·m), m = ⌈n / k⌉). Then ⟨Sa, Sb⟩ is an unbiased estimate of ⟨a, b⟩, like ⟨Ra, Rb⟩ with Gaussian R;
  it holds 8 bytes per parameter instead of 4k (so any k fits), and its product is a gather and a sum
  (`sketch`). Not the paper's R: a `fedpsa.projection` option (docs/performance.md, "FedPSA's cost")."""
  leaves, treedef = jax.tree.flatten(tree)
  sizes = tuple(int(np.prod(_leaf_shape(leaf))) for leaf in leaves)
  blocks = [CountSketchBlock(order=order, signs=signs, k=k) for order, signs in _count_sketch_draws(key, k, sizes)]
  return treedef.unflatten(blocks)


def _count_sketch_leaf(block: CountSketchBlock, leaf: jax.Array) -> jax.Array:
  """[k]: row r sums σ_p leaf[order_p] over its positions p (the padding's index, n, reads 0): a gather and a
  fixed-order reduction, so the same bits on every backend (a scatter-add would not be)."""
  values = jnp.take(jnp.ravel(leaf).astype(jnp.float32), block.order, mode="fill", fill_value=0)
  return jnp.sum((values * block.signs).reshape(block.k, -1), axis=1)


def sketch(R: Params, tree: Params) -> jax.Array:
  """Eq. 11: R vec(tree), with R in the per-leaf blocks of `projection` / `split_projection` (or the CountSketch
  blocks of `count_sketch_projection`: then S vec(tree)).

  vec is `jax.flatten_util.ravel_pytree`'s order (the leaf order of `jax.tree.leaves`, dict keys sorted,
  each leaf row-major), the same for every tree of one structure, so sketches of different clients (and of
  the global model) are comparable coordinate by coordinate. Computed as Σ_leaves block · vec(leaf), one
  matrix-vector product per leaf: vec(tree) as one vector would be a concatenation of the leaves, which
  XLA:CPU runs as a slow elementwise loop (docs/performance.md, "FedPSA's cost").
  """
  blocks = jax.tree.leaves(R, is_leaf=lambda b: isinstance(b, CountSketchBlock))
  leaves = jax.tree.leaves(tree)
  if isinstance(blocks[0], CountSketchBlock):
    if len(blocks) != len(leaves) or any(b.order.shape[0] != b.k * -(-jnp.size(leaf) // b.k)
                                         for b, leaf in zip(blocks, leaves)):
      raise ValueError("the CountSketch blocks do not match the tree's leaves (make them with "
                       "`count_sketch_projection` for this structure)")
    return functools.reduce(jnp.add, [_count_sketch_leaf(b, leaf) for b, leaf in zip(blocks, leaves)])
  if jax.tree.structure(R) != jax.tree.structure(tree) or any(
      b.shape[1:] != jnp.shape(leaf) for b, leaf in zip(blocks, leaves)):
    raise ValueError("R's blocks do not match the tree's leaves (make R with `projection` for this structure)")
  # HIGHEST: on accelerators the default matmul precision may drop to bf16/tf32 passes.
  parts = [jnp.dot(b.reshape(b.shape[0], -1), jnp.ravel(leaf).astype(b.dtype), precision=jax.lax.Precision.HIGHEST)
           for b, leaf in zip(blocks, leaves)]
  return functools.reduce(jnp.add, parts)


def cosine_similarity(a: jax.Array, b: jax.Array, eps: float = 1e-12) -> jax.Array:
  """cos(a, b) = <a, b> / (||a|| ||b||) along the last axis (Eqs. 10, 12), broadcasting the rest.

  The denominator is floored at `eps`, so a zero vector gives 0 rather than NaN.
  """
  dot = jnp.sum(a * b, axis=-1)
  norms = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return dot / jnp.maximum(norms, eps)


project = jax.jit(sketch)  # Eq. 11 alone, compiled (R and the tree as arguments)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("chunk_size", "use_sensitivity", "method"))
def sketch_of(
    apply_fn: ApplyFn,
    params: Params,
    R: Params,
    x: jax.Array,
    y: jax.Array,
    *,
    chunk_size: int | None = None,
    use_sensitivity: bool = True,
    method: str = "auto",
) -> jax.Array:
  """The sensitivity sketch s̃ = R vec(s(Θ)) of Eqs. 8 and 11 on the calibration batch (x, y); with
  `use_sensitivity=False`, R vec(Θ) (FedPSA's `no_sensitivity` ablation). R is `projection`'s blocks;
  `chunk_size` and `method` choose the Fisher path (`fisher_diagonal`).

  One compiled program, the one every FedPSA client, `init` and round calls (and `--mode=profile` times).
  R and the batch are arguments, so give them as device arrays made once: a closed-over R would be baked
  into the program, and a host array copied at every call. Traced inside another jit, it is inlined.
  """
  tree = sensitivity(apply_fn, params, x, y, chunk_size=chunk_size, method=method) if use_sensitivity else params
  return sketch(R, tree)


def num_params(params: Params) -> int:
  """d, the number of scalar parameters in the tree."""
  return int(sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(params)))
