"""benchmarks/bench_threads.py: packing a series sample, unpacking it bit-exact, and a small measurement's outputs."""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")  # the scripts run by their path: this folder is first on sys.path
SCRIPT = os.path.join(BENCH, "bench_threads.py")


def _trainer_series(tmp_path, steps=(10, 20)):
    """A real Trainer-layout series: a tiny model trained with AdamW, saved at each step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    for step in range(1, max(steps) + 1):
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in steps:
            d = tmp_path / f"checkpoint-{step}"
            d.mkdir(parents=True)
            safetensors_torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                        str(d / "model.safetensors"))
            torch.save(opt.state_dict(), d / "optimizer.pt")
    return tmp_path


def _run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))  # this lmc
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_pack_measure_report(tmp_path):
    series = _trainer_series(tmp_path / "series")
    packed = tmp_path / "sample.npz"
    p = _run("--pack", str(packed), str(series), "--per-kind", "5000", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    sys.path.insert(0, BENCH)
    try:
        import bench_threads
        import benchlib
    finally:
        sys.path.remove(BENCH)
    cur, ref, what = bench_threads.unpack(str(packed))
    want = [benchlib.load_step(str(series / f"checkpoint-{s}")) for s in (20, 10)]
    for got, w in zip((cur, ref), want):  # the sample is each kind's first 5000 elements, bit-exact
        exp = np.concatenate([w[k][:5000] for k in bench_threads.KINDS])
        assert got.tobytes() == exp.tobytes()
    assert "step 20 (reference: step 10)" in what

    out = tmp_path / "out"
    p = _run("--packed", str(packed), "--threads", "1,2", "--elements", "40000", "--repeat", "1",
             "--no-zipnn", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(open(out / "threads.csv")))
    cells = {(r["dtype"], r["mode"], int(r["threads"])) for r in rows}
    assert cells == {(d, m, t) for d in ("fp32", "bf16") for m in ("alone", "reference") for t in (1, 2)}
    for r in rows:
        assert int(r["elements"]) == 40000
        assert float(r["ratio"]) > 1.0 and float(r["compress_gibs"]) > 0 and float(r["decompress_gibs"]) > 0
    # the ratio does not depend on the thread count (byte-identical output), and the reference helps here:
    # consecutive AdamW steps of the same model
    by = {(r["dtype"], r["mode"], int(r["threads"])): float(r["ratio"]) for r in rows}
    for d in ("fp32", "bf16"):
        assert by[(d, "alone", 1)] == by[(d, "alone", 2)]
        assert by[(d, "reference", 1)] > by[(d, "alone", 1)]
    report = (out / "report.md").read_text()
    assert "| fp32 | lmc | alone | 2 |" in report and "paper" in report


def test_series_without_an_earlier_step_is_refused(tmp_path):
    series = _trainer_series(tmp_path / "series", steps=(10,))
    p = _run("--pack", str(tmp_path / "x.npz"), str(series), cwd=tmp_path)
    assert p.returncode != 0
    assert "has no earlier step" in p.stderr
