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
newest run of the same config under runs/.

Every failure a user can cause ends in one message on stderr, no traceback, and its exit code
(fedpsa_jax/cli.py): 2 bad input (a flag, a config file or value, the workdir, missing data, a checkpoint
that must not or cannot be restored), nothing done; 1 a diverged or failed run; 3 an output that could not
be written (a full disk); 130 / 143 a run stopped by SIGINT / SIGTERM (status `interrupted`, resumable).
"""

from __future__ import annotations

import datetime
import os
import sys


def max_host_devices() -> int:
  """The most `--host_devices` allowed: 4 per core. Each host device is a client trainer; beyond the cores
  they only wait for one, and XLA builds every one of them (a thread pool and its buffers) at start."""
  return 4 * (os.cpu_count() or 1)


def _force_host_devices(argv: list[str], default: int = 2) -> int:
  """Sets XLA_FLAGS for `--host_devices=D` (before JAX starts: XLA reads the flag once per process).

  On a CPU, host devices let clients train at the same time (local.execution=loop); XLA:CPU runs each
  convolution on one core, so one device leaves a core idle. The default 2 is one client device per core
  of a 2-core machine, the first also the server's. Measured on the default job (docs/performance.md,
  "Host devices"): as fast as a third device that only serves (FedPSA, once the first device's work
  counts the payloads it computes) or faster (FedBuff, ~7%), with ~70-120 MB less peak RSS (each device
  has its own threads, buffers and malloc arenas). On more cores, try one device per core. GPU
  runs are unaffected (their devices are the GPUs). An XLA_FLAGS that already sets the count wins.
  """
  count = default
  for arg in argv:
    if arg.startswith("--host_devices="):
      value = arg.split("=", 1)[1]
      # (bad values, too many included: the flag's own error below, before JAX starts)
      count = int(value) if value.isdigit() and 1 <= int(value) <= max_host_devices() else count
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if count > 1 and "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={count}".strip()
  return count


_force_host_devices(sys.argv)

import ml_collections  # noqa: E402  (after XLA_FLAGS is set)
from absl import app, flags, logging
from ml_collections import config_flags

from fedpsa_jax import cli, errors, io, profiling, signals
from fedpsa_jax import config as config_lib
from fedpsa_jax import sweep as sweep_lib
from fedpsa_jax.sim import runner
from fedpsa_jax.validation import MISSING, get_field

DEFAULT_CONFIG = "configs/default.py"
# Locked once built: `--config.field=value` may change a field but not add one (a typo is an error). No
# default here: ml_collections would load a default config file while this module is imported, outside
# any error handling; `parse_flags` adds `--config=DEFAULT_CONFIG` to the command line instead.
_CONFIG = config_flags.DEFINE_config_file("config", None, f"Run config file[:arg] (default: {DEFAULT_CONFIG}).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "profile", "sweep", "report"], "What to do with the config.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", list(sweep_lib.EXECUTORS),
                              "sweep: run members one after another here (local) or as Ray tasks (ray).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", None, "sweep: JAX persistent compilation cache directory shared by the members "
    "(default: WORKDIR/jax_cache; '' turns it off). Members recompile the same functions; the cache makes "
    "short members ~3x faster and does not change results. It holds executable code: use only a cache "
    "this user made.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "sweep --executor=ray: the cluster address for "
                                   "ray.init(address=...) ('auto': this node's cluster); none: a local instance.")
flags.DEFINE_integer("host_devices", 2, "CPU only: host devices XLA creates (set before JAX starts). 2: both "
                     "train one client each at a time, the first also serves (one per core of a 2-core machine); "
                     "3 or more: one serves and the others train; 1: a single device.", lower_bound=1)
flags.register_validator(
    "host_devices", lambda count: count <= max_host_devices(),
    message=f"more host devices than this machine can use; allowed: at most {max_host_devices()} (4 x this "
    f"machine's {os.cpu_count() or 1} cores: each host device trains one client at a time, so devices beyond the "
    "cores only wait, and XLA builds each of them at start)")
_PROFILE_TRACE = flags.DEFINE_bool("profile_trace", False, "profile: also write a jax.profiler trace.")
_PROFILE_REPEATS = flags.DEFINE_integer("profile_repeats", 5, "profile: timed calls per piece (median).")
_RESUME = flags.DEFINE_bool(
    "resume", False, "train: continue the run in --workdir (without --workdir: the newest "
    "runs/<config>-* run of this same config) from its last complete checkpoint; an error if there is "
    "none. Rerunning into the same --workdir resumes as well, without this flag.")


# --- flags and config files --------------------------------------------------------------------------


def _config_spec(argv: list[str]) -> str | None:
  """The value of the last `--config=...` / `--config ...` in argv (None when absent)."""
  spec = None
  for i, arg in enumerate(argv):
    if arg.startswith(("--config=", "-config=")):
      spec = arg.split("=", 1)[1]
    elif arg in ("--config", "-config") and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def _without_config(args: list[str]) -> list[str]:
  """`args` without `--config=...` / `--config ...` (`_config_spec` has its value)."""
  out, skip = [], False
  for arg in args:
    if skip:
      skip = False
    elif arg in ("--config", "-config"):
      skip = True
    elif not arg.startswith(("--config=", "-config=")):
      out.append(arg)
  return out


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
  """(dotted field, the argument as given) of every `--config.<field>=value` in argv, in order."""
  out = []
  for arg in argv:
    name = arg.lstrip("-").split("=", 1)[0]
    for prefix in ("config.", "noconfig."):  # (`--noconfig.flag` sets a boolean field to False)
      if arg.startswith("-") and name.startswith(prefix):
        out.append((name[len(prefix):].split("[", 1)[0], arg))
  return out


def _unknown_override(argv: list[str], spec: str) -> str | None:
  """The message for the first `--config.<field>` override that names no field of the config, if any.

  ml_collections reports such a field (the config is locked) as a bare AttributeError deep in its flag
  parser; this names the flag and the nearest field, as `config.set_fields` does for the notebook API.
  Loads the config file once more, so only on that error path."""
  overrides = _overrides(argv)
  if not overrides:
    return None
  try:
    config = flags.FLAGS["config"].parser.parse(spec)
  except Exception:  # (the file itself fails: its own message is the better one)
    return None
  if not isinstance(config, ml_collections.ConfigDict):
    return _not_a_config(spec, config)
  for field, arg in overrides:
    if get_field(config, field) is MISSING:
      return f"{arg}: {config_lib.unknown_field(config, field)}"
  return None


def _fresh_config(spec: str) -> ml_collections.ConfigDict | None:
  """The config file's config as written, without the overrides (None when it cannot be loaded)."""
  try:
    config = flags.FLAGS["config"].parser.parse(spec)
  except Exception:  # (the file itself fails: its own message is the better one)
    return None
  return config if isinstance(config, ml_collections.ConfigDict) else None


