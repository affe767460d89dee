"""docs/results.md, "Tuned, then compared": FedPSA, FedBuff and the uniform buffer, each at its own best server step.

`configs/results/step_tuning.py` selects each shape's effective step on tuning seeds 100-102 by a rule declared
before its runs; this sweep reads that selection from the tuning records (`fedpsa_lab.tuning.selected_steps`) and
compares the tuned arms at fresh seeds, with FedBuff at the paper's η = 1 beside them:

| arm           | method, fields                                      | server step η               |
|---------------|-----------------------------------------------------|-----------------------------|
| fedbuff       | FedBuff, as the paper ran it                        | 1 (mean effective step 0.66) |
| fedbuff_tuned | FedBuff                                             | e_fedbuff / 0.6556          |
| uniform_tuned | FedBuff, `weighting=uniform, step=unit` (w = η/B)   | e_uniform                   |
| fedpsa_tuned  | FedPSA (κ-softmax, Eq. 20)                          | e_fedpsa                    |

× α ∈ {0.1, 1.0} × fresh seeds 200-211 (12 seeds, disjoint from tuning's and from 0-7) = 96 members, each run as
shape_step's (`paper.embedded_mnist_base`, 0.25 virtual day, evaluated every 0.005 day, events kept).
`:horizon` is the second design: the three tuned arms at α = 0.1 × seeds 200-204 for 1 virtual day (evaluated
every 0.02 day, checkpoints every 0.1), to see the comparison past the first rise.

The analysis plan (`analysis`), declared here before any member of either design runs:
- unit: the seed (members sharing one share data, partition, latencies and initial model): each contrast is
  computed within a seed, α averaged first, then a one-sample t-test over the seeds;
- primary endpoint: the mean test accuracy over the evaluations in the last 10% of the run (shape_step's);
  secondary: the final evaluation and AULC per day; and, reported beside them, each arm's gain over the last 40%
  of its run (how far from a plateau the endpoint was taken): the primary endpoint minus the mean accuracy over
  the 10% of the run that ends where the last 40% begins (`fedpsa_lab.contrasts.gain`, report/gain.md);
- one family, Holm-adjusted together:
  1. FedPSA(tuned) − FedBuff(tuned): does FedPSA beat a FedBuff given the same chance to tune? (It is also κ −
     the staleness discount, both tuned: FedBuff's discount is its shape.)
  2. κ − uniform (both tuned): does κ's shape help once each shape has its best step?
  3. uniform − FedBuff (both tuned): does the staleness discount's shape help or hurt once tuned?
  4. FedBuff(tuned) − FedBuff(η = 1): what tuning alone is worth.
  The horizon design has contrasts 1-3 (it has no η = 1 arm).
- power, for the test actually read: Holm's first threshold over four contrasts is 0.05 / 4. shape_step's
  seed-level SDs (implied by its 95% intervals over 8 seeds) are 0.82 points for FedPSA − FedBuff, 0.22 for κ −
  uniform and 0.66 for its step contrast. At SD 0.82, 12 seeds give 86% power for a one-point difference at
  0.0125 (80% power for 0.93 points; 8 seeds would give 57%); at SD 0.22, 80% power for 0.25 points; at SD 0.66,
  97% power for one point. (`fedpsa_lab.report_stats.power_paired_t`; held to these figures by
  tests/test_tuning.py.) The horizon design's 5 seeds and three contrasts: at Q2's SDs (0.19-0.27), 80% power at
  0.05 / 3 for 0.44-0.62 points.

`launch.py --mode=sweep --config=configs/results/tuned.py --workdir=DIR --records=results/tuned` (and
`tuned.py:horizon` with `--records=results/tuned_horizon`); `:tuning=DIR` reads the selection from another
tuning records directory than the repository's results/step_tuning. Until the tuning selects a step for every
shape, the config is refused in one line that names the shapes still open. `:seeds=K` runs the first K seeds.
"""

from __future__ import annotations

import os

import ml_collections

from fedpsa_jax.errors import ConfigError, DamagedRunFile
from fedpsa_lab import paper, tuning

