"""Building a run (fedpsa_jax/sim/build.py) on its own, without running it: `prepare`'s checks and claim, the
federation `build_data` makes, `sample_split`, the `StrategyContext` and the `Run` of `build_run`, each
against what the config asks for, counted by hand."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpsa_jax import config as config_lib
from fedpsa_jax import seeding
from fedpsa_jax.data.sources import Dataset
from fedpsa_jax.models import get_model
from fedpsa_jax.sim import build
from fedpsa_jax.strategies.fedbuff import FedBuff
from helpers import small_config

NUM_CLIENTS, CONCURRENCY, TEST_FRACTION = 10, 0.5, 0.2


def _config(**fields):
  return small_config("fedbuff", partition__num_clients=NUM_CLIENTS, sim__concurrency=CONCURRENCY,
                      data__client_test_fraction=TEST_FRACTION, **fields)


@pytest.fixture(scope="module")
def built():
  """(config, (dataset, fed), run) of one small run, built once for the file."""
  config, claim = build.prepare(_config(), None)
  assert claim is None  # no workdir: nothing claimed
  data = build.build_data(config)
  return config, data, build.build_run(config, data=data)


def test_prepare_refuses_a_bad_config_before_touching_the_workdir(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(config_lib.ConfigError, match="local.epochs"):
    build.prepare(_config(local__epochs=0), str(workdir))
  assert not workdir.exists()


def test_prepare_claims_the_workdir_once_and_abandon_leaves_nothing_it_made(tmp_path):
  workdir = str(tmp_path / "run")
  config, claim = build.prepare(_config(), workdir)
  assert claim.created and os.listdir(workdir) == [".lock"]
  assert config.data.fingerprint is None  # (named data: no content fingerprint)
  with pytest.raises(config_lib.ConfigError, match="is in use by another run"):
    build.prepare(_config(), workdir)
  claim.abandon()
  assert not os.path.exists(workdir)
  os.makedirs(workdir)
  _, claim = build.prepare(_config(), workdir)  # a directory the user made stays, its lock file too
  assert not claim.created
  claim.abandon()
  assert os.listdir(workdir) == [".lock"]
  build.prepare(_config(), workdir)[1].abandon()  # released: claimed again


def test_build_data_places_every_training_sample_with_one_client(built):
  _, (dataset, fed), _ = built
  assert fed.num_clients == NUM_CLIENTS and fed.num_classes == dataset.num_classes == 10
  table = np.asarray(fed.client_indices)
  train = [table[i, :fed.client_sizes[i]] for i in range(NUM_CLIENTS)]
  test = [np.asarray(t) for t in fed.client_test_indices]
  everything = np.sort(np.concatenate(train + test))
  np.testing.assert_array_equal(everything, np.arange(len(dataset.y_train)))  # each sample once, none left out
  for i in range(NUM_CLIENTS):  # the local test split: round(0.2 n_i), at least 1, leaving at least 1 to train
    n = len(train[i]) + len(test[i])
    assert len(test[i]) == min(max(round(TEST_FRACTION * n), 1), n - 1)
  np.testing.assert_array_equal(np.asarray(fed.y_train), dataset.y_train)
  np.testing.assert_array_equal(np.asarray(fed.y_test), dataset.y_test)


def test_build_data_refuses_more_clients_than_training_samples():
  config, _ = build.prepare(small_config("fedbuff", partition__num_clients=4_600), None)  # mnist_5k: 4,500
  with pytest.raises(config_lib.ConfigError, match="partition.num_clients"):
    build.build_data(config)


def test_sample_split_draws_distinct_rows_in_their_order_by_purpose():
  n = 50
  x = np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1)  # each image holds its own index
  dataset = Dataset("numbered", x, (np.arange(n) % 3).astype(np.int32), x[:20] + 1000, np.zeros(20, np.int32), 3)
  xs, ys = build.sample_split(dataset, 0, "train", 8, "calibration")
  rows = np.asarray(xs).ravel().astype(int)
  assert len(set(rows)) == 8 and list(rows) == sorted(rows) and rows.min() >= 0 and rows.max() < n
  np.testing.assert_array_equal(np.asarray(ys), rows % 3)  # each label stays with its image
  again, _ = build.sample_split(dataset, 0, "train", 8, "calibration")
  other, _ = build.sample_split(dataset, 0, "train", 8, "alignment")
  np.testing.assert_array_equal(np.asarray(again), np.asarray(xs))
  assert not np.array_equal(np.asarray(other), np.asarray(xs))  # another purpose, another draw
  test_rows, _ = build.sample_split(dataset, 0, "test", 20, "calibration")
  np.testing.assert_array_equal(np.asarray(test_rows).ravel(), np.arange(20) + 1000)  # the whole test split


def test_the_strategy_context_describes_the_run(built):
  config, (dataset, fed), run = built
  ctx = run.strategy.ctx
  assert ctx.num_clients == NUM_CLIENTS and ctx.concurrency == int(NUM_CLIENTS * CONCURRENCY) == 5
  np.testing.assert_array_equal(ctx.client_sizes, fed.client_sizes)
  assert ctx.num_classes == 10 and ctx.input_shape == (28, 28, 1) and ctx.seed == config.seed
  assert ctx.split_sizes == {"train": len(dataset.y_train), "test": len(dataset.y_test)} == {"train": 4_500,
                                                                                                "test": 500}
  x, y = ctx.sample("test", 4, "probe")
  want_x, want_y = build.sample_split(dataset, config.seed, "test", 4, "probe")
  np.testing.assert_array_equal(np.asarray(x), np.asarray(want_x))
  np.testing.assert_array_equal(np.asarray(y), np.asarray(want_y))


def test_build_run_starts_from_the_seeded_initial_model(built):
  config, (_, fed), run = built
  assert isinstance(run.strategy, FedBuff) and run.execution == "loop"  # runtime.execution='auto' on CPU
  model = get_model(config.model.name, 10, config.model.init)
  want = model.init(seeding.device_key(config.seed, "init"), jnp.zeros((1, 28, 28, 1), jnp.float32))
  got = run.initial_state.params
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)  # (initializer draws, ~0.05)
    assert a.devices() == {fed.home}  # committed to the server's device
  assert jax.tree.map(lambda p: p.shape, run.strategy.ctx.params_shape) == jax.tree.map(lambda p: p.shape, want)
  metrics = run.evaluate(got)
  assert 0.0 <= metrics["test_accuracy"] <= 1.0 and round(metrics["test_accuracy"] * 500) == metrics["test_accuracy"] * 500
  assert run.personal_evaluate is not None  # data.client_test_fraction > 0
