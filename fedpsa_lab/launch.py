"""The command line: `fedpsa-jax` (the package's console script) and `python launch.py`, one `main`.

The command joins the two packages, which is why it lives in the analysis package, the one that may import
both (docs/architecture.md, "Two packages"): it defines the flags and makes one call into the simulator
(`fedpsa_jax.cli.modes.main`), handing it the analysis' modes (`fedpsa_lab.modes`). Importing this module
loads only the standard library and the simulator's stdlib-only start-up modules: `main` sets XLA_FLAGS
(`--host_devices`) before JAX is imported, and defines the flags when it runs, not on import. `USAGE` is what
`--help` prints above the flags.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from fedpsa_jax import cli, signals
from fedpsa_jax.cli import host_devices

USAGE = """fedpsa-jax --config=FILE[:arg] [--config.field=value ...] [--mode=MODE] [--workdir=DIR]
(from a clone: python launch.py ...)

--config is a config file from the working directory, else a config shipped with the package by name
(default, paper/table1:smoke, or configs/paper/table1.py as typed in the repository's root), so both
commands work from any directory; without --config, configs/default.py.

Modes (fedpsa_jax/cli/modes.py; report: fedpsa_lab/modes.py):
  train (default)  one run into --workdir (default runs/<config>[-<arg>]-<time>); rerunning into the same
                   workdir, or --resume, continues it from its last complete checkpoint
  profile          compiled cost and time of each jitted piece: a table and WORKDIR/profile.json
  sweep            every member of a sweep config (configs/paper/*.py), or of a grid over a run config
                   (--sweep='method=fedbuff,fedpsa seed=0:3'), into WORKDIR/runs/<member>; rerun resumes
  report           the tables and figures of a sweep or run directory, into WORKDIR/report
                   (with --config=SWEEP_CONFIG: drawn with that config's report layout)

Every failure a user can cause ends in one message on stderr, no traceback, and its exit code: 2 bad input
(a flag, a config file or value, the workdir, ...), nothing done; 1 a diverged or failed run; 3 an output
that could not be written (a full disk); 130 / 143 a run stopped by SIGINT / SIGTERM (status `interrupted`,
resumable). docs/runs.md is the reference.
"""


def main() -> None:
  """Runs the command line on sys.argv and exits with its code (what `fedpsa-jax` and launch.py call)."""
  signals.exit_while_starting()  # a Ctrl-C while the libraries load: one line, not the traceback of an import
  cli.skip_final_collections()  # (the exit's collections over JAX's objects took ~0.45 s of every command)
  host_devices.force_host_devices(sys.argv)  # before JAX is imported: XLA reads XLA_FLAGS once

  from absl import app  # (after XLA_FLAGS is set)

  from fedpsa_jax.cli import flag_parsing

  sys.modules["__main__"].__doc__ = USAGE  # (what absl's --help prints first, for either command)
  app.run(_define_flags(), flags_parser=flag_parsing.parse_flags)


def _define_flags() -> Callable[[list[str]], int]:
  """Defines the command's flags in absl's registry and returns the absl main that reads them."""
  from absl import flags
  from ml_collections import config_flags

  from fedpsa_jax import sweep as sweep_lib
  from fedpsa_jax.cli import flag_parsing, modes
  from fedpsa_lab import modes as lab_modes

  # Locked once built: `--config.field=value` may change a field but not add one (a typo is an error). No
  # default here: ml_collections would load a default config file while the flags are defined, outside any
  # error handling; `parse_flags` adds `--config=DEFAULT_CONFIG` to the command line instead.
  config = config_flags.DEFINE_config_file(
      "config", None, f"Run config file[:arg], or a shipped config by name[:arg] (default, paper/table1:smoke) "
      f"(default: {flag_parsing.DEFAULT_CONFIG}).", lock_config=True)
  workdir = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
  mode = flags.DEFINE_enum("mode", "train", [*modes.MODES, *lab_modes.MODES], "What to do with the config.")
  executor = flags.DEFINE_enum("executor", "local", list(sweep_lib.EXECUTORS),
                               "sweep: run members one after another here (local) or as Ray tasks (ray).")
  compilation_cache = flags.DEFINE_string(
      "compilation_cache", None, "sweep: JAX persistent compilation cache directory shared by the members "
      "(default: WORKDIR/jax_cache; '' turns it off). Members recompile the same functions; the cache spares "
      "them and does not change results. It holds executable code: use only a cache "
      "this user made.")
  records = flags.DEFINE_string(
      "records", None, "sweep: also keep each finished member's record (config, summary, metrics, events; no "
      "checkpoints) in this directory, a sweep directory small enough to commit that --mode=report reads; members "
      "recorded there start done, e.g. on a fresh machine.")
  grid = flags.DEFINE_multi_string(
      "sweep", None, "sweep: a grid over the run config --config, axes separated by spaces (here or in several "
      "--sweep flags): field=v1,v2 or field=a:b (the integers a to b-1), e.g. "
      "--sweep='method=fedbuff,fedpsa seed=0:3 alpha=0.1,1.0' (docs/runs.md, \"Sweeps from the command line\"). "
      "Default workdir: runs/<config>-sweep.")
  ray_address = flags.DEFINE_string("ray_address", None, "sweep --executor=ray: the cluster address for "
                                    "ray.init(address=...) ('auto': this node's cluster); none: a local instance.")
  ray_cpus = flags.DEFINE_integer(
      "ray_cpus_per_member", None, "sweep --executor=ray: CPUs each member's task asks for, and its host devices "
      f"(default {sweep_lib.RayResources.cpus}).")
  ray_gpus = flags.DEFINE_float(
      "ray_gpus_per_member", None, "sweep --executor=ray: each member's share of one GPU, 0 to 1; its JAX may "
      f"allocate {sweep_lib.GPU_MEMORY_OF_SHARE:g} of that share of the device's memory (default "
      f"{sweep_lib.DEFAULT_GPU_SHARE:g} on a cluster with GPUs, 0 without; docs/reproducing.md, \"On a cluster\").")
  flags.DEFINE_integer("host_devices", host_devices.DEFAULT, "CPU only: host devices XLA creates (set before JAX "
                       "starts). 2: both train one client each at a time, the first also serves (one per core of a "
                       "2-core machine); 3 or more: one serves and the others train; 1: a single device.",
                       lower_bound=1)
  flags.register_validator(
      "host_devices", lambda count: count <= host_devices.max_host_devices(),
      message=f"more host devices than this machine can use; allowed: at most {host_devices.max_host_devices()} "
      f"(4 x this machine's {os.cpu_count() or 1} cores: each host device trains one client at a time, so devices "
      "beyond the cores only wait, and XLA builds each of them at start)")
  profile_trace = flags.DEFINE_bool("profile_trace", False, "profile: also write a jax.profiler trace.")
  profile_repeats = flags.DEFINE_integer("profile_repeats", 5, "profile: timed calls per piece (median).")
  profile_pieces = flags.DEFINE_list("profile_pieces", None, "profile: only these pieces, e.g. "
                                     "sgd_step,client_update,server_step (docs/profiling.md); default: every one.")
  verbose = flags.DEFINE_bool("verbose", False, "Also show the libraries' info log lines (absl, JAX, tfds); "
                              "by default the console has the progress bar, warnings and the result lines only.")
  resume = flags.DEFINE_bool(
      "resume", False, "train: continue the run in --workdir (without --workdir: the newest "
      "runs/<config>-* run of this same config) from its last complete checkpoint; an error if there is "
      "none. Rerunning into the same --workdir resumes as well, without this flag.")

  # `--helpshort` lists the main module's key flags, and `python launch.py` / `fedpsa-jax` is the main module.
  for name in ("config", "workdir", "mode", "executor", "compilation_cache", "records", "sweep", "ray_address",
               "ray_cpus_per_member", "ray_gpus_per_member", "host_devices", "profile_trace", "profile_repeats",
               "profile_pieces", "verbose", "resume"):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])

  def run(argv: list[str]) -> int:
    del argv  # (only the program's name: `flag_parsing.parse_flags` refuses any argument that is not a flag)
    options = modes.Options(
        config_path=config_flags.get_config_filename(flags.FLAGS["config"]), mode=mode.value,
        workdir=workdir.value, resume=resume.value, executor=executor.value, ray_address=ray_address.value,
        ray_cpus_per_member=ray_cpus.value, ray_gpus_per_member=ray_gpus.value,
        compilation_cache=compilation_cache.value, records=records.value, sweep=tuple(grid.value or ()),
        profile_trace=profile_trace.value, profile_repeats=profile_repeats.value,
        profile_pieces=None if profile_pieces.value is None else tuple(profile_pieces.value), verbose=verbose.value)
    return modes.main(config.value, options, lab_modes.MODES)

  return run
