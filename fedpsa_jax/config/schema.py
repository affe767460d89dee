"""Every field of the run config with its meaning and default: the one place where fields are defined.

Config files under `configs/` start from `base_config()` and change values. The sections:
- the research sections (`data`, `partition`, `model`, `local`, `sim`, `eval`, `output`, `checkpoint` and the
  top-level `method`, `seed`, `stop_on_nan`): what the run computes;
- one section per registered strategy (`config.<method>`, from its `default_config()`), so a new algorithm
  brings its hyperparameters with it;
- `runtime`: how the run executes (backend, loop form, memory, timing, the console and
  TensorBoard). No field of it changes a result, so it is never part of a run's identity
  (`fedpsa_jax/run_identity.py`): a run may continue, and a sweep member counts as done, under other runtime
  settings. What each knob buys, measured, is in docs/performance.md.
"""

from __future__ import annotations

import ml_collections

UNITS_PER_DAY = 86_400  # FLGo's virtual day, in atomic time units
# Virtual times, seeds and response times are int64 on the way through NumPy and JAX (response-time draws,
# `jax.random.key(seed)`); a value beyond it crashes the build or wraps around (a run that never ends):
# INT64_MAX (`fedpsa_jax.validation`, which refuses any config integer beyond it).
# Day counts (`sim.virtual_days`, `*.every_days`) times 86,400 units must stay below INT64_MAX (~1.07e14
# days); a round bound in the messages.
MAX_DAYS = 10**14
# The sections every run shares (top-level fields count as their own name). With `runtime` and the
# strategies' sections they are all of `base_config()`; a test checks that nothing is left out.
SHARED_SECTIONS = ("method", "seed", "stop_on_nan", "data", "partition", "model", "local", "sim", "eval", "output",
                   "checkpoint")
RUNTIME_SECTION = "runtime"


def registered_strategies() -> dict:
  """{name: Strategy class} of every registered strategy.

  Imported when called, not with this module: the strategies import JAX, and the config sits below them
  (a plug-in registry, looked up at the moment a config is built or validated)."""
  from fedpsa_jax import strategies

  strategies.load_all()
  return strategies.registered()


def runtime_config() -> ml_collections.ConfigDict:
  """The `runtime` section: result-neutral knobs (a run's metrics are the same under any of their values, up
  to the float rounding of a different compiled program where a field says so)."""
  c = ml_collections.ConfigDict()
  # How client updates run (fedpsa_jax/sim/executor.py): loop (one jitted update per job, on the client device
  # with the least work), vmap (pending jobs, buckets of similar step counts in one vmapped call), sharded (vmap
  # split over all local devices), auto (loop: the fastest measured on CPU and on one GPU, docs/performance.md).
  c.execution = "auto"
  # A client update's compiled form: unrolled (a host loop over one-step calls; CPU, conv models), rolled (the
  # whole update in one call; GPU, CPU without convolutions), auto (local.resolve_loop). Results agree to float
  # rounding (different programs).
  c.loop = "auto"
  # vmap/sharded: clients in every vmapped call, padded with inert jobs when fewer are pending. One width for all
  # calls (XLA's results change with a batch's size), so a client's result never depends on which clients share
  # its call. 0: the in-flight count rounded up to a power of two (sharded: a multiple of the devices).
  c.vmap_width = 0
  # loop: client updates issued ahead of their arrival, per client device, the next to arrive first; 0: each at
  # its dispatch. An issued update holds its trained parameters until it arrives: fewer ahead, less memory.
  c.jobs_ahead = 2
  # FedPSA's Fisher diagonal (fedpsa_jax/fisher.py, sensitivity.py): factored (exact, no per-sample dense or
  # conv gradients) | per_sample (vmapped per-sample gradients) | auto (factored where the model allows it).
  c.fisher = "auto"
  c.fisher_chunk_size = 8  # per_sample path: samples per vmap(grad) chunk
  # Time client training, client payloads and server steps apart (the summary's *_compute_seconds,
  # client_payload_seconds, train_seconds; the paper's Fig. 5): the host then waits for the devices at every
  # event, losing the overlap of its work with theirs. Off, those fields are null.
  c.phase_timing = False
  c.progress = True  # show a progress bar over virtual days
  # Write each evaluation's metrics and the strategy's diagnostics as TensorBoard scalars in RUN_DIR/tensorboard
  # (fedpsa_jax/tensorboard.py; needs a workdir). A view of metrics.jsonl, rebuilt from it when a run resumes.
  c.tensorboard = False
  # Give the heap's free pages back to the OS at every evaluation and at most once a second of rounds (glibc's
  # malloc_trim; nothing elsewhere), so that peak RSS follows what the run holds: for many runs side by side.
  # Costs speed (the pages come back as page faults). (After XLA compiles the run always trims.)
  c.trim_heap = False
  return c


