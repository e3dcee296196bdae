"""Every experiment renderer runs on a small real run (the session's tiny tinygpt series) without failing."""

from __future__ import annotations

import importlib.util
import os

import pytest

from lmcbench_testlib import REPO

RENDERERS = sorted(p[:-3] for p in os.listdir(REPO / "experiments") if p.endswith(".py") and not p.startswith("_")
                   and p != "peak_memory.py")


def load(name):
    spec = importlib.util.spec_from_file_location(f"lmcbench_experiment_{name}", REPO / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", RENDERERS)
def test_renderer_on_a_small_run(name, e2e, tmp_path):
    run = e2e["run1"]["dir"]
    out = tmp_path / name
    path = load(name).render(str(run), str(out))
    text = open(path).read()
    assert text.startswith("# ") and "command:" in text


def test_compressibility_xor_analysis(e2e, tmp_path):
    import pandas as pd

    run = e2e["run1"]["dir"]
    xor = pd.read_csv(run / "xor.csv", dtype={"bit_flips": str})
    assert set(xor["step"]) == {20, 30} and set(xor["ref_step"]) == {10, 20}
    widths = {len(v.split("/")) for v in xor["bit_flips"]}
    assert widths == {32}
    for _, r in xor.iterrows():
        flips = [int(v) for v in r["bit_flips"].split("/")]
        assert sum(flips) == r["changed_bits"] and flips[0] == r["sign_flips"]
        assert sum(flips[1:9]) == r["exponent_flips"] and sum(flips[9:]) == r["mantissa_flips"]
        assert r["changed_elems"] <= r["numel"] and r["changed_bytes"] <= 4 * r["numel"]
    mod = load("paper_compressibility")
    out = tmp_path / "pc"
    mod.render(str(run), str(out))
    assert (out / "xor_vs_step.png").stat().st_size > 1000 and (out / "xor_bit_positions.png").exists()
    m, steps = mod.bit_positions(xor, "float32", "weight")
    assert m.shape == (2, 32) and steps == [20, 30] and ((m >= 0) & (m <= 1)).all()
