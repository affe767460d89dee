"""memory.py: freed heap pages go back to the operating system, after compiles and at evaluations."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from fedpsa_jax import memory
from fedpsa_jax.cli import host_devices
from fedpsa_jax.sim import runner
from helpers import small_config


def _rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc (Linux)")
def test_trim_returns_freed_pages_where_glibc_can():
  if memory._MALLOC_TRIM is None:  # not glibc: nothing to call, and it says so
    assert memory.trim_heap() is False
    return
  # ~120 MB in 2 KiB blocks (malloc's heap, not mmap), all freed but the last, which pins the heap's top:
  # malloc keeps the freed pages mapped until trimmed.
  blocks = [bytes(2048) for _ in range(60_000)]
  last = blocks[-1]
  del blocks
  before = _rss_bytes()
  assert memory.trim_heap() is True
  assert before - _rss_bytes() > 60 * 2**20
  del last


@pytest.mark.slow
def test_the_run_trims_after_each_compile_and_each_evaluation(monkeypatch):
  calls = []
  monkeypatch.setattr(memory, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
  monkeypatch.setattr(memory, "_open_trimmers", [0])  # (runs other tests left open would trim too)
  # two open runs: still one trim per compile
  other = runner.Simulation(small_config("fedbuff", days=0.01, runtime__trim_heap=True))
  sim = runner.Simulation(small_config("fedbuff", days=0.01, runtime__trim_heap=True))
  x = jax.block_until_ready(jnp.arange(7.0))
  calls.clear()
  evaluations = len(sim.history)
  jax.jit(lambda x: x * 3 + 1)(x)  # a compile no earlier test made: one trim
  assert len(calls) == 1
  sim.run_until(0.01)
  assert len(calls) >= len(sim.history) - evaluations > 0
  sim.close()
  other.close()
  calls.clear()
  jax.jit(lambda x: x * 5 + 2)(x)  # closed runs no longer trim
  assert calls == []


def _trims_of_a_run(monkeypatch, **fields) -> tuple[int, int]:
  """(trims after a compile made while the run is open, trims during its rounds and evaluations, compiles
  during them)."""
  calls = []
  monkeypatch.setattr(memory, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
  monkeypatch.setattr(memory, "_open_trimmers", [0])
  sim = runner.Simulation(small_config("fedbuff", days=0.01, eval__every_days=0.002, **fields))
  sim.trimmer.periodic.every_seconds = 0.0  # (would trim at every round if it were on)
  x = jax.block_until_ready(jnp.arange(5.0 + len(fields)))
  calls.clear()
  jax.jit(lambda x: x * 7 - 3)(x)  # a compile no earlier test made
  after_compile, compiles = len(calls), sim.compiles.count
  sim.run_until(0.01)
  assert len(sim.history) > 2 and sim.loop.round > 2  # evaluations and rounds happened
  sim.close()
  return after_compile, len(calls) - after_compile, sim.compiles.count - compiles


@pytest.mark.slow
def test_by_default_the_run_trims_after_compiles_only(monkeypatch):
  after_compile, in_rounds, compiles = _trims_of_a_run(monkeypatch)
  assert after_compile == 1
  assert in_rounds == compiles  # one per compile in the rounds, none per round or evaluation


def test_periodic_trim_trims_only_when_its_period_passed(monkeypatch):
  calls = []
  monkeypatch.setattr(memory, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
  never = memory.PeriodicTrim(every_seconds=3600.0)
  for _ in range(100):
    never.maybe()
  assert calls == []
  always = memory.PeriodicTrim(every_seconds=0.0)
  for _ in range(5):
    always.maybe()
  assert len(calls) == 5


_ORBAX_PROBE = """
import sys
from fedpsa_jax.sim import runner
from helpers import small_config
config = small_config("fedbuff", days=0.01)
config.checkpoint.every_days = 0.0  # at the end only
sim = runner.Simulation(config, sys.argv[1])
sim.run_until(0.01)
print("before_end", "orbax.checkpoint" in sys.modules)
sim.run()
print("after_end", "orbax.checkpoint" in sys.modules, sim.recorder.checkpoints.steps())
"""


@pytest.mark.slow
def test_orbax_is_imported_at_the_first_checkpoint_not_before(tmp_path):
  # (a fresh process: this one imported orbax long ago). orbax with tensorstore is ~25-50 MB of resident
  # memory that a run would otherwise hold from its first step.
  import subprocess
  import sys

  env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, "-c", _ORBAX_PROBE, str(tmp_path / "run")], env=env, capture_output=True,
                       text=True, check=True).stdout.split("\n")
  assert "before_end False" in out
  after = next(line for line in out if line.startswith("after_end"))
  assert after.startswith("after_end True [") and after != "after_end True []"


# --- --host_devices (cli.host_devices), and benchmarks/peak_memory.py --allocator -----------------------------

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peak_memory_benchmark():
  spec = importlib.util.spec_from_file_location("peak_memory_benchmark", os.path.join(_ROOT, "benchmarks",
                                                                                       "peak_memory.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_memory_benchmark_preloads_the_allocator_it_is_asked_for():
  """launch.py leaves the allocator to whoever starts it; the benchmark preloads it into its runs."""
  plan = _peak_memory_benchmark().allocator_environment
  env = plan("auto", {"PATH": "/bin"}, "libtcmalloc_minimal.so.4")  # found
  assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4" and env["PATH"] == "/bin"
  assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 2**40
  assert plan("tcmalloc", {"LD_PRELOAD": "/x/a.so"}, "/y/t.so")["LD_PRELOAD"] == "/x/a.so /y/t.so"  # (kept)
  assert "LD_PRELOAD" not in plan("auto", {}, None)  # not found: glibc's malloc
  assert plan("system", {"LD_PRELOAD": "/x/a.so /opt/libtcmalloc.so"}, "t.so")["LD_PRELOAD"] == "/x/a.so"
  assert plan("auto", {"LD_PRELOAD": "/opt/libtcmalloc.so"}, "/y/t.so")["LD_PRELOAD"] == "/y/t.so"  # (once)
  with pytest.raises(SystemExit, match="libtcmalloc-minimal4"):
    plan("tcmalloc", {}, None)


def test_launch_makes_two_host_devices_by_default_and_what_it_is_told(monkeypatch):
  """Two host devices unless told otherwise (one per core of a 2-core machine: docs/performance.md, "Host
  devices"), and an XLA_FLAGS that already sets the count wins."""
  force = host_devices.force_host_devices
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
  assert force(["launch.py"]) == 2
  assert os.environ["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=2"
  monkeypatch.delenv("XLA_FLAGS")
  assert force(["launch.py", "--host_devices=3"]) == 3
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
  force(["launch.py", "--host_devices=2"])  # (the count set above stays)
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
  monkeypatch.delenv("XLA_FLAGS")
  assert force(["launch.py", "--host_devices=1"]) == 1 and "XLA_FLAGS" not in os.environ


def test_what_launch_imports_before_setting_xla_flags_imports_no_jax():
  """XLA reads XLA_FLAGS once, when JAX starts: the modules launch.py and `fedpsa-jax` (and the simulator, for
  signals) import before they set them must not start JAX."""
  probe = ("import sys\nimport fedpsa_lab.launch, fedpsa_jax.cli.host_devices, fedpsa_jax.cli, fedpsa_jax.signals\n"
           "print(sorted(m for m in ('jax', 'jaxlib', 'numpy', 'absl', 'ml_collections') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", probe], cwd=_ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
