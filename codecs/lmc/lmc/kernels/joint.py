"""lmc kernels: the joint-symbol chunk mode of format v9 (bfloat16, alone): each element's exponent and its
top ``k`` mantissa bits (k = 1..3) as one byte symbol in one stream record (Huffman, as the exponent stream
of mode 0), the sign and the other ``7 - k`` mantissa bits packed raw, ``8 - k`` bits an element.  Its
planners (``joint_estimate`` from a sample, ``joint_plan`` from counts), writer, structural check
(``check_joint``) and decoder.

Why: the top mantissa bits of a bell-shaped weight distribution depend on the binade (the mantissa-context
mode's finding), and an order-0 Huffman code of the exponent alone loses about 0.04 bits an element to its
whole-bit code lengths (2.59 against an entropy of 2.55 on a 24M model's bf16 weights). One symbol of the
exponent and the top mantissa bit is coded at 3.54 bits against 2.59 + 1, the top two at 4.50 against
2.59 + 2: the chunk is 0.5% (k = 1) to 0.7% (k = 2) smaller, and it decodes with mode 0's Huffman decoder
plus a pass that unpacks the raw fields and one that merges (vector loops, 0.1 ns an element together).

The symbol of an element with exponent ``e`` is ``((e - b) mod 256) << k | top k mantissa bits``, ``b`` the
chunk's smallest exponent: the chunk's exponents must lie in ``b .. b + (256 >> k) - 1``.  Where size does
not come first the encoder takes k = 1 only (its symbols decode at 0.54 ns against 0.67 for k = 2), decided
and coded from a sample (``joint_estimate``); else the smallest of k = 1..3 from exact counts.  A chunk whose
exponents span more than 128 values (zeros beside values of 2 or more) keeps mode 0."""

import numpy as np
from numba import njit

from .intrinsics import ld
from .intrinsics import st as put
from .intrinsics import store_u32
from .base import (CHUNK_JOINT, ERR_JOINT, ERR_LEN, ERR_PAD, ERR_TRUNC, LAYOUT_BF16, MAXLEN, MODE_CONST, MODE_HUFF,
                   MODE_RAW, NO_MARGIN, OK, _U0, _fold_w, checksum_units, ck_mode, csum_sums, split_chunk)
from .huffman import decode_huff_stream, huffman_lengths
from .jmerge import merge_blocks
from .simd import SIMD
from .huffenc import put_huff
from .streams import (_decode_stream, _huff_sub_bytes, _read_record, _table_bytes, _write_stream, analyze_planes_but,
                      check_planes, near_raw_counts, pred_gain_h0)

JOINT_KMAX = 3
JOINT_MIN = 1024    # smaller chunks are not planned
# joint_analyze leaves a bf16 chunk's exponent plane uncounted where the predicted-exponent mode's sampled gain is
# this many times the margin it must win by (an entropy from 1/32 of the chunk: its error is far below that)
PRED_SURE = 2


@njit(nogil=True, cache=True)
def joint_hist(x, n, jh):
    """jh[(i % 4) * 2048 + (x[i] >> 4 & 0x7FF)]: the counts of (exponent, top 3 mantissa bits) per
    sub-stream (int32[4 * 2048], zeroed here); x: the chunk's uint16 units."""
    jh[:] = 0
    n4 = n & ~3
    for i in range(0, n4, 4):
        jh[(np.int64(ld(x, i)) >> 4) & 0x7FF] += 1
        jh[2048 + ((np.int64(ld(x, i + 1)) >> 4) & 0x7FF)] += 1
        jh[4096 + ((np.int64(ld(x, i + 2)) >> 4) & 0x7FF)] += 1
        jh[6144 + ((np.int64(ld(x, i + 3)) >> 4) & 0x7FF)] += 1
    for i in range(n4, n):
        jh[((i & 3) << 11) + ((np.int64(x[i]) >> 4) & 0x7FF)] += 1


@njit(nogil=True, cache=True)
def joint_exp_hist(jh, h):
    """h[sub-stream, e]: the exponent counts of mode 0's stream 0 from the joint counts (int64[4, 256])."""
    for k in range(4):
        for e in range(256):
            t = 0
            for m in range(8):
                t += jh[(k << 11) + (e << 3) + m]
            h[k, e] = t


