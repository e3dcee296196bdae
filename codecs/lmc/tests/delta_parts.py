"""Delta chunks (format 6, chunk mode 6) taken apart and written from FORMAT.md, for test_delta.py and
test_delta_forgeries.py: the parts of the chunk of x against r for a cut c and field width q (_parts), a chunk
payload of parts with every stream record raw or constant (_payload), an encoded chunk's parts (_parse), and
what a blob's chunks are (_modes, _heads) and decode to (_round_trip).  A plain module (no tests)."""
import struct

import ml_dtypes
import numpy as np

import lmc
import pyref
from fuzz_blobs import Blob, mono


BF = ml_dtypes.bfloat16
DTS = [BF, np.float16, np.float32]
IDS = ["bf16", "f16", "f32"]
UINT = {2: np.uint16, 4: np.uint32}


def _modes(blob):
    return [p[0] for p in Blob(blob).payloads]


def _heads(blob):
    """(c, q, m) of each chunk of the blob; None for a chunk in another mode."""
    return [(p[1], p[2], struct.unpack_from("<I", p, 3)[0]) if p[0] == 6 else None for p in Blob(blob).payloads]


def _round_trip(x, r, blob):
    """lmc (1 and 2 threads) and the oracle decode the blob to x; returns the oracle's chunk modes."""
    for threads in (1, 2):
        y = lmc.decompress(blob, reference=r, threads=threads)
        assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()
    out, cmodes, _ = pyref.decode(blob, r.tobytes())
    assert out == x.tobytes()
    return cmodes


# ---------------------------------------------------------------------------
# a delta chunk written from FORMAT.md, every stream record raw (or constant)
# ---------------------------------------------------------------------------
def _z(x, r):
    """z_i = zigzag(mono(x_i) - mono(r_i) mod 2^W) (FORMAT.md), as int64."""
    u = x.dtype.itemsize
    W = 8 * u
    d = (mono(x.reshape(-1).view(UINT[u]), W) - mono(r.reshape(-1).view(UINT[u]), W)) & ((1 << W) - 1)
    d = np.where(d >> (W - 1), d - (1 << W), d)       # signed
    return np.where(d < 0, -2 * d - 1, 2 * d)


def _parts(x, r, c, q):
    """The contents of the delta chunk of x against r cut at bit c with field width q: dict(c, q, m, low
    (c // 8 arrays of n bytes), nib (where c % 8 = 4: ceil(n / 2) bytes of two nibbles, else None), packed
    (ceil(n / g) bytes), esc (ceil((W - c) / 8) arrays of m bytes; empty where m = 0))."""
    W = 8 * x.dtype.itemsize
    z = _z(x, r)
    n = z.size
    g = 8 // q
    M = (1 << q) - 1
    h = z >> c
    f = np.minimum(h, M)
    fp = np.zeros(-(-n // g) * g, np.int64)
    fp[:n] = f
    packed = (fp.reshape(-1, g) << (q * np.arange(g))).sum(axis=1).astype(np.uint8)
    nib = None
    if c % 8:
        v = np.zeros(n + n % 2, np.int64)
        v[:n] = (z >> (8 * (c // 8))) & 15
        nib = (v[0::2] | v[1::2] << 4).astype(np.uint8)
    e = h[f == M] - M
    return dict(c=c, q=q, m=int(e.size), low=[((z >> (8 * j)) & 255).astype(np.uint8) for j in range(c // 8)],
                nib=nib, packed=packed,
                esc=[((e >> (8 * t)) & 255).astype(np.uint8) for t in range((W - c + 7) // 8)] if e.size else [])


def _record(sym, const=False):
    sym = np.asarray(sym, np.uint8)
    if const and sym.size and (sym == sym[0]).all():
        return bytes([1]) + struct.pack("<I", 1) + bytes([int(sym[0])])
    return bytes([0]) + struct.pack("<I", sym.size) + sym.tobytes()


def _payload(d, const=False, m=None):
    """The chunk payload of the parts d (m: the u32 written, default d["m"]); const: a constant stream as a
    constant record."""
    streams = d["low"] + ([] if d["nib"] is None else [d["nib"]]) + [d["packed"]] + d["esc"]
    return (bytes([6, d["c"] & 255, d["q"] & 255]) + struct.pack("<I", d["m"] if m is None else m)
            + b"".join(_record(s, const) for s in streams))


def _parse(p, n, unit):
    """The parts of a delta chunk payload (its records decoded by the oracle)."""
    c, q = p[1], p[2]
    (m,) = struct.unpack_from("<I", p, 3)
    nb, nib = c // 8, c % 8 != 0
    pos, out = 7, []
    for count in [n] * nb + [(n + 1) // 2] * nib + [-(-n // (8 // q))] + [m] * ((8 * unit - c + 7) // 8 if m else 0):
        s, pos = pyref.stream_record(p, pos, len(p), count, 6, set())
        out.append(np.array(s, np.uint8))
    assert pos == len(p)
    return dict(c=c, q=q, m=m, low=out[:nb], nib=out[nb] if nib else None, packed=out[nb + nib],
                esc=out[nb + nib + 1:])


def _one_chunk_blob(x, r):
    """A one-chunk prefer="fast" blob of x against r: its Blob (a chunk payload swapped in by Blob.pack keeps
    the chunk's checksum, which depends on the decoded units only)."""
    return Blob(lmc.compress(x, reference=r, chunk_size=x.size, prefer="fast"))


def _with(d, **kw):
    e = dict(d, low=list(d["low"]), esc=[s.copy() for s in d["esc"]], packed=d["packed"].copy())
    e.update(kw)
    return e


def _top(d, x):
    """2^(W - c): h must be below it."""
    return 1 << (8 * x.dtype.itemsize - d["c"])


def _esc_set(d, e):
    """The first escape's value set to e (the escape records re-encoded raw; e below 2^(8 records))."""
    assert e < 1 << (8 * len(d["esc"]))
    esc = [s.copy() for s in d["esc"]]
    for t, s in enumerate(esc):
        s[0] = (e >> (8 * t)) & 255
    return _payload(_with(d, esc=esc))
