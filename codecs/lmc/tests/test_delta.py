"""The delta chunk mode (format 6, chunk mode 6: float32 / float16 / bfloat16 coded against a reference in byte
streams; prefer="fast" takes it, the default where it is smallest): round trips through lmc and the Python
oracle, tiny and odd chunks (the unused fields of the last packed byte), special values, the cut c and field
width q the encoder picks and escapes, every (c, q) a decoder must read (chunks written here from FORMAT.md),
version handling, the caller's buffers, and the blob's size against the other codings (the refusals FORMAT.md
requires of a decoder: test_delta_forgeries.py)."""
import struct

import numpy as np
import pytest

import lmc
import pyref
from delta_parts import (BF, DTS, IDS, UINT, _esc_set, _heads, _modes, _one_chunk_blob, _parse, _parts, _payload,
                         _round_trip, _top, _with, _z)
from fuzz_blobs import Blob, delta_pair, stepped
from lmc import api
from lmc.kernels.base import ck_mode
from make_vectors import train_pair


# ---------------------------------------------------------------------------
# what the encoder writes
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dt", DTS, ids=IDS)
def test_fast_takes_it_and_round_trips(dt):
    # every element moved a few ulps, 1% far (escapes): five chunks of odd length, the last shorter
    x, r = delta_pair(dt, 4 * 1501 + 1001, 16, spread=6, far=0.01)
    blob = lmc.compress(x, reference=r, chunk_size=1501, prefer="fast")
    assert _modes(blob) == [6] * 5
    info = lmc.info(blob)
    assert info["version"] == 9 and info["has_reference"] and info["chunk_modes"] == {"delta": 5}
    assert all(m > 0 for _, _, m in _heads(blob))        # its far moves are escapes
    assert _round_trip(x, r, blob) == {6}
    # the default takes it where it is smallest (a temporal chunk elsewhere); never the temporal mode in "fast"
    speed = lmc.compress(x, reference=r, chunk_size=1501)
    assert set(_modes(speed)) <= {0, 1, 3, 6} and _round_trip(x, r, speed) <= {0, 1, 3, 6}
    assert len(speed) <= len(blob)


