"""Entry point: `python launch.py --config=configs/default.py[:arg] [--config.field=value ...]`.

Modes: train (default), profile, sweep, report. A bad config fails before any work with one message naming
each bad field.

sweep: `--config` is a sweep config (configs/paper/*.py); every member runs into WORKDIR/runs/<member>
(default WORKDIR: runs/<config>[-<arg>]), skipping finished members, so rerunning the same command resumes
an interrupted sweep. `--executor=local` (default) runs them one after another here; `--executor=ray`
runs each as a Ray task on the cluster at `--ray_address` (none: a local Ray instance). Exit code 1 if a
member failed.

report: `--workdir` is a sweep directory (the table in the paper's layout as markdown and CSV, and the
figures, in WORKDIR/report) or a single run directory (its learning curve and figures, in WORKDIR/report).

profile: compiles and measures each jitted piece of the configured run (one SGD step, a client update,
the Fisher diagonal on each path and Eq. 8 at calibration sizes 16/32/128/512, the sketch, evaluation,
each strategy's server step): a table on stdout and WORKDIR/profile.json; `--profile_trace` also
writes a jax.profiler trace (TensorBoard / Perfetto) to WORKDIR/trace with one named scope per piece.

train: rerunning into the same --workdir continues the run from its last complete checkpoint (bitwise
the same metrics as an uninterrupted run); `--resume` does so explicitly, and without --workdir finds the
newest run of the same config under runs/. Bad input (config, workdir, missing data) exits with code 2
and one message, no traceback; a diverged run exits with code 1.
"""

from __future__ import annotations

import datetime
import os
import sys


def _force_host_devices(argv: list[str], default: int = 3) -> int:
  """Sets XLA_FLAGS for `--host_devices=D` (before JAX starts: XLA reads the flag once per process).

  On a CPU, host devices let clients train at the same time (local.execution=loop); XLA:CPU runs each
  convolution on one core, so one device leaves a core idle. The default 3 is one server device and two
  client devices, one per core of a 2-core machine, so the server's steps never wait behind training
  (measured: docs/performance.md, benchmarks/throughput.py). On more
  cores, use D = cores + 1. GPU runs are unaffected (their devices are the GPUs). An XLA_FLAGS that
  already sets the count wins.
  """
  count = default
  for arg in argv:
    if arg.startswith("--host_devices="):
      value = arg.split("=", 1)[1]
      count = int(value) if value.isdigit() and int(value) >= 1 else count  # (bad values: absl's error below)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if count > 1 and "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={count}".strip()
  return count


_force_host_devices(sys.argv)

import ml_collections  # noqa: E402  (after XLA_FLAGS is set)
from absl import app, flags, logging
from ml_collections import config_flags

from fedpsa_jax import config as config_lib
from fedpsa_jax import checkpoint, io, profiling
from fedpsa_jax import sweep as sweep_lib
from fedpsa_jax.data.sources import DatasetNotFoundError
from fedpsa_jax.sim import runner

# Locked once built: `--config.field=value` may change a field but not add one (a typo is an error).
_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Run config file[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "profile", "sweep", "report"], "What to do with the config.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", list(sweep_lib.EXECUTORS),
                              "sweep: run members one after another here (local) or as Ray tasks (ray).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", None, "sweep: JAX persistent compilation cache directory shared by the members "
    "(default: WORKDIR/jax_cache; '' turns it off). Members recompile the same functions; the cache makes "
    "short members ~3x faster and does not change results.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "sweep --executor=ray: the cluster address for "
                                   "ray.init(address=...) ('auto': this node's cluster); none: a local instance.")
flags.DEFINE_integer("host_devices", 3, "CPU only: host devices XLA creates (set before JAX starts). With 3 or "
                     "more, one serves and the others train one client each at a time (cores + 1 is a good "
                     "choice); 2: both train, the first also serves; 1: a single device.", lower_bound=1)
_PROFILE_TRACE = flags.DEFINE_bool("profile_trace", False, "profile: also write a jax.profiler trace.")
_PROFILE_REPEATS = flags.DEFINE_integer("profile_repeats", 5, "profile: timed calls per piece (median).")
_RESUME = flags.DEFINE_bool(
    "resume", False, "train: continue the run in --workdir (without --workdir: the newest "
    "runs/<config>-* run of this same config) from its last complete checkpoint; an error if there is "
    "none. Rerunning into the same --workdir resumes as well, without this flag.")


def default_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  arg = config_path.split(":", 1)[1].replace(",", "_").replace("=", "-") if ":" in config_path else ""
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}{'-' + arg if arg else ''}-{stamp}")


def resumable_workdir(config_path: str, config: ml_collections.ConfigDict) -> str:
  """The newest `default_workdir` sibling (same config file and arg, any time) that holds a run of this
  config (`config.identity_differences`: the same shared fields and method section); ConfigError when
  there is none."""
  prefix = os.path.basename(default_workdir(config_path))[:-len("YYYYmmdd-HHMMSS")]
  current = io.config_json(config)
  found = []
  for name in os.listdir("runs") if os.path.isdir("runs") else []:
    path = os.path.join("runs", name)
    if not name.startswith(prefix):
      continue
    try:
      saved = io.read_config(path)
    except (OSError, ValueError):  # a damaged config.json is not a run to continue
      continue
    if saved is not None and not config_lib.identity_differences(saved, current):
      found.append(path)
  if not found:
    raise config_lib.ConfigError(f"--resume found no run of this config under runs/{prefix}*; allowed: "
                                 "--workdir=DIR of the run to continue, or no --resume for a new run")
  return max(found)  # the names end in a sortable timestamp


