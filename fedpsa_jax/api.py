"""The notebook API: build a config in Python, run it, look at it, compare runs, explore step by step.

Everything here is a thin layer over the same pieces the command line uses (`config.base_config`,
config files' `get_config(arg)`, `sim.runner.Simulation`, the run directory of `io`), so a run made in a
notebook and one made by `launch.py` leave the same files and the same numbers.

  cfg = config_from("configs/default.py", {"sim.virtual_days": 0.05}, model="linear")
  result = run(cfg)                      # RunResult: .history (DataFrame), .summary, .plot()
  compare([result, run(config_from(cfg, method="fedbuff"))])
  ex = simulate(cfg)                     # Explorer: .run_until(day), .params, .state, .diagnostics()
  load_run("runs/x")                     # a finished run directory as a RunResult

pandas is imported here (the histories are DataFrames); matplotlib only when something is plotted, so
importing the API never picks a plotting backend.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any, Iterable, Mapping, Sequence

import ml_collections
import pandas as pd

from fedpsa_jax import config as config_lib
from fedpsa_jax import io, strategies
from fedpsa_jax.config import shipped
from fedpsa_jax import sweep as sweep_lib
from fedpsa_jax.sim import runner
from fedpsa_jax.tree_util import to_host


# --- configs -----------------------------------------------------------------------------------------


def _config_file(spec: str) -> ml_collections.ConfigDict:
  """'path/to/file.py[:arg]' or a shipped config's name ('default', 'paper/table1:smoke') -> that file's
  get_config(arg), read as `--config=` reads it (`config.load_file`); a path that exists from the working
  directory wins (`config.shipped.locate`). FileNotFoundError saying where it looked."""
  located = shipped.locate_spec(spec)
  if located is None:
    path = spec.partition(":")[0]
    raise FileNotFoundError(f"config file {path!r}: {shipped.not_found(path)}")
  return config_lib.load_file(located)


def _add_missing_sections(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Gives every registered strategy its default section if `c` lacks it.

  base_config() builds one section per strategy registered *when it is called*; a strategy registered
  later (in a notebook) would otherwise meet a config without its hyperparameters.
  """
  for name, cls in strategies.registered().items():
    if name not in c:
      with c.unlocked():
        c[name] = cls.default_config()
  return c


def config_from(source: str | ml_collections.ConfigDict | None = None,
                overrides: Mapping[str, Any] | str | None = None, /,
                **fields: Any) -> ml_collections.ConfigDict:
  """A run config built in Python: a starting point, then overrides.

  `source`: None for `base_config()` (every field's default); a config file as on the command line,
  `'configs/default.py'` or `'configs/default.py:method=fedbuff,alpha=0.5'` (a path from the working
  directory, else the config shipped with the package of that name: `'default'`, `'paper/table1:smoke'`
  from any directory); or an existing ConfigDict, which is copied, never changed.
  `overrides`: a dict of dotted fields (`{'sim.virtual_days': 0.05}`) or a `'key=value,...'` string of
  fields as after the colon of a config file (`config.parse_arg`). `**fields`: more overrides as
  keywords, `__` standing for a dot (`sim__virtual_days=0.05`). The short names of
  `config.OVERRIDE_ALIASES` work everywhere (`alpha`, `dataset`, `model`, `num_clients`, `virtual_days`,
  `concurrency`). They are set with `config.set_fields`.

  An unknown field raises ConfigError (a ValueError) at once, naming it; values are validated when the
  config is run.
  """
  if source is None:
    c = config_lib.base_config()
  elif isinstance(source, ml_collections.ConfigDict):
    c = copy.deepcopy(source)  # variants never alias their parent
  else:
    c = _config_file(source)
  _add_missing_sections(c)
  if isinstance(overrides, str):
    overrides = config_lib.parse_arg(overrides)[1]
  items = dict(overrides or {})
  items.update({key.replace("__", "."): value for key, value in fields.items()})
  return config_lib.set_fields(c, {config_lib.OVERRIDE_ALIASES.get(k, k): v for k, v in items.items()})