@njit(nogil=True, cache=True)
def _span(h0):
    """(lowest, highest) exponent present in the chunk, from its exponent counts h0[sub-stream, e]."""
    lo = 256
    hi = -1
    for e in range(256):
        if h0[0, e] + h0[1, e] + h0[2, e] + h0[3, e] > 0:
            if lo == 256:
                lo = e
            hi = e
    return lo, hi


@njit(nogil=True, cache=True)
def _sym_hist(jh, k, lo, hi, h):
    """h[sub-stream, symbol]: the counts of the symbols under k and base lo (exponents lo..hi; int64[4, 256],
    overwritten)."""
    h[:] = 0
    for s in range(4):
        for e in range(lo, hi + 1):
            for m in range(8):
                h[s, ((e - lo) << k) | (m >> (3 - k))] += jh[(s << 11) + (e << 3) + m]


@njit(nogil=True, cache=True)
def _plan_k(hk, n, lk, k, lo):
    """(k, lo, stream mode, payload size) of the symbol stream whose sub-stream counts are hk: Huffman, or
    constant where one symbol holds every element, raw where Huffman is not smaller; lk its code lengths."""
    freq = np.empty(256, np.int64)
    for c in range(256):
        freq[c] = hk[0, c] + hk[1, c] + hk[2, c] + hk[3, c]
    if huffman_lengths(freq, lk) == 1:
        return k, lo, MODE_CONST, 1
    sub = np.empty(4, np.int64)
    size = _table_bytes(lk) + 12 + _huff_sub_bytes(hk, lk, sub)
    if size >= n:
        return k, lo, MODE_RAW, n
    return k, lo, MODE_HUFF, size


@njit(nogil=True, cache=True)
def joint_plan(jh, h0, n, h, lens, kmin, kmax):
    """Plan a joint-symbol chunk from the joint counts jh and the exponent counts h0 (joint_exp_hist): (k,
    b, stream mode, payload size) of the smallest of k = kmin..kmax whose exponents fit (k = 0: none fits),
    h and lens (int64[4, 256], uint8[256]) its symbol counts and Huffman code lengths.  Its chunk size after
    the mode byte: 2 + 5 + payload + rest_bytes(n, k)."""
    lo, hi = _span(h0)
    best = (0, lo, MODE_RAW, 0)
    bt = 1 << 62
    hk = np.empty((4, 256), np.int64)
    lk = np.empty(256, np.uint8)
    for k in range(kmin, kmax + 1):
        if hi - lo >= (256 >> k):
            continue
        _sym_hist(jh, k, lo, hi, hk)
        plan = _plan_k(hk, n, lk, k, lo)
        if plan[3] + rest_bytes(n, k) < bt:
            bt = plan[3] + rest_bytes(n, k)
            best = plan
            h[:, :] = hk
            lens[:] = lk
    return best


@njit(nogil=True, cache=True)
def rest_bytes(n, k):
    """Bytes of the raw fields of n elements: 16 (8 - k) a block of 128, the last block whole."""
    return ((n + 127) >> 7) * 16 * (8 - k)


@njit(nogil=True, cache=True, inline="always")
def _sym_loop(x, n, k, bb, t, r):
    sh = 7 - k
    tm = (1 << k) - 1
    lm = (1 << sh) - 1
    for i in range(n):
        v = np.int64(x[i])
        t[i] = np.uint8((((np.uint8(v >> 7) - bb[0]) & 255) << k) | ((v >> sh) & tm))
        r[i] = np.uint8(((v >> 15) << sh) | (v & lm))


@njit(nogil=True, cache=True)
def _symbols(x, n, k, b, t, r):
    """t[i]: element i's symbol ((e - b) mod 256) << k | top k mantissa bits; r[i]: its raw field, sign << (7
    - k) | the other 7 - k mantissa bits.  One loop per k, k a constant in each, and b read from an array in
    the loop: so LLVM vectorizes them in bytes (with k and b plain arguments it works in 64-bit lanes, 5x
    slower)."""
    bb = np.full(1, b, np.uint8)
    if k == 1:
        _sym_loop(x, n, 1, bb, t, r)
    elif k == 2:
        _sym_loop(x, n, 2, bb, t, r)
    else:
        _sym_loop(x, n, 3, bb, t, r)


