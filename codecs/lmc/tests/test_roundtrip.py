import ml_dtypes
import numpy as np
import pytest

import lmc
from helpers import DTYPES, make, same_bits

LENGTHS = [0, 1, 7, 1001, 3 * 4096 + 17]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", LENGTHS)
def test_roundtrip(dtype, n):
    x = make(dtype, n, seed=n)
    blob = lmc.compress(x, chunk_size=4096)
    assert isinstance(blob, bytes)
    assert same_bits(lmc.decompress(blob), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_roundtrip_reference(dtype):
    x = make(dtype, 20000, seed=1)
    ref = x.copy()
    ref.view(np.uint8)[::13] ^= 0x5
    blob = lmc.compress(x, reference=ref, chunk_size=4096)
    plain = lmc.compress(x, chunk_size=4096)
    assert len(blob) <= len(plain) + 8
    assert len(blob) < len(plain) / 2  # close reference -> big gain
    assert same_bits(lmc.decompress(blob, reference=ref), x)


def test_reference_unrelated_never_bigger():
    x = make(ml_dtypes.bfloat16, 50000, seed=2)
    ref = make(ml_dtypes.bfloat16, 50000, seed=3, kind="random")
    blob = lmc.compress(x, reference=ref)
    plain = lmc.compress(x)
    assert len(blob) <= len(plain) + 8
    assert same_bits(lmc.decompress(blob, reference=ref), x)


def test_reference_errors():
    x = make(np.float32, 5000)
    ref = make(np.float32, 5000, seed=9)
    blob = lmc.compress(x, reference=ref)
    with pytest.raises(lmc.FormatError, match="reference"):
        lmc.decompress(blob)
    wrong = ref.copy()
    wrong[17] += 1
    # x and ref are unrelated: no chunk uses the reference, and a wrong one gives the exact array
    assert lmc.info(blob)["chunk_modes"] == {"alone": 1}
    assert lmc.decompress(blob, reference=wrong).tobytes() == x.tobytes()
    near = (ref + make(np.float32, 5000, seed=5) * 1e-4).astype(np.float32)   # coded against ref: refused
    with pytest.raises(lmc.FormatError, match="wrong reference"):
        lmc.decompress(lmc.compress(near, reference=ref), reference=wrong)
    with pytest.raises(lmc.FormatError, match="reference"):
        lmc.decompress(blob, reference=ref[:10])
    with pytest.raises(lmc.FormatError, match="reference"):
        lmc.decompress(blob, reference=ref.astype(np.float64))
    with pytest.raises(ValueError):
        lmc.compress(x, reference=ref[:10])


@pytest.mark.parametrize("shape", [(), (0,), (3, 5), (2, 0, 3), (4, 3, 2, 1)])
def test_shapes(shape):
    x = make(np.float16, int(np.prod(shape)), seed=4).reshape(shape)
    y = lmc.decompress(lmc.compress(x))
    assert same_bits(y, x)


def test_special_values():
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45,
                np.finfo(np.float32).tiny / 3, np.finfo(np.float32).max]
    x32 = np.array(specials * 100, np.float32)
    x32.view(np.uint32)[::7] |= 0x7FC00001  # NaN payloads
    with np.errstate(over="ignore"):
        low = [x32.astype(np.float16), x32.astype(ml_dtypes.bfloat16)]
    for x in [x32, *low, x32.astype(np.float64)]:
        assert same_bits(lmc.decompress(lmc.compress(x)), x)
    # all 65536 16-bit patterns
    allbits = np.arange(65536, dtype=np.uint16)
    for dt in (np.float16, ml_dtypes.bfloat16):
        x = allbits.view(dt)
        assert same_bits(lmc.decompress(lmc.compress(x, chunk_size=1000)), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_constant(dtype):
    x = np.full(100000, 3, dtype=dtype)
    blob = lmc.compress(x)
    assert len(blob) < 200
    assert same_bits(lmc.decompress(blob), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("chunk", [1000, 131072])
def test_incompressible_bound(dtype, chunk):
    n = 50001
    x = make(dtype, n, seed=5, kind="random")
    blob = lmc.compress(x, chunk_size=chunk)
    info = lmc.info(blob)
    nch = info["nchunks"]
    header = 4 + 4 + 8 * x.ndim + 8 + 12 * nch + 4
    assert len(blob) <= x.nbytes + header + nch
    assert same_bits(lmc.decompress(blob), x)


def test_input_unchanged_and_noncontiguous():
    x = make(ml_dtypes.bfloat16, 30000).reshape(300, 100)
    ref = make(ml_dtypes.bfloat16, 30000, seed=7).reshape(300, 100)
    xc, rc = x.copy(), ref.copy()
    lmc.compress(x, reference=ref)
    assert same_bits(x, xc) and same_bits(ref, rc)
    xt = x.T  # non-contiguous
    y = lmc.decompress(lmc.compress(xt))
    assert same_bits(y, np.ascontiguousarray(xt))
    assert same_bits(x, xc)
    ro = x.copy()
    ro.flags.writeable = False
    assert same_bits(lmc.decompress(lmc.compress(ro)), ro)


def test_big_endian():
    x = make(np.float32, 1000).astype(">f4")
    y = lmc.decompress(lmc.compress(x))
    assert y.dtype == np.float32 and np.array_equal(y, x)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int8])
