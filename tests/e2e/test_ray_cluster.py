"""A sweep on a real Ray cluster: a head and a second node started on this machine as processes of their own
(`ray start --head`, `ray start --address=...`, one CPU each), one sweep directory both see. Members run on both nodes, each in a fresh process, and give the local executor's summaries; a node killed
in the middle of a member costs nothing but time: the member runs again on the node left and continues from its
checkpoint. The cluster is stopped by the processes the test started, whatever happens.

Each test runs in a network namespace of its own (`unshare --net`, as root), whose only interface is its loopback
with one more address, PRIVATE_ADDRESS: Ray gives a multi-node cluster a node address that is not 127.0.0.1, and
in that namespace every packet, to whatever address, stays on its loopback. Nothing of the cluster reaches the
machine's own interfaces. Without the rights to make a namespace, the tests are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

import pytest

from fedpsa_jax import io, sweep
from fedpsa_jax.sim import runner
from helpers import _tiny_sweep, process_of, ROOT

ray = pytest.importorskip("ray")

TIMING = set(runner.PROCESS_FIELDS) | {"sweep_action"}
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
START_SECONDS = 120  # a node's start on a busy 2-core machine
# The same authentication for the nodes and this driver whatever the user's ~/.ray holds (a local `ray.init()`
# leaves a token there, which a node started later would require and a joining one would not send).
AUTH = {"RAY_AUTH_MODE": "disabled"}
PRIVATE_ADDRESS = "10.77.0.1"  # the namespace's own address, on its loopback (module docstring)
IN_NAMESPACE = "FEDPSA_TEST_PRIVATE_NETWORK"  # set inside the namespace
NAMESPACE_SETUP = (f"ip link set lo up && ip addr add {PRIVATE_ADDRESS}/32 dev lo && "
                   f"ip route add default dev lo src {PRIVATE_ADDRESS}")


def _run_in_private_network(request: pytest.FixtureRequest) -> bool:
  """Outside the namespace: runs this very test again inside a new one (a pytest of its own) and asserts it passed;
  True. Inside: False, and the test goes on."""
  if os.environ.get(IN_NAMESPACE):
    return False
  if shutil.which("unshare") is None or subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode:
    pytest.skip("needs a network namespace of its own (unshare --net, as root) to keep the cluster off this "
                "machine's interfaces")
  test = f"{request.node.path}::{request.node.name}"
  inner = (f"{NAMESPACE_SETUP} && exec {shlex.quote(sys.executable)} -m pytest -p no:cacheprovider -p no:xdist "
           f"-q {shlex.quote(test)}")
  done = subprocess.run(["unshare", "--net", "sh", "-c", inner], cwd=ROOT, capture_output=True, text=True,
                        env={**os.environ, IN_NAMESPACE: "1"})
  assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
  return True


def _free_port() -> int:
  with socket.socket() as s:
    s.bind((PRIVATE_ADDRESS, 0))
    return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
  """`pid` and every process below it (Ray's workers start sessions of their own: a process group misses them)."""
  children: dict[int, list[int]] = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      with contextlib.suppress(OSError, IndexError, ValueError):
        with open(f"/proc/{entry}/stat") as f:
          children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
  out, todo = [], [pid]
  while todo:
    p = todo.pop()
    out.append(p)
    todo += children.get(p, [])
  return out


def _kill(pid: int) -> None:
  """SIGKILL to `pid` and every process below it, as a machine that loses power."""
  for p in _descendants(pid):
    with contextlib.suppress(ProcessLookupError):
      os.kill(p, signal.SIGKILL)


class Cluster:
  """A head and a worker node on this machine, each a `ray start --block` process the test owns."""

  def __init__(self, root: str):
    self.root, self.port, self.nodes = root, _free_port(), {}
    self.env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "JAX_PLATFORMS": "cpu", "RAY_USAGE_STATS_ENABLED": "0", **AUTH}

  @property
  def address(self) -> str:
    return f"{PRIVATE_ADDRESS}:{self.port}"

  def start(self, name: str, *args: str) -> subprocess.Popen:
    log = open(os.path.join(self.root, f"{name}.log"), "w")
    command = [RAY, "start", "--block", "--num-cpus=1", f"--node-ip-address={PRIVATE_ADDRESS}",
               f"--temp-dir={os.path.join(self.root, name)}", "--object-store-memory=100000000",
               "--disable-usage-stats", *args]
    self.nodes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True)
    return self.nodes[name]

  def wait_for(self, count: int) -> dict[str, str]:
    """{node name: Ray node id} once `count` nodes are alive (the driver joined)."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
      for name, process in self.nodes.items():
        log = open(os.path.join(self.root, f"{name}.log")).read()[-3000:] if process.poll() is not None else ""
        assert process.poll() is None, f"ray start ({name}) ended: {log}"
      if not ray.is_initialized():
        with contextlib.suppress(ConnectionError, RuntimeError):
          ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
      if ray.is_initialized():
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) == count:
          return self._names(alive)
      time.sleep(1)
    raise AssertionError(f"{count} Ray nodes not up after {START_SECONDS} s")

  def _names(self, alive: list[dict]) -> dict[str, str]:
    """Which node is which: a node's sockets are in the --temp-dir its `ray start` was given."""
    return {name: node["NodeID"] for node in alive for name in self.nodes
            if node["RayletSocketName"].startswith(os.path.join(self.root, name) + os.sep)}

  def stop(self) -> None:
    if ray.is_initialized():
      ray.shutdown()
    for process in self.nodes.values():
      _kill(process.pid)
      process.wait(timeout=30)