def _allowed_type(field: str, spec: str) -> str:
  """'; allowed: a value of type float, like its default 10.0' for a field of the config file (as
  `config.set_fields` says for the notebook API), or '' when the file cannot tell."""
  config = _fresh_config(spec)
  default = get_field(config, field) if config is not None else MISSING
  if default is MISSING or default is None:
    return ""
  return f"; allowed: a value of type {type(default).__name__}, like its default {default!r}"


def _bool_for_a_number(argv: list[str], spec: str, config: ml_collections.ConfigDict) -> str | None:
  """The message for the first `--config.<field>=True` (or False) whose field is a number, if any.

  A boolean is not a number (`virtual_days=True` must not run one day). ml_collections' flag parser refuses
  the word for an int or float field today, but a ConfigDict stores True as 1.0 in a float field, so this is
  checked on the raw arguments after parsing as well: no version of the parser can let one through."""
  for field, arg in _overrides(argv):
    raw = arg.split("=", 1)[1].strip() if "=" in arg else ""
    value = get_field(config, field)
    if raw.lower() in ("true", "false") and isinstance(value, (int, float)) and not isinstance(value, bool):
      return f"{arg}: config field {field}={raw} is invalid (a boolean for a number){_allowed_type(field, spec)}"
  return None


def _not_a_config(spec: str, config: object) -> str:
  return (f"--config={spec}: get_config() returned {type(config).__name__}; allowed: a config file whose "
          "get_config(arg) returns a ConfigDict")