def test_threads_identical(dtype):
    x = make(dtype, 200000, seed=11)
    ref = make(dtype, 200000, seed=12)
    for r in (None, ref):
        blobs = [lmc.compress(x, threads=t, reference=r, chunk_size=8192) for t in (1, 2, None)]
        assert blobs[0] == blobs[1] == blobs[2]
        for t in (1, 2):
            assert same_bits(lmc.decompress(blobs[0], threads=t, reference=r), x)


def test_bytes_input():
    x = make(ml_dtypes.bfloat16, 999)
    for b in (x.tobytes(), bytearray(x.tobytes()), memoryview(x.tobytes())):
        blob = lmc.compress(b, dtype="bfloat16")
        assert blob == lmc.compress(x)
        assert same_bits(lmc.decompress(blob), x)
    with pytest.raises(TypeError):
        lmc.compress(x.tobytes())
    with pytest.raises(ValueError):
        lmc.compress(b"abc", dtype=np.float32)


def test_torch_input():
    torch = pytest.importorskip("torch")
    t = torch.randn(1000, 3) * 0.02
    for tt in (t, t.to(torch.bfloat16), t.to(torch.float16), t[:, 1]):
        before = tt.clone()
        r = tt * 0
        y = lmc.decompress(lmc.compress(tt, reference=r), reference=r)
        assert y.shape == tuple(tt.shape)
        if tt.dtype == torch.bfloat16:
            assert y.dtype == ml_dtypes.bfloat16
            assert np.array_equal(y.view(np.int16), tt.contiguous().view(torch.int16).numpy())
        else:
            assert np.array_equal(y, tt.numpy())
        assert torch.equal(tt, before)


