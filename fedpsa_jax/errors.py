"""User errors: bad input found before any work (a config value, a workdir, a resume that cannot be).

This module imports nothing from the project (nor JAX), so that every layer, down to the run-directory
reader and the sweep and report tools, can raise and catch the same error. `launch.py` turns it into one
message and exit code 2, without a traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
  """Bad input found before any training: a config value, the workdir, or a resume that cannot be.

  A ValueError, so callers that catch ValueError (notebooks, older code) keep working. The message names
  the field or flag, the value, and what is allowed."""
