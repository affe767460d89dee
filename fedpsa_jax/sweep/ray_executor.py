"""The Ray executor: each member of a sweep a Ray task, in a process of its own, on a cluster.

Each member's task asks for `RayResources` (CPUs, a share of one GPU with JAX's memory capped to it) and runs
again, from its checkpoint, when its node is lost (docs/reproducing.md, "On a cluster"). The tasks run the same
`run_member` as the local executor, into the shared sweep directory, and hand their outcomes to the same loop
(`fedpsa_jax.sweep.loop.collect`). What the executor guarantees besides (docs/runs.md, "Sweeps on Ray"): a sweep
whose members no node can take is refused before any member runs (`unplaceable`); SIGINT and SIGTERM stop it as
they stop a local sweep, its running members stopped as interrupted runs (`_stop_members`); Ray's own output goes
to SWEEP_DIR/ray.log (`ray_logs`); a member whose process or node is lost on every try is one failed member
(`MemberLost`), and the sweep goes on. `ray` is imported when a sweep runs on it, never on import.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Sequence

import ml_collections

from fedpsa_jax import io, signals
from fedpsa_jax.errors import ConfigError
from fedpsa_jax.sweep import members as members_lib
from fedpsa_jax.sweep import ray_logs, records
from fedpsa_jax.sweep.grid import Member, expand, run_order
from fedpsa_jax.sweep.loop import Completion, check_dirs, collect
from fedpsa_jax.sweep.members import locked, member_dir, write_sweep_json

# A member's share of one GPU when none is asked for (`RayResources.gpus` None) on a cluster with GPUs: four members
# per device, a starting value rather than a measured optimum (docs/performance.md, "Several members per device",
# says how to measure one's own card).
DEFAULT_GPU_SHARE = 0.25
# The part of its share of the device's memory a member's JAX may allocate: the rest is the process's own CUDA
# context and the libraries' workspaces, which JAX's allocator does not count.
GPU_MEMORY_OF_SHARE = 0.9
# How often Ray runs a member again whose process or node was lost (the task's `max_retries`): it continues
# from the member's last checkpoint in the shared sweep directory.
MEMBER_RETRIES = 3
# How long an interrupted sweep waits for its running members to stop as an interrupted run stops (a member is
# between two steps within moments, unless XLA is compiling) before Ray kills their processes: batch schedulers
# kill a job some 30 s after their SIGTERM.
STOP_SECONDS = 20
RAY_LOG = ray_logs.RAY_LOG


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


def unplaceable(resources: RayResources, share: float, cluster: Mapping[str, float],
                nodes: Sequence[Mapping[str, float]]) -> str | None:
  """The line that refuses a sweep whose members no node of the cluster can take, which Ray would keep waiting for
  ever: each asks for more CPUs, or a larger GPU share, than the largest node has. `share`: each member's GPU share
  (`RayResources.gpu_share`); `cluster`: `ray.cluster_resources()`; `nodes`: each live node's resources. None when
  a member fits on some node."""
  most = {kind: max([node.get(kind, 0.0) for node in nodes], default=0.0) for kind in ("CPU", "GPU")}
  has = (f"the Ray cluster has {cluster.get('CPU', 0.0):g} CPU(s) and {cluster.get('GPU', 0.0):g} GPU(s) on "
         f"{len(nodes)} node(s), at most {most['CPU']:g} CPU(s) and {most['GPU']:g} GPU(s) on one")
  if share > most["GPU"]:
    return (f"--ray_gpus_per_member={share:g} asks for {share:g} of a GPU for each member, more than any node has "
            f"({has}); allowed: --ray_gpus_per_member=0 (no GPU)"
            + (f" or at most {most['GPU']:g}" if most["GPU"] else "") + ", or a cluster with GPUs")
  if resources.cpus > most["CPU"]:
    return (f"--ray_cpus_per_member={resources.cpus} asks for {resources.cpus} CPU(s) for each member, more than any "
            f"node has ({has}); allowed: "
            + (f"--ray_cpus_per_member={int(most['CPU'])} or fewer, or " if most["CPU"] >= 1 else "")
            + "a cluster with larger nodes")
  return None


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
  joins an already initialised Ray or starts a local instance (a Ray this call joined or started, it leaves at
  its end). The sweep directory must be on storage every node sees (a shared filesystem), and fedpsa_jax
  importable on every node. Each task asks for `resources` and runs in a process of its own; a sweep whose members
  no node can take is refused before any member runs (ConfigError, `unplaceable`). A task whose node is lost runs
  again (MEMBER_RETRIES) and continues from the member's checkpoint; one lost every time fails as `MemberLost`,
  and the sweep goes on. Members that are done are skipped by the task itself, so a resumed sweep costs one short
  task (a process that imports no JAX) per finished member. A failed member, a full disk and `records_dir`: as
  `collect` says (records written here as each task returns, from the shared sweep directory). An interruption
  (KeyboardInterrupt: SIGINT, or SIGTERM under the command line) stops the members running as it stops a local
  run (`_stop_members`), then stops the sweep; rerunning resumes. Ray's own output goes to SWEEP_DIR/ray.log
  (`ray_logs`).
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
  io.refuse_links(sweep_dir, (RAY_LOG,), rewritten=(RAY_LOG,))  # (appended to, by each start of the sweep)
  io.check_entry_kinds(sweep_dir, (RAY_LOG,), (), "--workdir", "a sweep", "a sweep directory")
  with locked(sweep_dir, sweep.name), ray_logs.output_to(os.path.join(sweep_dir, RAY_LOG)):
    joined = _join(ray, address)
    try:
      return _run_ray_members(ray, sweep, members, sweep_dir, resources, log, compilation_cache, records_dir)
    finally:
      if joined:
        ray.shutdown()


def _join(ray: Any, address: str | None) -> bool:
  """Joins the Ray cluster at `address` (None: a local instance) unless this process has joined one already;
  whether it joined. The process keeps its own SIGINT and SIGTERM handlers (`ray.init` installs a SIGTERM handler
  that exits at once); ConfigError naming --ray_address when there is no cluster there."""
  if ray.is_initialized():
    return False
  try:
    with signals.kept_handlers():
      ray.init(address=address, include_dashboard=False, log_to_driver=False)
  except ConnectionError as err:
    raise ConfigError(f"--ray_address={address!r}: no Ray cluster to join there ({_first_line(err)}); allowed: the "
                      "address of a running cluster's head node (`ray start --head` prints it), 'auto' for the "
                      "cluster this node belongs to, or no --ray_address for a local Ray instance") from None
  return True


def _run_ray_members(ray: Any, sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str,
                     resources: RayResources, log: Callable[[str], None], compilation_cache: str | None,
                     records_dir: str | None) -> dict[str, dict]:
  """`run_ray`'s work once the sweep directory is locked and Ray joined."""
  cluster = ray.cluster_resources()
  share = resources.gpu_share(cluster.get("GPU", 0))
  refusal = unplaceable(resources, share, cluster, [node["Resources"] for node in ray.nodes() if node["Alive"]])
  if refusal:
    raise ConfigError(refusal)
  write_sweep_json(sweep, members, sweep_dir)
  records.open_records(sweep, members, sweep_dir, records_dir, log)
  task = ray.remote(num_cpus=resources.cpus, num_gpus=share, max_calls=1, max_retries=MEMBER_RETRIES)(
      run_remote_member)
  sweep_dir = os.path.abspath(sweep_dir)
  cache = os.path.abspath(compilation_cache) if compilation_cache else None
  refs: dict[Any, Member] = {}

  def completions() -> Iterator[Completion]:
    pending = list(refs)
    while pending:
      done, pending = ray.wait(pending, num_returns=1)
      yield refs[done[0]], lambda ref=done[0]: _summary(ray, ref)

  def cancel_running() -> None:  # (on a full disk: the members still running would fail alike)
    for ref in refs:
      ray.cancel(ref)

  try:
    for m in run_order(members):
      ref = task.remote(member_env(share), resources.cpus, io.config_json(m.config), member_dir(sweep_dir, m), cache)
      refs[ref] = m
    log(f"{len(refs)} members submitted, each asking for {resources.cpus} CPU(s)"
        + (f" and {share:g} of a GPU" if share else "") + f"; Ray's own log: {os.path.join(sweep_dir, RAY_LOG)}")
    return collect(members, completions(), sweep_dir, records_dir, log, stop=cancel_running)
  except KeyboardInterrupt:
    _stop_members(ray, list(refs))
    signals.stop_if_signalled()  # (Ray's wait turns the handler's `errors.Interrupted` into a bare KeyboardInterrupt)
    raise


