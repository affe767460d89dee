"""Validation shared by the strategies' `validate_config`: a section's rows and the buffer's size.

A strategy writes its section's checks as rows `(field, validator)` of the shared validators
(fedpsa_jax/validation.py) and adds only its cross-field checks by hand, so every method rejects a bool
where a number is wanted and NaN or an infinity where a finite value is, with one message shape:

  ROWS = (("server_lr", number(gt=0)), ("log", boolean))
  errors = section_errors(config, "fedbuff", ROWS + (("buffer_size", buffer_size(config)),))
"""

from __future__ import annotations

from typing import Any, Sequence

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
