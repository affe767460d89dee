"""Local SGD against an explicit reference: the same schedule written as a plain Python loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpsa_jax import local
from fedpsa_jax.models import TinyMLP
from numerics import assert_close, f32_tolerance


@pytest.fixture(scope="module")
def problem():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(200, 4, 4, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, size=200), jnp.int32)
  model = TinyMLP(num_classes=3, hidden=8)
  params = model.init(jax.random.key(0), x[:1])
  index_row = jnp.asarray(np.concatenate([rng.permutation(200)[:70], np.zeros(30, int)]), jnp.int32)
  return model, params, x, y, index_row


def reference_train(model, params, x, y, index_row, n, lr, key, batch_size, epochs, mu=0.0):
  """Plain loop: per epoch the same shuffle, real (unpadded) batches, mean loss over each batch."""
  orders = local.epoch_orders(key, jnp.int32(n), index_row.shape[0], epochs)
  anchor = params
  for e in range(epochs):
    order = np.asarray(orders[e])[:n]
    for start in range(0, n, batch_size):
      sample = np.asarray(index_row)[order[start:start + batch_size]]

      def loss(p):
        l = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x[sample]), y[sample]))
        sq = sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(anchor)))
        return l + 0.5 * mu * sq

      g = jax.grad(loss)(params)
      params = jax.tree.map(lambda p, gi: p - lr * gi, params, g)
  return params


def train(trainer, params, x, y, index_row, n, lr, key, **kwargs):
  """One client update through the public entry point, as job 0 under `key`: its samples are shuffled under
  fold_in(key, 0) (`job_key`)."""
  return trainer.train_job(params, client_data(x, y, index_row, n), lr=lr, clients_key=key, job_id=0, **kwargs)


def client_data(x, y, index_rows, num_samples):
  """The samples one update reads (`train_job`: a row, a host int; `train_batch`: J of each), orders unset."""
  return local.ClientData(x_all=x, y_all=y, index_row=index_rows, orders=None, num_samples=num_samples)


def job_key(key):
  """The key `train` shuffles under."""
  return jax.random.fold_in(key, 0)


def assert_trees_close(a, b, steps):
  """Equal up to float32 rounding: a gradient element sums a batch of at most 32 samples times a layer's
  fan-in of 16, and each of `steps` SGD steps starts from the last one's rounded parameters."""
  assert_close(a, b, f32_tolerance(32 * 16, depth=steps))


@pytest.mark.slow
@pytest.mark.parametrize("loop, max_unroll", [("unrolled", 1), ("unrolled", 2), ("rolled", 4)])
def test_masked_partial_batches_equal_unpadded_training(problem, loop, max_unroll):
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, batch_size=32, epochs=2, loop=loop, max_unroll=max_unroll)
  key = jax.random.key(5)
  got = train(trainer, params, x, y, index_row, 70, 0.1, key)  # 70 = 32 + 32 + 6: a partial batch
  want = reference_train(model, params, x, y, index_row, 70, 0.1, job_key(key), 32, 2)
  assert_trees_close(got, want, steps=2 * 3)
  # Training really moved the parameters (so equality above is not trivial).
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params))) > 1e-3


@pytest.mark.slow
def test_proximal_term_matches_reference(problem):
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, 16, 1, regularizer=local.ProximalTerm(0.5), max_unroll=2)
  key = jax.random.key(1)
  got = train(trainer, params, x, y, index_row, 40, 0.2, key)
  want = reference_train(model, params, x, y, index_row, 40, 0.2, job_key(key), 16, 1, mu=0.5)
  assert_trees_close(got, want, steps=3)