SEEDS = list(range(200, 212))  # fresh: disjoint from 0-7 (shape_step, horizon) and 100-102 (tuning); power above
HORIZON_SEEDS = SEEDS[:5]
ALPHAS = (0.1, 1.0)
EVAL_EVERY_DAYS = 0.005  # shape_step's: six evaluations in the last 10%
HORIZON_DAYS = 1.0
# Where the tuning records live, relative to this file: the repository's results/step_tuning.
TUNING_RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "results", "step_tuning")

# shape (`fedpsa_lab.tuning.SHAPES`: its fields and the η of effective step e, the table above) -> (label, printed name)
TUNED = {"fedbuff": ("fedbuff_tuned", "FedBuff, tuned"), "uniform": ("uniform_tuned", "Uniform, tuned"),
         "fedpsa": ("fedpsa_tuned", "FedPSA, tuned")}
PAPER_FEDBUFF = ("fedbuff", {"method": "fedbuff"}, "FedBuff (η = 1)")

CONTRASTS = [
    ["FedPSA − FedBuff (both tuned)", {"fedpsa_tuned": 1.0, "fedbuff_tuned": -1.0}],
    ["κ − uniform (both tuned)", {"fedpsa_tuned": 1.0, "uniform_tuned": -1.0}],
    ["uniform − FedBuff (both tuned)", {"uniform_tuned": 1.0, "fedbuff_tuned": -1.0}],
    ["tuning: FedBuff tuned − FedBuff η = 1", {"fedbuff_tuned": 1.0, "fedbuff": -1.0}],
]


def tuned_arms(selected: dict[str, tuple[float, bool]]) -> tuple:
  """(label, fields, printed name) of each tuned arm at its selected effective step."""
  arms = []
  for shape, (label, name) in TUNED.items():
    step, at_edge = selected[shape]
    edge = ", at the grid edge" if at_edge else ""
    arms.append((label, tuning.SHAPES[shape].fields_at(step), f"{name} (step {step:g}{edge})"))
  return tuple(arms)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg, horizon=False, tuning="")
  records = os.path.normpath(options.tuning or TUNING_RECORDS)
  allowed = ("allowed: a tuning records directory (configs/results/step_tuning.py's --records) whose every shape "
             "has a selected step, as tuning=DIR")
  if not os.path.isfile(os.path.join(records, "sweep.json")):
    raise ConfigError(f"no tuning records in {records!r} (no sweep.json); {allowed}")
  try:
    selected = tuning.selected_steps(records)
  except (tuning.SelectionPending, DamagedRunFile) as err:
    raise ConfigError(f"{err}; {allowed}") from None
  base = paper.embedded_mnist_base()
  base.output.events = True  # every sweep's records keep events.jsonl (the answer must be re-derivable)
  arms = tuned_arms(selected)
  if options.horizon:
    base.sim.virtual_days = HORIZON_DAYS
    base.eval.every_days = 0.02  # 51 evaluations, six in the last 10%
    base.checkpoint.every_days = 0.1
    name, alphas, seeds, contrasts = "tuned-horizon", (0.1,), HORIZON_SEEDS, CONTRASTS[:3]
    description = "FedBuff, the uniform buffer and FedPSA, each at its tuned step, for 1 virtual day at α = 0.1"
  else:
    base.eval.every_days = EVAL_EVERY_DAYS
    arms = (PAPER_FEDBUFF, *arms)
    name, alphas, seeds, contrasts = "tuned", ALPHAS, SEEDS, CONTRASTS
    description = "FedBuff, the uniform buffer and FedPSA, each at its tuned step, and FedBuff at the paper's η = 1"
  if "seeds=" in (arg or ""):  # (the first K of the design's seeds: a smaller rehearsal of the same sweep)
    seeds = seeds[:options.seeds]
  axis, display = paper.arms_axis(arms)
  reference = {"method": "fedbuff" if not options.horizon else "fedbuff_tuned"}
  c = paper.sweep_config(name, description, base, [axis, paper.alpha_axis(alphas)], seeds,
                         {"rows": ["method"], "cols": ["alpha"], "reference": reference,
                          "more_metrics": ["aulc_per_day"], "display": display},
                         overrides=overrides)
  c.analysis = paper.seed_contrast_plan(contrasts)  # declared before the runs (module docstring)
  c.analysis.gain_fraction = 0.4  # each arm's gain over this last fraction of the run, reported beside the endpoints
  return c