@njit(nogil=True, cache=True)
def _pack(r, n, k, out, o, lim):
    """Pack the raw fields r[:n] at out[o:] in blocks of 128 (the format's layout: a 4-bit plane of 64 bytes,
    then a 2-bit plane of 32 where 8 - k >= 6, then a 1-bit plane of 16 where 8 - k is odd; byte j of a c-bit
    plane holds field j + 16 c m at bits c m); r must be zero past n up to a whole block.  Loops of 16 bytes
    that write each byte once: LLVM vectorizes them (0.03-0.05 ns a field).  Returns the end, -1 past lim."""
    w = 8 - k
    nblk = (n + 127) >> 7
    if o + nblk * 16 * w > lim:
        return -1
    if k == 1:
        _pack_loop(r, nblk, 7, out, o)
    elif k == 2:
        _pack_loop(r, nblk, 6, out, o)
    else:
        _pack_loop(r, nblk, 5, out, o)
    return o + nblk * 16 * w


@njit(nogil=True, cache=True, inline="always")
def _pack_loop(r, nblk, w, out, o):
    top = 4 if w == 5 else 6
    for g in range(nblk):
        s = 128 * g
        d = o + 16 * w * g
        for j in range(16):
            f0 = np.int64(ld(r, s + j))
            f1 = np.int64(ld(r, s + 16 + j))
            f2 = np.int64(ld(r, s + 32 + j))
            f3 = np.int64(ld(r, s + 48 + j))
            f4 = np.int64(ld(r, s + 64 + j))
            f5 = np.int64(ld(r, s + 80 + j))
            f6 = np.int64(ld(r, s + 96 + j))
            f7 = np.int64(ld(r, s + 112 + j))
            put(out, d + j, (f0 & 15) | ((f4 & 15) << 4))
            put(out, d + 16 + j, (f1 & 15) | ((f5 & 15) << 4))
            put(out, d + 32 + j, (f2 & 15) | ((f6 & 15) << 4))
            put(out, d + 48 + j, (f3 & 15) | ((f7 & 15) << 4))
            if w >= 6:
                put(out, d + 64 + j, ((f0 >> 4) & 3) | (((f2 >> 4) & 3) << 2) | (((f4 >> 4) & 3) << 4)
                    | (((f6 >> 4) & 3) << 6))
                put(out, d + 80 + j, ((f1 >> 4) & 3) | (((f3 >> 4) & 3) << 2) | (((f5 >> 4) & 3) << 4)
                    | (((f7 >> 4) & 3) << 6))
            if w & 1:
                put(out, d + 16 * (w - 1) + j, ((f0 >> top) & 1) | (((f1 >> top) & 1) << 1)
                    | (((f2 >> top) & 1) << 2) | (((f3 >> top) & 1) << 3) | (((f4 >> top) & 1) << 4)
                    | (((f5 >> top) & 1) << 5) | (((f6 >> top) & 1) << 6) | (((f7 >> top) & 1) << 7))

@njit(nogil=True, cache=True)
def joint_write(x, n, k, b, mode, size, h, lens, t, r, ready, out, o, lim, tbuf, fv):
    """Write a joint-symbol chunk at out[o:] (its plan: k, b, the symbol stream's mode and size, h, lens;
    size -1: Huffman with the code lengths lens, uncounted); t, r: uint8[>= n rounded up to 128] for the
    symbols and the raw fields, which hold them already where ready; tbuf: >= 1.4 n + 64 bytes.  Returns the
    end position, or -1 if it would pass lim."""
    if o + 3 > lim:
        return -1
    out[o] = CHUNK_JOINT
    out[o + 1] = k
    out[o + 2] = b
    if not ready:
        _symbols(x, n, k, b, t, r)
    r[n:(n + 127) & ~127] = 0
    if size >= 0:
        f = np.zeros(256, np.int64)
        q = _write_stream(t, n, mode, size, h, lens, f, f, out, o + 3, lim, tbuf, fv)
    else:   # (Huffman, its sub-stream sizes found by coding into tbuf: >= 4 bounds)
        sub = np.full(4, ((((n + 3) >> 2) * MAXLEN + 7) >> 3) + 8, np.int64)
        q = put_huff(t, n, lens, sub, out, o + 8, lim, tbuf, True)
        if q >= 0:
            out[o + 3] = MODE_HUFF
            store_u32(out, o + 4, np.uint32(q - o - 8))
    if q < 0:
        return -1
    return _pack(r, n, k, out, q, lim)


