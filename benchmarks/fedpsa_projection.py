"""How well each projection keeps κ: Eq. 11's Gaussian R against a CountSketch, on the sensitivities of a real run.

    python benchmarks/fedpsa_projection.py [--days=0.03] [--keys=3] [--model=mnist_cnn]

Runs FedPSA on the default job (configs/default.py) and, for every update the server receives, takes the
pair FedPSA compares: the sensitivity s_i of the client's trained model and s_g of the global model as it is
at the arrival (Eq. 8, the run's calibration batch). Their exact cosine (no sketch) is the κ that both sketches
estimate; each projection, drawn with `--keys` different keys, gives its own estimate cos(P s_i, P s_g) with the
run's k. Printed per projection and key: the error of the sketched κ against the exact one (root mean square
and the largest), the Pearson correlation of sketched and exact κ over the updates, and the bytes it holds; then
per projection the mean over keys with a 95% interval; then the correlation of κ under two projections over the
run (the issue's test), for two Gaussians as the baseline that sketch noise alone sets.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

flags.DEFINE_float("days", 0.03, "virtual days of the FedPSA run whose updates are measured")
flags.DEFINE_integer("keys", 3, "projections drawn per kind (different keys)")
flags.DEFINE_string("model", "mnist_cnn", "configs/default.py model")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  import jax
  import scipy.stats
  from jax.flatten_util import ravel_pytree

  from configs.default import get_config
  from fedpsa_jax import sensitivity
  from fedpsa_jax.sim import runner

  config = get_config(f"method=fedpsa,model={FLAGS.model}")
  config.runtime.progress = False
  config.sim.virtual_days = FLAGS.days
  sim = runner.Simulation(config)
  strategy = sim.strategy
  k, apply_fn, (x, y) = strategy.hparams.sketch_dim, sim.model.apply, strategy.calibration
  shapes = jax.eval_shape(lambda: strategy.eval_models(sim.state).params)
  makers = {"gaussian": sensitivity.projection, "count_sketch": sensitivity.count_sketch_projection}
  projections = {(kind, i): make(jax.random.key(1000 + i), k, shapes) for kind, make in makers.items()
                 for i in range(FLAGS.keys)}
  sens = jax.jit(lambda p: sensitivity.sensitivity(apply_fn, p, x, y))
  cos = jax.jit(sensitivity.cosine_similarity)
  exact, sketched = [], {key: [] for key in projections}
  receive = strategy.receive

  def observe(state, arrivals):
    s_g = sens(state.params)
    for a in arrivals:
      s_i = sens(jax.tree.map(lambda p, d: p + d, a.params_start, a.delta))
      exact.append(float(cos(ravel_pytree(s_i)[0], ravel_pytree(s_g)[0])))
      for key, P in projections.items():
        sketched[key].append(float(cos(sensitivity.project(P, s_i), sensitivity.project(P, s_g))))
    return receive(state, arrivals)

  strategy.receive = observe
  sim.run()
  exact = np.asarray(exact)
  d = sensitivity.num_params(shapes)
  held = {"gaussian": 4 * k * d, "count_sketch": 8 * d}
  print(f"{len(exact)} received updates of FedPSA on the default job ({FLAGS.model}, {d:,} parameters, k = {k}); "
        f"exact κ from {exact.min():.3f} to {exact.max():.3f} (mean {exact.mean():.3f})")
  print(f"{'projection':14s} {'key':>3s} {'RMS error':>9s} {'max error':>9s} {'r(exact)':>8s} {'MB held':>7s}")
  for (kind, i), values in sketched.items():
    err = np.asarray(values) - exact
    print(f"{kind:14s} {i:3d} {np.sqrt(np.mean(err ** 2)):9.4f} {np.abs(err).max():9.4f} "
          f"{scipy.stats.pearsonr(values, exact)[0]:8.4f} {held[kind] / 2**20:7.1f}")
  print("\nper projection, over its keys (mean and 95% t-interval):")
  for kind in makers:
    rms = [np.sqrt(np.mean((np.asarray(sketched[(kind, i)]) - exact) ** 2)) for i in range(FLAGS.keys)]
    r = [scipy.stats.pearsonr(sketched[(kind, i)], exact)[0] for i in range(FLAGS.keys)]
    print(f"{kind:14s} RMS error {_mean_ci(rms)}   r(exact) {_mean_ci(r)}")
  print("\nPearson r between two projections' κ over the run (key i against key i + 1, or the same i):")
  pairs = {"gaussian, gaussian": ("gaussian", "gaussian", 1),
           "count_sketch, count_sketch": ("count_sketch", "count_sketch", 1),
           "gaussian, count_sketch": ("gaussian", "count_sketch", 0)}
  for name, (a, b, shift) in pairs.items():
    r = [scipy.stats.pearsonr(sketched[(a, i)], sketched[(b, (i + shift) % FLAGS.keys)])[0] for i in range(FLAGS.keys)]
    print(f"{name:28s} {_mean_ci(r)}")


def _mean_ci(values) -> str:
  """mean ± the 95% t-interval's half-width (`report_stats.interval`, as the results tables give it)."""
  from fedpsa_lab import report_stats

  result = report_stats.interval(values)
  return f"{result.mean:.3f} ± {result.half_width:.3f}"


if __name__ == "__main__":
  app.run(main)