@contextlib.contextmanager
def _cluster() -> Iterator[Cluster]:
  """A head and a worker node, stopped (every process below each `ray start`) however the block ends. Their
  folders are under a short /tmp path: Ray's socket paths must fit in 107 characters."""
  root = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
  cluster = Cluster(root)
  with pytest.MonkeyPatch.context() as patch:
    for name, value in AUTH.items():
      patch.setenv(name, value)
    try:
      cluster.start("head", "--head", f"--port={cluster.port}", "--include-dashboard=false")
      cluster.start("worker", f"--address={cluster.address}")
      yield cluster
    finally:
      cluster.stop()
      shutil.rmtree(root, ignore_errors=True)


def _same_results(remote: dict[str, dict], local: dict[str, dict], sweep_dirs: tuple[str, str]) -> None:
  assert list(remote) == list(local)
  for name in local:
    assert {k: v for k, v in remote[name].items() if k not in TIMING} == {
        k: v for k, v in local[name].items() if k not in TIMING}, name
    lines = [[{k: v for k, v in r.items() if k not in TIMING}
              for r in io.read_jsonl(os.path.join(d, "runs", name, io.METRICS_FILE))] for d in sweep_dirs]
    assert lines[0] == lines[1] and len(lines[0]) >= 2, name


@pytest.mark.ci
def test_a_sweep_over_two_nodes_gives_the_local_executor_results(tmp_path, request):
  if _run_in_private_network(request):
    return
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  config.seeds = [0, 1]
  local = sweep.run_local(config, str(tmp_path / "local"), log=lambda _: None)
  shared = str(tmp_path / "shared")
  with _cluster() as cluster:
    nodes = cluster.wait_for(2)
    remote = sweep.run_ray(config, shared, cluster.address, sweep.RayResources(cpus=1), log=lambda _: None)
  _same_results(remote, local, (str(tmp_path / "local"), shared))
  ran_on = {name: s["provenance"]["machine"]["ray_node"] for name, s in remote.items()}
  assert set(ran_on.values()) == set(nodes.values()), ran_on  # both nodes ran members, and nothing else did
  processes = [process_of(sweep.member_dir(shared, name)) for name in remote]
  assert len(set(processes)) == len(remote) and os.getpid() not in processes  # a fresh process per member


def _kill_mid_member(cluster: Cluster, shared: str, names: list[str], seen: dict, done: threading.Event) -> None:
  """Waits for a member running on the worker node to have saved a checkpoint, then kills that node; what it
  saw goes into `seen` (the member, the checkpoints then, whether it had finished). Gives up once `done` is set."""
  worker = cluster.nodes["worker"].pid
  while not done.is_set() and "member" not in seen:
    for name in names:
      run_dir = sweep.member_dir(shared, name)
      pid = process_of(run_dir)
      checkpoints = os.path.join(run_dir, "checkpoints")
      steps = [s for s in os.listdir(checkpoints) if s.isdigit()] if os.path.isdir(checkpoints) else []
      if pid and pid in _descendants(worker) and steps:
        seen.update(member=name, steps=sorted(map(int, steps)), finished=io.read_summary(run_dir) is not None)
        _kill(worker)
        break
    time.sleep(0.2)


@pytest.mark.ci
def test_a_node_lost_mid_member_costs_only_time(tmp_path, request):
  """The worker node dies (every process of it, SIGKILL) once a member it runs has saved a checkpoint: the sweep
  finishes, the member ran again on the head and continued from a checkpoint (its summary's provenance says from
  which), and every summary is the local executor's."""
  if _run_in_private_network(request):
    return
  config = _tiny_sweep(("fedbuff", "fedpsa"))
  config.base.sim.virtual_days = 0.03
  config.base.checkpoint.every_days = 0.0025
  local = sweep.run_local(config, str(tmp_path / "local"), log=lambda _: None)
  shared, seen = str(tmp_path / "shared"), {}
  with _cluster() as cluster:
    nodes = cluster.wait_for(2)
    done = threading.Event()
    killer = threading.Thread(target=_kill_mid_member, args=(cluster, shared, list(local), seen, done), daemon=True)
    killer.start()
    try:
      remote = sweep.run_ray(config, shared, cluster.address, sweep.RayResources(cpus=1), log=lambda _: None)
    finally:
      done.set()
      killer.join(timeout=30)
    assert seen, "no member on the worker node saved a checkpoint before the sweep ended"
    assert cluster.nodes["worker"].poll() is not None  # the node is gone
  assert not seen["finished"], seen  # killed in the middle of a member
  _same_results(remote, local, (str(tmp_path / "local"), shared))
  killed = remote[seen["member"]]["provenance"]
  assert killed["machine"]["ray_node"] == nodes["head"]
  # (a checkpoint at least as late as the first one it had when the node died)
  assert killed["resumed_from_day"] is not None and round(killed["resumed_from_day"] * 86400) >= seen["steps"][0], (
      killed, seen)
