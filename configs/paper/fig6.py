"""Fig. 6: FedPSA's κ against gradient alignment (Sec. 6.6, Eqs. 21-22), CIFAR-10, α = 0.1.

For every update FedPSA receives, events.jsonl records κ and align = cos(g_client, g_server), the
gradients of the test loss on one fixed held-out test batch at the client's trained model and at the
server's current global model. The report pools the pairs of all members (seeds), bins them by κ
(width 0.1) and prints the sample-level and binned Pearson and Spearman correlations and each bin's
count. The paper does not name the setting; CIFAR-10, α = 0.1 is assumed. `smoke`: embedded-data
stand-in with a longer budget (more pairs).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  base = paper.paper_base(smoke)
  base.method = "fedpsa"
  base.partition.alpha = 0.1
  paper.on_dataset(base, "cifar10", smoke)
  base.fedpsa.log_alignment = True  # κ and align per received update, into events.jsonl
  base.output.events = True
  if smoke:
    base.sim.virtual_days = 0.03  # ~60 received updates
    base.sim.concurrency = 0.3
  return paper.sweep_config(
      "fig6" + ("-smoke" if smoke else ""),
      "Fig. 6: behavioral similarity κ against gradient alignment",
      base,
      [paper.method_axis(("fedpsa",))],
      seeds,
      {"kind": "alignment", "bin_width": 0.1, "best": ""}, overrides=overrides)
