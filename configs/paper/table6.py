"""Table 6: FedPSA's ablations (w/o T, w/o S, w/o T&S, full) × concurrency p ∈ {0.1, 0.2, 0.3} × α ∈ {1.0, 0.1}.

CIFAR-10 (the paper's full-model numbers at p = 0.2 match its Table 2 CIFAR-10 column): 24 members.
`smoke`: embedded-data stand-in (fedpsa_lab/paper.py).

The readings of the ablations (fedpsa_jax/strategies/fedpsa.py says why): "w/o T" fixes Temp at γ + δ = 5.5,
a nearly uniform softmax; "w/o S" sketches the raw parameters, whose κ ≈ 1 for every client, so it is nearly
uniform too; "w/o T&S" is both. Near-uniform variants can hardly show the paper's large gaps between them
(non-IID, p = 0.1: w/o T 53.30, w/o T&S 44.08).

`temps` (e.g. `table6.py:temps` or `table6.py:smoke,temps`) adds the fixed-temperature axis: beside each
variant without the thermometer (w/o T, w/o T&S, at Temp = γ + δ) the same variant at the sharper fixed
temperatures of `fixed_temperatures` (Temp = 1 and Temp = δ = 0.5): 48 members, the table's rows then reading
Temp ∈ {γ + δ, 1, δ} for each. The paper's 24 members keep their names, so `temps` run into the workdir of
a finished Table 6 trains only the 24 new ones.
"""

from __future__ import annotations

import ml_collections

from fedpsa_jax import sweep
from fedpsa_lab import paper

# (label, fedpsa.no_temperature, fedpsa.no_sensitivity), in the paper's row order.
VARIANTS = (("no_t", True, False), ("no_s", False, True), ("no_ts", True, True), ("full", False, False))


def fixed_temperatures(fedpsa: ml_collections.ConfigDict) -> tuple[tuple[str, float], ...]:
  """The `temps` axis beside γ + δ (the plain variant, fedpsa.fixed_temperature = 0), as (name, Temp): Temp = 1
  and Temp = δ, a softmax 5.5 and 11 times sharper than at the paper's γ + δ = 5.5. (Names, not values, go into
  the labels: a label becomes a ConfigDict key, which cannot hold a dot.)"""
  return (("1", 1.0), ("delta", float(fedpsa.delta)))


def variant_axis(base: ml_collections.ConfigDict, temps: bool) -> sweep.Axis:
  """The variant axis: the paper's four, and with `temps` each variant without the thermometer also at
  every temperature of `fixed_temperatures` (labelled `<variant>-T<name>`, e.g. `no_t-Tdelta`)."""
  values = []
  for name, no_t, no_s in VARIANTS:
    switches = {"fedpsa.no_temperature": no_t, "fedpsa.no_sensitivity": no_s}
    values.append((name, switches))
    if temps and no_t:
      values += [(f"{name}-T{t_name}", {**switches, "fedpsa.fixed_temperature": temp})
                 for t_name, temp in fixed_temperatures(base.fedpsa)]
  return ("variant", values)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options, overrides = paper.parse_arg(arg, temps=False)  # temps: the fixed-temperature readings
  smoke, seeds, temps = options.smoke, paper.seeds(options), options.temps
  base = paper.paper_base(smoke)
  base.method = "fedpsa"
  paper.on_dataset(base, "cifar10", smoke)
  display = dict(paper.DISPLAY_NAMES)
  if temps:  # every row of a variant without the thermometer says its Temp
    for name, no_t, _ in VARIANTS:
      if no_t:
        display.update({f"{name}-T{t_name}": f"{display[name]} (Temp={'' if t_name == '1' else 'δ='}{temp:g})"
                        for t_name, temp in fixed_temperatures(base.fedpsa)})
        display[name] = f"{display[name]} (Temp=γ+δ={base.fedpsa.gamma + base.fedpsa.delta:g})"
  return paper.sweep_config(
      "table6" + ("-smoke" if smoke else "") + ("-temps" if temps else ""),
      "Table 6: ablation study of FedPSA under different settings (CIFAR-10, final accuracy %)"
      + (", with w/o T and w/o T&S also at fixed Temp = 1 and δ" if temps else ""),
      base,
      [paper.alpha_axis((1.0, 0.1)), variant_axis(base, temps),
       sweep.axis("concurrency", (0.1, 0.2, 0.3), "sim.concurrency")],
      seeds,
      {"rows": ["alpha", "variant"], "cols": ["concurrency"], "display": display}, overrides=overrides)
