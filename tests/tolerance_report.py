"""Headroom of every float comparison: how much of its tolerance the suite used, per call site.

  FEDPSA_TOLERANCE_LOG=/tmp/tol.jsonl make test
  XLA_FLAGS=--xla_cpu_max_isa=AVX2 FEDPSA_TOLERANCE_LOG=/tmp/tol-avx2.jsonl make test
  .venv/bin/python tests/tolerance_report.py /tmp/tol.jsonl /tmp/tol-avx2.jsonl

prints one row per `assert_close` call site: its relative tolerance and the largest error seen there, as a
fraction of what the tolerance allowed, in each log (one log per machine or instruction set). A fraction near
1 is a comparison about to fail on some CPU; every site also rejects a 1% error (tests/numerics.py checks it).
"""

from __future__ import annotations

import collections
import json
import sys


def main(paths: list[str]) -> None:
  worst: dict[str, dict[str, float]] = collections.defaultdict(dict)
  rel: dict[str, float] = {}
  for path in paths:
    with open(path) as f:
      for line in f:
        record = json.loads(line)
        site = record["site"]
        rel[site] = max(rel.get(site, 0.0), record["rel"])
        worst[site][path] = max(worst[site].get(path, 0.0), record["worst_fraction_of_tolerance"])
  print("| call site | tolerance (rel) | " + " | ".join(f"used: {p}" for p in paths) + " |")
  print("|---|---|" + "---|" * len(paths))
  for site in sorted(worst, key=lambda s: (s.split(":")[0], int(s.split(":")[1]))):
    used = " | ".join(f"{worst[site][p]:.3f}" if p in worst[site] else "-" for p in paths)
    print(f"| {site} | {rel[site]:.2e} | {used} |")


if __name__ == "__main__":
  main(sys.argv[1:])
