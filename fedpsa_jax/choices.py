"""The values a config field may name, for the fields whose vocabulary is fixed in code.

A leaf module (no project or JAX imports): `config` validates against these tuples without importing
the models, the executor or the data code that implement them, so that `config`, `io`, `sweep` and
`report` import without JAX. The modules that implement a vocabulary import its tuple from here (or a
test checks that theirs is the same). Two vocabularies are open: `model.name` and `runtime.execution` allow,
beside their built-in names, those that the registries of the modules implementing them add at run time
(`models.register_model`, `sim.executor.register_backend`: `register`, `allowed`), kept here so that config
validation needs neither module; `method` is checked against the strategy registry itself.
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
MODELS = ("mnist_cnn", "linear", "cifar_cnn", "tiny_mlp", "aifed_cnn")  # model.name, built in (models.MODELS)
INITS = ("torch", "flax")  # model.init
LOCAL_LOOPS = ("auto", "unrolled", "rolled")  # runtime.loop
EXECUTIONS = ("auto", "loop", "vmap", "sharded")  # runtime.execution, built in (sim/executor.py)
LATENCY_DISTRIBUTIONS = ("uniform", "long_tail")  # sim.latency.distribution
LATENCY_RESAMPLING = ("fixed", "per_dispatch")  # sim.latency.resample
CALIBRATION_KINDS = ("gaussian", "real")  # fedpsa.calibration (data/calibration.py)
FISHER_METHODS = ("auto", "factored", "per_sample")  # runtime.fisher
# Sec. 6.1's model per dataset (FMNIST: one fully connected layer, so no FedPAC); the embedded datasets take the
# model of what they hold (mnist_5k: MNIST images) or the small test model (synthetic). The run configs that
# follow the dataset use it (configs/paper/experiment.py, configs/casa.py; fedpsa_lab.paper re-exports it).
PAPER_MODELS = {"mnist": "mnist_cnn", "fashion_mnist": "linear", "cifar10": "cifar_cnn", "cifar100": "cifar_cnn",
                "mnist_5k": "mnist_cnn", "synthetic": "tiny_mlp"}

# The open vocabularies: {field: its built-in names} and the names registered beside them, in their order.
_BUILT_IN = {"model.name": MODELS, "runtime.execution": EXECUTIONS}
_REGISTERED: dict[str, list[str]] = {field: [] for field in _BUILT_IN}


def register(field: str, name: str) -> None:
  """Allows `name` as a value of the open field `field` ('model.name' or 'runtime.execution'), for this process
  (called by the registry of the module that implements the field)."""
  if name not in allowed(field):
    _REGISTERED[field].append(name)


def allowed(field: str) -> tuple[str, ...]:
  """The values the open field `field` allows: its built-in names, then those registered."""
  return _BUILT_IN[field] + tuple(_REGISTERED[field])


def is_dataset_name(name: object) -> bool:
  """Whether `name` can be a `data.name`: one of DATASETS or a tfds dataset name."""
  return isinstance(name, str) and (name in DATASETS or TFDS_NAME.fullmatch(name) is not None)