@pytest.mark.parametrize("dt", DTS, ids=IDS)
def test_tiny_and_odd_chunks(dt):
    """Chunks of 1 to 13 elements (the last one of a blob shorter): a delta chunk or a stored one (a delta
    chunk of a few elements can be larger than the units), the delta chunk once n >= 9; steps of +-1 take
    2-bit fields and steps up to +-6 4-bit fields, where n not a multiple of 4 (2) leaves unused fields in
    the last packed byte."""
    seen = set()
    for spread, q in ((1, 2), (6, 4)):
        for chunk in (1, 2, 3, 5, 7, 9, 10, 11, 13):
            total = 3 * chunk + (chunk + 1) // 2
            x, r = delta_pair(dt, total, 100 + chunk, spread=spread)
            blob = lmc.compress(x, reference=r, chunk_size=chunk, prefer="fast")
            b = Blob(blob)
            for c, hd in enumerate(_heads(blob)):
                n = b.n_of(c)
                if hd is None:
                    assert b.payloads[c][0] == 2 and n < 9, (chunk, c, b.payloads[c][0])
                    continue
                if n >= 9:
                    assert hd == (0, q, 0), (chunk, c, hd)
                seen.add((hd[1], n % (8 // hd[1])))
            assert _round_trip(x, r, blob) <= {2, 6}
    assert {(2, 1), (2, 2), (2, 3), (4, 1)} <= seen, seen


# units of special values: +-0, +-inf, NaNs (quiet, signalling, negative, all ones, the largest payload), the
# smallest subnormals of both signs, the largest subnormal, the smallest normal, +-max finite
SPECIALS = {"bf16": [0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC0, 0xFFFF, 0x7FFF, 1, 0x8001, 0x007F, 0x0080,
                     0x7F7F, 0xFF7F],
            "f16": [0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0xFFFF, 0x7FFF, 1, 0x8001, 0x03FF, 0x0400,
                    0x7BFF, 0xFBFF],
            "f32": [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00000, 0xFFFFFFFF,
                    0x7FFFFFFF, 1, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF]}


@pytest.mark.parametrize("dt", DTS, ids=IDS)
def test_special_values(dt):
    """Every pair of special values (x_i, r_i) (identical ones: a zero difference; +0 / -0 and the smallest
    subnormals of both signs: sign crossings of a unit or three; NaN <-> inf, max <-> -max: far moves;
    0xFFFF.. <-> 0x7FFF..: the wrap-around of mod 2^W, a difference of 1), and the extreme differences
    -2^(W-1) and 2^(W-1) - 1 (z = 2^W - 1 and 2^W - 2: escapes at the top of their range), among small steps:
    bit for bit."""
    u = np.dtype(dt).itemsize
    W = 8 * u
    sp = SPECIALS[IDS[DTS.index(dt)]]
    k = len(sp)
    xs = np.array([a for a in sp for _ in sp], UINT[u])
    rs = np.array([c for _ in sp for c in sp], UINT[u])
    # (spread thin: where far moves are a few percent of a chunk, coding the XOR can be the smaller, and
    # prefer="fast" takes it)
    x, r = delta_pair(dt, 30000, 7, spread=1)
    xv, rv = x.view(UINT[u]), r.view(UINT[u])
    pos = np.random.default_rng(8).choice(30000, k * k + 4, replace=False)
    xv[pos[:k * k]] = xs
    rv[pos[:k * k]] = rs
    ext = pos[k * k:]
    x[ext] = stepped(r[ext], [-(1 << (W - 1)), (1 << (W - 1)) - 1, -(1 << (W - 1)) + 1, 1 << (W - 2)])
    assert set(_z(x[ext], r[ext]).tolist()) == {(1 << W) - 1, (1 << W) - 2, (1 << W) - 3, 1 << (W - 1)}
    blob = lmc.compress(x, reference=r, chunk_size=10000, prefer="fast")
    heads = _heads(blob)
    assert all(hd is not None and hd[2] > 0 for hd in heads), heads     # delta chunks, with escapes
    assert _round_trip(x, r, blob) == {6}
    # the same pairs decode in the default blob too (whatever mode it takes)
    _round_trip(x, r, lmc.compress(x, reference=r, chunk_size=10000))


@pytest.mark.parametrize("dt", DTS, ids=IDS)
def test_identical_and_every_element_moved(dt):
    x, r = delta_pair(dt, 5000, 3)
    # x == r: every difference 0: a 13-byte chunk (the 7-byte head, the packed fields a constant record)
    same = lmc.compress(r.copy(), reference=r, chunk_size=2048, prefer="fast")
    assert _heads(same) == [(0, 2, 0)] * 3
    assert [len(p) for p in Blob(same).payloads] == [13] * 3
    assert _round_trip(r, r, same) == {6}
    # every element moved by one unit in the last place, up or down (z = 1 or 2, no escape)
    d = np.random.default_rng(4).choice([-1, 1], 5000)
    y = stepped(r, d)
    assert (y.view(UINT[y.dtype.itemsize]) != r.view(UINT[y.dtype.itemsize])).all()
    moved = lmc.compress(y, reference=r, chunk_size=2048, prefer="fast")
    assert all(hd is not None and hd[2] == 0 for hd in _heads(moved)), _heads(moved)
    assert _round_trip(y, r, moved) == {6}


def _record_modes(p, W):
    """{(what, stream mode)} of a delta chunk's records: what is "low", "nibble", "packed" or "escape"."""
    c, (m,) = p[1], struct.unpack_from("<I", p, 3)
    kinds = ["low"] * (c // 8) + ["nibble"] * (c % 8 != 0) + ["packed"] + ["escape"] * ((W - c + 7) // 8 if m else 0)
    out, pos = set(), 7
    for k in kinds:
        out.add((k, p[pos]))
        pos += 5 + struct.unpack_from("<I", p, pos + 1)[0]
    assert pos == len(p)
    return out


def test_larger_chunks_and_coded_records():
    """Chunks of 16384: the default (prefer="speed") Huffman-codes the nibble, packed and escape records
    (prefer="fast" stores a record raw unless Huffman saves enough), both decode through lmc and the
    oracle."""
    seen = set()
    for dt, spread in ((BF, 60), (np.float32, 3000)):
        W = 8 * np.dtype(dt).itemsize
        x, r = delta_pair(dt, 2 * 16384 + 7001, 5, spread=spread, far=0.01, far_span=1 << (W - 4))
        for prefer in ("fast", "speed"):
            blob = lmc.compress(x, reference=r, chunk_size=16384, prefer=prefer)
            b = Blob(blob)
            assert _modes(blob) == [6] * 3, (prefer, _modes(blob))
            for p in b.payloads:
                assert p[1] % 8 == 4      # a nibble stream
                seen |= {(prefer,) + km for km in _record_modes(p, W)}
            assert _round_trip(x, r, blob) == {6}
    assert {("fast", "nibble", 0), ("fast", "packed", 2), ("speed", "nibble", 2), ("speed", "packed", 2),
            ("speed", "escape", 2)} <= seen, seen
    assert not {k for k in seen if k[0] == "fast" and k[2] == 3}      # no rANS in prefer="fast"


# (dtype, spread, far share, far span): data for which the encoder takes different cuts and field widths
PLANS = [(BF, 1, 0.02, 30000), (BF, 6, 0.01, 30000), (BF, 60, 0.02, 30000), (BF, 0, 0.0, 0),
         (np.float16, 1, 0.0, 0), (np.float16, 6, 0.02, 30000), (np.float16, 60, 0.0, 0),
         (np.float32, 1, 0.01, 1 << 22), (np.float32, 6, 0.01, 1 << 22), (np.float32, 1000, 0.003, 1 << 24),
         (np.float32, 4000, 0.0, 0), (np.float32, 10 ** 6, 0.0, 0)]


def test_cuts_field_widths_and_escapes():
    """Steps of different sizes: the encoder takes several cuts c and field widths q, c > 0 on float32 too and
    a cut inside a byte (a nibble stream), and escapes (of 2 and 4 bytes; test_every_cut_and_field_width
    _decodes has every cut with escapes); every blob round-trips through lmc and the oracle."""
    seen, esc = set(), set()
    for i, (dt, spread, far, span) in enumerate(PLANS):
        x, r = delta_pair(dt, 2 * 2048 + 1001, 40 + i, spread=spread, far=far, far_span=span)
        blob = lmc.compress(x, reference=r, chunk_size=2048, prefer="fast")
        W = 8 * x.dtype.itemsize
        for hd in _heads(blob):
            assert hd is not None, (i, _heads(blob))
            seen.add((W, hd[0], hd[1]))
            if hd[2]:
                esc.add((W - hd[0] + 7) // 8)        # the escape values' bytes
        assert _round_trip(x, r, blob) == {6}
    assert len({(c, q) for _, c, q in seen}) >= 4, seen
    assert {q for *_, q in seen} == {2, 4, 8}, seen
    assert any(W == 32 and c > 0 for W, c, _ in seen), seen
    assert any(c % 8 == 4 for _, c, _ in seen), seen
    assert esc >= {2, 4}, esc


@pytest.mark.parametrize("dt", DTS, ids=IDS)
@pytest.mark.parametrize("const", [False, True], ids=["raw", "const"])
def test_every_cut_and_field_width_decodes(dt, const):
    """Delta chunks written here from FORMAT.md for every cut c (0, 4, .., W - 4) and field width q,
    whatever the encoder would choose: steps of every size (and the extreme differences) so that every plan
    has escapes where it can, n = 1001 (an unused final nibble, and unused fields in the last packed byte for q = 2 and
    4); every record raw, or constant where its stream is (the low byte streams then read partly from
    records, partly in place)."""
    x, r = delta_pair(dt, 1001, 9, spread=3, far=0.05, far_span=1 << (8 * np.dtype(dt).itemsize - 2))
    W = 8 * x.dtype.itemsize
    x[:2] = stepped(r[:2], [-(1 << (W - 1)), (1 << (W - 1)) - 1])
    base = _one_chunk_blob(x, r)
    unit = x.dtype.itemsize
    for c in range(0, W, 4):
        for q in (2, 4, 8):
            d = _parts(x, r, c, q)
            # (the extreme differences: an escape in every plan whose h can reach 2^q - 1)
            assert (d["m"] > 0) == (W - c >= q), (c, q, d["m"])
            blob = base.pack([_payload(d, const)])
            assert _round_trip(x, r, blob) == {6}, (c, q)
            assert _parse(Blob(blob).payloads[0], x.size, unit)["m"] == d["m"]


@pytest.mark.parametrize("dt", [BF, np.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("q", [2, 4, 8])
def test_escapes_per_block(dt, q):
    """The decoder finds escapes 64 fields at a time, ESC_K (4) of a block without a branch each: blocks of
    64 fields with 0, 1 (the last field), 4, 5, 63 and 64 escapes, then a last partial block (37 fields) all
    escapes, written from FORMAT.md (every record raw); lmc and the oracle decode them, and packed fields that
    mark one escape more or one fewer than m are refused."""
    W = 8 * np.dtype(dt).itemsize
    c = 4 if W == 16 else 8
    M = (1 << q) - 1
    per = [[], [63], [0, 9, 10, 40], [1, 2, 3, 4, 5], list(range(1, 64)), list(range(64))]
    n = 64 * len(per) + 37
    esc = np.zeros(n, bool)
    for b, fs in enumerate(per):
        esc[[64 * b + f for f in fs]] = True
    esc[64 * len(per):] = True
    g = np.random.default_rng(q)
    h = np.where(esc, M + g.integers(0, 1 << (W - c - 1) if W - c - 1 < 12 else 1 << 12, n), g.integers(0, M, n))
    z = (h << c) | g.integers(0, 1 << c, n)
    d = np.where(z & 1, -((z + 1) >> 1), z >> 1)
    r = (g.standard_normal(n) * 0.02).astype(np.float32).astype(dt)
    x = stepped(r, d)
    parts = _parts(x, r, c, q)
    assert parts["m"] == esc.sum()
    base = _one_chunk_blob(x, r)
    assert _round_trip(x, r, base.pack([_payload(parts)])) == {6}
    g8 = 8 // q
    for i, v in ((5, M), (64 * 3 + 3, 0), (64 * 4 + 1, 0)):     # one more, one fewer (in blocks of 5 and 63)
        pk = parts["packed"].copy()
        pk[i // g8] = (int(pk[i // g8]) & ~(M << (q * (i % g8)))) | (v << (q * (i % g8)))
        bad = base.pack([_payload(_with(parts, packed=pk))])
        with pytest.raises(lmc.FormatError, match="chunk 0: "):
            lmc.decompress(bad, reference=r)
        with pytest.raises(ValueError):
            pyref.decode(bad, r.tobytes())


# ---------------------------------------------------------------------------
# versions
# ---------------------------------------------------------------------------
def _relabel_version(b, v, r):
    """The blob as version v, its reference hash recomputed for that version's checksums (it is checked
    first)."""
    h = api._ref_hash(api._ro_bytes(r), b.h["total"], b.chunk, b.h["unit"], 1, ck_mode(v))
    return b.pack(version=v, refhash=h)


@pytest.mark.parametrize("dt", DTS, ids=IDS)
def test_versions(dt):
    x, r = delta_pair(dt, 3003, 5, spread=6, far=0.01)
    fast = lmc.compress(x, reference=r, chunk_size=1001, prefer="fast")
    v5 = lmc.compress(x, reference=r, chunk_size=1001, prefer="fast", format_version=5)
    assert lmc.info(fast)["version"] == 9 and set(_modes(fast)) == {6}
    assert lmc.info(v5)["version"] == 5 and 6 not in _modes(v5)
    assert lmc.decompress(v5, reference=r).tobytes() == x.tobytes()
    assert len(fast) < len(v5)
    assert lmc.info(lmc.compress(x, reference=r))["version"] == 9       # the default writes version 9
    # a mode-6 chunk in an older blob: refused (also by the oracle)
    b = Blob(fast)
    for v in (2, 4, 5):
        forged = _relabel_version(b, v, r)
        with pytest.raises(lmc.FormatError, match="chunk 0: chunk or stream mode newer than the blob's format"):
            lmc.decompress(forged, reference=r)
        with pytest.raises(ValueError):
            pyref.decode(forged, r.tobytes())
    # a version-7 blob (version 6's checksums) relabelled as version 6 by the same path still decodes (the
    # forgery is the version)
    b7 = Blob(lmc.compress(x, reference=r, chunk_size=1001, prefer="fast", format_version=7))
    assert lmc.decompress(_relabel_version(b7, 6, r), reference=r).tobytes() == x.tobytes()


def test_relabelled_dtypes():
    """The delta chunk codes units: a 16-bit float blob of delta chunks relabelled as the other 16-bit float
    decodes to the same bits; relabelled as an integer type (no mode 6 there) it is refused."""
    x, r = delta_pair(BF, 3000, 11, spread=2, far=0.01)
    b = Blob(lmc.compress(x, reference=r, chunk_size=1000, prefer="fast"))
    assert _modes(b.pack()) == [6] * 3
    y = lmc.decompress(b.pack(code=2), reference=r.view(np.float16))
    assert y.dtype == np.float16 and y.tobytes() == x.tobytes()
    assert pyref.decode(b.pack(code=2), r.tobytes())[0] == x.tobytes()
    for dt, code in ((BF, 7), (BF, 8), (np.float16, 7), (np.float32, 9), (np.float32, 10)):
        x, r = delta_pair(dt, 3000, 12, spread=2)
        b = Blob(lmc.compress(x, reference=r, chunk_size=1000, prefer="fast"))
        assert _modes(b.pack()) == [6] * 3
        rr = r.view(api._DTYPES[code][0])
        with pytest.raises(lmc.FormatError, match="chunk 0: invalid chunk flags byte"):
            lmc.decompress(b.pack(code=code), reference=rr)
        with pytest.raises(ValueError):
            pyref.decode(b.pack(code=code), rr.tobytes())


# ---------------------------------------------------------------------------
# the caller's buffers
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [BF, np.float32], ids=["bf16", "f32"])
def test_reference_and_out_untouched(dt):
    """The reference is only read (a read-only one decodes too), out= is written inside its elements only;
    a forged chunk refused by the structure check leaves out= as it was, one refused while decoding leaves
    the chunks after it as they were (one thread)."""
    x, r = delta_pair(dt, 3 * 1001, 17, spread=2, far=0.02)
    blob = lmc.compress(x, reference=r, chunk_size=1001, prefer="fast")
    assert _modes(blob) == [6] * 3
    r_before = r.tobytes()
    ro = r.copy()
    ro.flags.writeable = False
    u = UINT[x.dtype.itemsize]
    big = np.full(x.size + 64, 0x5A5A, u).view(dt)      # guards of 32 elements on both sides
    out = big[32:-32]
    for threads in (1, 2):
        y = lmc.decompress(blob, reference=ro, out=out, threads=threads)
        assert y is out and out.tobytes() == x.tobytes()
        assert (big.view(u)[:32] == 0x5A5A).all() and (big.view(u)[-32:] == 0x5A5A).all()
    assert r.tobytes() == r_before and ro.tobytes() == r_before
    b = Blob(blob)
    d1 = _parts(x[1001:2002], r[1001:2002], 0, 2)     # chunk 1 rewritten: 2-bit fields, escapes
    assert d1["m"] > 0
    # refused by the structure check (c = W in chunk 1): nothing written
    forged = b.pack([b.payloads[0], _payload(_with(d1, c=8 * x.dtype.itemsize)), b.payloads[2]])
    for threads in (1, 2):
        big.view(u)[:] = 0x5A5A
        with pytest.raises(lmc.FormatError, match="chunk 1: delta chunk"):
            lmc.decompress(forged, reference=r, out=out, threads=threads)
        assert (big.view(u) == 0x5A5A).all()
    # refused while decoding chunk 1 (an escape too large): chunk 0 decoded, chunk 2 not touched
    forged = b.pack([b.payloads[0], _esc_set(d1, _top(d1, x) - 1), b.payloads[2]])
    big.view(u)[:] = 0x5A5A
    with pytest.raises(lmc.FormatError, match="chunk 1: delta chunk"):
        lmc.decompress(forged, reference=r, out=out, threads=1)
    assert out[:1001].tobytes() == x[:1001].tobytes()
    assert (out.view(u)[2002:] == 0x5A5A).all()
    assert (big.view(u)[:32] == 0x5A5A).all() and (big.view(u)[-32:] == 0x5A5A).all()
    assert r.tobytes() == r_before


# ---------------------------------------------------------------------------
# size
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dt, margin", [(BF, 0.93), (np.float16, 0.95), (np.float32, 0.99)],
                         ids=IDS)
def test_size_against_other_codings(dt, margin):
    """Every weight of a checkpoint moved by ~1% of its value (default chunks): prefer="fast" is never
    smaller than the default (which may take the temporal mode), smaller than coding the XOR of the two
    alone by a margin, far smaller than alone, and smaller than without the delta mode (format 5)."""
    n = 1 << 18
    g = np.random.default_rng(5)
    r32 = (g.standard_normal(n) * 0.02).astype(np.float32)
    x = (r32 * (1 + 0.01 * g.standard_normal(n))).astype(np.float32).astype(dt)
    r = r32.astype(dt)
    u = UINT[x.dtype.itemsize]
    fast = lmc.compress(x, reference=r, prefer="fast")
    speed = lmc.compress(x, reference=r)
    xor = lmc.compress(np.bitwise_xor(x.view(u), r.view(u)))
    v5 = lmc.compress(x, reference=r, prefer="fast", format_version=5)
    assert set(_modes(fast)) == {6}
    assert len(speed) <= len(fast) < margin * len(xor), (len(speed), len(fast), len(xor))
    assert len(fast) < 0.8 * len(lmc.compress(x)), len(fast)     # alone
    assert len(fast) < len(v5), (len(fast), len(v5))             # format 5 (no delta mode): XOR or alone
    assert lmc.decompress(fast, reference=r).tobytes() == x.tobytes()
    # a training step of 30% of the weights (train_pair): still never below the default, far below alone
    x, r = train_pair(dt, n, 6)
    fast = lmc.compress(x, reference=r, prefer="fast")
    assert len(lmc.compress(x, reference=r)) <= len(fast) < 0.5 * len(lmc.compress(x))


def _best_plan(x, r):
    """(bytes, c, q) of the smallest delta chunk written here (records raw, or constant), over every plan."""
    W = 8 * x.dtype.itemsize
    return min((len(_payload(_parts(x, r, c, q), const=True)), c, q) for c in range(0, W, 4) for q in (2, 4, 8))


@pytest.mark.parametrize("which", ["bf16_ulp", "f32_far", "plans"])
def test_fast_plan_near_the_best_plan(which):
    """The encoder's plan under prefer="fast" (c and q chosen from a sample, streams of fewer than 8192
    symbols stored raw) is within 5% of the best plan written here.  bf16_ulp: every element moved by one
    unit in the last place (z = 1 or 2: 2-bit fields and no cut, 2 bits an element); f32_far: steps of +-1
    and 2% far moves (escapes of 4 bytes); plans: PLANS' steps.  (lmc 0.3.5 as first committed priced the
    low bytes by their entropy and took a cut of 8 where no cut was 4x smaller, and on f32_far a cut of 24
    for 2x.)"""
    if which == "bf16_ulp":
        _, r = delta_pair(BF, 5000, 3)
        cases = [(stepped(r, np.random.default_rng(2).choice([-1, 1], 5000)), r, 2048)]
    elif which == "f32_far":
        cases = [delta_pair(np.float32, 65536, 1, spread=1, far=0.02, far_span=1 << 22) + (65536,)]
    else:
        cases = [delta_pair(dt, 2 * 2048 + 1001, 40 + i, spread=spread, far=far, far_span=span) + (2048,)
                 for i, (dt, spread, far, span) in enumerate(PLANS)]
    for x, r, chunk in cases:
        b = Blob(lmc.compress(x, reference=r, chunk_size=chunk, prefer="fast"))
        for c, p in enumerate(b.payloads):
            sl = slice(c * chunk, c * chunk + b.n_of(c))
            best = _best_plan(x[sl], r[sl])
            assert p[0] == 6 and len(p) <= 1.05 * best[0], (c, _heads(b.pack()), len(p), best)


def _plan_of_every_cut(x, r):
    """delta_plan's (c, q, estimate) as first written: every sampled table counted (numpy here), every cut and
    field width priced by the kernel's _hcost, the first smallest taken."""
    from lmc.kernels.delta.encode import DSAMPLE, DSAMPLE_MIN, _hcost
    from fuzz_blobs import mono
    W = 8 * x.dtype.itemsize
    u = np.dtype(f"u{W // 8}")
    n = x.size
    step = 1 if n < DSAMPLE_MIN else DSAMPLE
    d = (mono(x.view(u), W) - mono(r.view(u), W)) & ((1 << W) - 1)
    z = ((d << 1) & ((1 << W) - 1)) ^ np.where(d >> (W - 1), (1 << W) - 1, 0)
    z = np.concatenate([z[b:b + ((min(b + 64, n) - b) & ~7)] for b in range(0, n - 7, 64 * step)] or [z[:0]])
    m = z.size
    if m == 0:
        return 0, 8, 0
    hs = np.zeros(256, np.int64)

    def cost(keys):
        hs[:] = np.bincount(keys, minlength=256)
        return _hcost(hs, 0)
    best, bc, bq = 1 << 62, 0, 8
    for c in range(0, W, 4):
        low = sum(cost((z >> (8 * j)) & 255) for j in range(c >> 3))
        if c & 4:
            j = c >> 3
            low += cost(((z[0::2] >> (8 * j)) & 15) | (((z[1::2] >> (8 * j)) & 15) << 4))
        h = z >> c
        sb = 8 * ((W - c + 7) >> 3)
        for q in (2, 4, 8):
            f = np.minimum(h, (1 << q) - 1)
            g = 8 // q
            keys = sum(f[k::g] << (q * k) for k in range(g))
            bits = low + cost(keys) + int((f == (1 << q) - 1).sum()) * sb
            if bits < best:
                best, bc, bq = bits, c, q
    return bc, bq, int(best * (n / (8.0 * m))) + 6 + 5 * ((W >> 3) + 2)


def test_plan_bounds_keep_the_plan_of_every_cut():
    """The delta plan counts a cut's tables only where a bound below its bits (the low part and the escapes that
    are certain) is below the best so far, and stops where the low part alone reaches it: the plan, and its
    estimate, are those of counting every cut, on every spread (no move to far moves, every layout), sampled
    chunks and chunks counted whole, and z = 0 everywhere.  Told a limit (the gate's cut), the plan is the same
    where its estimate is not above the limit, and PLAN_OVER (stopped early) wherever it is."""
    from lmc.kernels.delta.encode import DPLAN_TABLES, PLAN_OVER, delta_plan
    from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F16, LAYOUT_F32
    lay = {BF: LAYOUT_BF16, np.float16: LAYOUT_F16, np.float32: LAYOUT_F32}
    hs = np.full(DPLAN_TABLES * 256, 7, np.int64)   # (scratch left dirty by an earlier call)
    seen = set()
    for i, (dt, spread, far, span) in enumerate(PLANS + [(np.float32, 30, 0.5, 1 << 30), (BF, 3, 0.3, 100)]):
        for n in (8, 1001, 4095, 70000):
            x, r = delta_pair(dt, n, 900 + i, spread=spread, far=far, far_span=span)
            want = _plan_of_every_cut(x, r)
            got = delta_plan(x.view(np.uint8), r.view(np.uint8), 0, n, lay[dt], hs)
            assert tuple(int(v) for v in got) == want, (dt, spread, far, n, got, want)
            seen.add(want[:2])
            e = want[2]
            for lim in sorted({0, e // 2, e - 1, e, e + 1, 2 * e + 100} - {-1}):
                got = tuple(int(v) for v in delta_plan(x.view(np.uint8), r.view(np.uint8), 0, n, lay[dt], hs, lim))
                assert got == (want if e <= lim else (0, 8, int(PLAN_OVER))), (dt, spread, far, n, lim, got, want)
    assert len(seen) >= 6, seen   # (the cases reach several plans)
