"""The recorder: everything a run writes, in one place (docs/runs.md, 'What a run writes').

It owns the run directory (config.json, metrics.jsonl, events.jsonl, summary.json; `io.RunDir`), the
checkpoint store (`checkpoint.CheckpointStore`), the TensorBoard events of `runtime.tensorboard`
(`tensorboard.EventLog`, in RUN_DIR/tensorboard) and the progress bar. Without a workdir it writes nothing and
only shows progress, so a notebook run costs no disk.

Output positions: a checkpoint records how many metrics lines and how many bytes of metrics.jsonl and
events.jsonl existed when it was taken; resuming cuts the files back to them, so lines written after the
checkpoint (and a line cut off by a kill) are neither duplicated nor left behind. A checkpoint whose
positions the files no longer reach (metrics.jsonl cut or deleted) is set aside and the newest one that
fits is used; with none, the run starts over, with a warning. The TensorBoard events follow metrics.jsonl:
rewritten from the lines kept whenever the run starts or resumes, then appended with each new line.

Failures: an OSError while writing an output (a full disk) becomes `errors.OutputWriteError` naming the
file; a checkpoint write is never cut by SIGINT/SIGTERM (`signals.deferred_signals`: the signal is delivered
once the checkpoint is complete).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Iterable, Iterator

import ml_collections
import tqdm.auto as tqdm

from fedpsa_jax import checkpoint as checkpoint_lib
from fedpsa_jax import errors, io, signals, tensorboard
from fedpsa_jax.config import UNITS_PER_DAY, budget_units

TENSORBOARD_DIR = io.TENSORBOARD_DIR  # RUN_DIR/tensorboard: the event files of runtime.tensorboard


class Recorder:
  """A run's outputs: files, checkpoints and progress."""

  def __init__(self, rundir: io.RunDir | None, config: ml_collections.ConfigDict):
    """`rundir`: the run directory, its lock already held (`sim.build.prepare` takes it before the run is
    built); None to write nothing. The recorder closes it, and with it the lock, in `close`."""
    self.config = config
    self.rundir = rundir
    # The bar ends at the budget's exact day (whole units: 0.002 days is 173 units, 0.0020023 days), which the
    # last evaluation reaches; a rounded total would be overshot.
    self.progress = tqdm.tqdm(total=budget_units(config) / UNITS_PER_DAY, unit="day", leave=True,
                              disable=not config.runtime.progress,
                              bar_format="{l_bar}{bar}| {n:.3f}/{total:.3f} days [{elapsed}<{remaining}{postfix}]")
    self.checkpoints = (checkpoint_lib.CheckpointStore(rundir.file(io.CHECKPOINTS_DIR), config.checkpoint.keep)
                        if rundir is not None else None)
    self.tensorboard = (tensorboard.EventLog(rundir.file(TENSORBOARD_DIR))
                        if rundir is not None and config.runtime.tensorboard else None)

  @contextlib.contextmanager
  def _writing(self, name: str) -> Iterator[None]:
    """Turns an OSError while writing output `name` into an OutputWriteError naming its path; refuses first a
    folder the write would go through that has become a symbolic link since the run began (exit 3)."""
    try:
      if self.rundir is not None:
        self.rundir.refuse_links_made()
      yield
    except errors.OutputWriteError:
      raise
    except OSError as err:
      raise errors.OutputWriteError.of(err, self.rundir.file(name) if self.rundir else name) from err

  def open(self) -> checkpoint_lib.Restored | None:
    """The run directory's newest usable checkpoint, if any: one that reads back intact and whose output
    positions the files still reach. Without one, whatever an earlier attempt wrote is cleared for a fresh
    start."""
    if self.rundir is None:
      return None
    mismatched: list[str] = []

    def fits(restored: checkpoint_lib.Restored) -> str | None:
      reason = self._positions_mismatch(restored.snapshot["outputs"])
      if reason is not None:
        mismatched.append(reason)
      return reason

    restored = self.checkpoints.restore_latest(accept=fits)
    if restored is None:
      if mismatched:
        warnings.warn(f"no checkpoint in {self.checkpoints.directory} matches the run's files ({mismatched[-1]}); "
                      "the run starts over from the beginning", checkpoint_lib.CheckpointWarning, stacklevel=2)
      with self._writing(io.METRICS_FILE):
        self.rundir.truncate(io.METRICS_FILE, 0)
        self.rundir.truncate(io.EVENTS_FILE, 0)
      self._restart_tensorboard([])
    return restored

  def _positions_mismatch(self, positions: dict[str, int]) -> str | None:
    """Why the output files cannot be cut back to a checkpoint's positions (None when they can): a file
    shorter than recorded, or a metrics.jsonl whose recorded part does not hold the recorded lines."""
    for name, key in ((io.METRICS_FILE, "metrics_bytes"), (io.EVENTS_FILE, "events_bytes")):
      have = self.rundir.size(name)
      if have < positions[key]:
        return f"{name} has {have} bytes, the checkpoint recorded {positions[key]}"
    with open(self.rundir.file(io.METRICS_FILE), "rb") if positions["metrics_bytes"] else contextlib.nullcontext() as f:
      head = f.read(positions["metrics_bytes"]) if f else b""
    lines = head.split(b"\n")
    if lines[-1] != b"" or len(lines) - 1 != positions["metrics_lines"]:
      return (f"the first {positions['metrics_bytes']} bytes of {io.METRICS_FILE} are not the "
              f"{positions['metrics_lines']} whole lines the checkpoint recorded")
    try:
      for line in lines[:-1]:
        json.loads(line)
    except ValueError:
      return f"{io.METRICS_FILE} has a damaged line before the checkpoint's position"
    return None

  def write_config(self) -> None:
    if self.rundir:
      with self._writing(io.CONFIG_FILE):
        self.rundir.write_config(self.config)

  def metrics(self, record: dict[str, Any]) -> None:
    """Appends one evaluation's record to metrics.jsonl (and its TensorBoard event) and moves the progress bar
    to its day."""
    if self.rundir:
      with self._writing(io.METRICS_FILE):
        self.rundir.append(io.METRICS_FILE, [record])
    if self.tensorboard is not None:
      with self._writing(TENSORBOARD_DIR):
        self.tensorboard.write(record)
    self.progress.set_postfix(acc=f"{record['test_accuracy']:.4f}", round=record["round"], refresh=False)
    self._progress_to(record["day"])

  def events(self, lines: Iterable[dict[str, Any]]) -> None:
    if self.rundir:
      with self._writing(io.EVENTS_FILE):
        self.rundir.append(io.EVENTS_FILE, lines)

  @property
  def wants_events(self) -> bool:
    return self.rundir is not None and bool(self.config.output.events)

  def positions(self, metrics_lines: int) -> dict[str, int]:
    """The output positions a checkpoint records (the files synced first: they must be on disk before the
    checkpoint exists)."""
    with self._writing(io.METRICS_FILE):
      self.rundir.sync()
    return {"metrics_lines": metrics_lines, "metrics_bytes": self.rundir.size(io.METRICS_FILE),
            "events_bytes": self.rundir.size(io.EVENTS_FILE)}

  def rewind(self, positions: dict[str, int]) -> list[dict]:
    """Cuts the outputs back to a checkpoint's positions and returns the metrics history read back."""
    with self._writing(io.METRICS_FILE):
      self.rundir.truncate(io.METRICS_FILE, positions["metrics_bytes"])
      self.rundir.truncate(io.EVENTS_FILE, positions["events_bytes"])
    history = io.read_metrics(self.rundir.path)
    if len(history) != positions["metrics_lines"]:  # (`open` chose a checkpoint that fits: a safeguard)
      raise RuntimeError(f"{self.rundir.file(io.METRICS_FILE)} holds {len(history)} lines where the "
                         f"checkpoint recorded {positions['metrics_lines']}; it cannot continue exactly")
    self._restart_tensorboard(history)
    if history:
      self._progress_to(history[-1]["day"])
    return history

  def _restart_tensorboard(self, history: list[dict]) -> None:
    """The TensorBoard events made equal to metrics.jsonl's kept lines (`tensorboard.EventLog.restart`)."""
    if self.tensorboard is not None:
      with self._writing(TENSORBOARD_DIR):
        self.tensorboard.restart(history)

  def save_checkpoint(self, step: int, snapshot: dict[str, Any]) -> None:
    """Writes checkpoint `step`. A SIGINT/SIGTERM meanwhile is held back until it is complete (then
    delivered: the run stops with this checkpoint as its newest); a full disk is an OutputWriteError."""
    with signals.deferred_signals():
      try:
        self.rundir.refuse_links_made()  # (orbax follows links: the checkpoints must stay in the run directory)
        self.checkpoints.save(step, snapshot, io.config_json(self.config))
      except Exception as err:
        if isinstance(err, OSError) or errors.is_write_limit(err):  # (orbax may wrap the OS error)
          raise errors.OutputWriteError.of(err, os.path.join(self.checkpoints.directory, str(step))) from err
        raise

  def write_summary(self, summary: dict[str, Any]) -> None:
    if self.rundir:
      with self._writing(io.SUMMARY_FILE):
        self.rundir.write_summary(summary)

  def discard_summary(self) -> None:
    """Removes summary.json (when a new one cannot be written, an old one must not speak for this run)."""
    if self.rundir:
      with contextlib.suppress(OSError):
        os.remove(self.rundir.file(io.SUMMARY_FILE))

  def _progress_to(self, day: float) -> None:
    """Moves the bar to `day` (never past its end)."""
    self.progress.update(max(0.0, min(day, self.progress.total) - self.progress.n))

  def close_progress(self) -> None:
    self.progress.close()

  def close(self) -> None:
    """Closes the files and the checkpoint store (the run can be resumed from its workdir later)."""
    self.progress.close()
    if self.tensorboard is not None:
      with contextlib.suppress(OSError):  # (a write that failed before, e.g. a full disk, was raised then)
        self.tensorboard.close()
    if self.rundir is not None:
      self.rundir.close()
    if self.checkpoints:
      self.checkpoints.close()

