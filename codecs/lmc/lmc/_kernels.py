"""Numba kernels of the lmc codec.

All kernels are serial ``@njit(nogil=True, cache=True)`` functions (compiled
once, cached on disk).  Parallelism comes from running the chunk-range
drivers at the bottom on several Python threads (they release the GIL); see
README for why ``parallel=True``/``prange`` drivers were not used (they cannot
be cached and re-optimise the whole inlined call tree on every process start:
~10 s per process).

All data buffers are flat ``uint8`` arrays; elements ("units") of 1, 2, 4 or
8 bytes are read with unaligned little-endian loads (see ``_intrinsics``).

Memory safety: every kernel that reads a compressed blob validates each
length/offset against the chunk end *before* touching memory, and the
Huffman decoder only uses wide loads where the 8 bytes are known to lie
inside the sub-stream (slow byte-wise refill otherwise).
"""
import numpy as np
from numba import njit

from ._intrinsics import (clz64, f64_bits, ld, load_u16, load_u32, load_u64, mulhi64, store_u16,
                          store_u32, store_u64)
from ._intrinsics import st as put

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

ERROR_MESSAGES = {
    ERR_TRUNC: "chunk data truncated (a length points past the end of the chunk)",
    ERR_FLAGS: "invalid chunk flags byte",
    ERR_NOREF: "chunk is delta-coded but no reference is available",
    ERR_MODE: "invalid stream mode",
    ERR_LEN: "stream or chunk payload length inconsistent with its mode",
    ERR_TABLE: "invalid Huffman table header",
    ERR_KRAFT: "invalid Huffman code lengths (length > 11 or Kraft sum != 1)",
    ERR_STREAM: "Huffman bit stream overrun or length mismatch",
    ERR_PAD: "non-zero padding bits at the end of a Huffman bit stream",
    ERR_TRAIL: "unused trailing bytes in chunk",
    ERR_CHECKSUM: "chunk checksum mismatch (corrupt data or wrong reference)",
    ERR_VERSION: "chunk or stream mode not allowed in a format-version-1 blob",
    ERR_FREQ: "invalid rANS frequency table (bad range, encoding, or sum != 4096)",
    ERR_RANS: "rANS stream overrun/underrun or final state mismatch",
    ERR_CTX: "temporal chunk: context tables do not match the reference's contexts",
    ERR_BITS: "raw bit stream overrun, length mismatch or non-zero padding",
}

_M11 = np.uint64(TABSIZE - 1)
_M63 = np.uint64(63)
_M15 = np.uint64(15)
_M3 = np.uint64(3)
_S8 = np.uint64(8)
_CM = np.uint64(15 | (3 << 32))
_M57 = np.uint64((1 << 57) - 1)
_B57 = np.uint64(1 << 57)
_U0 = np.uint64(0)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S29 = np.uint64(29)
_C1 = np.uint64(0x9E3779B97F4A7C15)
_C3 = np.uint64(0xD6E8FEB86659FD93)


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
# Both are plain reductions, so the loops vectorize.
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
def checksum_units(data, start, n, unit):
    base = start * unit
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
def split_chunk(data, ref, use_ref, start, n, unit, layout, planes):
    """Split n units (from unit index start) into planes[s, :n], XORed with
    ref first when use_ref.  Returns the checksum of the ORIGINAL units."""
    base = start * unit
    chk = checksum_units(data, start, n, unit)
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
        d = dst[:2 * n].view(np.uint16)
        p0 = planes[0]
        p1 = planes[1]
        for i in range(n):
            sm = np.uint16(p1[i])
            d[i] = np.uint16(((sm & 0x80) << 8) | (np.uint16(p0[i]) << 7) | (sm & 0x7F))
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
        d = dst[:4 * n].view(np.uint32)
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        p3 = planes[3]
        for i in range(n):
            a = np.uint32(p1[i])
            d[i] = np.uint32(((a & 0x80) << 24) | (np.uint32(p0[i]) << 23) | ((a & 0x7F) << 16)
                             | (np.uint32(p2[i]) << 8) | np.uint32(p3[i]))
    else:
        for j in range(unit):
            p = planes[j]
            for i in range(n):
                dst[i * unit + j] = p[i]


@njit(nogil=True, cache=True)
def merge_chunk(planes, n, out, ref, use_ref, start, unit, layout):
    """Write the chunk's n units to out (XOR with ref when use_ref) and
    return the checksum of the written units."""
    base = start * unit
    nb = n * unit
    dst = out[base:base + nb]
    merge_units(planes, n, unit, layout, dst)
    if use_ref:
        xor_into(dst, dst, ref[base:base + nb], 0, nb)
    return checksum_units(out, start, n, unit)


# ---------------------------------------------------------------------------
# Huffman code construction
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def histo4(p, n, h):
    """h[k, s] += count of symbol s at positions i with i % 4 == k."""
    n4 = n & ~3
    for i in range(0, n4, 4):
        h[0, p[i]] += 1
        h[1, p[i + 1]] += 1
        h[2, p[i + 2]] += 1
        h[3, p[i + 3]] += 1
    for i in range(n4, n):
        h[i & 3, p[i]] += 1


@njit(nogil=True, cache=True)
def _package_merge(w, m, depth):
    """Optimal length-limited (<= MAXLEN) code lengths by package-merge
    (Larmore-Hirschberg).  w: the m >= 2 (m <= 2^MAXLEN) weights sorted
    ascending; writes depth[i] = code length of leaf i (non-increasing in
    i, Kraft sum exactly 1).

    List l (l = MAXLEN-1 .. 0, list MAXLEN-1 = the leaves) merges the leaves
    with the pairs ("packages") of consecutive items of list l+1; no list
    needs more than 2m-2 items.  nl[l, k] = leaves among the first k items
    of list l.  Selecting the first 2m-2 items of list 0 and following the
    packages down, leaf i's length is the number of lists in which it is
    selected (selected leaves are always a prefix of the sorted leaves)."""
    cap = 2 * m - 2
    wt = np.empty((MAXLEN, cap), np.int64)
    nl = np.empty((MAXLEN, cap + 1), np.int64)
    cnt = np.empty(MAXLEN, np.int64)
    last = MAXLEN - 1
    nl[last, 0] = 0
    for i in range(m):
        wt[last, i] = w[i]
        nl[last, i + 1] = i + 1
    cnt[last] = m
    for lev in range(last - 1, -1, -1):
        npk = cnt[lev + 1] >> 1
        i = 0
        j = 0
        k = 0
        nl[lev, 0] = 0
        while k < cap and (i < m or j < npk):
            if j < npk:
                pw = wt[lev + 1, 2 * j] + wt[lev + 1, 2 * j + 1]
                if i < m and w[i] <= pw:
                    wt[lev, k] = w[i]
                    i += 1
                else:
                    wt[lev, k] = pw
                    j += 1
            else:
                wt[lev, k] = w[i]
                i += 1
            k += 1
            nl[lev, k] = i
        cnt[lev] = k
    for i in range(m):
        depth[i] = 0
    k = cap
    for lev in range(MAXLEN):
        c = nl[lev, k]
        for i in range(c):
            depth[i] += 1
        k = 2 * (k - c)


@njit(nogil=True, cache=True)
def huffman_lengths(freq, lens):
    """Length-limited (<= 11) Huffman code lengths for 256 symbol
    frequencies.  Writes lens (uint8[256], 0 = absent) and returns the number
    of present symbols.  With >= 2 symbols the code is complete (Kraft sum
    exactly 1).  A plain Huffman code (two-queue construction) is used when
    its depth fits; otherwise the optimal length-limited code is computed
    by package-merge (an encoder choice only: any complete code with
    lengths <= 11 is valid)."""
    m = 0
    for s in range(256):
        lens[s] = 0
        if freq[s] > 0:
            m += 1
    if m <= 1:
        return m
    keys = np.empty(m, np.int64)
    w = np.empty(m, np.int64)
    sym = np.empty(m, np.int64)
    iw = np.empty(m, np.int64)
    par_leaf = np.empty(m, np.int64)
    par_int = np.empty(m, np.int64)
    dep_int = np.empty(m, np.int64)
    j = 0
    for s in range(256):
        if freq[s] > 0:
            keys[j] = np.int64(freq[s]) * 256 + s
            j += 1
    keys.sort()
    for i in range(m):
        w[i] = keys[i] >> 8
        sym[i] = keys[i] & 255
    i = 0
    j = 0
    for k in range(m - 1):
        if i < m and (j >= k or w[i] <= iw[j]):
            a = w[i]
            par_leaf[i] = k
            i += 1
        else:
            a = iw[j]
            par_int[j] = k
            j += 1
        if i < m and (j >= k or w[i] <= iw[j]):
            b = w[i]
            par_leaf[i] = k
            i += 1
        else:
            b = iw[j]
            par_int[j] = k
            j += 1
        iw[k] = a + b
    dep_int[m - 2] = 0
    for k in range(m - 3, -1, -1):
        dep_int[k] = dep_int[par_int[k]] + 1
    maxd = 0
    for i in range(m):
        d = dep_int[par_leaf[i]] + 1
        if d > maxd:
            maxd = d
    if maxd <= MAXLEN:
        for i in range(m):
            lens[sym[i]] = dep_int[par_leaf[i]] + 1
        return m
    _package_merge(w, m, dep_int)
    for i in range(m):
        lens[sym[i]] = dep_int[i]
    return m


@njit(nogil=True, cache=True)
def canonical_codes(lens, codes):
    """Canonical (deflate-style) codes, returned bit-reversed (LSB-first) in
    codes (uint64[256])."""
    bl = np.zeros(MAXLEN + 2, np.int64)
    for s in range(256):
        if lens[s] > 0:
            bl[lens[s]] += 1
    nxt = np.zeros(MAXLEN + 2, np.int64)
    code = 0
    for b in range(1, MAXLEN + 1):
        code = (code + bl[b - 1]) << 1
        nxt[b] = code
    for s in range(256):
        L = np.int64(lens[s])
        if L > 0:
            c = nxt[L]
            nxt[L] += 1
            r = 0
            for t in range(L):
                r = (r << 1) | ((c >> t) & 1)
            codes[s] = np.uint64(r)
        else:
            codes[s] = _U0


