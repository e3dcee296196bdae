"""lmc kernels: what every coder shares - constants, error codes, the chunk checksum (also of a
constant chunk, ``checksum_fill``, for the structural pre-pass), byte copies and XOR, splitting units
into byte streams and merging them back, and the histogram increment ``_inc``.  See ``kernels.chunk`` for the
conventions every kernel follows and for how the modules fit together."""

import numpy as np
from numba import njit

from .intrinsics import ld
from .intrinsics import st as put



MAXLEN = 11
TABSIZE = 1 << MAXLEN

MODE_RAW = 0
MODE_CONST = 1
MODE_HUFF = 2
MODE_RANS = 3          # format v2

CHUNK_ALONE = 0
CHUNK_XOR = 1
CHUNK_STORED = 2
CHUNK_TEMPORAL = 3     # format v2
CHUNK_PRED = 4         # format v3: alone, the exponent stream as residuals of a 2-D prediction
CHUNK_MCTX = 5         # format v5: alone, bf16: sign + top 3 mantissa bits with the exponent as context
CHUNK_DELTA = 6        # format v6: float layouts, a reference: the monotone difference's byte streams
CHUNK_JOINT = 7        # format v9: alone, bf16: the exponent and top k mantissa bits as one symbol

# rANS (format v2): 32-bit states in [2^16, 2^32), 16-bit renormalisation,
# 4 interleaved states (symbol i uses state i % 4), frequencies sum to 2^12
PROB_BITS = 12
PROB_SCALE = 1 << PROB_BITS
RANS_L = 1 << 16
NCTX = 16              # temporal contexts
# a stream or mode is taken over a faster one only when it saves more than
# size/RANS_MARGIN (+ RANS_SLACK bytes for the stream)
RANS_MARGIN = 32
RANS_SLACK = 16
TEMPORAL_MARGIN = 64
# format 7: the temporal mode (symbol by symbol, several times slower to decode than the byte-stream modes)
# must save more than 1/32 over every other coding, the delta mode's included: where the delta mode comes
# within that, its byte streams decode at the alone modes' speed, for at most 1/32 more bytes
TEMPORAL_MARGIN7 = 32
# the predicted-exponent mode (an extra serial pass to decode) is taken when
# it saves more than size/PRED_MARGIN
PRED_MARGIN = 64
# where the caller puts size first (compress(prefer="size")) every margin
# above is this divisor: a slower coding is taken whenever it is smaller
NO_MARGIN = 1 << 50
# compress(prefer=...): the encoder's setting (encode_chunk's pref)
PREF_SPEED = 0
PREF_SIZE = 1
PREF_FAST = 2
# a plane of at least NEAR_RAW_MIN bytes whose sampled entropy is within
# NEAR_RAW_BITS of 8 bits is stored raw without being counted (except where
# size comes first): kernels.streams.near_raw
NEAR_RAW_MIN = 32768
NEAR_RAW_BITS = 0.05

LAYOUT_PLANES = 0
LAYOUT_BF16 = 1
LAYOUT_F16 = 2
LAYOUT_F32 = 3

# status codes returned by the decoder kernels
OK = 0
ERR_TRUNC = 1
ERR_FLAGS = 2
ERR_NOREF = 3
ERR_MODE = 4
ERR_LEN = 5
ERR_TABLE = 6
ERR_KRAFT = 7
ERR_STREAM = 8
ERR_PAD = 9
ERR_TRAIL = 10
ERR_CHECKSUM = 11
ERR_VERSION = 12
ERR_FREQ = 13
ERR_RANS = 14
ERR_CTX = 15
ERR_BITS = 16
ERR_PRED = 17
ERR_MCTX = 18
ERR_DELTA = 19
ERR_JOINT = 20