def test_same_key_same_result_other_key_differs(problem):
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, 16, 2)
  a = train(trainer, params, x, y, index_row, 50, 0.1, jax.random.key(3))
  b = train(trainer, params, x, y, index_row, 50, 0.1, jax.random.key(3))
  c = train(trainer, params, x, y, index_row, 50, 0.1, jax.random.key(4))
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  assert any(not np.allclose(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


@pytest.mark.slow
def test_epoch_orders_are_fresh_permutations_with_padding_last():
  orders = np.asarray(local.epoch_orders(jax.random.key(0), jnp.int32(7), 10, 3))
  for row in orders:
    assert sorted(row[:7]) == list(range(7))
    assert list(row[7:]) == [7, 8, 9]
  assert not (np.array_equal(orders[0], orders[1]) and np.array_equal(orders[1], orders[2]))


@pytest.mark.parametrize("max_n, width", [(1, 1), (2, 2), (3, 4), (64, 64), (65, 128), (1000, 1024)])
def test_training_width_is_the_next_power_of_two(max_n, width):
  assert local.training_width(max_n) == width
  table = jnp.arange(3 * max_n, dtype=jnp.int32).reshape(3, max_n)
  rows = local.training_rows(table)
  assert rows.shape == (3, width) and rows.dtype == jnp.int32
  np.testing.assert_array_equal(rows[:, :max_n], table)
  assert not np.asarray(rows[:, max_n:]).any()  # padded with index 0, as the table itself


def _bits(tree) -> list[np.ndarray]:
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["unrolled", "rolled"])
def test_a_client_update_is_the_same_bits_at_any_row_width(problem, loop):
  """What makes padding the rows to `training_width` safe: one job, and a batch of two, trained from a row of 100
  and from the same row padded to 256, give bitwise equal parameters (70 samples: a partial batch)."""
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, batch_size=32, epochs=2, loop=loop)
  key = jax.random.key(2)
  widths = (100, 256)
  rows = {w: jnp.pad(index_row, (0, w - index_row.shape[0])) for w in widths}
  jobs = {w: _bits(train(trainer, params, x, y, rows[w], 70, np.float32(0.1), key)) for w in widths}
  stacked = jax.tree.map(lambda p: jnp.stack([p, p]), params)
  keys, sizes = jax.random.split(key), jnp.asarray([70, 45], jnp.int32)
  batches = {w: _bits(trainer.train_batch(stacked, client_data(x, y, jnp.stack([rows[w], rows[w]]), sizes),
                                          lr=jnp.full(2, 0.1, jnp.float32), keys=keys,
                                          total_steps=local.num_local_steps(70, 32, 2)))
             for w in widths}
  for w in widths[1:]:
    for a, b in zip(jobs[widths[0]], jobs[w]):
      np.testing.assert_array_equal(a, b)
    for a, b in zip(batches[widths[0]], batches[w]):
      np.testing.assert_array_equal(a, b)
  assert not np.array_equal(jobs[100][0], _bits(params)[0])  # (training moved the parameters)


@pytest.mark.parametrize("total", [0, 1, 5, 10, 16, 17, 31, 100])
def test_chunks_cover_steps_exactly_with_few_shapes(total):
  trainer = local.LocalTrainer(lambda p, x: x, 1, 1, max_unroll=16)
  chunks = trainer.chunk_sizes(total)
  assert sum(chunks) == total
  assert set(chunks) <= {16, 8, 4, 2, 1}


def test_learning_rate_is_traced_no_recompilation(problem):
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, 32, 1, max_unroll=4)
  train(trainer, params, x, y, index_row, 64, 0.1, jax.random.key(0))
  before = local._run_batches._cache_size()
  assert before > 0  # the unrolled path went through it
  train(trainer, params, x, y, index_row, 64, 0.05, jax.random.key(1))
  assert local._run_batches._cache_size() == before


@pytest.mark.parametrize("max_unroll", [1, 4])
def test_epoch_calls_are_the_dataloader_batches_with_few_programs(max_unroll):
  """For every client size n, an epoch's calls run exactly the DataLoader's batches (positions
  [64 i, min(64 (i + 1), n)) of the shuffled order, the last one padded to a power of two >= 8), using
  programs of a power-of-two count <= max_unroll of batches of B, 8, 16 or 32 rows: few, whatever n."""
  b = 64
  trainer = local.LocalTrainer(lambda p, x: x, batch_size=b, epochs=1, max_unroll=max_unroll)
  programs = set()
  for n in range(1, 400):
    batches = []
    for start, count, rows in trainer.epoch_calls(n):
      programs.add((count, rows))
      batches += [range(start + s * rows, start + (s + 1) * rows) for s in range(count)]
    want = [range(i, min(i + b, n)) for i in range(0, n, b)]
    assert [[p for p in batch if p < n] for batch in batches] == [list(w) for w in want], n
    last = len(want[-1])
    assert len(batches[-1]) == (b if last == b else max(8, 1 << (last - 1).bit_length())), n
  assert {rows for _, rows in programs} == {b, 8, 16, 32}
  counts = {count for count, _ in programs}
  assert max(counts) == max_unroll and all(c & (c - 1) == 0 for c in counts)


def test_num_local_steps():
  assert local.num_local_steps(90, 64, 5) == 10
  assert local.num_local_steps(64, 64, 5) == 5
  assert local.num_local_steps(1, 64, 3) == 3


def test_resolve_loop():
  assert local.resolve_loop("auto", "cpu") == "unrolled"  # (a model is taken to convolve unless told)
  assert local.resolve_loop("auto", "cpu", convolutional=True) == "unrolled"
  assert local.resolve_loop("auto", "cpu", convolutional=False) == "rolled"
  assert local.resolve_loop("auto", "gpu", convolutional=True) == "rolled"
  assert local.resolve_loop("rolled", "cpu") == "rolled"
  assert local.resolve_loop("unrolled", "gpu", convolutional=False) == "unrolled"