@njit(nogil=True, cache=True)
def build_decode_table(lens, dec):
    """Fill dec (uint16[2048], entry = symbol | length << 8).  Returns False
    if a length exceeds 11 or the Kraft sum is not exactly 1."""
    kraft = 0
    for s in range(256):
        L = np.int64(lens[s])
        if L > MAXLEN:
            return False
        if L > 0:
            kraft += 1 << (MAXLEN - L)
    if kraft != TABSIZE:
        return False
    codes = np.empty(256, np.uint64)
    canonical_codes(lens, codes)
    for s in range(256):
        L = np.int64(lens[s])
        if L > 0:
            e = np.uint16(s | (L << 8))
            for idx in range(np.int64(codes[s]), TABSIZE, 1 << L):
                dec[idx] = e
    return True


# ---------------------------------------------------------------------------
# stream analysis / encoding
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _huff_sub_bytes(h, lens, sub):
    total = 0
    for k in range(4):
        bits = 0
        for s in range(256):
            bits += h[k, s] * np.int64(lens[s])
        sub[k] = (bits + 7) >> 3
        total += sub[k]
    return total


@njit(nogil=True, cache=True)
def _table_bytes(lens):
    lo = 0
    while lens[lo] == 0:
        lo += 1
    hi = 255
    while lens[hi] == 0:
        hi -= 1
    return 2 + (hi - lo + 2) // 2


@njit(nogil=True, cache=True)
def analyze_planes(planes, n, ns, h, lens, modes, sizes, f, cm, allow_rans):
    """Count the symbols of each plane per sub-stream into h (zeroed by the
    caller), then analyze_hist."""
    for s in range(ns):
        histo4(planes[s], n, h[s])
    return analyze_hist(h, n, ns, lens, modes, sizes, f, cm, allow_rans)


@njit(nogil=True, cache=True)
def analyze_hist(h, n, ns, lens, modes, sizes, f, cm, allow_rans):
    """Choose a mode per stream from its counts h[s, sub-stream, symbol];
    returns the total payload size (incl. the 5-byte stream headers).
    Huffman and raw sizes are exact; the rANS size (f, cm: its quantised
    table per stream at s * 256) is estimated from the quantised
    frequencies and is taken only when it saves more than 1/RANS_MARGIN of
    the faster choice plus RANS_SLACK bytes."""
    freq = np.empty(256, np.int64)
    sub = np.empty(4, np.int64)
    total = 0
    for s in range(ns):
        for c in range(256):
            freq[c] = h[s, 0, c] + h[s, 1, c] + h[s, 2, c] + h[s, 3, c]
        m = huffman_lengths(freq, lens[s])
        if m == 1:
            modes[s] = MODE_CONST
            sizes[s] = 1
        else:
            hs = _table_bytes(lens[s]) + 12 + _huff_sub_bytes(h[s], lens[s], sub)
            if hs < n:
                modes[s] = MODE_HUFF
                sizes[s] = hs
            else:
                modes[s] = MODE_RAW
                sizes[s] = n
            if allow_rans:
                rans_normalize(freq, 0, 256, f[256 * s:256 * s + 256])
                fs = f[256 * s:256 * s + 256]
                rs = (freq_table_bytes(fs, 0, 256) + 16
                      + np.int64(np.ceil(rans_cost_bits(freq, fs, 0, 256) / 8)))
                if rs + RANS_SLACK + sizes[s] // RANS_MARGIN < sizes[s]:
                    modes[s] = MODE_RANS
                    sizes[s] = rs
                    cum_freqs(fs, 0, cm[256 * s:256 * s + 256])
        total += 5 + sizes[s]
    return total


@njit(nogil=True, cache=True)
def _encode4(p, n, codes, lens, out, o, sub):
    """Encode the n symbols of p into 4 interleaved LSB-first sub-streams
    (symbol i -> sub-stream i % 4) written back to back at out[o:], whose
    exact byte sizes sub[0..3] are known in advance.  Never writes outside
    [o, o + sum(sub)).  Returns the end position (or -1 on a size mismatch,
    which would be an internal error)."""
    ct = np.empty(256, np.uint64)  # code | length << 32
    for c in range(256):
        ct[c] = codes[c] | (np.uint64(lens[c]) << _S32)
    q0 = o
    en0 = q0 + sub[0]
    q1 = en0
    en1 = q1 + sub[1]
    q2 = en1
    en2 = q2 + sub[2]
    q3 = en2
    en3 = q3 + sub[3]
    a0 = _U0
    a1 = _U0
    a2 = _U0
    a3 = _U0
    n0 = 0
    n1 = 0
    n2 = 0
    n3 = 0
    nblk = n >> 4
    j = 0
    while j < nblk:
        # the 8-byte stores below must stay inside each sub-stream
        if q0 + 8 > en0 or q1 + 8 > en1 or q2 + 8 > en2 or q3 + 8 > en3:
            break
        i = 16 * j
        for t in range(4):
            e0 = ld(ct, ld(p, i + 4 * t))
            e1 = ld(ct, ld(p, i + 4 * t + 1))
            e2 = ld(ct, ld(p, i + 4 * t + 2))
            e3 = ld(ct, ld(p, i + 4 * t + 3))
            a0 |= (e0 & _M32) << np.uint64(n0)
            a1 |= (e1 & _M32) << np.uint64(n1)
            a2 |= (e2 & _M32) << np.uint64(n2)
            a3 |= (e3 & _M32) << np.uint64(n3)
            n0 += np.int64(e0 >> _S32)
            n1 += np.int64(e1 >> _S32)
            n2 += np.int64(e2 >> _S32)
            n3 += np.int64(e3 >> _S32)
        store_u64(out, q0, a0)
        store_u64(out, q1, a1)
        store_u64(out, q2, a2)
        store_u64(out, q3, a3)
        q0 += n0 >> 3
        q1 += n1 >> 3
        q2 += n2 >> 3
        q3 += n3 >> 3
        a0 >>= np.uint64(n0 & ~7)
        a1 >>= np.uint64(n1 & ~7)
        a2 >>= np.uint64(n2 & ~7)
        a3 >>= np.uint64(n3 & ~7)
        n0 &= 7
        n1 &= 7
        n2 &= 7
        n3 &= 7
        j += 1
    qs = np.empty(4, np.int64)
    qs[0] = q0
    qs[1] = q1
    qs[2] = q2
    qs[3] = q3
    accs = np.empty(4, np.uint64)
    accs[0] = a0
    accs[1] = a1
    accs[2] = a2
    accs[3] = a3
    nbs = np.empty(4, np.int64)
    nbs[0] = n0
    nbs[1] = n1
    nbs[2] = n2
    nbs[3] = n3
    ens = np.empty(4, np.int64)
    ens[0] = en0
    ens[1] = en1
    ens[2] = en2
    ens[3] = en3
    for k in range(4):
        q = qs[k]
        acc = accs[k]
        nb = nbs[k]
        for i in range(16 * j + k, n, 4):
            c = p[i]
            acc |= codes[c] << np.uint64(nb)
            nb += lens[c]
            while nb >= 8:
                out[q] = np.uint8(acc & np.uint64(0xFF))
                q += 1
                acc >>= np.uint64(8)
                nb -= 8
        if nb > 0:
            out[q] = np.uint8(acc & np.uint64(0xFF))
            q += 1
        if q != ens[k]:
            return -1
    return en3


@njit(nogil=True, cache=True)
def _write_stream(p, n, mode, size, h, lens, f, cm, out, o, lim, tbuf):
    """Write one stream record at out[o:]; returns the end, or -1 if it
    would pass lim (the rANS size is only known after encoding)."""
    if mode == MODE_RANS:
        tb = freq_table_bytes(f, 0, 256)
        q = rans_encode(p, p, False, n, f, cm, tbuf)
        R = tbuf.size - q
        if o + 5 + tb + R > lim:
            return -1
        out[o] = mode
        store_u32(out, o + 1, np.uint32(tb + R))
        o = write_freq_table(f, 0, 256, out, o + 5)
        copy_bytes(out, o, tbuf, q, R)
        return o + R
    if o + 5 + size > lim:
        return -1
    out[o] = mode
    store_u32(out, o + 1, np.uint32(size))
    o += 5
    if mode == MODE_RAW:
        copy_bytes(out, o, p, 0, n)
        return o + n
    if mode == MODE_CONST:
        out[o] = p[0]
        return o + 1
    lo = 0
    while lens[lo] == 0:
        lo += 1
    hi = 255
    while lens[hi] == 0:
        hi -= 1
    out[o] = lo
    out[o + 1] = hi
    o += 2
    cnt = hi - lo + 1
    nbt = (cnt + 1) // 2
    for j in range(nbt):
        a = lens[lo + 2 * j]
        b = 0
        if 2 * j + 1 < cnt:
            b = lens[lo + 2 * j + 1]
        out[o + j] = np.uint8(a | (b << 4))
    o += nbt
    sub = np.empty(4, np.int64)
    _huff_sub_bytes(h, lens, sub)
    store_u32(out, o, np.uint32(sub[0]))
    store_u32(out, o + 4, np.uint32(sub[1]))
    store_u32(out, o + 8, np.uint32(sub[2]))
    o += 12
    codes = np.empty(256, np.uint64)
    canonical_codes(lens, codes)
    ln = np.empty(256, np.int64)
    for s in range(256):
        ln[s] = lens[s]
    return _encode4(p, n, codes, ln, out, o, sub)


@njit(nogil=True, cache=True)
def _write_planes(flag, planes, n, ns, modes, sizes, h, lens, f, cm, out, o, lim, tbuf):
    """Chunk mode byte + the ns stream records; -1 if past lim."""
    if o + 1 > lim:
        return -1
    out[o] = flag
    o += 1
    for s in range(ns):
        o = _write_stream(planes[s], n, modes[s], sizes[s], h[s], lens[s],
                          f[256 * s:256 * s + 256], cm[256 * s:256 * s + 256], out, o, lim, tbuf)
        if o < 0:
            return -1
    return o


@njit(nogil=True, cache=True)
def _uses_rans(modes, ns):
    for s in range(ns):
        if modes[s] == MODE_RANS:
            return True
    return False


