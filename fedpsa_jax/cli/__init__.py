"""What the command line promises its user: one line per failure, a distinct exit code, clean signals.

The command (`fedpsa-jax`, or `launch.py` in a clone: fedpsa_lab/launch.py) parses its flags with
`flag_parsing.parse_flags` and runs every mode (`modes`) inside `exit_code_of` (one `except` path, not one per
mode); a notebook gets the same exception types (`fedpsa_jax.errors`) instead. The package's modules, each
importable without side effects:

- `host_devices`: the `--host_devices` count, set in XLA_FLAGS before JAX is imported (stdlib only);
- `flag_parsing`: absl's flags parser that turns every bad flag or config file into one line;
- `run_name`: run directory names, `<config>[-<arg>]-<YYYYmmdd-HHMMSS>`, and finding a run to resume;
- `modes`: train, profile and sweep (the command adds the analysis package's report, `fedpsa_lab.modes`);
- `sweep_flags`: `--sweep`, a grid over a run config built as a sweep config.

Exit codes (docs/runs.md, the exit-code table):

| code | meaning |
|---|---|
| 0 | done (a run completed, a sweep finished every member, a report was written) |
| 1 | a run diverged or failed, or a sweep member failed |
| 2 | bad input, nothing done: a flag, a config file or value, the workdir, missing data, a checkpoint that must not or cannot be restored, a damaged output file |
| 3 | an output could not be written (a full disk, a quota): the run stopped with its last checkpoint intact |
| 130 | SIGINT (Ctrl-C): the run stopped, status `interrupted`, resumable (`fedpsa_jax.signals`) |
| 143 | SIGTERM (what batch schedulers send): likewise |

Standard library only: launch.py imports this before JAX.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import traceback
from typing import Any, Callable

from fedpsa_jax import errors

EXIT_OK = 0
EXIT_FAILED = 1  # a run that diverged or failed; a failed sweep member
EXIT_BAD_INPUT = 2
EXIT_CANNOT_WRITE = 3
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # fedpsa_jax/
_REPOSITORY = os.path.dirname(_PACKAGE_DIR.rstrip(os.sep))
_LAUNCH = os.path.join(_REPOSITORY, "launch.py")
# The project's code, not a user's: this package and the analysis package beside it (a path, not an import).
_PROJECT_DIRS = (_PACKAGE_DIR, os.path.join(_REPOSITORY, "fedpsa_lab") + os.sep)


def skip_final_collections() -> None:
  """Makes the interpreter's exit skip the garbage collections it runs over everything still alive.

  With JAX, flax and optax loaded those walk millions of objects: about 0.45 s of every command's exit on a
  quiet 2-core CPU (more on a busy one), a one-line refusal included (benchmarks/command_exit.py).
  `gc.freeze()` moves the live objects where the collector no longer looks; they are freed by the process's end
  as they would have been. Registered before any other exit hook, it runs after all of them (atexit runs its
  hooks last-in, first-out), so every hook sees the usual exit."""
  atexit.register(gc.freeze)


def exit_code_for_signal(signum: int) -> int:
  """128 + the signal number, the shells' convention (130 for SIGINT, 143 for SIGTERM)."""
  return 128 + int(signum)


# --- messages ----------------------------------------------------------------------------------------


def innermost_message(err: BaseException) -> str:
  """The message a user needs from an error raised through library layers (absl's flag parser and
  ml_collections' config loader re-raise what a config file raised, adding a traceback as text): the
  innermost `UserError`'s message if there is one, else the innermost error as 'Type: message', with
  the file and line where it was raised when that is not the project's or a library's code (a config
  file's own bug)."""
  chain = list(errors.exception_chain(err))  # outermost first
  for inner in reversed(chain):
    if isinstance(inner, errors.UserError):
      return _one_message(inner)
  inner = chain[-1]
  text = _one_message(inner)
  where = _user_frame(inner)
  text = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
  return f"{text} ({where})" if where else text


def _one_message(err: BaseException) -> str:
  if isinstance(err, SyntaxError) and err.filename:
    return f"{err.msg} ({err.filename}, line {err.lineno})"
  if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
    return err.args[0]  # (str(KeyError) wraps the message in quotes)
  return str(err).strip()


def _user_frame(err: BaseException) -> str:
  """'file, line N' of the innermost frame of `err` in the user's code (a config file): not a library's,
  this package's or launch.py's."""
  if isinstance(err, SyntaxError):
    return ""  # (its message has the place)
  frames = traceback.extract_tb(err.__traceback__) if err.__traceback__ is not None else []
  for frame in reversed(frames):
    path = os.path.abspath(frame.filename)
    if not ("site-packages" in path or path.startswith(_PROJECT_DIRS) or path == _LAUNCH
            or frame.filename.startswith("<") or path.startswith(sys.prefix)):
      return f"{frame.filename}, line {frame.lineno}"
  return ""


MAX_LINE = 2_000  # the longest error line printed: past it, the middle is left out (`one_line`)


def one_line(text: str) -> str:
  """`text` with its lines joined (a message that lists several problems keeps them, separated by '; '), at most
  MAX_LINE characters: a message that echoes a huge value (a library's, which `validation.shown` did not shorten)
  keeps its start and its end (what is allowed) and says how much it left out."""
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  line = lines[0] + " " + "; ".join(lines[1:]) if len(lines) > 1 and lines[0].endswith(":") else "; ".join(lines)
  if len(line) <= MAX_LINE:
    return line
  head, tail = MAX_LINE * 3 // 5, MAX_LINE // 5
  return f"{line[:head]} … ({len(line) - head - tail:,} characters left out) … {line[-tail:]}"


# --- stdout ------------------------------------------------------------------------------------------


def readable_streams() -> None:
  """stdout and stderr write what their encoding cannot hold as backslash escapes (a non-ASCII --workdir on an
  ASCII terminal, PYTHONIOENCODING=ascii) instead of raising once the run is done."""
  for stream in (sys.stdout, sys.stderr):
    if stream is not None and hasattr(stream, "reconfigure"):
      stream.reconfigure(errors="backslashreplace")


def say(text: str) -> None:
  """Prints a result line on stdout, flushed. A reader that went away (`| head -c 0`, a closed pipe) loses the
  line, never the run's exit code: stdout then goes to the null device for the rest of the process."""
  if sys.stdout is None:  # (started with stdout closed)
    return
  try:
    print(text, flush=True)
  except BrokenPipeError:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def exit_code_of(run: Callable[[], int], *, stderr: Any = None) -> int:
  """Runs `run()` and turns what it raises into one line on stderr and an exit code (see the table
  above); anything else (a bug) propagates with its traceback."""
  stderr = stderr or sys.stderr
  try:
    return run()
  except errors.UserError as err:
    print(err, file=stderr)  # (validation's multi-line list of bad fields stays as written)
    return EXIT_BAD_INPUT
  except errors.Interrupted as err:
    print(f"{err}: stopped (status 'interrupted'); rerun the same command to resume from the last checkpoint",
          file=stderr)
    return exit_code_for_signal(err.signum)
  except KeyboardInterrupt:  # (a SIGINT that arrived before the handlers were installed)
    print("interrupted by SIGINT: stopped; rerun the same command to resume from the last checkpoint", file=stderr)
    return exit_code_for_signal(signal.SIGINT)
  except errors.OutputWriteError as err:
    print(err, file=stderr)
    return EXIT_CANNOT_WRITE
