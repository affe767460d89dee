"""One run of the paper's main grid: `configs/paper/experiment.py:method=...,dataset=...,alpha=...`.

Datasets and models as in Sec. 6.1: mnist -> MNIST CNN, fashion_mnist -> linear, cifar10 / cifar100 ->
CIFAR CNN; 50 clients, FLGo Dirichlet partition, concurrency 20%, 5 epochs, batch 64, lr 0.01 decaying
0.999 per round, response times uniform on [10, 500], 10 virtual days, the stratified 10% holdout
test set. Any other field can be overridden the same way (`seed=1`, `virtual_days=1`, `local.lr=0.05`;
`config.parse_arg`); the model follows the dataset (`fedpsa_jax.choices.PAPER_MODELS`) unless `model=` is given.
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax.choices import PAPER_MODELS
from fedpsa_jax.config import ConfigError, base_config, parse_arg, set_fields


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  _, overrides = parse_arg(arg)
  c = base_config()
  c.sim.virtual_days = 10.0
  c.eval.every_days = 0.05
  c = set_fields(c, overrides)
  if c.data.name not in PAPER_MODELS:
    raise ConfigError(f"dataset={c.data.name!r} is invalid; allowed: {', '.join(PAPER_MODELS)}")
  if "model.name" not in overrides:  # the paper's model unless one is asked for
    c.model.name = PAPER_MODELS[c.data.name]
  return c
