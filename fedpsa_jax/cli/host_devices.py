"""`--host_devices=D`: the number of CPU devices XLA creates, set in XLA_FLAGS before JAX is imported.

XLA reads the flag once per process, when JAX starts, so launch.py calls `force_host_devices` before its
other imports; this module is standard library only for that reason.

On a CPU, host devices let clients train at the same time (runtime.execution=loop); XLA:CPU runs each
convolution on one core, so one device leaves a core idle. The default 2 is one client device per core of
a 2-core machine, the first also the server's; docs/performance.md ("Host devices") has the measurements
against a third device that only serves. On more cores, try one device per core. GPU runs are unaffected
(their devices are the GPUs). An XLA_FLAGS that already sets the count wins.
"""

from __future__ import annotations

import os

DEFAULT = 2


def max_host_devices() -> int:
  """The most `--host_devices` allowed: 4 per core. Each host device is a client trainer; beyond the cores
  they only wait for one, and XLA builds every one of them (a thread pool and its buffers) at start."""
  return 4 * (os.cpu_count() or 1)


def force_host_devices(argv: list[str], default: int = DEFAULT) -> int:
  """Sets XLA_FLAGS for the last `--host_devices=D` in argv (else `default`) and returns the count asked for.

  A bad value (not a number, too many) counts as the default here: the flag's own validator reports it
  once flags are parsed, still before JAX runs anything."""
  count = default
  for arg in argv:
    if arg.startswith("--host_devices="):
      value = arg.split("=", 1)[1]
      count = int(value) if value.isdigit() and 1 <= int(value) <= max_host_devices() else count
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if count > 1 and "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={count}".strip()
  return count
