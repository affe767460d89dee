"""TensorBoard scalars of a run's evaluations: `runtime.tensorboard` writes RUN_DIR/tensorboard/ (docs/runs.md).

Every metrics.jsonl line becomes one TensorBoard event at step = the line's `time` (the virtual clock, 86,400
units a day: the x-axis of the paper's curves, and unique per line; rounds and client updates may repeat between
evaluations). Each numeric field is a scalar tagged with its metrics.jsonl name (`scalars`): the evaluation
(`test_accuracy`, `test_loss`, `round`, `lr`, bytes, ...) and the strategy's `diagnostics` (FedPSA's
`temperature`; `kappa/0`, `weights/0`, ... per buffer position; AiFed's `layer_upload_rate/<layer>`). Values are
float32, as TensorBoard stores scalars.

The event files mirror metrics.jsonl. A resumed run cuts metrics.jsonl back to its checkpoint, so steps written
after the checkpoint (by a run killed before its next one) would be written twice; instead `EventLog.restart`
removes the directory's event files and writes the kept lines again into a new one, then the run appends. So the
directory never holds a step twice, whatever the reader (TensorBoard's own purging of orphaned steps differs
between its loaders), and turning the option on when resuming gives the whole history. Events carry the run's
spacing in wall time: a rewritten line is dated its `wall_seconds` before the last kept one, which is dated now.

Written with tensorboardX's synchronous `EventsWriter` (no TensorFlow; its `SummaryWriter` hands events to a
background thread whose `flush` does not wait for them, so a killed run could lose lines metrics.jsonl has,
and a full disk would go unnoticed in that thread). Each event is flushed to disk as written (the writer
fsyncs), so the file holds every line metrics.jsonl does.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any, Iterable, Mapping

import numpy as np
from tensorboardX import event_file_writer, summary
from tensorboardX.proto import event_pb2, summary_pb2

STEP_FIELD = "time"  # the metrics field that is each event's step
EVENT_FILE_PATTERN = "events.out.tfevents.*"  # (the name TensorBoard looks for; tensorboardX adds time and host)


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
  """{tag: value} of one metrics record, by sorted tag: every number and bool (as 0/1) under its field's name,
  lists by index (`kappa/0`), dicts by key (`layer_upload_rate/conv1`); strings, None and the step field are
  left out."""
  out: dict[str, float] = {}

  def visit(tag: str, value: Any) -> None:
    if isinstance(value, Mapping):
      for key, item in value.items():
        visit(f"{tag}/{key}", item)
    elif isinstance(value, np.ndarray):
      visit(tag, value.tolist())
    elif isinstance(value, (list, tuple)):
      for index, item in enumerate(value):
        visit(f"{tag}/{index}", item)
    elif isinstance(value, (bool, int, float, np.bool_, np.number)):
      out[tag] = float(value)

  for key, value in record.items():
    if key != STEP_FIELD:
      visit(key, value)
  return dict(sorted(out.items()))


def event(record: Mapping[str, Any], wall_time: float) -> event_pb2.Event:
  """One record's scalars as one TensorBoard event at step `record['time']`."""
  values = [v for tag, x in scalars(record).items() for v in summary.scalar(tag, x).value]
  return event_pb2.Event(wall_time=wall_time, step=int(record[STEP_FIELD]), summary=summary_pb2.Summary(value=values))


class EventLog:
  """The event file of one run directory's TensorBoard folder, kept equal to its metrics.jsonl."""

  def __init__(self, logdir: str):
    self.logdir = logdir
    self._writer: event_file_writer.EventsWriter | None = None

  def restart(self, history: Iterable[Mapping[str, Any]]) -> None:
    """Removes the folder's event files and writes `history` (metrics.jsonl as kept) into a new one: called
    when a run starts (empty) or resumes (the lines before its checkpoint)."""
    self.close()
    os.makedirs(self.logdir, exist_ok=True)
    for path in glob.glob(os.path.join(self.logdir, EVENT_FILE_PATTERN)):
      os.remove(path)
    self._writer = event_file_writer.EventsWriter(os.path.join(self.logdir, "events"))
    history = list(history)
    now = time.time()
    last = history[-1].get("wall_seconds", 0.0) if history else 0.0
    for record in history:
      self._writer.write_event(event(record, now - (last - record.get("wall_seconds", last))))
    self._writer.flush()

  def write(self, record: Mapping[str, Any]) -> None:
    """Appends one metrics record's event and flushes it to the OS."""
    if self._writer is None:
      raise RuntimeError(f"the TensorBoard log in {self.logdir} was not started (EventLog.restart)")
    self._writer.write_event(event(record, time.time()))
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      writer, self._writer = self._writer, None
      writer.close()