def base_config() -> ml_collections.ConfigDict:
  """All fields with their defaults (the paper's Sec. 6.1 values where the paper gives one), one section per
  registered strategy (`config.<method>`, from its `default_config()`), and `runtime`."""
  strategies = registered_strategies()
  c = ml_collections.ConfigDict()
  c.method = "fedpsa"  # the strategy: one of fedpsa_jax.strategies.registered()
  c.seed = 0  # the run seed; every random stream is derived from it by purpose (seeding.py)
  c.stop_on_nan = True  # stop the run with status 'diverged' when the model or loss becomes NaN/Inf

  c.data = ml_collections.ConfigDict()
  # The dataset by name: mnist | fashion_mnist | cifar10 | cifar100 (the paper's, from tfds) | any other tfds
  # image-classification dataset prepared in array_record (kmnist, emnist/digits, svhn_cropped, ...) | mnist_5k |
  # synthetic (embedded). None when data.path names it.
  c.data.name = "mnist_5k"
  # Or the dataset by path (with data.name=None): the version folder of a prepared tfds dataset of any name
  # (.../my_dataset/1.0.0), or an .npz with x_train, y_train, x_test, y_test (docs/runs.md). Only says where the
  # data is (a run may continue from a moved copy); data.fingerprint says what it is.
  c.data.path = ml_collections.FieldReference(None, field_type=str)
  # The content fingerprint of data.path (fedpsa_jax/data/fingerprint.py). None: computed when the run starts and
  # recorded in config.json, so a run continues, and a sweep member counts as done, only on the same content.
  # Set (16 hex digits), it pins the config to that content.
  c.data.fingerprint = ml_collections.FieldReference(None, field_type=str)
  c.data.test_split = "holdout"  # holdout: stratified share of the pooled data (the paper); official
  c.data.holdout_fraction = 0.1  # share of each class held out as the test set when test_split=holdout
  # Where tfds' prepared datasets live (None: tfds' default). Only says where the same data is: not identity.
  c.data.data_dir = ml_collections.FieldReference(None, field_type=str)
  # Share of each client's own samples held out as its local test split (personalised evaluation:
  # metrics then carry `personalized_accuracy`); a simple random split per client. 0.0: off.
  c.data.client_test_fraction = 0.0

  c.partition = ml_collections.ConfigDict()
  # dirichlet_flgo (the paper's, via FLGo) | dirichlet | iid | label_groups (CASA's grouped label skew) |
  # labels_per_client (AiFed's k labels per client)
  c.partition.method = "dirichlet_flgo"
  c.partition.alpha = 0.1  # Dirichlet concentration α (smaller: more heterogeneous)
  c.partition.num_clients = 50  # N
  # label_groups only: client share of each group (labels are split in the same shares, disjoint);
  # Dirichlet partition.alpha inside each group. CASA's Appendix A.2.4 default.
  c.partition.group_proportions = (0.2, 0.2, 0.3, 0.3)
  c.partition.min_labels = 2  # labels_per_client: each client holds k labels, k uniform in [min, max]
  c.partition.max_labels = 6  # labels_per_client: the upper bound of k (AiFed: 2-6 on MNIST/FMNIST/CIFAR-10)

  c.model = ml_collections.ConfigDict()
  c.model.name = "mnist_cnn"  # mnist_cnn | linear | cifar_cnn | tiny_mlp | aifed_cnn
  # torch: PyTorch's default layer init, as in the FLGo harness the paper ran (kernels and biases
  # U(±1/√fan_in); the linear model's bias 0) | flax: Flax's defaults (LeCun normal, zero biases)
  c.model.init = "torch"

  c.local = ml_collections.ConfigDict()
  c.local.epochs = 5  # E local epochs, each of ceil(n_i / batch_size) SGD steps
  c.local.batch_size = 64  # B; the last partial batch of an epoch is kept (masked), not dropped
  c.local.lr = 0.01  # initial client learning rate
  c.local.lr_decay = 0.999  # lr_r = lr * lr_decay**r, r the global round at dispatch

  c.sim = ml_collections.ConfigDict()
  c.sim.virtual_days = 10.0  # the virtual-time budget in days (86,400 units each)
  c.sim.concurrency = 0.2  # share of clients in flight at once: C = max(1, int(N * concurrency))
  c.sim.latency = ml_collections.ConfigDict()
  c.sim.latency.distribution = "uniform"  # uniform: integers on [low, high]; long_tail: bounded Pareto
  c.sim.latency.low = 10  # shortest response time (units)
  c.sim.latency.high = 500  # longest response time (units)
  c.sim.latency.shape = 1.0  # long_tail only: Pareto shape a (larger: more mass near `low`)
  c.sim.latency.resample = "fixed"  # fixed: one time per client for the run; per_dispatch: redrawn
  # Slow devices (CASA's setting: 0.3 at 5x): a fixed set of round(slow_fraction * N) clients, drawn with
  # the latency generator, has its response times multiplied by slow_factor. 0.0: none (no extra draw).
  c.sim.latency.slow_fraction = 0.0
  c.sim.latency.slow_factor = 5.0  # the slow clients' response-time multiplier

  c.eval = ml_collections.ConfigDict()
  c.eval.every_days = 0.01  # evaluate the global model every this many virtual days (and at 0, end)
  c.eval.every_round = False  # also evaluate after every round (costly; for fine-grained curves)
  c.eval.batch_size = 1000  # test-set batch size of evaluation
  # Time-to-accuracy: the summary reports the day/time/round/client updates/bytes uploaded of the first
  # evaluation whose test accuracy reaches this value (None if never). 0 disables it.
  c.eval.target_accuracy = 0.0

  c.output = ml_collections.ConfigDict()
  c.output.events = False  # write events.jsonl: one line per received update

  c.checkpoint = ml_collections.ConfigDict()
  # Save a checkpoint (WORKDIR/checkpoints) at the first evaluation at least this many virtual days
  # after the previous one, and always at the end; 0: only at the end. Needs a workdir.
  c.checkpoint.every_days = 0.5
  c.checkpoint.keep = 3  # most recent checkpoints kept; >= 2 leaves a fallback if the newest is corrupt

  for name, cls in sorted(strategies.items()):
    c[name] = cls.default_config()
  c[RUNTIME_SECTION] = runtime_config()
  return c


def eval_every_units(config: ml_collections.ConfigDict) -> int:
  return max(1, int(round(config.eval.every_days * UNITS_PER_DAY)))


def budget_units(config: ml_collections.ConfigDict) -> int:
  return int(round(config.sim.virtual_days * UNITS_PER_DAY))


def concurrency(config: ml_collections.ConfigDict) -> int:
  """C = max(1, int(N * concurrency)), the number of clients in flight."""
  return max(1, int(config.partition.num_clients * config.sim.concurrency))
