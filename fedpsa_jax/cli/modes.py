"""The modes behind launch.py, each a function of the config and the flags' values (`Options`).

train (default): runs the config into `--workdir` (default runs/<config>[-<arg>]-<time>). Rerunning into the
same workdir continues the run from its last complete checkpoint (bitwise the same metrics as an
uninterrupted run); `--resume` does so explicitly, and without `--workdir` finds the newest run of the same
config under runs/ (`run_name.resumable_workdir`).

profile: compiles and measures each jitted piece of the configured run (one SGD step, a client update, the
Fisher diagonal on each path and Eq. 8 at calibration sizes 16/32/128/512, the sketch, evaluation, each
strategy's server step): a table on stdout and WORKDIR/profile.json; `profile_pieces` limits it to the pieces
named; `profile_trace` also writes a jax.profiler trace (TensorBoard / Perfetto) to WORKDIR/trace with one named
slice per piece, and a warning line where JAX's event cap cut one out of it.

sweep: the config is a sweep config (configs/paper/*.py), or a run config and `sweep` a grid over it
(`--sweep`, `sweep_flags`); every member runs into WORKDIR/runs/<member> (default WORKDIR: runs/<config>[-<arg>],
for a grid runs/<config>[-<arg>]-sweep), skipping finished members, so rerunning the same command resumes an
interrupted sweep. `executor="local"` runs them one after another here; `"ray"` runs each as a Ray task on
the cluster at `ray_address` (None: a local Ray instance), each asking for `ray_cpus_per_member` CPUs and
`ray_gpus_per_member` of a GPU (`sweep_lib.RayResources`). `records`: a directory that also keeps each finished
member's record (no checkpoints) and restores it on a fresh machine (fedpsa_jax/sweep/records.py). Exit code 1 if a
member failed.

Modes beyond these come from the caller: launch.py passes the analysis package's (`fedpsa_lab.modes`:
report), which this package does not import (docs/architecture.md, "Two packages").

Bad input raises a `errors.UserError`; `main` turns it, and every other failure a user can cause, into one
line on stderr and its exit code (`fedpsa_jax.cli`).
"""

from __future__ import annotations

import dataclasses
import logging as std_logging
import os
import sys
import warnings
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import ml_collections
from absl import logging

from fedpsa_jax import cli, compilation_cache, io, profiling, signals
from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep as sweep_lib
from fedpsa_jax.cli import run_name, sweep_flags
from fedpsa_jax.sim import runner

MODES = ("train", "profile", "sweep")  # the simulator's own; a caller may add more (`run_mode`'s `more_modes`)


@dataclasses.dataclass(frozen=True)
class Options:
  """What the command's flags ask for besides the config (each field is the flag of the same name)."""

  config_path: str  # `--config`: the config file[:arg], which names the default workdir
  mode: str = "train"
  workdir: str | None = None
  resume: bool = False
  executor: str = "local"
  ray_address: str | None = None
  ray_cpus_per_member: int | None = None  # None: not given (sweep_lib.RayResources's default)
  ray_gpus_per_member: float | None = None  # None: not given (the default share on a cluster with GPUs)
  compilation_cache: str | None = None  # None: WORKDIR/jax_cache; '': none
  records: str | None = None  # `--records`: sweep only; the finished members' records kept there as well
  sweep: tuple[str, ...] = ()  # `--sweep`: sweep only; a grid over the run config (`sweep_flags`)
  profile_trace: bool = False
  profile_repeats: int = 5
  profile_pieces: tuple[str, ...] | None = None  # `--profile_pieces`: None: every piece
  verbose: bool = False  # `--verbose`: the libraries' info log lines (absl, JAX, tfds) on the console too


Mode = Callable[[ml_collections.ConfigDict, Options], int]  # a mode a caller adds: (config, flags) -> exit code
NO_MORE_MODES: Mapping[str, Mode] = MappingProxyType({})


def train(config: ml_collections.ConfigDict, workdir: str, resume: bool) -> int:
  """The train mode: 0 when the run completed, 1 when it diverged (a stopped run raises, see `main`)."""
  if resume and not os.path.exists(os.path.join(workdir, "config.json")):
    raise config_lib.ConfigError(f"--workdir={workdir!r} holds no run to resume (no config.json); "
                                 "allowed: the workdir of an earlier run, or no --resume for a new run")
  simulation = runner.Simulation(config, workdir)
  if simulation.resumed_from is not None:
    cli.say(f"resuming {workdir} from its checkpoint at day "
            f"{simulation.resumed_from / config_lib.UNITS_PER_DAY:.4f} (status {simulation.status})")
  summary = simulation.run()
  cli.say(runner.summary_line(summary))
  cli.say(f"outputs in {workdir}")
  return cli.EXIT_OK if summary["status"] == "completed" else cli.EXIT_FAILED


