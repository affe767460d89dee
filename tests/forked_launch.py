"""launch.py in a child forked from one process that has already imported its libraries (tests only).

A launch.py process spends about 2.5 s importing JAX, flax, optax and the analysis' libraries before it reads
a flag; the refusal tests (a bad flag, field, value or workdir: exit 2 and one line, before any work) run
several dozen of them, and the signal and SIGKILL tests a few dozen short runs. A server process (this file
run as a script, one per xdist worker) imports those libraries, but starts no JAX backend, and forks on
request; the child runs launch.py as `__main__` with the given arguments and its stdout and stderr in files,
and exits as `python launch.py ...` would (its exit code, a traceback if one escapes). So each is a real
launch.py process, minus the import. `launch` runs one to its end (a `subprocess.run`); `start` returns a
`Child` to poll, signal, kill and wait for (a `subprocess.Popen`).

What it leaves out, and what still uses plain subprocesses: a stop while the libraries load, and anything
that needs an environment other than the test session's (the server's environment is fixed when it starts).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
LAUNCH = os.path.join(ROOT, "launch.py")


class _Server:
  """The server process of this xdist worker, and its replies read line by line (unbuffered: `select` must see
  every line that has not been read yet)."""

  def __init__(self):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__)], cwd=ROOT, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    atexit.register(self.process.kill)
    self._pending = b""
    self.child: Child | None = None  # the child it waits for (one at a time)

  def send(self, request: dict) -> None:
    self.process.stdin.write((json.dumps(request) + "\n").encode())
    self.process.stdin.flush()

  def reply(self, timeout: float | None) -> dict | None:
    """The next reply, or None if none came within `timeout` seconds (None: wait for it)."""
    while b"\n" not in self._pending:
      ready, _, _ = select.select([self.process.stdout], [], [], timeout)
      chunk = os.read(self.process.stdout.fileno(), 65536) if ready else None
      if chunk is None:
        return None
      if not chunk:
        raise RuntimeError("the forked-launch server ended")
      self._pending += chunk
    line, self._pending = self._pending.split(b"\n", 1)
    return json.loads(line)


_server: _Server | None = None


class Child:
  """One launch.py child of the server, used like a `subprocess.Popen` whose stdout and stderr (text) are read
  when it has ended."""

  def __init__(self, server: _Server, args: list[str], cwd: str):
    self._server, self.args, self.returncode = server, [LAUNCH, *args], None
    self._folder = tempfile.mkdtemp(prefix="forked-launch-")
    server.send({"args": args, "cwd": str(cwd), "stdout": os.path.join(self._folder, "stdout"),
                 "stderr": os.path.join(self._folder, "stderr")})
    self.pid = server.reply(60)["pid"]
    server.child = self

  def poll(self) -> int | None:
    return self.returncode if self.returncode is not None else self._collect(0)

  def wait(self, timeout: float | None = None) -> int:
    if self.returncode is None and self._collect(timeout) is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def send_signal(self, signum: int) -> None:
    if self.poll() is None:  # (as Popen: never a pid the server has already reaped)
      os.kill(self.pid, signum)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout: float | None = None) -> tuple[str, str]:
    """Waits for the end (killing the child if it outlives `timeout`); its stdout and stderr."""
    try:
      self.wait(timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      self.wait()
      raise
    with open(os.path.join(self._folder, "stdout")) as out, open(os.path.join(self._folder, "stderr")) as err:
      streams = out.read(), err.read()
    shutil.rmtree(self._folder, ignore_errors=True)
    return streams

  def _collect(self, timeout: float | None) -> int | None:
    reply = self._server.reply(timeout)
    if reply is not None:
      self.returncode, self._server.child = reply["returncode"], None
    return self.returncode


def start(*args: str, cwd: str = ROOT) -> Child:
  """`python launch.py *args` started in `cwd`, as a child of this worker's server (started on first use)."""
  global _server
  if _server is None or _server.process.poll() is not None:
    _server = _Server()
  if _server.child is not None:  # (left running by a test that failed: the server waits for it)
    _server.child.kill()
    _server.child.communicate()  # (its reply read, its output folder removed)
  return Child(_server, list(args), cwd)


def launch(*args: str, cwd: str = ROOT, timeout: float = 240) -> subprocess.CompletedProcess:
  """`python launch.py *args` in `cwd`, run to its end: its exit code, stdout and stderr (text)."""
  child = start(*args, cwd=cwd)
  stdout, stderr = child.communicate(timeout)
  return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def _serve() -> None:
  """Reads one request per line on stdin; answers {"pid": ...} at the fork and {"returncode": ...} at the end."""
  sys.path[0] = ROOT  # what `python launch.py` puts first
  # launch.py's imports, without running it: no backend starts, so no JAX thread exists to be forked.
  import absl.app  # noqa: F401
  import ml_collections.config_flags  # noqa: F401

  import fedpsa_jax.cli.flag_parsing  # noqa: F401
  import fedpsa_jax.cli.host_devices  # noqa: F401
  import fedpsa_jax.cli.modes  # noqa: F401
  import fedpsa_jax.cli.sweep_flags  # noqa: F401
  import fedpsa_jax.signals  # noqa: F401
  import fedpsa_jax.sweep  # noqa: F401
  import fedpsa_lab.launch  # noqa: F401  (its flags are defined when it runs, in the child)
  import fedpsa_lab.modes  # noqa: F401

  reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _become_launch(request, reply)
      return  # (not reached: launch.py exits)
    reply.write(json.dumps({"pid": pid}) + "\n")
    reply.flush()
    _, status = os.waitpid(pid, 0)
    reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    reply.flush()


def _become_launch(request: dict, reply) -> None:
  """In the child: launch.py's streams, directory and arguments, then launch.py itself. Its SystemExit (or any
  exception) leaves through the server's top level, so the interpreter exits as launch.py's own would."""
  reply.close()
  for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                          (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
    opened = os.open(path, flags, 0o644)
    os.dup2(opened, fd)
    os.close(opened)
  os.chdir(request["cwd"])
  sys.argv = [LAUNCH, *request["args"]]
  sys.path[0] = ROOT
  import runpy

  runpy.run_path(LAUNCH, run_name="__main__")


if __name__ == "__main__":
  _serve()
