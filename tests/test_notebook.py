"""colab/quickstart.ipynb runs top to bottom (quick config, hub part skipped) in a kernel of this environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "colab" / "quickstart.ipynb"


def test_quickstart_notebook_runs(tmp_path, tmp_path_factory, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    workdir = tmp_path / "job"
    monkeypatch.setenv("IPL_JAX_NOTEBOOK_CONFIG", "synthetic:quick")
    monkeypatch.setenv("IPL_JAX_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("IPL_JAX_HUB", "0")  # the hub part must announce that it is skipped
    monkeypatch.setenv("IPL_JAX_QUIET", "1")
    # shared with test_pipeline_run's jobs (same config): each program compiles once per test session
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jax_compilation_cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()

    def outputs(i):
        out = []
        for o in nb.cells[i].get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o["text"])
            elif "data" in o:
                out.append(json.dumps(sorted(o["data"])))
        return "".join(out)

    text = [outputs(i) for i in range(len(nb.cells))]
    joined = "\n".join(text)
    # the kernel ran this checkout with this interpreter's packages
    assert str(REPO / "ipl_jax") in joined
    # the per-round table, the plot and one tree were shown
    assert "total match" in joined and "round 1" in joined
    assert any("image/png" in t for t in text)
    assert any("text/html" in t for t in text)
    assert "Part 2 skipped" in joined
    results = json.loads((workdir / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [0, 1]
