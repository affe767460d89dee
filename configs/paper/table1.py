"""Table 1: final accuracy (%) on MNIST / FMNIST after 10 virtual days, 7 methods × α ∈ {0.1, 0.5, 1.0}.

`launch.py --mode=sweep --config=configs/paper/table1.py[:smoke][,seeds=K] --workdir=DIR`, then
`launch.py --mode=report --workdir=DIR`. 39 members: FedPAC is absent on FMNIST's linear model, as in the
paper. `smoke`: the embedded MNIST subset stands in for both datasets (fedpsa_lab/paper.py).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

DATASETS = ("mnist", "fashion_mnist")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  return paper.sweep_config(
      "table1" + ("-smoke" if smoke else ""),
      "Table 1: final accuracy (%) of MNIST / FMNIST after 10 days of virtual time",
      paper.paper_base(smoke),
      [paper.method_axis(), paper.dataset_axis(DATASETS, smoke), paper.alpha_axis()],
      seeds,
      {"rows": ["method"], "cols": ["dataset", "alpha"]},
      exclude=paper.no_fedpac_on_linear(DATASETS), overrides=overrides)