ERROR_MESSAGES = {
    ERR_TRUNC: "chunk data truncated (a length points past the end of the chunk)",
    ERR_FLAGS: "invalid chunk flags byte",
    ERR_NOREF: "chunk is delta-coded but no reference is available",
    ERR_MODE: "invalid stream mode",
    ERR_LEN: "stream or chunk payload length inconsistent with its mode",
    ERR_TABLE: "invalid Huffman table header",
    ERR_KRAFT: "invalid Huffman code lengths (length > 11 or Kraft sum != 1)",
    ERR_STREAM: "Huffman bit stream overrun or length mismatch",
    ERR_PAD: ("non-zero padding bits (a Huffman sub-stream's last byte, a mantissa-context chunk's unused final "
              "nibble, or a joint-symbol chunk's fields past its last element)"),
    ERR_TRAIL: "unused trailing bytes in chunk",
    ERR_CHECKSUM: "chunk checksum mismatch (corrupt data or wrong reference)",
    ERR_VERSION: "chunk or stream mode newer than the blob's format version",
    ERR_FREQ: "invalid rANS frequency table (bad range, encoding, or sum != 4096)",
    ERR_RANS: "rANS stream overrun/underrun or final state mismatch",
    ERR_CTX: "context mask does not match the chunk's contexts (temporal: the reference's exponents; mantissa context: the chunk's)",
    ERR_BITS: "raw bit stream overrun, length mismatch or non-zero padding",
    ERR_PRED: "predicted-exponent chunk: row length 0, or every stream constant",
    ERR_MCTX: "mantissa-context chunk: context count outside 1..8, or a context mask empty or past it",
    ERR_DELTA: ("delta chunk: cut or field width invalid, escape count past the chunk or not the escapes found, "
                "an escape too large, or a non-zero unused field"),
    ERR_JOINT: "joint-symbol chunk: mantissa bits per symbol outside 1..3",
}

_M11 = np.uint64(TABSIZE - 1)
_M63 = np.uint64(63)
_M15 = np.uint64(15)
_M3 = np.uint64(3)
_S8 = np.uint64(8)
_CM = np.uint64(15 | (7 << 40))  # a multi-symbol entry's bit count and symbol count (kernels.huffman)
_M57 = np.uint64((1 << 57) - 1)
_B57 = np.uint64(1 << 57)
_U0 = np.uint64(0)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S29 = np.uint64(29)
_C1 = np.uint64(0x9E3779B97F4A7C15)
_C3 = np.uint64(0xD6E8FEB86659FD93)
_C2 = np.uint64(0xBF58476D1CE4E5B9)


@njit(nogil=True, cache=True)
def _i4(a, b, c, d):
    """The 4 per-state values of an interleaved coder as an int64 array (its scalar tail loops index them)."""
    out = np.empty(4, np.int64)
    out[0], out[1], out[2], out[3] = a, b, c, d
    return out


@njit(nogil=True, cache=True)
def _u4(a, b, c, d):
    """As _i4, uint64."""
    out = np.empty(4, np.uint64)
    out[0], out[1], out[2], out[3] = a, b, c, d
    return out


@njit(nogil=True, cache=True)
def _fold(s1, s2):
    a = (s1 ^ (s1 >> _S32)) & _M32
    b = (s2 ^ (s2 >> _S32)) & _M32
    return a | (b << _S32)


# ---------------------------------------------------------------------------
# checksums and stream grouping
#
# Chunk checksum over the n units v_i (unsigned, zero-extended to 64 bits),
# all arithmetic mod 2^64, i = index of the unit inside the chunk:
#   s1 = sum(v_i)
#   s2 = sum(mix(v_i, i)),  mix(v, i) = x ^ (x >> 29),  x = (v ^ (i * C3)) * C1
#   chk = fold(s1) | fold(s2) << 32,   fold(x) = (x ^ (x >> 32)) & 0xFFFFFFFF
# C1 = 0x9E3779B97F4A7C15, C3 = 0xD6E8FEB86659FD93.  s1 catches every
# single-unit error; the non-linear s2 catches structured multi-unit errors
# (a purely linear Fletcher-style sum misses e.g. +d,-d,-d,+d patterns).
# Both are plain reductions, so the loops vectorize.  Format 4 takes the
# same sums over the chunk's 64-bit little-endian words instead of its units
# (the last word zero-padded, i = the word's index): one multiply per 8 bytes
# instead of one per unit, ~4x less work on bf16 (_csum_words).
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def copy_bytes(dst, d0, src, s0, n):
    """dst[d0:d0+n] = src[s0:s0+n] (slices first: Numba's slice assignment
    and offset-indexed loops do not vectorize)."""
    d = dst[d0:d0 + n]
    s = src[s0:s0 + n]
    n8 = n >> 3
    d8 = d[:n8 * 8].view(np.uint64)
    s8 = s[:n8 * 8].view(np.uint64)
    for i in range(n8):
        d8[i] = s8[i]
    for i in range(n8 * 8, n):
        d[i] = s[i]


