"""FedPSA's server work per round: two jitted calls at the flush (the aggregation, the new global model's
sketch), none at the receives before it.

Executions are counted where XLA runs them (`pxla.ExecuteReplicated.__call__`), with JAX's C++ dispatch fast
path turned off for the span (it would run a cached executable without passing through Python), so every
jitted function and every eager op (`x + 1`, `x[i]`, `jnp.stack`) counts: a hidden per-arrival op would show.
"""

from __future__ import annotations

import collections
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import pjit
from jax._src.interpreters import pxla

from fedpsa_jax import checkpoint
from numerics import assert_close, f32_tolerance
from test_strategies import K_SKETCH, PARAMS0, RefFedPSA, _arrival, _cos, _fedpsa, _flat, _np_tree, _random_like

NUM_PARAMS = sum(np.size(x) for x in jax.tree.leaves(PARAMS0))


@contextlib.contextmanager
def count_executions():
  """Yields a Counter of XLA executions by program name ('jit(_aggregate)', 'jit(add)', ...) made inside the
  block. JAX's caches are cleared on entry and exit, so no call inside can take the C++ path."""
  counts: collections.Counter[str] = collections.Counter()
  call, fastpath = pxla.ExecuteReplicated.__call__, pjit._get_fastpath_data

  def counted_call(self, *args):
    counts[self.name] += 1
    return call(self, *args)

  pxla.ExecuteReplicated.__call__ = counted_call
  pjit._get_fastpath_data = lambda *args, **kwargs: None  # no fast-path entry: every call goes through Python
  jax.clear_caches()
  try:
    yield counts
  finally:
    pxla.ExecuteReplicated.__call__, pjit._get_fastpath_data = call, fastpath
    jax.clear_caches()


def _arrivals(rng, n: int, first: int = 0) -> list:
  return [_arrival(first + i, _random_like(PARAMS0, rng, rng.uniform(0.01, 0.3)),
                   jnp.asarray(rng.normal(size=K_SKETCH), jnp.float32)) for i in range(n)]


def _groups(items: list, sizes: tuple[int, ...]) -> list[list]:
  starts = np.cumsum((0, *sizes))
  assert starts[-1] == len(items)
  return [items[a:b] for a, b in zip(starts[:-1], starts[1:])]


def test_counter_sees_eager_ops_and_the_fast_path():
  # The counter itself: an eager op and a warm jitted function (cached, so normally on the C++ path) count.
  f = jax.jit(lambda x: x * 2)
  x = jnp.arange(3.0)
  f(x), f(x)
  with count_executions() as counts:
    f(x), f(x), x + 1, x[1]
  assert counts["jit(<lambda>)"] == 2 and sum(counts.values()) >= 4, counts


@pytest.mark.parametrize("buffer_size,sizes", [(3, (1, 1, 1)), (9, (1,) * 9), (9, (2, 3, 4)), (3, (1, 3))])
def test_a_round_is_three_jitted_calls_however_many_arrivals(buffer_size, sizes):
  strategy, state = _fedpsa(buffer_size=buffer_size, queue_length=4)
  rng = np.random.default_rng(0)
  # Two rounds: the queue (L_q = 4) fills during the first or the second, and both are counted.
  rounds = [_groups(_arrivals(rng, sum(sizes), 100 * r), sizes) for r in range(2)]
  for groups in rounds:
    for group in groups[:-1]:
      with count_executions() as counts:
        state, changed = strategy.receive(state, group)
      assert not changed and sum(counts.values()) == 0, counts  # no device work before the flush
    with count_executions() as counts:
      state, changed = strategy.receive(state, groups[-1])
    # (The aggregation, then the new global model's sensitivity and its projection: sensitivity.sketch_of.)
    assert changed and counts == {"jit(_aggregate)": 1, "jit(_sensitivity_of)": 1, "jit(sketch)": 1}, counts
    with count_executions() as counts:
      diagnostics = strategy.diagnostics(state)
    assert sum(counts.values()) == 0, counts
    assert isinstance(diagnostics["temperature"], jax.Array) and diagnostics["kappa"].shape == (sum(sizes),)
  assert state.queue_count == 2 * sum(sizes) >= 4 and float(state.m0) > 0


