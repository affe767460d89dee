"""The paper's models (Sec. 6.1; `aifed_cnn`: AiFed's Sec. V-A) as pure Flax Linen modules, used as
`model.apply(params, x)`.

Inputs are NHWC float32 images; every model flattens what it needs itself, so any model can be paired
with any dataset whose images it accepts.

Models with a feature extractor (every one but `Linear`) take `return_features=True` and then return
`(features, logits)`: the features are the input of the last Dense layer, the classifier (FedPAC's split,
DESIGN §4). The default call `model.apply(params, x)` returns the logits, and parameter names do not
depend on the flag, so one parameter tree serves both calls.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp


def max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
  """2x2 max-pool, stride 2, as a reshape and a max when height and width are even.

  Same values as `nn.max_pool(x, (2, 2), strides=(2, 2))`, but its gradient is an elementwise mask
  instead of XLA's select-and-scatter, which on this 2-core CPU took 22 ms forward and backward on
  the MNIST CNN's first pooling (B = 64) against 4 ms here: a quarter of a whole SGD step.
  """
  b, h, w, c = x.shape
  if h % 2 or w % 2:
    return nn.max_pool(x, (2, 2), strides=(2, 2))
  return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _conv_block(x: jnp.ndarray, features: int) -> jnp.ndarray:
  """5x5 SAME convolution, ReLU, 2x2 max-pool: the block both paper CNNs are built from."""
  x = nn.relu(nn.Conv(features, (5, 5), padding="SAME")(x))
  return max_pool_2x2(x)


class MnistCNN(nn.Module):
  """MNIST CNN: conv5x5-32, pool, conv5x5-64, pool, dense 512, dense `num_classes` (1.66M params)."""

  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = _conv_block(x, 32)
    x = _conv_block(x, 64)
    x = x.reshape((x.shape[0], -1))
    features = nn.relu(nn.Dense(512)(x))
    logits = nn.Dense(self.num_classes)(features)
    return (features, logits) if return_features else logits


class Linear(nn.Module):
  """The FMNIST model: one dense layer from the flattened image to the logits, bias initialised to 0."""

  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(self.num_classes, bias_init=nn.initializers.zeros)(x)


class CifarCNN(nn.Module):
  """CIFAR CNN: conv5x5-64, pool, conv5x5-64, pool, dense 384, dense 192, dense `num_classes`."""

  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = _conv_block(x, 64)
    x = _conv_block(x, 64)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(384)(x))
    features = nn.relu(nn.Dense(192)(x))
    logits = nn.Dense(self.num_classes)(features)
    return (features, logits) if return_features else logits


class AiFedCNN(nn.Module):
  """AiFed's MNIST/FMNIST CNN (Sec. V-A): conv-64, conv-128 ("two shallow layers"), dense 256, dense 512
  ("two deep layers"), then the `num_classes` output layer (~1.95M params on 28x28x1).

  The paper gives only the filter and unit counts. Read here: both dense layers are hidden (the output
  layer comes on top, as a classifier needs); each conv is this file's 5x5 SAME + ReLU + 2x2 max-pool
  block; `filters` doubles them for CIFAR-10 (`aifed_cnn` uses the MNIST widths).
  """

  num_classes: int = 10
  filters: tuple[int, int] = (64, 128)
  units: tuple[int, int] = (256, 512)

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = _conv_block(x, self.filters[0])
    x = _conv_block(x, self.filters[1])
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.units[0])(x))
    features = nn.relu(nn.Dense(self.units[1])(x))
    logits = nn.Dense(self.num_classes)(features)
    return (features, logits) if return_features else logits


class TinyMLP(nn.Module):
  """A two-layer MLP (hidden 16) for fast tests and hand checks; not a paper model."""

  num_classes: int = 10
  hidden: int = 16

  @nn.compact
  def __call__(self, x: jnp.ndarray, return_features: bool = False):
    x = x.reshape((x.shape[0], -1))
    features = nn.relu(nn.Dense(self.hidden)(x))
    logits = nn.Dense(self.num_classes)(features)
    return (features, logits) if return_features else logits


MODELS = {"mnist_cnn": MnistCNN, "linear": Linear, "cifar_cnn": CifarCNN, "tiny_mlp": TinyMLP,
          "aifed_cnn": AiFedCNN}
# Models that accept `return_features=True` (a feature extractor below a Dense classifier).
FEATURE_MODELS = ("mnist_cnn", "cifar_cnn", "tiny_mlp", "aifed_cnn")


def classifier_layer(params: Mapping[str, Any]) -> str:
  """The name of the classifier, the last Dense layer (`Dense_<i>` with the largest i), in a model's
  parameters (`{'params': {...}}` or the inner dict)."""
  layers = params["params"] if "params" in params else params
  dense = [name for name in layers if name.startswith("Dense_")]
  if not dense:
    raise ValueError(f"no Dense layer among the parameters {sorted(layers)}")
  return max(dense, key=lambda name: int(name.split("_")[1]))


def get_model(name: str, num_classes: int) -> nn.Module:
  """The model called `name` (one of `MODELS`) with `num_classes` outputs."""
  if name not in MODELS:
    raise ValueError(f"model.name={name!r} is not a known model; allowed: {sorted(MODELS)}")
  return MODELS[name](num_classes=num_classes)
