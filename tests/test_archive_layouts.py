"""lmc-archive on real training runs in the layouts large runs write, and resuming from what it restores.

Four real runs on the CPU, two gloo ranks (processes) each, written by ``train_layouts.py``: a Hugging Face
Trainer with DeepSpeed ZeRO-2 and ZeRO-3 (``checkpoint-<N>/global_step<N>/``, bf16 weights, per-rank fp32 master
weights and Adam moments), a Trainer with FSDP2 and sharded state dicts (``checkpoint-<N>/pytorch_model_fsdp_0/``
and ``optimizer_0/`` DCP folders) and torchtitan-style DCP step folders (``step-<N>/``). Each trains once (6 steps,
a checkpoint every 2) and is archived with ``lmc-archive compress`` and restored step by step with ``lmc-archive
restore --step N``. Checked: every restored file is byte-identical; the tensors were coded by lmc (the bytes stored
as opaque bytes are a small share of every step and of every large tensor file); the framework's own resume from
the restored middle step gives the same losses and weights, bit for bit, as its resume from the original step; and
that resume continues the run exactly (its losses and final weights are the uninterrupted run's).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # four real runs, each trained once and resumed twice: about 2.5 minutes on 2 cores

from lmc.archive import Archive  # noqa: E402
from lmc.archive import main as archive_main  # noqa: E402

HERE = Path(__file__).parent
SCRIPT = HERE / "train_layouts.py"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
STEPS, EVERY, MORE = 6, 2, 2
LAYOUTS = ["ds_zero2", "ds_zero3", "fsdp", "titan"]
STEP_DIR = re.compile(r"^(checkpoint-|global_step|step-|step)(\d+)$")
TENSOR_FILES = (".pt", ".pth", ".bin", ".distcp", ".safetensors")
# opaque bytes / bytes in, per step. titan: torchtitan's flattened optimizer state holds each parameter's
# param-group settings (lr, betas, eps, ...) as ~250 small pickled DCP items, one torch zip each: about 0.6 MB
# whatever the model's size, 1.5% of this 3.7 M-parameter run's steps (0.8% at 6.8 M parameters)
MAX_OPAQUE = {"ds_zero2": 0.01, "ds_zero3": 0.01, "fsdp": 0.01, "titan": 0.02}


def _have(mod):
    return importlib.util.find_spec(mod) is not None


def _train_layouts(*args, timeout=300):
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=ENV, capture_output=True, text=True,
                       timeout=timeout, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


def _resume(layout, ckpt: Path, scratch: Path, out_json: Path) -> dict:
    _train_layouts(layout, scratch, "--resume", ckpt, "--out-json", out_json, "--steps", STEPS, "--more", MORE)
    return json.loads(out_json.read_text())


def _tree(folder: Path) -> dict:
    """relpath -> SHA-256 of every file under folder."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", params=LAYOUTS)
def run(request, tmp_path_factory):
    """One real run of a layout: OUT/<step folders>, the run's own losses and final weights (train.json)."""
    layout = request.param
    if layout.startswith("ds_") and not _have("deepspeed"):
        pytest.skip("deepspeed is not installed (pip install -e '.[test]' installs it)")
    for mod in ("transformers", "accelerate"):
        if not _have(mod):
            pytest.skip(f"{mod} is not installed")
    base = tmp_path_factory.mktemp(layout)
    out = base / "run"
    _train_layouts(layout, out, "--steps", STEPS, "--save-every", EVERY, "--out-json", base / "train.json")
    folders = {int(m.group(2)): p.name for p in out.iterdir() if (m := STEP_DIR.match(p.name))}
    assert sorted(folders) == list(range(EVERY, STEPS + 1, EVERY)), sorted(os.listdir(out))
    mid = STEPS - MORE  # resumed, MORE steps make the run's last step
    yield types.SimpleNamespace(layout=layout, base=base, out=out, folders=folders, mid=mid,
                                train=json.loads((base / "train.json").read_text()))
    shutil.rmtree(base, ignore_errors=True)  # ~0.7 GB a layout with its archive and restored copy


@pytest.fixture(scope="module")
def original_resume(run):
    """The framework's resume from the original middle step folder."""
    return _resume(run.layout, run.out / run.folders[run.mid], run.base / "scratch-orig", run.base / "orig.json")