@njit(nogil=True, cache=True)
def _csum(d, n):
    # i * C3 as an induction variable (ic += C3): no multiply by i, and the
    # loop vectorizes (~28% faster than recomputing i * C3)
    s1 = _U0
    s2 = _U0
    ic = _U0
    for i in range(n):
        v = np.uint64(d[i])
        s1 += v
        x = (v ^ ic) * _C1
        ic += _C3
        s2 += x ^ (x >> _S29)
    return _fold(s1, s2)


@njit(nogil=True, cache=True)
def _mix(v, ic, wk):
    """The s2 term of word v at index multiple ic (wk as ck_mode).  Format 4: x ^ x >> 29 of x = (v ^ ic) * C1;
    format 5 (wk 2) with x ^= x >> 32, x *= C2 between (format 4's lets bit 63 of v reach only bits 63 and 34 of
    the mix, so an even number of flips of words' top bits, a bf16 sign every 4th element, can cancel); format 8
    (wk 3): lo(x) * hi(x) of x = v ^ ic, the two 32-bit halves' product, one vector multiply for four words where
    format 5 takes six (AVX2 has no 64-bit multiply), its sum mixed once per chunk (_fold_w)."""
    if wk >= 3:
        x = v ^ ic
        return (x & _M32) * (x >> _S32)
    x = (v ^ ic) * _C1
    if wk == 2:
        x ^= x >> _S32
        x *= _C2
    return x ^ (x >> _S29)


@njit(nogil=True, cache=True)
def _mix_add(s2, v, ic, wk):
    return s2 + _mix(v, ic, wk)


@njit(nogil=True, cache=True)
def _fold_w(s1, s2, wk):
    """chk of the word sums: format 8 mixes s2 (format 5's strong mix at index 0, a bijection) before folding, so
    that a change of its sum reaches both halves."""
    if wk >= 3:
        s2 = _mix(s2, _U0, 2)
    return _fold(s1, s2)


@njit(nogil=True, cache=True)
def csum_sums(b, nb, i0, s1, s2):
    """Format 8's checksum (wk 3) as its two sums, s1 and s2 (given) continued over the nb bytes b[:nb] as the words
    numbered i0, i0 + 1, ... (the last zero-padded): the checksum of words 0 .. is _fold_w(s1, s2, 3).  Local sums
    from 0, so that the loop vectorises."""
    n8 = nb >> 3
    d = b[:n8 * 8].view(np.uint64)
    t1 = _U0
    t2 = _U0
    ic = np.uint64(i0) * _C3
    for i in range(n8):
        v = d[i]
        t1 += v
        x = v ^ ic
        ic += _C3
        t2 += (x & _M32) * (x >> _S32)
    if nb > n8 * 8:
        v = _U0
        for j in range(nb - n8 * 8):
            v |= np.uint64(b[n8 * 8 + j]) << np.uint64(8 * j)
        t1 += v
        t2 = _mix_add(t2, v, ic, 3)
    return s1 + t1, s2 + t2