def _flags_error_message(err: BaseException, argv: list[str], spec: str) -> str:
  """One line for an error raised while the flags and the config file were parsed (see `parse_flags`)."""
  chain = cli.exception_chain(err)
  if isinstance(chain[-1], (AttributeError, KeyError)):
    unknown = _unknown_override(argv, spec)
    if unknown:
      return unknown
  if isinstance(chain[-1], AttributeError) and "has no attribute 'get_config'" in str(chain[-1]):
    return f"--config={spec}: the file has no get_config(arg) function; allowed: a config file that defines one"
  if any(isinstance(e, errors.UserError) for e in chain):  # raised by the config file (parse_arg, set_fields)
    return f"--config={spec}: {cli.one_line(cli.innermost_message(err))}"
  if isinstance(err, flags.Error) and "Traceback" not in str(err):  # absl's own: an unknown flag, a bad value
    for field, arg in _overrides(argv):  # a `--config.<field>=value` its parser refused: say what the field takes
      if str(err).startswith(f"flag {arg}: "):
        reason = cli.one_line(str(err)[len(f"flag {arg}: "):])
        return f"{arg}: config field {field} is invalid ({reason}){_allowed_type(field, spec)}"
    return cli.one_line(str(err)) + " (--helpshort lists the flags)"
  return f"--config={spec}: {cli.one_line(cli.innermost_message(err))}"


def parse_flags(argv: list[str]) -> list[str]:
  """absl's `flags_parser` (app.run): parses the flags and loads the config file, or prints one line and
  exits with code 2.

  absl's own parser prints usage and exits 1 on a flags.Error and lets anything else through with a
  traceback; ml_collections re-raises what a config file raised with the traceback as its message, and
  reports a `--config.<field>` the config does not have as an AttributeError. Everything raised here is
  the user's input (a flag, a config file, an `:arg`, a field), so each ends in its innermost message.
  """
  spec = _config_spec(argv)
  # The config file first: ml_collections refuses a `--config.<field>` given before it, but the overrides
  # apply to the file wherever it is named.
  argv = [argv[0], f"--config={spec or DEFAULT_CONFIG}", *_without_config(argv[1:])]
  spec = spec or DEFAULT_CONFIG
  sys.argv = argv  # (ml_collections finds the overrides in sys.argv, not in the argv absl parses)
  try:
    path = spec.split(":", 1)[0]
    if not os.path.isfile(path):
      raise errors.ConfigError(f"--config={spec!r}: no such file; allowed: a config file such as "
                               f"{DEFAULT_CONFIG}[:arg], or a sweep config "
                               f"configs/paper/{{{','.join(_paper_configs())}}}[:smoke][,seeds=K]")
    rest = flags.FLAGS(argv)
    config = _CONFIG.value
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
      getattr(config, "method")  # (ml_collections defers a file it could not open to the config's first use)
    if not isinstance(config, ml_collections.ConfigDict):
      raise errors.ConfigError(_not_a_config(spec, config))
    wrong_type = _bool_for_a_number(argv, spec, config)
    if wrong_type:
      raise errors.ConfigError(wrong_type)
    return rest
  except Exception as err:  # noqa: BLE001 — see the docstring: all of it is bad input
    own = isinstance(err, errors.ConfigError) and str(err).startswith(("--config=", "--config."))
    message = cli.one_line(str(err)) if own else _flags_error_message(err, argv, spec)
    print(message, file=sys.stderr)
    sys.exit(cli.EXIT_BAD_INPUT)


def _paper_configs() -> list[str]:
  paper_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "paper")
  return sorted(f for f in os.listdir(paper_dir) if f.startswith(("table", "fig")) and f.endswith(".py"))


# --- modes -------------------------------------------------------------------------------------------


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
  """The train mode: 0 when the run completed, 1 when it diverged (a stopped run raises, see `main`)."""
  if resume and not os.path.exists(os.path.join(workdir, "config.json")):
    raise config_lib.ConfigError(f"--workdir={workdir!r} holds no run to resume (no config.json); "
                                 "allowed: the workdir of an earlier run, or no --resume for a new run")
  simulation = runner.Simulation(config, workdir)
  logging.info("workdir: %s", workdir)
  if simulation.resumed_from is not None:
    print(f"resuming {workdir} from its checkpoint at day "
          f"{simulation.resumed_from / config_lib.UNITS_PER_DAY:.4f} (status {simulation.status})")
  summary = simulation.run()
  print(runner.summary_line(summary))
  print(f"outputs in {workdir}")
  return cli.EXIT_OK if summary["status"] == "completed" else cli.EXIT_FAILED


