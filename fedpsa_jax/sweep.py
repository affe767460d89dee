"""Sweeps: one config describes a grid of full run configs; run it locally or on Ray, resumably.

A sweep config (`configs/paper/*.py`, `get_config(arg)`) is a ConfigDict with:

- `name`: the sweep's name (also the report's title);
- `base`: the run config every member starts from (`config.base_config()` plus changes);
- `axes`: a list of `(axis_name, [(label, {dotted_field: value, ...}), ...])`: the members are the
  product of the axes, each member the base with the overrides of one label per axis applied (an axis
  value may set several fields, e.g. a dataset and its model, or an ablation's two switches);
- `exclude`: a list of `{axis_name: label}`; a member matching every item of one of them is left out
  (FedPAC on the linear model);
- `seeds`: every member is repeated once per seed (the run field `seed`);
- `report`: the layout `fedpsa_lab.report` draws (see there).

Every member is a full run config that must pass `config.validate`, and has a stable directory name
made of its labels, `method=fedpsa,dataset=cifar10,alpha=0.1,seed=0`, under `SWEEP_DIR/runs/`. Both
executors run each member with the same function, `run_member`, which skips a member whose
summary.json says `completed` for this very run (`is_done`: the same run identity, `run_identity.run_identity`,
and the same budget) and otherwise lets `Simulation` continue it from its own checkpoint (or start it):
an interrupted sweep rerun with the same command redoes nothing finished, and a field added to another
method's section since then reruns nothing. Both run every member's first seed before any second one
(`run_order`): a sweep stopped partway has whole seeds to report.
`SWEEP_DIR/sweep.json` holds the sweep config and the member list, which is all the report needs.
With a records directory (`--records=DIR`), each finished member's record (`RECORD_FILES`: its config, summary,
metrics and events, not its checkpoints) is also kept in DIR/runs/<member>, and a member whose record there is
done for its config starts done (`restore_records`): DIR, small enough to commit, is a sweep directory the report
reads, and it carries a sweep's finished members to a fresh machine (docs/results.md keeps its sweeps so).
A running sweep holds `SWEEP_DIR/.lock` (`locked`) from writing sweep.json to its last member: a second
sweep on the same directory is refused at once (ConfigError), never run beside it. Before any of that, a symbolic
link among what the sweep writes in either directory (`SWEEP_WRITES`, `RECORDS_WRITES`: every member's files
included) is refused (`check_dirs`), and records are copied with links kept as links: a record's file linked
elsewhere never brings the file it points to into a sweep or a records directory.
Both executors hand their members' outcomes to one loop (`_collect`: failures, a full disk, records, the log).
On Ray each member is a task of its own process that asks for `RayResources` (CPUs, a share of one GPU with JAX's
memory capped to it) and runs again, from its checkpoint, when its node is lost (docs/reproducing.md, "On a
cluster").

Expanding a sweep imports no JAX by itself; validating its members loads the strategies (which do).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import math
import os
import re
import shutil
import time
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Sequence

import ml_collections

from fedpsa_jax import config as config_lib
from fedpsa_jax import compilation_cache as compilation_cache_lib
from fedpsa_jax import io, run_identity
from fedpsa_jax.data import fingerprint
from fedpsa_jax.errors import ConfigError, DamagedRunFile, OutputWriteError, is_write_limit
from fedpsa_jax.validation import INT64_MAX

SWEEP_FILE = "sweep.json"
RECORD_FILES = (io.CONFIG_FILE, io.SUMMARY_FILE, io.METRICS_FILE, io.EVENTS_FILE)  # what `is_done` and a report read
# The record files a records directory keeps compressed (`io.compress_jsonl`: FILE.xz, read as FILE by `io`): the
# per-evaluation and per-update logs, nearly all of a record's bytes. A record written plain (by an earlier version,
# or copied in by hand) is read the same; `compress_records` converts one.
COMPRESSED_FILES = (io.METRICS_FILE, io.EVENTS_FILE)
FINISHED = ("completed", "diverged")  # the run statuses whose record is kept (`save_record`)
LOCK_FILE = io.LOCK_FILE
RUNS_DIR = "runs"
EXECUTORS = ("local", "ray")
# What a sweep writes, moves or deletes in its directory and in a records directory (the folders with all they
# hold: every member's run directory): none may be a symbolic link (`io.refuse_links`).
SWEEP_WRITES = (LOCK_FILE, SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX, RUNS_DIR)
RECORDS_WRITES = (SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX, RUNS_DIR)
_LABEL = re.compile(r"^[A-Za-z0-9._+-]+$")  # labels become directory names: keep them portable
# Every member is a full run (minutes to days) expanded, validated and listed in sweep.json before the first
# one starts: beyond these counts a sweep is a typo (`seeds=1e9`), refused before anything is expanded. The
# paper's largest grid (Table 1) has 120 members per seed.
MAX_SEEDS = 1_000
MAX_MEMBERS = 10_000

Axis = tuple[str, Sequence[tuple[Any, dict[str, Any]]]]


@dataclasses.dataclass(frozen=True)
class Member:
  """One run of a sweep: its labels per axis (and seed), its overrides and its full run config."""

  name: str  # directory name under SWEEP_DIR/runs, from the labels: 'method=fedpsa,alpha=0.1,seed=0'
  labels: dict[str, Any]  # axis name -> label, plus 'seed'
  overrides: dict[str, Any]  # dotted field -> value, applied to the sweep's base (seed included)
  config: ml_collections.ConfigDict

  def as_json(self) -> dict[str, Any]:
    return {"name": self.name, "labels": self.labels, "overrides": self.overrides}


def axis(name: str, values: Sequence[Any], field: str | None = None,
         extra: Callable[[Any], dict[str, Any]] | None = None) -> Axis:
  """An axis whose labels are `values`, each setting `field` (default: `name`) to the value, plus the
  fields `extra(value)` returns (e.g. the model that goes with a dataset)."""
  return (name, [(v, {field or name: v, **(extra(v) if extra else {})}) for v in values])


def is_sweep_config(c: Any) -> bool:
  return isinstance(c, ml_collections.ConfigDict) and all(k in c for k in ("name", "base", "axes", "seeds"))


def member_name(labels: dict[str, Any]) -> str:
  return ",".join(f"{k}={v}" for k, v in labels.items())


def expand(sweep: ml_collections.ConfigDict) -> list[Member]:
  """The members of a sweep, in axis order (the last axis fastest, seeds innermost), each validated.

  Raises ConfigError naming the member and field when a member's config is invalid, a label cannot
  be a directory name, or two members would share a directory.
  """
  if not is_sweep_config(sweep):
    raise ConfigError("a sweep config needs the fields name, base, axes, seeds (see fedpsa_jax/sweep.py)")
  axes = [(str(name), list(values)) for name, values in sweep.axes]
  # `parts`: a union of grids, [(part_label, more_axes), ...]; each part is the product of `axes` and its
  # own axes, labelled `part=<label>` (Fig. 4: the γ×δ grid beside the L_s×L_q grid).
  parts = [(label, [("part", [(label, {})]), *axes, *[(str(n), list(v)) for n, v in more]])
           for label, more in sweep.get("parts", [])] or [(None, axes)]
  excludes = [dict(e) for e in sweep.get("exclude", [])]
  seeds = sweep.seeds
  if (not isinstance(seeds, (list, tuple)) or not 1 <= len(seeds) <= MAX_SEEDS
      or not all(isinstance(s, int) and 0 <= s <= INT64_MAX for s in seeds)):
    shown = seeds if not isinstance(seeds, (list, tuple)) or len(seeds) <= 10 else f"[{len(seeds)} seeds]"
    raise ConfigError(f"sweep seeds={shown!r} is invalid; allowed: a list of 1 to {MAX_SEEDS:,} integers in "
                      f"[0, {INT64_MAX}]")
  seeds = list(seeds)
  count = sum(math.prod(len(values) for _, values in part_axes) for _, part_axes in parts) * len(seeds)
  if count > MAX_MEMBERS:  # (before the members are expanded; excluded ones counted too)
    raise ConfigError(f"sweep {sweep.name!r} has {count:,} members ({len(seeds)} seeds); allowed: at most "
                      f"{MAX_MEMBERS:,} (fewer seeds or axis values, or several sweeps)")
  members, names = [], set()
  combos = [(part_axes, combo) for _, part_axes in parts
            for combo in itertools.product(*(values for _, values in part_axes))]
  for axes, combo in combos:
    labels = {name: label for (name, _), (label, _) in zip(axes, combo)}
    if any(all(labels.get(k) == v for k, v in e.items()) for e in excludes):
      continue
    for seed in seeds:
      overrides: dict[str, Any] = {}
      for _, fields in combo:
        overrides.update(fields)
      overrides["seed"] = seed
      full_labels = {**labels, "seed": seed}
      name = member_name(full_labels)
      bad = [str(v) for v in full_labels.values() if not _LABEL.match(str(v))]
      if bad:
        raise ConfigError(f"sweep {sweep.name!r}: label(s) {bad} cannot be part of a directory name; "
                                     "allowed: letters, digits and . _ + -")
      if name in names:
        raise ConfigError(f"sweep {sweep.name!r}: two members are both named {name!r}")
      names.add(name)
      config = copy.deepcopy(sweep.base)
      try:
        config_lib.set_fields(config, overrides)
      except ConfigError as err:
        raise ConfigError(f"sweep {sweep.name!r}, member {name}: {err}") from None
      errors = config_lib.config_errors(config)
      if errors:
        raise ConfigError(f"sweep {sweep.name!r}, member {name}: invalid config:\n  " + "\n  ".join(errors))
      members.append(Member(name, full_labels, overrides, config))
  return members


def run_order(members: Sequence[Member]) -> list[Member]:
  """The order a sweep runs its members in: every member's first seed before any second one (axis order within a
  seed), so that a sweep stopped partway holds whole seeds of every member, a table with an interval over the
  seeds done, rather than all seeds of the first members and nothing of the rest."""
  position = {seed: i for i, seed in enumerate(dict.fromkeys(m.labels["seed"] for m in members))}
  return sorted(members, key=lambda m: position[m.labels["seed"]])


def member_dir(sweep_dir: str, member: Member | str) -> str:
  return os.path.join(sweep_dir, RUNS_DIR, member if isinstance(member, str) else member.name)


def write_sweep_json(sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str) -> str:
  """SWEEP_DIR/sweep.json: the sweep config (its base as config.json holds a run config) and members.
  OutputWriteError when it cannot be written (a full disk)."""
  path = os.path.join(sweep_dir, SWEEP_FILE)
  try:
    os.makedirs(os.path.join(sweep_dir, RUNS_DIR), exist_ok=True)
    io.write_json_atomic(path, {"sweep": io.config_json(sweep), "members": [m.as_json() for m in members]})
  except OSError as err:
    raise OutputWriteError.of(err, err.filename or path) from None
  return path


@contextlib.contextmanager
def locked(sweep_dir: str, name: str = "") -> Iterator[None]:
  """Holds SWEEP_DIR/.lock inside the block: the sweep's claim on its directory (`io.claim`, the claim a
  run's `io.RunDir.lock` takes too). ConfigError at once if another sweep (or a run) holds it: two sweeps
  writing sweep.json and running the same members into the same run directories would collide."""
  try:
    os.makedirs(sweep_dir, exist_ok=True)
  except OSError as err:
    raise OutputWriteError.of(err, sweep_dir) from None
  owner = f"sweep {name}, pid {os.getpid()}" if name else f"sweep, pid {os.getpid()}"
  f = io.claim(os.path.join(sweep_dir, LOCK_FILE), owner, lambda holder: (
      f"--workdir={sweep_dir!r} is in use by another sweep or run ({holder}); allowed: a sweep directory no "
      "running sweep uses (wait for that one to end: rerunning the same command then resumes it), or another "
      "--workdir"))
  try:
    yield
  finally:
    f.close()  # releases the claim


def read_sweep_json(sweep_dir: str) -> dict[str, Any]:
  """SWEEP_DIR/sweep.json: {'sweep': the sweep config, 'members': [{name, labels, overrides}]}; DamagedRunFile
  naming what is missing when the file is not one `write_sweep_json` wrote (another tool's sweep.json)."""
  path = os.path.join(sweep_dir, SWEEP_FILE)
  contract = ("a sweep.json as --mode=sweep writes it: an object with 'sweep' (the sweep config: name, axes, ...) "
              "and 'members' (a list of objects with a 'name' and 'labels')")
  saved = io.read_json_object(path, contract)
  sweep, members = saved.get("sweep"), saved.get("members")
  problem = ("its 'sweep' is not an object with 'name' and a list 'axes'"
             if not (isinstance(sweep, dict) and "name" in sweep and isinstance(sweep.get("axes"), list)) else
             "its 'members' is not a list of objects with a string 'name' and an object 'labels'"
             if not (isinstance(members, list) and all(isinstance(m, dict) and isinstance(m.get("name"), str)
                                                        and isinstance(m.get("labels"), dict) for m in members)) else
             None)
  if problem:
    raise DamagedRunFile(f"{path}: {problem}; allowed: {contract}")
  return saved


def is_done(config_json: dict[str, Any], run_dir: str) -> bool:
  """Whether `run_dir` holds a completed run of this config (JSON form), so it can be skipped: the same
  run identity (`run_identity.identity_differences`: shared sections and the method's own section) and the same
  budget. A completed run with a smaller `sim.virtual_days` is not done: `Simulation` extends it. With `data.path`,
  the content must be the same too (`data.fingerprint`, computed here as the run computes it)."""
  summary, saved = io.read_summary(run_dir), io.read_config(run_dir)
  if not summary or summary.get("status") != "completed" or saved is None:
    return False
  same_budget = saved.get("sim", {}).get("virtual_days") == config_json["sim"]["virtual_days"]
  return same_budget and not run_identity.identity_differences(saved, fingerprint.pinned_json(config_json))


def run_member(config_json: dict[str, Any], run_dir: str, compilation_cache: str | None = None) -> dict[str, Any]:
  """Runs one member into `run_dir` unless it is done there; returns its summary.json as read back,
  with `sweep_action` 'ran' or 'skipped'.

  The one function both executors call (the Ray task sends the config as JSON), so both leave the same
  run directories and give the same summaries. A partial run directory continues from its checkpoint.
  `compilation_cache`: a directory for `compilation_cache.enable` (None: leave JAX as configured).
  """
  io.refuse_link_made(os.path.dirname(run_dir))  # (SWEEP_DIR/runs, checked at the start, made a link since: exit 3)
  if is_done(config_json, run_dir):  # (before JAX is imported: a Ray task's fresh process skips it cheaply)
    return {**io.read_summary(run_dir), "sweep_action": "skipped"}
  from fedpsa_jax.sim import runner  # imported here: expanding a sweep needs no JAX

  if compilation_cache:
    compilation_cache_lib.enable(compilation_cache)
  config = ml_collections.ConfigDict(config_json)
  runner.Simulation(config, run_dir).run()
  return {**io.read_summary(run_dir), "sweep_action": "ran"}


def check_records_dir(records_dir: str, sweep: ml_collections.ConfigDict, sweep_dir: str) -> None:
  """ConfigError before any work when `records_dir` cannot keep this sweep's records: it is the sweep directory
  itself, a file, or the records of another sweep (its sweep.json names another one)."""
  if os.path.realpath(records_dir) == os.path.realpath(sweep_dir):
    raise ConfigError(f"--records={records_dir!r} is the sweep directory itself; allowed: another directory (the "
                      "records are a copy of the finished members, without their checkpoints)")
  if os.path.lexists(records_dir) and not os.path.isdir(records_dir):
    raise ConfigError(f"--records={records_dir!r} is not a directory; allowed: a directory (made if missing)")
  # (a member's file linked elsewhere is never copied; records are only copied, never rewritten in place: a hard
  # link there, a `cp -al` backup, is harmless)
  io.refuse_links(records_dir, RECORDS_WRITES, "--records", rewritten=())
  io.check_entry_kinds(records_dir, (SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX), (RUNS_DIR,), "--records",
                       "a sweep", "a records directory")
  if not os.path.exists(os.path.join(records_dir, SWEEP_FILE)):
    return
  try:
    kept = read_sweep_json(records_dir)["sweep"]["name"]
  except (DamagedRunFile, OSError, ValueError) as err:
    raise ConfigError(f"--records={records_dir!r} holds an unreadable {SWEEP_FILE} ({err}); allowed: the "
                      "records directory of this sweep, or a new one") from None
  if kept != sweep.name:
    raise ConfigError(f"--records={records_dir!r} holds the records of sweep {kept!r}, not of {sweep.name!r}; "
                      "allowed: the records directory of this sweep, or a new one")


def check_dirs(sweep: ml_collections.ConfigDict, sweep_dir: str, records_dir: str | None,
               compilation_cache: str | None) -> None:
  """ConfigError before any work when the sweep directory holds an entry the sweep writes through that is a symbolic
  link (`SWEEP_WRITES`, every member's run directory included, and the compilation cache when it lies in there), or
  when `records_dir` cannot keep this sweep's records (`check_records_dir`)."""
  cache = [os.path.relpath(compilation_cache, sweep_dir)] if compilation_cache and os.path.abspath(
      os.path.dirname(compilation_cache)) == os.path.abspath(sweep_dir) else []
  io.refuse_links(sweep_dir, (*SWEEP_WRITES, *cache))
  io.check_entry_kinds(sweep_dir, (LOCK_FILE, SWEEP_FILE, SWEEP_FILE + io.TMP_SUFFIX), (RUNS_DIR,), "--workdir",
                       "a sweep", "a sweep directory")
  if records_dir:
    check_records_dir(records_dir, sweep, sweep_dir)


def save_record(run_dir: str, records_dir: str, name: str) -> bool:
  """Copies a finished member's record (`RECORD_FILES`, not its checkpoints) from `run_dir` to
  records_dir/runs/<name>, replacing an older copy by one rename (a half-written record is never seen).
  Finished: completed, or diverged (a result the report shows). False, copying nothing, for a member not
  finished (running, interrupted, failed). OutputWriteError when it cannot be written."""
  summary = io.read_summary(run_dir)
  if not summary or summary.get("status") not in FINISHED:
    return False
  target = member_dir(records_dir, name)
  fresh, stale = f"{target}.new", f"{target}.old"
  io.refuse_link_made(os.path.dirname(target))  # (RECORDS/runs, checked at the start, made a link since: exit 3)
  try:
    for leftover in (fresh, stale):  # (a copy an interrupted save left)
      shutil.rmtree(leftover, ignore_errors=True)
    os.makedirs(fresh)
    for file in RECORD_FILES:
      if os.path.lexists(os.path.join(run_dir, file)):  # (a link, made since the check, is copied as a link)
        shutil.copy2(os.path.join(run_dir, file), fresh, follow_symlinks=False)
    for file in COMPRESSED_FILES:  # (kept as FILE.xz: what every reader of `io` reads as FILE)
      io.compress_jsonl(os.path.join(fresh, file))
    if os.path.exists(target):
      os.replace(target, stale)
    os.replace(fresh, target)
    shutil.rmtree(stale, ignore_errors=True)
  except OSError as err:
    raise OutputWriteError.of(err, err.filename or target) from None
  return True


def compress_records(records_dir: str) -> int:
  """Compresses the plain metrics and events of every record in `records_dir` (`COMPRESSED_FILES`), as
  `save_record` keeps them; the number of files compressed. For records an earlier version wrote plain."""
  count = 0
  for name in sorted(os.listdir(os.path.join(records_dir, RUNS_DIR))):
    folder = os.path.join(records_dir, RUNS_DIR, name)
    if os.path.isdir(folder) and not os.path.islink(folder):
      count += sum(io.compress_jsonl(os.path.join(folder, file)) for file in COMPRESSED_FILES)
  return count


def restore_records(records_dir: str, sweep_dir: str, members: Sequence[Member]) -> list[str]:
  """Copies into `sweep_dir` the record of each member that has no run directory there yet and whose record in
  `records_dir` is done for its config (`is_done`: the same run identity and budget); the names restored. A run
  directory already there is left to continue its own run; a record of another config or budget stays unused."""
  restored = []
  for m in members:
    record, run_dir = member_dir(records_dir, m), member_dir(sweep_dir, m)
    if os.path.lexists(run_dir) or not os.path.isdir(record) or not is_done(io.config_json(m.config), record):
      continue
    try:
      shutil.rmtree(f"{run_dir}.new", ignore_errors=True)  # (a copy an interrupted restore left)
      shutil.copytree(record, f"{run_dir}.new", symlinks=True)  # (links as links, never their targets)
      for file in COMPRESSED_FILES:  # (a run appends to the plain files, should it be extended)
        io.decompress_jsonl(os.path.join(f"{run_dir}.new", file))
      os.replace(f"{run_dir}.new", run_dir)
    except OSError as err:
      raise OutputWriteError.of(err, err.filename or run_dir) from None
    restored.append(m.name)
  return restored


def _open_records(sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str,
                  records_dir: str | None, log: Callable[[str], None]) -> None:
  """A sweep's start with a records directory: its finished members restored, its sweep.json written."""
  if not records_dir:
    return
  restored = restore_records(records_dir, sweep_dir, members)
  if restored:
    log(f"{len(restored)} finished member(s) restored from the records in {records_dir}")
  write_sweep_json(sweep, members, records_dir)


def _stop_if_disk_full(err: BaseException, run_dir: str) -> None:
  """Raises the OutputWriteError of a member that failed on a full disk (or quota, or a file-size limit): the sweep
  stops there."""
  if is_write_limit(err):
    raise OutputWriteError.of(err, getattr(err, "filename", None) or run_dir) from None


def _failure(member: Member, err: BaseException) -> dict[str, Any]:
  return {"status": "failed", "sweep_action": "failed", "error": f"{type(err).__name__}: {err}", "member": member.name}


# One member's outcome as an executor hands it over: the member and a call that returns its summary (running
# it, for the local executor; reading a finished task's result, for Ray) or raises what the member raised.
Completion = tuple[Member, Callable[[], dict]]


def _collect(members: Sequence[Member], completions: Iterator[Completion], sweep_dir: str, records_dir: str | None,
             log: Callable[[str], None], stop: Callable[[], None] = lambda: None) -> dict[str, dict]:
  """The member loop both executors share: each member's summary as it completes, its record kept, a line logged;
  {member name: summary}, in axis order.

  A member that raises an Exception is recorded as failed and the sweep goes on, except on a full disk (every
  member after it would fail alike): `stop()` (the executor's members still running are cancelled) and the
  member's OutputWriteError. `records_dir`: see the module docstring (each member's record is saved once it has
  finished, skipped members' too)."""
  results, start = {}, time.perf_counter()
  for m, outcome in completions:
    try:
      results[m.name] = outcome()
    except Exception as err:  # noqa: BLE001 — one broken member must not stop a long sweep
      if is_write_limit(err):
        stop()
      _stop_if_disk_full(err, member_dir(sweep_dir, m))
      results[m.name] = _failure(m, err)
    if records_dir:
      save_record(member_dir(sweep_dir, m), records_dir, m.name)
    log(f"[{len(results)}/{len(members)}] {m.name}: {_outcome(results[m.name])} "
        f"({time.perf_counter() - start:.1f} s into the sweep)")
  return {m.name: results[m.name] for m in members}


def run_local(sweep: ml_collections.ConfigDict, sweep_dir: str, log: Callable[[str], None] = print,
              compilation_cache: str | None = None, records_dir: str | None = None) -> dict[str, dict]:
  """Runs every member one after another in this process, seed by seed (`run_order`); {member name: summary},
  in axis order. A failed member, a full disk and `records_dir`: as `_collect` says. An interruption
  (KeyboardInterrupt) stops the sweep; rerunning resumes (finished members are skipped)."""
  members = expand(sweep)
  check_dirs(sweep, sweep_dir, records_dir, compilation_cache)
  with locked(sweep_dir, sweep.name):
    write_sweep_json(sweep, members, sweep_dir)
    _open_records(sweep, members, sweep_dir, records_dir, log)
    completions = ((m, lambda m=m: run_member(io.config_json(m.config), member_dir(sweep_dir, m), compilation_cache))
                   for m in run_order(members))
    return _collect(members, completions, sweep_dir, records_dir, log)


def _outcome(summary: dict[str, Any]) -> str:
  if summary.get("sweep_action") == "failed":
    return f"failed ({summary['error']})"
  acc = summary.get("final_test_accuracy")
  return f"{summary['sweep_action']}, {summary.get('status')}" + (f", final acc {acc:.4f}" if acc is not None else "")


# --- Ray ------------------------------------------------------------------------------------------------

# A member's share of one GPU when none is asked for (`RayResources.gpus` None) on a cluster with GPUs. Provisional:
# four members per device, until the several-members-per-device measurement (docs/performance.md, "Several
# members per device") has been taken on a GPU.
DEFAULT_GPU_SHARE = 0.25
# The part of its share of the device's memory a member's JAX may allocate: the rest is the process's own CUDA
# context and the libraries' workspaces, which JAX's allocator does not count.
GPU_MEMORY_OF_SHARE = 0.9
# How often Ray runs a member again whose process or node was lost (the task's `max_retries`): it continues
# from the member's last checkpoint in the shared sweep directory.
MEMBER_RETRIES = 3


@dataclasses.dataclass(frozen=True)
class RayResources:
  """What each member's Ray task asks for and runs with (`--ray_cpus_per_member`, `--ray_gpus_per_member`)."""

  cpus: int = 1  # Ray `num_cpus`, and the member's host devices (its client trainers on a CPU; GPUs are unaffected)
  gpus: float | None = None  # the share of one GPU, 0 to 1; None: DEFAULT_GPU_SHARE on a cluster with GPUs, else 0

  def problems(self) -> list[str]:
    """One line per bad field, naming its flag and what is allowed; [] when both are fine."""
    out = []
    if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 1:
      out.append(f"--ray_cpus_per_member={self.cpus!r} is invalid; allowed: an integer >= 1 (the CPUs Ray reserves "
                 "for each member, and its host devices on a CPU)")
    if self.gpus is not None and not (isinstance(self.gpus, (int, float)) and not isinstance(self.gpus, bool)
                                      and 0 <= self.gpus <= 1 and math.isfinite(self.gpus)):
      out.append(f"--ray_gpus_per_member={self.gpus!r} is invalid; allowed: a number from 0 to 1 (each member's "
                 "share of one GPU; 0: no GPU)")
    return out

  def gpu_share(self, cluster_gpus: float) -> float:
    """The share each member asks for on a cluster with `cluster_gpus` GPUs in all."""
    return self.gpus if self.gpus is not None else (DEFAULT_GPU_SHARE if cluster_gpus > 0 else 0.0)


MEMORY_FRACTION = "XLA_CLIENT_MEM_FRACTION"  # jaxlib's cap on its allocator, a fraction of the device's memory
DEPRECATED_MEMORY_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # its old name, refused beside the new one


def member_env(gpu_share: float) -> dict[str, str]:
  """The environment a member's process runs with for its share of a GPU: no preallocation of the whole device,
  and JAX's allocator capped to GPU_MEMORY_OF_SHARE of the share (both read when JAX starts its GPU backend)."""
  if gpu_share <= 0:
    return {}
  return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", MEMORY_FRACTION: f"{GPU_MEMORY_OF_SHARE * gpu_share:.4g}"}


def apply_member_env(environ: MutableMapping[str, str], env: Mapping[str, str]) -> None:
  """Sets `env` (`member_env`) in `environ`; where it caps the memory, a cap under the old name goes (jaxlib
  refuses both names at once, and the share Ray reserved is the one that holds)."""
  environ.update(env)
  if MEMORY_FRACTION in env:
    environ.pop(DEPRECATED_MEMORY_FRACTION, None)


def run_remote_member(env: dict[str, str], host_devices: int, config_json: dict[str, Any], run_dir: str,
                      compilation_cache: str | None) -> dict[str, Any]:
  """A member's Ray task: in a fresh worker process (the task's `max_calls=1`: nothing is carried from one member
  to the next), `env` and the host devices are set before JAX starts, then `run_member`. An XLA_FLAGS that already
  sets the host device count wins."""
  apply_member_env(os.environ, env)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if host_devices > 1 and "xla_force_host_platform_device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = f"{xla_flags} --xla_force_host_platform_device_count={host_devices}".strip()
  return run_member(config_json, run_dir, compilation_cache)


def run_ray(sweep: ml_collections.ConfigDict, sweep_dir: str, address: str | None = None,
            resources: RayResources = RayResources(), log: Callable[[str], None] = print,
            compilation_cache: str | None = None, records_dir: str | None = None) -> dict[str, dict]:
  """Runs every member as a Ray task (`run_remote_member`), submitted seed by seed (`run_order`); {member name:
  summary}, in axis order.

  `address`: the cluster to join (`ray.init(address=...)`; 'auto' for the local node's cluster); None
  joins an already initialised Ray or starts a local instance. The sweep directory must be on storage
  every node sees (a shared filesystem), and fedpsa_jax importable on every node. Each task asks for
  `resources` and runs in a process of its own; a task whose node is lost runs again (MEMBER_RETRIES) and
  continues from the member's checkpoint. Members that are done are skipped by the task itself, so a resumed
  sweep costs one short task (a process that imports no JAX) per finished member. A failed member, a full disk
  and `records_dir`: as `_collect` says (records written here as each task returns, from the shared sweep
  directory).
  """
  problems = resources.problems()
  if problems:
    raise ConfigError(problems[0])
  try:
    import ray
  except ImportError as err:
    raise ConfigError("--executor=ray needs the ray package (pip install ray); allowed: --executor=local, "
                                 "or install ray") from err
  members = expand(sweep)  # (every member validated before Ray starts)
  check_dirs(sweep, sweep_dir, records_dir, compilation_cache)
  with locked(sweep_dir, sweep.name):
    return _run_ray_members(ray, sweep, members, sweep_dir, address, resources, log, compilation_cache, records_dir)


def _run_ray_members(ray: Any, sweep: ml_collections.ConfigDict, members: Sequence[Member], sweep_dir: str,
                     address: str | None, resources: RayResources, log: Callable[[str], None],
                     compilation_cache: str | None, records_dir: str | None) -> dict[str, dict]:
  """`run_ray`'s work once the sweep directory is locked."""
  write_sweep_json(sweep, members, sweep_dir)
  _open_records(sweep, members, sweep_dir, records_dir, log)
  if not ray.is_initialized():
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
  share = resources.gpu_share(ray.cluster_resources().get("GPU", 0))
  task = ray.remote(num_cpus=resources.cpus, num_gpus=share, max_calls=1, max_retries=MEMBER_RETRIES)(
      run_remote_member)
  sweep_dir = os.path.abspath(sweep_dir)
  cache = os.path.abspath(compilation_cache) if compilation_cache else None
  refs = {task.remote(member_env(share), resources.cpus, io.config_json(m.config), member_dir(sweep_dir, m), cache): m
          for m in run_order(members)}
  log(f"{len(refs)} members submitted, each asking for {resources.cpus} CPU(s)"
      + (f" and {share:g} of a GPU" if share else ""))

  def completions() -> Iterator[Completion]:
    pending = list(refs)
    while pending:
      done, pending = ray.wait(pending, num_returns=1)
      yield refs[done[0]], lambda ref=done[0]: ray.get(ref)  # (a failed task raises; RayTaskError wraps it)

  def cancel_running() -> None:  # (on a full disk: the members still running would fail alike)
    for ref in refs:
      ray.cancel(ref)

  return _collect(members, completions(), sweep_dir, records_dir, log, stop=cancel_running)


def run(sweep: ml_collections.ConfigDict, sweep_dir: str, executor: str = "local", address: str | None = None,
        log: Callable[[str], None] = print, compilation_cache: str | None = None,
        records_dir: str | None = None, resources: RayResources = RayResources()) -> dict[str, dict]:
  """Runs a sweep with the named executor ('local' or 'ray'); {member name: summary}. `records_dir`: where
  the finished members' records are kept as well (module docstring); None: nowhere else. `resources`: what each
  member's Ray task asks for (Ray only)."""
  if executor not in EXECUTORS:
    raise ConfigError(f"--executor={executor!r} is invalid; allowed: {', '.join(EXECUTORS)}")
  if executor == "ray":
    return run_ray(sweep, sweep_dir, address, resources, log=log, compilation_cache=compilation_cache,
                   records_dir=records_dir)
  return run_local(sweep, sweep_dir, log=log, compilation_cache=compilation_cache, records_dir=records_dir)
