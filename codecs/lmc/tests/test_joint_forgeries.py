"""The joint-symbol chunk (format 9, chunk mode 7, bfloat16) against FORMAT.md: chunks written here from the
format text alone (every k, bases that wrap, tiny and partial last blocks, a constant symbol record, in a blob
with a reference) decode in lmc and in the Python oracle (tests/pyref.py) to the same units; and the refusals
FORMAT.md requires of a decoder ("Version 9 adds"), each forged in one thing: lmc must raise FormatError with
the message, and the oracle refuse it too.  Why here and not in the vectors: the encoder never writes most of
these chunks (k = 3 on small chunks, a base other than the smallest exponent, mode 7 beside a reference)."""
import numpy as np
import pytest

import lmc
import pyref
from delta_parts import BF, _record
from fuzz_blobs import Blob


def _weights(n, seed):
    """Weight-like bfloat16 values with every magnitude in [2^-20, 2^-2): 18 exponents, which k = 3 fits."""
    g = np.random.default_rng(seed)
    x = np.clip(np.abs(g.standard_normal(n) * 0.02), 2.0 ** -20, 0.24) * np.where(g.random(n) < 0.5, -1, 1)
    return x.astype(np.float32).astype(BF)


def _fields(x, k):
    """The symbols t_i and raw fields r_i of x (FORMAT.md: t without the base, added by _payload)."""
    u = x.reshape(-1).view(np.uint16).astype(np.int64)
    m = u & 127
    return (u >> 7) & 255, m >> (7 - k), (u >> 15) << (7 - k) | (m & ((1 << (7 - k)) - 1))


def _blocks(r, w):
    """The raw fields r in blocks of 128, 16 * w bytes a block: the 4-bit plane (bytes 0..63, element j in the
    low nibble of byte j and j + 64 in its high nibble), where w >= 6 the 2-bit plane (bytes 64..95: elements
    j, j + 32, j + 64, j + 96 at bits 0-1, 2-3, 4-5, 6-7 of byte 64 + j), where w is odd the 1-bit plane (the
    last 16 bytes: bit w - 1 of element j + 16 m at bit m of byte j)."""
    nb = -(-r.size // 128)
    f = np.zeros(nb * 128, np.int64)
    f[:r.size] = r
    f = f.reshape(nb, 128)
    out = np.zeros((nb, 16 * w), np.int64)
    out[:, :64] = (f[:, :64] & 15) | (f[:, 64:] & 15) << 4
    if w >= 6:
        out[:, 64:96] = sum((f[:, 32 * m:32 * m + 32] >> 4 & 3) << (2 * m) for m in range(4))
    if w % 2:
        out[:, 16 * (w - 1):] = sum((f[:, 16 * m:16 * m + 16] >> (w - 1) & 1) << m for m in range(8))
    return out.astype(np.uint8).tobytes()


def _payload(x, k, base=None, const=False, kbyte=None):
    """The mode-7 chunk of x with this k and base (default the smallest exponent), its symbol record raw (or
    constant where const and every symbol is equal); kbyte: the k byte written, if not k."""
    e, top, r = _fields(x, k)
    base = int(e.min()) if base is None else base
    t = ((e - base) % 256) << k | top
    assert t.max() < 256, "the exponents do not fit this k and base"
    return bytes([7, k if kbyte is None else kbyte, base]) + _record(t, const) + _blocks(r, 8 - k)


def _host(x, r=None):
    """A one-chunk blob of x (lmc's, any mode; against r if given): Blob.pack swaps a payload in and keeps the
    chunk's checksum, which depends on the decoded units only."""
    return Blob(lmc.compress(x, reference=r, chunk_size=x.size))


def _both_decode(blob, x, r=None):
    for threads in (1, 2):
        y = lmc.decompress(blob, reference=r, threads=threads)
        assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()
    out, cmodes, _ = pyref.decode(blob, None if r is None else r.tobytes())
    assert out == x.tobytes() and cmodes == {7}


# ---------------------------------------------------------------------------
# chunks written from FORMAT.md decode
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 127, 128, 129, 1001])
def test_written_from_the_format(n, k):
    x = _weights(n, n + k)
    _both_decode(_host(x).pack([_payload(x, k)]), x)


def _bits(n, seed, elo, ehi, mmax=127):
    """n bfloat16 values of random sign, exponent fields uniform on elo..ehi (both present), mantissas on
    0..mmax."""
    g = np.random.default_rng(seed)
    e = g.integers(elo, ehi + 1, n)
    e[:2] = (elo, ehi)
    return ((g.integers(0, 2, n) << 15) | e << 7 | g.integers(0, mmax + 1, n)).astype(np.uint16).view(BF)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_any_base(k):
    """b is any value, e - b taken mod 256 (FORMAT.md): exponents 1..2^(8 - k) - 8 with the smallest as the base,
    with the lowest base they fit (-7: 249, every e - b wraps) and with 255."""
    x = _bits(700, k, 1, (1 << (8 - k)) - 8)
    for base in (1, 249, 255):
        _both_decode(_host(x).pack([_payload(x, k, base)]), x)


def test_constant_symbol_record():
    """One binade and one top mantissa bit: the symbol record is constant (stream mode 1), the raw fields are
    not: the chunk is not one of equal units (the structural pass's shortcut for constant chunks must not take
    it)."""
    x = _bits(1000, 5, 127, 127, 63)
    p = _payload(x, 1, const=True)
    assert p[3] == 1
    _both_decode(_host(x).pack([p]), x)


