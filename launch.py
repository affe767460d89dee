"""Entry point from a clone: `python launch.py --config=configs/default.py[:arg] [--config.field=value ...]
[--mode=train|profile|sweep|report] [--workdir=DIR]`, the same command as the installed `fedpsa-jax`.

The flags, the modes and the exit codes are in fedpsa_lab/launch.py (`--helpshort` lists the flags;
docs/runs.md is the reference). This file only runs that command, so that a clone needs no install.
"""

from fedpsa_lab import launch

if __name__ == "__main__":
  launch.main()
