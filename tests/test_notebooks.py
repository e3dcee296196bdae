"""The notebooks in notebooks/ run from top to bottom on the tiny runs of the ``e2e`` fixture and draw figures."""

from __future__ import annotations

import shutil

import pytest

from lmcbench_testlib import REPO

NOTEBOOKS = REPO / "notebooks"
pytestmark = pytest.mark.slow  # every notebook runs on the e2e fixture's trained series

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def execute(name: str, monkeypatch, **env) -> list:
    """Run notebooks/<name> in a fresh kernel (which inherits ``env``); returns the outputs of every cell."""
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend is what makes image outputs
    nb = nbformat.read(str(NOTEBOOKS / name), as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, "\n".join(f"{e['ename']}: {e['evalue']}" for e in errors)
    return outputs


def images(outputs) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs)


def text(outputs) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)


def _ok(e2e):
    for name in ("run1", "run2"):
        p = e2e[name]["proc"]
        assert p.returncode == 0, p.stderr[-2000:]


def test_compressibility_from_records(e2e, monkeypatch):
    _ok(e2e)
    out = execute("compressibility_over_training.ipynb", monkeypatch, LMCBENCH_RUN=e2e["run1"]["dir"])
    assert images(out) >= 2  # ratio against step, delta gain (and the chosen tensor)
    t = text(out)
    assert "records.csv" in t and "delta / raw" in t and "ratio at every step" in t


def test_compressibility_from_summary_only(e2e, monkeypatch, tmp_path):
    _ok(e2e)
    run = tmp_path / "results_like"
    run.mkdir()
    shutil.copy(e2e["run1"]["dir"] / "summary.csv", run / "summary.csv")
    out = execute("compressibility_over_training.ipynb", monkeypatch, LMCBENCH_RUN=run)
    assert images(out) >= 2
    assert "using summary.csv" in text(out) and "need the run's records.csv" in text(out)


def test_codec_sweep(e2e, monkeypatch):
    _ok(e2e)
    out = execute("codec_sweep.ipynb", monkeypatch, LMCBENCH_SWEEP=e2e["sweep"])
    assert images(out) >= 1
    t = text(out)
    assert "2 runs" in t and "codec_label" in t
