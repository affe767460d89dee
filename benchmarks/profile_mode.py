"""Wall time and peak RSS of `launch.py --mode=profile` on the default job, whole processes, and what its trace holds.

    python benchmarks/profile_mode.py [--variants=table,trace,pieces] [--pieces=sgd_step,server_step]
                                      [--repeats=1] [--root=DIR]

Each variant is one `launch.py --config=configs/default.py --mode=profile` process (the embedded MNIST, the
paper's CNN, FedPSA: every piece of docs/profiling.md's table): `table` as it is, `trace` with `--profile_trace`,
`pieces` with `--profile_pieces=PIECES` only. Its peak RSS is the kernel's accounting of that child (`os.wait4`,
what `/usr/bin/time -v` reports; `peak_memory.measured_child`); the variants alternate within each repeat, so that
a drift of the machine affects them alike. For a trace it also prints the trace folder's size, its Perfetto
file's size and events, and the table's pieces that have no slice of their name there (none, unless JAX's
event cap cut it: the run then warns in one line, also printed).

`--root`: the checkout whose launch.py runs (default: this one), with this interpreter; e.g. an older commit
unpacked elsewhere (`git archive COMMIT | tar -x -C DIR`), to measure before and after side by side.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import tempfile

from absl import app, flags

import peak_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_list("variants", ["table", "trace", "pieces"], "table, trace (--profile_trace), pieces (--profile_pieces)")
flags.DEFINE_list("pieces", ["sgd_step", "server_step"], "the pieces of the `pieces` variant")
flags.DEFINE_integer("repeats", 1, "runs per variant")
flags.DEFINE_string("root", ROOT, "the checkout whose launch.py runs")
FLAGS = flags.FLAGS


def command(variant: str, workdir: str) -> list[str]:
  extra = {"table": [], "trace": ["--profile_trace"], "pieces": [f"--profile_pieces={','.join(FLAGS.pieces)}"]}
  return [sys.executable, os.path.join(FLAGS.root, "launch.py"), "--config=configs/default.py", "--mode=profile",
          f"--workdir={workdir}", *extra[variant]]


def trace_contents(workdir: str) -> str:
  """The trace folder's size, its Perfetto file's size and events, and the table's pieces it has no slice of."""
  folder = os.path.join(workdir, "trace")
  total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)
  perfetto, = glob.glob(os.path.join(folder, "plugins", "profile", "*", "perfetto_trace.json.gz"))
  with gzip.open(perfetto, "rt") as f:
    events = json.load(f)["traceEvents"]
  with open(os.path.join(workdir, "profile.json")) as f:
    pieces = dict.fromkeys(r["piece"] for r in json.load(f)["rows"])
  slices = {e.get("name") for e in events if e.get("ph") == "X"}
  missing = [p for p in pieces if p not in slices] or ["none"]
  return (f"trace folder {total / 1e6:.1f} MB, perfetto_trace.json.gz {os.path.getsize(perfetto) / 1e6:.1f} MB, "
          f"{sum(e.get('ph') not in (None, 'M') for e in events):,} events; of its {len(pieces)} pieces without a "
          f"slice: {', '.join(missing)}")


def main(argv):
  del argv
  print(f"launch.py of {FLAGS.root}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start")
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(FLAGS.repeats):
      for variant in FLAGS.variants:
        workdir = os.path.join(tmp, f"{variant}-{repeat}")
        code, wall, peak_mb, stderr = peak_memory.measured_child(command(variant, workdir), dict(os.environ),
                                                                 cwd=FLAGS.root)
        if code != 0:
          raise SystemExit(f"{variant}: launch.py failed ({code}):\n{stderr[-2000:]}")
        print(f"{variant:7s} run {repeat + 1}: wall {wall / 60:5.1f} min  peak RSS {peak_mb:6,.0f} MB  "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        if variant == "trace":
          print(f"        {trace_contents(workdir)}", flush=True)
          for line in stderr.splitlines():
            if line.startswith("warning:"):
              print(f"        {line}", flush=True)


if __name__ == "__main__":
  app.run(main)
