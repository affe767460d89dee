"""docs/results.md's sweep configs (configs/results/): what each expands to, checked against hand counts and
against the run each member is meant to be."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fedpsa_jax import io, run_identity, sweep
from fedpsa_jax import config as config_lib
from fedpsa_jax.strategies import fedpsa as fedpsa_lib
from helpers import ROOT


def _members(name: str, arg: str = "") -> dict[str, sweep.Member]:
  path = os.path.join(ROOT, "configs", "results", f"{name}.py") + (f":{arg}" if arg else "")
  return {m.name: m for m in sweep.expand(config_lib.load_file(path))}


def test_fedpsa_parts_pairs_fedbuff_fedpsa_and_the_uniform_buffer_on_r1s_runs():
  parts, r1 = _members("fedpsa_parts"), _members("table1_mnist_5k")
  assert len(parts) == 3 * 3 * 3  # (FedBuff, uniform, FedPSA) × 3 α × 3 seeds
  for name, m in parts.items():
    assert config_lib.config_errors(m.config) == []
    method = m.labels["method"]
    if method != "fedpsa_uniform":  # FedBuff and FedPSA: R1's member of that name, the same run
      assert run_identity.identity_differences(io.config_json(r1[name].config), io.config_json(m.config)) == []
      continue
    twin = r1[name.replace("method=fedpsa_uniform", "method=fedpsa")]  # the uniform buffer: FedPSA but the weights
    assert run_identity.identity_differences(io.config_json(twin.config), io.config_json(m.config)) == [
        "fedpsa.fixed_temperature: 0.0 -> 1000000000.0", "fedpsa.no_temperature: False -> True"]
  # Its weights are exactly uniform, whatever the κ: the softmax at its Temp is the softmax of zeros (the
  # uniform weights FedPSA uses before its thermometer fills), bit for bit.
  uniform = next(m.config.fedpsa for m in parts.values() if m.labels["method"] == "fedpsa_uniform")
  temp = fedpsa_lib.fixed_temperature(uniform)
  for b in (1, 5, 8):
    kappas = jax.random.uniform(jax.random.key(b), (b,), jnp.float32, -1.0, 1.0).at[0].set(1.0)
    weights = np.asarray(fedpsa_lib.flush_weights(kappas, jnp.float32(temp), jnp.bool_(True)))
    assert weights.tobytes() == np.asarray(fedpsa_lib.flush_weights(kappas, jnp.float32(temp), jnp.bool_(False))).tobytes()
    assert np.all(weights == np.float32(1 / b))
  # The report pairs each method with the uniform buffer.
  layout = config_lib.load_file(os.path.join(ROOT, "configs", "results", "fedpsa_parts.py")).report
  assert dict(layout.reference) == {"method": "fedpsa_uniform"} and list(layout.rows) == ["method"]


def test_shape_step_arms_differ_from_fedbuff_or_fedpsa_by_their_documented_fields_only():
  members = _members("shape_step")
  assert len(members) == 6 * 2 * 8  # arms × α ∈ {0.1, 1.0} × 8 seeds
  expected = {  # docs/methods.md, "Shape and step"
      "fedbuff": ("fedbuff", []),
      "fedbuff_unit": ("fedbuff", ["fedbuff.step: 'staleness' -> 'unit'"]),
      "uniform_stale": ("fedbuff", ["fedbuff.weighting: 'staleness' -> 'uniform'"]),
      "uniform_unit": ("fedbuff", ["fedbuff.step: 'staleness' -> 'unit'", "fedbuff.weighting: 'staleness' -> 'uniform'"]),
      "fedpsa_stale": ("fedpsa", ["fedpsa.step: 'unit' -> 'staleness'"]),
      "fedpsa": ("fedpsa", []),
  }
  for name, m in members.items():
    assert config_lib.config_errors(m.config) == []
    assert m.config.output.events and m.config.partition.alpha in (0.1, 1.0)
    method, diffs = expected[m.labels["method"]]
    twin = members[name.replace(f"method={m.labels['method']},", f"method={method},")]
    assert run_identity.identity_differences(io.config_json(twin.config), io.config_json(m.config)) == diffs


def test_declared_contrasts_are_differences_of_arms_the_sweep_has():
  for name in ("shape_step", "horizon"):
    c = config_lib.load_file(os.path.join(ROOT, "configs", "results", f"{name}.py"))
    arms = {label for label, _ in dict(c.axes)[c.analysis.axis]}
    assert c.analysis.unit == "seed" and c.analysis.primary == "tail_test_accuracy"
    for label, weights in c.analysis.contrasts:
      assert set(weights) <= arms, label
      assert abs(sum(weights.values())) < 1e-12 and abs(sum(w for w in weights.values() if w > 0) - 1) < 1e-12, label


def test_horizon_arms():
  members = _members("horizon")
  assert len(members) == 4 * 5
  exact = next(m.config for m in members.values() if m.labels["method"] == "fedpsa_exact")
  assert (exact.fedpsa.projection, exact.fedpsa.sketch_dim, exact.sim.virtual_days) == ("count_sketch", 4096, 1.0)
  assert exact.fedpsa.log_alignment and exact.output.events


def test_the_recorded_sweeps_ran_the_plan_the_configs_declare():
  # results/<sweep>/sweep.json holds the analysis as declared when the sweep started; today's config must give
  # the same plan and the same members, or the page would read a plan the runs were not declared under.
  for name in ("shape_step", "horizon"):
    saved = sweep.read_sweep_json(os.path.join(ROOT, "results", name))
    c = config_lib.load_file(os.path.join(ROOT, "configs", "results", f"{name}.py"))
    assert io.config_json(c)["analysis"] == saved["sweep"]["analysis"], name
    assert [m.name for m in sweep.expand(c)] == [m["name"] for m in saved["members"]], name
