"""The values a config field may name, for the fields whose vocabulary is fixed in code.

A leaf module (no project or JAX imports): `config` validates against these tuples without importing
the models, the executor or the data code that implement them, so that `config`, `io`, `sweep` and
`report` import without JAX. The modules that implement a vocabulary import its tuple from here (or a
test checks that theirs is the same). The strategies are the exception: `method` is checked against the
strategy registry, which notebooks extend at run time.
"""

from __future__ import annotations

import re

# data.name: the names with a meaning fixed in code (the paper's tfds datasets, with their normalisation
# constants, and the embedded ones); any other tfds dataset name is accepted too (data/sources.py).
DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "mnist_5k", "synthetic")
EMBEDDED_DATASETS = ("mnist_5k", "synthetic")  # read without tfds; they have no official test split
# Any other data.name is a tfds dataset: `name[/config][:version]`, tfds' own grammar (lower case).
TFDS_NAME = re.compile(r"[a-z0-9_]+(/[a-z0-9_.\-]+)?(:\d+\.\d+\.\d+)?")
TEST_SPLITS = ("holdout", "official")  # data.test_split
PARTITIONERS = ("dirichlet_flgo", "dirichlet", "iid", "label_groups", "labels_per_client")  # partition.method
MODELS = ("mnist_cnn", "linear", "cifar_cnn", "tiny_mlp", "aifed_cnn")  # model.name (models.MODELS)
INITS = ("torch", "flax")  # model.init
LOCAL_LOOPS = ("auto", "unrolled", "rolled")  # runtime.loop
EXECUTIONS = ("auto", "loop", "vmap", "sharded")  # runtime.execution (sim/executor.py)
LATENCY_DISTRIBUTIONS = ("uniform", "long_tail")  # sim.latency.distribution
LATENCY_RESAMPLING = ("fixed", "per_dispatch")  # sim.latency.resample
CALIBRATION_KINDS = ("gaussian", "real")  # fedpsa.calibration (data/calibration.py)
FISHER_METHODS = ("auto", "factored", "per_sample")  # runtime.fisher


def is_dataset_name(name: object) -> bool:
  """Whether `name` can be a `data.name`: one of DATASETS or a tfds dataset name."""
  return isinstance(name, str) and (name in DATASETS or TFDS_NAME.fullmatch(name) is not None)
