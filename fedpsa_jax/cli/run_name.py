"""Run directory names, `runs/<config>[-<arg>]-<YYYYmmdd-HHMMSS>`, and finding the run `--resume` continues.

A name is written by `RunName.format` and read by `RunName.parse`, the one place that knows its shape, so
that the default workdir, the sweep workdir and resume discovery cannot disagree about it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re

import ml_collections

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, run_identity
from fedpsa_jax.data import fingerprint

RUNS_DIR = "runs"
STAMP_FORMAT = "%Y%m%d-%H%M%S"
_NAME = re.compile(r"(?P<stem>.+)-(?P<stamp>\d{8}-\d{6})")


@dataclasses.dataclass(frozen=True)
class RunName:
  """`<config>[-<arg>]-<YYYYmmdd-HHMMSS>`, or `<config>[-<arg>]` without a time (a sweep's directory).

  `stem` is `<config>[-<arg>]` as one string: a config file's name and its `:arg` may both hold dashes, so a
  name cannot say where one ends and the other begins, and two runs are of the same config file and arg
  exactly when their stems are equal.
  """

  stem: str
  stamp: datetime.datetime | None = None

  @classmethod
  def of(cls, config_path: str, stamp: datetime.datetime | None = None) -> RunName:
    """The name of a run of `config_path` (`configs/x.py[:arg]`): the file's name, then the arg with its
    `,` and `=` (not for file names) as `_` and `-`."""
    path, _, arg = config_path.partition(":")
    stem = os.path.splitext(os.path.basename(path))[0]
    if arg:
      stem += "-" + arg.replace(",", "_").replace("=", "-")
    return cls(stem, stamp)

  @classmethod
  def parse(cls, name: str) -> RunName | None:
    """The RunName `format` wrote as `name` (a directory's base name), or None when it is not one with a time."""
    match = _NAME.fullmatch(name)
    if match is None:
      return None
    try:
      stamp = datetime.datetime.strptime(match["stamp"], STAMP_FORMAT)
    except ValueError:  # (digits that are no date, e.g. a month 13)
      return None
    return cls(match["stem"], stamp)

  def format(self) -> str:
    return self.stem if self.stamp is None else f"{self.stem}-{self.stamp.strftime(STAMP_FORMAT)}"


def default_workdir(config_path: str) -> str:
  """runs/<config>[-<arg>]-<now>: a new directory for each run."""
  now = datetime.datetime.now().replace(microsecond=0)
  return os.path.join(RUNS_DIR, RunName.of(config_path, now).format())


def sweep_workdir(config_path: str) -> str:
  """runs/<config>[-<arg>], without a time: rerunning the same sweep command resumes it."""
  return os.path.join(RUNS_DIR, RunName.of(config_path).format())


def resumable_workdir(config_path: str, config: ml_collections.ConfigDict) -> str:
  """The newest `default_workdir` of the same config file and arg (any time) that holds a run of this
  config (`run_identity.identity_differences`: the same shared fields and method section); ConfigError when
  there is none."""
  wanted = RunName.of(config_path).stem
  current = fingerprint.pinned_json(io.config_json(config))  # (what a run of data.path records of its content)
  found: list[tuple[datetime.datetime, str]] = []
  for name in os.listdir(RUNS_DIR) if os.path.isdir(RUNS_DIR) else []:
    run_name = RunName.parse(name)
    if run_name is None or run_name.stem != wanted:
      continue
    path = os.path.join(RUNS_DIR, name)
    try:
      saved = io.read_config(path)
    except (OSError, ValueError):  # a damaged config.json is not a run to continue
      continue
    if saved is not None and not run_identity.identity_differences(saved, current):
      found.append((run_name.stamp, path))
  if not found:
    raise config_lib.ConfigError(f"--resume found no run of this config under {RUNS_DIR}/{wanted}-*; allowed: "
                                 "--workdir=DIR of the run to continue, or no --resume for a new run")
  return max(found)[1]