@pytest.fixture(scope="module")
def archived(run):
    """The run archived with `lmc-archive compress`, every step restored with `lmc-archive restore --step N`."""
    arc = run.base / "run.lmca"
    assert archive_main(["compress", str(run.out), str(arc)]) == 0
    restored = run.base / "restored"
    for s in sorted(run.folders):
        assert archive_main(["restore", str(arc), str(restored), "--step", str(s)]) == 0
    return types.SimpleNamespace(arc=arc, restored=restored)


def test_layout_is_what_the_framework_writes(run):
    names = {s: sorted(_tree(run.out / n)) for s, n in run.folders.items()}
    for s, files in names.items():
        if run.layout.startswith("ds_"):
            gs = f"global_step{s}/"
            assert {"latest", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth", "model.safetensors",
                    gs + "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                    gs + "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= set(files), files
            model_states = ({gs + "mp_rank_00_model_states.pt"} if run.layout == "ds_zero2" else
                            {gs + "zero_pp_rank_0_mp_rank_00_model_states.pt",
                             gs + "zero_pp_rank_1_mp_rank_00_model_states.pt"})
            assert model_states <= set(files), files
        elif run.layout == "fsdp":
            assert {f"{d}/{f}" for d in ("pytorch_model_fsdp_0", "optimizer_0")
                    for f in (".metadata", "__0_0.distcp", "__1_0.distcp")} <= set(files), files
            assert {"trainer_state.json", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"} <= set(files)
        else:
            assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"], files
    assert len(run.train["losses"]) == 2 and all(len(r) == STEPS for r in run.train["losses"])


def test_resume_continues_the_run(run, original_resume):
    """The resume is a real one: from step mid, MORE steps give the uninterrupted run's losses and final weights
    (so comparing a resume from a restored folder with it means something)."""
    r = original_resume
    assert r["resumed_from"] == run.folders[run.mid]
    assert r["losses"] == [ranks[run.mid:run.mid + MORE] for ranks in run.train["losses"]]
    for k in ("weights_sha256", "master_sha256"):
        assert r.get(k) == run.train.get(k), k


def test_archive_codes_the_tensors(run, archived, capsys):
    a = Archive(archived.arc)
    es = a.entries()
    assert [e["step"] for e in es] == sorted(run.folders)
    assert {e["step"]: e["name"] for e in es} == run.folders
    for e in es:
        assert isinstance(e["opaque"], int), e
        rows = a.opaque(e["step"])
        assert sum(n for _, n, _ in rows) == e["opaque"], (e, rows)
        assert e["opaque"] < MAX_OPAQUE[run.layout] * e["bytes_in"], (e, rows)
        # every large tensor file went in tensor by tensor: what of it is opaque (zip directory, pickles,
        # small storages) is a small share of it
        folder = run.out / e["name"]
        opaque = {path: n for path, n, _ in rows}
        big = [p for p in folder.rglob("*") if p.name.endswith(TENSOR_FILES) and p.stat().st_size >= 1 << 20]
        assert big
        for p in big:
            rel = str(p.relative_to(folder))
            assert opaque.get(rel, 0) < 0.05 * p.stat().st_size, (rel, opaque.get(rel), p.stat().st_size)
    assert sum(e["size"] for e in es) < sum(e["bytes_in"] for e in es)
    assert any(e["depends_on"] is not None for e in es)  # steps coded against another step
    capsys.readouterr()
    assert archive_main(["ls", str(archived.arc)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "opaque" in lines[0].split()
    for name in run.folders.values():
        assert any(line.split()[-1] == name for line in lines[1:]), (name, lines)


def test_restored_byte_identical(run, archived):
    assert sorted(os.listdir(archived.restored)) == sorted(run.folders.values())
    for name in run.folders.values():
        assert _tree(archived.restored / name) == _tree(run.out / name), name


def test_resume_from_restored_is_identical(run, archived, original_resume):
    ckpt = archived.restored / run.folders[run.mid]
    restored = _resume(run.layout, ckpt, run.base / "scratch-restored", run.base / "restored.json")
    assert restored == original_resume