def _prepared(config: ml_collections.ConfigDict, progress: bool, caller: str) -> ml_collections.ConfigDict:
  """A private copy of `config` for one run (the caller's object is never changed), with the progress
  switch set and the sections of late-registered strategies added. TypeError naming `config_from` when
  `config` is not a ConfigDict (a config file's path, a dict); ConfigError when it is a sweep config."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise TypeError(f"{caller}(config=...) takes a ConfigDict, not {type(config).__name__} {config!r:.80}; allowed: "
                    f"a config built with config_from, e.g. {caller}(config_from('configs/default.py'))")
  if sweep_lib.is_sweep_config(config):
    raise config_lib.ConfigError(
        f"{caller}(config=...) got the sweep config {config.name!r} (name, base, axes, seeds), not one run's; allowed: "
        f"one member's run config, e.g. {caller}(fedpsa_jax.sweep.expand(sweep)[0].config), or the whole sweep with "
        "python launch.py --mode=sweep --config=FILE")
  c = _add_missing_sections(copy.deepcopy(config))
  c.runtime.progress = bool(progress)
  return c


# --- histories ---------------------------------------------------------------------------------------


def _normalised(record: dict) -> dict:
  """A record exactly as it reads back from a JSON line (io's codec both ways), so in-memory and on-disk
  histories agree."""
  return io.from_json(json.loads(json.dumps(io.to_json(record))))


# events.jsonl's line type and the runner's own columns first, in this order; then the strategy's
# diagnostics, sorted by name (io writes JSON lines with sorted keys, so the order of a record in memory
# cannot be read back from disk, and both must give the same frame).
_LEADING_COLUMNS = ("type", "time", "day", "round", "client_updates", "test_accuracy", "test_loss", "lr",
                    "wall_seconds", "train_seconds")


def _frame(records: Iterable[dict]) -> pd.DataFrame:
  frame = pd.DataFrame([_normalised(r) for r in records])
  leading = [c for c in _LEADING_COLUMNS if c in frame.columns]
  return frame[leading + sorted(c for c in frame.columns if c not in leading)]


# --- results -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
  """One run: its metrics history (one row per evaluation), its summary and where its files are.

  `history` has the columns of metrics.jsonl (`time`, `day`, `round`, `client_updates`,
  `test_accuracy`, `test_loss`, `lr`, `wall_seconds`, ... and the strategy's diagnostics such as
  FedPSA's `temperature`, `kappa` and `weights`, the last two lists per row). `workdir` is None for a
  run kept in memory only.
  """

  history: pd.DataFrame
  summary: dict
  config: ml_collections.ConfigDict | None = None
  workdir: str | None = None
  label: str = ""

  def __post_init__(self):
    if not self.label:
      self.label = str(self.summary.get("method") or (self.config.method if self.config else "run"))

  @property
  def events(self) -> pd.DataFrame:
    """events.jsonl as a DataFrame (one row per received update, `type='update'`, and one per round,
    `type='round'`); empty unless the run had a workdir and `output.events=True`."""
    if not self.workdir:
      return pd.DataFrame()
    return _frame(io.read_events(self.workdir))

  def plot(self, ax: Any = None, x: str = "day", y: str = "test_accuracy", **kwargs: Any) -> Any:
    """Draws `y` against `x` from the history (the learning curve by default) on `ax` (a new figure if
    None), labelled with this run's label; returns the matplotlib Axes. `kwargs` go to `ax.plot`."""
    return compare([self], x=x, y=y, ax=ax, **kwargs)

  def __repr__(self) -> str:
    s = self.summary
    if s.get("final_test_accuracy") is None:
      return f"RunResult({self.label!r}, {len(self.history)} evaluations, workdir={self.workdir!r})"
    return (f"RunResult({self.label!r}: {s.get('status')}, final acc {s['final_test_accuracy']:.4f}, "
            f"AULC {s.get('aulc', float('nan')):.4f} over {s.get('virtual_days', float('nan')):.3f} days, "
            f"{s.get('rounds')} rounds, workdir={self.workdir!r})")


def _result_of(sim: runner.Simulation, summary: dict, workdir: str | None, label: str | None) -> RunResult:
  return RunResult(history=_frame(sim.history), summary=summary, config=sim.config, workdir=workdir,
                   label=label or "")


def run(config: ml_collections.ConfigDict, workdir: str | None = None, *, progress: bool = True,
        label: str | None = None) -> RunResult:
  """Runs `config` to the end of its budget and returns its RunResult.

  The config is validated first (a bad value raises ValueError naming the field) and copied, so the
  caller's object is not changed. With a `workdir` the run leaves the same files as `launch.py`
  (config.json, metrics.jsonl, summary.json, events.jsonl if `output.events`, checkpoints), and a
  workdir that already holds a run of the same config continues it, as `launch.py` does; without one
  the run stays in memory. `progress` shows a progress bar over virtual days (a widget in Jupyter).
  `label` names the run in plots (default: the method).
  """
  sim = runner.Simulation(_prepared(config, progress, "run"), workdir)
  summary = sim.run()
  return _result_of(sim, summary, workdir, label)


def load_run(workdir: str | os.PathLike, label: str | None = None) -> RunResult:
  """A run directory written by `run(..., workdir)` or `launch.py` as a RunResult.

  Reads metrics.jsonl (required; or metrics.jsonl.xz, as a records directory keeps it), summary.json and
  config.json (empty / None when absent, e.g. for a run that is still going or was killed before writing them).
  """
  if not io.stored(os.path.join(workdir, io.METRICS_FILE)):
    raise FileNotFoundError(f"{workdir!r} is not a run directory: it has no {io.METRICS_FILE}")
  record = io.read_run(workdir, events=False)  # (RunResult.events reads them when asked)
  config = ml_collections.ConfigDict(record.config) if record.config is not None else None
  return RunResult(history=_frame(record.metrics), summary=record.summary or {}, config=config,
                   workdir=os.fspath(workdir), label=label or "")


RunLike = RunResult | str | os.PathLike  # a result, or a run directory to load


def compare(results: Sequence[RunLike] | Mapping[str, RunLike], *, x: str = "day", y: str = "test_accuracy",
            ax: Any = None, labels: Sequence[str] | None = None, title: str | None = None,
            **kwargs: Any) -> Any:
  """Draws `y` against `x` for several runs on one Axes, one labelled line each; returns the Axes.

  `results`: RunResults or run directories (loaded with `load_run`), as a list (labels: each run's
  label, i.e. its method unless given) or a dict {label: run}. `labels` overrides the labels of a
  list. `ax`: the Axes to draw on (a new figure if None). `kwargs` go to every `ax.plot` call.
  """
  import matplotlib.pyplot as plt  # here, not at import: the API must not pick a backend by itself

  if isinstance(results, Mapping):
    labels, results = list(results.keys()), list(results.values())
  runs = [load_run(r) if isinstance(r, (str, os.PathLike)) else r for r in results]
  if labels is not None and len(labels) != len(runs):
    raise ValueError(f"labels has {len(labels)} entries for {len(runs)} runs")
  if ax is None:
    _, ax = plt.subplots(figsize=(6, 4))
  for i, r in enumerate(runs):
    for column in (x, y):
      if column not in r.history:
        raise ValueError(f"run {r.label!r} has no column {column!r}; it has: {list(r.history.columns)}")
    ax.plot(r.history[x], r.history[y], label=labels[i] if labels is not None else r.label, **kwargs)
  ax.set_xlabel("virtual day" if x == "day" else x.replace("_", " "))
  ax.set_ylabel(y.replace("_", " "))
  if title:
    ax.set_title(title)
  ax.grid(True, alpha=0.3)
  ax.legend()
  return ax


# --- step-wise exploration ---------------------------------------------------------------------------


class Explorer:
  """A run that a notebook advances step by step (built by `simulate`).

  `run_until(day)` moves the virtual clock (evaluating when due, as a full run would); in between, the
  current global parameters (`params`), the strategy's server state (`state`), its diagnostics (for
  FedPSA the last flush's κ and weights and the thermometer's temperature) and the history so far can
  be read. `finish()` runs to the end of the budget and returns the RunResult; the numbers equal those
  of `run(config)`, since both drive the same `Simulation`.
  """

  def __init__(self, simulation: runner.Simulation, workdir: str | None = None, label: str | None = None):
    self.simulation = simulation
    self.workdir = workdir
    self.label = label
    self.result: RunResult | None = None  # set by finish()

  @property
  def strategy(self) -> strategies.Strategy:
    """The strategy object of this run (its hooks: `diagnostics`, `client`, `eval_models`...)."""
    return self.simulation.strategy

  @property
  def state(self) -> Any:
    """The strategy's current server state (a pytree; e.g. FedPSA's temperature, queue, last_kappas)."""
    return self.simulation.state

  @property
  def params(self) -> Any:
    """The global parameters the test set is evaluated on now (`strategy.eval_models(state).params`)."""
    return self.simulation.strategy.eval_models(self.simulation.state).params

  @property
  def day(self) -> float:
    """The current virtual time in days."""
    return self.simulation.loop.now / config_lib.UNITS_PER_DAY

  @property
  def round(self) -> int:
    """The number of global-model changes (aggregations) so far."""
    return self.simulation.loop.round

  @property
  def history(self) -> pd.DataFrame:
    """The evaluations so far, one row each (the columns of metrics.jsonl)."""
    return _frame(self.simulation.history)

  def run_until(self, day: float) -> "Explorer":
    """Advances virtual time to `day` (capped at the budget: `math.inf` runs to its end; a day already passed
    changes nothing), evaluating when due; returns self, so that a notebook cell shows where the run
    stands. ValueError for NaN."""
    self.simulation.run_until(day)
    return self

  def diagnostics(self) -> dict[str, Any]:
    """The strategy's diagnostics of the current state (FedPSA: `temperature`, `thermometer_ready` and,
    after the first flush, the `kappa` and `weights` of the last flush), as Python numbers and lists."""
    return to_host(self.simulation.strategy.diagnostics(self.simulation.state))

  def evaluate(self) -> dict[str, float]:
    """Test accuracy and loss of the current global parameters, now (not logged in the history)."""
    return self.simulation.evaluate(self.params)

  def finish(self) -> RunResult:
    """Runs to the end of the budget, writes summary.json (with a workdir) and returns the RunResult."""
    if self.result is None:
      summary = self.simulation.run()
      self.result = _result_of(self.simulation, summary, self.workdir, self.label)
    return self.result

  def __repr__(self) -> str:
    last = self.simulation.history[-1] if self.simulation.history else {}
    acc = f", test acc {last['test_accuracy']:.4f} at day {last['day']:.4f}" if last else ""
    return (f"Explorer({self.simulation.config.method!r}: day {self.day:.4f} of "
            f"{self.simulation.budget / config_lib.UNITS_PER_DAY:.4f}, round {self.round}{acc})")


def simulate(config: ml_collections.ConfigDict, workdir: str | None = None, *, progress: bool = True,
             label: str | None = None) -> Explorer:
  """Builds a run of `config` without running it: an Explorer to advance with `run_until(day)` and
  inspect in between. Validation, copying, `workdir` and `progress` as in `run`."""
  return Explorer(runner.Simulation(_prepared(config, progress, "simulate"), workdir), workdir, label)
