"""docs/results.md, Table R4: what FedPSA's κ weighting adds at R1's scale, apart from its step size.

FedPSA changes only FedBuff's weights (Sec. 5.1), yet in two ways at once: FedBuff weighs the B buffered
updates by its staleness discount s(τ)/B = (1 + τ)^(-1/2)/B, which sums to less than 1 (a smaller step), and
FedPSA by softmax(κ / Temp) (Eq. 19), which sums to 1 (Eq. 20). R1's buffer_weights.md measures both. This
sweep separates them with a third member between the two: FedPSA with uniform weights, exactly 1/B (Temp
fixed at 1e9, where every κ / Temp rounds to the same float32 softmax), i.e. FedBuff without its discount, or
FedPSA without κ. Its paired differences answer two questions over the same seeds:
- FedPSA − uniform: what the κ weighting adds;
- FedBuff − uniform: what the staleness discount (and its smaller step) adds.

FedBuff, FedPSA and the uniform buffer × α ∈ {0.1, 0.5, 1.0} × seeds 0..2 (27 members), each run as R1's
(`paper.embedded_mnist_base`: the same data, model, budget and seeds), so that the three are paired within
this sweep, and a member whose code is unchanged can be one of R1's runs (docs/results.md, R4).

`launch.py --mode=sweep --config=configs/results/fedpsa_parts.py --workdir=DIR`, then `--mode=report
--workdir=DIR`. `:seeds=K` changes the seed count; `field=value` any base field.
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

SEEDS = 3  # as R1
UNIFORM_TEMPERATURE = 1e9  # κ ∈ [-1, 1]: κ / Temp within 1e-9 of 0, below float32's resolution at 1


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  if "seeds=" not in (arg or ""):
    options.seeds = SEEDS
  uniform = {"method": "fedpsa", "fedpsa.no_temperature": True, "fedpsa.fixed_temperature": UNIFORM_TEMPERATURE}
  methods = ("method", [("fedbuff", {"method": "fedbuff"}), ("fedpsa_uniform", uniform),
                        ("fedpsa", {"method": "fedpsa"})])
  display = {**paper.DISPLAY_NAMES, "fedpsa_uniform": "Uniform buffer (FedPSA, w = 1/B)"}
  return paper.sweep_config(
      "fedpsa-parts",
      "FedBuff, FedPSA and the uniform buffer between them, at R1's scale",
      paper.embedded_mnist_base(),
      [methods, paper.alpha_axis()],
      paper.seeds(options),
      {"rows": ["method"], "cols": ["alpha"], "reference": {"method": "fedpsa_uniform"},
       "more_metrics": ["aulc_per_day"], "display": display},
      overrides=overrides)