@njit(nogil=True, cache=True)
def encode_chunk(data, ref, has_ref, v2, start, n, unit, layout, ns, out, o, planes, planes2,
                 jb, low, th, ha, hx, thist, tf, tcm, tbuf, rbuf, kbt, et):
    """Encode one chunk at out[o:] (planes, planes2: ns x >= n scratch;
    temporal scratch (float layouts with a reference and v2): jb, low: n
    u16 / u32; th: int32[4 * NCTX * 65]; ha, hx: int32[ns * 1024]; thist,
    tf, tcm: NCTX * 256 int64; tbuf: >= 2n + 16 bytes; rbuf: >= n * unit
    bytes; kbt: uint8[NCTX * 65]; et: uint64[2 * NCTX * 65]; out must have
    4 bytes of room past o + n * unit).  v2: format-v2 modes allowed.  The
    mode is chosen from estimates: alone, XOR (with a reference) or temporal
    (with a reference, float layouts), the smallest estimate winning,
    temporal only when it saves more than 1/TEMPORAL_MARGIN (it decodes
    slower).  Returns (size, checksum, uses a v2 mode)."""
    h = np.zeros((ns, 4, 256), np.int64)
    lens = np.zeros((ns, 256), np.uint8)
    modes = np.empty(ns, np.int64)
    sizes = np.empty(ns, np.int64)
    f = np.zeros(ns * 256, np.int64)
    cm = np.zeros(ns * 256, np.int64)
    h2 = h
    lens2 = lens
    modes2 = modes
    sizes2 = sizes
    f2 = f
    cm2 = cm
    if has_ref:
        h2 = np.zeros((ns, 4, 256), np.int64)
        lens2 = np.zeros((ns, 256), np.uint8)
        modes2 = np.empty(ns, np.int64)
        sizes2 = np.empty(ns, np.int64)
        f2 = np.zeros(ns * 256, np.int64)
        cm2 = np.zeros(ns * 256, np.int64)
    E = 0
    cmask = 0
    raw = 0
    W = 32 if layout == LAYOUT_F32 else 16
    temporal = has_ref and v2 and layout != LAYOUT_PLANES
    nbytes = n * unit
    base = start * unit
    do_t = temporal
    do_x = has_ref
    cost_t = 0
    if temporal:
        # exact counts of the alone coding; the XOR and temporal codings are
        # estimated on a sample first and analysed exactly only where they
        # may win; the chosen mode is split into planes afterwards
        chk = checksum_units(data, start, n, unit)
        stream_count(data, ref, False, start, n, layout, ha)
        stream_hist(ha, ns, h)
        cost_a = analyze_hist(h, n, ns, lens, modes, sizes, f, cm, v2)
        E = temporal_base(ref, start, n, layout)
        est_t, est_x = temporal_sample(data, ref, start, n, layout, E, thist, tcm)
        do_t = est_t - est_t // 16 < cost_a
        if do_t:
            raw = temporal_count(data, ref, start, n, layout, E, jb, low, th)
            temporal_hist(th, W, thist)
            trans, cmask = temporal_estimate(thist, tf, tcm, W)
            cost_t = 3 + trans + 4 + ((raw + 7) >> 3)
        do_x = est_x - est_x // 16 < (min(cost_a, cost_t) if do_t else cost_a)
        cost_x = cost_a + 1
        if do_x:
            stream_count(data, ref, True, start, n, layout, hx)
            stream_hist(hx, ns, h2)
            cost_x = analyze_hist(h2, n, ns, lens2, modes2, sizes2, f2, cm2, v2)
    else:
        chk = split_chunk(data, ref, False, start, n, unit, layout, planes)
        cost_a = analyze_planes(planes, n, ns, h, lens, modes, sizes, f, cm, v2)
        cost_x = cost_a
        if has_ref:
            split_chunk(data, ref, True, start, n, unit, layout, planes2)
            cost_x = analyze_planes(planes2, n, ns, h2, lens2, modes2, sizes2, f2, cm2, v2)
    best = CHUNK_ALONE
    score = cost_a
    cost = cost_a
    if do_x and cost_x < score:
        best = CHUNK_XOR
        score = cost_x
        cost = cost_x
    if do_t:
        if cost_t + cost_t // TEMPORAL_MARGIN < score:
            best = CHUNK_TEMPORAL
            cost = cost_t
    o0 = o
    lim = o + nbytes  # an encoded chunk must be smaller than a stored one
    e = -1
    if cost < nbytes:
        if best == CHUNK_TEMPORAL:
            e = temporal_write(E, cmask, jb, low, n, W, tf, tcm, raw, out, o, lim, tbuf, kbt, et)
        elif best == CHUNK_XOR:
            if temporal:
                xor_into(rbuf, data, ref, base, nbytes)
                split_units(rbuf, n, unit, layout, planes2)
            e = _write_planes(CHUNK_XOR, planes2, n, ns, modes2, sizes2, h2, lens2, f2, cm2,
                              out, o, lim, tbuf)
        # never larger than the alone encoding (exact unless it uses rANS)
        if best != CHUNK_ALONE and (e < 0 or e - o0 > 1 + cost_a) and cost_a < nbytes:
            best = CHUNK_ALONE
            e = -1
        if best == CHUNK_ALONE:
            if temporal:
                split_units(data[base:base + nbytes], n, unit, layout, planes)
            e = _write_planes(CHUNK_ALONE, planes, n, ns, modes, sizes, h, lens, f, cm,
                              out, o, lim, tbuf)
    if e < 0:
        # stored chunk: the original units verbatim (never larger than input)
        out[o] = CHUNK_STORED
        copy_bytes(out, o + 1, data, base, nbytes)
        return 1 + nbytes, chk, False
    if best == CHUNK_TEMPORAL:
        used = True
    elif best == CHUNK_XOR:
        used = _uses_rans(modes2, ns)
    else:
        used = _uses_rans(modes, ns)
    return e - o0, chk, used


# ---------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _slow_load(buf, st, L, byte):
    acc = _U0
    for j in range(8):
        if byte + j < L:
            acc |= np.uint64(buf[st + byte + j]) << np.uint64(8 * j)
    return acc


@njit(nogil=True, cache=True)
def build_multi_table(dec, dec3):
    """From the single-symbol table build dec3 (uint64[2048]): up to 3
    symbols whose codes fit entirely in the 11 peeked bits.  Entry:
    total_bits | sym1 << 8 | sym2 << 16 | sym3 << 24 | count << 32 (bits
    4-7 are zero, so ``x & 63`` is the shift count)."""
    for idx in range(TABSIZE):
        e = np.int64(dec[idx])
        l1 = e >> 8
        syms = e & 255
        tot = l1
        cnt = 1
        rest = idx >> l1
        avail = MAXLEN - l1
        e2 = np.int64(dec[rest])
        l2 = e2 >> 8
        if l2 <= avail:
            syms |= (e2 & 255) << 8
            tot += l2
            cnt = 2
            avail -= l2
            rest >>= l2
            e3 = np.int64(dec[rest])
            l3 = e3 >> 8
            if l3 <= avail:
                syms |= (e3 & 255) << 16
                tot += l3
                cnt = 3
        dec3[idx] = np.uint64(tot | (syms << 8) | (cnt << 32))


