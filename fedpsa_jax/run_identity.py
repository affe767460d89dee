"""A run's identity: what must be equal for a run directory, a checkpoint or a finished sweep member to belong
to a config.

The identity is the shared sections (`config.schema.SHARED_SECTIONS`) and the run's own method section, as a
flat {dotted field: value}, less `RESUMABLE_FIELDS`. Never part of it: the `runtime` section (result-neutral
by contract) and the other methods' sections (adding a field to CASA's section changes no FedPSA run). It is
computed from the config's JSON form alone (`io.config_json`), with neither JAX nor the strategy registry, so
the run-directory code (`io`, `sweep`, the command line's resume) stays light.
"""

from __future__ import annotations

from typing import Any, Mapping

from fedpsa_jax.config.fields import ADDED_FIELDS, MOVED_FIELDS, REMOVED_FIELDS
from fedpsa_jax.config.schema import SHARED_SECTIONS

# Fields that may differ between a run directory's config and the config that continues it, or that counts it
# as a finished sweep member: `sim.virtual_days` may grow (to extend a finished run) but not fall below the
# time of the checkpoint resumed from, and a sweep member is only done at its own budget (`sweep.is_done`);
# `data.data_dir` and `data.path` only say where the same data now lives (what data.path holds is
# `data.fingerprint`, which is part of the identity); the checkpoint fields only how often the run saves and how
# many saves it keeps.
RESUMABLE_FIELDS = ("sim.virtual_days", "data.data_dir", "data.path", "checkpoint.every_days", "checkpoint.keep")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in d.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
  """What makes a run this run, as a flat {dotted field: value}: the shared sections and the section named by
  `config['method']`, less `RESUMABLE_FIELDS`."""
  sections = set(SHARED_SECTIONS) | {config.get("method")}
  return {k: v for k, v in _flatten(config).items()
          if k.split(".", 1)[0] in sections and k not in RESUMABLE_FIELDS}


def identity_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
  """`'field: saved -> current'` (sorted; a field only one side has shows as <absent>) for every field of
  `run_identity` that differs: empty when `current` may continue (or skip) the run `saved` describes. A field
  one side lacks and the other leaves None is no difference: a field added since, unset, so runs written before
  it still resume. Two runs of different methods show only the `method` line and the shared fields (their
  sections are not comparable). A field of `config.fields.ADDED_FIELDS` that one side lacks is that field at the
  value the runs before it had."""
  a, b = run_identity(saved), run_identity(current)
  if saved.get("method") != current.get("method"):
    own = {saved.get("method"), current.get("method")}
    a, b = ({k: v for k, v in d.items() if k.split(".", 1)[0] not in own} for d in (a, b))
  out = []
  for key in sorted(set(a) | set(b)):
    before = ADDED_FIELDS.get(key, "<absent>")  # (what a config written before the field was added means by it)
    va, vb = a.get(key, before), b.get(key, before)
    if (va, vb) in (("<absent>", None), (None, "<absent>")):
      continue  # a field added since, unset (None: a new field's "off"), is the run an older version wrote
    if va != vb:
      out.append(f"{key}: {va!r} -> {vb!r}")
  return out


def fields_of_an_older_schema(saved: Mapping[str, Any]) -> list[str]:
  """'old -> new' (or 'old: gone') for each field of a saved config that has moved or gone since it was written
  (`config.fields.MOVED_FIELDS`, `REMOVED_FIELDS`): such a run directory belongs to an older version."""
  flat = _flatten(saved)
  return ([f"{old} -> {new}" for old, new in MOVED_FIELDS.items() if old in flat]
          + [f"{old}: gone" for old in REMOVED_FIELDS if old in flat])


def what_may_change() -> str:
  """The words an error gives for what may differ when a run is continued."""
  return f"the runtime section, other methods' sections and {', '.join(RESUMABLE_FIELDS)}"
