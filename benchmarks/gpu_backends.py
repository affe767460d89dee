"""The paper's MNIST and CIFAR-10 members per execution backend, for a GPU: updates/s, wall seconds per virtual day,
peak memory; with `--per_device`, several members at once on one device.

    python benchmarks/gpu_backends.py [--members=mnist,cifar10] [--executions=loop,vmap] [--loops=auto]
                                      [--days=0.05] [--warmup_days=0.01] [--data_dir=DIR] [--small | --nosmall]
                                      [--per_device=1,2,4,8] [--model=NAME]

A member is `configs/paper/experiment.py:method=fedpsa,dataset=<member>` (Sec. 6.1: 50 clients, Dirichlet
α = 0.1, 20% in flight, E = 5, B = 64, FedPSA's defaults; the MNIST CNN and the CIFAR CNN), run for `--days`
virtual days with `runtime.execution` set to each backend (and `runtime.loop` to each of `--loops`: the client
update as one-step calls or one call), one fresh process per row (no jit cache shared,
peak memory per row). Figures are taken after `--warmup_days`, compile time excluded:
- updates/s: client updates received in the window per second of wall time;
- s/day: wall seconds per virtual day (the paper's budget is 10 days);
- peak memory: the device's `peak_bytes_in_use` (`Device.memory_stats()`, GPUs and TPUs; the largest over the
  local devices), or the process's peak RSS where the device keeps no statistics (a CPU); the column says which.

Data: the tfds dataset from `--data_dir` (tfds' default without it). When it is absent a stand-in of the same
shape runs, and the `data` column says so: for MNIST the embedded `mnist_5k` (5,000 real MNIST images: the same
model and step cost, a tenth of the samples per client, so each update is ~10x shorter); for CIFAR-10 random
images of its shape and size (60,000 of 32x32x3, 10 balanced classes, the same 10% holdout): a step costs the
same on noise, so the speed figures hold, and the accuracy is chance.

`--per_device=N1,N2,...`: for each member and backend, N members (the same run) at once on one device, each a
process of its own with the environment a Ray member with a 1/N share of a GPU gets (`sweep.member_env`: no
preallocation, JAX's memory capped to 0.9/N of the device). The members wait for each other after the warm-up, so
their windows start together; one row per N: the aggregate client updates/s (the sum of the members' updates/s,
each over its own window without compile time, as in the backends' table), its ratio to N = 1's, each member's
mean updates/s and the largest member's peak device memory. `--model` replaces the paper's model (the CPU test's
`tiny_mlp`).

`--small` (the default when JAX's backend is the CPU): the same members at a size a CPU runs in minutes, always
on the stand-ins (10 clients, half in flight, one local epoch, 2,000 CIFAR-shaped images, 0.01 days after 0.002),
so that the script stays tested (tests/test_gpu_backends.py). Its figures say nothing about a GPU.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable
from unittest import mock

import ml_collections
from absl import app, flags

if TYPE_CHECKING:
  from fedpsa_jax.data.sources import Dataset
  from fedpsa_jax.sim.runner import Simulation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags, defined only when run as a script: a test imports this module beside other
  benchmarks into one process, where two modules defining a flag of one name (`days`) is an error."""
  flags.DEFINE_list("members", ["mnist", "cifar10"], "the paper's datasets to run (configs/paper/experiment.py)")
  flags.DEFINE_list("executions", ["loop", "vmap"], "runtime.execution backends")
  flags.DEFINE_list("loops", ["auto"], "runtime.loop of the rows (unrolled, rolled; auto: rolled off the CPU)")
  flags.DEFINE_float("days", None, "virtual days per run (default: 0.05; 0.01 with --small)")
  flags.DEFINE_float("warmup_days", None, "virtual days before the measurement starts (default: 0.01; 0.002 small)")
  flags.DEFINE_string("data_dir", None, "where tfds' prepared datasets are (None: tfds' default)")
  flags.DEFINE_bool("small", None, "the CPU-sized version (default: on when JAX's backend is the CPU)")
  flags.DEFINE_string("child", "", "internal: run one member:execution and print JSON")
  flags.DEFINE_list("per_device", [], "members at once on one device, one row each (e.g. 1,2,4,8); none: the "
                    "backends' table, one member at a time")
  flags.DEFINE_string("model", None, "a model in place of the paper's (e.g. tiny_mlp for a CPU's quick check)")
  flags.DEFINE_string("barrier", "", "internal: DIR:N, wait after the warm-up until N members are ready in DIR")

STAND_IN_SEED = 0
CIFAR10_IMAGES = 60_000  # CIFAR-10's train and test splits together, as the holdout pools them
SMALL_CIFAR10_IMAGES = 2_000
DEFAULT_DAYS = {False: (0.05, 0.01), True: (0.01, 0.002)}  # small -> (days, warmup_days)


