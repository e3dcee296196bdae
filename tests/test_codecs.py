"""Codec conformance: every configured codec x every configured pipeline round-trips bit-exactly over the
dtype matrix, through the same path the runner uses, and no input buffer is ever modified."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmcbench.bench.options import BenchOptions
from lmcbench.bench.runner import measure_tensor
from lmcbench.codecs import Codec, available_codecs, get_codec, get_codec_class
from lmcbench.errors import ConfigError, NotApplicable
from lmcbench.sources import TensorRecord
from lmcbench.transforms import Pipeline, Stream

from lmcbench_testlib import BF16, DTYPES, LENGTHS, codec_configs, make_codec_or_skip, pipeline_configs, random_bits, same_bits

CODECS = codec_configs()
PIPELINES = pipeline_configs()
DTYPE_AWARE = ("zipnn", "openzl", "lmc", "z4ai", "pcodec")  # take typed float streams
REFUSE_BYTES = ("zipnn", "openzl", "z4ai", "pcodec")  # and refuse the others (NotApplicable)
QUICK = BenchOptions(warmup=0, repeats=1, budget_s=0.0, progress=False)


def test_codec_configs_found():
    assert {"memcpy", "zstd", "lz4", "bz2", "lzma", "brotli", "zipnn", "openzl", "lmc"} <= {c["id"] for c in CODECS.values()}


def snapshot(a):
    return np.ascontiguousarray(a).tobytes() if isinstance(a, np.ndarray) else bytes(a)


def dtype_aware(codec) -> bool:
    """Codecs that only take some element dtypes (they refuse byte planes with NotApplicable)."""
    return codec.codec_id in REFUSE_BYTES


def codec_roundtrip_streams(codec, streams):
    """Encode/decode every stream as the runner does; the decoded streams, or None if a stream is not applicable.
    Checks that neither encode nor decode modifies the buffer it gets."""
    if any(s.ref is not None for s in streams) and not codec.supports_reference:
        with pytest.raises(NotApplicable):
            codec.encode_ref(streams[0].as_typed(), streams[0].ref_typed())
        return None
    try:
        for s in streams:
            codec.check_applicable(s.as_typed())
    except NotApplicable as why:
        assert dtype_aware(codec), f"byte codec {codec.codec_id} refused a stream: {why}"
        return None
    out = []
    for s in streams:
        a, r = s.as_typed(), s.ref_typed()
        before = snapshot(a)
        r_before = None if r is None else snapshot(r)
        blob = codec.encode(a) if r is None else codec.encode_ref(a, r)
        assert snapshot(a) == before, f"{codec.codec_id}.encode modified its input"
        assert r is None or snapshot(r) == r_before, f"{codec.codec_id}.encode modified its reference"
        blob_before = snapshot(blob)
        raw = codec.decode(blob) if r is None else codec.decode_ref(blob, r)
        assert snapshot(blob) == blob_before, f"{codec.codec_id}.decode modified its input"
        raw = np.asarray(raw).reshape(-1).view(np.uint8)
        assert raw.nbytes == s.nbytes
        out.append(Stream(s.name, raw.view(s.data.dtype).reshape(s.data.shape), s.typed))
    return out


@pytest.mark.parametrize("pname", sorted(PIPELINES))
@pytest.mark.parametrize("cname", sorted(CODECS))
def test_conformance(cname, pname):
    """pipeline.encode -> codec per stream (Stream.as_typed) -> codec.decode -> pipeline.decode, bit-exact,
    for fp32/fp16/bf16/int8, lengths 0/1/7/1001, special values, with and without a reference."""
    codec = make_codec_or_skip(CODECS[cname])
    pipe = Pipeline.from_config(pname, PIPELINES[pname])
    n_checked = 0
    for dtype in DTYPES:
        for n in LENGTHS:
            for with_ref in (False, True):
                x = random_bits(n, dtype, seed=11)
                ref = random_bits(n, dtype, seed=12) if with_ref else None
                x0 = x.copy()
                r0 = None if ref is None else ref.copy()
                streams = pipe.encode(x, ref)
                dec = codec_roundtrip_streams(codec, streams)
                if dec is None:
                    continue
                y = pipe.decode(dec, ref, dtype, x.shape)
                assert same_bits(y, x0), f"{cname}/{pname}: {dtype} n={n} ref={with_ref} not bit-exact"
                assert same_bits(x, x0)
                if ref is not None:
                    assert same_bits(ref, r0)
                n_checked += 1
    if not dtype_aware(codec):
        with_refs = 1 if pipe.codec_reference and not codec.supports_reference else 2
        assert n_checked == len(DTYPES) * len(LENGTHS) * with_refs
    else:
        assert n_checked > 0 or pname not in ("raw", "delta", "delta_sub"), "dtype-aware codec applied nowhere"


@pytest.mark.parametrize("pname", sorted(PIPELINES))
@pytest.mark.parametrize("cname", sorted(CODECS))
def test_conformance_via_measure_tensor(cname, pname):
    """The same matrix through lmcbench.bench.runner.measure_tensor: every row verified."""
    codec = make_codec_or_skip(CODECS[cname])
    pipe = Pipeline.from_config(pname, PIPELINES[pname])
    for dtype in DTYPES:
        for n in LENGTHS:
            x = random_bits(n, dtype, seed=21).reshape((n,) if n != 1001 else (7, 143))
            ref = random_bits(n, dtype, seed=22).reshape(x.shape)
            for refs in ({}, {pname: (5, ref)}):
                rec = TensorRecord(10, "t", "weight", x.dtype, x.shape, x)
                skipped = {}
                rows, srows, new_refs = measure_tensor(rec, {pname: pipe}, {cname: codec}, QUICK, dict(refs), skipped)
                if not rows:
                    assert skipped, "no row and no skip note"
                    assert dtype_aware(codec) or (pipe.codec_reference and not codec.supports_reference)
                    continue
                (row,) = rows
                assert row["verified"] is True, row["error"]
                assert row["error"] == ""
                assert row["orig_bytes"] == x.nbytes
                if n:
                    assert row["ratio"] == pytest.approx(row["orig_bytes"] / row["comp_bytes"])
                assert row["ref_step"] == (5 if (refs and pipe.temporal) else "")
                assert json.loads(row["codec_config"]) == codec.get_config()
                assert sum(r["bytes"] for r in srows) == sum(s.nbytes for s in pipe.encode(x, ref if refs else None))
                if pipe.temporal:
                    step, nref = new_refs[pname][-1]
                    assert step == 10 and same_bits(nref, x)
                else:
                    assert new_refs == {}


@pytest.mark.parametrize("cname", [c for c in sorted(CODECS) if CODECS[c]["id"] in DTYPE_AWARE])
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=str)
@pytest.mark.parametrize("pname", ["raw", "delta"])
def test_dtype_aware_codecs_apply_to_float_raw_streams(cname, dtype, pname):
    codec = make_codec_or_skip(CODECS[cname])
    if CODECS[cname]["id"] == "pcodec" and dtype == BF16:
        pytest.skip("pcodec has no bfloat16")
    x = random_bits(1001, dtype, seed=3)
    streams = Pipeline.from_config(pname, PIPELINES[pname]).encode(x, random_bits(1001, dtype, seed=4))
    (s,) = streams
    assert s.as_typed().dtype == dtype
    codec.check_applicable(s.as_typed())  # must not raise
    rows, _, _ = measure_tensor(TensorRecord(1, "t", "weight", dtype, x.shape, x),
                                {pname: Pipeline.from_config(pname, PIPELINES[pname])}, {cname: codec}, QUICK, {}, {})
    assert len(rows) == 1 and rows[0]["verified"] is True


@pytest.mark.parametrize("cname", [c for c in sorted(CODECS) if CODECS[c]["id"] in REFUSE_BYTES])
def test_dtype_aware_codecs_refuse_byte_streams(cname):
    codec = make_codec_or_skip(CODECS[cname])
    streams = Pipeline("bg", Pipeline.from_config("bg", [{"id": "bytegroup"}]).transforms).encode(
        random_bits(64, np.float32))
    with pytest.raises(NotApplicable):
        codec.check_applicable(streams[0].as_typed())
    with pytest.raises(NotApplicable):
        codec.check_applicable(random_bits(64, np.int8))
    # the runner records a skip note, not a row and not an error
    skipped = {}
    x = random_bits(64, np.int8)
    rows, _, _ = measure_tensor(TensorRecord(1, "t", "weight", x.dtype, x.shape, x),
                                {"raw": Pipeline("raw", [])}, {cname: codec}, QUICK, {}, skipped)
    assert rows == [] and len(skipped) == 1 and cname.split("_")[0] in next(iter(skipped.values()))


@pytest.mark.parametrize("cname", sorted(CODECS))
def test_codec_readonly_inputs_and_buffer_types(cname):
    codec = make_codec_or_skip(CODECS[cname])
    for dtype in ([np.dtype(np.uint8)] if not dtype_aware(codec) else []) + [BF16, np.dtype(np.float32)]:
        if dtype_aware(codec) and codec.codec_id == "pcodec" and dtype == BF16:
            continue  # pcodec has no bfloat16
        a = random_bits(257, dtype, seed=7)
        a0 = a.copy()
        a.flags.writeable = False
        blob = codec.encode(a)
        assert same_bits(a, a0)
        for b in (bytes(memoryview(blob).cast("B")), bytearray(memoryview(blob).cast("B")),
                  np.frombuffer(bytes(memoryview(blob).cast("B")), np.uint8)):
            if isinstance(b, np.ndarray):
                b.flags.writeable = False
            dec = codec.decode(b)
            assert dec.dtype == np.uint8 and dec.tobytes() == a0.tobytes()
        out = np.empty_like(a0)
        assert codec.decode(blob, out=out) is out and same_bits(out, a0)
    if not dtype_aware(codec):
        raw = b"hello world " * 50
        assert codec.decode(codec.encode(raw)).tobytes() == raw


@pytest.mark.parametrize("cname", sorted(CODECS))
def test_config_equals_get_config_and_json_roundtrip(cname):
    """A codec config in conf/codec/<name>.yaml equals get_config() of the codec it makes."""
    cfg = CODECS[cname]
    codec = get_codec(cfg)  # no third-party import needed for this
    assert codec.get_config() == cfg
    again = get_codec(json.loads(json.dumps(codec.get_config())))
    assert type(again) is type(codec) and again.get_config() == cfg
    assert type(codec).from_config(json.loads(json.dumps(cfg))).get_config() == cfg
    assert isinstance(codec.label, str) and codec.label
    assert get_codec_class(cfg["id"]) is type(codec)


@pytest.mark.parametrize("cfg", [
    {"id": "nope"}, {}, {"id": "zstd", "level": 99}, {"id": "zstd", "level": "3"}, {"id": "zstd", "bogus": 1},
    {"id": "bz2", "level": 0}, {"id": "lzma", "preset": 10}, {"id": "brotli", "quality": 12},
    {"id": "brotli", "lgwin": 30}, {"id": "lz4", "level": 17}, {"id": "lz4", "acceleration": 2},
    {"id": "bz2", "level": True}, {"id": "lzma", "bogus": 1},
    {"id": "lmc", "threads": 0}, {"id": "lmc", "threads": True}, {"id": "lmc", "prefer": "smallest"},
])
def test_bad_codec_configs(cfg):
    with pytest.raises(ConfigError):
        get_codec(cfg)


def test_memcpy_rejects_unknown_options():
    with pytest.raises(ConfigError):
        get_codec({"id": "memcpy", "level": 1})


def test_available_codecs_lists_the_basic_ones():
    av = available_codecs()
    assert {"memcpy", "bz2", "lzma", "zstd", "lz4", "brotli"} <= set(av)
    for cid in av:
        get_codec_class(cid).check_installed()


def test_codec_labels():
    assert get_codec({"id": "lmc"}).label == "lmc"
    assert get_codec({"id": "lmc", "prefer": "size"}).label == "lmc-size"
    assert get_codec({"id": "lmc", "prefer": "fast"}).label == "lmc-fast"
    assert "prefer" not in get_codec({"id": "lmc", "prefer": "speed"}).get_config()
    assert get_codec({"id": "zstd", "level": 19}).label == "zstd-19"
    assert get_codec({"id": "lz4", "level": 9}).label == "lz4hc-9"
    assert get_codec({"id": "lz4"}).label == "lz4"
    assert get_codec({"id": "lzma", "preset": 1}).label == "lzma-1"
    assert get_codec({"id": "lmc", "threads": None}).label == "lmc-allt"
    assert get_codec({"id": "zstd", "threads": -1}).threads >= 1


def test_compression_actually_compresses():
    x = np.zeros(100_000, np.float32)
    for cid in ("zstd", "lz4", "bz2", "lzma", "brotli"):
        blob = get_codec({"id": cid}).encode(x)
        assert len(memoryview(blob).cast("B")) < x.nbytes / 20, cid
    assert len(get_codec({"id": "memcpy"}).encode(x)) == x.nbytes


def test_base_codec_contract():
    class NoImpl(Codec):
        codec_id = "test_noimpl"

    with pytest.raises(NotImplementedError):
        NoImpl().encode(b"x")
    assert NoImpl(a=1).get_config() == {"id": "test_noimpl", "a": 1}
    assert "a=1" in repr(NoImpl(a=1))
