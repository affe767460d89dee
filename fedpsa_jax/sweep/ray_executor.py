"""The Ray executor: each member of a sweep a Ray task, in a process of its own, on a cluster.

Each member's task asks for `RayResources` (CPUs, a share of one GPU with JAX's memory capped to it) and runs
again, from its checkpoint, when its node is lost (docs/reproducing.md, "On a cluster"). The tasks run the same
`run_member` as the local executor, into the shared sweep directory, and hand their outcomes to the same loop
(`fedpsa_jax.sweep.loop.collect`). `ray` is imported when a sweep runs on it, never on import.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Sequence

import ml_collections

from fedpsa_jax import io
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.sweep import members as members_lib
from fedpsa_jax.sweep import records
from fedpsa_jax.sweep.grid import Member, expand, run_order
from fedpsa_jax.sweep.loop import Completion, check_dirs, collect
from fedpsa_jax.sweep.members import locked, member_dir, write_sweep_json

# A member's share of one GPU when none is asked for (`RayResources.gpus` None) on a cluster with GPUs. Provisional:
# four members per device, until the several-members-per-device measurement (docs/performance.md, "Several
# members per device") has been taken on a GPU.
DEFAULT_GPU_SHARE = 0.25
# The part of its share of the device's memory a member's JAX may allocate: the rest is the process's own CUDA
# context and the libraries' workspaces, which JAX's allocator does not count.
GPU_MEMORY_OF_SHARE = 0.9
# How often Ray runs a member again whose process or node was lost (the task's `max_retries`): it continues
# from the member's last checkpoint in the shared sweep directory.
MEMBER_RETRIES = 3


@dataclasses.dataclass(frozen=True)
class RayResources:
  """What each member's Ray task asks for and runs with (`--ray_cpus_per_member`, `--ray_gpus_per_member`)."""

  cpus: int = 1  # Ray `num_cpus`, and the member's host devices (its client trainers on a CPU; GPUs are unaffected)
  gpus: float | None = None  # the share of one GPU, 0 to 1; None: DEFAULT_GPU_SHARE on a cluster with GPUs, else 0

  def problems(self) -> list[str]:
    """One line per bad field, naming its flag and what is allowed; [] when both are fine."""
    out = []
    if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 1:
      out.append(f"--ray_cpus_per_member={self.cpus!r} is invalid; allowed: an integer >= 1 (the CPUs Ray reserves "
                 "for each member, and its host devices on a CPU)")
    if self.gpus is not None and not (isinstance(self.gpus, (int, float)) and not isinstance(self.gpus, bool)
                                      and 0 <= self.gpus <= 1 and math.isfinite(self.gpus)):
      out.append(f"--ray_gpus_per_member={self.gpus!r} is invalid; allowed: a number from 0 to 1 (each member's "
                 "share of one GPU; 0: no GPU)")
    return out

  def gpu_share(self, cluster_gpus: float) -> float:
    """The share each member asks for on a cluster with `cluster_gpus` GPUs in all."""
    return self.gpus if self.gpus is not None else (DEFAULT_GPU_SHARE if cluster_gpus > 0 else 0.0)


MEMORY_FRACTION = "XLA_CLIENT_MEM_FRACTION"  # jaxlib's cap on its allocator, a fraction of the device's memory
DEPRECATED_MEMORY_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # its old name, refused beside the new one


def member_env(gpu_share: float) -> dict[str, str]:
  """The environment a member's process runs with for its share of a GPU: no preallocation of the whole device,
  and JAX's allocator capped to GPU_MEMORY_OF_SHARE of the share (both read when JAX starts its GPU backend)."""
  if gpu_share <= 0:
    return {}
  return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", MEMORY_FRACTION: f"{GPU_MEMORY_OF_SHARE * gpu_share:.4g}"}


def apply_member_env(environ: MutableMapping[str, str], env: Mapping[str, str]) -> None:
  """Sets `env` (`member_env`) in `environ`; where it caps the memory, a cap under the old name goes (jaxlib
  refuses both names at once, and the share Ray reserved is the one that holds)."""
  environ.update(env)
  if MEMORY_FRACTION in env:
    environ.pop(DEPRECATED_MEMORY_FRACTION, None)


