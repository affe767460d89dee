"""fedpsa-lab: the analysis beside the simulator: sweeps' tables and statistics, figures, the paper's setup.

The simulator (`fedpsa_jax`) runs experiments and writes run directories; this package reads them back and
draws what a paper shows. It imports the simulator, never the reverse (docs/architecture.md, "Two packages"):

- `paper`: the paper's experimental setup (Sec. 6.1) and published numbers, shared by `configs/paper/*.py`;
- `report_stats`: the statistics of a table (intervals over seeds, paired differences, Holm's correction);
- `report_lib`: the pieces a report is made of (the paper-layout table, figures, writers);
- `figures`: figure plug-ins per method (FedPSA's Fig. 5 and 6, AiFed, CASA, the buffer weights);
- `report`: the report driver (`build(workdir)`), for a sweep or a run directory;
- `modes`: launch.py's `--mode=report`.
"""
