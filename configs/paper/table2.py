"""Table 2: final accuracy (%) on CIFAR-10 / CIFAR-100 after 10 virtual days, 7 methods × α ∈ {0.1, 0.5, 1.0}.

The same grid as Table 1 on the CIFAR datasets (42 members); Table 3 (AULC) and Fig. 3 (learning
curves) are drawn from the very same runs, so their sweeps may share this sweep's directory.
`smoke`: the embedded MNIST subset stands in for both datasets (fedpsa_lab/paper.py).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

DATASETS = ("cifar10", "cifar100")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  return paper.sweep_config(
      "table2" + ("-smoke" if smoke else ""),
      "Table 2: final accuracy (%) of CIFAR-10 / CIFAR-100 after 10 days of virtual time",
      paper.paper_base(smoke),
      [paper.method_axis(), paper.dataset_axis(DATASETS, smoke), paper.alpha_axis()],
      seeds,
      {"rows": ["method"], "cols": ["dataset", "alpha"]}, overrides=overrides)