@njit(nogil=True, cache=True)
def _csum_words(b, nb, wk):
    """The checksum of the nb bytes b[:nb] over their 64-bit little-endian words (the last zero-padded), i = the
    word's index: format 4 (wk 1), 5 (wk 2, the strong mix) or 8 (wk 3, the halves' product).  A quarter of the
    per-unit work on 16-bit units, half on 32-bit ones.  One loop per mix: a branch inside would keep the loop
    from vectorising."""
    if wk >= 3:
        s1, s2 = csum_sums(b, nb, 0, _U0, _U0)
        return _fold_w(s1, s2, wk)
    n8 = nb >> 3
    d = b[:n8 * 8].view(np.uint64)
    s1 = _U0
    s2 = _U0
    ic = _U0
    if wk == 2:
        for i in range(n8):
            v = d[i]
            s1 += v
            x = (v ^ ic) * _C1
            ic += _C3
            x ^= x >> _S32
            x *= _C2
            s2 += x ^ (x >> _S29)
    else:
        for i in range(n8):
            v = d[i]
            s1 += v
            x = (v ^ ic) * _C1
            ic += _C3
            s2 += x ^ (x >> _S29)
    if nb > n8 * 8:
        v = _U0
        for j in range(nb - n8 * 8):
            v |= np.uint64(b[n8 * 8 + j]) << np.uint64(8 * j)
        s1 += v
        s2 = _mix_add(s2, v, ic, wk)
    return _fold_w(s1, s2, wk)


@njit(nogil=True, cache=True)
def ck_mode(version):
    """The checksum of a format version: 0 over units (1-3), 1 over words (4),
    2 over words with the strong mix (5-7), 3 over words with the halves' product (8)."""
    return 0 if version < 4 else (1 if version == 4 else (2 if version < 8 else 3))


@njit(nogil=True, cache=True)
def checksum_units(data, start, n, unit, wk):
    """The checksum of the chunk of n units from unit index start: over its
    units (wk 0: format versions 1-3) or over its 64-bit words (wk 1: version
    4; wk 2: versions 5-7, the strong mix; wk 3: version 8).  See ck_mode."""
    base = start * unit
    if wk:
        return _csum_words(data[base:base + n * unit], n * unit, wk)
    if unit == 1:
        return _csum(data[base:base + n], n)
    if unit == 2:
        return _csum(data[base:base + 2 * n].view(np.uint16), n)
    if unit == 4:
        return _csum(data[base:base + 4 * n].view(np.uint32), n)
    return _csum(data[base:base + 8 * n].view(np.uint64), n)


@njit(nogil=True, cache=True)
def xor_into(dst, a, b, off, nbytes):
    """dst[:nbytes] = a[off:off+nbytes] ^ b[off:off+nbytes] (8 bytes at a time)."""
    n8 = nbytes >> 3
    d8 = dst[:n8 * 8].view(np.uint64)
    a8 = a[off:off + n8 * 8].view(np.uint64)
    b8 = b[off:off + n8 * 8].view(np.uint64)
    for i in range(n8):
        d8[i] = a8[i] ^ b8[i]
    for i in range(n8 * 8, nbytes):
        dst[i] = a[off + i] ^ b[off + i]


@njit(nogil=True, cache=True)
def split_units(src, n, unit, layout, planes):
    """Split the n units of src (uint8, n*unit bytes) into byte planes."""
    if layout == LAYOUT_BF16:
        d = src[:2 * n].view(np.uint16)
        p0 = planes[0]
        p1 = planes[1]
        for i in range(n):
            v = d[i]
            p0[i] = np.uint8((v >> 7) & 0xFF)
            p1[i] = np.uint8(((v >> 8) & 0x80) | (v & 0x7F))
    elif layout == LAYOUT_F16:
        d = src[:2 * n].view(np.uint16)
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        for i in range(n):
            v = d[i]
            p0[i] = np.uint8((v >> 10) & 0x1F)
            p1[i] = np.uint8(((v >> 13) & 0x4) | ((v >> 8) & 0x3))
            p2[i] = np.uint8(v & 0xFF)
    elif layout == LAYOUT_F32:
        d = src[:4 * n].view(np.uint32)
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        p3 = planes[3]
        for i in range(n):
            v = d[i]
            p0[i] = np.uint8((v >> 23) & 0xFF)
            p1[i] = np.uint8(((v >> 24) & 0x80) | ((v >> 16) & 0x7F))
            p2[i] = np.uint8((v >> 8) & 0xFF)
            p3[i] = np.uint8(v & 0xFF)
    else:
        for j in range(unit):
            p = planes[j]
            for i in range(n):
                p[i] = src[i * unit + j]


