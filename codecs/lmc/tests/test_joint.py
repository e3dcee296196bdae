"""The joint-symbol chunk mode (format 9, chunk mode 7, bfloat16): round trips through lmc, when the encoder
takes the mode (and which k) and when it must not, the encoder's chunks read back with a decoder written here
from FORMAT.md, and the refusals FORMAT.md requires of a decoder ("Decoder obligations": the structure-aware
fuzzer forges the mode too, fuzz_modes._joint_mutation).

The chunks forged below are the encoder's (k = 1) and ones written here from FORMAT.md (k = 2 and 3, the
symbols in a raw stream record), so that every layout of the raw fields (7, 6 and 5 bits: the 4-, 2- and
1-bit planes) is forged, whatever k the encoder happens to choose.  A chunk payload swapped in by Blob.pack
keeps the chunk's checksum, which depends on the decoded units only."""
import struct

import ml_dtypes
import numba
import numpy as np
import pytest

import lmc
import pyref
from lmc.kernels import joint
from lmc.kernels.base import _fold_w, checksum_units
from lmc.kernels.jmerge import merge_blocks
from lmc.kernels.simd import SIMD
from fuzz_blobs import Blob, tied

BF = ml_dtypes.bfloat16
SLOW = numba.config.DISABLE_JIT     # the pure-Python (checked) build: the largest arrays once only


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def _weights(n, seed=0, scale=0.02):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32).astype(BF)


def _units(x):
    return np.ascontiguousarray(x).reshape(-1).view(np.uint16).astype(np.int64)


# ---------------------------------------------------------------------------
# the chunk, from FORMAT.md
# ---------------------------------------------------------------------------
def _pack(f, k):
    """Raw fields f (a whole number of blocks of 128, w = 8 - k bits each) in FORMAT.md's block layout: the
    4-bit plane (64 bytes: f_j and f_(j+64)), where w >= 6 the 2-bit plane (32 bytes: bits 4-5 of f_j,
    f_(j+32), f_(j+64), f_(j+96)), where w is odd the 1-bit plane (16 bytes: bit w - 1 of f_(j+16m) at bit m)."""
    w = 8 - k
    f = np.asarray(f, np.int64)
    out = []
    for g in range(0, f.size, 128):
        blk = f[g:g + 128]
        parts = [(blk[:64] & 15) | (blk[64:] & 15) << 4]
        if w >= 6:
            t = (blk >> 4) & 3
            parts.append(t[:32] | t[32:64] << 2 | t[64:96] << 4 | t[96:] << 6)
        if w & 1:
            o = (blk >> (w - 1)) & 1
            parts.append(sum(o[16 * m:16 * m + 16] << m for m in range(8)))
        out.append(np.concatenate(parts).astype(np.uint8).tobytes())
    return b"".join(out)


def _unpack(area, k):
    """The fields of the raw-field area (the inverse of _pack)."""
    w = 8 - k
    a = np.frombuffer(bytes(area), np.uint8).astype(np.int64).reshape(-1, 16 * w)
    f = np.concatenate([a[:, :64] & 15, a[:, :64] >> 4], axis=1)
    if w >= 6:
        t = a[:, 64:96]
        f |= np.concatenate([t & 3, (t >> 2) & 3, (t >> 4) & 3, t >> 6], axis=1) << 4
    if w & 1:
        o = a[:, 16 * (w - 1):]
        f |= np.concatenate([(o >> m) & 1 for m in range(8)], axis=1) << (w - 1)
    return f.reshape(-1)


def _fields(u, k, b):
    """(symbols t, raw fields r) of the units u under k and base b."""
    e = (u >> 7) & 255
    m = u & 127
    return ((e - b) % 256) << k | m >> (7 - k), (u >> 15) << (7 - k) | m % (1 << (7 - k))


