"""The run directory (DESIGN §6): config.json, metrics.jsonl, events.jsonl, summary.json.

Lines are appended and flushed one at a time and summary.json is replaced atomically, so a run that
dies leaves every line it wrote readable.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable

import ml_collections


def _jsonable(value: Any) -> Any:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/Inf; keep them readable instead of writing invalid JSON
  if hasattr(value, "item") and getattr(value, "shape", None) == ():
    return _jsonable(value.item())
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def write_json_atomic(path: str, obj: Any) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(_jsonable(obj), f, indent=2, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class RunDir:
  """A run's output folder."""

  def __init__(self, path: str):
    self.path = path
    os.makedirs(path, exist_ok=True)
    self._files: dict[str, Any] = {}

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def write_config(self, config: ml_collections.ConfigDict) -> None:
    write_json_atomic(self.file("config.json"), config.to_dict())

  def append(self, name: str, records: Iterable[dict]) -> None:
    """Appends JSON lines to `name` and flushes them to the OS at once."""
    if name not in self._files:
      self._files[name] = open(self.file(name), "a")
    f = self._files[name]
    for record in records:
      f.write(json.dumps(_jsonable(record), sort_keys=True) + "\n")
    f.flush()

  def write_summary(self, summary: dict) -> None:
    write_json_atomic(self.file("summary.json"), summary)

  def close(self) -> None:
    for f in self._files.values():
      f.close()
    self._files.clear()
