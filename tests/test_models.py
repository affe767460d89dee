"""The paper's models have the paper's shapes: parameter counts from each layer's shape, by hand.

FLGo's modules (the harness the paper's numbers came from): MNIST CNN conv5x5 1→32 and 32→64 with padding 2,
dense 3136→512→10; FMNIST's linear 784→10; CIFAR conv5x5 3→64 and 64→64 unpadded, dense 1600→384→192→classes.
"""

from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import pytest

from fedpsa_jax import models, sensitivity
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.models import get_model, has_convolution


def conv(k: int, c_in: int, c_out: int) -> int:
  return k * k * c_in * c_out + c_out


def dense(n_in: int, n_out: int) -> int:
  return n_in * n_out + n_out


# (model, classes, input shape, layer-by-layer count, the parameter count the model must have)
PAPER_MODELS = [
    ("mnist_cnn", 10, (28, 28, 1), conv(5, 1, 32) + conv(5, 32, 64) + dense(7 * 7 * 64, 512) + dense(512, 10),
     1_663_370),
    ("linear", 10, (28, 28, 1), dense(28 * 28, 10), 7_850),
    # 32 → (unpadded 5x5) 28 → pool 14 → (unpadded) 10 → pool 5: 5·5·64 = 1,600 features
    ("cifar_cnn", 10, (32, 32, 3),
     conv(5, 3, 64) + conv(5, 64, 64) + dense(1600, 384) + dense(384, 192) + dense(192, 10), 797_962),
    ("cifar_cnn", 100, (32, 32, 3),
     conv(5, 3, 64) + conv(5, 64, 64) + dense(1600, 384) + dense(384, 192) + dense(192, 100), 815_332),
]


@pytest.mark.parametrize("name,classes,shape,by_layers,stated", PAPER_MODELS)
def test_paper_model_parameter_counts(name, classes, shape, by_layers, stated):
  assert by_layers == stated
  model = get_model(name, classes)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *shape)))
  assert sensitivity.num_params(params) == stated
  logits = jax.eval_shape(model.apply, params, jnp.zeros((2, *shape)))
  assert logits.shape == (2, classes)


def test_cifar_cnn_flattens_1600_unpadded_features():
  model = get_model("cifar_cnn", 10)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert params["params"]["Dense_0"]["kernel"].shape == (1600, 384)
  assert [params["params"][f"Conv_{i}"]["kernel"].shape for i in range(2)] == [(5, 5, 3, 64), (5, 5, 64, 64)]


# --- initialisation ---------------------------------------------------------------------------------
# Every model and input shape the configs use; AiFed's CNN on MNIST (its largest layer, 6,272 x 256).
INIT_MODELS = [("mnist_cnn", 10, (28, 28, 1)), ("linear", 10, (28, 28, 1)), ("cifar_cnn", 100, (32, 32, 3)),
               ("aifed_cnn", 10, (28, 28, 1)), ("tiny_mlp", 10, (4,))]


def _layers(name: str, classes: int, shape: tuple, init: str, seed: int = 0) -> dict:
  model = get_model(name, classes, init)
  return jax.jit(model.init)(jax.random.key(seed), jnp.zeros((1, *shape)))["params"]


def _fan_in(kernel) -> int:
  """Inputs per output, from the kernel's shape alone: Dense [in, out], Conv [kh, kw, in, out]."""
  return int(np.prod(kernel.shape[:-1]))


def _assert_uniform(values: np.ndarray, bound: float, what: str) -> None:
  """`values` look like iid draws from U(−bound, bound): inside the bound, reaching near it, mean 0,
  E[x²] = bound²/3 and E[x⁴]/E[x²]² = 9/5 (a normal's is 3), each within 5 standard errors."""
  x = values.astype(np.float64).ravel()
  n = x.size
  assert np.all(np.abs(x) <= bound * (1 + 1e-6)), f"{what}: outside ±{bound}"
  if n >= 1000:  # the largest of n draws is within bound·(1 − 5/n) with probability 1 − e^-5 per side
    assert np.abs(x).max() >= bound * (1 - 5 / n), f"{what}: never near ±{bound}"
  second = bound ** 2 / 3
  assert abs(x.mean()) <= 5 * np.sqrt(second / n), f"{what}: mean {x.mean()}"
  # Var(x²) = E[x⁴] − E[x²]² = bound⁴/5 − bound⁴/9 = 4·bound⁴/45
  assert abs(np.mean(x ** 2) - second) <= 5 * np.sqrt(4 * bound ** 4 / 45 / n), f"{what}: E[x²] {np.mean(x ** 2)}"
  if n >= 1000:
    kurtosis = np.mean(x ** 4) / np.mean(x ** 2) ** 2
    assert abs(kurtosis - 9 / 5) <= 0.15 + 10 / np.sqrt(n), f"{what}: kurtosis {kurtosis}"


@pytest.mark.parametrize("name,classes,shape", INIT_MODELS)
def test_torch_init_draws_pytorch_bounds(name, classes, shape):
  """PyTorch's Conv2d/Linear defaults: kernel kaiming_uniform(a=√5) = U(±1/√fan_in), bias U(±1/√fan_in);
  the FMNIST linear model's bias is zero (the paper's choice)."""
  for layer, p in _layers(name, classes, shape, "torch").items():
    kernel, bias = np.asarray(p["kernel"]), np.asarray(p["bias"])
    bound = 1 / np.sqrt(_fan_in(kernel))
    _assert_uniform(kernel, bound, f"{name}.{layer}.kernel")
    if name == "linear":
      assert np.all(bias == 0), f"{name}.{layer}.bias"
    else:
      _assert_uniform(bias, bound, f"{name}.{layer}.bias")
      assert np.all(bias != 0)


