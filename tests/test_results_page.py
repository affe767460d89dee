"""docs/results.md against the committed reports: every effect with its interval in a table of the page, and the
Holm p beside it, is one row of a report that the page's section links (results/<sweep>/report/*.md), so the page
cannot drift from what `make results-report` draws from the records. Prose figures (rounded, in sentences) are not
checked; the tables hold the claims."""

from __future__ import annotations

import os
import re

import pytest

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
