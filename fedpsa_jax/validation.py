"""Validators shared by the run config and the strategies' sections: validation written as data.

A `Validator` is a predicate on one value plus the words that say what it allows. A config is checked
against rows `(dotted field, validator)` by `field_errors`, and every message has one shape:
`'<field>=<value> is invalid; allowed: <what>'`. Numbers are strict: a bool is not a number (Python's
True == 1 would slip through `isinstance(v, int)`), and `number` rejects NaN and infinities unless asked
not to. No dependencies beyond the standard library, so any layer can use it.

  ROWS = [("local.lr", number(gt=0)), ("local.epochs", integer(ge=1)), ("model.init", one_of(INITS)),
          ("eval.every_round", boolean)]
  errors = field_errors(config, ROWS)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Iterable, Sequence

MISSING = object()  # what `get_field` returns for a path the config does not have
# Every integer of a config reaches NumPy or JAX as an int64 (an array, a counter, a key); beyond it, they raise
# OverflowError or wrap around, so `field_errors` refuses it whatever the field's own validator says.
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Validator:
  """`test(value) -> bool` and `allowed`, the words an error message gives for the accepted values."""

  test: Callable[[Any], bool]
  allowed: str

  def __call__(self, value: Any) -> bool:
    return bool(self.test(value))


def is_integer(value: Any) -> bool:
  """An integer (Python or NumPy), not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any, finite: bool = True) -> bool:
  """A real number (int or float, Python or NumPy), not a bool; finite unless `finite=False`."""
  if not isinstance(value, numbers.Real) or isinstance(value, bool):
    return False
  return not finite or math.isfinite(value)


def _in_range(value: Any, gt: Any, ge: Any, lt: Any, le: Any) -> bool:
  return ((gt is None or value > gt) and (ge is None or value >= ge) and (lt is None or value < lt)
          and (le is None or value <= le))


def _range_words(kind: str, gt: Any, ge: Any, lt: Any, le: Any) -> str:
  """'a number in (0, 1]', 'an integer >= 1', 'a number > 0', ... ."""
  low, high = (gt, "(") if gt is not None else (ge, "["), (lt, ")") if lt is not None else (le, "]")
  if low[0] is not None and high[0] is not None:
    return f"{kind} in {low[1]}{low[0]}, {high[0]}{high[1]}"
  if low[0] is not None:
    return f"{kind} {'>' if gt is not None else '>='} {low[0]}"
  if high[0] is not None:
    return f"{kind} {'<' if lt is not None else '<='} {high[0]}"
  return kind


def _noted(words: str, note: str) -> str:
  return f"{words} ({note})" if note else words


def integer(*, gt: Any = None, ge: Any = None, lt: Any = None, le: Any = None, note: str = "") -> Validator:
  """An integer (not a bool) within the given bounds; `note` is added to the allowed words."""
  return Validator(lambda v: is_integer(v) and _in_range(v, gt, ge, lt, le),
                   _noted(_range_words("an integer", gt, ge, lt, le), note))


def number(*, gt: Any = None, ge: Any = None, lt: Any = None, le: Any = None, finite: bool = True,
           note: str = "") -> Validator:
  """A real number (not a bool; finite unless `finite=False`) within the given bounds."""
  return Validator(lambda v: is_number(v, finite) and _in_range(v, gt, ge, lt, le),
                   _noted(_range_words("a number", gt, ge, lt, le), note))


def one_of(choices: Iterable[Any], note: str = "") -> Validator:
  """One of `choices` (listed sorted in the message)."""
  options = tuple(choices)
  return Validator(lambda v: _hashable(v) and v in options, _noted(", ".join(sorted(map(str, options))), note))


def _hashable(value: Any) -> bool:
  try:
    hash(value)
  except TypeError:
    return False
  return True


def sequence_of(item: Validator, *, min_len: int = 0, note: str = "") -> Validator:
  """A tuple or list of at least `min_len` values, each passing `item`."""
  words = f"a {'non-empty ' if min_len == 1 else ''}tuple of {_plural(item.allowed)}"
  if min_len > 1:
    words += f" (at least {min_len})"
  return Validator(lambda v: isinstance(v, (tuple, list)) and len(v) >= min_len and all(item(x) for x in v),
                   _noted(words, note))


def _plural(words: str) -> str:
  for article in ("an ", "a "):
    if words.startswith(article):
      head, _, rest = words[len(article):].partition(" ")
      return f"{head}s {rest}".strip()
  return words


boolean = Validator(lambda v: isinstance(v, bool), "True, False")


def get_field(config: Any, path: str) -> Any:
  """The value at dotted `path` of a ConfigDict or nested dict; MISSING if any part is absent."""
  node = config
  for part in path.split("."):
    try:
      if part not in node:
        return MISSING
      node = node[part]
    except TypeError:  # a leaf where a section was expected
      return MISSING
  return node


SHOWN_CHARS = 200  # the most of a value's repr that a message shows (`shown`)


def shown(value: Any) -> str:
  """`repr(value)`, or for a huge value (a 20,000-element tuple) its start and its size: a message names a value,
  it never echoes the whole of one."""
  text = repr(value)
  if len(text) <= SHOWN_CHARS:
    return text
  items = f"{len(value):,} items, " if isinstance(value, (list, tuple, dict, set, frozenset)) else ""
  return f"{text[:SHOWN_CHARS]}… ({items}{len(text):,} characters)"


def error(field: str, value: Any, allowed: str) -> str:
  """The one shape of a config error message: the field, the value (`shown`) and what is allowed."""
  if value is MISSING:
    return f"{field} is missing; allowed: {allowed}"
  return f"{field}={shown(value)} is invalid; allowed: {allowed}"


def field_errors(config: Any, rows: Sequence[tuple[str, Validator]]) -> list[str]:
  """One message per row `(dotted field, validator)` whose value in `config` fails its validator, or is an
  integer beyond int64."""
  errors = []
  for field, validator in rows:
    value = get_field(config, field)
    if value is MISSING or not validator(value):
      errors.append(error(field, value, validator.allowed))
    elif is_integer(value) and not INT64_MIN <= value <= INT64_MAX:
      errors.append(error(field, value, f"{validator.allowed}, within int64 (at most {INT64_MAX})"))
  return errors


__all__ = ["INT64_MAX", "INT64_MIN", "MISSING", "Validator", "boolean", "error", "field_errors", "get_field", "integer",
           "is_integer", "is_number", "number", "one_of", "sequence_of"]
