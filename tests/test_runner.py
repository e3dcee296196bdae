"""The runner in-process: failed round trips are recorded (never raised), the delta reference is the decoded
tensor, slicing is transparent, and run() writes the records."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from lmcbench.bench.measure import block_entropies, byte_histogram, entropy_bits, timed
from lmcbench.bench.options import BenchOptions
from lmcbench.bench.records import RECORD_COLUMNS, STREAM_COLUMNS
from lmcbench.bench.runner import measure_tensor, run
from lmcbench.codecs import Codec, get_codec, register_codec
from lmcbench.sources import TensorRecord, get_source
from lmcbench.transforms import Pipeline

from lmcbench_testlib import BF16, make_trainer_folder, random_bits, same_bits

QUICK = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False)


class _StoresBytes(Codec):
    """Stores the bytes as they are; the test codecs below break the way back."""

    @classmethod
    def check_installed(cls):
        pass

    def _encode(self, arr):
        return arr.reshape(-1).view(np.uint8).tobytes()


@register_codec
class FlipFirstByte(_StoresBytes):
    """Its decode returns the bytes with the first one flipped: a broken round trip."""

    codec_id = "test_flip"

    def _decode(self, buf):
        b = bytearray(buf)
        if b:
            b[0] ^= 0xFF
        return bytes(b)


@register_codec
class RaisesOnDecode(_StoresBytes):
    codec_id = "test_raises"

    def _decode(self, buf):
        raise RuntimeError("boom")


@register_codec
class ShortDecode(_StoresBytes):
    codec_id = "test_short"

    def _decode(self, buf):
        return bytes(buf)[:-1]


def rec(x, step=10, name="t", kind="weight"):
    return TensorRecord(step, name, kind, x.dtype, x.shape, x)


def pipes(*names):
    cfg = {"raw": [], "delta": [{"id": "delta", "mode": "xor"}], "bytegroup": [{"id": "bytegroup"}],
           "delta_expsplit": [{"id": "delta"}, {"id": "expsplit"}],
           "delta_bytegroup": [{"id": "delta"}, {"id": "bytegroup"}], "reference": [{"id": "reference"}]}
    return {n: Pipeline.from_config(n, cfg[n]) for n in names}


def test_registered_test_codecs_via_get_codec():
    assert isinstance(get_codec({"id": "test_flip"}), FlipFirstByte)


def test_failing_codec_is_recorded_not_raised():
    x = random_bits(1001, np.float32, seed=1)
    x0 = x.copy()
    codecs = {"flip": get_codec({"id": "test_flip"}), "raises": get_codec({"id": "test_raises"}),
              "short": get_codec({"id": "test_short"}), "zstd": get_codec({"id": "zstd"})}
    rows, srows, refs = measure_tensor(rec(x), pipes("raw", "bytegroup"), codecs, QUICK, {}, {})
    assert same_bits(x, x0)
    by = {(r["transform"], r["codec"]): r for r in rows}
    assert len(by) == 8
    for p in ("raw", "bytegroup"):
        assert by[(p, "flip")]["verified"] is False and "bit-exact" in by[(p, "flip")]["error"]
        assert by[(p, "raises")]["verified"] is False and "boom" in by[(p, "raises")]["error"]
        assert "RuntimeError" in by[(p, "raises")]["error"]
        assert by[(p, "short")]["verified"] is False and "bytes" in by[(p, "short")]["error"]
        assert by[(p, "zstd")]["verified"] is True and by[(p, "zstd")]["error"] == ""
    assert refs == {}


def test_delta_reference_is_the_decoded_tensor():
    x1 = random_bits(300, np.float32, seed=1)
    x2 = random_bits(300, np.float32, seed=2)
    # a good codec: the reference is x1's bits
    rows, _, refs = measure_tensor(rec(x1, 10), pipes("delta", "raw"), {"zstd": get_codec({"id": "zstd"})}, QUICK,
                                   {}, {})
    assert set(refs) == {"delta"} and refs["delta"][-1][0] == 10 and same_bits(refs["delta"][-1][1], x1)
    assert all(r["ref_step"] == "" for r in rows)
    rows, _, refs2 = measure_tensor(rec(x2, 20), pipes("delta", "raw"), {"zstd": get_codec({"id": "zstd"})}, QUICK,
                                    refs, {})
    d = next(r for r in rows if r["transform"] == "delta")
    assert d["ref_step"] == 10 and d["verified"] is True
    assert next(r for r in rows if r["transform"] == "raw")["ref_step"] == ""
    assert refs2["delta"][-1][0] == 20 and same_bits(refs2["delta"][-1][1], x2)

    # a broken first codec: the reference passed on is what it decoded, not the original
    codecs = {"flip": get_codec({"id": "test_flip"}), "zstd": get_codec({"id": "zstd"})}
    _, _, refs = measure_tensor(rec(x1, 10), pipes("delta"), codecs, QUICK, {}, {})
    expected = x1.copy().view(np.uint8)
    expected[0] ^= 0xFF
    ref = refs["delta"][-1][1]
    assert ref.shape == x1.shape and ref.dtype == x1.dtype
    assert ref.tobytes() == expected.tobytes()
    assert not same_bits(ref, x1)


def test_bound_given_the_reference():
    """cond_bound_bytes: each stream of a temporal pipeline coded with the same stream of the reference as
    context (an adaptive code length, never above the adaptive order-0 one); empty without a reference."""
    rng = np.random.default_rng(7)
    x1 = rng.normal(0, 0.02, 1 << 15).astype(np.float32)
    x2 = x1.copy()
    moved = rng.random(x1.size) < 0.1
    x2[moved] += rng.normal(0, 1e-4, int(moved.sum())).astype(np.float32)
    codecs = {"memcpy": get_codec({"id": "memcpy"}), "lmc": get_codec({"id": "lmc"})}  # lmc takes the reference
    p = pipes("delta_bytegroup", "reference", "bytegroup")
    rows, srows, refs = measure_tensor(rec(x1, 10), p, codecs, QUICK, {}, {})
    assert all(r["cond_bound_bytes"] == "" for r in rows + srows)
    rows, srows, _ = measure_tensor(rec(x2, 20), p, codecs, QUICK, refs, {})
    by = {r["transform"]: r for r in rows}
    assert by["bytegroup"]["cond_bound_bytes"] == ""  # standalone: no reference to condition on
    d, ref = by["delta_bytegroup"], by["reference"]
    # 90% of the values are unchanged: given the reference, well under the standalone order-0 bound
    assert 0 < d["cond_bound_bytes"] < 0.5 * by["bytegroup"]["entropy_bound_bytes"]
    # the reference pipeline's one raw stream, each byte against the reference's byte: the same information
    assert 0 < ref["cond_bound_bytes"] < 0.6 * by["bytegroup"]["entropy_bound_bytes"]
    streams = [r for r in srows if r["transform"] == "delta_bytegroup"]
    assert len(streams) == 4 and abs(sum(r["cond_bound_bytes"] for r in streams) - d["cond_bound_bytes"]) < 1
    # an unrelated reference carries no information: the bound is the adaptive order-0 one (within rounding)
    rows, _, _ = measure_tensor(rec(random_bits(1 << 15, np.float32, seed=9), 30), pipes("delta"),
                                {"memcpy": codecs["memcpy"]}, QUICK, {"delta": [(20, x2)]}, {})
    assert rows[0]["cond_bound_bytes"] >= 0.99 * rows[0]["orig_bytes"]


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.uint8], ids=str)
def test_plane_context_counts_against_numpy(dtype):
    """The compiled counts equal a NumPy statement of the definition: plane j's byte under the context (the
    reference's byte j, whether every higher byte equals the reference's)."""
    from lmcbench.bench.measure import plane_context_counts

    r = random_bits(5000, dtype, seed=1)
    x = r.copy().reshape(-1).view(np.uint8)
    x[::7] ^= 1  # some elements move in their lowest byte, a few higher ones by the random flips below
    x[::31] = random_bits(x[::31].size, np.uint8, seed=2)
    x = x.view(r.dtype)
    k = r.dtype.itemsize
    xb, rb = x.view(np.uint8).reshape(-1, k), r.view(np.uint8).reshape(-1, k)
    got = plane_context_counts(x, r)
    same = np.ones(len(xb), bool)
    for j in range(k - 1, -1, -1):
        ctx = rb[:, j].astype(np.int64) + 256 * same
        want = np.bincount(ctx * 256 + xb[:, j], minlength=512 * 256).reshape(512, 256)
        assert (got[j] == want).all(), j
        same &= xb[:, j] == rb[:, j]


def test_delta_reference_decoded_across_slices():
    x = random_bits(1000, np.float32, seed=3)
    opts = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False, chunk_mib=400 / 2**20)  # 100 elements
    codecs = {"flip": get_codec({"id": "test_flip"})}
    _, _, refs = measure_tensor(rec(x), pipes("delta"), codecs, opts, {}, {})
    # the first slice fails; the failed codec is not run on later slices, which keep the original bits
    expected = x.copy().view(np.uint8)
    expected[0] ^= 0xFF
    assert refs["delta"][-1][1].tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int8], ids=str)
def test_slicing_is_transparent(dtype):
    x = random_bits(3001, dtype, seed=4).reshape(3001)
    r = random_bits(3001, dtype, seed=5)
    small = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False, chunk_mib=1000 / 2**20)
    codecs = {"zstd": get_codec({"id": "zstd"}), "memcpy": get_codec({"id": "memcpy"})}
    rows_s, srows_s, refs_s = measure_tensor(rec(x, 20), pipes("delta_expsplit", "bytegroup"), codecs, small,
                                             {"delta_expsplit": (10, r)}, {})
    rows_b, srows_b, _ = measure_tensor(rec(x, 20), pipes("delta_expsplit", "bytegroup"), codecs, QUICK,
                                        {"delta_expsplit": (10, r)}, {})
    assert all(row["verified"] for row in rows_s + rows_b)
    mem = {r["transform"]: r["comp_bytes"] for r in rows_s if r["codec"] == "memcpy"}
    assert mem == {r["transform"]: r["comp_bytes"] for r in rows_b if r["codec"] == "memcpy"}
    # the per-stream byte counts and entropies are the same whether sliced or not
    key = lambda rows: sorted((r["transform"], r["stream"], r["bytes"], r["entropy_bits"]) for r in rows)  # noqa: E731
    assert key(srows_s) == key(srows_b)
    assert same_bits(refs_s["delta_expsplit"][-1][1], x)


def test_row_fields():
    x = np.zeros((64, 32), np.float32)
    rows, srows, _ = measure_tensor(rec(x, 7, "layer.w", "exp_avg"), pipes("raw"), {"zstd": get_codec({"id": "zstd"})},
                                    QUICK, {}, {})
    (r,) = rows
    assert set(RECORD_COLUMNS) <= set(r)
    assert r["shape"] == "64x32" and r["numel"] == 2048 and r["dtype"] == "float32" and r["kind"] == "exp_avg"
    assert r["orig_bytes"] == x.nbytes and r["comp_bytes"] < x.nbytes / 50
    assert r["ratio"] == x.nbytes / r["comp_bytes"]
    assert r["entropy_bits"] == 0.0 and r["n_streams"] == 1 and r["codec_label"] == "zstd-3"
    assert json.loads(r["transform_config"]) == []
    assert r["repeats"] == 1
    (s,) = srows
    assert set(STREAM_COLUMNS) <= set(s) and s["bytes"] == x.nbytes and s["stream"] == "raw"


def test_measure_primitives():
    calls = []
    out, t = timed(lambda: calls.append(1) or len(calls), warmup=2, repeats=3, budget_s=10)
    assert out == 5 and len(calls) == 5 and t.repeats == 3 and t.min <= t.median <= t.max
    h = byte_histogram(np.array([0, 1, 1, 255], np.uint8))
    assert h.sum() == 4 and h[1] == 2 and h[255] == 1
    assert entropy_bits(np.zeros(256)) == 0.0
    assert entropy_bits(np.ones(256)) == pytest.approx(8.0)
    assert block_entropies(np.arange(256, dtype=np.uint8), block=128).tolist() == [7.0, 7.0]


def test_run_writes_records(tmp_path):
    make_trainer_folder(tmp_path / "out", steps=(10, 20, 30))
    src = get_source({"type": "hf_trainer", "path": str(tmp_path / "out")})
    codecs = {"zstd": get_codec({"id": "zstd"}), "flip": get_codec({"id": "test_flip"})}
    logs = []
    summary = run(src, pipes("raw", "delta"), codecs, QUICK, str(tmp_path / "res"), log=logs.append)
    n_tensors = 3 * 3 * 6
    assert summary["tensors"] == n_tensors and summary["rows"] == n_tensors * 2 * 2
    assert summary["failed"] == n_tensors * 2  # every flip row
    with open(tmp_path / "res" / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == RECORD_COLUMNS and len(rows) == summary["rows"]
    ok = [r for r in rows if r["codec"] == "zstd"]
    assert all(r["verified"] == "True" for r in ok)
    assert all(r["verified"] == "False" for r in rows if r["codec"] == "flip")
    # the delta of zstd is measured against what flip (the first codec) decoded, and still verifies
    refs = {(r["tensor"], r["kind"], r["step"]): r["ref_step"] for r in rows if r["transform"] == "delta"}
    for (t, k, step), ref in refs.items():
        assert ref == {"10": "", "20": "10", "30": "20"}[step]
    assert (tmp_path / "res" / "streams.csv").exists()


def test_run_records_skips(tmp_path):
    from safetensors.numpy import save_file

    d = tmp_path / "out" / "checkpoint-1"
    d.mkdir(parents=True)
    save_file({"a": np.arange(100, dtype=np.int8), "b": np.ones(10, np.float32)}, str(d / "model.safetensors"))
    src = get_source({"type": "hf_trainer", "path": str(tmp_path / "out")})
    try:
        z = get_codec({"id": "zipnn"})
        type(z).check_installed()
    except ImportError:
        pytest.skip("zipnn not installed")
    logs = []
    summary = run(src, pipes("raw"), {"zipnn": z, "zstd": get_codec({"id": "zstd"})}, QUICK, str(tmp_path / "r"),
                  log=logs.append)
    assert summary["rows"] == 3 and summary["failed"] == 0  # zipnn: b only; zstd: a and b
    assert summary["skipped"] and "int8" in summary["skipped"][0]
    assert any("zipnn" in m and "int8" in m for m in logs), logs


def test_measure_tensor_leaves_readonly_inputs_alone():
    from lmcbench_testlib import codec_configs, pipeline_configs

    allp = {n: Pipeline.from_config(n, s) for n, s in pipeline_configs().items()}
    codecs = {n: get_codec(c) for n, c in codec_configs().items() if c["id"] in ("memcpy", "zstd", "lz4")}
    for dtype in (np.float32, BF16, np.float16, np.int8):
        x = random_bits(777, dtype, seed=8).reshape(7, 111)
        r = random_bits(777, dtype, seed=9).reshape(7, 111)
        x0, r0 = x.copy(), r.copy()
        x.flags.writeable = False
        r.flags.writeable = False
        refs = {n: (1, r) for n, p in allp.items() if p.temporal}
        rows, _, new_refs = measure_tensor(rec(x, 2), allp, codecs, QUICK, refs, {})
        # byte codecs take no reference: the 'reference' pipelines are left out for them
        n_byte_pipes = sum(1 for p in allp.values() if not p.codec_reference)
        assert len(rows) == n_byte_pipes * len(codecs) and all(row["verified"] for row in rows)
        assert same_bits(x, x0) and same_bits(r, r0)
        for n, hist in new_refs.items():
            assert len(hist) == allp[n].lag
            step, ref = hist[-1]
            assert step == 2 and same_bits(ref, x0)


def lag_pipes():
    cfg = {"xor2": [{"id": "delta", "mode": "xor", "lag": 2}],
           "sub3": [{"id": "delta", "mode": "sub", "lag": 3}, {"id": "bytegroup"}],
           "ref2": [{"id": "reference", "lag": 2}], "ref": [{"id": "reference"}], "raw": []}
    return {n: Pipeline.from_config(n, c) for n, c in cfg.items()}


def test_lagged_references_are_the_decoded_steps_that_many_back():
    xs = [random_bits(500, np.float32, seed=40 + i) for i in range(5)]
    codecs = {"zstd": get_codec({"id": "zstd"}), "lmc": get_codec({"id": "lmc"})}
    refs, seen = {}, {}
    for i, x in enumerate(xs):
        step = 10 * (i + 1)
        rows, _, refs = measure_tensor(rec(x, step), lag_pipes(), codecs, QUICK, refs, {})
        assert all(r["verified"] for r in rows), [r["error"] for r in rows if not r["verified"]]
        for r in rows:
            seen[(r["transform"], r["codec"], step)] = r["ref_step"]
        # each temporal pipeline keeps exactly its lag's worth of decoded history, oldest first
        assert [s for s, _ in refs["xor2"]] == [10 * (j + 1) for j in range(max(0, i - 1), i + 1)]
        assert [s for s, _ in refs["sub3"]] == [10 * (j + 1) for j in range(max(0, i - 2), i + 1)]
        assert len(refs["ref"]) == 1 and "raw" not in refs
        assert all(same_bits(a, xs[s // 10 - 1]) for s, a in refs["sub3"])
    assert [seen[("xor2", "zstd", s)] for s in (10, 20, 30, 40, 50)] == ["", "", 10, 20, 30]
    assert [seen[("sub3", "lmc", s)] for s in (10, 20, 30, 40, 50)] == ["", "", "", 10, 20]
    assert [seen[("ref2", "lmc", s)] for s in (10, 20, 30, 40, 50)] == ["", "", 10, 20, 30]
    # byte codecs take no reference: the reference pipelines have lmc rows only
    assert not any(k[0].startswith("ref") and k[1] == "zstd" for k in seen)


def test_reference_pipeline_never_loses_to_compressing_alone():
    """LMC's per-chunk choice: on a tensor whose first half barely changed and whose second half is new, the
    reference pipeline codes the first half as a delta and the second alone, so it beats both the standalone
    code and the XOR delta; on unrelated data it costs only the reference hash in the header."""
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 0.02, 600_000).astype(np.float32)
    x = ref.copy()
    x[:300_000] += rng.normal(0, 1e-6, 300_000).astype(np.float32)
    x[300_000:] = rng.normal(0, 0.02, 300_000).astype(np.float32)
    cfg = {"raw": [], "delta": [{"id": "delta"}], "reference": [{"id": "reference"}]}
    p = {n: Pipeline.from_config(n, c) for n, c in cfg.items()}
    hist = {"delta": [(1, ref)], "reference": [(1, ref)]}
    rows, _, _ = measure_tensor(rec(x, 2), p, {"lmc": get_codec({"id": "lmc"})}, QUICK, hist, {})
    size = {r["transform"]: r["comp_bytes"] for r in rows}
    assert all(r["verified"] for r in rows)
    assert size["reference"] < size["raw"] and size["reference"] < size["delta"]
    unrelated = rng.normal(0, 0.02, 600_000).astype(np.float32)
    rows, _, _ = measure_tensor(rec(unrelated, 2), p, {"lmc": get_codec({"id": "lmc"})}, QUICK, hist, {})
    size = {r["transform"]: r["comp_bytes"] for r in rows}
    assert size["raw"] <= size["reference"] <= size["raw"] + 8 < size["delta"]


def test_xor_analysis_over_several_lags(tmp_path):
    make_trainer_folder(tmp_path / "out", steps=(10, 20, 30, 40))
    src = get_source({"type": "hf_trainer", "path": str(tmp_path / "out"), "kinds": ["weight"]})
    opts = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False, xor_lags=[1, 2])
    run(src, pipes("raw"), {"memcpy": get_codec({"id": "memcpy"})}, opts, str(tmp_path / "res"), log=lambda m: None)
    with open(tmp_path / "res" / "xor.csv") as f:
        rows = list(csv.DictReader(f))
    per_tensor = {}
    for r in rows:
        per_tensor.setdefault(r["tensor"], set()).add((int(r["lag"]), int(r["step"]), int(r["ref_step"])))
    assert per_tensor and all(v == {(1, 20, 10), (1, 30, 20), (1, 40, 30), (2, 30, 10), (2, 40, 20)}
                              for v in per_tensor.values())


@pytest.mark.parametrize("bad", [[], [0], ["1"], [True], 3])
def test_xor_lags_validated(bad):
    from lmcbench.errors import ConfigError

    with pytest.raises(ConfigError, match="xor_lags"):
        BenchOptions.from_config({"xor_lags": bad})


@pytest.mark.parametrize("steps, msg", [
    ([{"id": "delta", "lag": 0}], "lag must be a positive integer"),
    ([{"id": "reference", "lag": 1.5}], "lag must be a positive integer"),
    ([{"id": "reference"}, {"id": "bytegroup"}], "only transform"),
])
def test_lag_and_reference_config_errors(steps, msg):
    from lmcbench.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        Pipeline.from_config("p", steps)
