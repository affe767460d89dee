"""docs/results.md, Table R2 and Fig. R3: the full MNIST (60,000 + 10,000 images, tfds) at α = 0.1.

FedPSA, FedBuff, CA2FL and FedAsync × seeds 0..1 (8 members) with Sec. 6.1's setup (the MNIST CNN, 50
clients, FLGo Dirichlet, concurrency 20%, 5 epochs, batch 64, lr 0.01 × 0.999 per round, response times
uniform on [10, 500]) for 0.05 virtual day (~170 client updates): each client holds ~1,260 images (~100 SGD
steps per update): a horizon chosen for a sweep of about two hours on a 2-core CPU (docs/results.md gives the
wall time it took).
FedPSA's members record κ and the gradient alignment of every received update (events.jsonl). The report:
the table (mean ± 95% interval, paired differences from FedBuff, the paper's Table 1 beside it) and Fig. 6's
κ against alignment over FedPSA's updates, with bootstrap intervals on Pearson and Spearman (resampling blocks of
successive updates, and pair by pair) and the correlation left once a drift in time is removed within each run.

`launch.py --mode=sweep --config=configs/results/mnist_full.py:data.data_dir=DIR --workdir=WORKDIR`, DIR a
tfds data folder holding `mnist/3.0.1` prepared (README, "Data"); then `--mode=report --workdir=WORKDIR`.
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

PUBLISHED = "FedPSA paper, Table 1 (MNIST, 10 virtual days, full MNIST)"
SEEDS = 2
METHODS = ("fedbuff", "fedasync", "ca2fl", "fedpsa")  # Table 1's order


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  if "seeds=" not in (arg or ""):
    options.seeds = SEEDS
  base = paper.paper_base(smoke=False)
  paper.on_dataset(base, "mnist", smoke=False)
  base.partition.alpha = 0.1
  base.sim.virtual_days = 0.05
  base.eval.every_days = 0.005
  base.checkpoint.every_days = 0.01  # a killed member loses at most a fifth of its run
  base.fedpsa.log_alignment = True  # κ and align per received update, into events.jsonl (Fig. 6)
  base.output.events = True
  return paper.sweep_config(
      "mnist-full",
      "FedPSA, FedBuff, CA2FL and FedAsync on the full MNIST at α = 0.1",
      base,
      [paper.method_axis(METHODS), paper.alpha_axis((0.1,))],
      paper.seeds(options),
      {"kind": "alignment", "bin_width": 0.1, "rows": ["method"], "cols": ["alpha"], "reference": {"method": "fedbuff"},
       "more_metrics": ["aulc_per_day"],
       "published": paper.published(paper.TABLE1_MNIST, PUBLISHED, METHODS)},
      overrides=overrides)