def run_remote_member(env: dict[str, str], host_devices: int, config_json: dict[str, Any], run_dir: str,
                      compilation_cache: str | None) -> dict[str, Any]:
  """A member's Ray task: in a fresh worker process (the task's `max_calls=1`: nothing is carried from one member
  to the next), `env` and the host devices are set before JAX starts, then `run_member`. An XLA_FLAGS that already
  sets the host device count wins."""
  apply_member_env(os.environ, env)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if host_devices > 1 and "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={host_devices}".strip()
  return members_lib.run_member(config_json, run_dir, compilation_cache)


def run_ray(sweep: ml_collections.ConfigDict, sweep_dir: str, address: str | None = None,
            resources: RayResources = RayResources(), log: Callable[[str], None] = print,
            compilation_cache: str | None = None, records_dir: str | None = None) -> dict[str, dict]:
  """Runs every member as a Ray task (`run_remote_member`), submitted seed by seed (`run_order`); {member name:
  summary}, in axis order.

  `address`: the cluster to join (`ray.init(address=...)`; 'auto' for the local node's cluster); None
  joins an already initialised Ray or starts a local instance. The sweep directory must be on storage
  every node sees (a shared filesystem), and fedpsa_jax importable on every node. Each task asks for
  `resources` and runs in a process of its own; a task whose node is lost runs again (MEMBER_RETRIES) and
  continues from the member's checkpoint. Members that are done are skipped by the task itself, so a resumed
  sweep costs one short task (a process that imports no JAX) per finished member. A failed member, a full disk
  and `records_dir`: as `collect` says (records written here as each task returns, from the shared sweep
  directory).
  """
  problems = resources.problems()
  if problems:
    raise ConfigError(problems[0])
  try:
    import ray
  except ImportError as err:
    raise ConfigError("--executor=ray needs the ray package (pip install ray); allowed: --executor=local, "
                                 "or install ray") from err
  members = expand(sweep)  # (every member validated before Ray starts)
  check_dirs(sweep, sweep_dir, records_dir, compilation_cache)
  with locked(sweep_dir, sweep.name):
    return _run_ray_members(ray, sweep, members, sweep_dir, address, resources, log, compilation_cache, records_dir)


def _run_ray_members(ray: Any, sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str,
                     address: str | None, resources: RayResources, log: Callable[[str], None],
                     compilation_cache: str | None, records_dir: str | None) -> dict[str, dict]:
  """`run_ray`'s work once the sweep directory is locked."""
  write_sweep_json(sweep, members, sweep_dir)
  records.open_records(sweep, members, sweep_dir, records_dir, log)
  if not ray.is_initialized():
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
  share = resources.gpu_share(ray.cluster_resources().get("GPU", 0))
  task = ray.remote(num_cpus=resources.cpus, num_gpus=share, max_calls=1, max_retries=MEMBER_RETRIES)(
      run_remote_member)
  sweep_dir = os.path.abspath(sweep_dir)
  cache = os.path.abspath(compilation_cache) if compilation_cache else None
  refs = {task.remote(member_env(share), resources.cpus, io.config_json(m.config), member_dir(sweep_dir, m), cache): m
          for m in run_order(members)}
  log(f"{len(refs)} members submitted, each asking for {resources.cpus} CPU(s)"
      + (f" and {share:g} of a GPU" if share else ""))

  def completions() -> Iterator[Completion]:
    pending = list(refs)
    while pending:
      done, pending = ray.wait(pending, num_returns=1)
      yield refs[done[0]], lambda ref=done[0]: ray.get(ref)  # (a failed task raises; RayTaskError wraps it)

  def cancel_running() -> None:  # (on a full disk: the members still running would fail alike)
    for ref in refs:
      ray.cancel(ref)

  return collect(members, completions(), sweep_dir, records_dir, log, stop=cancel_running)
