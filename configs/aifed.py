"""AiFed's setting (You et al., Sec. V-A, Tables III-IV): `configs/aifed.py[:arg]`.

Paper setting (no arg): MNIST from tfds (`mnist`, the official 60k/10k split: the paper partitions the
60k training images among the clients and tests on the 10k), 40 clients, non-IID partitions of 2-6
labels per client (`labels_per_client`), AiFed's CNN (conv 64/128, dense 256/512: `aifed_cnn`), 2 local
epochs, lr 0.003 (no decay: the paper names none), batch 48, participant fraction 0.2 (8 clients in
flight), the integrated AiFed (IE) with a counter of 5, target accuracy 0.90 (the paper's round_t
target for non-IID MNIST). The paper runs 400 rounds; 1 virtual day here is ~2,700 client updates
(~540 rounds at K = 5) with the default response times (uniform on [10, 500] units).

`:smoke`: the same on the embedded `mnist_5k` (no download; the holdout test split), 0.015 virtual days
(~35 client updates; ~2 minutes on a busy 2-core CPU, where 0.02 days took 3 minutes and reached 0.65).
Its lr is 0.05: at the paper's 0.003, plain SGD moves too little in so few updates to show learning.

`arg` (`config.parse_arg`): `smoke` and/or `field=value` overrides, comma-separated in any order
(`configs/aifed.py:smoke,method=fedbuff`, `configs/aifed.py:aifed.variant=almu,aifed.lir=label_number`).
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax.config import base_config, parse_arg, set_fields


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = parse_arg(arg, smoke=False)
  c = base_config()
  c.method = "aifed"
  c.data.name = "mnist"
  c.data.test_split = "official"
  c.model.name = "aifed_cnn"
  c.partition.method = "labels_per_client"
  c.partition.num_clients = 40
  c.partition.min_labels = 2
  c.partition.max_labels = 6
  c.local.epochs = 2
  c.local.lr = 0.003
  c.local.lr_decay = 1.0
  c.local.batch_size = 48
  c.sim.concurrency = 0.2
  c.sim.virtual_days = 1.0
  c.eval.every_days = 0.01
  c.eval.target_accuracy = 0.90
  c.aifed.variant = "aifed"
  c.aifed.lir = "entropy"
  if options.smoke:
    c.data.name = "mnist_5k"
    c.data.test_split = "holdout"
    c.local.lr = 0.05
    c.sim.virtual_days = 0.015
    c.eval.every_days = 0.003
    c.eval.target_accuracy = 0.5
    c.checkpoint.every_days = 0.0
  return set_fields(c, overrides)