@njit(nogil=True, cache=True)
def huff_decode4(buf, st, ln, dec, dec3, dec1, single, out, n, tmp):
    """Decode n symbols from 4 interleaved LSB-first sub-streams (symbol i in
    sub-stream i % 4); sub-stream k occupies buf[st[k] : st[k] + ln[k]].
    Sub-stream k is first decoded into tmp[k*r : k*r + (n+3-k)//4],
    r = (n+3)//4 + 16 (tmp needs 4*r bytes; the fast loop stores 4 bytes at
    a time, up to 3 past the last symbol), then interleaved into out[:n].
    single: every code is >= 6 bits long; then dec1 (uint16[2048], entry =
    length | symbol << 8) is used instead of dec3."""
    m = (n + 3) >> 2
    r = m + 16
    s0 = st[0]
    s1 = st[1]
    s2 = st[2]
    s3 = st[3]
    L0 = ln[0]
    L1 = ln[1]
    L2 = ln[2]
    L3 = ln[3]
    b0 = 0
    b1 = 0
    b2 = 0
    b3 = 0
    r0 = 0
    r1 = r
    r2 = 2 * r
    r3 = 3 * r
    # symbol counts of the sub-streams minus 15 (5 lookups of <= 3 symbols)
    e0 = ((n + 3) >> 2) - 15
    e1 = ((n + 2) >> 2) - 15
    e2 = ((n + 1) >> 2) - 15
    e3 = (n >> 2) - 15
    if single:
        # every code is >= 6 bits: one symbol per lookup, all readers advance
        # in lockstep (5 symbols per refill).  A sentinel bit above the 57
        # loaded bits gives the bits consumed: clz(a) - 6.
        u0 = tmp[0:r]
        u1 = tmp[r:2 * r]
        u2 = tmp[2 * r:3 * r]
        u3 = tmp[3 * r:4 * r]
        o = 0
        e = (n >> 2) - 5
        while (o <= e and (b0 >> 3) + 8 <= L0 and (b1 >> 3) + 8 <= L1
               and (b2 >> 3) + 8 <= L2 and (b3 >> 3) + 8 <= L3):
            a0 = ((load_u64(buf, s0 + (b0 >> 3)) >> np.uint64(b0 & 7)) & _M57) | _B57
            a1 = ((load_u64(buf, s1 + (b1 >> 3)) >> np.uint64(b1 & 7)) & _M57) | _B57
            a2 = ((load_u64(buf, s2 + (b2 >> 3)) >> np.uint64(b2 & 7)) & _M57) | _B57
            a3 = ((load_u64(buf, s3 + (b3 >> 3)) >> np.uint64(b3 & 7)) & _M57) | _B57
            for t in range(5):
                x0 = np.uint64(ld(dec1, a0 & _M11))
                x1 = np.uint64(ld(dec1, a1 & _M11))
                x2 = np.uint64(ld(dec1, a2 & _M11))
                x3 = np.uint64(ld(dec1, a3 & _M11))
                put(u0, o + t, x0 >> _S8)
                put(u1, o + t, x1 >> _S8)
                put(u2, o + t, x2 >> _S8)
                put(u3, o + t, x3 >> _S8)
                a0 >>= x0 & _M63
                a1 >>= x1 & _M63
                a2 >>= x2 & _M63
                a3 >>= x3 & _M63
            b0 += clz64(a0) - 6
            b1 += clz64(a1) - 6
            b2 += clz64(a2) - 6
            b3 += clz64(a3) - 6
            o += 5
        o0 = o
        o1 = o
        o2 = o
        o3 = o
    else:
        # per reader: c = bits consumed | symbols decoded << 32 (the bit count
        # stays < 2^32: <= 11 bits per symbol, <= 2^25 symbols per sub-stream)
        c0 = 0
        c1 = 0
        c2 = 0
        c3 = 0
        t0 = tmp[0:r]
        t1 = tmp[r:2 * r]
        t2 = tmp[2 * r:3 * r]
        t3 = tmp[3 * r:4 * r]
        while True:
            b0 = c0 & 0xFFFFFFFF
            b1 = c1 & 0xFFFFFFFF
            b2 = c2 & 0xFFFFFFFF
            b3 = c3 & 0xFFFFFFFF
            if ((c0 >> 32) > e0 or (c1 >> 32) > e1 or (c2 >> 32) > e2 or (c3 >> 32) > e3
                    or (b0 >> 3) + 8 > L0 or (b1 >> 3) + 8 > L1
                    or (b2 >> 3) + 8 > L2 or (b3 >> 3) + 8 > L3):
                break
            # 8-byte loads lie inside each sub-stream; >= 57 valid bits each,
            # 5 lookups consume <= 55
            a0 = load_u64(buf, s0 + (b0 >> 3)) >> np.uint64(b0 & 7)
            a1 = load_u64(buf, s1 + (b1 >> 3)) >> np.uint64(b1 & 7)
            a2 = load_u64(buf, s2 + (b2 >> 3)) >> np.uint64(b2 & 7)
            a3 = load_u64(buf, s3 + (b3 >> 3)) >> np.uint64(b3 & 7)
            for t in range(5):
                x0 = ld(dec3, a0 & _M11)
                x1 = ld(dec3, a1 & _M11)
                x2 = ld(dec3, a2 & _M11)
                x3 = ld(dec3, a3 & _M11)
                store_u32(t0, c0 >> 32, np.uint32((x0 >> _S8) & _M32))
                store_u32(t1, c1 >> 32, np.uint32((x1 >> _S8) & _M32))
                store_u32(t2, c2 >> 32, np.uint32((x2 >> _S8) & _M32))
                store_u32(t3, c3 >> 32, np.uint32((x3 >> _S8) & _M32))
                a0 >>= x0 & _M63
                a1 >>= x1 & _M63
                a2 >>= x2 & _M63
                a3 >>= x3 & _M63
                c0 += np.int64(x0 & _CM)
                c1 += np.int64(x1 & _CM)
                c2 += np.int64(x2 & _CM)
                c3 += np.int64(x3 & _CM)
        b0 = c0 & 0xFFFFFFFF
        b1 = c1 & 0xFFFFFFFF
        b2 = c2 & 0xFFFFFFFF
        b3 = c3 & 0xFFFFFFFF
        o0 = c0 >> 32
        o1 = c1 >> 32
        o2 = c2 >> 32
        o3 = c3 >> 32
    bp = np.empty(4, np.int64)
    bp[0] = b0
    bp[1] = b1
    bp[2] = b2
    bp[3] = b3
    op = np.empty(4, np.int64)
    op[0] = o0
    op[1] = o1
    op[2] = o2
    op[3] = o3
    for k in range(4):
        b = bp[k]
        L = ln[k]
        sk = st[k]
        rk = k * r
        for i in range(op[k], (n + 3 - k) >> 2):
            if b > 8 * L:
                return ERR_STREAM
            if (b >> 3) + 8 <= L:
                acc = load_u64(buf, sk + (b >> 3)) >> np.uint64(b & 7)
            else:
                acc = _slow_load(buf, sk, L, b >> 3) >> np.uint64(b & 7)
            e = dec[acc & _M11]
            tmp[rk + i] = np.uint8(e & 0xFF)
            b += np.int64(e >> 8)
        if (b + 7) >> 3 != L:
            return ERR_STREAM
        if b & 7:
            if (buf[sk + L - 1] >> (b & 7)) != 0:
                return ERR_PAD
    # interleave: out[4i + k] = sub-stream k symbol i
    q = n >> 2
    t0 = tmp[0:q]
    t1 = tmp[r:r + q]
    t2 = tmp[2 * r:2 * r + q]
    t3 = tmp[3 * r:3 * r + q]
    for i in range(q):
        store_u32(out, 4 * i, np.uint32(t0[i]) | (np.uint32(t1[i]) << 8)
                  | (np.uint32(t2[i]) << 16) | (np.uint32(t3[i]) << 24))
    for k in range(n - 4 * q):
        out[4 * q + k] = tmp[k * r + q]
    return OK


@njit(nogil=True, cache=True)
def decode_huff_stream(blob, pos, plen, p, n, lens, dec, dec3, dec1, tmp):
    end = pos + plen
    if plen < 2:
        return ERR_TRUNC
    lo = np.int64(blob[pos])
    hi = np.int64(blob[pos + 1])
    if hi < lo:
        return ERR_TABLE
    cnt = hi - lo + 1
    nbt = (cnt + 1) // 2
    if pos + 2 + nbt + 12 > end:
        return ERR_TRUNC
    for s in range(256):
        lens[s] = 0
    q = pos + 2
    for j in range(cnt):
        byte = blob[q + (j >> 1)]
        lens[lo + j] = (byte >> (4 * (j & 1))) & 15
    if cnt & 1:
        if (blob[q + nbt - 1] >> 4) != 0:
            return ERR_TABLE
    if lens[lo] == 0 or lens[hi] == 0:
        return ERR_TABLE
    if not build_decode_table(lens, dec):
        return ERR_KRAFT
    minlen = MAXLEN
    for j in range(cnt):
        L = np.int64(lens[lo + j])
        if L > 0 and L < minlen:
            minlen = L
    single = 2 * minlen > MAXLEN
    if single:
        for idx in range(TABSIZE):
            e = dec[idx]
            dec1[idx] = np.uint16((e >> 8) | ((e & 0xFF) << 8))
    else:
        build_multi_table(dec, dec3)
    q += nbt
    st = np.empty(4, np.int64)
    ln = np.empty(4, np.int64)
    ln[0] = np.int64(load_u32(blob, q))
    ln[1] = np.int64(load_u32(blob, q + 4))
    ln[2] = np.int64(load_u32(blob, q + 8))
    q += 12
    rem = end - q
    acc = 0
    for k in range(3):
        if ln[k] > rem - acc:
            return ERR_TRUNC
        st[k] = q + acc
        acc += ln[k]
    st[3] = q + acc
    ln[3] = rem - acc
    return huff_decode4(blob, st, ln, dec, dec3, dec1, single, p, n, tmp)


@njit(nogil=True, cache=True)
def decode_chunk(blob, off, clen, n, unit, layout, ns, ref, has_ref, out, start, expected,
                 planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, cb, syms):
    """Decode one chunk (blob[off:off+clen]) into out; planes (ns x >= n+16),
    dec (uint16[2048]), dec3 (uint64[2048]) and lens (uint8[256]) are
    scratch.  Returns a status."""
    end = off + clen
    if clen < 1:
        return ERR_TRUNC
    flags = blob[off]
    if flags > 3:
        return ERR_FLAGS
    if flags == CHUNK_TEMPORAL:
        if version < 2:
            return ERR_VERSION
        if layout == LAYOUT_PLANES:
            return ERR_FLAGS
        if not has_ref:
            return ERR_NOREF
        st = temporal_decode(blob, off + 1, end, n, layout, ref, start, out, f, cm, dtab, cb,
                             syms)
        if st != OK:
            return st
        if checksum_units(out, start, n, unit) != expected:
            return ERR_CHECKSUM
        return OK
    if flags == 2:
        # stored chunk
        nbytes = n * unit
        if clen != 1 + nbytes:
            return ERR_LEN
        copy_bytes(out, start * unit, blob, off + 1, nbytes)
        if checksum_units(out, start, n, unit) != expected:
            return ERR_CHECKSUM
        return OK
    delta = flags == 1
    if delta and not has_ref:
        return ERR_NOREF
    pos = off + 1
    for s in range(ns):
        if pos + 5 > end:
            return ERR_TRUNC
        mode = blob[pos]
        plen = np.int64(load_u32(blob, pos + 1))
        pos += 5
        if plen > end - pos:
            return ERR_TRUNC
        p = planes[s]
        if mode == MODE_RAW:
            if plen != n:
                return ERR_LEN
            copy_bytes(p, 0, blob, pos, n)
        elif mode == MODE_CONST:
            if plen != 1:
                return ERR_LEN
            p[:n] = blob[pos]  # fill (fast)
        elif mode == MODE_HUFF:
            st = decode_huff_stream(blob, pos, plen, p, n, lens, dec, dec3, dec1, tmp)
            if st != OK:
                return st
        elif mode == MODE_RANS:
            if version < 2:
                return ERR_VERSION
            st = decode_rans_stream(blob, pos, plen, p, n, f, cm, dtab)
            if st != OK:
                return st
        else:
            return ERR_MODE
        pos += plen
    if pos != end:
        return ERR_TRAIL
    chk = merge_chunk(planes, n, out, ref, delta, start, unit, layout)
    if chk != expected:
        return ERR_CHECKSUM
    return OK


# ---------------------------------------------------------------------------
# drivers over a range of chunks.  They release the GIL (nogil) and are run
# concurrently from a thread pool by lmc._core; each chunk is independent, so
# the output does not depend on the number of threads.
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def encode_range(data, ref, has_ref, v2, total, chunk, unit, layout, ns, scratch, cap,
                 sizes, chks, used, c0, c1):
    m = min(chunk, total) + 16
    planes = np.empty((ns, m), np.uint8)
    planes2 = np.empty((ns, m if has_ref else 1), np.uint8)
    tm = m if (has_ref and v2 and layout != LAYOUT_PLANES) else 1
    jb = np.empty(tm, np.uint16)
    low = np.empty(tm, np.uint32)
    th = np.empty(4 * NCTX * 65, np.int32)
    ha = np.empty(ns * 1024, np.int32)
    hx = np.empty(ns * 1024, np.int32)
    thist = np.empty(NCTX * 256, np.int64)
    tf = np.zeros(NCTX * 256, np.int64)
    tcm = np.zeros(NCTX * 256, np.int64)
    et = np.zeros(2 * NCTX * 65, np.uint64)
    kbt = np.zeros(NCTX * 65, np.uint8)
    tbuf = np.empty(2 * m + 32, np.uint8)
    rbuf = np.empty(unit * tm + 16, np.uint8)
    for c in range(c0, c1):
        start = c * chunk
        n = min(chunk, total - start)
        sz, ck, u = encode_chunk(data, ref, has_ref, v2, start, n, unit, layout, ns, scratch,
                                 c * cap, planes, planes2, jb, low, th, ha, hx, thist, tf, tcm,
                                 tbuf[:2 * n + 16], rbuf, kbt, et)
        sizes[c] = sz
        chks[c] = ck
        used[c] = u


