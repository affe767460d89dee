"""benchmarks/gpu_backends.py's core on a CPU: the paper's CIFAR-10 member, small, on its CIFAR-shaped stand-in,
measured under both backends (the script itself, with the paper's CNNs, takes minutes here: docs/performance.md).

The stand-in has CIFAR-10's shape, balanced classes and the paper's 10% holdout; both backends receive the same
updates (the virtual clock does not depend on how clients train) and their figures are consistent with each
other and with the run's summary.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from helpers import ROOT


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("gpu_backends", os.path.join(ROOT, "benchmarks", "gpu_backends.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_cifar10_stand_in_has_its_shape_classes_and_holdout(bench):
  data = bench.cifar10_stand_in(2_000, holdout_fraction=0.1)
  assert data.x_train.shape == (1_800, 32, 32, 3) and data.x_test.shape == (200, 32, 32, 3)
  assert data.num_classes == 10 and data.x_train.dtype == np.float32
  assert np.bincount(data.y_train).tolist() == [180] * 10 and np.bincount(data.y_test).tolist() == [20] * 10


@pytest.mark.ci  # (a benchmark script's core)
def test_both_backends_are_measured_on_the_stand_in(bench):
  results = {}
  for execution in ("loop", "vmap"):
    config = bench.member_config("cifar10", small=True)
    assert (config.method, config.model.name, config.partition.num_clients) == ("fedpsa", "cifar_cnn", 10)
    config.model.name = "tiny_mlp"  # (the paper's CIFAR CNN compiles for a minute on this CPU; the core is the same)
    config.runtime.execution = execution
    config.sim.virtual_days = 0.004
    results[execution] = bench.measure(config, warmup_days=0.001, small=True)
  for execution, r in results.items():
    assert r["execution"] == execution and r["member"] == "cifar10"
    assert r["loop"] == "rolled"  # (runtime.loop=auto: a model without convolutions)
    assert r["data"] == "random cifar10-shaped stand-in (2000 images)"
    assert r["updates"] > 0 and r["window_days"] == pytest.approx(0.003)
    # updates/s and s/day come from one window's wall time.
    assert r["updates_per_s"] * r["seconds_per_day"] * r["window_days"] == pytest.approx(r["updates"])
    assert r["memory_source"] == "RSS" and r["peak_bytes"] > 100 * 2**20  # (a CPU keeps no device statistics)
    assert 0.0 <= r["final_accuracy"] <= 1.0
  assert results["loop"]["updates"] == results["vmap"]["updates"]
  assert results["loop"]["rounds"] == results["vmap"]["rounds"]


@pytest.mark.ci
def test_several_members_at_once_share_one_device_over_a_common_window(bench):
  """`--per_device`: N copies of a member, each a process with the environment of a 1/N GPU share, measured
  over one window: the same run gives the same updates in each, their windows start once all have warmed up (the
  barrier), and the aggregate is the sum of their rates."""
  r = bench.run_together(2, "cifar10", "loop", "auto", small=True, days=0.004, warmup_days=0.001, model="tiny_mlp")
  members = r["members"]
  assert r["count"] == len(members) == 2 and r["member"] == "cifar10"
  assert [m["memory_fraction"] for m in members] == ["0.45"] * 2  # (0.9 of a half share, as a Ray member's)
  assert members[0]["updates"] == members[1]["updates"] > 0 and r["updates"] == 2 * members[0]["updates"]
  assert members[0]["final_accuracy"] == members[1]["final_accuracy"]
  starts, ends = [m["window"][0] for m in members], [m["window"][1] for m in members]
  assert max(m["warmed"] for m in members) <= min(starts) and max(starts) < min(ends)  # measured at the same time
  assert r["aggregate_updates_per_s"] == pytest.approx(sum(m["updates_per_s"] for m in members))
  assert r["peak_bytes"] == max(m["peak_bytes"] for m in members) > 100 * 2**20
