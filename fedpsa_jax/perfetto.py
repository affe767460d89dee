"""The Perfetto file of a `jax.profiler` trace, written with little memory, and what it holds.

A trace folder (`plugins/profile/<time>/`) holds the `.xplane.pb` (everything recorded, for TensorBoard's profile
plug-in) and the trace viewer's `*.trace.json.gz`, which JAX converts from it keeping only the earliest
`TRACE_EVENT_CAP` events (XLA's trace conversion, `GetTraceViewerMaxEvents`; the
environment variable `TRACE_EVENT_CAP_VARIABLE` changes it). Perfetto (ui.perfetto.dev) opens that JSON less its
top-level `metadata`, which `jax.profiler.start_trace(create_perfetto_trace=True)` removes by loading the whole
trace into Python objects, a large share of a profile's peak memory, and writing it out again.
`write_perfetto` writes the same file from the JSON's own text, reading its events one at a time, and sums up
what it holds (`TraceSummary`): its events, the cap, and which of the expected slices it lacks.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
from typing import Iterator, Sequence

TRACE_EVENT_CAP_VARIABLE = "TF_PROFILER_TRACE_VIEWER_MAX_EVENTS"
TRACE_EVENT_CAP = 1_000_000
PERFETTO_FILE = "perfetto_trace.json.gz"  # (the name jax.profiler gives it)


@dataclasses.dataclass(frozen=True)
class TraceSummary:
  """What a Perfetto file holds: `events` (less the metadata that names processes and threads), JAX's `cap` on
  them, and the expected slice names it has no complete event of (`missing`)."""

  path: str
  events: int
  cap: int
  missing: tuple[str, ...]

  @property
  def problem(self) -> str | None:
    """One line when the file lacks something (the cap reached, a slice missing), else None."""
    lacking = f"{', '.join(self.missing)} missing" if self.missing else "its last events missing"
    if self.events >= self.cap:
      return (f"the trace {self.path} stopped at {self.events:,} events, the cap of JAX's trace conversion "
              f"({TRACE_EVENT_CAP_VARIABLE}={self.cap:,}), with {lacking} (the .xplane.pb beside it holds them, "
              "for TensorBoard); trace fewer pieces (`pieces`, --profile_pieces) to see them in Perfetto")
    if self.missing:
      return f"the trace {self.path} has no slice named {', '.join(self.missing)}"
    return None


def trace_event_cap() -> int:
  """The events JAX keeps of a trace for the trace viewer and Perfetto (`TRACE_EVENT_CAP`, or the variable's)."""
  try:
    return int(os.environ.get(TRACE_EVENT_CAP_VARIABLE, TRACE_EVENT_CAP))
  except ValueError:
    return TRACE_EVENT_CAP


def newest_trace_folder(trace_dir: str) -> str:
  """The folder of the newest trace `jax.profiler` wrote into `trace_dir` (as jax.profiler picks it)."""
  return max(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "")), key=os.path.getmtime)


_BLANK = " \t\r\n"
_CHUNK = 1 << 24  # characters copied at a time


def _skip(text: str, at: int, chars: str) -> int:
  while text[at] in chars:
    at += 1
  return at


def _walk_events(text: str, at: int, decoder: json.JSONDecoder, expected: Sequence[str]) -> tuple[int, int, set[str]]:
  """The `traceEvents` array that starts at `at`, decoded one event at a time (none kept): its end, its events
  that are not metadata, and which `expected` names have a complete event ("X")."""
  count, names = 0, set()
  at += 1
  while True:
    at = _skip(text, at, _BLANK + ",")
    if text[at] == "]":
      return at + 1, count, names
    event, at = decoder.raw_decode(text, at)
    phase = event.get("ph")
    count += phase not in (None, "M")  # (the metadata that names processes and threads; a last, empty {})
    if phase == "X" and event.get("name") in expected:
      names.add(event["name"])


def write_perfetto(folder: str, expected: Sequence[str]) -> TraceSummary:
  """Writes `perfetto_trace.json.gz` in the trace folder `folder` from its `*.trace.json.gz`, the same JSON less
  its top-level `metadata`, copied as text, and sums it up, `expected` the slice names it should hold."""
  source, = glob.glob(os.path.join(folder, "*.trace.json.gz"))
  with gzip.open(source, "rt", encoding="utf-8") as f:
    text = f.read()
  decoder, path = json.JSONDecoder(), os.path.join(folder, PERFETTO_FILE)
  events, names, separator = 0, set(), ""
  with gzip.open(path, "wt", encoding="utf-8") as out:
    out.write("{")
    at = text.index("{") + 1
    while (at := _skip(text, at, _BLANK + ",")) and text[at] != "}":  # each top-level member
      key, at = decoder.raw_decode(text, at)
      start = _skip(text, _skip(text, at, _BLANK) + 1, _BLANK)  # (past the ':')
      if key == "traceEvents":
        end, events, names = _walk_events(text, start, decoder, expected)
      else:
        end = decoder.raw_decode(text, start)[1]
      if key != "metadata":
        out.write(f"{separator}{json.dumps(key)}:")
        for chunk in range(start, end, _CHUNK):
          out.write(text[chunk:min(chunk + _CHUNK, end)])
        separator = ","
      at = end
    out.write("}")
  return TraceSummary(path=path, events=events, cap=trace_event_cap(),
                      missing=tuple(name for name in dict.fromkeys(expected) if name not in names))