@njit(nogil=True, cache=True)
def split_chunk(data, ref, use_ref, start, n, unit, layout, planes, wk):
    """Split n units (from unit index start) into planes[s, :n], XORed with
    ref first when use_ref.  Returns the checksum of the ORIGINAL units (wk:
    format 4's, over words)."""
    base = start * unit
    chk = checksum_units(data, start, n, unit, wk)
    if use_ref:
        tmp = np.empty(n * unit, np.uint8)
        xor_into(tmp, data, ref, base, n * unit)
        split_units(tmp, n, unit, layout, planes)
    else:
        split_units(data[base:base + n * unit], n, unit, layout, planes)
    return chk


@njit(nogil=True, cache=True)
def merge_units(planes, n, unit, layout, dst):
    """Inverse of split_units: write n units to dst (uint8, n*unit bytes)."""
    if layout == LAYOUT_BF16:
        merge_bf16(planes[0], planes[1], n, dst[:2 * n].view(np.uint16))
    elif layout == LAYOUT_F16:
        d = dst[:2 * n].view(np.uint16)
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        for i in range(n):
            a = np.uint16(p1[i])
            d[i] = np.uint16(((a & 0x4) << 13) | ((np.uint16(p0[i]) & 0x1F) << 10)
                             | ((a & 0x3) << 8) | np.uint16(p2[i]))
    elif layout == LAYOUT_F32:
        merge_f32(planes[0], planes[1], planes[2], planes[3], n, dst[:4 * n].view(np.uint32))
    else:
        for j in range(unit):
            p = planes[j]
            for i in range(n):
                dst[i * unit + j] = p[i]


@njit(nogil=True, cache=True)
def merge_bf16(p0, p1, n, d):
    """merge_units for bf16 from any two planes (p1 may be a raw stream's
    bytes in the blob itself): d (uint16[n])."""
    for i in range(n):
        sm = np.uint16(p1[i])
        d[i] = np.uint16(((sm & 0x80) << 8) | (np.uint16(p0[i]) << 7) | (sm & 0x7F))


@njit(nogil=True, cache=True)
def merge_f32(p0, p1, p2, p3, n, d):
    """merge_units for fp32 from any four planes (p1..p3 may be raw streams' bytes in the blob itself): d
    (uint32[n])."""
    for i in range(n):
        a = np.uint32(p1[i])
        d[i] = np.uint32(((a & 0x80) << 24) | (np.uint32(p0[i]) << 23) | ((a & 0x7F) << 16)
                         | (np.uint32(p2[i]) << 8) | np.uint32(p3[i]))


@njit(nogil=True, cache=True)
def merge_chunk(planes, n, out, ref, use_ref, start, unit, layout, wk):
    """Write the chunk's n units to out (XOR with ref when use_ref) and
    return the checksum of the written units (wk as checksum_units)."""
    base = start * unit
    nb = n * unit
    dst = out[base:base + nb]
    merge_units(planes, n, unit, layout, dst)
    if use_ref:
        xor_into(dst, dst, ref[base:base + nb], 0, nb)
    return checksum_units(out, start, n, unit, wk)


@njit(nogil=True, cache=True)
def _slow_load(buf, st, L, byte):
    acc = _U0
    for j in range(8):
        if byte + j < L:
            acc |= np.uint64(buf[st + byte + j]) << np.uint64(8 * j)
    return acc



@njit(nogil=True, cache=True)
def nonzero_range(a, c0, nsym):
    """(lo, hi): the first and last s < nsym with a[c0 + s] != 0 (one must be)."""
    lo = 0
    while a[c0 + lo] == 0:
        lo += 1
    hi = nsym - 1
    while a[c0 + hi] == 0:
        hi -= 1
    return lo, hi


# histogram counts are kept in 4 partial tables (element i in table i % 4):
# consecutive elements never wait on each other's increment
@njit(nogil=True, cache=True)
def _inc(h, j):
    put(h, j, ld(h, j) + 1)