@pytest.mark.slow
@pytest.mark.parametrize("n", [64, 70, 90])  # no partial batch; a partial batch of 6 (8 rows); of 26 (32 rows)
@pytest.mark.parametrize("mu", [0.0, 0.5])  # (0.5: every step reads the anchor)
def test_train_job_is_the_job_shuffle_then_training(problem, n, mu):
  """`train_job` (rolled: shuffle and all epochs in one call) equals the reference loop under the job's key
  fold_in(clients_key, job_id), and the unrolled path's result."""
  model, params, x, y, index_row = problem
  clients_key, job_id = jax.random.key(9), 17
  regularizer = local.ProximalTerm(mu) if mu else None
  want = reference_train(model, params, x, y, index_row, n, 0.1, jax.random.fold_in(clients_key, job_id), 32, 2, mu=mu)
  for loop in ("rolled", "unrolled"):
    trainer = local.LocalTrainer(model.apply, batch_size=32, epochs=2, loop=loop, regularizer=regularizer)
    got = trainer.train_job(params, client_data(x, y, index_row, n), lr=np.float32(0.1), clients_key=clients_key,
                            job_id=job_id)
    assert_trees_close(got, want, steps=2 * local.num_local_steps(n, 32, 1))


@pytest.mark.slow
def test_rolled_job_compiles_once_per_partial_batch_size(problem):
  """The rolled job's loop over full batches is traced: every client size shares one program per size of the
  partial batch (none, 8, 16 or 32 rows for B = 32), however many full batches it has."""
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, batch_size=32, epochs=1, loop="rolled")
  before = local._run_job._cache_size()
  sizes = range(1, 101)
  for n in sizes:
    train(trainer, params, x, y, index_row, n, np.float32(0.1), jax.random.key(0))
  assert local._run_job._cache_size() - before == len({trainer.epoch_plan(n)[1] for n in sizes}) == 4


def _spy_chain(monkeypatch, name):
  """Records the parameters handed to every call of the jitted chain function `name`."""
  inputs = []
  original = getattr(local, name)

  def spy(params, *args, **kwargs):
    inputs.append(params)
    return original(params, *args, **kwargs)

  monkeypatch.setattr(local, name, spy)
  return inputs


@pytest.mark.slow
@pytest.mark.parametrize("owned", [False, True])
@pytest.mark.parametrize("mu", [0.0, 0.1])
def test_each_step_consumes_the_last_ones_parameters_never_the_callers(problem, monkeypatch, owned, mu):
  # Donation along the chain (local.py docstring): every call's input is given up once it has run, so a job
  # in flight holds one working set, whatever its step count; the caller's tree survives unless handed over
  # (`owned`) to a chain that does not read it as the anchor (FedProx's term does: mu > 0).
  model, params, x, y, index_row = problem
  regularizer = local.ProximalTerm(mu) if mu else None
  trainer = local.LocalTrainer(model.apply, batch_size=32, epochs=2, max_unroll=1, regularizer=regularizer)
  key = jax.random.key(5)
  expected = reference_train(model, params, x, y, index_row, 70, 0.1, job_key(key), 32, 2, mu=mu)
  mine = jax.tree.map(jnp.copy, params)
  inputs = _spy_chain(monkeypatch, "_run_batches")
  got = train(trainer, mine, x, y, index_row, 70, 0.1, key, owned=owned)
  assert len(inputs) == 6  # 2 epochs x (2 full batches + the partial one)
  assert all(leaf.is_deleted() for tree in inputs[1:] for leaf in jax.tree.leaves(tree))
  consumed = owned and not mu
  assert all(leaf.is_deleted() == consumed for leaf in jax.tree.leaves(mine))
  assert (inputs[0] is mine) == consumed  # (else the chain started from a private copy)
  assert_trees_close(got, expected, steps=6)


@pytest.mark.slow
def test_batched_chain_consumes_its_stacked_parameters_step_by_step(problem, monkeypatch):
  model, params, x, y, index_row = problem
  trainer = local.LocalTrainer(model.apply, batch_size=32, epochs=1, max_unroll=1)
  stacked = jax.tree.map(lambda p: jnp.stack([p, p]), params)
  mine = jax.tree.map(jnp.copy, stacked)
  inputs = _spy_chain(monkeypatch, "_run_batch")
  rows = jnp.stack([index_row, index_row])
  keys = jax.random.split(jax.random.key(1), 2)
  got = trainer.train_batch(mine, client_data(x, y, rows, jnp.asarray([70, 40], jnp.int32)),
                            lr=jnp.asarray([0.1, 0.2]), keys=keys, total_steps=3)
  assert len(inputs) == 3  # 3 steps, one call each (max_unroll 1)
  assert all(leaf.is_deleted() for tree in inputs[1:] for leaf in jax.tree.leaves(tree))
  assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(mine))  # not handed over: a copy was consumed
  for j, (n, lr) in enumerate([(70, 0.1), (40, 0.2)]):
    one = reference_train(model, params, x, y, index_row, n, lr, keys[j], 32, 1)  # (batched: keys[j] itself)
    assert_trees_close(jax.tree.map(lambda leaf: leaf[j], got), one, steps=3)
