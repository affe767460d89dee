"""Fig. 3: test accuracy against virtual days on CIFAR-10 / CIFAR-100, one line per method.

The members are Table 2's (same runs, same directory names); the report draws one panel per dataset
and α. `smoke`: embedded-data stand-ins (fedpsa_lab/paper.py).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

DATASETS = ("cifar10", "cifar100")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  return paper.sweep_config(
      "fig3" + ("-smoke" if smoke else ""),
      "Fig. 3: learning curves of the methods on the CIFAR datasets",
      paper.paper_base(smoke),
      [paper.method_axis(), paper.dataset_axis(DATASETS, smoke), paper.alpha_axis()],
      seeds,
      # curves: one panel per combination of `panels`, one line per label of `lines` (mean over seeds);
      # the table beside it holds the final accuracy, as Table 2.
      {"kind": "curves", "panels": ["dataset", "alpha"], "lines": "method", "rows": ["method"],
       "cols": ["dataset", "alpha"]}, overrides=overrides)