# the checksum of a chunk of one repeated unit (the structural pre-pass
# verifies constant chunks without writing them)
@njit(nogil=True, cache=True)
def _csum_fill(r, n, v, use_ref):
    """The chunk checksum of n units all equal to v (XORed with r[i] when
    use_ref) without materialising them."""
    s1 = _U0
    s2 = _U0
    ic = _U0
    for i in range(n):
        u = v
        if use_ref:
            u = np.uint64(r[i]) ^ v
        s1 += u
        s2 += _mix(u, ic, 1)
        ic += _C3
    return _fold(s1, s2)


@njit(nogil=True, cache=True)
def _csum_fill_words(r, nb, p, use_ref, wk):
    """The word checksum (wk as ck_mode) of nb bytes whose every
    64-bit word is p (XORed with r's words when use_ref), without
    materialising them."""
    n8 = nb >> 3
    s1 = _U0
    s2 = _U0
    ic = _U0
    d = r[:n8 * 8 if use_ref else 0].view(np.uint64)
    for i in range(n8):
        u = p
        if use_ref:
            u = d[i] ^ p
        s1 += u
        s2 += _mix(u, ic, wk)
        ic += _C3
    rem = nb - n8 * 8
    if rem > 0:
        u = p
        if use_ref:
            for j in range(rem):
                u ^= np.uint64(r[n8 * 8 + j]) << np.uint64(8 * j)
        u &= (np.uint64(1) << np.uint64(8 * rem)) - np.uint64(1)
        s1 += u
        s2 = _mix_add(s2, u, ic, wk)
    return _fold_w(s1, s2, wk)


@njit(nogil=True, cache=True)
def checksum_fill(ref, use_ref, start, n, unit, v, wk):
    """The checksum (wk as checksum_units) of n units all equal to v (XORed with
    ref's units from unit index start when use_ref)."""
    base = start * unit
    if wk:
        p = _U0
        for j in range(8 // unit):  # units are 1, 2, 4 or 8 bytes: every word is the same
            p |= v << np.uint64(8 * unit * j)
        return _csum_fill_words(ref[base:base + n * unit] if use_ref else ref[0:0], n * unit, p, use_ref, wk)
    if not use_ref:
        return _csum_fill(ref[0:0], n, v, False)
    if unit == 1:
        return _csum_fill(ref[base:base + n], n, v, True)
    if unit == 2:
        return _csum_fill(ref[base:base + 2 * n].view(np.uint16), n, v, True)
    if unit == 4:
        return _csum_fill(ref[base:base + 4 * n].view(np.uint32), n, v, True)
    return _csum_fill(ref[base:base + 8 * n].view(np.uint64), n, v, True)


# the monotone map of sign-magnitude units (the temporal and delta modes)
@njit(nogil=True, cache=True)
def _mono(v, sb, mask):
    """Sign-magnitude bits -> monotone integer (branchless)."""
    return v ^ sb ^ (-np.int64((v & sb) != 0) & (sb - 1))


@njit(nogil=True, cache=True)
def _unmono(m, sb, mask):
    """Inverse of _mono (branchless)."""
    return m ^ sb ^ (-np.int64((m & sb) == 0) & (sb - 1))


# log2 of a count, looked up below LOG2_K (the estimates from samples take one per count: a call of log2 each was
# two thirds of the temporal mode's sampled estimate on fp32 weights)
@njit(nogil=True, cache=True)
def _log2_table(k):
    """log2(c) for c < k, by the compiled code's own log2 (what log2_count computes above the table)."""
    t = np.zeros(k, np.float64)
    for c in range(1, k):
        t[c] = np.log2(np.float64(c))
    return t


LOG2_K = 4097   # (a chunk of 2^17 elements samples 4,096)
_LOG2 = _log2_table(LOG2_K)   # (a constant of the compiled kernels)


@njit(inline="always")
def log2_count(c):
    """log2 of a count c >= 1."""
    return _LOG2[c] if c < LOG2_K else np.log2(np.float64(c))