@njit(nogil=True, cache=True)
def _head(blob, pos, end, n, version):
    """(status, k, b, the symbol record's mode, its payload length) of the chunk body blob[pos:end] (after
    the mode byte), k in 1..3 and the record inside the chunk."""
    if pos + 2 > end:
        return ERR_TRUNC, 0, 0, 0, 0
    k = np.int64(blob[pos])
    b = np.int64(blob[pos + 1])
    if k < 1 or k > JOINT_KMAX:
        return ERR_JOINT, 0, 0, 0, 0
    st, m0, l0 = _read_record(blob, pos + 2, end, n, version)
    return st, k, b, m0, l0


@njit(nogil=True, cache=True)
def _tail_checks(blob, q, end, n, k):
    """The raw fields at blob[q:end]: exactly rest_bytes(n, k) bytes."""
    if end - q != rest_bytes(n, k):
        return ERR_LEN
    return OK


@njit(nogil=True, cache=True)
def check_joint(blob, pos, end, n, version, lens, f, cm, one):
    """Structural check of a joint-symbol chunk body blob[pos:end] (after the mode byte), nothing decoded:
    header, the symbol record (as check_planes) and the raw fields' length (their padding is the decoder's to
    check: it unpacks them).  Returns a status."""
    st, k, b, m0, l0 = _head(blob, pos, end, n, version)
    if st != OK:
        return st
    pos += 2
    st, _c = check_planes(blob, pos, pos + 5 + l0, n, 1, version, lens, f, cm, one)
    if st != OK:
        return st
    return _tail_checks(blob, pos + 5 + l0, end, n, k)


@njit(nogil=True, cache=True)
def _unpack(blob, q, n, k, r):
    """The raw fields of the blocks at blob[q:] (rest_bytes(n, k) bytes, checked inside the chunk) into
    r[:n rounded up to 128] (one loop per k, as _symbols).  Returns whether the fields past n are zero."""
    nblk = (n + 127) >> 7
    if k == 1:
        _unpack_loop(blob, q, nblk, 7, r)
    elif k == 2:
        _unpack_loop(blob, q, nblk, 6, r)
    else:
        _unpack_loop(blob, q, nblk, 5, r)
    pad = 0
    for i in range(n, nblk << 7):
        pad |= r[i]
    return pad == 0


@njit(nogil=True, cache=True, inline="always")
def _unpack_loop(blob, q, nblk, w, r):
    top = 4 if w == 5 else 6
    for g in range(nblk):
        s = q + 16 * w * g
        o = 128 * g
        for j in range(16):
            n0 = np.int64(ld(blob, s + j))
            n1 = np.int64(ld(blob, s + 16 + j))
            n2 = np.int64(ld(blob, s + 32 + j))
            n3 = np.int64(ld(blob, s + 48 + j))
            f0 = n0 & 15
            f1 = n1 & 15
            f2 = n2 & 15
            f3 = n3 & 15
            f4 = n0 >> 4
            f5 = n1 >> 4
            f6 = n2 >> 4
            f7 = n3 >> 4
            if w >= 6:
                t0 = np.int64(ld(blob, s + 64 + j))
                t1 = np.int64(ld(blob, s + 80 + j))
                f0 |= (t0 & 3) << 4
                f1 |= (t1 & 3) << 4
                f2 |= ((t0 >> 2) & 3) << 4
                f3 |= ((t1 >> 2) & 3) << 4
                f4 |= ((t0 >> 4) & 3) << 4
                f5 |= ((t1 >> 4) & 3) << 4
                f6 |= (t0 >> 6) << 4
                f7 |= (t1 >> 6) << 4
            if w & 1:
                u = np.int64(ld(blob, s + 16 * (w - 1) + j))
                f0 |= (u & 1) << top
                f1 |= ((u >> 1) & 1) << top
                f2 |= ((u >> 2) & 1) << top
                f3 |= ((u >> 3) & 1) << top
                f4 |= ((u >> 4) & 1) << top
                f5 |= ((u >> 5) & 1) << top
                f6 |= ((u >> 6) & 1) << top
                f7 |= (u >> 7) << top
            put(r, o + j, f0)
            put(r, o + 16 + j, f1)
            put(r, o + 32 + j, f2)
            put(r, o + 48 + j, f3)
            put(r, o + 64 + j, f4)
            put(r, o + 80 + j, f5)
            put(r, o + 96 + j, f6)
            put(r, o + 112 + j, f7)

