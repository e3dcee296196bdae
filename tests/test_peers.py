"""The peer codecs (ZipNN, OpenZL, z4ai, blosc2, pcodec): bit-exact round trips, caller buffers untouched, configs, applicability."""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

from lmcbench.codecs import get_codec, get_codec_class
from lmcbench.errors import ConfigError, NotApplicable

BF16 = np.dtype(ml_dtypes.bfloat16)
LENGTHS = [0, 1, 7, 1001, 300000]


def _have(mod):
    try:
        importlib.import_module(mod)
        return True
    except ImportError:
        return False


needs_zipnn = pytest.mark.skipif(not _have("zipnn"), reason="zipnn not installed")
needs_openzl = pytest.mark.skipif(not _have("openzl.ext"), reason="openzl not installed")
needs_z4ai = pytest.mark.skipif(not _have("z4ai"), reason="z4ai not installed")
needs_blosc2 = pytest.mark.skipif(not _have("blosc2"), reason="blosc2 not installed")
needs_pcodec = pytest.mark.skipif(not _have("pcodec"), reason="pcodec not installed")

# (config, dtypes the codec takes)
ZIPNN_CFG = pytest.param({"id": "zipnn", "threads": 1}, marks=needs_zipnn, id="zipnn")
ZIPNN_MT = pytest.param({"id": "zipnn", "threads": 4}, marks=needs_zipnn, id="zipnn-4t")
OPENZL_CFG = pytest.param({"id": "openzl", "graph": "deconstruct_huffman"}, marks=needs_openzl, id="openzl")
OPENZL_GEN = pytest.param({"id": "openzl", "graph": "generic"}, marks=needs_openzl, id="openzl-generic")
Z4AI_CFG = pytest.param({"id": "z4ai", "threads": 1}, marks=needs_z4ai, id="z4ai")
Z4AI_MT = pytest.param({"id": "z4ai", "threads": 0}, marks=needs_z4ai, id="z4ai-allt")
BLOSC2 = [pytest.param({"id": "blosc2", "cname": c, "clevel": 5, "shuffle": f, "threads": 1}, marks=needs_blosc2,
                       id=f"blosc2-{f}-{c}") for f in ("shuffle", "bitshuffle") for c in ("zstd", "lz4")]
BLOSC2_MISC = [pytest.param({"id": "blosc2", "cname": "blosclz", "clevel": 9, "shuffle": "noshuffle", "threads": 2},
                            marks=needs_blosc2, id="blosc2-noshuffle-blosclz-2t")]
PCODEC_CFG = pytest.param({"id": "pcodec", "level": 8}, marks=needs_pcodec, id="pcodec")
ALL = [ZIPNN_CFG, ZIPNN_MT, OPENZL_CFG, OPENZL_GEN, Z4AI_CFG, Z4AI_MT, *BLOSC2, *BLOSC2_MISC, PCODEC_CFG]
FLOATS = [BF16, np.dtype(np.float16), np.dtype(np.float32)]


def random_bits(n, dtype, seed=0):
    """Random bit patterns viewed as ``dtype``: NaNs, infinities, subnormals and ±0 all show up, plus a few forced."""
    dtype = np.dtype(dtype)
    u = np.dtype(f"<u{dtype.itemsize}")
    rng = np.random.default_rng(seed + n)
    bits = rng.integers(0, 1 << (8 * dtype.itemsize), n, dtype=u, endpoint=False)
    nbits = 8 * dtype.itemsize
    special = {  # +inf, -inf, quiet NaN, NaN with payload, smallest subnormal, largest subnormal, -0
        16: [0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x0001, 0x007F, 0x8000] if dtype == BF16 else
            [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x0001, 0x03FF, 0x8000],
        32: [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x00000001, 0x007FFFFF, 0x80000000],
    }.get(nbits, [])
    k = min(n, len(special))
    bits[:k] = np.array(special[:k], dtype=u)
    return bits.view(dtype)


def gaussian_bf16(n=1 << 20):
    return (np.random.default_rng(0).standard_normal(n) * 0.02).astype(BF16)


def takes(codec, dtype) -> bool:
    try:
        codec.check_applicable(np.zeros(1, dtype))
        return True
    except NotApplicable:
        return False


def pick(codec, *dtypes):
    """The first of ``dtypes`` that ``codec`` takes."""
    return next(np.dtype(d) for d in dtypes if takes(codec, d))