@njit(nogil=True, cache=True)
def gather_range(scratch, cap, sizes, offsets, out, c0, c1):
    for c in range(c0, c1):
        a = offsets[c]
        b = c * cap
        copy_bytes(out, a, scratch, b, sizes[c])


@njit(nogil=True, cache=True)
def decode_range(blob, offsets, sizes, chks, total, chunk, unit, layout, ns, ref, has_ref,
                 out, status, version, c0, c1):
    planes = np.empty((ns, min(chunk, total) + 16), np.uint8)
    dec = np.empty(TABSIZE, np.uint16)
    dec3 = np.empty(TABSIZE, np.uint64)
    dec1 = np.empty(TABSIZE, np.uint16)
    lens = np.empty(256, np.uint8)
    tmp = np.empty(4 * (((min(chunk, total) + 3) >> 2) + 16), np.uint8)
    f = np.empty(NCTX * 256, np.int64)
    cm = np.empty(NCTX * 256, np.int64)
    dtab = np.empty(NCTX * PROB_SCALE, np.uint32)
    cb = np.empty(min(chunk, total) + 16, np.uint16)
    syms = np.empty(min(chunk, total) + 16, np.uint8)
    for c in range(c0, c1):
        start = c * chunk
        n = min(chunk, total - start)
        status[c] = decode_chunk(blob, offsets[c], sizes[c], n, unit, layout, ns,
                                 ref, has_ref, out, start, chks[c], planes, dec, dec3,
                                 dec1, lens, tmp, version, f, cm, dtab, cb, syms)


@njit(nogil=True, cache=True)
def checksum_range(data, total, chunk, unit, chks, c0, c1):
    for c in range(c0, c1):
        start = c * chunk
        n = min(chunk, total - start)
        chks[c] = checksum_units(data, start, n, unit)


# ---------------------------------------------------------------------------
# rANS (format v2).  Static, 32-bit states in [2^16, 2^32), 16-bit
# renormalisation words, frequencies quantised to sum 2^12, 4 interleaved
# states (symbol i uses state i % 4) sharing one word stream.  Frequencies
# and cumulative frequencies live in flat int64 arrays indexed
# table * 256 + symbol (several tables: the temporal mode's contexts).
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def rans_normalize(cnt, c0, nsym, f):
    """f[c0 + s] (s < nsym): counts cnt[c0 + s] quantised to a sum of
    PROB_SCALE, f > 0 exactly where cnt > 0.  Returns the number of present
    symbols (0: nothing to code; f all zero)."""
    total = 0
    for s in range(nsym):
        total += cnt[c0 + s]
    if total == 0:
        for s in range(nsym):
            f[c0 + s] = 0
        return 0
    tot = 0
    m = 0
    best = 0
    bc = -1
    for s in range(nsym):
        c = cnt[c0 + s]
        if c > 0:
            q = (c * PROB_SCALE + (total >> 1)) // total
            if q < 1:
                q = 1
            f[c0 + s] = q
            tot += q
            m += 1
            if c > bc:
                bc = c
                best = s
        else:
            f[c0 + s] = 0
    diff = PROB_SCALE - tot
    if diff > 0:
        f[c0 + best] += diff
    while diff < 0:  # take from the largest frequency (it is > 1: the sum exceeds 2^12 > 256)
        j = 0
        for s in range(nsym):
            if f[c0 + s] > f[c0 + j]:
                j = s
        t = min(-diff, f[c0 + j] - 1)
        f[c0 + j] -= t
        diff += t
    return m


@njit(nogil=True, cache=True)
def rans_cost_bits(cnt, f, c0, nsym):
    """Ideal coded size (bits) of the counts under the quantised f."""
    bits = 0.0
    for s in range(nsym):
        c = cnt[c0 + s]
        if c > 0:
            bits += c * (PROB_BITS - np.log2(np.float64(f[c0 + s])))
    return bits


@njit(nogil=True, cache=True)
def freq_table_bytes(f, c0, nsym):
    lo = 0
    while f[c0 + lo] == 0:
        lo += 1
    hi = nsym - 1
    while f[c0 + hi] == 0:
        hi -= 1
    b = 2
    for s in range(lo, hi + 1):
        b += 1 if f[c0 + s] < 128 else 2
    return b


@njit(nogil=True, cache=True)
def write_freq_table(f, c0, nsym, out, o):
    """lo, hi, then per symbol lo..hi its frequency: one byte if < 128, else
    two bytes 0x80 | f >> 8, f & 0xFF.  Returns the end position."""
    lo = 0
    while f[c0 + lo] == 0:
        lo += 1
    hi = nsym - 1
    while f[c0 + hi] == 0:
        hi -= 1
    out[o] = lo
    out[o + 1] = hi
    o += 2
    for s in range(lo, hi + 1):
        v = f[c0 + s]
        if v < 128:
            out[o] = v
            o += 1
        else:
            out[o] = 0x80 | (v >> 8)
            out[o + 1] = v & 0xFF
            o += 2
    return o


@njit(nogil=True, cache=True)
def read_freq_table(blob, pos, end, maxsym, f, c0, cm):
    """Parse a frequency table at blob[pos:end] into f[c0:c0+256] and its
    cumulative frequencies cm.  Returns the end position, or -1 if invalid
    (truncated, hi < lo, hi > maxsym, f[lo] or f[hi] zero, a non-minimal or
    > 4096 two-byte value, or a sum != 4096)."""
    if pos + 2 > end:
        return -1
    lo = np.int64(blob[pos])
    hi = np.int64(blob[pos + 1])
    if hi < lo or hi > maxsym:
        return -1
    pos += 2
    for s in range(256):
        f[c0 + s] = 0
        cm[c0 + s] = 0
    tot = 0
    for s in range(lo, hi + 1):
        if pos >= end:
            return -1
        b = np.int64(blob[pos])
        if b & 0x80:
            if pos + 1 >= end:
                return -1
            v = ((b & 0x7F) << 8) | np.int64(blob[pos + 1])
            if v < 128 or v > PROB_SCALE:
                return -1
            pos += 2
        else:
            v = b
            pos += 1
        f[c0 + s] = v
        cm[c0 + s] = tot
        tot += v
    if tot != PROB_SCALE or f[c0 + lo] == 0 or f[c0 + hi] == 0:
        return -1
    return pos


@njit(nogil=True, cache=True)
def cum_freqs(f, c0, cm):
    t = 0
    for s in range(256):
        cm[c0 + s] = t
        t += f[c0 + s]


@njit(nogil=True, cache=True)
def build_rans_dtab(f, cm, c0, dtab, t0):
    """dtab[t0 + slot] = symbol | (freq - 1) << 8 | (slot - cum) << 20 for a
    validated table (sum 4096)."""
    for s in range(256):
        fs = f[c0 + s]
        if fs > 0:
            base = cm[c0 + s]
            hi = np.uint32(s | ((fs - 1) << 8))
            for j in range(fs):
                dtab[t0 + base + j] = hi | np.uint32(j << 20)


@njit(nogil=True, cache=True)
def _renc(x, s, f, cm, inv, buf, p):
    """Encode symbol index s (table * 256 + symbol) into state x, pushing
    at most one 16-bit word below buf[p]; returns (x, p).  x // f by a
    double reciprocal, corrected to the exact quotient (x < 2^32, f <= 2^12:
    the product is off by less than one only when f divides x)."""
    fs = ld(f, s)
    # branchless renormalisation: the word is stored speculatively (p >= 16
    # + 2 * the words still to come, so p - 2 is inside buf)
    g = np.int64(x >= (fs << 20))
    store_u16(buf, p - 2, np.uint16(x & 0xFFFF))
    p -= g << 1
    x >>= g << 4
    q = np.int64(np.float64(x) * ld(inv, s))
    r = x - q * fs
    if r >= fs:
        q += 1
        r -= fs
    return (q << PROB_BITS) + r + ld(cm, s), p


@njit(nogil=True, cache=True)
def rans_encode(syms, ctxs, use_ctx, n, f, cm, buf):
    """Encode syms[0:n] (table ctxs[i] if use_ctx else 0) backwards; the
    stream (4 u32 final states, then the 16-bit words in decoding order) is
    placed at the end of buf (len >= 2n + 16).  Returns its start."""
    inv = np.empty(f.size, np.float64)
    for j in range(f.size):
        inv[j] = 1.0 / f[j] if f[j] > 0 else 0.0
    p = buf.size
    xs = np.empty(4, np.int64)
    xs[:] = RANS_L
    n4 = n & ~3
    for i in range(n - 1, n4 - 1, -1):  # the last n % 4 symbols first
        s = np.int64(ld(syms, i))
        if use_ctx:
            s += np.int64(ld(ctxs, i)) << 8
        xs[i & 3], p = _renc(xs[i & 3], s, f, cm, inv, buf, p)
    x0 = xs[0]
    x1 = xs[1]
    x2 = xs[2]
    x3 = xs[3]
    for g in range(n4 - 4, -1, -4):
        s3 = np.int64(ld(syms, g + 3))
        s2 = np.int64(ld(syms, g + 2))
        s1 = np.int64(ld(syms, g + 1))
        s0 = np.int64(ld(syms, g))
        if use_ctx:
            s3 += np.int64(ld(ctxs, g + 3)) << 8
            s2 += np.int64(ld(ctxs, g + 2)) << 8
            s1 += np.int64(ld(ctxs, g + 1)) << 8
            s0 += np.int64(ld(ctxs, g)) << 8
        x3, p = _renc(x3, s3, f, cm, inv, buf, p)
        x2, p = _renc(x2, s2, f, cm, inv, buf, p)
        x1, p = _renc(x1, s1, f, cm, inv, buf, p)
        x0, p = _renc(x0, s0, f, cm, inv, buf, p)
    p -= 16
    store_u32(buf, p, np.uint32(x0))
    store_u32(buf, p + 4, np.uint32(x1))
    store_u32(buf, p + 8, np.uint32(x2))
    store_u32(buf, p + 12, np.uint32(x3))
    return p


