"""Peak resident memory (RSS) and wall time of the default job, whole processes, as a user runs it.

    python benchmarks/peak_memory.py [--methods=fedbuff,fedpsa] [--repeats=2] [--days=0.08]
                                     [--host_devices=2] [--allocator=auto] [--overrides=runtime.trim_heap=True,...]
                                     [--env=MALLOC_ARENA_MAX=2,...]

Each (method, repeat) is one `launch.py --config=configs/default.py` process (the embedded MNIST, 50
clients, Dirichlet α = 0.1, the MNIST CNN, 10 in flight; FedBuff is the job FLGo was measured on, FedPSA
the default job itself), its peak RSS read from the kernel's accounting of that child (`os.wait4`), so
the figure is what `/usr/bin/time -v` reports. Runs alternate between methods, so that a drift of the
machine affects both alike. Printed per run: peak RSS, wall seconds, client updates, final accuracy; then
per method the median. The bar: FLGo's ~0.73-0.74 GB on the FedBuff job (FLGo 0.4.4, two torch threads, on a
2-core x86-64 CPU). Peak RSS varies between runs of one config by ~±50 MB (when
the host dispatches relative to the devices), so compare medians of several repeats.

`--allocator`: the C allocator of the runs, preloaded here into each child (`LD_PRELOAD`; launch.py itself
leaves the allocator to whoever starts it, docs/performance.md "Memory"). `auto` (the default) measures
tcmalloc where this machine has it (Debian/Ubuntu: libtcmalloc-minimal4), `tcmalloc` stops when it is
missing, `system` measures glibc's malloc; glibc's tunables go in `--env`, e.g. the mapping threshold of
docs/performance.md:
`--allocator=system --env=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304:glibc.malloc.hugetlb=1`.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags, defined only when run as a script: another benchmark imports this module
  (`measured_child`) beside its own flags of the same names (`repeats`)."""
  flags.DEFINE_list("methods", ["fedbuff", "fedpsa"], "methods to run")
  flags.DEFINE_integer("repeats", 2, "runs per method")
  flags.DEFINE_float("days", 0.08, "virtual days per run (the default job's budget)")
  flags.DEFINE_integer("host_devices", 2, "launch.py --host_devices")
  flags.DEFINE_enum("allocator", "auto", ["auto", "tcmalloc", "system"],
                    "the runs' C allocator: tcmalloc (preloaded), glibc's malloc (system), or tcmalloc when found (auto)")
  flags.DEFINE_list("overrides", [], "config fields for every run, as field=value (e.g. runtime.trim_heap=True)")
  flags.DEFINE_list("env", [], "extra KEY=VALUE environment variables for the runs (experiments)")


def allocator_environment(choice: str, environ: dict[str, str], tcmalloc: str | None) -> dict[str, str]:
  """`environ` for a child that runs with the allocator `choice`, `tcmalloc` the library found (None: none).

  Preloading is the only way to swap the C allocator of a process that is already running Python, so it is
  set in the child's environment: any tcmalloc in an inherited LD_PRELOAD is dropped first, so that `system`
  measures glibc's malloc whatever the shell preloads."""
  preload = [lib for lib in environ.get("LD_PRELOAD", "").split() if "tcmalloc" not in os.path.basename(lib)]
  if choice == "tcmalloc" and tcmalloc is None:
    raise SystemExit("--allocator=tcmalloc: no tcmalloc library found (Debian/Ubuntu: apt-get install "
                     "libtcmalloc-minimal4); allowed: auto or system")
  env = {k: v for k, v in environ.items() if k != "LD_PRELOAD"}
  if choice in ("auto", "tcmalloc") and tcmalloc is not None:
    preload.append(tcmalloc)
    # (tcmalloc reports each allocation over 1 GiB on stderr; a run's stderr is for its errors)
    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(2**60))
  if preload:
    env["LD_PRELOAD"] = " ".join(preload)
  return env


def find_tcmalloc() -> str | None:
  """The system's tcmalloc library (a name the dynamic loader resolves), or None."""
  return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def measured_child(command: list[str], env: dict[str, str], cwd: str = ROOT) -> tuple[int, float, float, str]:
  """Runs `command` in `cwd` (default: the repository root): its exit code, wall seconds, peak RSS in MB (the
  kernel's accounting of that child, `os.wait4`: what `/usr/bin/time -v` reports) and stderr."""
  # stderr to a file, not a pipe: nothing reads a pipe while wait4 waits, and a full one would stall the run.
  with tempfile.TemporaryFile("w+") as log:
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)  # (so that Popen does not wait for it again)
    log.seek(0)
    stderr = log.read()
  scale = 1 if sys.platform == "darwin" else 1024  # (ru_maxrss is in KiB on Linux, bytes on macOS)
  return child.returncode, wall, usage.ru_maxrss * scale / 2**20, stderr


def run_once(method: str, workdir: str) -> dict:
  env = dict(os.environ, **dict(kv.split("=", 1) for kv in FLAGS.env))
  env = allocator_environment(FLAGS.allocator, env, find_tcmalloc())
  command = [sys.executable, os.path.join(ROOT, "launch.py"), "--config=" + os.path.join(ROOT, "configs/default.py"),
             f"--host_devices={FLAGS.host_devices}", f"--config.method={method}",
             "--config.runtime.progress=False",
             f"--config.sim.virtual_days={FLAGS.days}", f"--workdir={workdir}"] + [
                 f"--config.{field}" for field in FLAGS.overrides]
  code, wall, peak_mb, stderr = measured_child(command, env)
  if code != 0:
    raise SystemExit(f"{method}: launch.py failed:\n{stderr[-2000:]}")
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  return {"method": method, "peak_rss_mb": peak_mb, "wall_s": wall,
          "updates": summary["client_updates"], "final_accuracy": summary["final_test_accuracy"]}


def main(argv):
  del argv
  preload = allocator_environment(FLAGS.allocator, dict(os.environ), find_tcmalloc()).get("LD_PRELOAD")
  print(f"allocator: {preload or 'glibc malloc'}")
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(FLAGS.repeats):
      for method in FLAGS.methods:
        row = run_once(method, os.path.join(tmp, f"{method}-{repeat}"))
        rows.append(row)
        print(f"{method:10s} run {repeat + 1}: peak RSS {row['peak_rss_mb']:7.0f} MB  wall {row['wall_s']:6.1f} s  "
              f"{row['updates']} updates  final acc {row['final_accuracy']:.4f}", flush=True)
  print()
  for method in FLAGS.methods:
    mine = [r for r in rows if r["method"] == method]
    print(f"{method:10s} median of {len(mine)}: peak RSS {statistics.median(r['peak_rss_mb'] for r in mine):7.0f} MB  "
          f"wall {statistics.median(r['wall_s'] for r in mine):6.1f} s")


if __name__ == "__main__":
  define_flags()
  app.run(main)
