"""The paper's models have the paper's shapes: parameter counts from each layer's shape, by hand.

FLGo's modules (the harness the paper's numbers came from): MNIST CNN conv5x5 1→32 and 32→64 with padding 2,
dense 3136→512→10; FMNIST's linear 784→10; CIFAR conv5x5 3→64 and 64→64 unpadded, dense 1600→384→192→classes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from fedpsa_jax import sensitivity
from fedpsa_jax.models import get_model


def conv(k: int, c_in: int, c_out: int) -> int:
  return k * k * c_in * c_out + c_out


def dense(n_in: int, n_out: int) -> int:
  return n_in * n_out + n_out


# (model, classes, input shape, layer-by-layer count, the count the issue states)
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
