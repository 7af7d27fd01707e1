"""The examples run: the quickstart notebook executes top to bottom in a real Jupyter kernel."""
from __future__ import annotations

import pytest
import yaml

from spotlight.config import PROJECT_ROOT
from tests.pipelines.conftest import TINY_RUN

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    import nbclient
    import nbformat

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_RUN))
    monkeypatch.setenv("SPOTLIGHT_QUICKSTART_CONFIG", str(config))
    notebook = nbformat.read(PROJECT_ROOT / "examples" / "quickstart.ipynb", as_version=4)
    work = tmp_path / "examples"
    work.mkdir()
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(work)}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "running in the background: True" in outputs
    assert "iteration 0:" in outputs and "spotlight audit" in outputs
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in notebook.cells for o in c.get("outputs", []))   # the plot
    assert (work / "runs").is_dir()   # the run store, next to the notebook
