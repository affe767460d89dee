"""Table 3: AULC (accuracy-days over 10 virtual days) on CIFAR-10 / CIFAR-100, with the row average.

The members are Table 2's (same runs, same directory names): run this sweep into Table 2's directory to
reuse them, or into its own. `smoke`: embedded-data stand-ins (fedpsa_lab/paper.py).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

DATASETS = ("cifar10", "cifar100")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  return paper.sweep_config(
      "table3" + ("-smoke" if smoke else ""),
      "Table 3: AULC after 10 days of virtual time across CIFAR datasets",
      paper.paper_base(smoke),
      [paper.method_axis(), paper.dataset_axis(DATASETS, smoke), paper.alpha_axis()],
      seeds,
      {"rows": ["method"], "cols": ["dataset", "alpha"], "metric": "aulc", "scale": 1.0,
       "decimals": 5 if smoke else 3,  # a smoke run's 0.01 day holds little area
       "row_mean": True}, overrides=overrides)