@njit(nogil=True, cache=True)
def rans_decode(blob, pos, end, dtab, ctxs, use_ctx, out, n):
    """Decode n symbols from the rANS stream blob[pos:end] into out[0:n]
    (decode table dtab[ctxs[i] * 4096 ...] if use_ctx, else dtab[0:4096]).
    Every word read is checked against end; the stream must be consumed
    exactly and all 4 final states must equal 2^16."""
    if end - pos < 16:
        return ERR_RANS
    x0 = np.int64(load_u32(blob, pos))
    x1 = np.int64(load_u32(blob, pos + 4))
    x2 = np.int64(load_u32(blob, pos + 8))
    x3 = np.int64(load_u32(blob, pos + 12))
    if x0 < RANS_L or x1 < RANS_L or x2 < RANS_L or x3 < RANS_L:
        return ERR_RANS
    p = pos + 16
    i = 0
    n4 = n & ~3
    t0 = 0
    t1 = 0
    t2 = 0
    t3 = 0
    # fast loop: 4 symbols, at most 4 words (8 bytes) per iteration
    while i < n4 and p + 8 <= end:
        if use_ctx:
            t0 = np.int64(ld(ctxs, i)) << PROB_BITS
            t1 = np.int64(ld(ctxs, i + 1)) << PROB_BITS
            t2 = np.int64(ld(ctxs, i + 2)) << PROB_BITS
            t3 = np.int64(ld(ctxs, i + 3)) << PROB_BITS
        e0 = np.int64(ld(dtab, t0 + (x0 & 4095)))
        e1 = np.int64(ld(dtab, t1 + (x1 & 4095)))
        e2 = np.int64(ld(dtab, t2 + (x2 & 4095)))
        e3 = np.int64(ld(dtab, t3 + (x3 & 4095)))
        put(out, i, e0 & 255)
        put(out, i + 1, e1 & 255)
        put(out, i + 2, e2 & 255)
        put(out, i + 3, e3 & 255)
        x0 = (((e0 >> 8) & 4095) + 1) * (x0 >> 12) + (e0 >> 20)
        x1 = (((e1 >> 8) & 4095) + 1) * (x1 >> 12) + (e1 >> 20)
        x2 = (((e2 >> 8) & 4095) + 1) * (x2 >> 12) + (e2 >> 20)
        x3 = (((e3 >> 8) & 4095) + 1) * (x3 >> 12) + (e3 >> 20)
        # branchless renormalisation (p + 8 <= end: the 4 loads are inside)
        g0 = np.int64(x0 < RANS_L)
        x0 = (x0 << (g0 << 4)) | (np.int64(load_u16(blob, p)) & -g0)
        p += g0 << 1
        g1 = np.int64(x1 < RANS_L)
        x1 = (x1 << (g1 << 4)) | (np.int64(load_u16(blob, p)) & -g1)
        p += g1 << 1
        g2 = np.int64(x2 < RANS_L)
        x2 = (x2 << (g2 << 4)) | (np.int64(load_u16(blob, p)) & -g2)
        p += g2 << 1
        g3 = np.int64(x3 < RANS_L)
        x3 = (x3 << (g3 << 4)) | (np.int64(load_u16(blob, p)) & -g3)
        p += g3 << 1
        i += 4
    xs = np.empty(4, np.int64)
    xs[0] = x0
    xs[1] = x1
    xs[2] = x2
    xs[3] = x3
    while i < n:
        k = i & 3
        x = xs[k]
        t = 0
        if use_ctx:
            t = np.int64(ctxs[i]) << PROB_BITS
        e = np.int64(dtab[t + (x & 4095)])
        out[i] = e & 255
        x = (((e >> 8) & 4095) + 1) * (x >> 12) + (e >> 20)
        if x < RANS_L:
            if p + 2 > end:
                return ERR_RANS
            x = (x << 16) | np.int64(load_u16(blob, p))
            p += 2
        xs[k] = x
        i += 1
    if p != end:
        return ERR_RANS
    for k in range(4):
        if xs[k] != RANS_L:
            return ERR_RANS
    return OK


@njit(nogil=True, cache=True)
def decode_rans_stream(blob, pos, plen, p, n, f, cm, dtab):
    """Stream mode 3: frequency table, then the rANS stream (to the end of
    the payload)."""
    end = pos + plen
    q = read_freq_table(blob, pos, end, 255, f, 0, cm)
    if q < 0:
        return ERR_FREQ
    build_rans_dtab(f, cm, 0, dtab, 0)
    return rans_decode(blob, q, end, dtab, p, False, p, n)


# ---------------------------------------------------------------------------
# temporal chunk mode (format v2): fp32 / fp16 / bf16 against a reference.
# Each W-bit pattern v is mapped to a monotone integer
#   mono(v) = v ^ signbit            if v's sign bit is 0
#           = v ^ (2^W - 1)          otherwise
# d = mono(x) - mono(r) (mod 2^W, read as signed).  Symbol: 0 for d = 0,
# else 2k - 1 + (d < 0) with k = bit_length(|d|) (|d| <= 2^(W-1));
# the k-1 bits of |d| below its leading one go raw into a bit stream.
# Context of element i: from the reference's exponent field e:
#   15 if e is all ones (inf/NaN), else clamp(E - e, 0, 14),
# E = the chunk's context base (the encoder uses the largest finite
# exponent of the reference in the chunk).
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _fparams(layout):
    """(W, mantissa bits, exponent mask) of a float layout."""
    if layout == LAYOUT_F32:
        return 32, 23, 0xFF
    if layout == LAYOUT_F16:
        return 16, 10, 0x1F
    return 16, 7, 0xFF


@njit(nogil=True, cache=True)
def temporal_base(ref, start, n, layout):
    """Largest finite exponent field of the reference units in the chunk."""
    W, mb, em = _fparams(layout)
    if W == 32:
        return _tbase(ref[4 * start:4 * (start + n)].view(np.uint32), n, mb, em)
    return _tbase(ref[2 * start:2 * (start + n)].view(np.uint16), n, mb, em)


@njit(nogil=True, cache=True)
def _tbase(r, n, mb, em):
    E = np.int32(0)
    m = np.int32(em)
    for i in range(n):
        e = np.int32(r[i] >> mb) & m
        E = max(E, e & -np.int32(e != m))  # (branch-free: vectorizes)
    return np.int64(E)


@njit(nogil=True, cache=True)
def _ctx_of(rv, E, mb, em):
    e = (rv >> mb) & em
    c = min(max(E - e, 0), 14)
    return 15 if e == em else c


@njit(nogil=True, cache=True)
def _mono(v, sb, mask):
    """Sign-magnitude bits -> monotone integer (branchless)."""
    return v ^ sb ^ (-np.int64((v & sb) != 0) & (sb - 1))


@njit(nogil=True, cache=True)
def _unmono(m, sb, mask):
    """Inverse of _mono (branchless)."""
    return m ^ sb ^ (-np.int64((m & sb) == 0) & (sb - 1))


# Encoder.  The alone coding is counted exactly (stream_count, no split
# into planes); the temporal and XOR codings are first estimated on a
# sample (temporal_sample) and counted exactly only where they may win
# (temporal_count: per element the joint symbol j = context * (2W + 1) +
# symbol, u16, and the bits of |d| below its leading one, u32).  Counts are
# kept in 4 partial tables (element i in table i % 4): consecutive elements
# never wait on each other's increment, and the Huffman sizes need the
# counts per sub-stream anyway.  Only the chosen mode is split into planes.
@njit(nogil=True, cache=True)
def _inc(h, j):
    put(h, j, ld(h, j) + 1)


@njit(nogil=True, cache=True)
def _tsyms(x, r, n, W, mb, em, E, jb, low):
    """Joint symbols and raw bits (branch-free, no stores that depend on
    the data: the loop vectorizes)."""
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    KS = 2 * W + 1
    raw = 0
    for i in range(n):
        xv = np.int64(x[i])
        rv = np.int64(r[i])
        e = (rv >> mb) & em
        c = min(max(E - e, 0), 14)
        c = 15 if e == em else c
        d = (_mono(xv, sb, mask) - _mono(rv, sb, mask)) & mask
        neg = (d >> (W - 1)) & 1          # d read as signed W-bit
        a = ((d ^ -neg) + neg) & mask     # |d| (2^(W-1) for the most negative)
        # bit length of a from the exponent of float64(a >> 1) (an int32:
        # exact, and unlike a count of leading zeros it vectorizes on AVX2)
        nz = np.int64(a != 0)
        k = max((f64_bits(np.float64(np.int32(a >> 1))) >> 52) - 1022, 0) + nz
        raw += k - nz
        jb[i] = np.uint16(c * KS + 2 * k - nz + neg)
        low[i] = np.uint32(a ^ ((np.int64(1) << k) >> 1))
    return raw


SAMPLE = 32   # the estimates that decide which modes to analyse exactly use 1/SAMPLE


@njit(nogil=True, cache=True)
def _ent_bits(cnt, c0, m):
    """Order-0 entropy (bits) of the counts cnt[c0:c0+m]."""
    tot = 0
    for s in range(m):
        tot += cnt[c0 + s]
    bits = 0.0
    if tot > 0:
        lt = np.log2(np.float64(tot))
        for s in range(m):
            c = cnt[c0 + s]
            if c > 0:
                bits += c * (lt - np.log2(np.float64(c)))
    return bits


@njit(nogil=True, cache=True)
def temporal_sample(data, ref, start, n, layout, E, ts, xs):
    """Estimated sizes (bytes) of the temporal and of the XOR coding of the
    chunk from every SAMPLE-th group of 4 elements: order-0 entropies of the
    (context, symbol) counts, raw bits and byte-stream counts, scaled
    (no table costs: the estimates only decide whether to analyse a mode
    exactly).  ts: int64[NCTX * 65], xs: int64[4 * 256] scratch.  Below
    64 sampled groups it returns (0, 0): analyse everything."""
    W, mb, em = _fparams(layout)
    ts[:] = 0
    xs[:] = 0
    if n < 64 * 4 * SAMPLE:  # small chunk: analyse every mode exactly
        return 0, 0
    if W == 32:
        raw, m = _tsample(data[4 * start:4 * (start + n)].view(np.uint32),
                          ref[4 * start:4 * (start + n)].view(np.uint32), n, layout, E, ts, xs)
    else:
        raw, m = _tsample(data[2 * start:2 * (start + n)].view(np.uint16),
                          ref[2 * start:2 * (start + n)].view(np.uint16), n, layout, E, ts, xs)
    if m == 0:
        return 0, 0
    KS = 2 * W + 1
    bt = np.float64(raw)
    for c in range(NCTX):
        bt += _ent_bits(ts, c * KS, KS)
    ns = 2 if layout == LAYOUT_BF16 else (3 if layout == LAYOUT_F16 else 4)
    bx = 0.0
    for s in range(ns):
        bx += min(_ent_bits(xs, s * 256, 256), 8.0 * m)
    sc = n / (8.0 * m)
    return np.int64(bt * sc), np.int64(bx * sc)