def train(config: ml_collections.ConfigDict, workdir: str, resume: bool) -> int:
  """The train mode: bad input (config, workdir, data) -> its message and exit code 2, no traceback."""
  try:
    if resume and not os.path.exists(os.path.join(workdir, "config.json")):
      raise config_lib.ConfigError(f"--workdir={workdir!r} holds no run to resume (no config.json); "
                                   "allowed: the workdir of an earlier run, or no --resume for a new run")
    simulation = runner.Simulation(config, workdir)
  except (config_lib.ConfigError, DatasetNotFoundError, checkpoint.IncompatibleCheckpoint) as err:
    print(err, file=sys.stderr)
    return 2
  logging.info("workdir: %s", workdir)
  if simulation.resumed_from is not None:
    print(f"resuming {workdir} from its checkpoint at day "
          f"{simulation.resumed_from / config_lib.UNITS_PER_DAY:.4f} (status {simulation.status})")
  summary = simulation.run()
  print(runner.summary_line(summary))
  print(f"outputs in {workdir}")
  return 0 if summary["status"] == "completed" else 1


def profile(config: ml_collections.ConfigDict, workdir: str) -> int:
  """The profile mode: the table on stdout, the rows in WORKDIR/profile.json."""
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as err:
    print(err, file=sys.stderr)
    return 2
  os.makedirs(workdir, exist_ok=True)
  trace_dir = os.path.join(workdir, "trace") if _PROFILE_TRACE.value else None
  try:
    rows = profiling.profile(config, repeats=_PROFILE_REPEATS.value, trace_dir=trace_dir)
  except DatasetNotFoundError as err:
    print(err, file=sys.stderr)
    return 2
  print(profiling.format_table(rows))
  io.write_json_atomic(os.path.join(workdir, "profile.json"), rows)
  print(f"profile written to {os.path.join(workdir, 'profile.json')}"
        + (f", trace to {trace_dir}" if trace_dir else ""))
  return 0


def sweep_workdir(config_path: str) -> str:
  """runs/<config>[-<arg>], without a timestamp: rerunning the same sweep command resumes it."""
  return default_workdir(config_path)[:-len("-YYYYmmdd-HHMMSS")]


def run_sweep(config: ml_collections.ConfigDict, config_path: str, workdir: str | None) -> int:
  """The sweep mode: bad input -> its message and exit code 2; a failed member -> exit code 1."""
  paper_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "paper")
  paper_configs = sorted(f for f in os.listdir(paper_dir) if f.startswith(("table", "fig")) and f.endswith(".py"))
  if not os.path.exists(config_path.split(":")[0]):
    print(f"--config={config_path!r}: no such file; allowed: a sweep config, configs/paper/"
          f"{{{','.join(paper_configs)}}}[:smoke][,seeds=K]", file=sys.stderr)
    return 2
  if not sweep_lib.is_sweep_config(config):
    print(f"--config={config_path!r} is not a sweep config (it needs name, base, axes, seeds); allowed: a "
          "sweep config such as configs/paper/table1.py (configs/paper/{table1..table6,fig3..fig6}.py)",
          file=sys.stderr)
    return 2
  workdir = workdir or sweep_workdir(config_path)
  try:
    cache = _COMPILATION_CACHE.value if _COMPILATION_CACHE.value is not None else os.path.join(workdir, "jax_cache")
    results = sweep_lib.run(config, workdir, _EXECUTOR.value, _RAY_ADDRESS.value, compilation_cache=cache or None)
  except config_lib.ConfigError as err:
    print(err, file=sys.stderr)
    return 2
  failed = [name for name, s in results.items() if s.get("sweep_action") == "failed"]
  print(f"sweep {config.name}: {len(results) - len(failed)}/{len(results)} members done in {workdir}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nreport: python launch.py --mode=report --workdir={workdir}")
  return 1 if failed else 0


def run_report(workdir: str | None) -> int:
  """The report mode: tables and figures of a sweep or a run directory into WORKDIR/report."""
  from fedpsa_jax import report  # matplotlib only when a report is drawn

  if not workdir:
    print("--workdir is required for --mode=report; allowed: a sweep directory (with sweep.json) or a run "
          "directory (with metrics.jsonl)", file=sys.stderr)
    return 2
  try:
    written = report.build(workdir)
  except report.ReportError as err:
    print(err, file=sys.stderr)
    return 2
  print("\n".join(["report written:", *written]))
  return 0


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  config_path = (flags.FLAGS["config"].config_filename if hasattr(flags.FLAGS["config"], "config_filename")
                 else sys.argv[0])
  if _MODE.value == "report":
    return run_report(_WORKDIR.value)
  if _MODE.value == "sweep":
    return run_sweep(config, config_path, _WORKDIR.value)
  if sweep_lib.is_sweep_config(config):
    print(f"--config={config_path!r} is a sweep config; allowed with it: --mode=sweep (then --mode=report)",
          file=sys.stderr)
    return 2
  errors = config_lib.config_errors(config)
  if errors:
    print("invalid config:\n  " + "\n  ".join(errors), file=sys.stderr)
    return 2
  if _MODE.value == "profile":
    return profile(config, _WORKDIR.value or default_workdir(config_path) + "-profile")
  if _RESUME.value and not _WORKDIR.value:
    try:
      workdir = resumable_workdir(config_path, config)
    except config_lib.ConfigError as err:
      print(err, file=sys.stderr)
      return 2
  else:
    workdir = _WORKDIR.value or default_workdir(config_path)
  return train(config, workdir, _RESUME.value)


if __name__ == "__main__":
  app.run(main)