def member_config(member: str, small: bool, data_dir: str | None = None) -> ml_collections.ConfigDict:
  """The paper's run of `member` (configs/paper/experiment.py, FedPSA), or its small version."""
  from configs.paper import experiment

  config = experiment.get_config(f"method=fedpsa,dataset={member}")
  config.data.data_dir = data_dir
  config.runtime.progress = False
  if small:
    config.partition.num_clients = 10
    config.sim.concurrency = 0.5
    config.local.epochs = 1
  return config


def cifar10_stand_in(num_images: int, holdout_fraction: float, seed: int = STAND_IN_SEED) -> Dataset:
  """Random normalised images of CIFAR-10's shape, 10 balanced classes, split like the real one (`Dataset`)."""
  import numpy as np

  from fedpsa_jax.data import sources

  rng = np.random.default_rng(seed)
  y = rng.permutation(np.arange(num_images) % 10).astype(np.int32)
  x = rng.standard_normal((num_images, 32, 32, 3), dtype=np.float32)
  train, test = sources.stratified_holdout(y, holdout_fraction, rng)
  return sources.Dataset("cifar10", x[train], y[train], x[test], y[test], num_classes=10)


def simulation(config: ml_collections.ConfigDict, small: bool) -> tuple[Simulation, str]:
  """(Simulation, what data it runs on): the configured tfds data when it is there, else the stand-in."""
  from fedpsa_jax.data import sources
  from fedpsa_jax.sim import build, runner

  name = config.data.name
  if not small:
    try:
      return runner.Simulation(config), f"{name} (tfds)"
    except sources.DatasetNotFoundError:
      pass
  if name == "mnist":
    config.data.name = "mnist_5k"
    return runner.Simulation(config), "mnist_5k stand-in"
  images = SMALL_CIFAR10_IMAGES if small else CIFAR10_IMAGES
  dataset = cifar10_stand_in(images, config.data.holdout_fraction)
  with mock.patch.object(build, "load_dataset", lambda *args, **kwargs: dataset):
    return runner.Simulation(config), f"random {name}-shaped stand-in ({images} images)"


def peak_memory() -> tuple[int, str]:
  """(bytes, 'device' or 'RSS'): the devices' peak use where they keep statistics, else this process's peak RSS."""
  import jax

  stats = [d.memory_stats() for d in jax.local_devices()]
  if all(s and "peak_bytes_in_use" in s for s in stats):
    return max(s["peak_bytes_in_use"] for s in stats), "device"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "RSS"  # (Linux counts kilobytes)


def wait_for_each_other(directory: str, count: int, timeout: float = 900.0) -> None:
  """Marks this process ready in `directory` and returns once `count` processes are (a barrier across processes)."""
  open(os.path.join(directory, f"ready-{os.getpid()}"), "w").close()
  deadline = time.monotonic() + timeout
  while sum(name.startswith("ready-") for name in os.listdir(directory)) < count:
    if time.monotonic() > deadline:
      raise TimeoutError(f"fewer than {count} members ready in {directory} after {timeout} s")
    time.sleep(0.05)


def measure(config: ml_collections.ConfigDict, warmup_days: float, small: bool,
            barrier: Callable[[], None] = lambda: None) -> dict[str, Any]:
  """One run of `config` (its `runtime.execution` and `sim.virtual_days`), measured after `warmup_days` (and after
  `barrier` returns); `warmed` (the warm-up's end) and `window` (the measured span) in seconds since the epoch."""
  import jax

  member = config.data.name
  sim, data = simulation(config, small)
  sim.run_until(warmup_days)
  warmed = time.time()
  barrier()
  start, updates, compile_seconds = time.perf_counter(), sim.loop.client_updates, sim.compiles.seconds
  epoch_start = time.time()
  summary = sim.finish()
  window = (epoch_start, time.time())
  wall = time.perf_counter() - start - (sim.compiles.seconds - compile_seconds)
  updates = summary["client_updates"] - updates
  memory, memory_source = peak_memory()
  window_days = config.sim.virtual_days - warmup_days
  return {"member": member, "data": data, "execution": summary["execution"], "loop": sim.executor.trainer.loop,
          "device": jax.local_devices()[0].device_kind, "updates": updates, "window_days": window_days,
          "updates_per_s": updates / wall, "seconds_per_day": wall / window_days, "peak_bytes": memory,
          "memory_source": memory_source, "compile_seconds": summary["compile_seconds"], "rounds": summary["rounds"],
          "final_accuracy": summary["final_test_accuracy"], "warmed": warmed, "window": window,
          "memory_fraction": os.environ.get("XLA_CLIENT_MEM_FRACTION")}