def _payload(u, k, b):
    """A mode-7 chunk of the units u from FORMAT.md, its symbols in a raw stream record."""
    t, r = _fields(u, k, b)
    assert t.max() < 256
    fields = np.zeros(-(-u.size // 128) * 128, np.int64)
    fields[:u.size] = r
    return (bytes([7, k, b]) + bytes([0]) + struct.pack("<I", u.size) + t.astype(np.uint8).tobytes()
            + _pack(fields, k))


def _parse(p, n):
    """The parts of a mode-7 chunk payload of n elements: k, b, the symbol record's end, the symbols (the
    oracle's stream decoder) and the raw fields."""
    k, b = p[1], p[2]
    t, q = pyref.stream_record(bytes(p), 3, len(p), n, 9, set())
    assert len(p) - q == 16 * (8 - k) * -(-n // 128)      # the area: exactly its blocks
    return dict(k=k, b=b, rec_end=q, t=np.array(t, np.int64), f=_unpack(p[q:], k))


def _spec_decode(p, n):
    """The units of a mode-7 chunk as FORMAT.md decodes them (fields past n must be 0)."""
    d = _parse(p, n)
    k, t, f = d["k"], d["t"], d["f"]
    assert not f[n:].any()
    e = (d["b"] + (t >> k)) % 256
    return (f[:n] >> (7 - k)) << 15 | e << 7 | (t % (1 << k)) << (7 - k) | f[:n] % (1 << (7 - k))


def _chunks(blob):
    """[(mode, k or None)] per chunk."""
    return [(p[0], p[1] if p[0] == 7 else None) for p in Blob(blob).payloads]


def _check_blob(x, blob, threads=(1, 2)):
    """lmc decodes the blob to x (also into an out= array), and each of its mode-7 chunks is as FORMAT.md
    says: its units, b the chunk's smallest exponent (the encoder's choice), k in 1..3."""
    for th in threads:
        y = lmc.decompress(blob, threads=th)
        assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == np.ascontiguousarray(x).tobytes()
    out = np.full(x.shape, 7, x.dtype)      # (decode into the caller's array)
    assert lmc.decompress(blob, out=out) is out and out.tobytes() == y.tobytes()
    b = Blob(blob)
    u = _units(x)
    for c, p in enumerate(b.payloads):
        if p[0] == 7:
            n = b.n_of(c)
            uc = u[c * b.chunk:c * b.chunk + n]
            assert (_spec_decode(p, n) == uc).all()
            assert p[1] in (1, 2, 3) and p[2] == ((uc >> 7) & 255).min()
    names = lmc.info(blob)["chunk_modes"]
    assert names.get("joint-symbol", 0) == sum(p[0] == 7 for p in b.payloads)


# ---------------------------------------------------------------------------
# round trips, and when the encoder takes the mode
# ---------------------------------------------------------------------------
SIZES = [1024, 1025, 4095, 4097, 131071, 131072, 131073]


@pytest.mark.parametrize("n", SIZES)
def test_round_trip_and_mode_7_on_every_chunk_of_1024_or_more(n):
    """One chunk (131073: one of 131072 and one of 1 element): the joint mode on the chunks it is planned for,
    k = 1 (prefer="speed"); the 1-element chunk keeps another mode.  Large arrays are weights (a bell-shaped
    distribution, where the mode saves ~0.5%), small ones tied data (where it saves a bit an element, so
    that it wins over the padding of the last block too)."""
    x = tied(n, seed=n) if n < 8192 else _weights(n, seed=n)
    blob = lmc.compress(x)
    assert lmc.info(blob)["version"] == 9
    b = Blob(blob)
    expect = [(7, 1) if b.n_of(c) >= 1024 else None for c in range(len(b.payloads))]
    got = _chunks(blob)
    assert [g if e else None for g, e in zip(got, expect)] == expect
    assert all(g[0] != 7 for g, e in zip(got, expect) if e is None)
    _check_blob(x, blob)
    v8 = lmc.compress(x, format_version=8)
    assert 7 not in [m for m, _ in _chunks(v8)] and len(blob) < len(v8)


@pytest.mark.parametrize("chunk_size", [1000, 1100, 3000, 4097, 6500])
def test_chunk_sizes_with_a_partial_last_block(chunk_size):
    """Chunks that are no multiple of 128 (the last block of raw fields partly padding): mode 7 exactly on
    the chunks of >= 1024 elements (none at 1000; the last chunk of 200, 2000, 3612 or 500), on 2 threads
    too."""
    x = tied(20000, seed=chunk_size)
    blob = lmc.compress(x, chunk_size=chunk_size)
    b = Blob(blob)
    assert [m for m, _ in _chunks(blob)] == [7 if b.n_of(c) >= 1024 else 0 for c in range(len(b.payloads))]
    _check_blob(x, blob)


@pytest.mark.parametrize("chunk_size", [None, 1024, 4097, 8192])
def test_never_larger_than_format_8(chunk_size):
    """On weights every chunk of a version-9 blob is at most as large as the version-8 blob's, and a chunk
    not in mode 7 is the same bytes (mode 7 is chosen only where it is smaller than mode 0, which the other
    modes are then compared with); the joint mode is never planned for a chunk under 1024 elements."""
    x = _weights(40000 if SLOW else 150001, seed=7)
    for prefer in ("speed", "fast") if SLOW else ("speed", "size", "fast"):
        b9 = Blob(lmc.compress(x, chunk_size=chunk_size, prefer=prefer))
        b8 = Blob(lmc.compress(x, chunk_size=chunk_size, prefer=prefer, format_version=8))
        for c, (p9, p8) in enumerate(zip(b9.payloads, b8.payloads)):
            assert len(p9) <= len(p8)
            assert p9 == p8 or p9[0] == 7
            assert p9[0] != 7 or b9.n_of(c) >= 1024
        if chunk_size in (None, 8192):
            assert any(p[0] == 7 for p in b9.payloads)


def test_prefer_speed_takes_k1_and_size_k_up_to_3():
    """prefer="speed" and "fast" write k = 1 only (its symbols decode faster); prefer="size" the smallest of
    k = 1..3, here k = 2 and 3 (the top two mantissa bits tied to the exponent), and a smaller blob."""
    seen = set()
    for n, p in ((4095, 1.0), (3000, 0.9), (4097, 0.9)):
        x = tied(n, seed=0, kb=2, p=p)
        fast = lmc.compress(x, prefer="speed")
        assert _chunks(fast) == [(7, 1)] and _chunks(lmc.compress(x, prefer="fast")) == [(7, 1)]
        size = lmc.compress(x, prefer="size")
        (mode, k), = _chunks(size)
        assert mode == 7 and k in (2, 3) and len(size) < len(fast)
        seen.add(k)
        _check_blob(x, size, threads=(1,))
    assert seen == {2, 3}
    w = _weights(2 * 8192, seed=3)        # weights: k = 2 where size comes first (at 8192: before mode 5)
    assert _chunks(lmc.compress(w, chunk_size=8192, prefer="size")) == [(7, 2), (7, 2)]


@pytest.mark.parametrize("exps, prefer, expect", [
    ((0, 127), "speed", 1),           # hi - lo = 127: every symbol (e - b) << 1 | m fits a byte
    ((0, 128), "speed", None),        # 128 apart: no k fits, mode 0
    ((0, 128), "size", None),
    ((3, 4, 65, 66), "size", 2),      # 63 apart: k = 2 fits (and is the smaller)
    ((3, 4, 66, 67), "size", 1),      # 64 apart: k = 1 only
    ((0, 255), "speed", None),        # denormals beside inf / NaN
])
def test_exponent_span(exps, prefer, expect):
    """A chunk whose exponents lie 2^(8 - k) or more apart cannot take k (its symbols would not fit a byte);
    one whose lie at most 2^(8 - k) - 1 apart can (the sign/mantissa plane is uniform in each: the span
    alone decides).  Both round-trip."""
    x = tied(4096, seed=sum(exps), exps=exps, kb=2 if expect == 2 else 1)
    blob = lmc.compress(x, prefer=prefer)
    (mode, k), = _chunks(blob)
    if expect is None:      # mode 0 (or the mantissa-context mode, where size comes first)
        assert mode == 0 or (prefer == "size" and mode == 5)
    else:
        assert (mode, k) == (7, expect)
    _check_blob(x, blob, threads=(1,))


def test_zeros_beside_large_values():
    """Zeros (exponent 0) beside values of 2.0 and more (exponents up to 130): no k fits, mode 0, and the
    array round-trips."""
    x = _weights(9000, seed=5, scale=4.0)
    x[::3] = 0
    x[1::7] = -0.0
    assert ((_units(x) >> 7) & 255).max() >= 128
    for prefer in ("speed", "size"):
        blob = lmc.compress(x, chunk_size=4500, prefer=prefer, format_version=9)   # (10 would mask the zeros)
        assert [m for m, _ in _chunks(blob)] == [0, 0]
        _check_blob(x, blob)


def test_special_values():
    """Exponents near 255 (inf and NaNs of several payloads, the largest finite values: b = 251), and near 0
    (denormals, +-0: b = 0): mode 7 with every bit kept."""
    hi = tied(4096, seed=11, exps=(251, 252, 253, 254))
    u = hi.view(np.uint16)
    u[::200] = 0x7F80                             # +inf
    u[1::200] = 0xFF80                            # -inf
    u[2::200] = 0x7FC0 | np.arange(u[2::200].size) % 64    # NaNs with payloads
    u[3::200] = 0xFF81
    lo = tied(4096, seed=12, exps=(0, 1, 2, 3))
    v = lo.view(np.uint16)
    v[::200] = 0x0000                             # +0
    v[1::200] = 0x8000                            # -0
    for x, base in ((hi, 251), (lo, 0)):
        blob = lmc.compress(x)
        assert _chunks(blob) == [(7, 1)] and Blob(blob).payloads[0][2] == base
        _check_blob(x, blob)


def test_non_contiguous_and_torch_input():
    """A strided numpy view, a transposed 2-D array and CPU torch bfloat16 tensors (contiguous or not)."""
    import torch
    big = tied(2 * 5000, seed=21)
    for x in (big[::2], big.reshape(100, 100).T):
        blob = lmc.compress(x)
        assert 7 in [m for m, _ in _chunks(blob)]
        y = lmc.decompress(blob)
        assert y.shape == x.shape and y.tobytes() == np.ascontiguousarray(x).tobytes()
    t = torch.from_numpy(big.view(np.int16).copy()).view(torch.bfloat16)
    for tt in (t, t.reshape(100, 100).t(), t[1::2]):
        blob = lmc.compress(tt)
        assert 7 in [m for m, _ in _chunks(blob)]
        y = lmc.decompress(blob)
        want = tt.contiguous().view(torch.int16).numpy().view(np.uint16)
        assert y.dtype == BF and y.shape == tuple(tt.shape) and (y.view(np.uint16) == want).all()


def test_spec_chunks_decode_for_every_k():
    """Chunks written here from FORMAT.md (raw symbol record) for k = 1, 2, 3 and bases b from the smallest
    exponent down to the lowest that keeps every exponent in reach, and bases above the largest exponent
    (b + (t >> k) wraps modulo 256), decode to the units; in a blob with a reference (where the mode is one
    way of coding a chunk alone) too."""
    xa = tied(3000, seed=31, exps=(100, 110, 120, 130))     # exponents 100..130
    xb = tied(3000, seed=32, exps=(0, 5, 10, 20))           # 0..20: bases near 255 wrap
    cases = [(xa, 1, 100), (xa, 1, 3), (xa, 2, 100), (xa, 2, 67), (xa, 3, 100), (xa, 3, 99),
             (xb, 1, 0), (xb, 1, 149), (xb, 2, 213), (xb, 3, 245), (xb, 3, 255)]
    for x, k, base in cases:
        u = _units(x)
        s = (((u >> 7) & 255) - base) % 256
        assert s.max() < 256 >> k and (s.max() == (256 >> k) - 1 or base in (0, 100, 255))
        blob = Blob(lmc.compress(x)).pack([_payload(u, k, base)])
        assert lmc.decompress(blob).tobytes() == x.tobytes(), (k, base)
    r = _weights(3000, seed=33)
    rb = Blob(lmc.compress(xa, reference=r))
    blob = rb.pack([_payload(_units(xa), 2, 100)])
    assert lmc.decompress(blob, reference=r).tobytes() == xa.tobytes()


@pytest.mark.parametrize("n", [1, 2, 127, 128, 129, 300])
def test_spec_chunks_of_any_length(n):
    """The decoder takes mode 7 for chunks of any length (the encoder plans it from 1024 elements only): one
    element, a block less one, a whole block, a block and one; every chunk of a blob in mode 7 (chunks of n,
    the last one shorter), on 1 and 2 threads."""
    x = tied(4 * n + n // 2 + 1, seed=60 + n)
    u = _units(x)
    b = Blob(lmc.compress(x, chunk_size=n))
    for k in (1, 2, 3):
        pl = [_payload(u[c * n:c * n + b.n_of(c)], k, 120) for c in range(len(b.payloads))]
        for th in (1, 2):
            assert lmc.decompress(b.pack(pl), threads=th).tobytes() == x.tobytes(), (k, th)


@pytest.mark.parametrize("n, prefer, probs, smode", [
    (3000, "size", (.85, .05, .05, .05), 3),      # rANS, 4 states
    (9000, "size", (.97, .01, .01, .01), 3),      # rANS, 32 states (8192 symbols or more)
    (3000, "speed", (.25, .25, .25, .25), 2),     # Huffman
    (3000, "speed", (1, 0, 0, 0), 1),             # constant
])
def test_symbol_record_in_every_stream_mode(n, prefer, probs, smode):
    """The symbols' record may be any stream record (FORMAT.md: "as in mode 0"), though the encoder writes
    Huffman, raw or constant only: the record lmc writes for the symbols as a uint8 array (an alone chunk of
    one stream) spliced into a mode-7 chunk decodes, rANS of 4 and 32 states too."""
    g = np.random.default_rng(n + smode)
    e = g.choice([120, 121, 122, 123], n, p=probs)
    u = g.integers(0, 2, n) << 15 | e << 7 | (0 if smode == 1 else g.integers(0, 128, n))
    x = u.astype(np.uint16).view(BF)
    t, r = _fields(u, 1, 120)
    rec = Blob(lmc.compress(t.astype(np.uint8), prefer=prefer, chunk_size=n)).payloads[0]
    assert rec[0] == 0 and rec[1] == smode and len(rec) == 6 + struct.unpack_from("<I", rec, 2)[0]
    f = np.zeros(-(-n // 128) * 128, np.int64)
    f[:n] = r
    blob = Blob(lmc.compress(x)).pack([bytes([7, 1, 120]) + rec[1:] + _pack(f, 1)])
    assert lmc.decompress(blob).tobytes() == x.tobytes()


# ---------------------------------------------------------------------------
# forgeries FORMAT.md requires a decoder to refuse
# ---------------------------------------------------------------------------
N = 3000          # 23 whole blocks and 56 fields: 72 padding fields in the last block


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["enc_k1", "spec_k2", "spec_k3"])
def case(request):
    """(x, Blob of one chunk, its mode-7 payload): the encoder's chunk (k = 1, a Huffman symbol record) or
    one written from FORMAT.md (k = 2, 3, a raw one); each decodes to x."""
    x = tied(N, seed=41)
    b = Blob(lmc.compress(x))
    p = b.payloads[0]
    assert p[0] == 7 and p[1] == 1 and p[3] == 2   # (the symbol record: Huffman)
    k = request.param
    if k > 1:
        p = _payload(_units(x), k, 120)
        assert lmc.decompress(b.pack([p])).tobytes() == x.tobytes()
    return x, b, bytes(p)


def _set(p, i, v):
    q = bytearray(p)
    q[i] = v & 255
    return bytes(q)


def _len(p, L):
    """The symbol record's u32 length set to L."""
    q = bytearray(p)
    struct.pack_into("<I", q, 4, L & 0xFFFFFFFF)
    return bytes(q)


def _field_flip(p, j, bit):
    """Bit `bit` of field j flipped (set where j is past n: padding), the area re-packed."""
    d = _parse(p, N)
    f = d["f"].copy()
    f[j] ^= 1 << bit
    return p[:d["rec_end"]] + _pack(f, d["k"])


def _rec_len(p):
    return struct.unpack_from("<I", p, 4)[0]


MSG_JOINT = "joint-symbol chunk"
MSG_LEN = "stream or chunk payload length inconsistent"
MSG_TRUNC = "chunk data truncated"
MSG_PAD = "non-zero padding bits"
MSG_CHK = "chunk checksum mismatch"
MSG_FLAGS = "invalid chunk flags byte"
MSG_VERSION = "chunk or stream mode newer than the blob's format version"

FORGERIES = [
    # (name, forge(b, p) -> blob, message: None for any FormatError)
    ("k_0", lambda b, p: b.pack([_set(p, 1, 0)]), MSG_JOINT),
    ("k_4", lambda b, p: b.pack([_set(p, 1, 4)]), MSG_JOINT),
    ("k_255", lambda b, p: b.pack([_set(p, 1, 255)]), MSG_JOINT),
    # another valid k: the area is then of another length
    ("k_other", lambda b, p: b.pack([_set(p, 1, p[1] % 3 + 1)]), MSG_LEN),
    ("b_plus_1", lambda b, p: b.pack([_set(p, 2, p[2] + 1)]), MSG_CHK),
    ("b_minus_1", lambda b, p: b.pack([_set(p, 2, p[2] - 1)]), MSG_CHK),
    ("b_xor_128", lambda b, p: b.pack([_set(p, 2, p[2] ^ 128)]), MSG_CHK),
    ("b_255", lambda b, p: b.pack([_set(p, 2, 255)]), MSG_CHK),     # exponents wrap past 255
    ("area_cut_1", lambda b, p: b.pack([p[:-1]]), MSG_LEN),
    ("area_plus_1", lambda b, p: b.pack([p + b"\x00"]), MSG_LEN),
    ("area_block_less", lambda b, p: b.pack([p[:-16 * (8 - p[1])]]), MSG_LEN),
    ("area_block_more", lambda b, p: b.pack([p + bytes(16 * (8 - p[1]))]), MSG_LEN),
    ("area_empty", lambda b, p: b.pack([p[:3 + 5 + _rec_len(p)]]), MSG_LEN),
    # a bit of a field inside n: valid structure, other units
    ("field_in_n", lambda b, p: b.pack([_field_flip(p, N - 1, 0)]), MSG_CHK),
    ("rec_len_past_end", lambda b, p: b.pack([_len(p, len(p) - 8 + 1)]), MSG_TRUNC),
    ("rec_len_max", lambda b, p: b.pack([_len(p, 0xFFFFFFFF)]), MSG_TRUNC),
    ("rec_len_to_end", lambda b, p: b.pack([_len(p, len(p) - 8)]), None),
    ("rec_len_minus_1", lambda b, p: b.pack([_len(p, _rec_len(p) - 1)]), None),
    ("rec_len_plus_1", lambda b, p: b.pack([_len(p, _rec_len(p) + 1)]), None),
    ("rec_mode_4", lambda b, p: b.pack([_set(p, 3, 4)]), "invalid stream mode"),
    ("rec_mode_255", lambda b, p: b.pack([_set(p, 3, 255)]), "invalid stream mode"),
    # a raw record whose length is not n (the Huffman record read as raw; the raw one shortened by a symbol
    # and the area shifted into it)
    ("rec_raw_len", lambda b, p: b.pack([_len(_set(p, 3, 0), _rec_len(p) - (p[3] == 0))]), MSG_LEN),
    # the symbols as one constant record: valid structure, other units
    ("rec_const", lambda b, p: b.pack([p[:3] + b"\x01" + struct.pack("<I", 1) + b"\x10"
                                       + p[8 + _rec_len(p):]]), MSG_CHK),
    ("head_cut_1", lambda b, p: b.pack([p[:1]]), MSG_TRUNC),
    ("head_cut_2", lambda b, p: b.pack([p[:2]]), MSG_TRUNC),
    ("head_cut_3", lambda b, p: b.pack([p[:3]]), MSG_TRUNC),
    ("head_cut_7", lambda b, p: b.pack([p[:7]]), MSG_TRUNC),
    ("in_v8", lambda b, p: b.pack([p], version=8), MSG_VERSION),
    ("in_v5", lambda b, p: b.pack([p], version=5), MSG_VERSION),
    ("in_v1", lambda b, p: b.pack([p], version=1), MSG_VERSION),
    ("as_f16", lambda b, p: b.pack([p], code=2), MSG_FLAGS),        # 2-byte units, no mode 7
    ("as_int16", lambda b, p: b.pack([p], code=7), MSG_FLAGS),
    ("mode_8", lambda b, p: b.pack([_set(p, 0, 8)]), MSG_FLAGS),
    ("mode_255", lambda b, p: b.pack([_set(p, 0, 255)]), MSG_FLAGS),
]


@pytest.mark.parametrize("name, forge, message", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_forgeries_are_refused(case, name, forge, message):
    """Each forgery raises FormatError (with the message FORMAT.md's rule gives), nothing else, and leaves
    the caller's buffer as it was."""
    x, b, p = case
    blob = forge(b, p)
    buf = bytearray(blob)
    with pytest.raises(lmc.FormatError, match=None if message is None else "chunk 0: " + message):
        lmc.decompress(buf)
    assert bytes(buf) == blob


def test_padding_bits_are_refused(case):
    """A non-zero bit in a field past n (in the last block): each bit of the first, a middle and the last
    padding field, so in each plane of the layout (4-bit, and 2-bit for k <= 2, 1-bit for odd 8 - k)."""
    x, b, p = case
    w = 8 - p[1]
    for j in (N, N + 37, -(-N // 128) * 128 - 1):
        for bit in range(w):
            blob = b.pack([_field_flip(p, j, bit)])
            with pytest.raises(lmc.FormatError, match="chunk 0: " + MSG_PAD):
                lmc.decompress(blob)


def test_mode_7_in_a_float32_blob(case):
    """A mode-7 chunk where the units are 4 bytes (float32: no mode 7) is refused by its mode byte."""
    x, b, p = case
    f32 = Blob(lmc.compress(x.astype(np.float32)))
    with pytest.raises(lmc.FormatError, match="chunk 0: " + MSG_FLAGS):
        lmc.decompress(f32.pack([p] + list(f32.payloads[1:])))


def test_forged_chunk_among_good_ones():
    """Four mode-7 chunks, one forged (a padding bit, k = 0, b changed): refused on 1 and 2 threads, naming
    that chunk; the good blob decodes."""
    x = tied(4 * N, seed=42)
    b = Blob(lmc.compress(x, chunk_size=N))
    assert [m for m, _ in _chunks(b.pack())] == [7] * 4
    for c, forge, message in ((2, lambda p: _field_flip(p, N + 5, 6), MSG_PAD),
                              (3, lambda p: _set(p, 1, 0), MSG_JOINT),
                              (1, lambda p: _set(p, 2, p[2] + 3), MSG_CHK)):
        pl = list(b.payloads)
        pl[c] = forge(pl[c])
        for th in (1, 2):
            with pytest.raises(lmc.FormatError, match=f"chunk {c}: {message}"):
                lmc.decompress(b.pack(pl), threads=th)
    _check_blob(x, b.pack())


def test_decompress_leaves_the_blob_alone(case):
    """decompress reads the caller's buffer and never writes it: bytearray, writable numpy array and
    memoryview, for a good blob and forged ones."""
    x, b, p = case
    forged = [b.pack([_field_flip(p, N + 1, 0)]), b.pack([_set(p, 2, p[2] + 1)]), b.pack([p + b"\x00"]),
              b.pack([_set(p, 1, 0)])]
    for blob in [b.pack([p])] + forged:
        for make in (bytearray, lambda v: np.frombuffer(bytearray(v), np.uint8), lambda v: memoryview(bytearray(v))):
            buf = make(blob)
            if blob in forged:
                with pytest.raises(lmc.FormatError):
                    lmc.decompress(buf)
            else:
                assert lmc.decompress(buf).tobytes() == x.tobytes()
            assert bytes(buf) == blob


def test_never_larger_with_a_reference_where_the_sample_errs():
    """The joint mode decided by its sample is taken the same way with a reference (where mode 0 is counted
    exactly) as without one (where it is not): with an unrelated reference the blob is never larger than alone
    plus its 8-byte reference hash, also where the sample's estimate errs above mode 0's exact size (seeds 0
    and 4 here, 53 bytes larger before the rule was shared)."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal(131072) * 0.02 * np.exp(0.3 * rng.standard_normal(131072))).astype(np.float32)
        x = x.astype(ml_dtypes.bfloat16)
        r = rng.integers(0, 65536, 131072).astype(np.uint16).view(ml_dtypes.bfloat16)
        with_ref = lmc.compress(x, reference=r, chunk_size=16384)
        assert len(with_ref) <= len(lmc.compress(x, chunk_size=16384)) + 8, seed
        assert lmc.decompress(with_ref, reference=r).tobytes() == x.tobytes()


@pytest.mark.skipif(not SIMD, reason="the vector pass runs only where simd.SIMD holds")
@pytest.mark.parametrize("k", [1, 2, 3])
def test_vector_pass_gives_the_three_passes_units(k):
    """kernels.jmerge.merge_blocks (sub-streams, fields and units in one vector pass) against the scalar passes
    (interleave, _unpack, _merge, then the chunk checksum) on symbols of every byte value (a base and symbols past
    255 wrap) and random fields, blocks 1 to 40."""
    rng = np.random.default_rng(k)
    for nb in (1, 2, 7, 40):
        n = 128 * nb
        t = rng.integers(0, 256, n).astype(np.uint8)
        fields = rng.integers(0, 1 << (8 - k), n + 128).astype(np.uint8)
        fields[n:] = 0
        blob = np.zeros(joint.rest_bytes(n, k) + 5, np.uint8)
        end = joint._pack(fields, n, k, blob, 3, blob.size)
        assert end == 3 + joint.rest_bytes(n, k)
        r = ((n + 3) >> 2) + 16
        tmp = np.zeros(4 * r, np.uint8)
        for s in range(4):
            tmp[s * r:s * r + len(t[s::4])] = t[s::4]
        for b in (0, 1, 100, 255):
            want = np.zeros(n, np.uint16)
            joint._merge(t, fields, n, k, b, want)
            got = np.zeros(n + 8, np.uint16)
            acc = np.zeros(2, np.uint64)
            merge_blocks(blob, 3, tmp, r, nb, k, b, got, acc)
            assert np.array_equal(got[:n], want) and not got[n:].any()
            # the chunk checksum's two sums, taken as the units are written
            assert _fold_w(acc[0], acc[1], 3) == checksum_units(want.view(np.uint8), 0, n, 2, 3)