def test_event_records_hold_kappa_and_norm_of_each_arrival_at_and_between_flushes():
  strategy, state = _fedpsa(buffer_size=3, queue_length=4)
  # A stand-in for the Fig. 6 alignment (the test's context has no test split): known values per arrival.
  strategy._alignment_fn = jax.jit(lambda server, starts, deltas: 0.25 + jnp.arange(len(deltas), dtype=jnp.float32))
  rng = np.random.default_rng(1)
  g = rng.normal(size=K_SKETCH)
  state = state.replace(global_sketch=jnp.asarray(g, jnp.float32))
  # Receives of 1 and 1 arrival (buffered), then 3 at once (a flush of 5, overflowing L_s = 3), then 2 (buffered
  # against the new global sketch).
  for group, flush in ((_arrivals(rng, 1), False), (_arrivals(rng, 1, 10), False), (_arrivals(rng, 3, 20), True),
                       (_arrivals(rng, 2, 30), False)):
    sketch = np.asarray(state.global_sketch, np.float64)  # what κ compares against: the sketch before the flush
    state, changed = strategy.receive(state, group)
    assert changed == flush
    with count_executions() as counts:
      records = strategy.event_records(state, group)
    assert sum(counts.values()) == 1, counts  # one small call: computed now, or picked from the flush's vectors
    records = jax.device_get(records)
    assert [set(r) for r in records] == [{"kappa", "delta_sq_norm", "alignment"}] * len(group)
    kappas = [_cos(a.payload, sketch) for a in group]
    norms = [float(np.sum(_flat(_np_tree(a.delta)) ** 2)) for a in group]
    assert_close([r["kappa"] for r in records], kappas, f32_tolerance(K_SKETCH))
    assert_close([r["delta_sq_norm"] for r in records], norms, f32_tolerance(NUM_PARAMS))
    np.testing.assert_array_equal([r["alignment"] for r in records], 0.25 + np.arange(len(group)))
    if flush:  # the flush's own vectors: the buffered 2 first, then these 3
      assert_close(state.last_norms[-3:], norms, f32_tolerance(NUM_PARAMS))
      assert state.last_kappas.shape == state.last_norms.shape == (5,)


def test_checkpoint_mid_buffer_then_continuing_gives_the_same_params_bit_for_bit(tmp_path):
  lq, ls, gamma, delta = 4, 3, 0.8, 0.1
  strategy, state = _fedpsa(buffer_size=ls, queue_length=lq, gamma=gamma, delta=delta)
  ref = RefFedPSA(PARAMS0, ls, lq, gamma, delta)
  rng = np.random.default_rng(2)
  g = np.asarray(state.global_sketch, np.float64)
  before, after = _groups(_arrivals(rng, 5), (2, 1, 2)), _groups(_arrivals(rng, 7, 50), (1, 2, 1, 3))
  for group in before:  # one flush (at the 3rd arrival), then 2 arrivals buffered
    state, changed = strategy.receive(state, group)
    assert changed == ref.receive(group, g)
    g = np.asarray(state.global_sketch, np.float64)  # (changed at a flush only, in both)
  assert len(state.sketches) == 2 and state.queue_count == 3
  store = checkpoint.CheckpointStore(str(tmp_path / "checkpoints"), keep=1)
  store.save(1, {"state": state}, {"seed": 0})
  restored = store.restore_latest().snapshot["state"]
  store.close()
  assert type(restored) is type(state) and restored.queue_count == 3 and len(restored.sketches) == 2
  states = [state, restored]
  for group in after:  # three more flushes: the queue fills inside the first
    results = [strategy.receive(s, group) for s in states]
    states = [s for s, _ in results]
    assert [c for _, c in results] == [ref.receive(group, g)] * 2
    g = np.asarray(states[0].global_sketch, np.float64)
  assert ref.m0 is not None and states[0].queue_count == 12
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  assert_close(states[0].params, ref.params, f32_tolerance(4, depth=3))
