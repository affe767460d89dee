"""Cost of FedPSA's client-side sensitivity, per model and Fisher path (Sec. 6.5, Fig. 5).

For the three paper models, prints each Fisher path's median time and peak temporary memory at several
calibration sizes, and the whole client extra (g + Fisher + Eq. 8 + sketch, as FedPSA runs it) as a
fraction of one SGD step (batch 64) and of one client update. CIFAR runs on tfds mock data (random
images of the right shape: timing does not depend on pixel values), so the script runs offline.

  .venv/bin/python benchmarks/sensitivity.py [--repeats 5] [--sizes 16,32,128,512]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow_datasets as tfds  # noqa: E402

from fedpsa_jax import config as config_lib  # noqa: E402
from fedpsa_jax import profiling  # noqa: E402

SETUPS = (("mnist_cnn", "mnist_5k"), ("linear", "mnist_5k"), ("cifar_cnn", "cifar10"))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--sizes", default="16,32,128,512")
  args = parser.parse_args()
  sizes = tuple(int(s) for s in args.sizes.split(","))
  print(f"{'model':<10}{'piece':<28}{'B':>5}{'ms':>9}{'temp MB':>9}{'x SGD step':>11}{'x update':>9}")
  for model, dataset in SETUPS:
    c = config_lib.base_config()
    c.model.name, c.data.name, c.method = model, dataset, "fedpsa"
    c.data.test_split = "official" if dataset == "cifar10" else "holdout"
    mock = tfds.testing.mock_data(num_examples=3000) if dataset == "cifar10" else contextlib.nullcontext()
    with mock:
      profiler = profiling.Profiler(c, repeats=args.repeats)
      profiler.local_training()
      profiler.method_pieces(calibration_sizes=sizes)  # FedPSA's plug-in: profilers/fedpsa.py
    step = next(r["ms"] for r in profiler.rows if r["piece"] == "sgd_step")
    update = next(r["ms"] for r in profiler.rows if r["piece"] == "client_update")
    for r in profiler.rows:
      print(f"{model:<10}{r['piece']:<28}{r.get('calibration', r.get('steps', '')):>5}{r['ms']:>9.1f}"
            f"{r['temp_mb']:>9.1f}{r['ms'] / step:>11.2f}{r['ms'] / update:>9.3f}")


if __name__ == "__main__":
  main()
