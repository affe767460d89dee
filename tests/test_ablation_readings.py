"""FedPSA's "w/o T" readings: `fedpsa.fixed_temperature` is the Temp of Eq. 19's softmax under no_temperature,
it is validated, and configs/paper/table6.py expands to the paper's 24 members or, with `temps`, to those plus
w/o T and w/o T&S at Temp = 1 and Temp = δ.

Eq. 19: Weight_i = exp(κ_i / Temp) / Σ_j exp(κ_j / Temp), κ_i = cos(s̃_i, s̃_g) (Eq. 12). κ is set through the
payloads: the state's global sketch is chosen, and each arrival's payload is a k-vector of the test's choosing.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedpsa_jax import api, sweep
from fedpsa_jax import config as config_lib
from fedpsa_jax.models import TinyMLP
from fedpsa_jax.strategies import Arrival, StrategyContext
from fedpsa_jax.strategies import fedpsa as fedpsa_lib
from helpers import strategy_context
from numerics import assert_close, f32_tolerance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K = 6  # sketch_dim
MODEL = TinyMLP(num_classes=3, hidden=5)
PARAMS0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 4), jnp.float32))
GAMMA, DELTA = 5.0, 0.5  # the paper's: γ + δ = 5.5


def _ctx() -> StrategyContext:
  rng = np.random.default_rng(1)
  calibration = (jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), jnp.asarray(rng.integers(0, 3, 8), jnp.int32))
  return strategy_context(MODEL, PARAMS0, train_batch=calibration)


def _config(fixed: float, no_temperature: bool = True, no_sensitivity: bool = False, buffer_size: int = 3):
  c = config_lib.base_config()
  c.fedpsa.sketch_dim = K
  c.fedpsa.calibration, c.fedpsa.calibration_size = "real", 8  # _ctx's batch
  c.fedpsa.buffer_size = buffer_size
  c.fedpsa.queue_length = 2  # fills at the first flush: under no_temperature Temp must still not move
  c.fedpsa.gamma, c.fedpsa.delta = GAMMA, DELTA
  c.fedpsa.no_temperature = no_temperature
  c.fedpsa.no_sensitivity = no_sensitivity
  c.fedpsa.fixed_temperature = fixed
  return c


def _hand_weights(payloads: np.ndarray, g: np.ndarray, temp: float) -> np.ndarray:
  """Eq. 19 in float64: softmax of κ_i / Temp, κ_i = cos(payload_i, g)."""
  kappa = payloads @ g / (np.linalg.norm(payloads, axis=1) * np.linalg.norm(g))
  e = np.exp(kappa / temp)
  return e / e.sum()


@pytest.mark.parametrize("fixed,temp", [(0.0, GAMMA + DELTA), (1.0, 1.0), (DELTA, DELTA), (0.2, 0.2)])
def test_fixed_temperature_is_the_softmax_temperature(fixed, temp):
  strategy = fedpsa_lib.FedPSA(_config(fixed), _ctx())
  state = strategy.init(PARAMS0)
  assert float(state.temperature) == pytest.approx(temp, rel=1e-6)
  rng = np.random.default_rng(2)
  for flush in range(3):  # the queue fills and rolls: the fixed Temp must hold at every flush
    g = rng.normal(size=K)
    state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
    # κ spread over [-1, 1]: aligned, orthogonal-ish and opposed payloads.
    payloads = np.stack([g + 0.3 * rng.normal(size=K), rng.normal(size=K), -g + 0.3 * rng.normal(size=K)])
    deltas = [jax.tree.map(lambda x: jnp.asarray(0.01 * rng.normal(size=x.shape), jnp.float32), PARAMS0)
              for _ in payloads]
    before = jax.tree.map(np.asarray, state.params)
    arrivals = [Arrival(client=i, num_samples=10, staleness=0, dispatch_round=0, params_start=PARAMS0, delta=d,
                        payload=jnp.asarray(p, jnp.float32)) for i, (p, d) in enumerate(zip(payloads, deltas))]
    state, changed = strategy.receive(state, arrivals)
    assert changed
    want = _hand_weights(payloads, g, temp)
    np.testing.assert_allclose(np.asarray(state.last_weights), want, rtol=1e-5)
    # The test tells temperatures apart: at this κ spread the weights at γ + δ and at Temp differ.
    if temp != GAMMA + DELTA:
      assert np.abs(want - _hand_weights(payloads, g, GAMMA + DELTA)).max() > 0.05
    assert float(state.temperature) == pytest.approx(temp, rel=1e-6)
    # Eq. 20 with those weights.
    expected = jax.tree.map(lambda w0, *ds: np.asarray(w0, np.float64) + sum(
        wt * np.asarray(d, np.float64) for wt, d in zip(want, ds)), before, *deltas)
    assert_close(state.params, expected, f32_tolerance(len(deltas) + 1))


def test_near_uniform_readings():
  """The documented readings: at γ + δ = 5.5 even κ = ±1 give weights within e^(2/5.5) ≈ 1.44 of each other."""
  w = _hand_weights(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([1.0, 0.0]), GAMMA + DELTA)
  assert w[0] / w[1] == pytest.approx(math.exp(2 / 5.5))
  strategy = fedpsa_lib.FedPSA(_config(0.0), _ctx())
  assert fedpsa_lib.fixed_temperature(strategy.hparams) == GAMMA + DELTA


def _errors(c) -> list[str]:
  return [e for e in config_lib.config_errors(c) if "fixed_temperature" in e]


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan, True, "1.0", None])
def test_fixed_temperature_bad_values_name_the_field(bad):
  c = _config(0.0)
  # A section rebuilt from a dict, as from JSON: ConfigDict would turn True into 1.0 on a float field.
  c.fedpsa = ml_collections.ConfigDict({**c.fedpsa.to_dict(), "fixed_temperature": bad})
  assert type(c.fedpsa.fixed_temperature) is type(bad)
  errors = _errors(c)
  assert len(errors) == 1 and errors[0].startswith(f"fedpsa.fixed_temperature={bad!r} is invalid; allowed:"), errors
  with pytest.raises(config_lib.ConfigError, match="fedpsa.fixed_temperature"):
    config_lib.validate(c)


def test_fixed_temperature_needs_no_temperature():
  # Without the switch the thermometer sets Temp: a fixed value would silently do nothing, so it is refused.
  errors = _errors(_config(1.0, no_temperature=False))
  assert len(errors) == 1 and "fedpsa.no_temperature=True" in errors[0], errors
  assert _errors(_config(0.0, no_temperature=False)) == []
  assert _errors(_config(1.0)) == [] and _errors(_config(0.0)) == []
  assert config_lib.base_config().fedpsa.fixed_temperature == 0.0  # the default: γ + δ, the paper's reading


# --- configs/paper/table6.py --------------------------------------------------------------------------

PAPER_VARIANTS = ["no_t", "no_s", "no_ts", "full"]
TEMPS_VARIANTS = ["no_t", "no_t-T1", "no_t-Tdelta", "no_s", "no_ts", "no_ts-T1", "no_ts-Tdelta", "full"]
# variant -> (no_temperature, no_sensitivity, the Temp of its softmax: None where the thermometer sets it)
INTENDED = {"no_t": (True, False, 5.5), "no_t-T1": (True, False, 1.0), "no_t-Tdelta": (True, False, 0.5),
            "no_s": (False, True, None), "no_ts": (True, True, 5.5), "no_ts-T1": (True, True, 1.0),
            "no_ts-Tdelta": (True, True, 0.5), "full": (False, False, None)}


def _table6(arg: str = ""):
  return api._load_config_file(os.path.join(ROOT, "configs", "paper", "table6.py") + (f":{arg}" if arg else ""))


def _check_members(members, variants):
  cells = {}
  for m in members:
    key = (m.labels["alpha"], m.labels["concurrency"], m.labels["seed"])
    cells.setdefault(key, []).append(m)
    no_t, no_s, temp = INTENDED[m.labels["variant"]]
    f = m.config.fedpsa
    assert (m.config.method, f.no_temperature, f.no_sensitivity) == ("fedpsa", no_t, no_s), m.name
    assert (f.gamma, f.delta) == (GAMMA, DELTA)
    if temp is None:
      assert f.fixed_temperature == 0.0, m.name
    else:
      assert fedpsa_lib.fixed_temperature(f) == temp, m.name
  # Every (α, p, seed) cell holds exactly the intended variants, in the table's row order.
  assert {(a, p) for a, p, _ in cells} == {(a, p) for a in (1.0, 0.1) for p in (0.1, 0.2, 0.3)}
  for ms in cells.values():
    assert [m.labels["variant"] for m in ms] == variants
  return {m.name: m for m in members}


@pytest.mark.parametrize("smoke", [False, True])
def test_table6_expands_to_the_paper_members_and_with_temps_to_the_readings(smoke):
  prefix = "smoke," if smoke else ""
  paper_members = _check_members(sweep.expand(_table6(prefix.rstrip(","))), PAPER_VARIANTS)
  assert len(paper_members) == 2 * 4 * 3
  temps = _table6(prefix + "temps")
  temps_members = _check_members(sweep.expand(temps), TEMPS_VARIANTS)
  assert len(temps_members) == 2 * 8 * 3
  # The paper's members keep their names and configs, so `temps` into a finished Table 6 reruns none of them.
  for name, m in paper_members.items():
    assert temps_members[name].config.to_dict() == m.config.to_dict()
  assert temps.report.rows == ["alpha", "variant"] and temps.report.display["no_t-Tdelta"] == "w/o T (Temp=δ=0.5)"
  assert len(sweep.expand(_table6(prefix + "temps,seeds=2"))) == 2 * 2 * 8 * 3


def test_table6_temperature_reaches_the_strategy():
  # Each w/o T reading's member config, built into the strategy, starts its softmax at the intended Temp.
  for m in sweep.expand(_table6("smoke,temps")):
    if m.labels["alpha"] != 0.1 or m.labels["concurrency"] != 0.2 or not m.config.fedpsa.no_temperature:
      continue
    m.config.fedpsa.sketch_dim = K
    m.config.fedpsa.calibration, m.config.fedpsa.calibration_size = "real", 8  # _ctx's batch
    state = fedpsa_lib.FedPSA(m.config, _ctx()).init(PARAMS0)
    assert float(state.temperature) == pytest.approx(INTENDED[m.labels["variant"]][2], rel=1e-6), m.name


def test_table6_bad_argument_names_temps():
  with pytest.raises(config_lib.ConfigError,
                     match=r"'tmps' is invalid \(did you mean 'temps'\?\); allowed: smoke, seeds=.*, temps"):
    _table6("tmps")