def profile(config: ml_collections.ConfigDict, workdir: str) -> int:
  """The profile mode: the table on stdout, the rows in WORKDIR/profile.json."""
  config_lib.validate(config)
  os.makedirs(workdir, exist_ok=True)
  trace_dir = os.path.join(workdir, "trace") if _PROFILE_TRACE.value else None
  rows = profiling.profile(config, repeats=_PROFILE_REPEATS.value, trace_dir=trace_dir)
  print(profiling.format_table(rows))
  io.write_json_atomic(os.path.join(workdir, "profile.json"), rows)
  print(f"profile written to {os.path.join(workdir, 'profile.json')}"
        + (f", trace to {trace_dir}" if trace_dir else ""))
  return cli.EXIT_OK


def sweep_workdir(config_path: str) -> str:
  """runs/<config>[-<arg>], without a timestamp: rerunning the same sweep command resumes it."""
  return default_workdir(config_path)[:-len("-YYYYmmdd-HHMMSS")]


def run_sweep(config: ml_collections.ConfigDict, config_path: str, workdir: str | None) -> int:
  """The sweep mode: 0 when every member is done, 1 when one failed."""
  if not sweep_lib.is_sweep_config(config):
    raise config_lib.ConfigError(
        f"--config={config_path!r} is not a sweep config (it needs name, base, axes, seeds); allowed: a "
        "sweep config such as configs/paper/table1.py (configs/paper/{table1..table6,fig3..fig6}.py)")
  workdir = workdir or sweep_workdir(config_path)
  cache = _COMPILATION_CACHE.value if _COMPILATION_CACHE.value is not None else os.path.join(workdir, "jax_cache")
  results = sweep_lib.run(config, workdir, _EXECUTOR.value, _RAY_ADDRESS.value, compilation_cache=cache or None)
  failed = [name for name, s in results.items() if s.get("sweep_action") == "failed"]
  print(f"sweep {config.name}: {len(results) - len(failed)}/{len(results)} members done in {workdir}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nreport: python launch.py --mode=report --workdir={workdir}")
  return cli.EXIT_FAILED if failed else cli.EXIT_OK


def run_report(workdir: str | None) -> int:
  """The report mode: tables and figures of a sweep or a run directory into WORKDIR/report."""
  from fedpsa_jax import report  # matplotlib only when a report is drawn

  if not workdir:
    raise config_lib.ConfigError("--workdir is required for --mode=report; allowed: a sweep directory (with "
                                 "sweep.json) or a run directory (with metrics.jsonl)")
  try:
    written = report.build(workdir)
  except report.ReportError as err:  # (report.py's own error type: bad input as well)
    raise errors.UserError(str(err)) from None
  print("\n".join(["report written:", *written]))
  return cli.EXIT_OK


def run_mode(config: ml_collections.ConfigDict, config_path: str) -> int:
  """The mode the flags ask for; bad input raises a UserError (see `main`)."""
  if _MODE.value == "report":
    return run_report(_WORKDIR.value)
  if _MODE.value == "sweep":
    return run_sweep(config, config_path, _WORKDIR.value)
  if sweep_lib.is_sweep_config(config):
    raise config_lib.ConfigError(f"--config={config_path!r} is a sweep config; allowed with it: --mode=sweep "
                                 "(then --mode=report)")
  config_lib.validate(config)
  if _MODE.value == "profile":
    return profile(config, _WORKDIR.value or default_workdir(config_path) + "-profile")
  if _RESUME.value and not _WORKDIR.value:
    workdir = resumable_workdir(config_path, config)
  else:
    workdir = _WORKDIR.value or default_workdir(config_path)
  return train(config, workdir, _RESUME.value)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config_path = config_flags.get_config_filename(flags.FLAGS["config"])
  signals.handle_signals()  # SIGINT / SIGTERM: one line, status `interrupted`, exit 130 / 143
  return cli.exit_code_of(lambda: run_mode(_CONFIG.value, config_path))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