@njit(nogil=True, cache=True, inline="always")
def _merge_loop(t, r, n, k, bb, dst):
    sh = 7 - k
    lm = (1 << sh) - 1
    for i in range(n):
        a = np.int64(t[i])
        f = np.int64(r[i])
        dst[i] = np.uint16(((f >> sh) << 15) | ((bb[0] + (a << sh)) & 0x7FFF) | (f & lm))


@njit(nogil=True, cache=True)
def _merge(t, r, n, k, b, dst):
    """dst[i]: element i from its symbol t[i] and raw field r[i] (vectorized as _symbols): sign << 15 | (b <<
    7) + (t << (7 - k)) | low mantissa bits, since (e - b) << 7 | top bits << (7 - k) = t << (7 - k) and e < 256
    (the symbol's exponent wraps modulo 256, so a forged b + (t >> k) past 255 is taken modulo 256 too)."""
    bb = np.full(1, b << 7, np.uint16)
    if k == 1:
        _merge_loop(t, r, n, 1, bb, dst)
    elif k == 2:
        _merge_loop(t, r, n, 2, bb, dst)
    else:
        _merge_loop(t, r, n, 3, bb, dst)


@njit(nogil=True, cache=True)
def joint_decode(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, dst):
    """Decode a joint-symbol chunk body blob[pos:end] (after the mode byte) into dst (uint16[n]).  Returns (status,
    the checksum of the units written: format 8's, ck_mode(version) being 3 for every version with the mode)."""
    st, k, b, m0, l0 = _head(blob, pos, end, n, version)
    if st != OK:
        return st, _U0
    pos += 2
    q = pos + 5 + l0
    d8 = dst.view(np.uint8)
    if SIMD and m0 == MODE_HUFF and n >= 128:   # (one vector pass from the sub-streams: kernels.jmerge)
        st = decode_huff_stream(blob, pos + 5, l0, planes[0], n, lens, dec, dec3, dec1, tmp, False)
        if st == OK:
            st = _tail_checks(blob, q, end, n, k)
        if st != OK:
            return st, _U0
        nb = n >> 7
        r = ((n + 3) >> 2) + 16   # (huff_decode4's sub-stream stride)
        acc = np.zeros(2, np.uint64)
        merge_blocks(blob, q, tmp, r, nb, k, b, dst, acc)
        m = n - (nb << 7)
        if m > 0:
            t = planes[0]
            for i in range(m):
                e = (nb << 7) + i
                t[i] = tmp[(e & 3) * r + (e >> 2)]
            if not _unpack(blob, q + (8 - k) * 16 * nb, m, k, planes[1]):
                return ERR_PAD, _U0
            _merge(t, planes[1], m, k, b, dst[nb << 7:])
        s1, s2 = csum_sums(d8[nb << 8:2 * n], 2 * m, nb << 5, acc[0], acc[1])
        return OK, _fold_w(s1, s2, 3)
    st = _decode_stream(blob, pos + 5, l0, m0, planes[0], n, lens, dec, dec3, dec1, tmp, f, cm, dtab, version)
    if st != OK:
        return st, _U0
    st = _tail_checks(blob, q, end, n, k)    # (the fields' bounds, before _merge reads them)
    if st != OK:
        return st, _U0
    if not _unpack(blob, q, n, k, planes[1]):
        return ERR_PAD, _U0
    _merge(planes[0], planes[1], n, k, b, dst)
    return OK, checksum_units(d8, 0, n, 2, ck_mode(version))


@njit(nogil=True, cache=True)
def _span_units(x, n):
    """(lowest, highest) exponent of the units x[:n]: the extremes of v & 0x7FFF, a reduction LLVM vectorizes
    in 16-bit lanes (0.04 ns an element; over the exponents in int64, 0.2)."""
    lo = np.uint16(0x7FFF)
    hi = np.uint16(0)
    for i in range(n):
        v = np.uint16(x[i] & np.uint16(0x7FFF))
        lo = min(lo, v)
        hi = max(hi, v)
    return np.int64(lo) >> 7, np.int64(hi) >> 7


@njit(nogil=True, cache=True)
def _bits(h, ln):
    t = 0
    for c in range(256):
        t += h[c] * np.int64(ln[c])
    return t