def roundtrip(codec, arr):
    before = arr.copy()
    blob = codec.encode(arr)
    assert np.array_equal(arr.view(np.uint8), before.view(np.uint8)), "encode modified the caller's array"
    dec = codec.decode(blob)
    assert dec.dtype == np.uint8 and dec.ndim == 1
    assert dec.tobytes() == before.tobytes()
    # decoding again (a reused decoder) gives the same bytes; so does a fresh codec from the config
    assert codec.decode(blob).tobytes() == before.tobytes()
    assert get_codec(codec.get_config()).decode(blob).tobytes() == before.tobytes()
    return blob


# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", ALL)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d))
@pytest.mark.parametrize("n", LENGTHS)
def test_roundtrip_bit_exact(cfg, dtype, n):
    codec = get_codec(cfg)
    arr = random_bits(n, dtype)
    if not takes(codec, dtype):  # pcodec: no bfloat16
        assert codec.codec_id == "pcodec" and dtype == BF16
        with pytest.raises(NotApplicable, match="bfloat16"):
            codec.encode(arr)
        return
    codec.check_applicable(arr)
    roundtrip(codec, arr)


@pytest.mark.parametrize("cfg", ALL)
def test_roundtrip_reuses_codec_across_dtypes_and_shapes(cfg):
    codec = get_codec(cfg)
    for i, (dtype, shape) in enumerate([(BF16, (37, 11)), (np.float32, (5, 3, 7)), (BF16, (1001,)),
                                         (np.float16, (2, 300)), (np.float32, (0, 4)), (BF16, (1, 1))]):
        if not takes(codec, dtype):
            continue
        arr = random_bits(int(np.prod(shape)), dtype, seed=i).reshape(shape)
        roundtrip(codec, arr)


@pytest.mark.parametrize("cfg", ALL)
def test_non_contiguous_input(cfg):
    codec = get_codec(cfg)
    arr = random_bits(2000, pick(codec, BF16, np.float32)).reshape(40, 50)[:, ::2]
    blob = codec.encode(arr)
    assert codec.decode(blob).tobytes() == np.ascontiguousarray(arr).tobytes()


@pytest.mark.parametrize("cfg", ALL)
def test_caller_bytes_untouched_on_gaussian(cfg):
    # the data ZipNN actually reorders in place (it leaves some random inputs alone): check on real-looking data
    codec = get_codec(cfg)
    for arr in (gaussian_bf16(1 << 16), (np.random.default_rng(1).standard_normal(1 << 16) * 0.02).astype(np.float32)):
        if not takes(codec, arr.dtype):
            continue
        snapshot = arr.tobytes()
        roundtrip(codec, arr)
        assert arr.tobytes() == snapshot


@pytest.mark.parametrize("cfg", [ZIPNN_CFG, OPENZL_CFG, Z4AI_CFG, BLOSC2[0]])
def test_ratio_on_gaussian_bf16(cfg):
    codec = get_codec(cfg)
    arr = gaussian_bf16()
    blob = roundtrip(codec, arr)
    ratio = arr.nbytes / len(blob)
    assert ratio > 1.3, f"{codec.label}: ratio {ratio:.3f}"


@pytest.mark.parametrize("cfg", BLOSC2 + [PCODEC_CFG])
def test_ratio_on_gaussian_fp32(cfg):
    # all of them below the order-0 coders on bf16 (blosc2-lz4: ~1.15), but above 1 on a Gaussian fp32 tensor
    codec = get_codec(cfg)
    arr = (np.random.default_rng(0).standard_normal(1 << 18) * 0.02).astype(np.float32)
    ratio = arr.nbytes / len(roundtrip(codec, arr))
    assert ratio > 1.05, f"{codec.label}: ratio {ratio:.3f}"


@pytest.mark.parametrize("cfg", ALL)
def test_decode_into_out(cfg):
    codec = get_codec(cfg)
    arr = random_bits(1001, np.float32)
    out = np.empty_like(arr)
    res = codec.decode(codec.encode(arr), out=out)
    assert res is out and out.tobytes() == arr.tobytes()
    with pytest.raises(ValueError):
        codec.decode(codec.encode(arr), out=np.empty(10, np.float32))


