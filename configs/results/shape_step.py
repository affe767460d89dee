"""docs/results.md, "κ, the shape, or the step?": a factorial that separates what FedPSA changes in FedBuff.

FedPSA replaces FedBuff's buffer weights s(τ_i)/B, s(τ) = (1 + τ)^(-1/2), by softmax(κ/Temp) (Eq. 19), and so
changes two things at once: the *shape* of the weights over the buffer and the *step*, their sum (1 in Eq. 20;
(1/B) Σ s(τ_i) < 1 in FedBuff). The six arms cross the shape (staleness discount | κ-softmax | uniform) with the
step (FedBuff's | unit), each arm one documented config field (docs/methods.md, "Shape and step"):

| arm            | method  | shape              | step      |
|----------------|---------|--------------------|-----------|
| fedbuff        | fedbuff | staleness discount | FedBuff's |
| fedbuff_unit   | fedbuff | staleness discount | unit      |
| uniform_stale  | fedbuff | uniform            | FedBuff's |
| uniform_unit   | fedbuff | uniform            | unit      |
| fedpsa_stale   | fedpsa  | κ-softmax          | FedBuff's |
| fedpsa         | fedpsa  | κ-softmax          | unit      |

× α ∈ {0.1, 1.0} × seeds 0..7 (96 members), each run as R1's (`paper.embedded_mnist_base`: the embedded 5,000
MNIST images, the paper's MNIST CNN and Sec. 6.1's settings, 0.25 virtual day), evaluated every 0.005 day so that
the primary endpoint averages six evaluations, with every member's events.jsonl kept.

The analysis plan (`analysis`, below) is declared here, before any member runs:
- unit: the seed. Members that share a seed share the data split, the partition, every client's latency and
  the initial model, whatever their arm or α; so each contrast is computed per seed (averaged over α), and the
  seed-level values get a one-sample t-test (n = seeds, n − 1 degrees of freedom).
- primary endpoint: the mean test accuracy over the evaluations in the last 10% of the virtual horizon
  (`tail_test_accuracy`); secondary: the final evaluation's accuracy and AULC per day.
- family: the four contrasts of `analysis.contrasts`, Holm-adjusted together, per endpoint; the per-α contrasts
  are a second family (4 contrasts × 2 α), also Holm-adjusted.
- power: R1's FedPSA − FedBuff on this endpoint, seed-level (mean over α = 0.1, 1.0), has SD 0.40 points over its
  3 seeds; its one-sided 80% upper confidence bound is 0.85. With 8 seeds, a paired t-test at 5% has 80% power
  for a one-point difference when the seed-level SD is 0.86 or less (0.81 at 0.85, 1.0 at 0.40): at least 80%
  power, with 80% confidence in the SD. (`fedpsa_lab.report_stats.power_paired_t` computes these.)

`launch.py --mode=sweep --config=configs/results/shape_step.py --workdir=DIR [--records=RECORDS]`, then
`--mode=report --workdir=RECORDS --config=configs/results/shape_step.py`. `:seeds=K` changes the seed count;
`field=value` any base field.
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper

SEEDS = 8  # the power computation above
ALPHAS = (0.1, 1.0)  # the most and the least heterogeneous of R1's columns
EVAL_EVERY_DAYS = 0.005  # 51 evaluations in 0.25 day, six in its last 10%

# (label, fields, printed name): the six arms of the module docstring's table.
ARMS = (
    ("fedbuff", {"method": "fedbuff"}, "FedBuff"),
    ("fedbuff_unit", {"method": "fedbuff", "fedbuff.step": "unit"}, "FedBuff, Σw = 1"),
    ("uniform_stale", {"method": "fedbuff", "fedbuff.weighting": "uniform"}, "Uniform, FedBuff's Σw"),
    ("uniform_unit", {"method": "fedbuff", "fedbuff.weighting": "uniform", "fedbuff.step": "unit"},
     "Uniform, Σw = 1"),
    ("fedpsa_stale", {"method": "fedpsa", "fedpsa.step": "staleness"}, "FedPSA, FedBuff's Σw"),
    ("fedpsa", {"method": "fedpsa"}, "FedPSA"),
)


def analysis_plan() -> ml_collections.ConfigDict:
  """The declared analysis (module docstring), as `fedpsa_lab.contrasts` reads it. The family: shapes averaged
  over both steps, steps over all three shapes."""
  return paper.seed_contrast_plan([
      ["FedPSA − FedBuff (all of it)", {"fedpsa": 1.0, "fedbuff": -1.0}],
      ["step: Σw = 1 − FedBuff's Σw", {"fedbuff_unit": 1 / 3, "uniform_unit": 1 / 3, "fedpsa": 1 / 3,
                                       "fedbuff": -1 / 3, "uniform_stale": -1 / 3, "fedpsa_stale": -1 / 3}],
      ["shape: κ − uniform", {"fedpsa": 0.5, "fedpsa_stale": 0.5, "uniform_unit": -0.5, "uniform_stale": -0.5}],
      ["shape: κ − staleness discount", {"fedpsa": 0.5, "fedpsa_stale": 0.5, "fedbuff_unit": -0.5,
                                         "fedbuff": -0.5}],
  ])


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  if "seeds=" not in (arg or ""):
    options.seeds = SEEDS
  base = paper.embedded_mnist_base()
  base.eval.every_days = EVAL_EVERY_DAYS
  base.output.events = True  # every sweep's records keep events.jsonl (the answer must be re-derivable)
  arms, display = paper.arms_axis(ARMS)
  c = paper.sweep_config(
      "shape-step",
      "FedBuff and FedPSA with the shape and the step of their buffer weights crossed",
      base,
      [arms, paper.alpha_axis(ALPHAS)],
      paper.seeds(options),
      {"rows": ["method"], "cols": ["alpha"], "reference": {"method": "fedbuff"},
       "more_metrics": ["aulc_per_day"], "display": display},
      overrides=overrides)
  c.analysis = analysis_plan()  # declared before the runs (module docstring)
  return c
