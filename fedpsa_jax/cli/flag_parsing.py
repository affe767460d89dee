"""`parse_flags`, absl's `flags_parser` for launch.py: every bad flag or config file ends in one line, exit 2.

absl's own parser prints usage and exits 1 on a flags.Error and lets anything else through with a traceback;
ml_collections re-raises what a config file raised with the traceback as its message, and reports a
`--config.<field>` the config does not have as an AttributeError. Everything raised while the flags are
parsed is the user's input (a flag, a config file, an `:arg`, a field), so each ends in its innermost
message, naming the flag and what is allowed.

The flags themselves are the command's (fedpsa_lab/launch.py, which launch.py and `fedpsa-jax` run); this
reads the config flag (`--config`, an ml_collections config file flag) from absl's registry, after resolving
its file: a path from the working directory, else a shipped config by name (`config.shipped`).
"""

from __future__ import annotations

import sys

import ml_collections
from absl import flags

from fedpsa_jax import cli, errors
from fedpsa_jax import config as config_lib
from fedpsa_jax.config import shipped
from fedpsa_jax.validation import MISSING, get_field

DEFAULT_CONFIG = "configs/default.py"  # from the working directory, else the shipped `default` (`config.shipped`)


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


def _set_nones(config: ml_collections.ConfigDict, argv: list[str]) -> None:
  """`--config.<field>=None` unsets a text field, as `None` does in an `:arg` and in the notebook API
  (ml_collections' parser reads it as the text 'None', which no text field allows): `data.name=None` with
  `data.path`, `data.data_dir=None`."""
  for field, arg in _overrides(argv):
    if arg.endswith("=None") and get_field(config, field) == "None":
      *parents, leaf = field.split(".")
      node = config
      for part in parents:
        node = node[part]
      node[leaf] = None


def _fresh_config(spec: str) -> object:
  """What the config file's get_config returns, without the overrides (MISSING when it cannot be loaded).
  Loads the file once more, so only on an error path."""
  try:
    return flags.FLAGS["config"].parser.parse(spec)
  except Exception:  # (the file itself fails: its own message is the better one)
    return MISSING


def _unknown_override(argv: list[str], spec: str) -> str | None:
  """The message for the first `--config.<field>` override that names no field of the config, if any.

  ml_collections reports such a field (the config is locked) as a bare AttributeError deep in its flag
  parser; this names the flag and the nearest field, as `config.set_fields` does for the notebook API."""
  overrides = _overrides(argv)
  config = _fresh_config(spec) if overrides else MISSING
  if config is MISSING:
    return None
  if not isinstance(config, ml_collections.ConfigDict):
    return _not_a_config(spec, config)
  for field, arg in overrides:
    if get_field(config, field) is MISSING:
      return f"{arg}: {config_lib.unknown_field(config, field)}"
  return None


def _allowed_type(field: str, spec: str) -> str:
  """'; allowed: a value of type float, like its default 10.0' for a field of the config file (as
  `config.set_fields` says for the notebook API), or '' when the file cannot tell."""
  config = _fresh_config(spec)
  default = get_field(config, field) if isinstance(config, ml_collections.ConfigDict) else MISSING
  if default is MISSING or default is None:
    return ""
  return f"; allowed: a value of type {type(default).__name__}, like its default {default!r}"


def _not_a_config(spec: str, config: object) -> str:
  return (f"--config={spec}: get_config() returned {type(config).__name__}; allowed: a config file whose "
          "get_config(arg) returns a ConfigDict")


def _flags_error_message(err: BaseException, argv: list[str], spec: str) -> str:
  """One line for an error raised while the flags and the config file were parsed (see `parse_flags`)."""
  chain = list(errors.exception_chain(err))  # outermost first
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


def _refuse(message: str) -> None:
  """Bad input: `message` as one line on stderr, exit code 2."""
  print(message, file=sys.stderr)
  sys.exit(cli.EXIT_BAD_INPUT)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's `flags_parser` (app.run): parses the flags and loads the config file, or prints one line on
  stderr and exits with code 2 (a bad flag or config file, an empty `--config=`, an argument that is not a
  flag). Returns [program], as app.run passes it to main."""
  spec = _config_spec(argv)
  if spec == "":
    _refuse(f"--config= is empty; allowed: a config file such as {DEFAULT_CONFIG}[:arg] (without --config: "
            f"{DEFAULT_CONFIG})")
  spec = spec or DEFAULT_CONFIG
  located = shipped.locate_spec(spec)  # a path from the working directory, else a shipped config by name
  if located is None:
    _refuse(f"--config={spec!r}: {shipped.not_found(spec.partition(':')[0])}; allowed: a config file[:arg], or a "
            "shipped config by name[:arg] (default, paper/table1:smoke)")
  spec = located
  # The config file first: ml_collections refuses a `--config.<field>` given before it, but the overrides
  # apply to the file wherever it is named.
  argv = [argv[0], f"--config={spec}", *_without_config(argv[1:])]
  sys.argv = argv  # (ml_collections finds the overrides in sys.argv, not in the argv absl parses)
  try:
    with config_lib.quiet_loader():
      rest = flags.FLAGS(argv)
    config = flags.FLAGS["config"].value
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
      getattr(config, "method")  # (ml_collections defers a file it could not open to the config's first use)
    if not isinstance(config, ml_collections.ConfigDict):
      raise errors.ConfigError(_not_a_config(spec, config))
    _set_nones(config, argv)
    config_lib.data_path_replaces_name(config, {field for field, _ in _overrides(argv)})
  except SystemExit as err:  # (absl's --help exits too: only the config file's own exit is bad input)
    if not config_lib.exited_in(err, spec.split(":", 1)[0]):
      raise
    _refuse(f"--config={spec}: the config file exited (sys.exit({err.code!r})) while it was loaded; allowed: a "
            "config file whose get_config(arg) returns a ConfigDict")
  except Exception as err:  # noqa: BLE001 — see the module docstring: all of it is bad input
    own = isinstance(err, errors.ConfigError) and str(err).startswith(("--config=", "--config."))
    _refuse(cli.one_line(str(err)) if own else _flags_error_message(err, argv, spec))
  if len(rest) > 1:
    _refuse(f"unexpected argument(s) {' '.join(map(repr, rest[1:]))}; allowed: flags only, such as "
            "--config=FILE[:arg] --workdir=DIR --mode=MODE (--helpshort lists them)")
  return rest