def profile(config: ml_collections.ConfigDict, workdir: str, *, trace: bool = False, repeats: int = 5,
            pieces: Sequence[str] | None = None) -> int:
  """The profile mode: the table on stdout, the rows and their provenance in WORKDIR/profile.json; `pieces`: only
  those (checked before any work); what a trace's Perfetto file lacks, one line on stderr."""
  config_lib.validate(config)
  if pieces is not None:
    profiling.check_pieces(config, pieces, what="--profile_pieces")
  io.refuse_links(workdir, ("profile.json", "profile.json" + io.TMP_SUFFIX, "trace"))
  os.makedirs(workdir, exist_ok=True)
  trace_dir = os.path.join(workdir, "trace") if trace else None
  rows = profiling.profile(config, repeats=repeats, trace_dir=trace_dir, pieces=pieces,
                           warn=lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
  origin = profiling.provenance_of(config, repeats)
  cli.say(profiling.format_table(rows, origin))
  absent = sorted(set(pieces or ()) - {r["piece"] for r in rows} - {profiling.SERVER_STEP})
  if absent:
    cli.say(f"not in this run: {', '.join(absent)} (a piece that does not apply to the config; docs/profiling.md)")
  io.write_json_atomic(os.path.join(workdir, "profile.json"), {"provenance": origin, "rows": rows})
  cli.say(f"profile written to {os.path.join(workdir, 'profile.json')}"
          + (f", trace to {trace_dir}" if trace_dir else ""))
  return cli.EXIT_OK


def run_sweep(config: ml_collections.ConfigDict, options: Options) -> int:
  """The sweep mode: 0 when every member is done, 1 when one failed. With `--sweep`, the sweep is that grid over
  the run config (`sweep_flags.grid_sweep`), in the default workdir runs/<config>[-<arg>]-sweep."""
  if options.sweep:
    config = sweep_flags.grid_sweep(config, options.sweep, options.config_path)
  elif not sweep_lib.is_sweep_config(config):
    raise config_lib.ConfigError(
        f"--config={options.config_path!r} is not a sweep config (it needs name, base, axes, seeds); allowed: "
        "a sweep config such as configs/paper/table1.py (configs/paper/{table1..table6,fig3..fig6}.py), or a grid "
        "over this config: --sweep='method=fedbuff,fedpsa seed=0:3'")
  default = sweep_flags.workdir if options.sweep else run_name.sweep_workdir
  workdir = options.workdir or default(options.config_path)
  cache = options.compilation_cache
  cache = os.path.join(workdir, "jax_cache") if cache is None else cache
  if cache and os.path.lexists(cache) and not os.path.isdir(cache):  # (every member would fail on it)
    raise config_lib.ConfigError(
        f"--compilation_cache={cache!r} is not a directory (default: WORKDIR/jax_cache); allowed: a directory "
        "(made if missing), another --compilation_cache, or --compilation_cache='' for none")
  results = sweep_lib.run(config, workdir, options.executor, options.ray_address, compilation_cache=cache or None,
                          records_dir=options.records, resources=ray_resources(options), log=cli.say)
  failed = [name for name, s in results.items() if s.get("sweep_action") == "failed"]
  cli.say(f"sweep {config.name}: {len(results) - len(failed)}/{len(results)} members done in {workdir}"
          + (f"; failed: {', '.join(failed)}" if failed else "")
          + f"\nreport: python launch.py --mode=report --workdir={workdir}")
  return cli.EXIT_FAILED if failed else cli.EXIT_OK


def ray_resources(options: Options) -> sweep_lib.RayResources:
  """What each member's Ray task asks for, from `--ray_cpus_per_member` and `--ray_gpus_per_member`; ConfigError
  when one is invalid, or given without --mode=sweep --executor=ray."""
  given = [f"--{name}" for name in ("ray_cpus_per_member", "ray_gpus_per_member") if getattr(options, name) is not None]
  if given and (options.mode != "sweep" or options.executor != "ray"):
    raise config_lib.ConfigError(f"{given[0]} is only for --mode=sweep --executor=ray; allowed: those, or no "
                                 f"{given[0]}")
  resources = sweep_lib.RayResources(
      **({"cpus": options.ray_cpus_per_member} if options.ray_cpus_per_member is not None else {}),
      gpus=options.ray_gpus_per_member)
  problems = resources.problems()
  if problems:
    raise config_lib.ConfigError(problems[0])
  return resources


def run_mode(config: ml_collections.ConfigDict, options: Options, more_modes: Mapping[str, Mode] = NO_MORE_MODES) -> int:
  """The mode `options` asks for, one of `MODES` or of `more_modes` (launch.py's: the lab's report); bad input
  raises a UserError (see `main`)."""
  if options.workdir == "":  # (given, but empty: not the same as no --workdir)
    raise config_lib.ConfigError("--workdir= is empty; allowed: a directory (without --workdir, the mode's "
                                 "default: a new runs/<config>-<time> for a run)")
  if options.records is not None and options.mode != "sweep":
    raise config_lib.ConfigError(f"--records is only for --mode=sweep, not --mode={options.mode}; allowed: "
                                 "--mode=sweep --records=DIR, or no --records")
  if options.records == "":
    raise config_lib.ConfigError("--records= is empty; allowed: a directory, or no --records")
  if options.sweep and options.mode != "sweep":
    raise config_lib.ConfigError(f"--sweep is only for --mode=sweep, not --mode={options.mode}; allowed: "
                                 "--mode=sweep --sweep=GRID, or no --sweep")
  if options.profile_pieces is not None and options.mode != "profile":
    raise config_lib.ConfigError(f"--profile_pieces is only for --mode=profile, not --mode={options.mode}; allowed: "
                                 "--mode=profile --profile_pieces=NAME,..., or no --profile_pieces")
  ray_resources(options)  # (the Ray flags checked before any mode starts)
  if options.mode in more_modes:
    return more_modes[options.mode](config, options)
  if options.mode not in MODES:
    raise config_lib.ConfigError(f"--mode={options.mode} is invalid; allowed: {', '.join([*MODES, *more_modes])}")
  if options.mode == "sweep":
    return run_sweep(config, options)
  if sweep_lib.is_sweep_config(config):
    raise config_lib.ConfigError(f"--config={options.config_path!r} is a sweep config; allowed with it: "
                                 "--mode=sweep (then --mode=report)")
  config_lib.validate(config)
  if options.mode == "profile":
    workdir = options.workdir or run_name.default_workdir(options.config_path) + "-profile"
    return profile(config, workdir, trace=options.profile_trace, repeats=options.profile_repeats,
                   pieces=options.profile_pieces)
  if options.resume and not options.workdir:
    workdir = run_name.resumable_workdir(options.config_path, config)
  else:
    workdir = options.workdir or run_name.default_workdir(options.config_path)
  return train(config, workdir, options.resume)


def main(config: ml_collections.ConfigDict, options: Options, more_modes: Mapping[str, Mode] = NO_MORE_MODES) -> int:
  """Runs the mode with SIGINT / SIGTERM handled (one line, status `interrupted`, exit 130 / 143; more signals
  while it stops or exits change neither): the process's exit code. A stopped run ends the process here
  (`signals.end_process`: no interpreter finalization). Installs signal handlers, so call it from a command
  line, not a notebook."""
  signals.handle_signals()
  cli.readable_streams()
  # (a cache set by JAX_COMPILATION_CACHE_DIR, or a sweep's, may be shared with other processes at once)
  compilation_cache.write_whole_entries()
  if not options.verbose:
    quiet_library_logs()
  code = cli.exit_code_of(lambda: run_mode(config, options, more_modes))
  signals.exit_on_signal(code)
  if code in STOPPED_BY_SIGNAL:
    signals.end_process(code)
  return code


STOPPED_BY_SIGNAL = tuple(cli.exit_code_for_signal(s) for s in signals.SIGNALS)


# Warnings that ask nothing of a user: tfds's advice to install OpenCV for faster decoding (a split is
# decoded once per machine, then read from fedpsa_jax/data/cache.py).
UNACTIONABLE_WARNINGS = ("OpenCV is not installed",)


def _actionable(record: std_logging.LogRecord) -> bool:
  return not str(record.msg).startswith(UNACTIONABLE_WARNINGS)


def quiet_library_logs() -> None:
  """Only warnings and errors of absl, JAX and tfds on the console (their info lines, e.g. JAX's search for
  a TPU, say nothing a user must act on), less the warnings that ask nothing of a user
  (`UNACTIONABLE_WARNINGS`); the run's own lines are printed, not logged."""
  logging.set_verbosity(logging.WARNING)
  std_logging.getLogger().setLevel(std_logging.WARNING)
  # JAX warns when it cannot write a compiled program to its persistent cache (a full disk, `ulimit -f`) and goes
  # on without it: the run's own writes meet the same limit and say so in one line.
  warnings.filterwarnings("ignore", message="Error writing persistent compilation cache entry", category=UserWarning)
  absl_logger = std_logging.getLogger("absl")
  if _actionable not in absl_logger.filters:
    absl_logger.addFilter(_actionable)
