"""docs/results.md, "Does κ act past the first rise?": FedBuff, FedPSA and the uniform buffer for 1 virtual day.

At 0.25 virtual day FedPSA's thermometer is still cooling (Temp falls from 5.5 towards 1) and its weights stay
near uniform; a longer run gives κ room to act. And κ itself is measured through a k = 16 Gaussian sketch, whose
cosine is a noisy estimate of the exact one: a fourth arm uses a CountSketch at k = 4096 (the largest sketch_dim;
8 bytes per parameter whatever k), whose κ is close to the exact cosine of the sensitivities.

| arm          | fields                                                              |
|--------------|---------------------------------------------------------------------|
| fedbuff      | FedBuff                                                             |
| uniform_unit | FedBuff with uniform weights summing to 1 (w = 1/B: FedPSA without κ) |
| fedpsa       | FedPSA (k = 16 Gaussian sketch)                                     |
| fedpsa_exact | FedPSA with a CountSketch at k = 4096 (near-exact κ)                 |

× α = 0.1 × seeds 0..4 (20 members) on the embedded MNIST data as R1 (`paper.embedded_mnist_base`) but for
1 virtual day (~3,400 client updates), evaluated every 0.02 day, events kept. Both FedPSA arms log Eq. 22's
gradient alignment beside κ for every update (`fedpsa.log_alignment`, on 128 held-out test images; it does not
change training): the data of "κ beyond staleness" (docs/results.md).

The analysis plan (`analysis`) is declared here, before any member runs: the seed is the unit (one member per
arm and seed, one α, so a paired t-test over the 5 seeds); the primary endpoint is the mean test accuracy over
the evaluations in the last 10% of the run; the family is the three contrasts below, Holm-adjusted together.

`launch.py --mode=sweep --config=configs/results/horizon.py --workdir=DIR [--records=RECORDS]`.
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

SEEDS = 5
VIRTUAL_DAYS = 1.0
EXACT_SKETCH_DIM = 4096  # fedpsa.MAX_SKETCH_DIM

ALIGNMENT = {"fedpsa.log_alignment": True, "fedpsa.alignment_batch_size": 128}
ARMS = (
    ("fedbuff", {"method": "fedbuff"}, "FedBuff"),
    ("uniform_unit", {"method": "fedbuff", "fedbuff.weighting": "uniform", "fedbuff.step": "unit"},
     "Uniform, Σw = 1"),
    ("fedpsa", {"method": "fedpsa", **ALIGNMENT}, "FedPSA (k = 16)"),
    ("fedpsa_exact", {"method": "fedpsa", "fedpsa.projection": "count_sketch", "fedpsa.sketch_dim": EXACT_SKETCH_DIM,
                      **ALIGNMENT}, "FedPSA (CountSketch, k = 4096)"),
)


def analysis_plan() -> ml_collections.ConfigDict:
  """The declared analysis (module docstring), as `fedpsa_lab.contrasts` reads it."""
  return paper.seed_contrast_plan([
      ["FedPSA − FedBuff", {"fedpsa": 1.0, "fedbuff": -1.0}],
      ["κ: FedPSA − uniform", {"fedpsa": 1.0, "uniform_unit": -1.0}],
      ["near-exact κ − k = 16 κ", {"fedpsa_exact": 1.0, "fedpsa": -1.0}],
  ])


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  if "seeds=" not in (arg or ""):
    options.seeds = SEEDS
  base = paper.embedded_mnist_base()
  base.sim.virtual_days = VIRTUAL_DAYS
  base.eval.every_days = 0.02  # 51 evaluations, six in the last 10% (days 0.90 to 1.00)
  base.checkpoint.every_days = 0.1
  base.output.events = True
  arms, display = paper.arms_axis(ARMS)
  c = paper.sweep_config(
      "horizon",
      "FedBuff, the uniform buffer and FedPSA (k = 16 and near-exact κ) for 1 virtual day at α = 0.1",
      base,
      [arms, paper.alpha_axis((0.1,))],
      paper.seeds(options),
      {"rows": ["method"], "cols": ["alpha"], "reference": {"method": "fedbuff"},
       "more_metrics": ["aulc_per_day"], "display": display,
       # κ beyond staleness (fedpsa_lab/event_correlations.py): κ against Eq. 22's alignment given τ and ||Δ||², then
       # given the time of arrival too (both drift as training goes on)
       "partial_correlations": [
           {"x": "kappa", "y": "alignment", "given": ["staleness", "log:delta_sq_norm"],
            "where": {"method": ["fedpsa", "fedpsa_exact"]}, "resamples": 2000},
           {"x": "kappa", "y": "alignment", "given": ["staleness", "log:delta_sq_norm", "arrival_time"],
            "where": {"method": ["fedpsa", "fedpsa_exact"]}, "resamples": 2000}]},
      overrides=overrides)
  c.analysis = analysis_plan()
  return c
