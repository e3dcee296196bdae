"""Reports in-process: loading records, aggregates, summary, render and merge."""

from __future__ import annotations

import json

import pytest

from lmcbench.bench.options import BenchOptions
from lmcbench.bench.runner import run
from lmcbench.codecs import get_codec
from lmcbench.errors import LmcbenchError
from lmcbench.report import aggregate, comparable, load_records, render, summary_text
from lmcbench.report import merge
from lmcbench.sources import get_source
from lmcbench.transforms import Pipeline

from lmcbench_testlib import make_trainer_folder

QUICK = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("rep")
    make_trainer_folder(base / "out", steps=(10, 20, 30))
    pipes = {"raw": Pipeline("raw", []), "delta": Pipeline.from_config("delta", [{"id": "delta"}])}
    dirs = []
    for i, codecs in enumerate(({"zstd": get_codec({"id": "zstd"}), "memcpy": get_codec({"id": "memcpy"})},
                                {"lz4": get_codec({"id": "lz4"})})):
        src = get_source({"type": "hf_trainer", "path": str(base / "out")})
        d = base / "sweep" / str(i)
        run(src, pipes, codecs, QUICK, str(d), log=lambda m: None)
        (d / "environment.json").write_text(json.dumps({"command": f"lmcbench run{i}", "cpu": "test-cpu", "cores": 2,
                                                        "python": "3.11", "git_commit": "abc", "source": "here"}))
        dirs.append(d)
    return base, dirs


def test_load_records(runs):
    base, dirs = runs
    df = load_records(dirs[0])
    assert len(df) == 3 * 3 * 6 * 2 * 2
    assert df["verified"].dtype == bool and df["verified"].all()
    both = load_records(base / "sweep")
    assert len(both) == len(df) + 3 * 3 * 6 * 2
    assert set(both["run"]) == {"0", "1"}
    assert len(load_records([dirs[0] / "records.csv", dirs[1]])) == len(both)


def test_load_records_errors(tmp_path):
    with pytest.raises(LmcbenchError, match="no such"):
        load_records(tmp_path / "nope")
    with pytest.raises(LmcbenchError, match="no records.csv"):
        load_records(tmp_path)
    (tmp_path / "records.csv").write_text("step,tensor\n")
    with pytest.raises(LmcbenchError, match="empty"):
        load_records(tmp_path)


def test_comparable_and_aggregate(runs):
    _, dirs = runs
    df = load_records(dirs[0])
    ok = comparable(df)
    assert set(ok["step"]) == {20, 30}  # the first step has no delta reference
    agg = aggregate(ok, ["transform", "codec_label"])
    mem = agg[agg["codec_label"] == "memcpy"]
    assert (mem["ratio"] == 1.0).all()
    for _, r in agg.iterrows():
        assert r["ratio"] == pytest.approx(r["orig_bytes"] / r["comp_bytes"])
    part = ok[(ok["transform"] == "raw") & (ok["codec_label"] == "zstd-3")]
    row = agg[(agg["transform"] == "raw") & (agg["codec_label"] == "zstd-3")].iloc[0]
    assert row["orig_bytes"] == part["orig_bytes"].sum() and row["comp_bytes"] == part["comp_bytes"].sum()


def test_summary_text(runs):
    _, dirs = runs
    txt = summary_text(load_records(dirs[0]))
    assert "ratio (orig/comp)" in txt and "zstd-3" in txt and "memcpy" in txt and "delta" in txt


def test_render(runs, tmp_path):
    _, dirs = runs
    path = render(dirs[0], str(tmp_path / "r"), title="my title", figures=True)
    md = open(path).read()
    assert md.startswith("# my title")
    assert "## weight (float32)" in md and "## exp_avg_sq (float32)" in md
    assert md.count("Compression ratio, ") == 3 and md.count("Compress / decompress MiB/s:") == 3
    assert (tmp_path / "r" / "summary.csv").exists()
    assert "test-cpu" in md and "lmcbench run0" in md
    assert "verified bit-exact: 216 of 216" in md
    for fig in ("ratio_vs_step.png", "tradeoff.png"):
        assert (tmp_path / "r" / fig).stat().st_size > 1000 and fig in md
    path = render(dirs[0], str(tmp_path / "nofig"), figures=False)
    assert not list((tmp_path / "nofig").glob("*.png")) and "Figures" not in open(path).read()


def test_render_lists_failed_round_trips(runs, tmp_path):
    _, dirs = runs
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(dirs[1], d)
    text = (d / "records.csv").read_text().splitlines()
    header = text[0].split(",")
    vi, ei = header.index("verified"), header.index("error")
    parts = text[1].split(",")
    parts[vi], parts[ei] = "False", "round trip is not bit-exact"
    text[1] = ",".join(parts)
    (d / "records.csv").write_text("\n".join(text) + "\n")
    md = open(render(d, str(d), figures=False)).read()
    assert "## Failed round trips" in md and "not bit-exact" in md


def test_merge_main(runs, tmp_path, capsys):
    base, _ = runs
    assert merge.main([str(base / "sweep"), "-o", str(tmp_path / "m"), "--no-figures"]) == 0
    assert (tmp_path / "m" / "report.md").is_file()
    assert capsys.readouterr().out.strip() == str(tmp_path / "m" / "report.md")
    assert merge.main([str(tmp_path / "nothing-here")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmcbench-report: error:") and "nothing-here" in err


def test_header_of_runs_and_experiments(tmp_path):
    """One header writer: the command, the machine, the commit, the libraries and the threads, read back from a
    run's environment.json."""
    from lmcbench.report import header

    env = header.collect("lmcbench codec=[zstd]", source="somewhere", versions={"zstd": "zstandard 0"})
    t = env["threads"]
    assert t["numba"] >= 1 and t["torch"] >= 1 and t["numba_threading_layer"]
    assert t["numba_threading_layer_from"].startswith(("numba.threading_layer()", "numba.config.THREADING_LAYER"))
    assert env["cores"] >= 1 and env["versions"]["zstd"] == "zstandard 0" and "numpy" in env["versions"]
    (tmp_path / "environment.json").write_text(json.dumps(env))
    lines = header.lines("T", header.load(tmp_path), "what it shows", more=["- 3 measurements"])
    assert lines[:4] == ["# T", "", "what it shows", ""] and lines[-2:] == ["- 3 measurements", ""]
    assert "- command: `lmcbench codec=[zstd]`" in lines and "- source: somewhere" in lines
    assert any(ln.startswith(f"- machine: {env['cpu']}, {env['cores']} cores;") and env["git_commit"] in ln
               for ln in lines)
    assert any(ln.startswith(f"- threads: numba {t['numba']} (threading layer {t['numba_threading_layer']}")
               and ln.endswith(f"torch {t['torch']}") for ln in lines)
    assert header.lines("T", {}) == ["# T", "", ""]  # a run without environment.json: the title only
