"""One JAX persistent compilation cache for the whole test session, fast compiles, the `slow` marker (which
every test under tests/e2e/ gets without asking).

Most of the suite's time is XLA compiling the same programs again: every test builds a fresh Simulation,
whose jitted closures are new Python objects with the same HLO, in each of the xdist workers and in
every launch.py subprocess. The cache (keyed by HLO, backend, devices and JAX version) holds the compiled
code itself, so results do not change; the compile counter still counts every hit, so the tests that
count compiles see the same numbers. The directory is new for each session and removed after it, unless
FEDPSA_TEST_CACHE names one to keep (`make test-fast`: the edit-test loop then compiles only what changed).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from fedpsa_jax import compilation_cache

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_OWNED = "FEDPSA_TEST_OWNS_JAX_CACHE"  # set on the process that made the directory, which removes it
# A directory kept between sessions (`make test-fast` sets it): the next session reads every program it
# compiles again from there instead of compiling it. Its size is capped (`_KEPT_CACHE_BYTES`, oldest out).
_KEPT_ENV = "FEDPSA_TEST_CACHE"
_KEPT_CACHE_BYTES = 2 * 2**30


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "slow: a test of 2 s or more (whole runs, subprocesses, sweeps, the notebook, CNN-sized "
                          "references): every test under tests/e2e/, and the module tests marked by hand; "
                          "`make test-fast` leaves them out (docs/testing.md)")
  config.addinivalue_line("markers", "ci: a test CI runs (`make test-ci`) and `make test` leaves out: one that needs a "
                          "set-up outside this process tree (a Ray cluster, a wheel installed in a new venv, a Jupyter "
                          "kernel) or repeats a stop-and-resume case at more moments, signals or limits "
                          "(docs/testing.md); also `slow`")
  _fast_compiles()
  compilation_cache.write_whole_entries()  # (the session's workers and launch.py subprocesses share one cache)
  # xdist workers inherit the controller's environment, so only the first process makes the directory;
  # subprocesses (launch.py) inherit it too. A cache set by the user is left as it is.
  if _CACHE_ENV in os.environ:
    return
  kept = os.environ.get(_KEPT_ENV)
  if kept:
    path = os.path.abspath(kept)
    os.makedirs(path, exist_ok=True)
    compilation_cache.repair(path)  # what a Ctrl-C'd session left half-written would warn in every later one
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(_KEPT_CACHE_BYTES)
  else:
    path = tempfile.mkdtemp(prefix="fedpsa-jax-cache-")
  # The parsed embedded MNIST too: parsed once per session, read by every worker and subprocess after that,
  # and kept out of the user's own cache (~/.cache/fedpsa-jax).
  os.environ.setdefault("FEDPSA_JAX_CACHE", os.path.join(path, "data"))
  os.environ.update({_CACHE_ENV: path, **({} if kept else {_OWNED: str(os.getpid())}),
                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # the many small compiles count too
                     "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
  import jax  # in case JAX was imported before this hook: its config reads the environment only once

  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  if kept:
    jax.config.update("jax_compilation_cache_max_size", _KEPT_CACHE_BYTES)


_E2E = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e") + os.sep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  """Marks every test under tests/e2e/ (whole runs), and every `ci` test, `slow`, so that nobody has to remember
  the mark."""
  del config
  for item in items:
    if str(item.path).startswith(_E2E) or item.get_closest_marker("ci"):
      item.add_marker(pytest.mark.slow)


# What `_fast_compiles` adds to XLA_FLAGS, each unless the user's XLA_FLAGS already sets it.
_FAST_COMPILE_FLAGS = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}


def _fast_compiles() -> None:
  """XLA:CPU set to compile fast for the suite (workers and subprocesses inherit it): its LLVM backend at
  optimisation level 0, and its fused loops emitted by the older emitters instead of the MLIR fusion emitters.

  Compiling is most of the suite's time. Level 0 compiles about twice as fast as the default, and the older
  emitters more than halve what is left: a set of the suite's programs (the shuffle, random draws, an SGD
  loop) compiled in 2.4-2.9 s against 5.8-6.2 s with level 0 alone. The programs are the same HLO, with the
  same operations in the same order; only the machine code differs, so a test sees the numerics users get up
  to the rounding differences that tests/numerics.py already allows between CPUs. `make test-avx2` (CI) runs
  the numerics-heavy files with the compiler users get, with FEDPSA_TEST_FULL_OPT=1."""
  if os.environ.get("FEDPSA_TEST_FULL_OPT") == "1":
    return
  flags = os.environ.get("XLA_FLAGS", "")
  added = [f"--{name}={value}" for name, value in _FAST_COMPILE_FLAGS.items() if name not in flags]
  os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()


@pytest.fixture(autouse=True, scope="session")
def _float32_products_on_accelerators():
  """On a GPU or TPU, float32 matrix products and convolutions at float32 precision for the whole suite.

  The tolerances of tests/numerics.py follow float32's rounding; an accelerator's default precision for them
  is TF32 or bf16 passes, 2^13 times or more coarser, which no float32 tolerance fits. Users' runs keep the
  default (docs/runs.md, "Determinism"). On a CPU nothing changes. (Asking for the backend starts JAX: by now
  pytest_configure has set the XLA flags it reads.)"""
  import jax

  if jax.default_backend() != "cpu":
    jax.config.update("jax_default_matmul_precision", "highest")
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"  # (launch.py subprocesses)
  yield


def pytest_unconfigure(config: pytest.Config) -> None:
  if os.environ.get(_OWNED) == str(os.getpid()):
    shutil.rmtree(os.environ[_CACHE_ENV], ignore_errors=True)