@pytest.mark.parametrize("cfg", ALL)
def test_decode_accepts_buffer_types(cfg):
    codec = get_codec(cfg)
    arr = random_bits(1001, pick(codec, BF16, np.float32))
    blob = bytes(codec.encode(arr))
    for b in (bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        assert codec.decode(b).tobytes() == arr.tobytes()


# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", ALL)
def test_config_roundtrip(cfg):
    codec = get_codec(cfg)
    conf = codec.get_config()
    assert conf == cfg
    again = get_codec(conf)
    assert type(again) is type(codec) and again.get_config() == conf
    assert type(codec).from_config(conf).get_config() == conf


@needs_zipnn
def test_zipnn_defaults_and_properties():
    import importlib.metadata

    codec = get_codec({"id": "zipnn"})
    assert codec.get_config() == {"id": "zipnn", "threads": 1}
    assert codec.label == "zipnn" and codec.threads == 1
    assert importlib.metadata.version("zipnn") in codec.version
    assert get_codec({"id": "zipnn", "threads": 8}).threads == 8
    assert get_codec({"id": "zipnn", "threads": 0}).threads >= 1
    get_codec_class("zipnn").check_installed()


@needs_openzl
def test_openzl_defaults_and_properties():
    import importlib.metadata

    codec = get_codec({"id": "openzl"})
    assert codec.get_config() == {"id": "openzl", "graph": "deconstruct_huffman"}
    assert codec.label == "openzl" and codec.threads == 1
    assert get_codec({"id": "openzl", "graph": "generic"}).label == "openzl-generic"
    assert importlib.metadata.version("openzl") in codec.version
    get_codec_class("openzl").check_installed()


@pytest.mark.parametrize("cfg", [
    {"id": "zipnn", "threads": -1}, {"id": "zipnn", "threads": 1.5}, {"id": "zipnn", "threads": True},
    {"id": "zipnn", "level": 3}, {"id": "openzl", "graph": "nope"}, {"id": "openzl", "threads": 2},
])
def test_bad_config(cfg):
    # validation happens before any third-party import, so this runs without the libraries too
    with pytest.raises(ConfigError):
        get_codec(cfg)


# ------------------------------------------------------------------------------------------------------------

_REFUSED = [np.uint8, np.int8, np.int16, np.uint16, np.int32, ">f4", ">f2"]
_NOT_APPLICABLE = ([(c, d) for c in (ZIPNN_CFG, ZIPNN_MT, OPENZL_CFG) for d in _REFUSED + [np.float64]]
                   + [(c, d) for c in (Z4AI_CFG, Z4AI_MT, PCODEC_CFG)
                      for d in _REFUSED + [np.int64, ">f8", ml_dtypes.float8_e4m3fn]])


@pytest.mark.parametrize("cfg,dtype", [pytest.param(c.values[0], d, marks=c.marks, id=f"{c.id}-{np.dtype(d)}")
                                       for c, d in _NOT_APPLICABLE])
def test_not_applicable(cfg, dtype):
    codec = get_codec(cfg)
    arr = np.zeros(16, dtype)
    with pytest.raises(NotApplicable, match=codec.codec_id):
        codec.check_applicable(arr)
    with pytest.raises(NotApplicable):
        codec.encode(arr)


@pytest.mark.parametrize("cfg", [ZIPNN_CFG, OPENZL_CFG, Z4AI_CFG, PCODEC_CFG])
def test_raw_bytes_not_applicable(cfg):
    # a plain bytes buffer arrives as uint8: these dtype-aware codecs refuse it
    codec = get_codec(cfg)
    with pytest.raises(NotApplicable):
        codec.encode(random_bits(64, BF16).tobytes())


@needs_zipnn
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=str)
@pytest.mark.parametrize("n", LENGTHS)
def test_zipnn_fp8(dtype, n):
    codec = get_codec({"id": "zipnn"})
    arr = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).view(dtype)
    codec.check_applicable(arr)
    roundtrip(codec, arr)


@needs_openzl
def test_openzl_deconstruct_rejects_fp8():
    codec = get_codec({"id": "openzl"})
    with pytest.raises(NotApplicable):
        codec.check_applicable(np.zeros(4, ml_dtypes.float8_e4m3fn))


@needs_openzl
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.float64, ml_dtypes.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("n", [0, 1, 1001])
def test_openzl_generic_other_dtypes(dtype, n):
    codec = get_codec({"id": "openzl", "graph": "generic"})
    dt = np.dtype(dtype)
    arr = np.random.default_rng(n).integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    codec.check_applicable(arr)
    roundtrip(codec, arr)
    with pytest.raises(NotApplicable):
        codec.check_applicable(np.zeros(4, ">f4"))