@pytest.mark.parametrize("name,classes,shape", INIT_MODELS)
def test_flax_init_keeps_flax_defaults(name, classes, shape):
  """LeCun normal (a normal truncated at ±2σ, rescaled to variance 1/fan_in) and zero biases."""
  for layer, p in _layers(name, classes, shape, "flax").items():
    kernel = np.asarray(p["kernel"], np.float64).ravel()
    n, variance = kernel.size, 1 / _fan_in(p["kernel"])
    assert np.all(np.asarray(p["bias"]) == 0), f"{name}.{layer}.bias"
    # truncation at 2σ of the underlying normal: |w| ≤ 2·σ/0.8796 (jax rescales by the truncated std)
    assert np.abs(kernel).max() <= 2 / 0.87962566 * np.sqrt(variance) * (1 + 1e-6)
    # E[x⁴]/E[x²]² of a normal truncated at ±2σ is 2.5 (a uniform's is 1.8): 4th moment bound loose
    assert abs(np.mean(kernel ** 2) - variance) <= 5 * np.sqrt(1.5 * variance ** 2 / n), f"{name}.{layer}"
    if n >= 1000:
      assert np.mean(kernel ** 4) / np.mean(kernel ** 2) ** 2 > 2.2, f"{name}.{layer}: not normal-shaped"


@pytest.mark.slow
def test_init_is_the_configs_and_checked():
  """`model.init` reaches the model, defaults to torch, and a bad value names the field and the choices."""
  from fedpsa_jax import config as config_lib
  c = config_lib.base_config()
  assert c.model.init == "torch"
  c.model.init = "pytorch"
  with pytest.raises(ValueError, match=r"model\.init='pytorch'.*allowed: flax, torch"):
    config_lib.validate(c)
  with pytest.raises(ValueError, match=r"model\.init='lecun'.*allowed: flax, torch"):
    get_model("mnist_cnn", 10, "lecun")
  torch, flax_ = (_layers("mnist_cnn", 10, (28, 28, 1), i) for i in ("torch", "flax"))
  assert not np.allclose(np.asarray(torch["Dense_0"]["kernel"]), np.asarray(flax_["Dense_0"]["kernel"]))


@pytest.mark.parametrize("name,classes,shape", INIT_MODELS)
def test_has_convolution_reads_the_model(name, classes, shape):
  """True exactly for the models with a Conv layer among their parameters (the reference: their names)."""
  model = get_model(name, classes)
  x = jnp.zeros((2, *shape), jnp.float32)
  params = model.init(jax.random.key(0), x)
  convolves = any(layer.startswith("Conv") for layer in params["params"])
  assert has_convolution(model.apply, params, x) == convolves
  assert convolves == (name in ("mnist_cnn", "cifar_cnn", "aifed_cnn"))  # (both kinds are exercised)


def test_has_convolution_looks_inside_nested_calls():
  """A convolution inside a nested jitted call still counts."""
  kernel = jnp.ones((3, 3, 1, 2))
  conv_fn = lambda x: jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  x = jnp.ones((1, 5, 5, 1))
  assert has_convolution(lambda p, x: jax.jit(conv_fn)(x) * p, 1.0, x)
  assert not has_convolution(lambda p, x: jax.jit(jnp.tanh)(x) * p, 1.0, x)


@pytest.mark.parametrize("name,shape,fits", [
    # CifarCNN: two unpadded 5x5 convs, each followed by a 2x2 pool: H -> floor((H - 4) / 2) -> floor((. - 4) / 2),
    # which must stay >= 1: 16 -> 6 -> 1 fits, 15 -> 5 -> 0 does not (by hand).
    ("cifar_cnn", (16, 16, 3), True), ("cifar_cnn", (15, 15, 3), False), ("cifar_cnn", (8, 8, 1), False),
    ("cifar_cnn", (24, 28, 3), True),
    # The SAME-padded CNNs keep the size through each conv and halve it (rounding down) at each of two pools:
    # 4 -> 2 -> 1 fits, 3 -> 1 -> 0 does not.
    ("mnist_cnn", (4, 4, 1), True), ("mnist_cnn", (3, 3, 1), False), ("aifed_cnn", (24, 28, 3), True),
    ("linear", (1, 1, 1), True), ("tiny_mlp", (2, 3, 5), True),
])
def test_fits_follows_the_layer_arithmetic(name, shape, fits):
  assert models.fits(name, shape) is fits


def test_a_model_too_large_for_the_images_names_the_models_that_fit():
  with pytest.raises(ConfigError) as err:
    models.check_fits("cifar_cnn", (8, 8, 1), 10, "data.name='synthetic'")
  assert str(err.value) == ("model.name='cifar_cnn' is invalid; allowed: a model that takes the 8x8x1 images of "
                            "data.name='synthetic': mnist_cnn, linear, tiny_mlp, aifed_cnn")
