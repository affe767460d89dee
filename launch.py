"""Entry point: `python launch.py --config=configs/default.py[:arg] [--config.field=value ...] [--mode=...]`.

Modes (fedpsa_jax/cli/modes.py; report: fedpsa_lab/modes.py):
  train (default)  one run into --workdir (default runs/<config>[-<arg>]-<time>); rerunning into the same
                   workdir, or --resume, continues it from its last complete checkpoint
  profile          compiled cost and time of each jitted piece: a table and WORKDIR/profile.json
  sweep            every member of a sweep config (configs/paper/*.py) into WORKDIR/runs/<member>; rerun resumes
  report           the tables and figures of a sweep or run directory, into WORKDIR/report
                   (with --config=SWEEP_CONFIG: drawn with that config's report layout)

Every failure a user can cause ends in one message on stderr, no traceback, and its exit code
(fedpsa_jax/cli/__init__.py): 2 bad input (a flag, a config file or value, the workdir, ...), nothing done;
1 a diverged or failed run; 3 an output that could not be written (a full disk); 130 / 143 a run stopped
by SIGINT / SIGTERM (status `interrupted`, resumable). This file holds the flags and one call into the
simulator (`fedpsa_jax`), handing it the analysis package's modes (`fedpsa_lab`): the simulator never imports
the analysis.
"""

from __future__ import annotations

import os
import sys

from fedpsa_jax import signals

signals.exit_while_starting()  # a Ctrl-C while the libraries load: one line, not the traceback of an import

from fedpsa_jax import cli  # noqa: E402
from fedpsa_jax.cli import host_devices  # noqa: E402

cli.skip_final_collections()  # (the exit's collections over JAX's objects took ~0.45 s of every command)

host_devices.force_host_devices(sys.argv)  # before JAX is imported: XLA reads XLA_FLAGS once

from absl import app, flags  # noqa: E402  (after XLA_FLAGS is set)
from ml_collections import config_flags  # noqa: E402

from fedpsa_jax import sweep as sweep_lib  # noqa: E402
from fedpsa_jax.cli import flag_parsing, modes  # noqa: E402
from fedpsa_lab import modes as lab_modes  # noqa: E402

# Locked once built: `--config.field=value` may change a field but not add one (a typo is an error). No
# default here: ml_collections would load a default config file while this module is imported, outside
# any error handling; `parse_flags` adds `--config=DEFAULT_CONFIG` to the command line instead.
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, f"Run config file[:arg] (default: {flag_parsing.DEFAULT_CONFIG}).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
_MODE = flags.DEFINE_enum("mode", "train", [*modes.MODES, *lab_modes.MODES], "What to do with the config.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", list(sweep_lib.EXECUTORS),
                              "sweep: run members one after another here (local) or as Ray tasks (ray).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", None, "sweep: JAX persistent compilation cache directory shared by the members "
    "(default: WORKDIR/jax_cache; '' turns it off). Members recompile the same functions; the cache spares "
    "them and does not change results. It holds executable code: use only a cache "
    "this user made.")
_RECORDS = flags.DEFINE_string(
    "records", None, "sweep: also keep each finished member's record (config, summary, metrics, events; no "
    "checkpoints) in this directory, a sweep directory small enough to commit that --mode=report reads; members "
    "recorded there start done, e.g. on a fresh machine.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "sweep --executor=ray: the cluster address for "
                                   "ray.init(address=...) ('auto': this node's cluster); none: a local instance.")
_RAY_CPUS = flags.DEFINE_integer(
    "ray_cpus_per_member", None, "sweep --executor=ray: CPUs each member's task asks for, and its host devices "
    f"(default {sweep_lib.RayResources.cpus}).")
_RAY_GPUS = flags.DEFINE_float(
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
_PROFILE_TRACE = flags.DEFINE_bool("profile_trace", False, "profile: also write a jax.profiler trace.")
_PROFILE_REPEATS = flags.DEFINE_integer("profile_repeats", 5, "profile: timed calls per piece (median).")
_PROFILE_PIECES = flags.DEFINE_list("profile_pieces", None, "profile: only these pieces, e.g. "
                                    "sgd_step,client_update,server_step (docs/profiling.md); default: every one.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Also show the libraries' info log lines (absl, JAX, tfds); "
                             "by default the console has the progress bar, warnings and the result lines only.")
_RESUME = flags.DEFINE_bool(
    "resume", False, "train: continue the run in --workdir (without --workdir: the newest "
    "runs/<config>-* run of this same config) from its last complete checkpoint; an error if there is "
    "none. Rerunning into the same --workdir resumes as well, without this flag.")


def main(argv: list[str]) -> int:
  del argv  # (only the program's name: `flag_parsing.parse_flags` refuses any argument that is not a flag)
  options = modes.Options(
      config_path=config_flags.get_config_filename(flags.FLAGS["config"]), mode=_MODE.value,
      workdir=_WORKDIR.value, resume=_RESUME.value, executor=_EXECUTOR.value, ray_address=_RAY_ADDRESS.value,
      ray_cpus_per_member=_RAY_CPUS.value, ray_gpus_per_member=_RAY_GPUS.value,
      compilation_cache=_COMPILATION_CACHE.value, records=_RECORDS.value, profile_trace=_PROFILE_TRACE.value,
      profile_repeats=_PROFILE_REPEATS.value,
      profile_pieces=None if _PROFILE_PIECES.value is None else tuple(_PROFILE_PIECES.value), verbose=_VERBOSE.value)
  return modes.main(_CONFIG.value, options, lab_modes.MODES)


if __name__ == "__main__":
  app.run(main, flags_parser=flag_parsing.parse_flags)
