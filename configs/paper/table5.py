"""Table 5: FedPSA's calibration batch D_b, real data vs Gaussian × sizes 16/32/128/512, CIFAR-10, α 0.1 and 1.0.

16 members; the report adds the paper's signed difference column (real − Gaussian).
`smoke`: embedded-data stand-in (fedpsa_lab/paper.py).
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
  paper.on_dataset(base, "cifar10", smoke)
  return paper.sweep_config(
      "table5" + ("-smoke" if smoke else ""),
      "Table 5: calibration batch D_b on CIFAR-10, final test accuracy (%), real-data vs Gaussian",
      base,
      [paper.alpha_axis((0.1, 1.0)), sweep.axis("calibration_size", (16, 32, 128, 512), "fedpsa.calibration_size"),
       sweep.axis("calibration", ("real", "gaussian"), "fedpsa.calibration")],
      seeds,
      {"rows": ["alpha", "calibration_size"], "cols": ["calibration"], "delta": ["real", "gaussian"], "best": ""},
      overrides=overrides)
