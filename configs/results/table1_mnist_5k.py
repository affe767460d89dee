"""docs/results.md, Table R1: Table 1's MNIST column at the scale a 2-core CPU allows.

The seven methods of Table 1 × α ∈ {0.1, 0.5, 1.0} × seeds 0..2 (63 members) on the embedded 5,000 MNIST
images (`mnist_5k`, stratified 10% test holdout) with everything else as Sec. 6.1 sets it (the MNIST CNN,
50 clients, FLGo Dirichlet, concurrency 20%, 5 epochs, batch 64, lr 0.01 × 0.999 per round, response
times uniform on [10, 500]), for 0.25 virtual day (~850 client updates) instead of 10, evaluated every
0.0125 day (21 points per curve). The report prints final accuracy and AULC as mean ±
95% interval over seeds, each method's paired difference from FedBuff, and curves with a band per method.

`launch.py --mode=sweep --config=configs/results/table1_mnist_5k.py --workdir=DIR`, then
`--mode=report --workdir=DIR`. `:seeds=K` changes the seed count; `field=value` any base field.
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

PUBLISHED = "FedPSA paper, Table 1 (MNIST, 10 virtual days, full MNIST)"
SEEDS = 3  # the minimum for an interval over seeds


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  if "seeds=" not in (arg or ""):
    options.seeds = SEEDS
  return paper.sweep_config(
      "table1-mnist-5k",
      "Table 1's MNIST column at 0.25 virtual day on the embedded 5,000 MNIST images",
      paper.embedded_mnist_base(),
      [paper.method_axis(), paper.alpha_axis()],
      paper.seeds(options),
      {"rows": ["method"], "cols": ["alpha"], "reference": {"method": "fedbuff"},
       "more_metrics": ["aulc_per_day"], "published": paper.published(paper.TABLE1_MNIST, PUBLISHED)},
      overrides=overrides)