def child_argv(member: str, execution: str, loop: str, small: bool, days: float, warmup_days: float,
               data_dir: str | None = None, model: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
  """The command line of one member's process (`--child`)."""
  return [sys.executable, os.path.abspath(__file__), f"--child={member}:{execution}:{loop}", f"--small={small}",
          f"--days={days}", f"--warmup_days={warmup_days}", *extra] + (
              [f"--data_dir={data_dir}"] if data_dir else []) + ([f"--model={model}"] if model else [])


def _result(out: str, err: str, code: int) -> dict[str, Any]:
  if code:
    raise RuntimeError(err[-3000:])
  return json.loads(out.strip().splitlines()[-1])


def run_child(member: str, execution: str, loop: str, small: bool, days: float, warmup_days: float) -> dict[str, Any]:
  out = subprocess.run(child_argv(member, execution, loop, small, days, warmup_days, FLAGS.data_dir, FLAGS.model),
                       capture_output=True, text=True, cwd=ROOT)
  return _result(out.stdout, out.stderr, out.returncode)


def run_together(count: int, member: str, execution: str, loop: str, small: bool, days: float,
                 warmup_days: float, data_dir: str | None = None, model: str | None = None) -> dict[str, Any]:
  """`count` copies of one member at once on this machine's device, each a process with a 1/count share
  (`sweep.member_env`), measured over a common window: their results and the aggregate row (see the docstring)."""
  from fedpsa_jax import sweep

  env = dict(os.environ)
  sweep.apply_member_env(env, sweep.member_env(1.0 / count))
  with tempfile.TemporaryDirectory(prefix="together-") as ready:
    argv = child_argv(member, execution, loop, small, days, warmup_days, data_dir, model,
                      (f"--barrier={ready}:{count}",))
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
                for _ in range(count)]
    members = [_result(*child.communicate(), child.returncode) for child in children]
  return {**members[0], "count": count, "members": members,
          "updates": sum(m["updates"] for m in members),
          "aggregate_updates_per_s": sum(m["updates_per_s"] for m in members),
          "member_updates_per_s": sum(m["updates_per_s"] for m in members) / count,
          "peak_bytes": max(m["peak_bytes"] for m in members)}


def row(r: dict[str, Any]) -> str:
  return (f"{r['member']:8s} {r['execution']:5s} {r['loop']:8s} {r['updates']:7d} {r['updates_per_s']:8.2f} "
          f"{r['seconds_per_day']:9.1f} {r['peak_bytes'] / 2**30:7.2f} {r['memory_source']:6s} "
          f"{r['compile_seconds']:8.1f} "
          f"{r['final_accuracy']:9.4f}  {r['data']}")


def together_row(r: dict[str, Any], alone: float | None) -> str:
  ratio = f"{r['aggregate_updates_per_s'] / alone:7.2f}x" if alone else f"{'':8s}"
  return (f"{r['member']:8s} {r['execution']:5s} {r['loop']:8s} {r['count']:3d} {r['updates']:7d} "
          f"{r['aggregate_updates_per_s']:9.2f} {ratio} {r['member_updates_per_s']:9.2f} "
          f"{r['peak_bytes'] / 2**30:8.2f} {r['memory_source']:6s} {r['final_accuracy']:9.4f}  {r['data']}")


TOGETHER_HEADER = (f"{'member':8s} {'exec':5s} {'loop':8s} {'N':>3s} {'updates':>7s} {'total/s':>9s} {'vs N=1':>8s} "
                   f"{'member/s':>9s} {'peak GiB':>8s} {'of':6s} {'final acc':>9s}  data")
HEADER = (f"{'member':8s} {'exec':5s} {'loop':8s} {'updates':>7s} {'upd/s':>8s} {'s/day':>9s} {'peak GiB':>7s} "
          f"{'of':6s} {'compile s':>8s} {'final acc':>9s}  data")


def main(argv):
  del argv
  import jax

  small = FLAGS.small if FLAGS.small is not None else jax.default_backend() == "cpu"
  days, warmup_days = (FLAGS.days or DEFAULT_DAYS[small][0]), (FLAGS.warmup_days or DEFAULT_DAYS[small][1])
  if FLAGS.child:
    member, execution, loop = FLAGS.child.split(":")
    config = member_config(member, small, FLAGS.data_dir)
    config.runtime.execution = execution
    config.runtime.loop = loop
    config.sim.virtual_days = days
    if FLAGS.model:
      config.model.name = FLAGS.model
    barrier = FLAGS.barrier.rsplit(":", 1) if FLAGS.barrier else None
    print(json.dumps(measure(config, warmup_days, small, (lambda: wait_for_each_other(barrier[0], int(barrier[1])))
                             if barrier else (lambda: None))))
    return
  print(f"FedPSA, paper members{' (small version)' if small else ''}, {days} virtual days measured after "
        f"{warmup_days}, on {jax.local_devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
  if FLAGS.per_device:
    print(f"several members at once on one device{f', model {FLAGS.model}' if FLAGS.model else ''}")
    print(TOGETHER_HEADER)
    for member in FLAGS.members:
      for execution in FLAGS.executions:
        for loop in FLAGS.loops:
          alone = None
          for count in map(int, FLAGS.per_device):
            r = run_together(count, member, execution, loop, small, days, warmup_days, FLAGS.data_dir, FLAGS.model)
            alone = r["aggregate_updates_per_s"] if count == 1 else alone
            print(together_row(r, alone), flush=True)
    return
  print(HEADER)
  for member in FLAGS.members:
    for execution in FLAGS.executions:
      for loop in FLAGS.loops:
        print(row(run_child(member, execution, loop, small, days, warmup_days)), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
