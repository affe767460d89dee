"""Fig. 4: FedPSA's final accuracy over the γ × δ grid and the L_s × L_q grid (heatmaps).

Two grids of 4 × 4 (32 members) on CIFAR-10, α = 0.1 (the paper does not name the setting of Fig. 4 nor
its grid values; these bracket the defaults γ = 5, δ = 0.5, L_s = 5, L_q = 50 and the ranges its text
discusses: L_s from 5 to 20, L_q from 10 to 50 and beyond). The other two hyperparameters keep their
defaults in each grid. `smoke`: embedded-data stand-in with 2 × 2 grids around the defaults.
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax import sweep
from fedpsa_lab import paper


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  smoke, seeds = options.smoke, paper.seeds(options)
  base = paper.paper_base(smoke)
  base.method = "fedpsa"
  base.partition.alpha = 0.1
  paper.on_dataset(base, "cifar10", smoke)
  if smoke:
    gammas, deltas, buffers, queues = (1.0, 5.0), (0.1, 0.5), (2, 5), (5, 50)
  else:
    gammas, deltas, buffers, queues = (1.0, 2.0, 5.0, 10.0), (0.1, 0.5, 1.0, 2.0), (2, 5, 10, 20), (10, 25, 50, 100)
  parts = [("gamma_delta", [sweep.axis("gamma", gammas, "fedpsa.gamma"), sweep.axis("delta", deltas, "fedpsa.delta")]),
           ("ls_lq", [sweep.axis("buffer_size", buffers, "fedpsa.buffer_size"),
                      sweep.axis("queue_length", queues, "fedpsa.queue_length")])]
  return paper.sweep_config(
      "fig4" + ("-smoke" if smoke else ""),
      "Fig. 4: performance of FedPSA under different hyperparameters (final accuracy %)",
      base, [], seeds,
      # heatmap: one per [part, row axis, column axis]
      {"kind": "heatmap", "heatmaps": [["gamma_delta", "gamma", "delta"], ["ls_lq", "buffer_size", "queue_length"]],
       "best": ""},
      parts=parts, overrides=overrides)
