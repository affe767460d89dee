"""The recorder: everything a run writes, in one place (DESIGN §6).

It owns the run directory (config.json, metrics.jsonl, events.jsonl, summary.json; `io.RunDir`), the
checkpoint store (`checkpoint.CheckpointStore`) and the progress bar. Without a workdir it writes
nothing and only shows progress, so a notebook run costs no disk.

Output positions: a checkpoint records how many metrics lines and how many bytes of metrics.jsonl and
events.jsonl existed when it was taken; resuming cuts the files back to them, so lines written after the
checkpoint (and a line cut off by a kill) are neither duplicated nor left behind.
"""

from __future__ import annotations

from typing import Any, Iterable

import ml_collections
import tqdm.auto as tqdm

from fedpsa_jax import checkpoint as checkpoint_lib
from fedpsa_jax import io


class Recorder:
  """A run's outputs: files, checkpoints and progress."""

  def __init__(self, workdir: str | None, config: ml_collections.ConfigDict):
    self.config = config
    self.progress = tqdm.tqdm(total=round(config.sim.virtual_days, 4), unit="day", leave=True,
                              disable=not config.output.progress,
                              bar_format="{l_bar}{bar}| {n:.3f}/{total:.3f} days [{elapsed}<{remaining}{postfix}]")
    self.rundir: io.RunDir | None = None
    self.checkpoints: checkpoint_lib.CheckpointStore | None = None
    self.workdir = workdir

  @property
  def writes(self) -> bool:
    return self.rundir is not None

  def open(self) -> checkpoint_lib.Restored | None:
    """Claims the workdir (a lock held until `close`) and returns its newest usable checkpoint, if any.
    Without one, whatever an earlier attempt wrote is cleared for a fresh start."""
    if not self.workdir:
      return None
    self.rundir = io.RunDir(self.workdir)
    self.rundir.lock()  # before anything in the workdir is read, cut back or written
    self.checkpoints = checkpoint_lib.CheckpointStore(self.rundir.file("checkpoints"), self.config.checkpoint.keep)
    restored = self.checkpoints.restore_latest()
    if restored is None:
      self.rundir.truncate(io.METRICS_FILE, 0)
      self.rundir.truncate(io.EVENTS_FILE, 0)
    return restored

  def write_config(self) -> None:
    if self.rundir:
      self.rundir.write_config(self.config)

  def metrics(self, record: dict[str, Any]) -> None:
    """Appends one evaluation's record to metrics.jsonl and moves the progress bar to its day."""
    if self.rundir:
      self.rundir.append(io.METRICS_FILE, [record])
    self.progress.set_postfix(acc=f"{record['test_accuracy']:.4f}", round=record["round"], refresh=False)
    self.progress.update(round(record["day"] - self.progress.n, 6))

  def events(self, lines: Iterable[dict[str, Any]]) -> None:
    if self.rundir:
      self.rundir.append(io.EVENTS_FILE, lines)

  @property
  def wants_events(self) -> bool:
    return self.rundir is not None and bool(self.config.output.events)

  def positions(self, metrics_lines: int) -> dict[str, int]:
    """The output positions a checkpoint records (the files synced first: they must be on disk before the
    checkpoint exists)."""
    self.rundir.sync()
    return {"metrics_lines": metrics_lines, "metrics_bytes": self.rundir.size(io.METRICS_FILE),
            "events_bytes": self.rundir.size(io.EVENTS_FILE)}

  def rewind(self, positions: dict[str, int]) -> list[dict]:
    """Cuts the outputs back to a checkpoint's positions and returns the metrics history read back."""
    self.rundir.truncate(io.METRICS_FILE, positions["metrics_bytes"])
    self.rundir.truncate(io.EVENTS_FILE, positions["events_bytes"])
    history = io.read_metrics(self.rundir.path)
    if len(history) != positions["metrics_lines"]:
      raise RuntimeError(f"{self.rundir.file(io.METRICS_FILE)} holds {len(history)} lines where the "
                         f"checkpoint recorded {positions['metrics_lines']}; it cannot continue exactly")
    if history:
      self.progress.update(round(history[-1]["day"], 6))
    return history

  def save_checkpoint(self, step: int, snapshot: dict[str, Any]) -> None:
    self.checkpoints.save(step, snapshot, io.config_json(self.config))

  def write_summary(self, summary: dict[str, Any]) -> None:
    if self.rundir:
      self.rundir.write_summary(summary)

  def close_progress(self) -> None:
    self.progress.close()

  def close(self) -> None:
    """Closes the files and the checkpoint store (the run can be resumed from its workdir later)."""
    self.progress.close()
    if self.rundir:
      self.rundir.close()
    if self.checkpoints:
      self.checkpoints.close()