@njit(nogil=True, cache=True)
def _sample_plan(x, n, lo, hi, lj):
    """From 32 elements in every 544 (a 17th of the chunk; not a power of two, so that on rows of 2^j elements
    the sampled columns move along the row instead of repeating): the estimated bits of mode 0
    (the exponent stream's Huffman code and the sign/mantissa plane stored raw) and of the joint-symbol mode
    with k = 1 and base lo (lo, hi: the chunk's exponent span, hi - lo < 128), and whether that plane is near
    raw (as near_raw).  lj: the joint mode's code lengths, from the sample's counts plus one for every symbol of
    the exponents lo..hi (so that every symbol of the chunk has a code).  The two estimates err together (the
    same elements); the joint mode wins by about 0.5% on weights where it wins at all."""
    # (four counts of each kind, element i into copy i % 4, summed after: the samples of one chunk hit few
    # bins, and one count incremented again before its last increment is stored waits on it, 3x the time)
    ht4 = np.zeros(1024, np.int64)
    hs4 = np.zeros(1024, np.int64)
    m = 0
    for b0 in range(0, n - 31, 544):
        for i in range(b0, b0 + 32, 4):
            for u in range(4):
                v = np.int64(ld(x, i + u))
                ht4[(u << 8) | ((((v >> 7) & 255) - lo) << 1) | ((v >> 6) & 1)] += 1
                hs4[(u << 8) | ((v >> 8) & 0x80) | (v & 0x7F)] += 1
        m += 32
    ht = np.zeros(256, np.int64)
    hs = np.zeros(256, np.int64)
    for c in range(256):
        ht[c] = ht4[c] + ht4[256 + c] + ht4[512 + c] + ht4[768 + c]
        hs[c] = hs4[c] + hs4[256 + c] + hs4[512 + c] + hs4[768 + c]
    he = np.zeros(256, np.int64)   # (the exponents lo .. hi, from the joint counts)
    for e in range(lo, hi + 1):
        he[e] = ht[2 * (e - lo)] + ht[2 * (e - lo) + 1]
    if m < 1024:
        return 0, 0, False
    ln = np.empty(256, np.uint8)
    huffman_lengths(he, ln)
    est0 = (_bits(he, ln) + 8 * m) * n // m
    f = np.empty(256, np.int64)
    for c in range(256):
        f[c] = 16 * ht[c] + (1 if c < 2 * (hi - lo + 1) else 0)
    huffman_lengths(f, lj)
    estj = (_bits(ht, lj) + 7 * m) * n // m
    return est0, estj, near_raw_counts(hs, m)


@njit(nogil=True, cache=True)
def joint_estimate(x, n, lj):
    """The joint-symbol mode with k = 1 where a sample (_sample_plan) says it is smaller than mode 0 and the
    sign/mantissa plane near raw: (its estimated chunk size after the mode byte, the base); size -1 where
    the sample says not, -2 where the chunk is too small to tell; lj: its code lengths.  Its symbols are not
    counted: their code comes from the sample, and the sub-stream sizes from coding them (joint_write with
    size -1), so that it costs the encoder what mode 0 does."""
    lo, hi = _span_units(x, n)
    if hi - lo >= 128:
        return -1, lo
    est0, estj, raw1 = _sample_plan(x, n, lo, hi, lj)
    if est0 == 0:
        return -2, lo
    if not raw1 or estj >= est0:
        return -1, lo
    return 2 + 5 + 14 + (hi - lo + 1) + ((estj - 7 * n) >> 3) + rest_bytes(n, 1), lo   # (estj: the fields too)