class MemberLost(RuntimeError):
  """Ray lost a member's process or node each time it ran it (its first run and MEMBER_RETRIES more)."""


def _summary(ray: Any, ref: Any) -> dict[str, Any]:
  """A finished task's summary; what its member raised, as the local executor would raise it (not Ray's wrapper,
  whose text holds the worker's traceback); `MemberLost`, in one line, when Ray lost its process or node every
  time it ran it."""
  try:
    return ray.get(ref)
  except ray.exceptions.RayError as err:
    cause = getattr(err, "cause", None)  # (a RayTaskError's: what the member raised)
    if isinstance(err, ray.exceptions.RayTaskError) and isinstance(cause, Exception):
      raise cause from None
    tries = MEMBER_RETRIES + 1
    raise MemberLost(f"Ray lost its process or node ({type(err).__name__}: {_first_line(err)}) and gave up after "
                     f"{tries} {'try' if tries == 1 else 'tries'}; rerun the same command to continue it from its last "
                     f"checkpoint (what Ray saw: {RAY_LOG})") from None


def _first_line(err: BaseException) -> str:
  text = str(err).strip()
  return text.splitlines()[0] if text else type(err).__name__


def _stop_members(ray: Any, refs: list[Any]) -> None:
  """Stops an interrupted sweep's members: those waiting are dropped, those running get a KeyboardInterrupt
  (`ray.cancel`) and stop as an interrupted run does (summary status 'interrupted', resumable from its last
  checkpoint); after STOP_SECONDS, any still running is killed (it resumes from its last checkpoint all the same)."""
  if not refs:
    return
  for ref in refs:
    ray.cancel(ref)
  _, running = ray.wait(refs, num_returns=len(refs), timeout=STOP_SECONDS)
  for ref in running:
    ray.cancel(ref, force=True)
