"""What a launch.py command spends starting and exiting, apart from its work: a flag refused at once.

    python benchmarks/command_exit.py [--repeats=5]

Times, in fresh processes taking turns, `launch.py` refusing a stray argument (its whole life: importing JAX,
flax, optax and the analysis' libraries, parsing the flags, one line, exit 2), and the same process with the
interpreter's final garbage collections left on (`cli.skip_final_collections` made a no-op). The difference is
what `skip_final_collections` saves on every command's exit. Prints the median and range of each, in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# launch.py with `skip_final_collections` replaced by a no-op before launch.py calls it.
_WITH_COLLECTIONS = ("import runpy, sys; from fedpsa_jax import cli; cli.skip_final_collections = lambda: None; "
                     "sys.argv = ['launch.py', 'stray']; runpy.run_path('launch.py', run_name='__main__')")
COMMANDS = {
    "launch.py stray (as shipped)": [sys.executable, "launch.py", "stray"],
    "the same, final collections on": [sys.executable, "-c", _WITH_COLLECTIONS],
}


def seconds(argv: list[str]) -> float:
  start = time.perf_counter()
  done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  elapsed = time.perf_counter() - start
  if done.returncode != 2 or "unexpected argument" not in done.stderr:
    raise SystemExit(f"{argv}: expected the one-line refusal, got exit {done.returncode}: {done.stderr[-500:]}")
  return elapsed


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5, help="processes per command, taking turns")
  args = parser.parse_args()
  times: dict[str, list[float]] = {name: [] for name in COMMANDS}
  for _ in range(args.repeats):
    for name, argv in COMMANDS.items():
      times[name].append(seconds(argv))
  for name, values in times.items():
    print(f"{name:34s} median {statistics.median(values):.2f} s  (range {min(values):.2f}-{max(values):.2f}, "
          f"{len(values)} processes)")


if __name__ == "__main__":
  main()
