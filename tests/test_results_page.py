"""docs/results.md against the committed reports: every effect with its interval in a table of the page, and the
Holm p beside it, is one row of a report that the page's section links (results/<sweep>/report/*.md), so the page
cannot drift from what `make results-report` draws from the records. The "Power as run" figures are recomputed from
the reports' intervals; other prose figures (rounded, in sentences) are not checked: the tables hold the claims."""

from __future__ import annotations

import csv
import math
import os
import re

import pytest
import scipy.optimize
import scipy.stats

from fedpsa_lab import report_stats
from helpers import ROOT

PAGE = os.path.join(ROOT, "docs", "results.md")
NUMBER = r"[+\-−]?\d+\.\d+"
# An effect with its interval, as the reports print it: "+1.66 ± 1.37" or "+0.022 [-0.248, +0.290]".
ESTIMATE = re.compile(rf"^({NUMBER}) (± \d+\.\d+|\[{NUMBER}, {NUMBER}\])$")
P_VALUE = re.compile(r"^\d\.\d{3}$")
REPORT_LINK = re.compile(r"(results/[\w./-]+/report/[\w.-]+\.md)")


def _cells(line: str) -> list[str]:
  return [c.strip().replace("−", "-") for c in line.strip().strip("|").split("|")]


def _sections(text: str) -> list[tuple[str, str]]:
  """(heading, body) of each '## ' section."""
  parts = re.split(r"^## ", text, flags=re.M)[1:]
  return [(p.splitlines()[0], p) for p in parts]


def _claims(body: str) -> list[tuple[str, str | None]]:
  """(estimate, the p cell after it or None) for each estimate cell of the section's table rows."""
  claims = []
  for line in body.splitlines():
    if not line.startswith("|") or set(line) <= set("|-: "):
      continue
    cells = _cells(line)
    for i, cell in enumerate(cells):
      if ESTIMATE.match(cell):
        after = cells[i + 1] if i + 1 < len(cells) else ""
        claims.append((cell, after if P_VALUE.match(after) else None))
  return claims


def _report_rows(paths: list[str]) -> list[list[str]]:
  rows = []
  for path in paths:
    with open(os.path.join(ROOT, path)) as f:
      rows += [_cells(line) for line in f if line.startswith("|")]
  return rows


SECTIONS = [(heading, body) for heading, body in _sections(open(PAGE).read()) if _claims(body)]


def test_the_page_has_tables_of_results_to_check():
  assert len(SECTIONS) >= 2 and sum(len(_claims(body)) for _, body in SECTIONS) >= 12


@pytest.mark.parametrize("heading,body", SECTIONS, ids=[h.split(".")[0] for h, _ in SECTIONS])
def test_every_estimate_of_a_section_is_a_row_of_the_reports_it_links(heading, body):
  links = sorted(set(REPORT_LINK.findall(body)))
  assert links, f"{heading!r} states results but links no report"
  rows = _report_rows(links)
  for estimate, p in _claims(body):
    matching = [row for row in rows if estimate in row and (p is None or p in row[row.index(estimate) + 1:])]
    assert matching, f"{heading!r}: {estimate} (p {p}) is in no row of {links}"


def test_a_changed_figure_is_caught():
  # The check itself: the same section with one digit of one estimate changed finds no row.
  heading, body = SECTIONS[0]
  estimate, _ = _claims(body)[0]
  changed = estimate[:-1] + str((int(estimate[-1]) + 1) % 10)
  rows = _report_rows(sorted(set(REPORT_LINK.findall(body))))
  assert any(estimate in row for row in rows) and not any(changed in row for row in rows)


def _report_csv(sweep: str, name: str) -> list[dict[str, str]]:
  with open(os.path.join(ROOT, "results", sweep, "report", name), newline="") as f:
    return list(csv.DictReader(f))


def _sd_of(half_width: float, n: int) -> float:
  """The spread over n units that a 95% t-interval's half-width implies: h·√n / t(0.975, n − 1)."""
  return half_width * math.sqrt(n) / scipy.stats.t.ppf(0.975, n - 1)


def _effect_with_80_percent_power(sd: float, n: int, level: float = report_stats.SIGNIFICANCE) -> float:
  return scipy.optimize.brentq(lambda effect: report_stats.power_paired_t(sd, n, effect, level) - 0.8, 1e-6, 100.0)


