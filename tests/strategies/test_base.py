"""What holds for every strategy: the base config of each method validates, every registered strategy's
default section validates clean and each of its fields goes through the shared validators (collected from the
registry, so a new strategy or field is covered without editing this file), and the buffer-size rules, checked
against the federation's size for each buffered method.
"""

from __future__ import annotations

import math

import ml_collections
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import strategies
from helpers import _cfg


@pytest.mark.parametrize("method", ["fedpsa", "fedbuff", "fedasync", "fedavg"])
def test_base_config_valid(method):
  assert config_lib.config_errors(_cfg(method)) == []


@pytest.mark.parametrize("method,field,value", [
    ("fedpsa", "buffer_size", 0),
    ("fedpsa", "buffer_size", 51),
    ("fedbuff", "buffer_size", 51),
    ("fedbuff", "buffer_size", 0),
])
def test_buffer_size_rejected(method, field, value):
  cfg = _cfg(method)
  assert cfg.partition.num_clients == 50
  cfg[method][field] = value
  errors = config_lib.config_errors(cfg)
  assert len(errors) == 1
  assert f"{method}.{field}" in errors[0] and str(value) in errors[0]


@pytest.mark.parametrize("method", ["fedpsa", "fedbuff"])
def test_buffer_size_equal_to_n_accepted(method):
  cfg = _cfg(method)
  cfg[method].buffer_size = 50
  assert config_lib.config_errors(cfg) == []
  cfg.partition.num_clients = 49
  assert any(f"{method}.buffer_size" in e for e in config_lib.config_errors(cfg))


# --- every registered strategy's section, through the shared validators --------------------------------


def _section_fields() -> list[tuple[str, str, object]]:
  """(method, field, default) of every field of every registered strategy's default section: collected from
  the registry, so that a new strategy (or a new field) is covered without editing this file."""
  strategies.load_all()
  return [(name, field, default) for name, cls in sorted(strategies.registered().items())
          for field, default in sorted(cls.default_config().items())]


def _is_numeric(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _with(method: str, field: str, value) -> ml_collections.ConfigDict:
  cfg = _cfg(method)
  # The section rebuilt from a dict, as from JSON: ConfigDict's own type check would turn True into 1.0 on a
  # float field and refuse NaN on an int one, so the strategy's validator would never see them.
  cfg[method] = ml_collections.ConfigDict({**cfg[method].to_dict(), field: value})
  assert type(cfg[method][field]) is type(value)
  return cfg


@pytest.mark.parametrize("method", sorted({m for m, _, _ in _section_fields()} | {"fedavg"}))
def test_every_default_section_validates_clean(method):
  assert config_lib.config_errors(_cfg(method)) == []


NUMERIC_FIELDS = [(m, f) for m, f, d in _section_fields() if _is_numeric(d)]


BOOL_FIELDS = [(m, f) for m, f, d in _section_fields() if isinstance(d, bool)]


def _only_error(cfg, method: str, field: str, value) -> str:
  errors = config_lib.config_errors(cfg)
  assert len(errors) == 1, errors
  assert errors[0].startswith(f"{method}.{field}={value!r} is invalid; allowed: "), errors
  return errors[0]


@pytest.mark.parametrize("bad", [True, math.nan, math.inf], ids=["bool", "nan", "inf"])
@pytest.mark.parametrize("method,field", NUMERIC_FIELDS, ids=[f"{m}.{f}" for m, f in NUMERIC_FIELDS])
def test_numeric_fields_reject_bools_and_non_finite_values(method, field, bad):
  """A bool is not a number (True == 1 would pass a bare isinstance check) and NaN or ±inf is never a
  usable hyperparameter: each is refused with the field named, in the one message shape."""
  _only_error(_with(method, field, bad), method, field, bad)
  with pytest.raises(config_lib.ConfigError, match=f"{method}\\.{field}="):
    config_lib.validate(_with(method, field, bad))


@pytest.mark.parametrize("bad", [1, "True"])
@pytest.mark.parametrize("method,field", BOOL_FIELDS, ids=[f"{m}.{f}" for m, f in BOOL_FIELDS])
def test_switches_reject_anything_but_a_bool(method, field, bad):
  assert _only_error(_with(method, field, bad), method, field, bad).endswith("allowed: True, False")


@pytest.mark.parametrize("method,field,default", _section_fields(),
                         ids=[f"{m}.{f}" for m, f, _ in _section_fields()])
def test_every_section_field_is_validated(method, field, default):
  """None fits no validator: a field that `validate_config` forgets to check passes it and fails here."""
  del default
  _only_error(_with(method, field, None), method, field, None)


def test_buffer_size_is_bounded_by_the_federation():
  assert NUMERIC_FIELDS and BOOL_FIELDS  # the registry was read
  for method in sorted(m for m, f, _ in _section_fields() if f == "buffer_size"):
    cfg = _cfg(method)
    n = cfg.partition.num_clients
    for k, ok in ((1, True), (n, True), (n + 1, False), (0, False)):
      cfg[method].buffer_size = k
      assert (config_lib.config_errors(cfg) == []) == ok, (method, k)
    assert config_lib.config_errors(cfg)[0] == (
        f"{method}.buffer_size=0 is invalid; allowed: an integer in [1, {n}] (at most partition.num_clients)")