@njit(nogil=True, cache=True)
def joint_analyze(data, start, n, planes, h, lens, modes, sizes, f, cm, rm, fv, wk, w, pm):
    """The alone codings of a bf16 chunk: mode 0's (split into planes, h .. cm as analyze_planes fills them) and the
    joint-symbol mode's (as joint_alone). Where size does not come first and joint_estimate takes the joint mode
    and the predicted-exponent mode cannot pay (pred_gain from the units, w: the row length, pm: its margin),
    the chunk is not split for mode 0 nor counted: its symbols and fields go to planes[0] and planes[1] in one
    pass. Where size does not come first, the sample says the joint mode does not pay and the sampled gain of
    the predicted-exponent mode is PRED_SURE times the margin it must win by over the largest mode 0 can cost
    (both planes raw), the exponent plane is not counted (the mode replaces it): stored raw in modes and sizes,
    mode 0's cost then an upper bound (second moments: their exponents' counts cost 0.3 ns an element of 2.4 on
    a Xeon core). Returns (checksum, mode 0's cost (2 n + 64 where not counted), then joint_alone's tuple,
    whether planes hold the joint mode's symbols and fields, the sampled gain and exponents' entropy (bits an
    exponent: pred_gain_h0; taken where size does not come first), whether they were, and whether the exponent
    plane was counted: where not, the caller trusts the sample only where its exponents' entropy clears the
    exact residuals' cost by PRED_SURE times the margin, and counts the plane otherwise)."""
    x = data[2 * start:2 * (start + n)].view(np.uint16)
    hj = np.zeros((4, 256), np.int64)
    lj = np.zeros(256, np.uint8)
    sf = rm == NO_MARGIN
    est = -2
    lo = 0
    g = 0.0
    h0 = 0.0
    if not sf:
        est, lo = joint_estimate(x, n, lj)
        g, h0 = pred_gain_h0(x, n, w, 32, 7)
        if est >= 0 and g * n <= 8 * est / pm:
            chk = checksum_units(data, start, n, 2, wk)
            _symbols(x, n, 1, lo, planes[0], planes[1])
            return chk, 2 * n + 64, est, 1, lo, MODE_HUFF, -1, hj, lj, True, g, h0, True, True
    chk = split_chunk(data, data, False, start, n, 2, LAYOUT_BF16, planes, wk)
    # (only where the sample says the joint mode does not pay, est -1: otherwise it is planned or taken against
    # mode 0's cost, which must then be exact)
    e0 = sf or est != -1 or g * n <= PRED_SURE * 8 * (2 * n + 10) / pm
    cost_a = analyze_planes_but(planes, n, 2, h, lens, modes, sizes, f, cm, rm, fv, 0 if e0 else 1)
    cj, k, b, mode, size = _choose(x, n, sf, modes[1] == MODE_RAW, est, lo, hj, lj)
    return chk, cost_a, cj, k, b, mode, size, hj, lj, False, g, h0, not sf, e0


@njit(nogil=True, cache=True)
def count_exponents(planes, n, h, lens, modes, sizes, f, cm, rm, fv):
    """Mode 0's exact cost where joint_analyze left the exponent plane uncounted: h zeroed and both planes
    counted anew (analyze_planes)."""
    h[:] = 0
    return analyze_planes_but(planes, n, 2, h, lens, modes, sizes, f, cm, rm, fv, 0)


@njit(nogil=True, cache=True)
def _choose(x, n, sf, raw1, est, lo, hj, lj):
    """joint_alone's choice, joint_estimate's (est, lo, lj) given."""
    if est >= 0:
        return est, 1, lo, MODE_HUFF, -1
    if not raw1 or (est == -1 and not sf):
        return -1, 0, 0, 0, 0
    jh = np.empty(4 * 2048, np.int32)
    joint_hist(x, n, jh)
    h0 = np.empty((4, 256), np.int64)   # (from the joint counts: mode 0's are not counted on a plane near raw)
    joint_exp_hist(jh, h0)
    k, b, mode, size = joint_plan(jh, h0, n, hj, lj, 1, JOINT_KMAX if sf else 1)
    if k == 0:
        return -1, 0, 0, 0, 0
    return 2 + 5 + size + rest_bytes(n, k), k, b, mode, size


@njit(nogil=True, cache=True)
def joint_alone(data, start, n, sf, raw1):
    """The joint-symbol mode as an alone coding of a bf16 chunk (raw1: mode 0 stores its sign/mantissa plane
    raw): where size comes first, planned exactly with k up to 3 if raw1; else
    joint_estimate's, or on a chunk too small for its sample, planned exactly with k = 1 if raw1.  Returns
    (its cost after the mode byte or -1, k, b, stream mode, size (-1: found by coding), counts, lengths)."""
    x = data[2 * start:2 * (start + n)].view(np.uint16)
    hj = np.zeros((4, 256), np.int64)
    lj = np.zeros(256, np.uint8)
    est = -2
    lo = 0
    if not sf:
        est, lo = joint_estimate(x, n, lj)
    cj, k, b, mode, size = _choose(x, n, sf, raw1, est, lo, hj, lj)
    return cj, k, b, mode, size, hj, lj
