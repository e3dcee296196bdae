"""The command line in a subprocess: clear one-line errors, and a small end-to-end run on the tinygpt series."""

from __future__ import annotations

import csv
import json

import pytest

from lmcbench_testlib import TINY_TRAIN, run_cli

REQUIRED = ["step", "tensor", "kind", "dtype", "transform", "codec", "orig_bytes", "comp_bytes", "ratio", "compress_s",
            "decompress_s", "verified"]


@pytest.mark.parametrize("args,needle", [
    (["source=hf_trainer", "source.path=/nonexistent"], "/nonexistent"),
    (["codec=[nope]"], "nope"),
    (["bench.nope=1"], "nope"),
    (["source=files", "source.path=/nonexistent/*.safetensors"], "/nonexistent"),
    (["bench.repeats=0"], "repeats"),
])
def test_cli_errors_are_one_line(tmp_path, args, needle):
    p = run_cli(args + ["codec=[zstd]" if not any(a.startswith("codec=") for a in args) else "report=none",
                        "pipeline=[raw]", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path / "cache", timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    err_lines = [ln for ln in p.stderr.splitlines() if ln.startswith("lmcbench: error:")]
    assert len(err_lines) == 1, p.stderr[-2000:]
    assert needle in err_lines[0]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "nothing is trained"


def test_cli_debug_shows_traceback(tmp_path):
    import os
    import subprocess
    import sys

    from lmcbench_testlib import cli_env

    env = cli_env(tmp_path / "cache")
    env["LMCBENCH_DEBUG"] = "1"
    p = subprocess.run([sys.executable, "-m", "lmcbench", "source=hf_trainer", "source.path=/nonexistent",
                        "codec=[zstd]", "pipeline=[raw]", f"hydra.run.dir={tmp_path / 'run'}"], cwd=str(tmp_path),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" in p.stderr and "SourceError" in p.stderr
    assert os.path.isdir(tmp_path)


# ------------------------------------------------------------------------------------------------------------
# end to end (the session fixture trains the series once and runs the CLI twice)
# ------------------------------------------------------------------------------------------------------------

def read_rows(run_dir):
    with open(run_dir / "records.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_e2e_exit_and_outputs(e2e):
    p = e2e["run1"]["proc"]
    assert p.returncode == 0, p.stderr[-4000:]
    d = e2e["run1"]["dir"]
    for f in ("records.csv", "streams.csv", "report.md", "ratio_vs_step.png", "tradeoff.png", "environment.json",
              "config.yaml"):
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    assert "Traceback" not in p.stderr
    assert "records:" in p.stdout and "0 failed" in p.stdout


@pytest.mark.slow
def test_e2e_records(e2e):
    rows = read_rows(e2e["run1"]["dir"])
    assert rows
    assert set(REQUIRED) <= set(rows[0])
    assert all(r["verified"] == "True" for r in rows), [r["error"] for r in rows if r["verified"] != "True"][:3]
    for r in rows:
        assert float(r["ratio"]) == pytest.approx(int(r["orig_bytes"]) / int(r["comp_bytes"]))
        for what in ("compress", "decompress"):  # medians of one call (bench=quick): min = median = max
            assert float(r[f"{what}_s_min"]) <= float(r[f"{what}_s"]) <= float(r[f"{what}_s_max"])
    assert {r["kind"] for r in rows} >= {"weight", "exp_avg", "exp_avg_sq"}
    assert {int(r["step"]) for r in rows} == {10, 20, 30}
    assert {r["codec"] for r in rows} == {"memcpy", "zstd", "lz4"}
    assert {r["transform"] for r in rows} == {"raw", "bytegroup", "delta"}
    assert {r["dtype"] for r in rows} == {"float32"}
    # memcpy stores everything as is
    assert all(r["orig_bytes"] == r["comp_bytes"] for r in rows if r["codec"] == "memcpy")
    # every (tensor, kind, step) was measured by every (transform, codec)
    keys = {(r["tensor"], r["kind"], r["step"]) for r in rows}
    assert len(rows) == len(keys) * 9
    names = {r["tensor"] for r in rows if r["kind"] == "exp_avg"}
    assert "lm_head.weight" in names and not any(n.startswith("slot") for n in names)


@pytest.mark.slow
def test_e2e_delta_ref_steps(e2e):
    rows = read_rows(e2e["run1"]["dir"])
    for r in rows:
        if r["transform"] == "delta":
            assert r["ref_step"] == {"10": "", "20": "10", "30": "20"}[r["step"]]
        else:
            assert r["ref_step"] == ""


@pytest.mark.slow
def test_e2e_environment_and_config(e2e):
    d = e2e["run1"]["dir"]
    env = json.loads((d / "environment.json").read_text())
    assert env["rows"] == len(read_rows(d)) and env["failed"] == 0
    assert "tinygpt" in env["source"] and env["python"]
    cfg = (d / "config.yaml").read_text()
    assert "tinygpt" in cfg and "memcpy" in cfg and f"max_steps: {TINY_TRAIN['max_steps']}" in cfg
    report = (d / "report.md").read_text()
    assert "weight (float32)" in report and "ratio_vs_step.png" in report


@pytest.mark.slow
def test_e2e_series_folder(e2e):
    series = [p for p in e2e["cache"].iterdir() if p.name.startswith("tinygpt-")]
    assert len(series) == 1
    s = series[0]
    assert (s / "lmcbench_series.json").is_file()
    for step in (10, 20, 30):
        c = s / f"checkpoint-{step}"
        for f in ("model.safetensors", "optimizer.pt", "trainer_state.json", "scheduler.pt", "rng_state.pth"):
            assert (c / f).is_file(), c / f
        assert json.loads((c / "trainer_state.json").read_text())["global_step"] == step
    assert not (s / "checkpoint-40").exists()


@pytest.mark.slow
def test_e2e_second_run_reuses_cache(e2e):
    p1, p2 = e2e["run1"]["proc"], e2e["run2"]["proc"]
    assert p2.returncode == 0, p2.stderr[-4000:]
    assert "training" in (p1.stderr + p1.stdout)
    assert "training" not in (p2.stderr + p2.stdout)
    # same series, same measurements (sizes are deterministic)
    key = lambda rows: sorted((r["tensor"], r["kind"], r["step"], r["transform"], r["codec"], r["comp_bytes"])  # noqa
                              for r in rows)
    assert key(read_rows(e2e["run1"]["dir"])) == key(read_rows(e2e["run2"]["dir"]))


@pytest.mark.slow
def test_e2e_merge_report(e2e, tmp_path):
    import subprocess
    import sys

    from lmcbench_testlib import cli_env

    out = tmp_path / "merged"
    p = subprocess.run([sys.executable, "-m", "lmcbench.report.merge", str(e2e["sweep"]), "-o", str(out),
                        "--title", "merged sweep"], env=cli_env(e2e["cache"]), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (out / "report.md").read_text()
    n = len(read_rows(e2e["run1"]["dir"])) + len(read_rows(e2e["run2"]["dir"]))
    assert md.startswith("# merged sweep")
    assert f"{n} measurements" in md
    assert (out / "tradeoff.png").is_file()
    # into the first folder by default
    p = subprocess.run([sys.executable, "-m", "lmcbench.report.merge", str(e2e["sweep"]), "--no-figures"],
                       env=cli_env(e2e["cache"]), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and (e2e["sweep"] / "report.md").is_file()
    assert p.stdout.strip().endswith("report.md")