@njit(nogil=True, cache=True)
def _tsample(x, r, n, layout, E, ts, xs):
    W, mb, em = _fparams(layout)
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    KS = 2 * W + 1
    raw = 0
    m = 0
    for g in range(0, n - 3, 4 * SAMPLE):
        for i in range(g, g + 4):
            xv = np.int64(x[i])
            rv = np.int64(r[i])
            c = _ctx_of(rv, E, mb, em)
            d = (_mono(xv, sb, mask) - _mono(rv, sb, mask)) & mask
            neg = (d >> (W - 1)) & 1
            a = ((d ^ -neg) + neg) & mask
            k = 64 - clz64(np.uint64(a))
            nz = np.int64(k != 0)
            raw += k - nz
            ts[c * KS + 2 * k - nz + neg] += 1
            xr = xv ^ rv
            if layout == LAYOUT_BF16:
                xs[(xr >> 7) & 0xFF] += 1
                xs[256 + (((xr >> 8) & 0x80) | (xr & 0x7F))] += 1
            elif layout == LAYOUT_F16:
                xs[(xr >> 10) & 0x1F] += 1
                xs[256 + (((xr >> 13) & 4) | ((xr >> 8) & 3))] += 1
                xs[512 + (xr & 0xFF)] += 1
            else:
                xs[(xr >> 23) & 0xFF] += 1
                xs[256 + (((xr >> 24) & 0x80) | ((xr >> 16) & 0x7F))] += 1
                xs[512 + ((xr >> 8) & 0xFF)] += 1
                xs[768 + (xr & 0xFF)] += 1
        m += 4
    return raw, m


@njit(nogil=True, cache=True)
def stream_count(data, ref, use_ref, start, n, layout, hs):
    """Byte-stream counts of the units (XOR the reference when use_ref) in 4
    partial tables: hs[s * 1024 + (i % 4) * 256 + byte] (int32, zeroed here)."""
    hs[:] = 0
    if layout == LAYOUT_F32:
        x = data[4 * start:4 * (start + n)].view(np.uint32)
        r = ref[4 * start:4 * (start + n)].view(np.uint32) if use_ref else x
        for i in range(n):
            hb = (i & 3) << 8
            v = np.int64(ld(x, i))
            if use_ref:
                v ^= np.int64(ld(r, i))
            _inc(hs, hb + ((v >> 23) & 0xFF))
            _inc(hs, 1024 + hb + (((v >> 24) & 0x80) | ((v >> 16) & 0x7F)))
            _inc(hs, 2048 + hb + ((v >> 8) & 0xFF))
            _inc(hs, 3072 + hb + (v & 0xFF))
        return
    x = data[2 * start:2 * (start + n)].view(np.uint16)
    r = ref[2 * start:2 * (start + n)].view(np.uint16) if use_ref else x
    if layout == LAYOUT_BF16:
        for i in range(n):
            hb = (i & 3) << 8
            v = np.int64(ld(x, i))
            if use_ref:
                v ^= np.int64(ld(r, i))
            _inc(hs, hb + ((v >> 7) & 0xFF))
            _inc(hs, 1024 + hb + (((v >> 8) & 0x80) | (v & 0x7F)))
    else:
        for i in range(n):
            hb = (i & 3) << 8
            v = np.int64(ld(x, i))
            if use_ref:
                v ^= np.int64(ld(r, i))
            _inc(hs, hb + ((v >> 10) & 0x1F))
            _inc(hs, 1024 + hb + (((v >> 13) & 4) | ((v >> 8) & 3)))
            _inc(hs, 2048 + hb + (v & 0xFF))


@njit(nogil=True, cache=True)
def temporal_count(data, ref, start, n, layout, E, jb, low, th):
    """Joint symbols jb and raw bits low of the chunk, their counts in 4
    partial tables th (int32[4 * NCTX * (2W + 1)], zeroed here).  Returns
    the raw bit count."""
    W, mb, em = _fparams(layout)
    th[:] = 0
    NK = NCTX * (2 * W + 1)
    if W == 32:
        x = data[4 * start:4 * (start + n)].view(np.uint32)
        r = ref[4 * start:4 * (start + n)].view(np.uint32)
        raw = _tsyms(x, r, n, W, mb, em, E, jb, low)
    else:
        x16 = data[2 * start:2 * (start + n)].view(np.uint16)
        r16 = ref[2 * start:2 * (start + n)].view(np.uint16)
        raw = _tsyms(x16, r16, n, W, mb, em, E, jb, low)
    for i in range(n):
        _inc(th, ((i & 3) * NK) + np.int64(ld(jb, i)))
    return raw


@njit(nogil=True, cache=True)
def temporal_hist(th, W, hist):
    """Sum the 4 partial (context, symbol) tables into hist[ctx * 256 + sym]."""
    KS = 2 * W + 1
    NK = NCTX * KS
    hist[:] = 0
    for c in range(NCTX):
        for s in range(KS):
            j = c * KS + s
            hist[(c << 8) + s] = (np.int64(th[j]) + np.int64(th[NK + j])
                                  + np.int64(th[2 * NK + j]) + np.int64(th[3 * NK + j]))


@njit(nogil=True, cache=True)
def stream_hist(hs, ns, h):
    """int32 stream counts hs[s * 1024 + k * 256 + c] -> int64 h[s, k, c]."""
    for s in range(ns):
        for k in range(4):
            for c in range(256):
                h[s, k, c] = hs[s * 1024 + k * 256 + c]


@njit(nogil=True, cache=True)
def temporal_estimate(hist, f, cm, W):
    """Quantise the context tables (f, cm) and estimate the rANS part:
    returns (bytes of tables + rANS stream, context mask)."""
    mask = 0
    tab = 0
    bits = 0.0
    for c in range(NCTX):
        m = rans_normalize(hist, c << 8, 2 * W + 1, f)
        for s in range(2 * W + 1, 256):
            f[(c << 8) + s] = 0
        if m > 0:
            mask |= 1 << c
            tab += freq_table_bytes(f, c << 8, 2 * W + 1)
            bits += rans_cost_bits(hist, f, c << 8, 2 * W + 1)
            cum_freqs(f, c << 8, cm)
    return tab + 16 + np.int64(np.ceil(bits / 8)), mask


_ALL1 = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(nogil=True, cache=True)
def _enc_entry(fs, cum, kb, et, j):
    """Encoder table entry j (two u64): the reciprocal m with
    x div f = mulhi(x, m) for x < 2^32 (exact: the error of m / 2^64 times
    x is below 2^-32 < 1/f), and bias | (4096 - f) << 13 | kb << 26 | f << 32
    with x' = x + bias + q * (4096 - f) = q * 4096 + x mod f + cum.  f = 1:
    m = 2^64 - 1 gives q = x - 1, compensated by bias = cum + 4095."""
    if fs == 1:
        m = _ALL1
        bias = cum + PROB_SCALE - 1
    else:
        m = _ALL1 // np.uint64(fs) + np.uint64(1)
        bias = cum
    et[2 * j] = m
    et[2 * j + 1] = np.uint64(bias | ((PROB_SCALE - fs) << 13) | (kb << 26) | (fs << 32))


@njit(nogil=True, cache=True)
def _renc2(x, m, info, buf, p):
    """Encode one symbol (table entry m, info) into state x (uint64 < 2^32),
    pushing at most one 16-bit word below buf[p]; returns (x, p)."""
    fs = info >> _S32
    g = np.uint64(x >= (fs << np.uint64(20)))
    store_u16(buf, p - 2, np.uint16(x & np.uint64(0xFFFF)))   # speculative
    p -= np.int64(g) << 1
    x >>= g << np.uint64(4)
    q = mulhi64(x, m)
    return x + (info & np.uint64(8191)) + q * ((info >> np.uint64(13)) & np.uint64(8191)), p


@njit(nogil=True, cache=True)
def _tenc(jb, n, et, buf):
    """rANS-encode the joint symbols jb[0:n] backwards into the end of buf
    (as rans_encode, with the packed table et).  Returns the stream start."""
    p = buf.size
    xs = np.empty(4, np.uint64)
    xs[:] = np.uint64(RANS_L)
    n4 = n & ~3
    for i in range(n - 1, n4 - 1, -1):  # the last n % 4 symbols first
        j = np.int64(ld(jb, i))
        xs[i & 3], p = _renc2(xs[i & 3], ld(et, 2 * j), ld(et, 2 * j + 1), buf, p)
    x0 = xs[0]
    x1 = xs[1]
    x2 = xs[2]
    x3 = xs[3]
    for g in range(n4 - 4, -1, -4):
        j3 = np.int64(ld(jb, g + 3))
        j2 = np.int64(ld(jb, g + 2))
        j1 = np.int64(ld(jb, g + 1))
        j0 = np.int64(ld(jb, g))
        x3, p = _renc2(x3, ld(et, 2 * j3), ld(et, 2 * j3 + 1), buf, p)
        x2, p = _renc2(x2, ld(et, 2 * j2), ld(et, 2 * j2 + 1), buf, p)
        x1, p = _renc2(x1, ld(et, 2 * j1), ld(et, 2 * j1 + 1), buf, p)
        x0, p = _renc2(x0, ld(et, 2 * j0), ld(et, 2 * j0 + 1), buf, p)
    p -= 16
    store_u32(buf, p, np.uint32(x0))
    store_u32(buf, p + 4, np.uint32(x1))
    store_u32(buf, p + 8, np.uint32(x2))
    store_u32(buf, p + 12, np.uint32(x3))
    return p


