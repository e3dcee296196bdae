"""Every experiment renderer runs on a small real run (the session's tiny tinygpt series) without failing."""

from __future__ import annotations

import importlib.util
import os

import pytest

from lmcbench_testlib import REPO

# renderers of lossless grid runs (excp renders its own lossy run: tests/test_excp_experiment.py)
RENDERERS = sorted(p[:-3] for p in os.listdir(REPO / "experiments") if p.endswith(".py") and not p.startswith("_")
                   and p not in ("peak_memory.py", "excp.py"))


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


def test_delta_gap_preset_end_to_end(e2e, tmp_path):
    """``lmcbench experiment=delta_gap`` on the tiny series: references 1 and 2 checkpoints back, the XOR
    analysis at both lags, and the adaptive reference never more than its 8-byte header over LMC alone."""
    import pandas as pd

    from lmcbench_testlib import run_cli, tiny_overrides

    args = tiny_overrides() + ["experiment=delta_gap", "source.steps=[10,20,30]", "bench.xor_lags=[1,2]",
                               f"results_dir={tmp_path / 'results'}", f"hydra.run.dir={tmp_path / 'run'}"]
    p = run_cli(args, tmp_path, e2e["cache"], timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = pd.read_csv(tmp_path / "run" / "records.csv")
    assert rec["verified"].all() and set(rec["codec"]) == {"lmc"}
    mod = load("delta_gap")
    t = mod.tidy(rec)
    # lag k has its reference from the (k+1)-th checkpoint on, and it is the checkpoint k back
    got = {(m, g, s): r for m, g, s, r in zip(t["mode"], t["lag"], t["step"], t["ref_step"]) if pd.notna(r)}
    assert got[("delta", 1, 20)] == 10 and got[("delta_sub", 2, 30)] == 10 and got[("reference", 2, 30)] == 10
    assert got[("reference", 1, 30)] == 20 and ("delta", 2, 20) not in got
    assert not any(g == 8 for (_, g, _) in got)  # 3 checkpoints: lag 4 and 8 never have a reference
    nl = pd.read_csv(tmp_path / "results" / "delta_gap" / "never_loses.csv")
    assert set(nl["lag"]) == {1, 2} and (nl["most bytes over alone"] <= mod.HEADER_SLACK).all()
    out = pd.read_csv(tmp_path / "results" / "delta_gap" / "delta_gap.csv")
    ch = out.dropna(subset=["changed"])
    assert set(ch["lag"]) == {1, 2} and ((ch["changed"] >= 0) & (ch["changed"] <= 1)).all()
    report = (tmp_path / "results" / "delta_gap" / "report.md").read_text()
    assert "never loses" in report and (tmp_path / "results" / "delta_gap" / "ratio_vs_changed.png").exists()