@needs_zipnn
def test_zipnn_rejects_garbage():
    with pytest.raises(Exception):
        get_codec({"id": "zipnn"}).decode(b"not a zipnn blob at all, definitely not" * 2)


@needs_openzl
def test_openzl_rejects_garbage():
    with pytest.raises(Exception):
        get_codec({"id": "openzl"}).decode(b"not an openzl frame at all" * 2)


# ------------------------------------------------------------------------------------------------------------
# z4ai, blosc2, pcodec
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [Z4AI_CFG, Z4AI_MT])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", LENGTHS)
def test_z4ai_reference_roundtrip(cfg, dtype, n):
    """compress_delta against the previous step: bit-exact, neither buffer touched, smaller than alone."""
    codec = get_codec(cfg)
    assert codec.supports_reference
    rng = np.random.default_rng(n)
    ref = (rng.standard_normal(n) * 0.02).astype(dtype)
    cur = (ref.astype(np.float32) + (rng.standard_normal(n) * 1e-4).astype(np.float32)).astype(dtype)
    cur[:7] = random_bits(min(n, 7), dtype)  # special values too
    cur0, ref0 = cur.copy(), ref.copy()
    blob = codec.encode_ref(cur, ref)
    assert cur.tobytes() == cur0.tobytes() and ref.tobytes() == ref0.tobytes()
    dec = codec.decode_ref(blob, ref)
    assert dec.dtype == np.uint8 and dec.ndim == 1 and dec.tobytes() == cur0.tobytes()
    assert get_codec(codec.get_config()).decode_ref(bytes(blob), ref).tobytes() == cur0.tobytes()
    assert ref.tobytes() == ref0.tobytes()
    if n >= 300000:
        assert len(blob) < len(codec.encode(cur)), "the delta against a close reference should code smaller"
        # the wrong reference is refused (z4ai records a digest of it), not silently decoded to garbage
        with pytest.raises(ValueError):
            codec.decode_ref(blob, cur)


@needs_z4ai
def test_z4ai_reference_must_match():
    codec = get_codec({"id": "z4ai"})
    x = random_bits(100, np.float32)
    with pytest.raises(ValueError, match="reference"):
        codec.encode_ref(x, random_bits(99, np.float32))
    with pytest.raises(ValueError, match="reference"):
        codec.encode_ref(x, random_bits(200, BF16))
    with pytest.raises(NotApplicable):
        codec.encode_ref(np.zeros(8, np.int16), np.zeros(8, np.int16))


@pytest.mark.parametrize("cfg", [Z4AI_CFG, PCODEC_CFG])
@pytest.mark.parametrize("n", LENGTHS)
def test_float64(cfg, n):
    codec = get_codec(cfg)
    arr = random_bits(n, np.float64) if n else np.zeros(0, np.float64)
    codec.check_applicable(arr)
    roundtrip(codec, arr)


@needs_pcodec
def test_pcodec_refuses_bf16():
    with pytest.raises(NotApplicable, match="bfloat16"):
        get_codec({"id": "pcodec"}).check_applicable(np.zeros(4, BF16))


@pytest.mark.parametrize("cfg", BLOSC2 + BLOSC2_MISC)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, ">f4", ">f2", BF16,
                                   ml_dtypes.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("n", [0, 1, 1001])
def test_blosc2_any_dtype(cfg, dtype, n):
    # a byte codec: every dtype, typesize from the element size
    codec = get_codec(cfg)
    dt = np.dtype(dtype)
    arr = np.random.default_rng(n).integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    codec.check_applicable(arr)
    blob = roundtrip(codec, arr)
    assert memoryview(blob).cast("B")[3] == dt.itemsize  # the chunk header's typesize byte


@needs_blosc2
def test_blosc2_typesize_from_dtype_matters():
    codec = get_codec({"id": "blosc2"})
    x = (np.random.default_rng(0).standard_normal(1 << 16) * 0.02).astype(np.float32)
    typed, as_bytes = codec.encode(x), codec.encode(x.view(np.uint8))
    assert len(typed) < 0.95 * len(as_bytes), "shuffle with typesize 4 should beat typesize 1 on floats"
    assert codec.decode(as_bytes).tobytes() == x.tobytes()


