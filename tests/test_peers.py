"""The peer codecs (ZipNN, OpenZL): bit-exact round trips, caller buffers untouched, configs, applicability."""

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

# (config, dtypes the codec takes)
ZIPNN_CFG = pytest.param({"id": "zipnn", "threads": 1}, marks=needs_zipnn, id="zipnn")
ZIPNN_MT = pytest.param({"id": "zipnn", "threads": 4}, marks=needs_zipnn, id="zipnn-4t")
OPENZL_CFG = pytest.param({"id": "openzl", "graph": "deconstruct_huffman"}, marks=needs_openzl, id="openzl")
OPENZL_GEN = pytest.param({"id": "openzl", "graph": "generic"}, marks=needs_openzl, id="openzl-generic")
ALL = [ZIPNN_CFG, ZIPNN_MT, OPENZL_CFG, OPENZL_GEN]
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
    codec.check_applicable(arr)
    roundtrip(codec, arr)


@pytest.mark.parametrize("cfg", ALL)
def test_roundtrip_reuses_codec_across_dtypes_and_shapes(cfg):
    codec = get_codec(cfg)
    for i, (dtype, shape) in enumerate([(BF16, (37, 11)), (np.float32, (5, 3, 7)), (BF16, (1001,)),
                                         (np.float16, (2, 300)), (np.float32, (0, 4)), (BF16, (1, 1))]):
        arr = random_bits(int(np.prod(shape)), dtype, seed=i).reshape(shape)
        roundtrip(codec, arr)


@pytest.mark.parametrize("cfg", ALL)
def test_non_contiguous_input(cfg):
    codec = get_codec(cfg)
    arr = random_bits(2000, BF16).reshape(40, 50)[:, ::2]
    blob = codec.encode(arr)
    assert codec.decode(blob).tobytes() == np.ascontiguousarray(arr).tobytes()


@pytest.mark.parametrize("cfg", ALL)
def test_caller_bytes_untouched_on_gaussian(cfg):
    # the data ZipNN actually reorders in place (it leaves some random inputs alone): check on real-looking data
    codec = get_codec(cfg)
    for arr in (gaussian_bf16(1 << 16), (np.random.default_rng(1).standard_normal(1 << 16) * 0.02).astype(np.float32)):
        snapshot = arr.tobytes()
        roundtrip(codec, arr)
        assert arr.tobytes() == snapshot


@pytest.mark.parametrize("cfg", [ZIPNN_CFG, OPENZL_CFG])
def test_ratio_on_gaussian_bf16(cfg):
    codec = get_codec(cfg)
    arr = gaussian_bf16()
    blob = roundtrip(codec, arr)
    ratio = arr.nbytes / len(blob)
    assert ratio > 1.3, f"{codec.label}: ratio {ratio:.3f}"


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
    arr = random_bits(1001, BF16)
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

@pytest.mark.parametrize("cfg", [ZIPNN_CFG, ZIPNN_MT, OPENZL_CFG])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.float64, ">f4", ">f2"],
                         ids=str)
def test_not_applicable(cfg, dtype):
    codec = get_codec(cfg)
    arr = np.zeros(16, dtype)
    with pytest.raises(NotApplicable, match=codec.codec_id):
        codec.check_applicable(arr)
    with pytest.raises(NotApplicable):
        codec.encode(arr)


@pytest.mark.parametrize("cfg", [ZIPNN_CFG, OPENZL_CFG])
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