def test_out_param():
    x = make(np.float32, 5000).reshape(50, 100)
    blob = lmc.compress(x)
    out = np.empty((50, 100), np.float32)
    y = lmc.decompress(blob, out=out)
    assert y is out and same_bits(out, x)
    flat = np.empty(5000, np.float32)
    y = lmc.decompress(blob, out=flat)
    assert y.shape == (50, 100) and same_bits(flat.reshape(50, 100), x)
    for bad in (np.empty(5000, np.float64), np.empty(4999, np.float32),
                np.empty((100, 100), np.float32)[:, ::2], [0.0] * 5000):
        with pytest.raises(ValueError):
            lmc.decompress(blob, out=bad)
    ro = np.empty(5000, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        lmc.decompress(blob, out=ro)


def test_bad_args():
    with pytest.raises(TypeError):
        lmc.compress(np.zeros(3, np.complex128))
    with pytest.raises(TypeError):
        lmc.compress(np.zeros(3, np.float32), level=3)
    with pytest.raises(ValueError):
        lmc.compress(np.zeros(3, np.float32), chunk_size=0)
    with pytest.raises(ValueError):
        lmc.compress(np.zeros(3, np.float32), threads=0)
    with pytest.raises(lmc.FormatError):
        lmc.decompress(b"")
    with pytest.raises(lmc.FormatError, match="magic"):
        lmc.decompress(b"XXXX" + bytes(100))
    assert issubclass(lmc.FormatError, ValueError)
    import os
    import re
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")) as f:
        assert lmc.__version__ == re.search(r'^version = "(.+)"$', f.read(), re.M).group(1)  # one version, said twice


# ---------------------------------------------------------------------------
# format v2: the previous checkpoint as context
# ---------------------------------------------------------------------------
from make_vectors import train_pair  # noqa: E402

FLOATS = [np.float32, np.float16, ml_dtypes.bfloat16]


def _edge_refs(x):
    """Reference edge cases for x: (name, ref)."""
    rng = np.random.default_rng(0)
    n = x.size
    u = x.view(np.uint16 if x.itemsize == 2 else np.uint32)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    with np.errstate(over="ignore"):
        spx = sp.astype(x.dtype)
    tiny = x.copy()
    tiny.view(u.dtype)[:] = rng.integers(0, 4, n).astype(u.dtype)  # denormals / zeros
    neg = -x  # every sign flipped: large monotone moves across zero
    yield "same", x.copy()
    yield "random", rng.integers(0, 256, x.nbytes, dtype=np.uint8).view(x.dtype)
    yield "specials", np.resize(spx, n)
    yield "denormals", tiny
    yield "negated", neg
    yield "zeros", np.zeros_like(x)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_reference_edge_cases(dtype):
    x, r = train_pair(dtype, 20000, 5)
    with np.errstate(over="ignore"):
        xs = x.copy()
        xs[::11] = np.array(np.nan, np.float32).astype(dtype)
        xs[1::13] = np.array(-np.inf, np.float32).astype(dtype)
        xs[2::17] = np.array(-0.0, np.float32).astype(dtype)
        xs.view(np.uint16 if xs.itemsize == 2 else np.uint32)[3::19] = 1  # denormal
    plain = {id(v): lmc.compress(v, chunk_size=4096) for v in (x, xs)}
    for name, ref in [("train", r), *_edge_refs(x)]:
        for v in (x, xs):
            blob = lmc.compress(v, reference=ref, chunk_size=4096)
            assert same_bits(lmc.decompress(blob, reference=ref), v), name
            assert len(blob) <= len(plain[id(v)]) + 8, name
    # a close previous step: big gain over coding alone and over XOR only
    assert len(lmc.compress(x, reference=r)) * 2 < len(plain[id(x)])


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_temporal_all_patterns(dtype):
    """Every 16-bit pattern against shifted/shuffled references; fp32 random
    patterns against nearby and random ones."""
    rng = np.random.default_rng(1)
    if np.dtype(dtype).itemsize == 2:
        u = np.arange(65536, dtype=np.uint16)
        refs = [np.roll(u, 1), u ^ 0x8000, rng.permutation(u), u + np.uint16(3)]
    else:
        u = rng.integers(0, 2**32, 100000, dtype=np.uint64).astype(np.uint32)
        refs = [u ^ 1, u ^ 0x80000000, rng.permutation(u), u + np.uint32(1000)]
    x = u.view(dtype)
    for r in refs:
        ref = r.view(dtype)
        blob = lmc.compress(x, reference=ref, chunk_size=5000)
        assert same_bits(lmc.decompress(blob, reference=ref), x)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_temporal_mode_used_and_smaller(dtype):
    x, r = train_pair(dtype, 100000, 9)
    blob = lmc.compress(x, reference=r, format_version=3)  # (the oldest version its modes need)
    assert lmc.info(blob)["version"] == 2
    # the v0.1 choice (XOR only) is what the v1 mode set can do; v2 beats it clearly
    xr = x.view(np.uint8) ^ r.view(np.uint8)
    assert len(blob) < len(lmc.compress(xr.view(x.dtype)))


def test_v1_written_when_no_v2_mode_needed():
    x = make(ml_dtypes.bfloat16, 10000)
    assert lmc.info(lmc.compress(x, format_version=3))["version"] == 1
    assert lmc.info(lmc.compress(x, reference=x, format_version=3))["version"] == 1  # XOR of equal: constant
    assert lmc.info(lmc.compress(x))["version"] == 9  # the default: word checksums, always version 9
    assert lmc.info(lmc.compress(x, reference=x))["chunk_modes"] == {"xor": 1}


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_format_version_1(dtype):
    """format_version=1: only the version-1 modes (what lmc 0.1 decodes), never smaller than version 2."""
    x, r = train_pair(dtype, 100000, 11)
    for ref in (None, r):
        v1 = lmc.compress(x, reference=ref, format_version=1)
        assert lmc.info(v1)["version"] == 1
        assert same_bits(lmc.decompress(v1, reference=ref), x)
        assert len(lmc.compress(x, reference=ref)) <= len(v1)
    for bad in (0, 11, True, "1", None):
        with pytest.raises(ValueError, match="format_version"):
            lmc.compress(x, format_version=bad)


# ---------------------------------------------------------------------------
# format v3: the predicted-exponent chunk mode (alone, float layouts)
# ---------------------------------------------------------------------------
from make_vectors import second_moment  # noqa: E402
import pyref  # noqa: E402
from test_corruption import _refix_crc  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
def test_predicted_exponent_smaller_on_second_moments(dtype):
    """A second-moment-like matrix (row x column scale): version 3, smaller than version 2 by more than the
    mode's margin, bit-exact through lmc and the Python oracle; format_version=2 never writes version 3."""
    x = second_moment(np.float32, 96, 96, 1, steps=40)
    x = (x * 1e5).astype(dtype) if dtype == np.float16 else x.astype(dtype)
    b3 = lmc.compress(x, chunk_size=4096, format_version=3)
    b2 = lmc.compress(x, chunk_size=4096, format_version=2)
    assert lmc.info(b3)["version"] == 3 and lmc.info(b2)["version"] <= 2
    assert len(b3) < len(b2) * (1 - 1 / 64)
    assert same_bits(lmc.decompress(b3), x)
    out, cmodes, _ = pyref.decode(b3)
    assert out == x.tobytes() and 4 in cmodes


@pytest.mark.parametrize("shape", [(5000,), (5000, 1), (1, 5000), (2, 2500), (50, 100), (3, 4, 417), (7,), (2,)])
@pytest.mark.parametrize("chunk", [None, 1, 2, 97, 1000])
def test_predicted_exponent_row_lengths(shape, chunk):
    """Every row length against every chunk size (row longer than a chunk, of 1, a chunk of 1 or 2 elements):
    bit-exact through lmc and the oracle, and never larger than version 2."""
    rng = np.random.default_rng(len(shape) * 100 + (chunk or 0))
    n = int(np.prod(shape))
    walk = np.exp(np.cumsum(rng.standard_normal(n)) * 0.2) * 1e-3
    x = walk.reshape(shape).astype(ml_dtypes.bfloat16)
    b3 = lmc.compress(x, chunk_size=chunk)
    assert same_bits(lmc.decompress(b3), x)
    assert len(b3) <= len(lmc.compress(x, chunk_size=chunk, format_version=2))
    if n <= 5000 and (chunk or 2) > 1:
        assert pyref.decode(b3)[0] == x.tobytes()


def _pred_blob():
    x = second_moment(ml_dtypes.bfloat16, 40, 96, 3)
    blob = bytearray(lmc.compress(x, chunk_size=len(x.reshape(-1)), format_version=3))
    assert blob[4] == 3
    return x, blob


def _chunk_start(blob):
    ndim = blob[7]
    return 8 + 8 * ndim + 8 + 12 * 1 + 4  # one chunk, no reference


def test_predicted_exponent_refused_where_invalid():
    x, blob = _pred_blob()
    c0 = _chunk_start(blob)
    assert blob[c0] == 4
    # a version-2 blob may not hold the mode
    b = bytearray(blob)
    b[4] = 2
    with pytest.raises(lmc.FormatError, match="version"):
        lmc.decompress(bytes(_refix_crc(b)))
    # row length 0
    b = bytearray(blob)
    b[c0 + 1:c0 + 5] = bytes(4)
    with pytest.raises(lmc.FormatError, match="row length"):
        lmc.decompress(bytes(b))
    # a truncated chunk head
    b = bytearray(blob[:c0 + 3])
    b[8 + 8 * b[7] + 8:8 + 8 * b[7] + 12] = (3).to_bytes(4, "little")
    with pytest.raises(lmc.FormatError):
        lmc.decompress(bytes(_refix_crc(b)))
    # another row length decodes to other exponents: the checksum refuses it
    b = bytearray(blob)
    b[c0 + 1] ^= 1
    with pytest.raises(lmc.FormatError, match="checksum"):
        lmc.decompress(bytes(b))


def test_predicted_exponent_every_stream_constant_refused():
    """A mode-4 chunk whose every stream is constant is invalid (its payload could not bound its cost): a
    forged one (row length 1, residual 0, mantissa 0) is refused by the structural pre-pass."""
    n = 1000
    head = bytearray(b"LMC1" + bytes([3, 3, 0, 1]) + n.to_bytes(8, "little") + n.to_bytes(4, "little")
                     + (1).to_bytes(4, "little"))
    payload = bytes([4]) + (1).to_bytes(4, "little") + bytes([1]) + (1).to_bytes(4, "little") + bytes([0x3F]) \
        + bytes([1]) + (1).to_bytes(4, "little") + bytes([0])
    head += len(payload).to_bytes(4, "little") + bytes(8)
    import zlib
    head += zlib.crc32(bytes(head)).to_bytes(4, "little")
    with pytest.raises(lmc.FormatError, match="constant"):
        lmc.decompress(bytes(head + payload))
    with pytest.raises(ValueError):
        pyref.decode(bytes(head + payload))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=str)
def test_reference_never_larger_than_the_predicted_exponent(dtype):
    """With a reference the alone option includes the predicted exponent: a second moment coded against an
    unrelated reference is at most the 8-byte reference hash larger than coded alone (format 3)."""
    x = second_moment(np.float32, 96, 96, 1, steps=40).astype(dtype)
    unrelated = second_moment(np.float32, 96, 96, 2, steps=40).astype(dtype)
    alone = lmc.compress(x, chunk_size=4096, format_version=3)
    assert lmc.info(alone)["version"] == 3
    with_ref = lmc.compress(x, chunk_size=4096, reference=unrelated)
    assert len(with_ref) <= len(alone) + 8
    assert same_bits(lmc.decompress(with_ref, reference=unrelated), x)
    assert pyref.decode(with_ref, unrelated.tobytes())[0] == x.tobytes()
