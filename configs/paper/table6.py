"""Table 6: FedPSA's ablations (w/o T, w/o S, w/o T&S, full) × concurrency p ∈ {0.1, 0.2, 0.3} × α ∈ {1.0, 0.1}.

CIFAR-10 (the paper's full-model numbers at p = 0.2 match its Table 2 CIFAR-10 column): 24 members.
`smoke`: embedded-data stand-in (fedpsa_jax/paper.py).
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax import paper, sweep

VARIANTS = (("no_t", True, False), ("no_s", False, True), ("no_ts", True, True), ("full", False, False))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  smoke, seeds = paper.parse_arg(arg)
  base = paper.paper_base(smoke)
  base.method = "fedpsa"
  paper.on_dataset(base, "cifar10", smoke)
  variant = ("variant", [(name, {"fedpsa.no_temperature": no_t, "fedpsa.no_sensitivity": no_s})
                         for name, no_t, no_s in VARIANTS])
  return paper.sweep_config(
      "table6" + ("-smoke" if smoke else ""),
      "Table 6: ablation study of FedPSA under different settings (CIFAR-10, final accuracy %)",
      base,
      [paper.alpha_axis((1.0, 0.1)), variant, sweep.axis("concurrency", (0.1, 0.2, 0.3), "sim.concurrency")],
      seeds,
      {"rows": ["alpha", "variant"], "cols": ["concurrency"]})
