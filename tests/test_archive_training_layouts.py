"""lmc-archive on the checkpoints real training writes, and resuming from what it restores.

Three real runs on the CPU, two gloo ranks each: DeepSpeed ZeRO-2 and ZeRO-3 (``deepspeed_train.py big-zero2`` /
``big-zero3``: ``global_step<N>/`` with the module states and the per-rank optimizer states, fp32 master weights
and both Adam moments) and FSDP2 saving torchtitan-style DCP step folders (``fsdp_train.py``: ``step-<N>/`` with
``.metadata`` and ``__<rank>_0.distcp``). Each run is archived with ``lmc-archive compress``; every tensor file must
be coded tensor by tensor (each step against the next), the opaque share must stay under 1%, every restored file
must be byte-identical, and the framework's own resume from a restored step must give the same losses and weights
as its resume from the original step.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from lmc.archive import Archive  # noqa: E402
from lmc.archive import main as archive_main  # noqa: E402

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
HAVE_DEEPSPEED = __import__("importlib").util.find_spec("deepspeed") is not None


def _run(*args, timeout=600):
    r = subprocess.run([sys.executable, *map(str, args)], env=ENV, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module", params=["big-zero2", "big-zero3", "titan"])
def run(request, tmp_path_factory):
    mode = request.param
    out = tmp_path_factory.mktemp(mode) / "run"
    if mode == "titan":
        _run(HERE / "fsdp_train.py", "train", out, "--steps", "6", "--save-every", "2")
    else:
        if not HAVE_DEEPSPEED:
            pytest.skip("deepspeed is not installed (pip install -e '.[test]' installs it)")
        _run(HERE / "deepspeed_train.py", out, mode)
    return mode, out


def _files(tree: Path) -> dict:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


def _resume(mode, root: Path, step: int, out_json: Path) -> dict:
    if mode == "titan":
        _run(HERE / "fsdp_train.py", "resume", root / f"step-{step}", out_json, "--more", "2")
    else:
        _run(HERE / "deepspeed_train.py", root, f"resume-{mode}", f"global_step{step}", out_json)
    return json.loads(out_json.read_text())


def test_archived_tensor_by_tensor_restored_byte_identical_and_resumes_the_same(run, tmp_path, capsys):
    mode, out = run
    arc = tmp_path / "run.lmca"
    assert archive_main(["compress", str(out), str(arc)]) == 0
    a = Archive(arc)
    es = a.entries()
    steps = [e["step"] for e in es]
    assert len(steps) >= 3
    for e in es:  # configs, pickles and zip directories only
        assert e["opaque"] < e["bytes_in"] / 100, (e, a.opaque(e["step"]))
    with a._view() as v:
        for e in es:
            # (ZeRO-3's model-states files hold the parameters empty: small, kept as bytes)
            big = [fe for fe in v.index(e["step"])["files"]
                   if fe["path"].endswith((".pt", ".distcp")) and fe["size"] >= 64 << 10]
            assert big and all(fe["kind"] == "torchzip" for fe in big)
            tensor_files = [fe for fe in v.index(e["step"])["files"] if fe["kind"] == "torchzip"]
            refs = [p["ref"] for fe in tensor_files for p in fe["parts"] if p["t"] == "tensor"]
            assert refs and all(p["enc"] == "lmc" for fe in tensor_files for p in fe["parts"] if p["t"] == "tensor")
            assert any(refs) == (e["depends_on"] is not None)
        assert es[-1]["depends_on"] is None and all(e["depends_on"] is not None for e in es[:-1])
    # smaller than every file compressed alone with zstd-3, at every step
    import zstandard
    z = zstandard.ZstdCompressor(level=3)
    for e in es:
        folder = out / e["name"]
        assert e["size"] < sum(len(z.compress(p.read_bytes())) for p in folder.rglob("*") if p.is_file())
    capsys.readouterr()
    assert archive_main(["ls", "--opaque", str(arc)]) == 0
    assert "opaque%" in capsys.readouterr().out
    restored = tmp_path / "restored"
    assert archive_main(["restore", str(arc), str(restored)]) == 0
    for e in es:
        assert _files(restored / e["name"]) == _files(out / e["name"])
    # the framework resumes from the restored middle step exactly as from the original
    mid = steps[len(steps) // 2]
    if mode != "titan":
        for n in ("latest", "zero_to_fp32.py"):  # files of the run folder, beside the step folders
            if (out / n).exists():
                shutil.copy(out / n, restored / n)
    a1 = _resume(mode, out, mid, tmp_path / "orig.json")
    a2 = _resume(mode, restored, mid, tmp_path / "restored.json")
    assert a1 == a2 and len(a1["losses"]) == 2