def _section(prefix: str) -> str:
  return next(body for heading, body in _sections(open(PAGE).read()) if heading.startswith(prefix))


def test_the_power_as_run_figures_follow_from_the_committed_reports():
  # The "Power as run" figures of Q1-Q3, recomputed from the reports' intervals, are the ones the page states.
  q1 = {r["contrast"]: r for r in _report_csv("shape_step", "contrasts.csv")
        if r["endpoint"] == "tail_test_accuracy" and r["block"] == "all"}
  total = q1["FedPSA − FedBuff (all of it)"]
  assert f"is {_sd_of(float(total['ci95_half_width']), int(total['seeds'])):.2f} points" in _section("Q1.")

  q2 = [r for r in _report_csv("horizon", "contrasts.csv") if r["endpoint"] == "tail_test_accuracy"]
  sds = [_sd_of(float(r["ci95_half_width"]), int(r["seeds"])) for r in q2]
  effects = [_effect_with_80_percent_power(sd, int(r["seeds"])) for sd, r in zip(sds, q2)]
  power_line = " ".join(line.strip() for line in _section("Q2.").split("**Power as run:**")[1].splitlines()[:4])
  assert [r["contrast"] for r in q2] == ["FedPSA − FedBuff", "κ: FedPSA − uniform", "near-exact κ − k = 16 κ"]
  assert (f"are {sds[0]:.2f} (FedPSA − FedBuff), {sds[1]:.2f} (κ − uniform) and {sds[2]:.2f} (near-exact − k = 16)"
          in power_line)
  assert f"80% power for {effects[0]:.2f}, {effects[1]:.2f} and {effects[2]:.2f} points" in power_line
  # ...and for the test read, Holm's over the family: its first threshold, 0.05 / 3 (Q2) and 0.05 / 4 (Q1).
  holm = [_effect_with_80_percent_power(sd, int(r["seeds"]), 0.05 / 3) for sd, r in zip(sds, q2)]
  power_line = " ".join(_section("Q2.").split("**Power as run:**")[1].split())
  assert f"(0.05 / 3), the test read, 80% power for {holm[0]:.2f}, {holm[1]:.2f} and {holm[2]:.2f} points" in power_line
  q1_sd = _sd_of(float(total["ci95_half_width"]), int(total["seeds"]))
  q1_text = " ".join(_section("Q1.").split("**Power as run:**")[1].split())
  assert (f"it had {100 * report_stats.power_paired_t(q1_sd, 8, 1.0, 0.05 / 4):.0f}% power for one point, and 80% only "
          f"for {_effect_with_80_percent_power(q1_sd, 8, 0.05 / 4):.2f} points") in q1_text
  q1_design = " ".join(_section("Q1.").split("**Power.**")[1].split("**Members")[0].split())
  assert (f"{100 * report_stats.power_paired_t(0.86, 8, 1.0, 0.05 / 4):.0f}% power for one point at SD 0.86 (80% for "
          f"{_effect_with_80_percent_power(0.86, 8, 0.05 / 4):.2f} points)") in q1_design

  q3 = {r["group"]: r for r in _report_csv("horizon", "partial_correlations.csv") if "arrival_time" not in r["given"]}
  z_sd = {group: _sd_of((math.atanh(float(r["run_partial_high"])) - math.atanh(float(r["run_partial_low"]))) / 2,
                        int(r["runs"])) for group, r in q3.items()}
  r80 = {g: math.tanh(_effect_with_80_percent_power(sd, int(q3[g]["runs"]))) for g, sd in z_sd.items()}
  runs_for_k16 = next(n for n in range(3, 1000)
                      if report_stats.power_paired_t(z_sd["method=fedpsa"], n, math.atanh(0.14)) >= 0.8)
  text = " ".join(_section("Q3.").split())
  assert f"SD {z_sd['method=fedpsa']:.2f} on Fisher's z scale, against {z_sd['method=fedpsa_exact']:.2f}" in text
  assert f"partial r of {r80['method=fedpsa']:.2f} (k = 16) and {r80['method=fedpsa_exact']:.2f} (near-exact)" in text
  assert f"needs about {runs_for_k16} runs" in text
