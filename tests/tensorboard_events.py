"""A reader of TensorBoard event files for the tests, independent of the writer's code: the TFRecord framing
parsed here (little-endian u64 length, masked CRC-32C of it, the bytes, masked CRC-32C of them; both CRCs
checked) and each record decoded as an `Event` protobuf."""

from __future__ import annotations

import glob
import os
import struct

from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2


def _masked(data: bytes) -> int:
  """TFRecord's masked CRC-32C: the CRC rotated right by 15 bits plus a constant, modulo 2**32."""
  crc = crc32c(data) & 0xFFFFFFFF
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(path: str) -> list[event_pb2.Event]:
  """Every event of one file, in order; AssertionError on a bad CRC or a record cut short."""
  data, events, at = open(path, "rb").read(), [], 0
  while at < len(data):
    header = data[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", data[at + 8:at + 12])[0] == _masked(header), f"{path}: bad length CRC at {at}"
    body = data[at + 12:at + 12 + length]
    assert len(body) == length, f"{path}: record at {at} cut short"
    assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == _masked(body), f"{path}: bad CRC at {at}"
    events.append(event_pb2.Event.FromString(body))
    at += 16 + length
  return events


def event_files(logdir: str) -> list[str]:
  return sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))


def scalars_by_step(logdir: str) -> dict[int, dict[str, float]]:
  """{step: {tag: value}} of every scalar event in `logdir`'s event files, in the order written; a step that
  appears twice (in one file or across files) fails."""
  out: dict[int, dict[str, float]] = {}
  for path in event_files(logdir):
    for event in read_events(path):
      if not event.HasField("summary"):  # (the file-version record each file starts with)
        continue
      assert event.step not in out, f"step {event.step} written twice in {logdir}"
      out[event.step] = {v.tag: v.simple_value for v in event.summary.value}
  return out


def wall_times(logdir: str) -> dict[int, float]:
  """{step: wall time} of the scalar events in `logdir`."""
  return {e.step: e.wall_time for path in event_files(logdir) for e in read_events(path) if e.HasField("summary")}
