"""The numcodecs contract for lmc.numcodecs_codec.LMC, checked with numcodecs' own test helpers, and a zarr
array that uses it as its compressor."""
import itertools

import ml_dtypes
import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")

from numcodecs.tests.common import (  # noqa: E402
    check_config,
    check_encode_decode,
    check_err_decode_object_buffer,
    check_err_encode_object_buffer,
)

from lmc.numcodecs_codec import LMC  # noqa: E402
from helpers import make  # noqa: E402

def _finite(a):
    """``a`` with its NaNs replaced: numpy's assert_array_equal (in numcodecs' compare_arrays) finds two NaNs of
    an ml_dtypes type unequal. NaN payloads are checked byte for byte in test_nan_payloads_bit_exact."""
    a = a.copy()
    a[np.isnan(a.astype(np.float32))] = 0
    return a


codecs = [
    LMC(),
    LMC(threads=1),
    LMC(threads=2, chunk_size=4096),
    LMC(chunk_size=64),
]

# numcodecs' usual mix (as in its test_zstd.py / test_blosc.py): integer, float, bool, byte strings, datetimes;
# 1-D, 2-D, 3-D; C and F order -- plus what lmc is for: bf16, fp16, fp32 weights and fp8
rng = np.random.default_rng(42)
arrays = [
    np.arange(1000, dtype="i4"),
    np.linspace(1000, 1001, 1000, dtype="f8"),
    rng.normal(loc=1000, scale=1, size=(100, 10)),
    rng.integers(0, 2, size=1000).astype(bool).reshape(100, 10, order="F"),
    rng.choice([b"a", b"bb", b"ccc"], size=1000).reshape(10, 10, 10),
    rng.integers(0, 2**60, size=1000, dtype="u8").view("M8[ns]"),
    rng.integers(0, 2**60, size=1000, dtype="u8").view("m8[ns]"),
    rng.integers(0, 2**25, size=1000, dtype="u8").view("M8[m]"),
    rng.integers(0, 2**25, size=1000, dtype="u8").view("m8[m]"),
    rng.integers(-(2**63), -(2**63) + 20, size=1000, dtype="i8").view("M8[ns]"),
    rng.integers(-(2**63), -(2**63) + 20, size=1000, dtype="i8").view("m8[m]"),
    np.arange(1000, dtype="u2").reshape(10, 100),
    np.arange(1000, dtype=">i4"),
    np.linspace(-1, 1, 1000, dtype=">f8").reshape(10, 100, order="F"),
    np.arange(24, dtype="c8").reshape(2, 3, 4),
    make(ml_dtypes.bfloat16, 4096).reshape(64, 64),
    make(ml_dtypes.bfloat16, 4096).reshape(64, 64, order="F"),
    _finite(make(ml_dtypes.bfloat16, 1001, kind="random")),
    make(np.float16, 3000).reshape(30, 100),
    make(np.float32, 2500).reshape(50, 50, order="F"),
    make(np.float32, 1000, kind="random").reshape(10, 10, 10),
    _finite(make(ml_dtypes.float8_e4m3fn, 1000, kind="random")),
    np.zeros((3, 0), dtype="f4"),
]


@pytest.mark.parametrize("arr", arrays, ids=lambda a: f"{a.dtype}{a.shape}{'F' if not a.flags.c_contiguous else ''}")
@pytest.mark.parametrize("codec", codecs, ids=repr)
def test_encode_decode(arr, codec):
    check_encode_decode(arr, codec)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32, np.float64, ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float8_e5m2], ids=str)
def test_nan_payloads_bit_exact(dtype):
    x = make(dtype, 5001, kind="random")  # every bit pattern: NaNs with payloads, infinities, subnormals, -0
    for codec in codecs:
        for src in (x, x.tobytes()):
            dec = codec.decode(codec.encode(src))
            assert np.asarray(dec).tobytes() == x.tobytes()


def test_encode_decode_with_dtype():
    # dtype= reads the bytes of a raw buffer (or of an array of another dtype) as that dtype
    x = make(ml_dtypes.bfloat16, 10000)
    for codec in (LMC(dtype="bfloat16"), LMC(dtype="bf16", threads=1)):
        check_encode_decode(x, codec)
        check_encode_decode(x.view(np.uint16), codec)
        dec = codec.decode(codec.encode(x.tobytes()))
        assert dec.dtype == ml_dtypes.bfloat16 and dec.tobytes() == x.tobytes()
    check_encode_decode(make(np.float32, 999), LMC(dtype="float32"))
    with pytest.raises(ValueError, match="whole number"):
        LMC(dtype="float32").encode(b"12345")


def test_typed_coding_is_used():
    # bf16 weights coded by dtype beat the same bytes coded as bytes
    x = make(ml_dtypes.bfloat16, 1 << 16)
    typed, raw = len(LMC().encode(x)), len(LMC().encode(x.tobytes()))
    assert typed < raw and typed == len(LMC(dtype="bfloat16").encode(x.tobytes()))


def test_c_order_shape_round_trips():
    x = make(np.float32, 600).reshape(20, 30)
    dec = LMC().decode(LMC().encode(x))
    assert dec.dtype == x.dtype and dec.shape == x.shape and dec.tobytes() == x.tobytes()
    # a Fortran-ordered array comes back as its flat memory (numcodecs codecs are byte-faithful)
    f = np.asfortranarray(x)
    assert LMC().decode(LMC().encode(f)).tobytes() == f.tobytes(order="A")


@pytest.mark.parametrize("codec", codecs + [LMC(dtype="bfloat16", chunk_size=4096, threads=1),
                                            LMC(threads=1, format_version=4)], ids=repr)
