"""The experiment renderers: each report holds the numbers its tables say, recomputed here from the records it was
given (an in-process grid run on a small Trainer folder), and the presets run end to end (slow)."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from lmcbench.bench.options import BenchOptions
from lmcbench.bench.runner import run
from lmcbench.codecs import get_codec
from lmcbench.report import comparable, load_records
from lmcbench.report.header import collect
from lmcbench.sources import get_source
from lmcbench.transforms import Pipeline

from lmcbench_testlib import REPO, load_experiment, make_trainer_folder

# renderers of lossless grid runs (excp and lossy render their own lossy runs: tests/test_excp_experiment.py,
# tests/test_lossy_experiment.py; checkpoint_store its own task's files: tests/test_checkpoint_store.py; sampling
# its task's runs: tests/test_sampling.py; peak_memory and exp_avg_context measure by themselves (task:
# experiment): tests/test_config.py, tests/test_exp_avg_context.py)
RENDERERS = sorted(p[:-3] for p in os.listdir(REPO / "experiments") if p.endswith(".py") and not p.startswith("_")
                   and p not in ("peak_memory.py", "exp_avg_context.py", "excp.py", "lossy.py", "checkpoint_store.py",
                                 "sampling.py"))
GiB = 2**30


load = load_experiment



@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """Every codec and pipeline the renderers look for, over three steps of a small Trainer folder."""
    base = tmp_path_factory.mktemp("grid")
    make_trainer_folder(base / "out", steps=(10, 20, 30))
    steps = {"raw": [], "bytegroup": [{"id": "bytegroup"}], "expsplit_bytegroup": [{"id": "expsplit"}, {"id": "bytegroup"}],
             "delta": [{"id": "delta"}], "delta_sub": [{"id": "delta", "mode": "sub"}],
             "delta_bytegroup": [{"id": "delta"}, {"id": "bytegroup"}], "reference": [{"id": "reference"}]}
    pipelines = {n: Pipeline.from_config(n, s) for n, s in steps.items()}
    configs = {"memcpy": {"id": "memcpy"}, "zstd": {"id": "zstd"}, "bz2": {"id": "bz2"}, "lmc": {"id": "lmc"},
               "lmc_mt": {"id": "lmc", "threads": 2}}
    codecs = {n: get_codec(c) for n, c in configs.items()}
    d = base / "run"
    opts = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False)
    # LMC as the delta_gap preset measures it (alone, and each way of using the previous step)
    restrict = {"lmc": ["raw", "delta", "delta_sub", "reference"], "lmc_mt": ["raw"], "bz2": ["bytegroup"]}
    run(get_source({"type": "hf_trainer", "path": str(base / "out")}), pipelines, codecs, opts, str(d),
        log=lambda m: None, restrict=restrict)
    (d / "environment.json").write_text(json.dumps(collect("lmcbench test-grid", source="a small Trainer folder")))
    return d, load_records(d)


def row(md: str, label: str, after: str = "") -> str:
    """The Markdown table row whose first cell is ``label`` (the first one after the line ``after``)."""
    text = md[md.index(after):] if after else md
    return next(ln for ln in text.splitlines() if ln.startswith(f"| {label} |"))


def ratio(df: pd.DataFrame, **equal) -> float:
    part = df[df["verified"] & df["comp_bytes"].notna()]
    for col, value in equal.items():
        part = part[part[col] == value]
    assert len(part), equal
    return part["orig_bytes"].sum() / part["comp_bytes"].sum()


def render(name, grid, tmp_path) -> str:
    text = open(load(name).render(str(grid[0]), str(tmp_path / name))).read()
    assert text.startswith("# ") and "- command: `lmcbench test-grid`" in text and "- threads: numba " in text
    return text


def test_every_renderer_is_checked():
    assert set(RENDERERS) == {n[len("test_renderer_"):] for n in globals() if n.startswith("test_renderer_")}


def test_renderer_paper_codecs(grid, tmp_path):
    md = render("paper_codecs", grid, tmp_path)
    ok = comparable(grid[1])
    assert set(ok["step"]) == {20, 30}  # the first step has no reference
    for kind in ("weight", "exp_avg_sq"):
        r = ratio(ok, kind=kind, codec="zstd", transform="raw")
        d = ratio(ok, kind=kind, codec="zstd", transform="delta_bytegroup")
        line = row(md, "zstd-3", after=f"## {kind} (float32)")
        assert line.split(" | ")[1] == f"{r:.3f}" and f" {d:.3f} " in line


def test_renderer_paper_compressibility(grid, tmp_path):
    md = render("paper_compressibility", grid, tmp_path)
    df = grid[1]
    for label, codec, pipe in (("LMC", "lmc", "raw"), ("zstd-3, XOR delta + byte-grouped", "zstd", "delta_bytegroup")):
        cells = row(md, f"float32 / weight / {label}").split(" | ")[1:]
        assert cells[-1].rstrip(" |") == f"{ratio(df, kind='weight', codec=codec, transform=pipe, step=30):.3f}"
        assert cells[0] == f"{ratio(df, kind='weight', codec=codec, transform=pipe, step=10):.3f}"
    xor = pd.read_csv(grid[0] / "xor.csv")
    w = xor[(xor["kind"] == "weight") & (xor["step"] == 30)]
    cells = row(md, "float32 / weight / last").split(" | ")
    assert cells[1] == "30" and cells[2] == f"{w['changed_elems'].sum() / w['numel'].sum():.3f}"


def test_renderer_paper_lmc_vs_bz2(grid, tmp_path):
    md = render("paper_lmc_vs_bz2", grid, tmp_path)
    df = grid[1]
    for step in (10, 20, 30):
        lmc = ratio(df, codec="lmc", transform="raw", step=step)
        bz2 = ratio(df, codec="bz2", transform="bytegroup", step=step)
        cells = row(md, str(step), after="## float32: the headline").split(" | ")
        assert cells[1:4] == [f"{lmc:.4f}", f"{bz2:.4f}", f"{bz2 / lmc:.3f}"]


def test_renderer_paper_threads(grid, tmp_path):
    md = render("paper_threads", grid, tmp_path)
    df = grid[1]
    for threads in (1, 2):
        part = df[(df["codec_label"].str.startswith("lmc")) & (df["transform"] == "raw") & (df["threads"] == threads)]
        cells = row(md, f"float32 / lmc / {threads}").split(" | ")
        assert cells[1] == f"{part['orig_bytes'].sum() / GiB / part['compress_s'].sum():.3f}"
        assert cells[2] == f"{part['orig_bytes'].sum() / GiB / part['decompress_s'].sum():.3f}"


def test_renderer_lmc_vs_peers(grid, tmp_path):
    md = render("lmc_vs_peers", grid, tmp_path)
    df = grid[1]
    cells = row(md, "LMC, 1 thread").split(" | ")
    assert cells[1:4] == [f"{ratio(df, codec='lmc', transform='raw', kind=k):.4f}"
                          for k in ("weight", "exp_avg", "exp_avg_sq")]
    assert row(md, "bz2-9, byte-grouped").split(" | ")[-1].rstrip(" |") == \
        f"{ratio(df, codec='bz2', transform='bytegroup'):.4f}"
    b = df[(df["codec"] == "memcpy") & (df["transform"] == "expsplit_bytegroup")]
    assert row(md, "order-0 bound per 128 Ki-symbol chunk").split(" | ")[-1].rstrip(" |") == \
        f"{b['orig_bytes'].sum() / b['block_bound_bytes'].sum():.4f}"


def test_renderer_checkpoint_budget(grid, tmp_path):
    md = render("checkpoint_budget", grid, tmp_path)
    df = grid[1]
    label = df.loc[df["codec"] == "zstd", "codec_label"].iloc[0]
    cells = row(md, f"{label} (bytegroup)", after="## Measured rates").split(" | ")
    assert f"{ratio(df, codec='zstd', transform='bytegroup', kind='weight'):.3f}" in cells
    assert f"{ratio(df, codec='zstd', transform='bytegroup', kind='exp_avg'):.3f}" in cells


def test_renderer_delta_gap(grid, tmp_path):
    md = render("delta_gap", grid, tmp_path)
    df = grid[1]
    # lag 1 everywhere: the table covers the steps from the second on, where every pipeline has its reference
    for label, pipe in (("alone", "raw"), ("XOR delta", "delta"), ("subtraction delta", "delta_sub"),
                        ("adaptive (per-chunk XOR or not)", "reference")):
        cells = row(md, f"weight / {label}").split(" | ")
        got = [c.strip(" |") for c in cells[1:] if c.strip(" |")]
        assert got == [f"{ratio(df[df['step'] >= 20], codec='lmc', transform=pipe, kind='weight'):.3f}"], label


def test_renderer_temporal(grid, tmp_path):
    md = render("temporal", grid, tmp_path)
    df = grid[1]
    header = row(md, "kind", after="float32:").split(" | ")
    cols = [c.strip(" |") for c in header[1:]]
    assert cols[:2] == ["LMC alone", "LMC 0.2 (reference)"] and cols[-1] == "bound given the reference"
    late = df[df["step"] == 30]  # steps 20 and 30 have a reference; the last quarter of them is step 30
    for kind in ("weight", "exp_avg_sq"):
        cells = [c.strip(" |") for c in row(md, kind, after="float32:").split(" | ")[1:]]
        assert cells[0] == f"{ratio(late, codec='lmc', transform='raw', kind=kind):.3f}"
        assert cells[1] == f"{ratio(late, codec='lmc', transform='reference', kind=kind):.3f}"
        d = late[(late["codec"] == "zstd") & (late["transform"] == "delta_bytegroup") & (late["kind"] == kind)]
        assert cells[-1] == f"{d['orig_bytes'].sum() / d['cond_bound_bytes'].astype(float).sum():.3f}"
    whole = [c.strip(" |") for c in row(md, "whole checkpoint", after="float32:").split(" | ")[1:]]
    assert whole[1] == f"{ratio(late, codec='lmc', transform='reference'):.3f}"


@pytest.mark.slow
def test_compressibility_xor_analysis(e2e, tmp_path):
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


@pytest.mark.slow
def test_delta_gap_preset_end_to_end(e2e, tmp_path):
    """``lmcbench experiment=delta_gap`` on the tiny series: references 1 and 2 checkpoints back, the XOR
    analysis at both lags, and the adaptive reference never more than its 8-byte header over LMC alone."""
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
