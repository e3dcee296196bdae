"""The arithmetic of experiments/checkpoint_budget.py (pure functions), and its renderer on hand-made records."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lmcbench_testlib import load_experiment

MiB = 2**20


@pytest.fixture(scope="module")
def cb():
    return load_experiment("checkpoint_budget")


BF16 = {"weight": "bfloat16", "exp_avg": "float32", "exp_avg_sq": "float32"}
FP32 = {"weight": "float32", "exp_avg": "float32", "exp_avg_sq": "float32"}


def test_bytes_per_param(cb):
    assert cb.bytes_per_param(BF16) == 10
    assert cb.bytes_per_param(FP32) == 12
    b = cb.layout_bytes(7e9, BF16)
    assert b["weight"] == ("bfloat16", 14e9) and b["exp_avg"] == ("float32", 28e9)
    with pytest.raises(ValueError, match="unknown dtype"):
        cb.layout_bytes(1, {"weight": "complex64"})


def test_pipeline_time(cb):
    # the slower stage sets the pace, the faster one adds one unit
    assert cb.pipeline_time(100, 40, 10) == pytest.approx(104)
    assert cb.pipeline_time(40, 100, 10) == pytest.approx(104)
    # one unit: no overlap at all
    assert cb.pipeline_time(100, 40, 1) == pytest.approx(140)
    assert cb.pipeline_time(100, 40, 0) == pytest.approx(140)
    # nothing to compress: the write alone
    assert cb.pipeline_time(0, 40, 5) == pytest.approx(40)


def test_uncompressed_is_the_write(cb):
    e = cb.checkpoint_time(1e9, FP32, None, cores=16, bandwidth_GBps=2)
    assert e["orig_bytes"] == e["comp_bytes"] == 12e9
    assert e["compress_s"] == 0 and e["total_s"] == pytest.approx(6.0) and e["bound"] == "write"
    assert e["per_hour"] == pytest.approx(600)


def test_compress_bound_and_write_bound(cb):
    params = 1e9  # fp32 layout: 12e9 bytes
    rates = {(k, "float32"): (2.0, 100.0) for k in FP32}  # ratio 2, 100 MiB/s per core
    e = cb.checkpoint_time(params, FP32, rates, cores=4, bandwidth_GBps=10, chunk_mib=64)
    c = 12e9 / MiB / 400
    w = 6e9 / 10e9
    units = math.ceil(12e9 / (4 * 64 * MiB))
    assert e["compress_s"] == pytest.approx(c) and e["write_s"] == pytest.approx(w)
    assert e["units"] == units and e["bound"] == "compress"
    assert e["total_s"] == pytest.approx(c + w / units)
    assert e["ratio"] == pytest.approx(2.0)
    # linear in the cores
    e4x = cb.checkpoint_time(params, FP32, rates, cores=16, bandwidth_GBps=10, chunk_mib=64)
    assert e4x["compress_s"] == pytest.approx(c / 4)
    # slow storage: write-bound, and compression pays off by its ratio
    slow = cb.checkpoint_time(params, FP32, rates, cores=64, bandwidth_GBps=0.5)
    raw = cb.checkpoint_time(params, FP32, None, cores=64, bandwidth_GBps=0.5)
    assert slow["bound"] == "write"
    assert slow["write_s"] == pytest.approx(raw["write_s"] / 2)


def test_kinds_and_fallback(cb):
    rates = {("weight", "bfloat16"): (1.5, 200.0), ("all", "float32"): (1.2, 400.0)}
    e = cb.checkpoint_time(1e9, BF16, rates, cores=1, bandwidth_GBps=1)
    assert e["comp_bytes"] == pytest.approx(2e9 / 1.5 + 8e9 / 1.2)
    assert e["compress_s"] == pytest.approx(2e9 / MiB / 200 + 8e9 / MiB / 400)
    assert cb.lookup(rates, "exp_avg", "float32")[2] == "all kinds"
    assert cb.lookup(rates, "weight", "bfloat16")[2] == "weight"
    # a dtype that was not measured: NaN, never fits
    e = cb.checkpoint_time(1e9, FP32, {("weight", "bfloat16"): (1.5, 200.0)}, cores=1, bandwidth_GBps=1)
    assert math.isnan(e["total_s"]) and not cb.fits(e["total_s"], 1e9)


def test_fits_and_frequency(cb):
    assert cb.fits(600, 600) and not cb.fits(600.1, 600)
    assert cb.min_interval_s(123.0) == 123.0
    with pytest.raises(ValueError):
        cb.checkpoint_time(1e9, FP32, None, cores=0, bandwidth_GBps=1)


def _records():
    rows = []
    for kind in ("weight", "exp_avg", "exp_avg_sq"):
        for dtype, ratio in (("float32", 1.2), ("bfloat16", 1.5)):
            for codec, label, tr, secs, threads in (("zstd", "zstd-3", "bytegroup", 0.01, 1),
                                                    ("lmc_mt", "lmc", "raw", 0.004, 2),
                                                    ("memcpy", "memcpy", "raw", 0.0001, 1)):
                orig = 4 * MiB
                rows.append({"step": 800, "tensor": f"t.{kind}", "kind": kind, "dtype": dtype, "transform": tr,
                             "codec": codec, "codec_label": label, "threads": threads, "orig_bytes": orig,
                             "comp_bytes": orig / (1 if codec == "memcpy" else ratio), "compress_s": secs,
                             "decompress_s": secs / 2, "verified": True})
    return pd.DataFrame(rows)


def test_rates_from_records(cb):
    r = cb.rates_from_records(_records())
    assert set(r["pair"]) == {"zstd-3 (bytegroup)", "lmc (raw)"}  # memcpy is not a codec here
    z = r[(r["pair"] == "zstd-3 (bytegroup)") & (r["kind"] == "weight") & (r["dtype"] == "float32")].iloc[0]
    assert z["ratio"] == pytest.approx(1.2) and z["c_mibs_core"] == pytest.approx(400)
    # two threads: per-core speed is half the measured speed
    m = r[(r["pair"] == "lmc (raw)") & (r["kind"] == "all") & (r["dtype"] == "bfloat16")].iloc[0]
    assert m["c_mibs_core"] == pytest.approx(4 / 0.004 / 2) and m["ratio"] == pytest.approx(1.5)
    by = cb.rates_by_pair(r)
    assert by["lmc (raw)"][("exp_avg", "float32")] == (pytest.approx(1.2), pytest.approx(500))


def test_budget_table(cb):
    budget = {"models": {"1B": 1e9}, "layouts": {"bf16": BF16}, "intervals_s": [60, 600], "cores": [4],
              "bandwidth_GBps": [1], "chunk_mib": 64}
    t = cb.budget_table(cb.rates_by_pair(cb.rates_from_records(_records())), budget)
    assert len(t) == 3 * 2  # (uncompressed + 2 codecs) x 2 intervals
    raw = t[(t["codec"] == cb.UNCOMPRESSED) & (t["interval_s"] == 60)].iloc[0]
    assert raw["total_s"] == pytest.approx(10.0) and bool(raw["fits"])


def test_render(cb, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _records().to_csv(run / "records.csv", index=False)
    (run / "config.yaml").write_text(
        "budget:\n  models: {7B: 7.0e9}\n  layouts:\n    bf16:\n      weight: bfloat16\n      exp_avg: float32\n"
        "      exp_avg_sq: float32\n  intervals_s: [600]\n  cores: [16]\n  bandwidth_GBps: [2]\n  chunk_mib: 64\n")
    path = cb.render(str(run), str(tmp_path / "out"))
    text = open(path).read()
    assert "### 7B parameters, bf16 (10 bytes/parameter, 70 GB per checkpoint)" in text
    assert "uncompressed (write only)" in text and "lmc (raw)" in text
    assert (tmp_path / "out" / "checkpoint_budget.png").exists()
    assert len(pd.read_csv(tmp_path / "out" / "budget.csv")) == 3
    # without a budget in the run's config: the preset's scenarios
    (run / "config.yaml").unlink()
    text = open(cb.render(str(run), str(tmp_path / "out2"))).read()
    assert "70B parameters" in text
