"""The run config, split by job:

- `schema`: every field with its meaning and default (`base_config()`; `runtime`, the result-neutral knobs);
- `rules`: validation (`validate`, `config_errors`; `validate_data` once the dataset is loaded);
- `fields`: what a user types: a config file (`load_file`), `set_fields(c, {dotted: value})` and a config
  file's `:arg` (`parse_arg`).

A run's identity (what must match to resume a run or skip a finished sweep member) is beside the run-directory
code, in `fedpsa_jax/run_identity.py`. This package needs only the standard library, ml_collections and the
leaf modules `errors`, `validation` and `choices`; the strategy registry (which imports JAX) is looked up when
a config is built or validated, not on import, so `io`, `sweep` and `report` import without JAX.
"""

from fedpsa_jax.config.fields import (MOVED_FIELDS, OVERRIDE_ALIASES, REMOVED_FIELDS, data_path_replaces_name,
                                     exited_in, literal_value, load_file, parse_arg, quiet_loader, set_fields,
                                     split_items, unknown_field)
from fedpsa_jax.config.rules import FIELD_RULES, DataSizes, config_errors, data_errors, validate, validate_data
from fedpsa_jax.config.schema import (MAX_DAYS, RUNTIME_SECTION, SHARED_SECTIONS, UNITS_PER_DAY, base_config,
                                      budget_units, concurrency, eval_every_units, runtime_config)
from fedpsa_jax.errors import ConfigError  # (the same class as `fedpsa_jax.errors.ConfigError`)
from fedpsa_jax.validation import INT64_MAX

__all__ = ["ConfigError", "DataSizes", "FIELD_RULES", "INT64_MAX", "MAX_DAYS", "MOVED_FIELDS", "OVERRIDE_ALIASES",
           "REMOVED_FIELDS", "RUNTIME_SECTION", "SHARED_SECTIONS", "UNITS_PER_DAY", "base_config", "budget_units",
           "concurrency", "config_errors", "data_errors", "data_path_replaces_name", "eval_every_units", "load_file",
           "exited_in", "literal_value", "parse_arg", "quiet_loader", "runtime_config", "set_fields", "split_items",
           "unknown_field", "validate", "validate_data"]