def test_in_a_blob_with_a_reference():
    """Mode 7 does not use the reference: in a blob with one (which lmc's encoder never writes it in) it decodes
    to the same units, the reference given."""
    x, r = _weights(1500, 6), _weights(1500, 7)
    b = _host(x, r)
    assert b.refhash is not None
    _both_decode(b.pack([_payload(x, 2)]), x, r)


# ---------------------------------------------------------------------------
# forgeries FORMAT.md requires a decoder to refuse
# ---------------------------------------------------------------------------
N = 1001            # odd, 7 full blocks and 105 fields of an 8th: its fields 105..127 are past n and must be 0


def _flip(p, k, j, bit):
    """The payload p with bit `bit` of field j of its last block flipped, in the plane FORMAT.md puts it: bits 0-3
    in the 4-bit plane, 4-5 (w >= 6) in the 2-bit plane, w - 1 (w odd) in the 1-bit plane."""
    w = 8 - k
    q = bytearray(p)
    last = len(p) - 16 * w
    if bit < 4:
        q[last + j % 64] ^= 1 << (4 * (j // 64) + bit)
    elif w >= 6 and bit < 6:
        q[last + 64 + j % 32] ^= 1 << (2 * (j // 32) + bit - 4)
    else:
        assert w % 2 and bit == w - 1
        q[last + 16 * (w - 1) + j % 16] ^= 1 << (j // 16)
    return bytes(q)


def _planes(k):
    """A bit of each plane of fields of 8 - k bits: the 4-bit plane's lowest and highest, the 2-bit plane's
    highest (w >= 6), the 1-bit plane's (w odd)."""
    w = 8 - k
    return [0, 3] + ([5] if w >= 6 else []) + ([w - 1] if w % 2 else [])


K = "joint-symbol chunk: mantissa bits per symbol outside 1..3"
NEWER = "chunk or stream mode newer than the blob's format version"
LENGTH = "stream or chunk payload length inconsistent with its mode"
FORGERIES = [
    # (name, forge(x, k, Blob, payload) -> blob, lmc's message)
    ("k_0", lambda x, k, b, p: b.pack([_payload(x, k, kbyte=0)]), K),
    ("k_4", lambda x, k, b, p: b.pack([_payload(x, k, kbyte=4)]), K),
    ("k_255", lambda x, k, b, p: b.pack([_payload(x, k, kbyte=255)]), K),
    # another valid k over the same bytes: 16 (8 - k) bytes a block no longer
    ("k_relabelled", lambda x, k, b, p: b.pack([p[:1] + bytes([k % 3 + 1]) + p[2:]]), LENGTH),
    ("fields_byte_short", lambda x, k, b, p: b.pack([p[:-1]]), LENGTH),
    ("fields_byte_long", lambda x, k, b, p: b.pack([p + b"\x00"]), LENGTH),
    ("fields_block_short", lambda x, k, b, p: b.pack([p[:-16 * (8 - k)]]), LENGTH),
    ("fields_block_long", lambda x, k, b, p: b.pack([p + bytes(16 * (8 - k))]), LENGTH),
    # a symbol record of n - 1 symbols (raw), the fields as they were
    ("record_short", lambda x, k, b, p: b.pack([p[:3] + _record(np.frombuffer(p, np.uint8, N - 1, 8)) + p[8 + N:]]),
     LENGTH),
    ("version_8", lambda x, k, b, p: b.pack([p], version=8), NEWER),
    ("version_5", lambda x, k, b, p: b.pack([p], version=5), NEWER),
    ("version_1", lambda x, k, b, p: b.pack([p], version=1), NEWER),
    ("float32", lambda x, k, b, p: b.pack([p], code=1), "invalid chunk flags byte"),
    ("float16", lambda x, k, b, p: b.pack([p], code=2), "invalid chunk flags byte"),
    ("int16", lambda x, k, b, p: b.pack([p], code=7), "invalid chunk flags byte"),
    ("trailing_record", lambda x, k, b, p: b.pack([p + _record(np.zeros(1, np.uint8))]), LENGTH),
] + [(f"cut_{c}", lambda x, k, b, p, c=c: b.pack([p[:c]]), "chunk data truncated") for c in (1, 2, 3, 7)]


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("name, forge, message", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_forgeries_are_refused(k, name, forge, message):
    x = _weights(N, 11)
    b = _host(x)
    p = _payload(x, k)
    _both_decode(b.pack([p]), x)
    with pytest.raises(lmc.FormatError, match="chunk 0: " + message):
        lmc.decompress(forge(x, k, b, p))
    with pytest.raises(ValueError):
        pyref.decode(forge(x, k, b, p))


@pytest.mark.parametrize("k, bit", [(k, bit) for k in (1, 2, 3) for bit in _planes(k)])
def test_fields_past_n_must_be_zero(k, bit):
    """A bit set in a field past n (the first, n mod 128, and the last, 127, of the last block) in each plane is
    refused; in field n - 1, the chunk's last element, it is data: a well-formed chunk of another unit, which the
    chunk checksum catches, in lmc and the oracle alike."""
    x = _weights(N, 11)
    b = _host(x)
    p = _payload(x, k)
    for j in (N % 128, 127):
        blob = b.pack([_flip(p, k, j, bit)])
        with pytest.raises(lmc.FormatError, match="chunk 0: non-zero padding bits"):
            lmc.decompress(blob)
        with pytest.raises(ValueError, match="past n"):
            pyref.decode(blob)
    blob = b.pack([_flip(p, k, N % 128 - 1, bit)])
    with pytest.raises(lmc.FormatError, match="chunk 0: chunk checksum mismatch"):
        lmc.decompress(blob)
    with pytest.raises(ValueError, match="checksum"):
        pyref.decode(blob)
