"""Sweeps: one config describes a grid of full run configs; run it locally or on Ray, resumably. Split by job:

- `grid`: the sweep config and its members (`axis`, `expand`, `run_order`): what `configs/` and `fedpsa_lab`
  import, without JAX;
- `members`: the sweep directory (`member_dir`, sweep.json, the lock) and one member's run (`run_member`, which
  skips a member already done, `is_done`);
- `records`: the finished members' records kept in a directory of their own (`--records`);
- `loop`: the member loop both executors share (`collect`) and the local executor (`run_local`);
- `ray_executor`: each member a Ray task (`run_ray`, `RayResources`), with `ray_logs` sending Ray's own output to
  SWEEP_DIR/ray.log.

`run` runs a sweep with the executor named. Expanding a sweep imports no JAX by itself; validating its members
loads the strategies (which do), running one loads the simulator.
"""

from __future__ import annotations

from typing import Callable

import ml_collections

from fedpsa_jax.errors import ConfigError
from fedpsa_jax.sweep.grid import MAX_MEMBERS, MAX_SEEDS, Axis, Member, axis, expand, is_sweep_config, member_name, \
    run_order
from fedpsa_jax.sweep.loop import Completion, check_dirs, collect, run_local
from fedpsa_jax.sweep.members import (LOCK_FILE, RUNS_DIR, SWEEP_FILE, SWEEP_WRITES, is_done, locked, member_dir,
                                      read_sweep_json, run_member, write_sweep_json)
from fedpsa_jax.sweep.ray_executor import (DEFAULT_GPU_SHARE, DEPRECATED_MEMORY_FRACTION, GPU_MEMORY_OF_SHARE,
                                           MEMBER_RETRIES, MEMORY_FRACTION, RAY_LOG, STOP_SECONDS, MemberLost,
                                           RayResources, apply_member_env, member_env, run_ray, run_remote_member,
                                           unplaceable)
from fedpsa_jax.sweep.records import (COMPRESSED_FILES, FINISHED, RECORD_FILES, RECORDS_WRITES, check_records_dir,
                                      compress_records, restore_records, save_record)

EXECUTORS = ("local", "ray")

__all__ = ["Axis", "COMPRESSED_FILES", "Completion", "DEFAULT_GPU_SHARE", "DEPRECATED_MEMORY_FRACTION", "EXECUTORS",
           "FINISHED", "GPU_MEMORY_OF_SHARE", "LOCK_FILE", "MAX_MEMBERS", "MAX_SEEDS", "MEMBER_RETRIES",
           "MEMORY_FRACTION", "Member", "MemberLost", "RAY_LOG", "RECORDS_WRITES", "RECORD_FILES", "RUNS_DIR",
           "RayResources", "STOP_SECONDS", "SWEEP_FILE",
           "SWEEP_WRITES", "apply_member_env", "axis", "check_dirs", "check_records_dir", "collect",
           "compress_records", "expand", "is_done", "is_sweep_config", "locked", "member_dir", "member_env",
           "member_name", "read_sweep_json", "restore_records", "run", "run_local", "run_member", "run_order",
           "run_ray", "run_remote_member", "save_record", "unplaceable", "write_sweep_json"]


def run(sweep: ml_collections.ConfigDict, sweep_dir: str, executor: str = "local", address: str | None = None,
        log: Callable[[str], None] = print, compilation_cache: str | None = None,
        records_dir: str | None = None, resources: RayResources = RayResources()) -> dict[str, dict]:
  """Runs a sweep with the named executor ('local' or 'ray'); {member name: summary}. `records_dir`: where
  the finished members' records are kept as well (`fedpsa_jax.sweep.records`); None: nowhere else. `resources`:
  what each member's Ray task asks for (Ray only)."""
  if executor not in EXECUTORS:
    raise ConfigError(f"--executor={executor!r} is invalid; allowed: {', '.join(EXECUTORS)}")
  if executor == "ray":
    return run_ray(sweep, sweep_dir, address, resources, log=log, compilation_cache=compilation_cache,
                   records_dir=records_dir)
  return run_local(sweep, sweep_dir, log=log, compilation_cache=compilation_cache, records_dir=records_dir)
