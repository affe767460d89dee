"""The paper's experimental setup (Sec. 6.1), shared by the sweep configs in `configs/paper/`.

Each `configs/paper/<result>.py` builds its sweep from these pieces: the run config of Sec. 6.1
(`paper_base`), the dataset axis with the paper's model per dataset (`dataset_axis`; `PAPER_MODELS`, the
simulator's one table of it, `fedpsa_jax.choices`, re-exported), the methods in the
paper's row order with their printed names, and the `:arg` options every paper config shares
(`parse_arg`, the grammar of `config.parse_arg`: `smoke` switches to the embedded data and tiny budgets;
`seeds=K` repeats each member; `field=value` changes a field of the base run config of every member, e.g.
`configs/paper/table1.py:smoke,local.epochs=2`).

(This module lives in the package rather than beside the configs, as big_vision's `configs/common.py`
does: config files are loaded by path, by absl's `--config` and by the notebook API from any working
directory or process, where only the installed package is importable, not `configs/`.)

Smoke variants keep the structure of each result (every row, column and grid point) and change only the
data and budget: the embedded 5,000 MNIST images stand in for every dataset, with `tiny_mlp` where the
paper uses a CNN (so FedPAC still has a feature extractor) and `linear` where the paper uses the linear
model (so FedPAC stays absent there, as in the paper), 20 clients, 1 local epoch, lr 0.05, FedPSA's
thermometer queue L_q = 5 (so κ weights the buffer within the run), the unrolled local loop (its compiles
shared by every member) and a budget of a hundredth of a virtual day. Their numbers show the pipeline works, not the
paper's results.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep
from fedpsa_jax.choices import PAPER_MODELS  # (re-exported: the simulator's one table of the paper's models)
from fedpsa_jax.validation import integer

# The paper's rows, in its order (Tables 1-3), and the names it prints.
METHODS = ("fedbuff", "fedavg", "fedasync", "ca2fl", "fedfa", "fedpac", "fedpsa")
DISPLAY_NAMES = {"fedbuff": "FedBuff (Base)", "fedavg": "FedAvg", "fedasync": "FedAsync", "ca2fl": "CA2FL",
                 "fedfa": "FedFa", "fedpac": "FedPAC", "fedpsa": "FedPSA (Ours)", "mnist": "MNIST",
                 "fashion_mnist": "FMNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "alpha": "α",
                 "no_t": "w/o T", "no_s": "w/o S", "no_ts": "w/o T&S", "full": "Full", "real": "Real-data D_b",
                 "gaussian": "Gaussian D_b", "uniform": "Uniform", "long_tail": "Long-tail",
                 "concurrency": "p", "calibration_size": "Batch size", "latency": "Setting",
                 "gamma": "γ", "delta": "δ", "buffer_size": "L_s", "queue_length": "L_q",
                 "final_test_accuracy": "Final test accuracy (%)",
                 "aulc_per_day": "AULC per virtual day: the mean test accuracy over the run (%)"}
# The smoke stand-in model: small, with a feature extractor where the paper's model has one.
SMOKE_MODELS = {"mnist_cnn": "tiny_mlp", "cifar_cnn": "tiny_mlp", "linear": "linear"}
ALPHAS = (0.1, 0.5, 1.0)
# The paper's Table 1, MNIST columns: final accuracy (%) after 10 virtual days, {method: {α: value}}, for a
# report's `published` comparison (the FMNIST columns and Table 2 can be added the same way).
TABLE1_MNIST = {
    "fedbuff": {0.1: 98.66, 0.5: 98.76, 1.0: 98.70}, "fedavg": {0.1: 98.35, 0.5: 98.67, 1.0: 98.70},
    "fedasync": {0.1: 95.62, 0.5: 97.59, 1.0: 97.95}, "ca2fl": {0.1: 98.49, 0.5: 98.73, 1.0: 98.79},
    "fedfa": {0.1: 94.72, 0.5: 97.12, 1.0: 97.75}, "fedpac": {0.1: 85.75, 0.5: 96.46, 1.0: 97.23},
    "fedpsa": {0.1: 98.53, 0.5: 98.79, 1.0: 98.84}}


def published(table: dict[str, dict[float, float]], source: str,
              methods: tuple[str, ...] = METHODS) -> dict[str, Any]:
  """A report's `published` section: `source` (the citation), the summary field the values are of (`metric`,
  in the report's scale) and its values as [method, column key, value] rows, the column key being the cell's
  column labels joined by ',' (`report_lib.column_key`; here the α; rows, since a config's keys hold no dots)."""
  return {"source": source, "metric": "final_test_accuracy",
          "values": [[m, str(a), v] for m in methods for a, v in table[m].items()]}


def parse_arg(arg: str | None, **spec: Any) -> tuple[ml_collections.ConfigDict, dict[str, Any]]:
  """A paper config's `:arg` (`config.parse_arg`): the options `smoke` and `seeds=K` (each member
  repeated with seeds 0..K-1), the config's own options `spec` (Table 6's `temps`), and `field=value`
  overrides of the base run config. Returns (options, overrides)."""
  return config_lib.parse_arg(arg, smoke=False, seeds=(1, integer(ge=1, le=sweep.MAX_SEEDS)), **spec)


def seeds(options: ml_collections.ConfigDict) -> list[int]:
  """The seeds of `seeds=K`: 0, ..., K-1."""
  return list(range(options.seeds))


def paper_base(smoke: bool) -> ml_collections.ConfigDict:
  """Sec. 6.1's run: 50 clients, FLGo Dirichlet, concurrency 20%, 5 epochs, batch 64, lr 0.01 × 0.999 per
  round, response times uniform on [10, 500], 10 virtual days, evaluation every 0.05 day; or its smoke
  stand-in (module docstring)."""
  c = config_lib.base_config()
  c.runtime.progress = False  # many runs, often in Ray workers: one line per member instead of bars
  if not smoke:
    c.sim.virtual_days = 10.0
    c.eval.every_days = 0.05
    return c
  c.data.name = "mnist_5k"
  c.model.name = "tiny_mlp"
  c.partition.num_clients = 20
  c.local.epochs = 1
  c.local.lr = 0.05  # a few updates must already show learning
  c.sim.virtual_days = 0.01
  c.eval.every_days = 0.002
  c.checkpoint.every_days = 0.0  # one checkpoint at the end: enough for resume and extension
  # One SGD step per compiled call: those programs depend only on the batch sizes, so every member of a smoke
  # sweep reuses the programs its first member compiled, where the rolled loop compiles again for each
  # member's client sizes. Compiling dominates a smoke member: Table 1's smoke sweep runs in about half the
  # time (`runtime` never changes a result).
  c.runtime.loop = "unrolled"
  # FedPSA's thermometer fills after L_q updates and only then do κ and the temperature weight the buffer
  # (uniform before); with the paper's L_q = 50 a smoke run would never get there.
  c.fedpsa.queue_length = 5
  return c


def dataset_axis(datasets: tuple[str, ...], smoke: bool) -> sweep.Axis:
  """The dataset axis, each label setting the data and the paper's model for it (smoke: stand-ins)."""
  values = []
  for name in datasets:
    model = PAPER_MODELS[name]
    fields: dict[str, Any] = {"data.name": name, "model.name": model}
    if smoke:
      fields = {"data.name": "mnist_5k", "model.name": SMOKE_MODELS[model]}
    values.append((name, fields))
  return ("dataset", values)


def no_fedpac_on_linear(datasets: tuple[str, ...]) -> list[dict[str, str]]:
  """FedPAC splits the model into extractor and classifier: absent where the paper's model is linear."""
  return [{"method": "fedpac", "dataset": d} for d in datasets if PAPER_MODELS[d] == "linear"]


def sweep_config(name: str, description: str, base: ml_collections.ConfigDict, axes: list,
                 seeds: list[int], report: dict[str, Any], exclude: list | None = None,
                 parts: list | None = None, overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The ConfigDict of one sweep (fields as `fedpsa_jax.sweep` describes them). `overrides` (the
  `field=value` items of the `:arg`) are set on `base` last, so the user's values win over the config's."""
  c = ml_collections.ConfigDict()
  c.name = name  # the sweep's name and the report's title
  c.description = description  # what the paper reports there
  c.base = config_lib.set_fields(base, overrides or {})  # the run config every member starts from
  c.axes = axes  # [(axis, [(label, {field: value})])]: members are their product
  c.parts = parts or []  # [(part, more_axes)]: a union of such products (Fig. 4's two grids)
  c.exclude = exclude or []  # [{axis: label}]: members left out (FedPAC on the linear model)
  c.seeds = seeds  # each member once per seed
  r = ml_collections.ConfigDict()
  r.kind = "table"  # table | curves | heatmap (fedpsa_lab/report.py) | overhead | alignment (figures/fedpsa.py)
  r.rows = []  # axes along the table's rows (outer first)
  r.cols = []  # axes along its columns (outer first)
  r.metric = "final_test_accuracy"  # the summary.json field in the cells
  r.scale = 100.0  # cells are metric × scale (100: accuracy in %)
  r.decimals = 2  # digits printed
  r.best = "max"  # bold the max (or min) of each column within each group of the outer row axis; '' none
  r.row_mean = False  # add an 'Avg' column (Table 3)
  r.delta = []  # [col_a, col_b]: add a column a − b of the innermost column axis (Table 5's Abs. Δ)
  r.more_metrics = []  # further summary.json fields, a table each in table.md (e.g. "aulc_per_day")
  r.reference = {}  # {axis: label}: mark cells differing from this one's by more than the noise (paired.md)
  r.published = {}  # {source, metric, values: [[row label, column key, value]]}: the paper's numbers beside ours
  r.display = dict(DISPLAY_NAMES)  # printed names of labels and axes
  r.update(report)
  r.display.update(stand_in_names(c.axes + [a for _, more in c.parts for a in more], r.display))
  c.report = r
  return c


def stand_in_names(axes: list, display: dict[str, str]) -> dict[str, str]:
  """{label: 'mnist_5k (for FMNIST)'} for each label of `axes` that names a dataset its members do not run on (a
  smoke variant's stand-in data, `dataset_axis`): a column headed "FMNIST" over runs on mnist_5k would claim a
  result on data that never ran."""
  names = {}
  for _, values in axes:
    for label, fields in values:
      data = dict(fields).get("data.name")
      if data is not None and data != label:
        names[str(label)] = f"{data} (for {display.get(str(label), label)})"
  return names


def embedded_mnist_base() -> ml_collections.ConfigDict:
  """docs/results.md's runs on the embedded data (`configs/results/table1_mnist_5k.py`, `fedpsa_parts.py`):
  Sec. 6.1's run (`paper_base`) on the 5,000 MNIST images of `mnist_5k` with the paper's MNIST CNN, for 0.25
  virtual day (~850 client updates) instead of 10, evaluated every 0.0125 day (21 points per curve). One
  definition, so that the two sweeps' members are comparable runs."""
  base = paper_base(smoke=False)
  base.data.name = "mnist_5k"
  base.model.name = PAPER_MODELS["mnist"]
  base.sim.virtual_days = 0.25
  base.eval.every_days = 0.0125
  base.checkpoint.every_days = 0.05  # a killed member loses at most a fifth of its run
  return base


def alpha_axis(alphas: tuple[float, ...] = ALPHAS) -> sweep.Axis:
  return sweep.axis("alpha", alphas, "partition.alpha")


def method_axis(methods: tuple[str, ...] = METHODS) -> sweep.Axis:
  return sweep.axis("method", methods)


def on_dataset(c: ml_collections.ConfigDict, name: str, smoke: bool) -> ml_collections.ConfigDict:
  """`c` set to one dataset and the paper's model for it (smoke: the stand-ins), as `dataset_axis` does."""
  (_, [(_, fields)]) = dataset_axis((name,), smoke)
  return config_lib.set_fields(c, fields)


def seed_contrast_plan(contrasts: list) -> ml_collections.ConfigDict:
  """A results sweep's declared analysis (`fedpsa_lab.contrasts`): the seed as the unit, α averaged within a seed,
  the primary endpoint (the mean test accuracy over the last 10% of the run) and the secondary ones, and the
  family `contrasts`, [[name, {arm label: coefficient}]] with coefficients summing to 0, Holm-adjusted together."""
  a = ml_collections.ConfigDict()
  a.unit = "seed"  # the replicate: members sharing a seed are paired, their α averaged within the seed
  a.axis = "method"  # the axis whose labels the contrasts weigh
  a.blocks = ["alpha"]  # axes averaged within each seed before the test
  a.primary = "tail_test_accuracy"  # mean test accuracy over the evaluations in the last `tail_fraction` of the run
  a.tail_fraction = 0.1  # the primary endpoint's window, a fraction of sim.virtual_days
  a.secondary = ["final_test_accuracy", "aulc_per_day"]  # summary.json fields, reported beside the primary
  a.scale = 100.0  # effects in percentage points
  a.contrasts = contrasts  # the family
  return a


def arms_axis(arms: tuple) -> tuple[sweep.Axis, dict[str, str]]:
  """The `method` axis of arms (label, fields, printed name), and the display names with the arms' added."""
  return ("method", [(label, fields) for label, fields, _ in arms]), {
      **DISPLAY_NAMES, **{label: name for label, _, name in arms}}
