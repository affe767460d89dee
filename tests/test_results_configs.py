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
