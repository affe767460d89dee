"""docs/results.md, "Tuned, then compared": each buffer shape's server step, tuned on seeds of its own.

shape_step found that a larger server step helps FedBuff at its untuned η = 1, while κ's shape adds nothing
measurable. Whether FedPSA beats a FedBuff given the same chance to tune is asked in two sweeps: this one tunes
each shape's step on three tuning seeds; `configs/results/tuned.py` compares the selected steps at fresh seeds.

A buffer's effective step is η × Σ_i w_i (docs/methods.md, "Shape and step"). The three shapes, each the method
as it is (its own weights) with only its server step η varied:

| shape   | method, fields                                            | Σw per flush             | η for effective step e |
|---------|-----------------------------------------------------------|--------------------------|------------------------|
| fedbuff | FedBuff (staleness discount, FedBuff's step)              | (1/B) Σ (1 + τ_i)^(-1/2) | e / 0.6556             |
| uniform | FedBuff, `weighting=uniform, step=unit` (w = η/B)         | 1                        | e                      |
| fedpsa  | FedPSA (κ-softmax, Eq. 20)                                | 1                        | e                      |

FedBuff's Σw varies from flush to flush (±10%) around its mean 0.6556 on this job: the mean over shape_step's
16 FedBuff records (8 seeds × 2 α) of each run's mean Σw per flush, `fedpsa_lab.tuning.mean_flush_sum` (the
latencies, and so every τ, depend on the seed alone, so every method of a seed has the same Σw sequence), held to
the records by `tests/test_tuning.py`. So a FedBuff arm's mean effective step is e; each flush's is within ±10%.

The grid: e ∈ {1, 1.5, 2.25} (a ladder of factor 1.5; FedBuff at the paper's η = 1 is e = 0.66, one rung below)
× α ∈ {0.1, 1.0} × tuning seeds 100, 101, 102 (disjoint from shape_step's and horizon's 0-7 and from the
confirmation's 200-207) = 54 members, each run as shape_step's (`paper.embedded_mnist_base`: the embedded 5,000
MNIST images, the paper's MNIST CNN, Sec. 6.1's settings, 0.25 virtual day, evaluated every 0.005 day, events
kept).

The selection rule (`analysis.selection`, applied by `fedpsa_lab.tuning`), declared here before any member runs:
- score: the primary endpoint, the mean test accuracy over the evaluations in the last 10% of the run (six
  evaluations), averaged over the 6 (seed, α) cells of an arm, each cell weighted equally;
- the highest score selects the shape's step; an exact tie goes to the smaller step; a step at which any
  member diverged is never selected;
- the grid grows where the best lands on its edge: when a shape's best step is the largest (smallest) it has
  run, the next rung, e × 1.5 (e / 1.5), is added to `EXTENSIONS` below for that shape and run on the same seeds
  and α before anything is selected; at most two rungs past the grid on either side (a best at the last
  allowed rung is selected there and reported as possibly short of the optimum);
- the tuning seeds are read by the selection only; no later analysis reads them.

`launch.py --mode=sweep --config=configs/results/step_tuning.py --workdir=DIR --records=results/step_tuning`,
then `--mode=report --workdir=results/step_tuning --config=configs/results/step_tuning.py` (report/tuning.md
gives every score and each shape's outcome: selected, or the rung to add).
"""

from __future__ import annotations

import ml_collections

from fedpsa_lab import paper, tuning

TUNING_SEEDS = [100, 101, 102]  # disjoint from every seed used before (0-7) or after (200-207)
ALPHAS = (0.1, 1.0)  # shape_step's columns
EVAL_EVERY_DAYS = 0.005  # shape_step's: 51 evaluations in 0.25 day, six in its last 10%
GRID = (1.0, 1.5, 2.25)  # effective steps e = η × mean Σw
LADDER = 1.5  # the factor between neighbouring rungs
MAX_EXTENSIONS = 2  # rungs a shape may grow past the grid on either side
# Rungs added by the rule above, {shape: (e, ...)}, each in a commit that cites the tuning report that asked for it.
EXTENSIONS: dict[str, tuple[float, ...]] = {}
# shape (`fedpsa_lab.tuning.SHAPES`: its fields and the η of effective step e, the table above) -> printed name
NAMES = {"fedbuff": "FedBuff", "uniform": "Uniform, Σw = 1", "fedpsa": "FedPSA"}


def steps(shape: str) -> list[float]:
  """The effective steps a shape runs: the grid and its extensions, in increasing order."""
  return sorted({*GRID, *EXTENSIONS.get(shape, ())})


def arms() -> list[tuple[str, str, float, dict, str]]:
  """(label, shape, e, fields, printed name) of every arm."""
  out = []
  for shape, name in NAMES.items():
    for label, e in zip(tuning.grid_labels(shape, steps(shape)), steps(shape)):
      out.append((label, shape, e, tuning.SHAPES[shape].fields_at(e), f"{name}, step {e:g}"))
  return out


def analysis_plan() -> ml_collections.ConfigDict:
  """The declared selection (module docstring), as `fedpsa_lab.tuning` reads it; the seed-level bookkeeping
  (unit, endpoints, blocks) as every results sweep declares it, with no contrasts: tuning tests nothing."""
  a = paper.seed_contrast_plan([])
  s = ml_collections.ConfigDict()
  s.arms = [[label, shape, e] for label, shape, e, _, _ in arms()]  # [arm label, shape, effective step]
  s.grid = list(GRID)  # the steps every shape starts from
  s.ladder = LADDER  # a rung's factor
  s.max_extensions = MAX_EXTENSIONS  # rungs past the grid on either side
  s.tie = "smaller step"  # an exact tie of scores
  a.selection = s
  return a


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg)
  base = paper.embedded_mnist_base()
  base.eval.every_days = EVAL_EVERY_DAYS
  base.output.events = True  # every sweep's records keep events.jsonl (the answer must be re-derivable)
  axis, display = paper.arms_axis(tuple((label, fields, name) for label, _, _, fields, name in arms()))
  seeds = TUNING_SEEDS[:options.seeds] if "seeds=" in (arg or "") else TUNING_SEEDS
  c = paper.sweep_config(
      "step-tuning",
      "The server step of FedBuff, the uniform buffer and FedPSA, tuned on seeds of its own",
      base,
      [axis, paper.alpha_axis(ALPHAS)],
      seeds,
      {"rows": ["method"], "cols": ["alpha"], "more_metrics": ["aulc_per_day"], "display": display},
      overrides=overrides)
  c.analysis = analysis_plan()  # declared before the runs (module docstring)
  return c
