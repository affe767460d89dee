"""The paper's models (Sec. 6.1; `aifed_cnn`: AiFed's Sec. V-A) as pure Flax Linen modules, used as
`model.apply(params, x)`.

Inputs are NHWC float32 images; every model flattens what it needs itself, so any model can be paired
with any dataset whose images it accepts.

Initialisation (`param_init`, config `model.init`): `torch` (the default) draws every layer as PyTorch's
`nn.Conv2d`/`nn.Linear` do, the harness the paper's numbers came from (FLGo's modules keep PyTorch's
defaults): kernels `kaiming_uniform_(a=√5)`, i.e. U(−1/√fan_in, 1/√fan_in) with fan_in = inputs × kernel
area, and biases U(−1/√fan_in, 1/√fan_in); `flax` keeps Flax's defaults (LeCun-normal kernels, zero
biases). The FMNIST linear model's bias is zero under both (the paper sets it so). The two train very
differently early on (on the embedded job, FedBuff, test accuracy at 4,320 virtual units was 0.77 with
Flax's init and 0.45 with PyTorch's), which moves AULC and FedPSA's M0: `torch` is the paper's.

Models with a feature extractor (every one but `Linear`) take `return_features=True` and then return
`(features, logits)`: the features are the input of the last Dense layer, the classifier (FedPAC's split,
docs/methods.md). The default call `model.apply(params, x)` returns the logits, and parameter names do not
depend on the flag, so one parameter tree serves both calls.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
from jax import lax

from fedpsa_jax import choices
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.validation import error

# Images per convolution in `batch_chunked_conv` on CPU: what benchmarks/conv_weight_grad.py measured
# fastest for the paper's convs (4 and 8 tie within a few %; 8 makes half as many ops to compile).
CPU_CONV_CHUNK = 8


def max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
  """2x2 max-pool, stride 2, as a reshape and a max when height and width are even.

  Same values and gradients as `nn.max_pool(x, (2, 2), strides=(2, 2))` (and PyTorch's max_pool2d):
  each window's output gradient goes to its first maximum, in row-major window order. Computed as
  elementwise selects instead of XLA's select-and-scatter, which is much slower on CPU (timings:
  docs/performance.md). (Autodiff of a plain reshape + max would split a tie's gradient evenly.)
  """
  b, h, w, c = x.shape
  if h % 2 or w % 2:
    return nn.max_pool(x, (2, 2), strides=(2, 2))
  return _even_max_pool_2x2(x)


def _window_view(x: jnp.ndarray) -> jnp.ndarray:
  """[B, H, W, C] as [B, H/2, 2, W/2, 2, C]: axes 2 and 4 index the position inside each 2x2 window."""
  b, h, w, c = x.shape
  return x.reshape(b, h // 2, 2, w // 2, 2, c)


def _windows(x: jnp.ndarray) -> list[jnp.ndarray]:
  """The four elements of every 2x2 window, in row-major window order, each [B, H/2, W/2, C]."""
  x = _window_view(x)
  return [x[:, :, i, :, j] for i in (0, 1) for j in (0, 1)]


@jax.custom_jvp
def _even_max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
  return _window_view(x).max(axis=(2, 4))


@_even_max_pool_2x2.defjvp
def _even_max_pool_2x2_jvp(primals, tangents):
  (x,), (x_dot,) = primals, tangents
  y = _even_max_pool_2x2(x)
  xs, ts = _windows(x), _windows(x_dot)
  y_dot = ts[3]
  for xi, ti in zip(xs[2::-1], ts[2::-1]):  # the first maximum wins: test in reverse, innermost last
    y_dot = jnp.where(xi == y, ti, y_dot)
  return y, y_dot


def batch_chunked_conv(lhs: jnp.ndarray, rhs: jnp.ndarray, *args, **kwargs) -> jnp.ndarray:
  """`lax.conv_general_dilated` whose kernel gradient is computed, on CPU, in chunks of `CPU_CONV_CHUNK` images.

  XLA:CPU's kernel-gradient convolution slows down sharply with the batch (the output gradient is its
  "kernel"; past the caches its time grows faster than the batch; timings: docs/performance.md). The forward
  value and the input gradient are the plain convolution's. Only the JVP's kernel term is written per
  chunk, so reverse mode (its transpose) sums one small kernel-gradient conv per chunk, and forward
  mode, vmap and grad-of-grad still work. Other platforms run the plain convolution (cuDNN's is fast).
  """
  dimension_numbers = kwargs.get("dimension_numbers") or (args[4] if len(args) > 4 else None)
  batch_axis = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers).lhs_spec[0]
  size = lhs.shape[batch_axis]

  def plain(lhs, rhs):
    return lax.conv_general_dilated(lhs, rhs, *args, **kwargs)

  if size <= CPU_CONV_CHUNK or kwargs.get("batch_group_count", 1) != 1:
    return plain(lhs, rhs)

  def kernel_term(lhs, rhs_dot):
    """conv(lhs, rhs_dot) as a concatenation of per-chunk convs: linear in rhs_dot, so its transpose is
    the sum of the chunks' kernel gradients."""
    def chunked(lhs, rhs_dot):
      chunks = [lax.slice_in_dim(lhs, start, min(start + CPU_CONV_CHUNK, size), axis=batch_axis)
                for start in range(0, size, CPU_CONV_CHUNK)]
      return jnp.concatenate([plain(chunk, rhs_dot) for chunk in chunks], axis=batch_axis)
    return lax.platform_dependent(lhs, rhs_dot, cpu=chunked, default=plain)

  @jax.custom_jvp
  def conv(lhs, rhs):
    return plain(lhs, rhs)

  @conv.defjvp
  def conv_jvp(primals, tangents):
    (lhs, rhs), (lhs_dot, rhs_dot) = primals, tangents
    return plain(lhs, rhs), plain(lhs_dot, rhs) + kernel_term(lhs, rhs_dot)

  return conv(lhs, rhs)


INITS = choices.INITS  # model.init


def torch_uniform(bound: float) -> nn.initializers.Initializer:
  """U(−bound, bound), PyTorch's `init.uniform_(-bound, bound)`."""
  def init(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def layer_init(init: str, fan_in: int, zero_bias: bool = False) -> dict[str, Any]:
  """`kernel_init` and `bias_init` of a Dense or Conv layer with `fan_in` inputs per output (inputs ×
  kernel area) under the scheme `init` (one of `INITS`; see the module docstring).

  PyTorch's kernel draw, `kaiming_uniform_(a=√5)`, has bound gain·√(3/fan_in) with gain = √(2/(1+a²)) =
  √(1/3): 1/√fan_in, which is Flax's `variance_scaling(1/3, 'fan_in', 'uniform')` (bound √(3·scale/fan_in)).
  Its bias bound is 1/√fan_in as well (`nn.Linear.reset_parameters`, `nn.Conv2d` alike).
  """
  if init not in INITS:
    raise ValueError(f"model.init={init!r} is not a known initialisation; allowed: {', '.join(sorted(INITS))}")
  if init == "flax":
    return {"bias_init": nn.initializers.zeros} if zero_bias else {}
  bound = 1.0 / fan_in ** 0.5
  return {"kernel_init": nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),
          "bias_init": nn.initializers.zeros if zero_bias else torch_uniform(bound)}


def dense(x: jnp.ndarray, features: int, init: str, zero_bias: bool = False) -> jnp.ndarray:
  """A Dense layer on the last axis of `x`, initialised by `layer_init`."""
  return nn.Dense(features, **layer_init(init, x.shape[-1], zero_bias))(x)


def _conv_block(x: jnp.ndarray, features: int, init: str, padding: str = "SAME") -> jnp.ndarray:
  """5x5 convolution, ReLU, 2x2 max-pool: the block both paper CNNs are built from (MNIST's convs keep the
  size, `SAME`; CIFAR's are unpadded, `VALID`, as in FLGo's model).

  Pooled before the ReLU: max and ReLU commute (ReLU is monotone), so values and gradients are the same,
  and the ReLU runs on a quarter of the elements (timing: docs/performance.md).
  """
  x = nn.Conv(features, (5, 5), padding=padding, conv_general_dilated=batch_chunked_conv,
              **layer_init(init, 5 * 5 * x.shape[-1]))(x)
  return nn.relu(max_pool_2x2(x))


class MnistCNN(nn.Module):
  """MNIST CNN: conv5x5-32, pool, conv5x5-64, pool, dense 512, dense `num_classes` (1.66M params)."""

  num_classes: int = 10
  param_init: str = "torch"  # one of INITS (not `init`: that is the Module method)

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = _conv_block(x, 32, self.param_init)
    x = _conv_block(x, 64, self.param_init)
    x = x.reshape((x.shape[0], -1))
    features = nn.relu(dense(x, 512, self.param_init))
    logits = dense(features, self.num_classes, self.param_init)
    return (features, logits) if return_features else logits


class Linear(nn.Module):
  """The FMNIST model: one dense layer from the flattened image to the logits, bias initialised to 0."""

  num_classes: int = 10
  param_init: str = "torch"  # one of INITS (not `init`: that is the Module method)

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = x.reshape((x.shape[0], -1))
    return dense(x, self.num_classes, self.param_init, zero_bias=True)


class CifarCNN(nn.Module):
  """CIFAR CNN, FLGo's `cifar10_classification` model (the one the paper's CIFAR tables were run with):
  unpadded conv5x5-64, pool, unpadded conv5x5-64, pool (32 → 28 → 14 → 10 → 5: 5·5·64 = 1,600 features),
  dense 384, dense 192, dense `num_classes`: 797,962 parameters (815,332 with CIFAR-100's 100 classes)."""

  num_classes: int = 10
  param_init: str = "torch"  # one of INITS (not `init`: that is the Module method)

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = _conv_block(x, 64, self.param_init, padding="VALID")
    x = _conv_block(x, 64, self.param_init, padding="VALID")
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(dense(x, 384, self.param_init))
    features = nn.relu(dense(x, 192, self.param_init))
    logits = dense(features, self.num_classes, self.param_init)
    return (features, logits) if return_features else logits


class AiFedCNN(nn.Module):
  """AiFed's MNIST/FMNIST CNN (Sec. V-A): conv-64, conv-128 ("two shallow layers"), dense 256, dense 512
  ("two deep layers"), then the `num_classes` output layer (~1.95M params on 28x28x1).

  The paper gives only the filter and unit counts. Read here: both dense layers are hidden (the output
  layer comes on top, as a classifier needs); each conv is this file's 5x5 SAME + ReLU + 2x2 max-pool
  block; `filters` doubles them for CIFAR-10 (`aifed_cnn` uses the MNIST widths).
  """

  num_classes: int = 10
  param_init: str = "torch"  # one of INITS (not `init`: that is the Module method)
  filters: tuple[int, int] = (64, 128)
  units: tuple[int, int] = (256, 512)

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = _conv_block(x, self.filters[0], self.param_init)
    x = _conv_block(x, self.filters[1], self.param_init)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(dense(x, self.units[0], self.param_init))
    features = nn.relu(dense(x, self.units[1], self.param_init))
    logits = dense(features, self.num_classes, self.param_init)
    return (features, logits) if return_features else logits


class TinyMLP(nn.Module):
  """A two-layer MLP (hidden 16) for fast tests and hand checks; not a paper model."""

  num_classes: int = 10
  param_init: str = "torch"  # one of INITS (not `init`: that is the Module method)
  hidden: int = 16

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = x.reshape((x.shape[0], -1))
    features = nn.relu(dense(x, self.hidden, self.param_init))
    logits = dense(features, self.num_classes, self.param_init)
    return (features, logits) if return_features else logits


# model.name -> module: the built-in ones (choices.MODELS), then those added by `register_model`.
MODELS = {"mnist_cnn": MnistCNN, "linear": Linear, "cifar_cnn": CifarCNN, "tiny_mlp": TinyMLP,
          "aifed_cnn": AiFedCNN}
# Models that accept `return_features=True` (a feature extractor below a Dense classifier).
FEATURE_MODELS = ("mnist_cnn", "cifar_cnn", "tiny_mlp", "aifed_cnn")


def register_model(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
  """Class decorator: makes a Linen module selectable as `config.model.name = name` in this process (as
  `strategies.register` does a strategy). A run builds it as `cls(num_classes=..., param_init=...)` (`param_init`
  one of INITS) and calls `model.apply(params, x)` on NHWC float32 images; `fits` checks it takes the data's."""

  def wrap(cls: type[nn.Module]) -> type[nn.Module]:
    MODELS[name] = cls
    choices.register("model.name", name)  # (what config validation reads: it imports no model)
    return cls

  return wrap


def classifier_layer(params: Mapping[str, Any]) -> str:
  """The name of the classifier, the last Dense layer (`Dense_<i>` with the largest i), in a model's
  parameters (`{'params': {...}}` or the inner dict)."""
  layers = params["params"] if "params" in params else params
  dense = [name for name in layers if name.startswith("Dense_")]
  if not dense:
    raise ValueError(f"no Dense layer among the parameters {sorted(layers)}")
  return max(dense, key=lambda name: int(name.split("_")[1]))


def has_convolution(apply_fn: Any, params: Any, x: jnp.ndarray) -> bool:
  """Whether `apply_fn(params, x)` runs a convolution (read from its jaxpr, nested calls included): on a CPU
  the local loop's best form depends on it (local.resolve_loop)."""

  def walk(jaxpr) -> bool:
    return any(eqn.primitive.name == "conv_general_dilated"
               or any(walk(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)) for eqn in jaxpr.eqns)

  return walk(jax.make_jaxpr(apply_fn)(params, x).jaxpr)


def fits(name: str, input_shape: tuple[int, ...], num_classes: int = 10) -> bool:
  """Whether the model `name` takes images of `input_shape` (H, W, C): initialised abstractly (`jax.eval_shape`,
  no arrays), every parameter is non-empty. Every model flattens what it needs, so any shape fits unless a
  convolution or pooling is larger than what reaches it (CifarCNN's unpadded 5x5 convs need 16x16 or more)."""
  x = jax.ShapeDtypeStruct((1, *input_shape), jnp.float32)
  try:
    shapes = jax.eval_shape(get_model(name, num_classes).init, jax.random.key(0), x)
  except (ArithmeticError, TypeError, ValueError):  # (a 1/√fan_in bound with fan_in 0, a negative spatial size)
    return False
  return all(leaf.size > 0 for leaf in jax.tree.leaves(shapes))


def check_fits(name: str, input_shape: tuple[int, ...], num_classes: int, data: str) -> None:
  """ConfigError naming the models that fit, when the model `name` does not take `data`'s images (`fits`)."""
  if fits(name, input_shape, num_classes):
    return
  shape = "x".join(str(d) for d in input_shape)
  fitting = [other for other in MODELS if fits(other, input_shape, num_classes)]
  raise ConfigError(error("model.name", name, f"a model that takes the {shape} images of {data}: "
                          f"{', '.join(fitting) or 'none of ' + ', '.join(MODELS)}"))


@functools.cache
def get_model(name: str, num_classes: int, init: str = "torch") -> nn.Module:
  """The model called `name` (one of `MODELS`) with `num_classes` outputs, initialised by `init` (`INITS`).

  One instance per (name, num_classes, init) in a process: a Linen module is an immutable description, and
  its bound `apply` equals another only if their module is the same object. The jitted functions that take
  `model.apply` as a static argument (local training, evaluation, the sketch) then see the same argument
  in every run a process builds (a sweep's members, a notebook's runs) and trace and compile once."""
  if name not in MODELS:
    raise ValueError(f"model.name={name!r} is not a known model; allowed: {sorted(MODELS)}")
  if init not in INITS:
    raise ValueError(f"model.init={init!r} is not a known initialisation; allowed: {', '.join(sorted(INITS))}")
  return MODELS[name](num_classes=num_classes, param_init=init)
