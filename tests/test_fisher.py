"""The factored Fisher (fisher.py) against the reference per-sample path, on every model we ship."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from fedpsa_jax import fisher, sensitivity
from fedpsa_jax.models import MODELS, get_model
from numerics import assert_close, f32_tolerance

INPUTS = {"mnist_cnn": (28, 28, 1), "linear": (28, 28, 1), "cifar_cnn": (32, 32, 3), "tiny_mlp": (6, 6, 1),
          "aifed_cnn": (28, 28, 1)}


def tolerance(x) -> float:
  """Rounding noise of a Fisher diagonal (or gradient) of batch `x` in float32: a per-sample gradient
  element of a conv kernel sums one product per output position (at most the input's elements), the
  Fisher then sums its squares over the batch."""
  return f32_tolerance(x[0].size * x.shape[0], depth=2)


def setup(name, batch=6, classes=10, seed=0):
  model = get_model(name, classes)
  x = jax.random.normal(jax.random.key(seed), (batch, *INPUTS[name]))
  y = jax.random.randint(jax.random.key(seed + 1), (batch,), 0, classes)
  return model, model.init(jax.random.key(seed + 2), x[:1]), x, y


def test_every_model_is_covered():
  assert set(INPUTS) == set(MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(INPUTS))
@pytest.mark.parametrize("masked", [False, True])
def test_factored_equals_reference(name, masked):
  model, params, x, y = setup(name)
  mask = (jnp.arange(x.shape[0]) % 4 != 1) if masked else None  # a partial (padded) batch

  @jax.jit
  def both(p):
    g, f = fisher.gradient_and_fisher(model.apply, p, x, y, mask)
    f_ref = sensitivity.fisher_diagonal(model.apply, p, x, y, mask, chunk_size=4, method="per_sample")
    g_ref = sensitivity.mean_gradient(model.apply, p, x, y, mask)
    s = sensitivity.sensitivity(model.apply, p, x, y, mask, method="factored")
    s_ref = sensitivity.sensitivity(model.apply, p, x, y, mask, chunk_size=4, method="per_sample")
    return (f, f_ref), (g, g_ref), (s, s_ref)

  for got, want in both(params):
    assert_close(got, want, tolerance(x))


@pytest.mark.slow
def test_batched_conv_loop_equals_fori():
  model, params, x, y = setup("cifar_cnn", batch=5)
  a = jax.jit(lambda p: fisher.gradient_and_fisher(model.apply, p, x, y, conv_loop="fori")[1])(params)
  b = jax.jit(lambda p: fisher.gradient_and_fisher(model.apply, p, x, y, conv_loop="batched")[1])(params)
  assert_close(a, b, tolerance(x))


class StridedNet(nn.Module):
  """Convs with stride, dilation and VALID/explicit padding, a grouped conv (per-sample fallback) and a
  dense layer applied twice: every branch of the factored path."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2), padding="VALID")(x))
    x = nn.relu(nn.Conv(4, (3, 2), kernel_dilation=(2, 1), padding=((1, 2), (0, 1)))(x))
    x = nn.relu(nn.Conv(4, (3, 3), feature_group_count=2, padding="SAME")(x))
    x = x.reshape((x.shape[0], -1))
    shared = nn.Dense(x.shape[-1])
    x = shared(nn.relu(shared(x)))
    return nn.Dense(3)(x)


@pytest.mark.slow
@pytest.mark.parametrize("masked", [False, True])
def test_unusual_layers_fall_back_or_factor_exactly(masked):
  model = StridedNet()
  x = jax.random.normal(jax.random.key(0), (6, 11, 9, 2))
  y = jnp.arange(6) % 3
  params = model.init(jax.random.key(1), x[:1])
  mask = jnp.array([1, 1, 0, 1, 0, 1], bool) if masked else None
  f = jax.jit(lambda p: fisher.gradient_and_fisher(model.apply, p, x, y, mask, chunk_size=4)[1])(params)
  f_ref = jax.jit(lambda p: sensitivity.fisher_diagonal(model.apply, p, x, y, mask, chunk_size=4,
                                                       method="per_sample"))(params)
  assert_close(f, f_ref, tolerance(x))


@pytest.mark.slow
def test_auto_method_selection():
  model, params, x, y = setup("tiny_mlp")
  assert sensitivity.resolve_fisher_method(model.apply, "auto") == "factored"
  plain = lambda p, xs: model.apply(p, xs)  # not a bound module apply: only the reference applies
  assert sensitivity.resolve_fisher_method(plain, "auto") == "per_sample"
  with pytest.raises(ValueError, match="runtime.fisher="):
    sensitivity.resolve_fisher_method(plain, "magic")
  assert_close(sensitivity.fisher_diagonal(plain, params, x, y),
               sensitivity.fisher_diagonal(model.apply, params, x, y), tolerance(x))