def test_config(codec):
    check_config(codec)
    cfg = codec.get_config()
    assert cfg["id"] == "lmc"
    assert LMC.from_config(cfg) == codec and LMC.from_config(cfg).get_config() == cfg
    c3 = numcodecs.get_codec(cfg)
    assert isinstance(c3, LMC) and c3.get_config() == cfg


@pytest.mark.parametrize("stmt", [
    "LMC(dtype=None, chunk_size=None, threads=None)",
    "LMC(dtype='bfloat16', chunk_size=4096, threads=1)",
    "LMC(dtype='float32', chunk_size=None, threads=2)",
    "LMC(dtype=None, chunk_size=None, threads=1, format_version=4)",
])
def test_repr(stmt):
    codec = eval(stmt, {"LMC": LMC})
    assert repr(codec) == stmt
    assert eval(repr(codec), {"LMC": LMC}) == codec


def test_format_version_for_older_readers():
    """format_version=4 writes what lmc 0.3.2/0.3.3 read (the same payloads, their checksums); the default is
    lmc's newest; anything else is refused."""
    x = make(np.dtype("f4"), 5000)
    import lmc
    assert lmc.info(LMC(threads=1, format_version=4).encode(x))["version"] == 4
    assert lmc.info(LMC(threads=1).encode(x))["version"] == 9
    assert LMC().decode(LMC(format_version=4).encode(x)).tobytes() == x.tobytes()
    for bad in (11, 0, True, "4"):
        with pytest.raises(ValueError, match="format_version"):
            LMC(format_version=bad)


def test_err_decode_object_buffer():
    check_err_decode_object_buffer(LMC())
    enc = LMC().encode(make(np.float32, 10))
    with pytest.raises(TypeError):
        LMC().decode(enc, out=np.empty(10, dtype=object))
    with pytest.raises(TypeError):
        LMC().decode(np.array([b"x"] * 10, dtype=object))


def test_err_encode_object_buffer():
    check_err_encode_object_buffer(LMC())
    with pytest.raises(TypeError):
        LMC(dtype="bfloat16").encode(np.array([1, "a"], dtype=object))


def test_decode_into_out():
    x = make(ml_dtypes.bfloat16, 10000)
    enc = LMC().encode(x)
    out = np.empty_like(x)
    assert LMC().decode(enc, out=out) is out and out.tobytes() == x.tobytes()
    ba = bytearray(x.nbytes)
    LMC().decode(enc, out=ba)
    assert bytes(ba) == x.tobytes()
    with pytest.raises(ValueError):
        LMC().decode(enc, out=np.empty(10, ml_dtypes.bfloat16))


def test_encode_leaves_input_alone():
    for x in (make(ml_dtypes.bfloat16, 5000), np.arange(1000, dtype=">f4"), make(np.float32, 900).reshape(30, 30).T):
        before = x.tobytes(order="A")
        x.flags.writeable = False
        LMC().encode(x)
        assert x.tobytes(order="A") == before


def test_non_contiguous_refused():
    with pytest.raises(ValueError, match="contiguous"):
        LMC().encode(np.arange(100, dtype="f4")[::2])


# ------------------------------------------------------------------------------------------------------------
@pytest.fixture()
def zarr_mod():
    z = pytest.importorskip("zarr", minversion="3.1")  # zarr 3 (Python >= 3.11); its create_array API
    # lmc's entry point registers it when lmc is installed; from a source checkout register it here
    numcodecs.register_codec(LMC)
    return z


@pytest.mark.parametrize("dtype,order", list(itertools.product(["f4", "f2", "i4"], ["C", "F"])))
def test_zarr_v2_array_with_lmc_compressor(zarr_mod, tmp_path, dtype, order):
    """zarr 3 writes zarr-format-2 arrays with any numcodecs codec as their compressor: write, reopen, compare."""
    z = zarr_mod
    x = make(np.dtype(dtype), 100 * 70).reshape(100, 70)
    path = str(tmp_path / "a.zarr")
    a = z.create_array(path, shape=x.shape, dtype=x.dtype, chunks=(32, 32), compressors=LMC(threads=1),
                       zarr_format=2, order=order)
    a[:] = x
    b = z.open_array(path, mode="r")
    assert b[:].dtype == x.dtype and b[:].tobytes() == x.tobytes()
    assert b.metadata.compressor == LMC(threads=1)
    assert b[10:40, 5:9].tobytes() == np.ascontiguousarray(x[10:40, 5:9]).tobytes()


def test_zarr_bf16_as_uint16(zarr_mod, tmp_path):
    """zarr has no bfloat16: store its bits as uint16 with LMC(dtype='bfloat16') so lmc codes them as bf16."""
    z = zarr_mod
    x = make(ml_dtypes.bfloat16, 256 * 256).reshape(256, 256)
    path = str(tmp_path / "w.zarr")
    a = z.create_array(path, shape=x.shape, dtype="u2", chunks=(128, 128),
                       compressors=LMC(dtype="bfloat16", threads=1), zarr_format=2)
    a[:] = x.view(np.uint16)
    b = z.open_array(path, mode="r")
    assert b[:].view(ml_dtypes.bfloat16).tobytes() == x.tobytes()
    stored = sum(len(v) for k, v in _chunk_files(tmp_path / "w.zarr"))
    assert stored < 0.8 * x.nbytes  # coded as bf16 (about 1.5x), not as bytes


def _chunk_files(root):
    for p in root.rglob("*"):
        if p.is_file() and not p.name.startswith(".z"):
            yield p.name, p.read_bytes()
