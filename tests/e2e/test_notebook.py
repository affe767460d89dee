"""notebooks/quickstart.ipynb: committed without outputs, and executed top to bottom in a real Jupyter kernel
(nbclient + ipykernel, offline) so that it cannot rot. About a minute on a 2-core CPU."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


def cells_tagged(nb, tag: str) -> list:
  return [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]


def outputs_text(cell) -> str:
  parts = []
  for out in cell.get("outputs", []):
    if out.output_type == "stream":
      parts.append(out.text)
    elif "data" in out:
      parts.append(str(out.data.get("text/plain", "")))
  return "\n".join(parts)


def has_image(cell) -> bool:
  return any("data" in out and "image/png" in out.data for out in cell.get("outputs", []))


def test_notebook_is_committed_with_outputs_cleared():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


@pytest.fixture
def kernel_of_this_python(tmp_path, monkeypatch) -> str:
  """A kernelspec running this interpreter, so the notebook sees this environment's packages even if
  another 'python3' kernel is installed for the user."""
  spec_dir = tmp_path / "jupyter" / "kernels" / "fedpsa-test"
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "fedpsa-test", "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  # The package from this checkout, as a notebook opened in it would import it.
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend, which yields PNG outputs
  return "fedpsa-test"


@pytest.mark.ci  # (a Jupyter kernel)
def test_quickstart_runs_top_to_bottom(tmp_path, kernel_of_this_python):
  workdir = tmp_path / "notebook"
  workdir.mkdir()
  path = workdir / NOTEBOOK.name
  shutil.copy(NOTEBOOK, path)  # executed from a copy: the committed file stays clean
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name=kernel_of_this_python,
                                   resources={"metadata": {"path": str(workdir)}})
  client.execute()  # raises CellExecutionError naming the cell on any error

  for cell in nb.cells:
    for out in cell.get("outputs", []):
      assert out.output_type != "error", cell.source[:80]
      if out.output_type == "stream" and out.name == "stderr":
        assert "Traceback" not in out.text, out.text[-2000:]
        assert "IProgress not found" not in out.text  # tqdm.auto found ipywidgets: bars are widgets

  (runs,) = cells_tagged(nb, "runs")
  assert any("data" in out and "application/vnd.jupyter.widget-view+json" in out.data for out in runs.outputs)

  (compare,) = cells_tagged(nb, "compare")
  assert has_image(compare), "the FedPSA/FedBuff comparison figure was not drawn"
  (profile,) = cells_tagged(nb, "profile")
  assert "sensitivity_eq8" in outputs_text(profile) and "client_update" in outputs_text(profile)
  (custom,) = cells_tagged(nb, "custom_strategy")
  assert "RunResult('fedbuff (hinge)': completed" in outputs_text(custom) and has_image(custom)
