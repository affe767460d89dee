"""Validation shared by the strategies' `validate_config`: a section's rows and the buffer's size.

A strategy writes its section's checks as rows `(field, validator)` of the shared validators
(fedpsa_jax/validation.py) and adds only its cross-field checks by hand, so every method rejects a bool
where a number is wanted and NaN or an infinity where a finite value is, with one message shape:

  ROWS = (("server_lr", number(gt=0)), ("log", boolean))
  errors = section_errors(config, "fedbuff", ROWS + (("buffer_size", buffer_size(config)),))
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fedpsa_jax.validation import Validator, field_errors, get_field, integer, is_integer

Rows = Sequence[tuple[str, Validator]]


def section_errors(config: Any, section: str, rows: Rows) -> list[str]:
  """One message `'<section>.<field>=<value> is invalid; allowed: ...'` per row whose value fails."""
  return field_errors(config, [(f"{section}.{field}", validator) for field, validator in rows])


def buffer_size(config: Any) -> Validator:
  """K of a buffered method: an integer from 1 to N = partition.num_clients (a buffer larger than the
  federation never fills). With a bad N (reported by the run config's own rows) only K >= 1 is checked."""
  n = get_field(config, "partition.num_clients")
  if not is_integer(n):
    return integer(ge=1)
  return integer(ge=1, le=n, note="at most partition.num_clients")


def buffer_size_errors(config: Any, section: str) -> list[str]:
  """`<section>.buffer_size` checked by `buffer_size(config)` (for a strategy that has no other rows)."""
  return section_errors(config, section, (("buffer_size", buffer_size(config)),))


# How much a buffered flush moves the model in all (Σ_i w_i, before a server step size): `staleness` is
# FedBuff's step, the mean staleness discount of the flushed updates, (1/B) Σ_i (1 + τ_i)^(-1/2) (< 1 once any
# update is stale); `unit` is weights summing to 1, FedPSA's Eq. 20. Both strategies offer both, so that the
# shape of the weights and the size of the step can be varied apart (docs/methods.md, "Shape and step").
STEPS = ("staleness", "unit")


def staleness_discount(tau: np.ndarray) -> np.ndarray:
  """FedBuff's s(τ) = (1 + τ)^(-1/2), on the host (NumPy, float32 in, float32 out)."""
  return (1.0 + tau) ** -0.5


def staleness_step(tau: Sequence[int]) -> np.float32:
  """FedBuff's step for one flush, Σ_i s(τ_i) / B over the B flushed updates (the `staleness` of STEPS)."""
  return np.float32(staleness_discount(np.asarray(tau, np.float32)).sum() / np.float32(len(tau)))
