"""Float comparisons whose tolerance fits the numbers compared, on any CPU.

XLA:CPU picks its vector width and summation order from the instruction set (AVX-512, AVX2, ...), so two
float32 programs that are equal in exact arithmetic differ in their last bits, by different amounts on
different machines. A tolerance here is therefore never one machine's observed difference: it is derived
from float32 precision and the length of the reductions that produced the numbers, and it is measured
against the magnitude of the values compared (a tiny element produced by cancellation inside a large sum
carries the rounding noise of the large terms, not of its own size).

`assert_close` also checks, at every call, that its tolerance is tight enough to catch a real error: that
the actual values scaled by 1.01, or with one element off by 1% of the values' scale, would fail. A
tolerance loosened past that point fails the test that wrote it, on every machine.

With FEDPSA_TOLERANCE_LOG=path set, every call appends one JSON line (test, call site, tolerance, largest
error seen as a fraction of the tolerance) for tests/tolerance_report.py.
"""

from __future__ import annotations

import inspect
import json
import math
import os

import jax
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23 ≈ 1.19e-7: float32's unit roundoff, twice
# Rounding errors of a sum of n terms grow like √n for the usual random-sign errors (a bound linear in n
# holds for adversarial orders only). SAFETY covers the constant in front and the difference of two
# orders (both sides of a comparison carry their own error).
SAFETY = 16.0
BREAK = 0.01  # the smallest real error every comparison must catch: a factor 1.01, or one element off by 1%


def f32_tolerance(terms: int, depth: int = 1) -> float:
  """Relative rounding noise to allow in a float32 result built from reductions of `terms` summands each,
  through `depth` dependent stages (e.g. SGD steps, each feeding the next; errors add stage by stage).

  rel = SAFETY · ε₃₂ · √terms · depth, measured against the scale of the compared values (see
  `assert_close`). Examples: a 5×5×3 conv over 64 images of 10×10 (kernel gradient: 6,400 terms) gives
  1.5e-4; a dot of two 10-vectors 6e-6.
  """
  if terms < 1 or depth < 1:
    raise ValueError(f"terms and depth must be >= 1, got {terms}, {depth}")
  return SAFETY * EPS32 * math.sqrt(terms) * depth


def _scale(desired: np.ndarray) -> float:
  """The magnitude the rounding noise of a leaf is measured against: its root mean square."""
  return float(np.sqrt(np.mean(np.square(desired)))) if desired.size else 0.0


def _leaf_close(actual, desired, rel: float, scale: float | None, where: str) -> float:
  """Checks one leaf; returns its largest error as a fraction of the allowed one. Raises AssertionError with
  the worst element named when it is not close, or when the tolerance could not catch a 1% error."""
  a, d = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
  if a.shape != d.shape:
    raise AssertionError(f"{where}: shapes differ: {a.shape} vs {d.shape}")
  if not np.all(np.isfinite(a)) or not np.all(np.isfinite(d)):
    np.testing.assert_array_equal(a, d, err_msg=f"{where}: non-finite values differ")
    return 0.0
  s = _scale(d) if scale is None else scale
  allowed = rel * (np.abs(d) + s)
  error = np.abs(a - d)
  if not np.all(error <= allowed):
    i = np.unravel_index(int(np.argmax(error - allowed)), d.shape) if d.ndim else ()
    raise AssertionError(
        f"{where}: not close (tolerance {rel:.2e} of |desired| + scale {s:.3g})"
        f"\n  worst element {i}: actual {a[i]!r}, desired {d[i]!r}, error {error[i]:.3g} > allowed {allowed[i]:.3g}"
        f"\n  {int(np.sum(error > allowed))} of {d.size} elements outside")
  _check_catches_breaks(d, s, allowed, rel, where)
  return float(np.max(error / np.maximum(allowed, np.finfo(np.float64).tiny), initial=0.0))


def _check_catches_breaks(d: np.ndarray, s: float, allowed: np.ndarray, rel: float, where: str) -> None:
  """The tolerance must reject the desired values scaled by 1 + BREAK, and one element (the smallest in
  magnitude: the hardest to see) moved by BREAK times the leaf's scale `s`."""
  if s == 0.0:
    return  # all zeros with no explicit scale: the allowed error is 0, anything but equality fails
  if not np.any(np.abs(BREAK * d) > allowed):
    raise AssertionError(f"{where}: tolerance {rel:.2e} is too loose to catch a factor {1 + BREAK}")
  i = np.unravel_index(int(np.argmin(np.abs(d))), d.shape) if d.ndim else ()
  if not BREAK * s > allowed[i]:
    raise AssertionError(f"{where}: tolerance {rel:.2e} is too loose to catch one element off by {BREAK:.0%}")


def assert_close(actual, desired, rel: float, *, scale: float | None = None) -> None:
  """Asserts that two arrays or pytrees of floats agree up to rounding, leaf by leaf:

    |actual − desired| ≤ rel · (|desired| + scale)   elementwise,

  with `scale` the leaf's root mean square unless given (give it where the values compared are tiny
  differences of large terms, e.g. a gradient that cancels to ~0). `rel` comes from `f32_tolerance`
  (rounding) or from a documented model of the error (e.g. a Monte-Carlo estimate's standard error).
  Desired values may be float64 references; both sides are compared in float64.
  """
  if any(jax.tree_util.treedef_is_leaf(jax.tree.structure(t)) for t in (actual, desired)):
    actual, desired = np.asarray(actual), np.asarray(desired)  # an array against a list of numbers
  a_leaves, treedef = jax.tree.flatten(actual)
  d_leaves, d_treedef = jax.tree.flatten(desired)
  caller = inspect.currentframe().f_back  # (inspect.stack() would read the source of every frame)
  where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
  if len(a_leaves) != len(d_leaves):
    raise AssertionError(f"{where}: trees differ: {treedef} vs {d_treedef}")
  worst = 0.0
  for k, (a, d) in enumerate(zip(a_leaves, d_leaves)):
    worst = max(worst, _leaf_close(a, d, rel, scale, f"{where} leaf {k}" if len(a_leaves) > 1 else where))
  log = os.environ.get("FEDPSA_TOLERANCE_LOG")
  if log:
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    with open(log, "a") as f:
      f.write(json.dumps({"test": test, "site": where, "rel": rel, "worst_fraction_of_tolerance": worst}) + "\n")
