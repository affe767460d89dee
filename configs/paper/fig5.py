"""Fig. 5: client and server compute and communication per method on all four datasets.

7 methods × 4 datasets at α = 0.1 (27 members: no FedPAC on FMNIST's linear model); the paper does not
name α, 0.1 is assumed. The report reads the accounting fields of each summary.json
(`client_compute_seconds`, `server_compute_seconds`, `bytes_uploaded`, `bytes_downloaded`, and per
update `upload_bytes_per_update`, `download_bytes_per_update`): bars for compute, a line for
communication, one panel per dataset. Compute seconds are wall-clock on the machine that ran the member,
so compare members run on the same hardware; they are measured because `runtime.phase_timing` is on (the
host waits for the devices at every event, so these runs are slower than untimed ones). `smoke`:
embedded-data stand-ins (fedpsa_lab/paper.py).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  base = paper.paper_base(smoke)
  base.partition.alpha = 0.1  # assumed (see the module docstring)
  base.runtime.phase_timing = True  # client and server compute timed apart: the figure's bars
  return paper.sweep_config(
      "fig5" + ("-smoke" if smoke else ""),
      "Fig. 5: computational and communication overheads of the methods on the datasets",
      base,
      [paper.method_axis(), paper.dataset_axis(DATASETS, smoke)],
      seeds,
      {"kind": "overhead", "rows": ["method"], "cols": ["dataset"], "metric": "upload_bytes_per_update",
       "scale": 1.0 / 2**20, "decimals": 4, "best": ""},
      exclude=paper.no_fedpac_on_linear(DATASETS), overrides=overrides)