@needs_blosc2
def test_blosc2_leaves_global_threads_alone():
    import blosc2

    before = blosc2.nthreads
    codec = get_codec({"id": "blosc2", "cname": "zstd", "clevel": 5, "shuffle": "shuffle", "threads": 1})
    codec.decode(codec.encode(random_bits(1 << 16, np.float32)))
    assert blosc2.nthreads == before


@needs_blosc2
def test_blosc2_refuses_buffers_over_its_limit(monkeypatch):
    import blosc2

    monkeypatch.setattr(blosc2, "MAX_BUFFERSIZE", 1000)
    codec = get_codec({"id": "blosc2"})
    codec.encode(np.zeros(250, np.float32))
    with pytest.raises(ValueError, match="at most 1000 bytes"):
        codec.encode(np.zeros(251, np.float32))


@needs_z4ai
@needs_blosc2
@needs_pcodec
def test_new_peers_defaults_and_properties():
    import importlib.metadata

    z = get_codec({"id": "z4ai"})
    assert z.get_config() == {"id": "z4ai", "threads": 1} and z.label == "z4ai" and z.threads == 1
    assert get_codec({"id": "z4ai", "threads": 0}).label == "z4ai-allt"
    assert get_codec({"id": "z4ai", "threads": 0}).threads >= 1
    assert importlib.metadata.version("z4ai") in z.version
    b = get_codec({"id": "blosc2"})
    assert b.get_config() == {"id": "blosc2", "cname": "zstd", "clevel": 5, "shuffle": "shuffle", "threads": 1}
    assert b.label == "blosc2-shuffle-zstd-5" and b.threads == 1
    assert get_codec({"id": "blosc2", "cname": "lz4", "shuffle": "bitshuffle", "threads": None}).label == \
        "blosc2-bitshuffle-lz4-5-allt"
    assert importlib.metadata.version("blosc2") in b.version
    p = get_codec({"id": "pcodec"})
    assert p.get_config() == {"id": "pcodec", "level": 8} and p.label == "pcodec-8" and p.threads == 1
    assert importlib.metadata.version("pcodec") in p.version
    for cid in ("z4ai", "blosc2", "pcodec"):
        get_codec_class(cid).check_installed()


@pytest.mark.parametrize("cfg", [
    {"id": "z4ai", "threads": -1}, {"id": "z4ai", "threads": 1.5}, {"id": "z4ai", "threads": None},
    {"id": "z4ai", "level": 3},
    {"id": "blosc2", "cname": "zip"}, {"id": "blosc2", "clevel": 10}, {"id": "blosc2", "clevel": "5"},
    {"id": "blosc2", "shuffle": "byte"}, {"id": "blosc2", "threads": 0}, {"id": "blosc2", "typesize": 4},
    {"id": "pcodec", "level": 13}, {"id": "pcodec", "level": "8"}, {"id": "pcodec", "threads": 1},
])
def test_new_peers_bad_config(cfg):
    with pytest.raises(ConfigError):
        get_codec(cfg)


@pytest.mark.parametrize("cfg", [Z4AI_CFG, BLOSC2[0], PCODEC_CFG])
def test_new_peers_reject_garbage(cfg):
    with pytest.raises(Exception):
        get_codec(cfg).decode(b"not a frame of this codec at all, definitely not" * 2)


@pytest.mark.parametrize("module,names", [
    ("z4ai", ["z4ai", "z4ai_mt"]), ("blosc2", ["blosc2_shuffle_zstd", "blosc2_bitshuffle_lz4"]), ("pcodec", ["pcodec"]),
])
def test_missing_library_is_dropped_with_a_note(monkeypatch, module, names):
    """A peer whose library does not import is left out of the run with a note, like zipnn and openzl."""
    import sys

    from hydra import compose, initialize_config_dir

    from lmcbench import cli
    from lmcbench.codecs import available_codecs

    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` now raises ImportError
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"codec=[{','.join(names)},zstd]", "pipeline=[raw]"])
    _, _, codecs, _, notes, _ = cli.build(cfg)
    assert list(codecs) == ["zstd"]
    for name in names:
        assert any(f"codec {name} skipped" in n and module in n for n in notes), notes
    assert module not in available_codecs()  # the codec id is the module's name
    with pytest.raises(ConfigError, match=names[0]):
        with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
            cli.build(compose(config_name="config", overrides=[f"codec=[{names[0]},zstd]", "pipeline=[raw]",
                                                               "skip_unavailable_codecs=false"]))
