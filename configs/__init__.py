"""The run and sweep configs, installed with the package as `fedpsa_configs` (pyproject.toml maps this folder).

Not imported: each file is read by path, as `--config=FILE[:arg]` and `fedpsa_jax.config_from` read it, and from
any directory by its name here (`default`, `paper/table1`, `results/horizon`; `fedpsa_jax/config/shipped.py`).
This file only makes the folder a package that an installed wheel carries.
"""
