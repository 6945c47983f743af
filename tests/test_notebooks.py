"""Every notebook in notebooks/ is valid, says what to install, and executes top to bottom."""

from __future__ import annotations

import json
import re
import warnings

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_says_what_to_install(path):
    # nbformat.read fills in a missing cell id (with a warning), so look at the file itself.
    cells = json.loads(path.read_text())["cells"]
    missing = [i for i, cell in enumerate(cells) if "id" not in cell]
    assert not missing, f"{path.name}: cells {missing} have no id"
    ids = [cell["id"] for cell in cells]
    assert len(set(ids)) == len(ids), f"{path.name}: repeated cell ids {ids}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
    # A notebook that draws plots says in its first cell that they need matplotlib.
    code = "".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    first = next(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    if "agentenv_jax.workflow.plotting" in code:
        assert "matplotlib" in first, first
        assert re.search(r"pip install 'agentenv_jax\[([\w-]+,)*plot\b", first), first


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    errors = [
        o
        for cell in notebook.cells
        for o in cell.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