@njit(nogil=True, cache=True)
def _traw(jb, low, n, kbt, out, o):
    """The raw bits (low[i], kbt[jb[i]] of them) LSB-first at out[o:];
    returns the end.  Stores 4 bytes at a time speculatively: out must
    have 4 bytes of room past the end."""
    q = o
    acc = _U0
    nb = 0
    for i in range(n):
        acc |= np.uint64(ld(low, i)) << np.uint64(nb)
        nb += np.int64(ld(kbt, np.int64(ld(jb, i))))
        store_u32(out, q, np.uint32(acc & _M32))
        g = np.int64(nb >= 32)
        q += g << 2
        acc >>= np.uint64(g << 5)
        nb -= g << 5
    while nb > 0:
        out[q] = np.uint8(acc & np.uint64(0xFF))
        q += 1
        acc >>= _S8
        nb -= 8
    return q


@njit(nogil=True, cache=True)
def temporal_write(E, cmask, jb, low, n, W, f, cm, rawbits, out, o, lim, tbuf, kbt, et):
    """Write a temporal chunk at out[o:] without passing lim (out must have 4
    bytes of room past lim; tbuf: >= 2n + 16 bytes, kbt: uint8[NCTX * (2W +
    1)] and et: uint64[2 * NCTX * (2W + 1)] scratch).  Returns the end
    position, or -1 if it does not fit."""
    KS = 2 * W + 1
    if o + 4 > lim:
        return -1
    out[o] = CHUNK_TEMPORAL
    out[o + 1] = E
    store_u16(out, o + 2, np.uint16(cmask))
    o += 4
    for c in range(NCTX):
        if cmask & (1 << c):
            if o + freq_table_bytes(f, c << 8, KS) > lim:
                return -1
            o = write_freq_table(f, c << 8, KS, out, o)
            for s in range(KS):
                fs = f[(c << 8) + s]
                if fs > 0:
                    k = (s + 1) >> 1
                    kb = k - np.int64(k != 0)
                    _enc_entry(fs, cm[(c << 8) + s], kb, et, c * KS + s)
                    kbt[c * KS + s] = kb
    p = _tenc(jb, n, et, tbuf)
    R = tbuf.size - p
    nraw = (rawbits + 7) >> 3
    if o + 4 + R + nraw > lim:
        return -1
    store_u32(out, o, np.uint32(R))
    o += 4
    copy_bytes(out, o, tbuf, p, R)
    o += R
    q = _traw(jb, low, n, kbt, out, o)
    if q != o + nraw:  # pragma: no cover - would be a bug
        return -1
    return q


# Decoder: a vectorized pass checks the context mask, one loop decodes the
# symbols (context from the reference through a 256-entry table, 4
# interleaved rANS states), one loop reads the raw bits and writes the units.
@njit(nogil=True, cache=True)
def temporal_decode(blob, pos, end, n, layout, ref, start, out, f, cm, dtab, cb, syms):
    """Decode a temporal chunk body blob[pos:end] (after the mode byte) into
    out (units from start); cb: uint16[>= n], syms: uint8[>= n] scratch.
    Returns a status (checksum not checked here)."""
    W, mb, em = _fparams(layout)
    if pos + 3 > end:
        return ERR_TRUNC
    E = np.int64(blob[pos])
    cmask = np.int64(load_u16(blob, pos + 1))
    pos += 3
    if W == 32:
        r32 = ref[4 * start:4 * (start + n)].view(np.uint32)
        o32 = out[4 * start:4 * (start + n)].view(np.uint32)
        used = _tmask(r32, n, E, mb, em, cb, o32, W)
    else:
        r16 = ref[2 * start:2 * (start + n)].view(np.uint16)
        o16 = out[2 * start:2 * (start + n)].view(np.uint16)
        used = _tmask(r16, n, E, mb, em, cb, o16, W)
    if used != cmask:
        return ERR_CTX
    for c in range(NCTX):
        if cmask & (1 << c):
            pos = read_freq_table(blob, pos, end, 2 * W, f, c << 8, cm)
            if pos < 0:
                return ERR_FREQ
            build_rans_dtab(f, cm, c << 8, dtab, c << PROB_BITS)
    if pos + 4 > end:
        return ERR_TRUNC
    R = np.int64(load_u32(blob, pos))
    pos += 4
    if R > end - pos:
        return ERR_TRUNC
    st = _tdsyms(blob, pos, pos + R, cb, n, dtab, syms)
    if st != OK:
        return st
    if W == 32:
        st = _trecon(blob, pos + R, end, o32, n, W, syms)
        _unmono_all(o32, n, W)
    else:
        st = _trecon(blob, pos + R, end, o16, n, W, syms)
        _unmono_all(o16, n, W)
    return st


@njit(nogil=True, cache=True)
def _tmask(r, n, E, mb, em, cb, o, W):
    """cb[i] = context of r[i] << 12 (u16), o[i] = mono(r[i]); returns the
    set of contexts (branch-free: vectorizes)."""
    used = np.int32(0)
    E32 = np.int32(E)
    m = np.int32(em)
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    for i in range(n):
        rv = r[i]
        e = np.int32(rv >> mb) & m
        c = min(max(E32 - e, np.int32(0)), np.int32(14))
        c = np.int32(15) if e == m else c
        used |= np.int32(1) << c
        cb[i] = np.uint16(c << PROB_BITS)
        o[i] = _mono(np.int64(rv), sb, mask)
    return np.int64(used)


@njit(nogil=True, cache=True)
def _unmono_all(o, n, W):
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    for i in range(n):
        o[i] = _unmono(np.int64(o[i]), sb, mask)


@njit(nogil=True, cache=True)
def _tdstep(x, i, cb, dtab, syms, blob, p):
    """Symbol i from state x (table of its context, at cb[i]), renormalised
    from blob[p] (2 bytes known inside the blob); returns (x, p)."""
    e = np.int64(ld(dtab, np.int64(ld(cb, i)) + (x & 4095)))
    put(syms, i, e & 255)
    x = (((e >> 8) & 4095) + 1) * (x >> 12) + (e >> 20)
    g = np.int64(x < RANS_L)
    x = (x << (g << 4)) | (np.int64(load_u16(blob, p)) & -g)
    return x, p + (g << 1)


@njit(nogil=True, cache=True)
def _tdsyms(blob, pos, end, cb, n, dtab, syms):
    """The n symbols of the rANS stream blob[pos:end] into syms (symbol i
    with the context table at dtab[cb[i]:]).  Every word read is checked
    against end; the stream must be consumed exactly and all 4 final
    states must equal 2^16."""
    if end - pos < 16:
        return ERR_RANS
    x0 = np.int64(load_u32(blob, pos))
    x1 = np.int64(load_u32(blob, pos + 4))
    x2 = np.int64(load_u32(blob, pos + 8))
    x3 = np.int64(load_u32(blob, pos + 12))
    if x0 < RANS_L or x1 < RANS_L or x2 < RANS_L or x3 < RANS_L:
        return ERR_RANS
    p = pos + 16
    i = 0
    n4 = n & ~3
    while i < n4 and p + 8 <= end:   # <= 4 words per 4 symbols
        x0, p = _tdstep(x0, i, cb, dtab, syms, blob, p)
        x1, p = _tdstep(x1, i + 1, cb, dtab, syms, blob, p)
        x2, p = _tdstep(x2, i + 2, cb, dtab, syms, blob, p)
        x3, p = _tdstep(x3, i + 3, cb, dtab, syms, blob, p)
        i += 4
    xs = np.empty(4, np.int64)
    xs[0] = x0
    xs[1] = x1
    xs[2] = x2
    xs[3] = x3
    while i < n:
        k = i & 3
        x = xs[k]
        e = np.int64(dtab[np.int64(cb[i]) + (x & 4095)])
        syms[i] = e & 255
        x = (((e >> 8) & 4095) + 1) * (x >> 12) + (e >> 20)
        if x < RANS_L:
            if p + 2 > end:
                return ERR_RANS
            x = (x << 16) | np.int64(load_u16(blob, p))
            p += 2
        xs[k] = x
        i += 1
    if p != end:
        return ERR_RANS
    for k in range(4):
        if xs[k] != RANS_L:
            return ERR_RANS
    return OK


@njit(nogil=True, cache=True)
def _trecon(blob, bs, end, o, n, W, syms):
    """Raw bits blob[bs:end] + symbols: o[i] = mono(r[i]) -> mono(r[i]) + d
    (mod 2^W; _unmono_all then gives the units).  The fast
    loop reads 8 bytes at bit b (branch-free) while they lie inside the
    raw stream; the rest byte by byte with checks."""
    mask = (np.int64(1) << W) - 1
    L = end - bs
    b = 0
    i = 0
    # per symbol: leading one | raw bit count << 32 | negative << 40
    stab = np.empty(256, np.int64)
    for s in range(256):
        k = min((s + 1) >> 1, W)
        neg = np.int64(s != 0) & (1 - (s & 1))
        stab[s] = ((np.int64(1) << k) >> 1) | ((k - np.int64(k != 0)) << 32) | (neg << 40)
    # an element takes <= W - 1 bits: the 8 bytes at b >> 3 hold them
    while i < n and (b >> 3) + 8 <= L:
        t = ld(stab, np.int64(ld(syms, i)))
        kb = (t >> 32) & 63
        neg = -(t >> 40)
        a = (t & 0xFFFFFFFF) | np.int64(
            (load_u64(blob, bs + (b >> 3)) >> np.uint64(b & 7))
            & ((np.uint64(1) << np.uint64(kb)) - np.uint64(1)))
        b += kb
        put(o, i, (np.int64(ld(o, i)) + ((a ^ neg) - neg)) & mask)
        i += 1
    while i < n:
        s = np.int64(ld(syms, i))
        k = (s + 1) >> 1
        kb = k - np.int64(k != 0)
        neg = np.int64(s != 0) & (1 - (s & 1))
        if b + kb > 8 * L:
            return ERR_BITS
        acc = np.int64(_slow_load(blob, bs, L, b >> 3) >> np.uint64(b & 7))
        a = ((np.int64(1) << k) >> 1) | (acc & ((np.int64(1) << kb) - 1))
        b += kb
        d = (a ^ -neg) + neg
        o[i] = (np.int64(o[i]) + d) & mask
        i += 1
    if (b + 7) >> 3 != L:
        return ERR_BITS
    if b & 7:
        if (blob[bs + L - 1] >> (b & 7)) != 0:
            return ERR_BITS
    return OK
