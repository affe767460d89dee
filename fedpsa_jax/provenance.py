"""Where a run's numbers came from: the code's commit, the data's fingerprint and the machine.

Every summary.json carries `provenance` (`of_run`), so a report that pools runs can say which code, data and
machines produced its table (`report_lib.provenance_section`), and a reader can tell a sweep run from a fixed
commit from one whose members straddle an edit.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from typing import Any

import numpy as np

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _git(*args: str) -> str | None:
  """`git -C <the package's folder> args...`'s output; None outside a git checkout or without git."""
  try:
    done = subprocess.run(["git", "-C", PACKAGE_DIR, *args], capture_output=True, text=True, timeout=10,
                          check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout.strip() if done.returncode == 0 else None


def code_version() -> dict[str, Any]:
  """{'commit': the HEAD commit of the checkout the package is imported from (None if it is not one),
  'dirty': whether tracked files differ from it (None if unknown)}."""
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
  return {"commit": commit, "dirty": None if status is None else bool(status)}


def data_fingerprint(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> str:
  """A digest of the examples the run used (images as normalised, with their labels), independent of their
  order and of how they are split into train and test: so every seed of a dataset whose test set is a
  seeded holdout (`mnist_5k`) shares one fingerprint, and any changed pixel or label changes it."""
  rows = []
  for x, y in ((x_train, y_train), (x_test, y_test)):
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    labels = np.asarray(y, np.int64)
    rows += [hashlib.blake2b(flat[i].tobytes() + labels[i].tobytes(), digest_size=16).digest()
             for i in range(len(flat))]
  return hashlib.blake2b(b"".join(sorted(rows)), digest_size=16).hexdigest()


def _cpu_model() -> str:
  """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


# The widest vector extension first, by the flag /proc/cpuinfo lists for it (x86 "flags", Arm "Features").
_VECTOR_ISAS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"), ("sve2", "SVE2"),
                ("sve", "SVE"), ("asimd", "NEON"))


def vector_isa(cpuinfo: str = "/proc/cpuinfo") -> str | None:
  """The widest vector instruction set the CPU has (Linux: its /proc/cpuinfo flags), None where unknown.

  XLA:CPU compiles for the host's widest one, and other vector widths sum in other orders: one CPU model name covers
  machines with and without AVX-512, whose runs of one config differ in their last bits and then drift apart."""
  try:
    with open(cpuinfo) as f:
      flags = next((set(line.split(":", 1)[1].split()) for line in f
                    if line.split(":", 1)[0].strip() in ("flags", "Features")), set())
  except OSError:
    return None
  return next((name for flag, name in _VECTOR_ISAS if flag in flags), None)


def ray_node() -> str | None:
  """The id of the Ray node this process runs on when it is a Ray worker (or a driver joined to a cluster), else
  None. Ray is not imported here: a process that has not imported it is no Ray worker."""
  ray = sys.modules.get("ray")
  if ray is None or not ray.is_initialized():
    return None
  return ray.get_runtime_context().get_node_id()


def machine() -> dict[str, Any]:
  """The machine and software a run executed on: CPU, its vector instruction set (`vector_isa`), cores, OS,
  Python, JAX's backend and devices, XLA_FLAGS (`--xla_cpu_max_isa` caps the instruction set), and the versions of
  the libraries that compute results; the host's name and its Ray node (`ray_node`), which tell the nodes of a
  cluster apart."""
  import flax
  import jax
  import jaxlib
  import optax

  devices = jax.devices()
  return {"cpu": _cpu_model(), "vector_isa": vector_isa(), "xla_flags": os.environ.get("XLA_FLAGS"),
          "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
          "backend": jax.default_backend(), "devices": f"{len(devices)} × {devices[0].device_kind}",
          "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__, "optax": optax.__version__,
          "host": platform.node(), "ray_node": ray_node()}


def of_run(dataset: Any) -> dict[str, Any]:
  """`provenance` of summary.json for a run on `dataset` (a `data.Dataset`)."""
  return {"code": code_version(),
          "data": {"name": dataset.name, "fingerprint": data_fingerprint(dataset.x_train, dataset.y_train,
                                                                         dataset.x_test, dataset.y_test)},
          "machine": machine()}


__all__ = ["code_version", "data_fingerprint", "machine", "of_run", "ray_node", "vector_isa"]
