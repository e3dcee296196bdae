"""Numba kernels of the lmc codec.

Serial per-chunk kernels are ``@njit(nogil=True, cache=True)``; the thin
drivers at the bottom are ``parallel=True`` and loop over chunks with
``prange`` (not cached, as Numba cannot cache parallel functions reliably).

All data buffers are flat ``uint8`` arrays; elements ("units") of 1, 2, 4 or
8 bytes are read with unaligned little-endian loads (see ``_intrinsics``).

Memory safety: every kernel that reads a compressed blob validates each
length/offset against the chunk end *before* touching memory, and the
Huffman decoder only uses wide loads where the 8 bytes are known to lie
inside the sub-stream (slow byte-wise refill otherwise).
"""
import numpy as np
from numba import njit, prange

from ._intrinsics import load_u16, load_u32, load_u64, store_u16, store_u32, store_u64

MAXLEN = 11
TABSIZE = 1 << MAXLEN

MODE_RAW = 0
MODE_CONST = 1
MODE_HUFF = 2

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

ERROR_MESSAGES = {
    ERR_TRUNC: "chunk data truncated (a length points past the end of the chunk)",
    ERR_FLAGS: "invalid chunk flags byte",
    ERR_NOREF: "chunk is delta-coded but no reference is available",
    ERR_MODE: "invalid stream mode",
    ERR_LEN: "stream payload length inconsistent with its mode",
    ERR_TABLE: "invalid Huffman table header",
    ERR_KRAFT: "invalid Huffman code lengths (length > 11 or Kraft sum != 1)",
    ERR_STREAM: "Huffman bit stream overrun or length mismatch",
    ERR_PAD: "non-zero padding bits at the end of a Huffman bit stream",
    ERR_TRAIL: "unused trailing bytes in chunk",
    ERR_CHECKSUM: "chunk checksum mismatch (corrupt data or wrong reference)",
}

_M11 = np.uint64(TABSIZE - 1)
_U0 = np.uint64(0)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@njit(nogil=True, cache=True)
def _fold(s1, s2):
    a = (s1 ^ (s1 >> _S32)) & _M32
    b = (s2 ^ (s2 >> _S32)) & _M32
    return a | (b << _S32)


# ---------------------------------------------------------------------------
# checksums
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def checksum_units(data, start, n, unit):
    """Fletcher-like 2x64-bit running sum over n units starting at unit
    ``start``, folded to 64 bits.  Same value as computed by split/merge."""
    s1 = _U0
    s2 = _U0
    base = start * unit
    if unit == 1:
        for i in range(n):
            s1 += np.uint64(data[base + i])
            s2 += s1
    elif unit == 2:
        for i in range(n):
            s1 += np.uint64(load_u16(data, base + 2 * i))
            s2 += s1
    elif unit == 4:
        for i in range(n):
            s1 += np.uint64(load_u32(data, base + 4 * i))
            s2 += s1
    else:
        for i in range(n):
            s1 += load_u64(data, base + 8 * i)
            s2 += s1
    return _fold(s1, s2)


# ---------------------------------------------------------------------------
# stream grouping
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def split_chunk(data, ref, use_ref, start, n, unit, layout, planes):
    """Split n units into byte planes (planes[s, :n]); XOR with ``ref`` first
    when use_ref.  Returns the checksum of the ORIGINAL units."""
    s1 = _U0
    s2 = _U0
    base = start * unit
    if layout == LAYOUT_BF16:
        p0 = planes[0]
        p1 = planes[1]
        for i in range(n):
            off = base + 2 * i
            v = load_u16(data, off)
            s1 += np.uint64(v)
            s2 += s1
            if use_ref:
                v ^= load_u16(ref, off)
            p0[i] = np.uint8((v >> 7) & 0xFF)
            p1[i] = np.uint8(((v >> 8) & 0x80) | (v & 0x7F))
    elif layout == LAYOUT_F16:
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        for i in range(n):
            off = base + 2 * i
            v = load_u16(data, off)
            s1 += np.uint64(v)
            s2 += s1
            if use_ref:
                v ^= load_u16(ref, off)
            p0[i] = np.uint8((v >> 10) & 0x1F)
            p1[i] = np.uint8(((v >> 13) & 0x4) | ((v >> 8) & 0x3))
            p2[i] = np.uint8(v & 0xFF)
    elif layout == LAYOUT_F32:
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        p3 = planes[3]
        for i in range(n):
            off = base + 4 * i
            v = load_u32(data, off)
            s1 += np.uint64(v)
            s2 += s1
            if use_ref:
                v ^= load_u32(ref, off)
            p0[i] = np.uint8((v >> 23) & 0xFF)
            p1[i] = np.uint8(((v >> 24) & 0x80) | ((v >> 16) & 0x7F))
            p2[i] = np.uint8((v >> 8) & 0xFF)
            p3[i] = np.uint8(v & 0xFF)
    else:
        if unit == 1:
            p0 = planes[0]
            for i in range(n):
                v = data[base + i]
                s1 += np.uint64(v)
                s2 += s1
                if use_ref:
                    v ^= ref[base + i]
                p0[i] = v
        elif unit == 2:
            p0 = planes[0]
            p1 = planes[1]
            for i in range(n):
                off = base + 2 * i
                v = load_u16(data, off)
                s1 += np.uint64(v)
                s2 += s1
                if use_ref:
                    v ^= load_u16(ref, off)
                p0[i] = np.uint8(v & 0xFF)
                p1[i] = np.uint8(v >> 8)
        elif unit == 4:
            for i in range(n):
                off = base + 4 * i
                v = load_u32(data, off)
                s1 += np.uint64(v)
                s2 += s1
                if use_ref:
                    v ^= load_u32(ref, off)
                for j in range(4):
                    planes[j, i] = np.uint8((v >> (8 * j)) & 0xFF)
        else:
            for i in range(n):
                off = base + 8 * i
                v = load_u64(data, off)
                s1 += v
                s2 += s1
                if use_ref:
                    v ^= load_u64(ref, off)
                for j in range(8):
                    planes[j, i] = np.uint8((v >> np.uint64(8 * j)) & np.uint64(0xFF))
    return _fold(s1, s2)


@njit(nogil=True, cache=True)
def merge_chunk(planes, n, out, ref, use_ref, start, unit, layout):
    """Inverse of split_chunk: write n units to ``out`` (XOR with ref when
    use_ref) and return the checksum of the written units."""
    s1 = _U0
    s2 = _U0
    base = start * unit
    if layout == LAYOUT_BF16:
        p0 = planes[0]
        p1 = planes[1]
        for i in range(n):
            off = base + 2 * i
            sm = np.uint16(p1[i])
            v = np.uint16(((sm & 0x80) << 8) | (np.uint16(p0[i]) << 7) | (sm & 0x7F))
            if use_ref:
                v ^= load_u16(ref, off)
            store_u16(out, off, v)
            s1 += np.uint64(v)
            s2 += s1
    elif layout == LAYOUT_F16:
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        for i in range(n):
            off = base + 2 * i
            a = np.uint16(p1[i])
            v = np.uint16(((a & 0x4) << 13) | ((np.uint16(p0[i]) & 0x1F) << 10)
                          | ((a & 0x3) << 8) | np.uint16(p2[i]))
            if use_ref:
                v ^= load_u16(ref, off)
            store_u16(out, off, v)
            s1 += np.uint64(v)
            s2 += s1
    elif layout == LAYOUT_F32:
        p0 = planes[0]
        p1 = planes[1]
        p2 = planes[2]
        p3 = planes[3]
        for i in range(n):
            off = base + 4 * i
            a = np.uint32(p1[i])
            v = np.uint32(((a & 0x80) << 24) | (np.uint32(p0[i]) << 23) | ((a & 0x7F) << 16)
                          | (np.uint32(p2[i]) << 8) | np.uint32(p3[i]))
            if use_ref:
                v ^= load_u32(ref, off)
            store_u32(out, off, v)
            s1 += np.uint64(v)
            s2 += s1
    else:
        if unit == 1:
            p0 = planes[0]
            for i in range(n):
                v = p0[i]
                if use_ref:
                    v ^= ref[base + i]
                out[base + i] = v
                s1 += np.uint64(v)
                s2 += s1
        elif unit == 2:
            p0 = planes[0]
            p1 = planes[1]
            for i in range(n):
                off = base + 2 * i
                v = np.uint16(np.uint16(p0[i]) | (np.uint16(p1[i]) << 8))
                if use_ref:
                    v ^= load_u16(ref, off)
                store_u16(out, off, v)
                s1 += np.uint64(v)
                s2 += s1
        elif unit == 4:
            for i in range(n):
                off = base + 4 * i
                v = np.uint32(np.uint32(planes[0, i]) | (np.uint32(planes[1, i]) << 8)
                              | (np.uint32(planes[2, i]) << 16) | (np.uint32(planes[3, i]) << 24))
                if use_ref:
                    v ^= load_u32(ref, off)
                store_u32(out, off, v)
                s1 += np.uint64(v)
                s2 += s1
        else:
            for i in range(n):
                off = base + 8 * i
                v = _U0
                for j in range(8):
                    v |= np.uint64(planes[j, i]) << np.uint64(8 * j)
                if use_ref:
                    v ^= load_u64(ref, off)
                store_u64(out, off, v)
                s1 += v
                s2 += s1
    return _fold(s1, s2)


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
def huffman_lengths(freq, lens):
    """Length-limited (<= 11) Huffman code lengths for 256 symbol
    frequencies.  Writes lens (uint8[256], 0 = absent) and returns the number
    of present symbols.  With >= 2 symbols the code is complete (Kraft sum
    exactly 1).  Limiting is done by halving the frequencies (keeping them
    non-zero) and rebuilding until the depth fits."""
    f = np.zeros(256, np.int64)
    m = 0
    for s in range(256):
        lens[s] = 0
        if freq[s] > 0:
            f[s] = freq[s]
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
    while True:
        j = 0
        for s in range(256):
            if f[s] > 0:
                keys[j] = f[s] * 256 + s
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
        for s in range(256):
            if f[s] > 0:
                f[s] = max(1, f[s] >> 1)


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
def analyze_planes(planes, n, ns, h, lens, modes, sizes):
    """Choose a mode per stream; returns the total payload size (incl. the
    5-byte stream headers)."""
    freq = np.empty(256, np.int64)
    sub = np.empty(4, np.int64)
    total = 0
    for s in range(ns):
        p = planes[s]
        histo4(p, n, h[s])
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
        total += 5 + sizes[s]
    return total


@njit(nogil=True, cache=True)
def _encode_sub(p, n, k, codes, lens, out, o):
    """Encode symbols p[k], p[k+4], ... LSB-first at out[o:].  Writes up to 8
    bytes past the end of the produced data (caller provides slack).
    Returns the new output position."""
    acc = _U0
    nb = 0
    cnt = (n - k + 3) >> 2
    j = 0
    while j + 4 <= cnt:
        i = k + 4 * j
        s = p[i]
        acc |= codes[s] << np.uint64(nb)
        nb += lens[s]
        s = p[i + 4]
        acc |= codes[s] << np.uint64(nb)
        nb += lens[s]
        s = p[i + 8]
        acc |= codes[s] << np.uint64(nb)
        nb += lens[s]
        s = p[i + 12]
        acc |= codes[s] << np.uint64(nb)
        nb += lens[s]
        store_u64(out, o, acc)
        nbytes = nb >> 3
        o += nbytes
        acc >>= np.uint64(nbytes * 8)
        nb &= 7
        j += 4
    while j < cnt:
        s = p[k + 4 * j]
        acc |= codes[s] << np.uint64(nb)
        nb += lens[s]
        store_u64(out, o, acc)
        nbytes = nb >> 3
        o += nbytes
        acc >>= np.uint64(nbytes * 8)
        nb &= 7
        j += 1
    if nb > 0:
        out[o] = np.uint8(acc & np.uint64(0xFF))
        o += 1
    return o


@njit(nogil=True, cache=True)
def _write_stream(p, n, mode, size, h, lens, out, o):
    out[o] = mode
    store_u32(out, o + 1, np.uint32(size))
    o += 5
    if mode == MODE_RAW:
        out[o:o + n] = p[:n]
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
    for k in range(4):
        o = _encode_sub(p, n, k, codes, ln, out, o)
    return o


@njit(nogil=True, cache=True)
def encode_chunk(data, ref, has_ref, start, n, unit, layout, ns, out, o):
    """Encode one chunk at out[o:].  Returns (size, checksum)."""
    planes = np.empty((ns, n), np.uint8)
    h = np.zeros((ns, 4, 256), np.int64)
    lens = np.zeros((ns, 256), np.uint8)
    modes = np.empty(ns, np.int64)
    sizes = np.empty(ns, np.int64)
    chk = split_chunk(data, ref, False, start, n, unit, layout, planes)
    cost = analyze_planes(planes, n, ns, h, lens, modes, sizes)
    flags = 0
    if has_ref:
        planes2 = np.empty((ns, n), np.uint8)
        h2 = np.zeros((ns, 4, 256), np.int64)
        lens2 = np.zeros((ns, 256), np.uint8)
        modes2 = np.empty(ns, np.int64)
        sizes2 = np.empty(ns, np.int64)
        split_chunk(data, ref, True, start, n, unit, layout, planes2)
        cost2 = analyze_planes(planes2, n, ns, h2, lens2, modes2, sizes2)
        if cost2 < cost:
            flags = 1
            planes = planes2
            h = h2
            lens = lens2
            modes = modes2
            sizes = sizes2
    o0 = o
    out[o] = flags
    o += 1
    for s in range(ns):
        o = _write_stream(planes[s], n, modes[s], sizes[s], h[s], lens[s], out, o)
    return o - o0, chk


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
def huff_decode4(buf, st, ln, dec, out, n):
    """Decode n symbols from 4 interleaved LSB-first sub-streams (symbol i in
    sub-stream i % 4); sub-stream k occupies buf[st[k] : st[k] + ln[k]]."""
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
    full = n >> 2
    r = 0
    while r + 5 <= full:
        # 8-byte loads must lie inside each sub-stream
        if ((b0 >> 3) + 8 > L0 or (b1 >> 3) + 8 > L1
                or (b2 >> 3) + 8 > L2 or (b3 >> 3) + 8 > L3):
            break
        a0 = load_u64(buf, s0 + (b0 >> 3)) >> np.uint64(b0 & 7)
        a1 = load_u64(buf, s1 + (b1 >> 3)) >> np.uint64(b1 & 7)
        a2 = load_u64(buf, s2 + (b2 >> 3)) >> np.uint64(b2 & 7)
        a3 = load_u64(buf, s3 + (b3 >> 3)) >> np.uint64(b3 & 7)
        o = 4 * r
        for t in range(5):
            e0 = dec[a0 & _M11]
            e1 = dec[a1 & _M11]
            e2 = dec[a2 & _M11]
            e3 = dec[a3 & _M11]
            out[o] = np.uint8(e0 & 0xFF)
            out[o + 1] = np.uint8(e1 & 0xFF)
            out[o + 2] = np.uint8(e2 & 0xFF)
            out[o + 3] = np.uint8(e3 & 0xFF)
            l0 = e0 >> 8
            l1 = e1 >> 8
            l2 = e2 >> 8
            l3 = e3 >> 8
            a0 >>= l0
            a1 >>= l1
            a2 >>= l2
            a3 >>= l3
            b0 += np.int64(l0)
            b1 += np.int64(l1)
            b2 += np.int64(l2)
            b3 += np.int64(l3)
            o += 4
        r += 5
    bp = np.empty(4, np.int64)
    bp[0] = b0
    bp[1] = b1
    bp[2] = b2
    bp[3] = b3
    for i in range(4 * r, n):
        k = i & 3
        b = bp[k]
        L = ln[k]
        if b > 8 * L:
            return ERR_STREAM
        acc = _slow_load(buf, st[k], L, b >> 3) >> np.uint64(b & 7)
        e = dec[acc & _M11]
        out[i] = np.uint8(e & 0xFF)
        bp[k] = b + np.int64(e >> 8)
    for k in range(4):
        b = bp[k]
        L = ln[k]
        if (b + 7) >> 3 != L:
            return ERR_STREAM
        if b & 7:
            if (buf[st[k] + L - 1] >> (b & 7)) != 0:
                return ERR_PAD
    return OK


@njit(nogil=True, cache=True)
def decode_huff_stream(blob, pos, plen, p, n, lens, dec):
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
    return huff_decode4(blob, st, ln, dec, p, n)


@njit(nogil=True, cache=True)
def decode_chunk(blob, off, clen, n, unit, layout, ns, ref, has_ref, out, start, expected):
    end = off + clen
    if clen < 1:
        return ERR_TRUNC
    flags = blob[off]
    if flags > 1:
        return ERR_FLAGS
    delta = flags == 1
    if delta and not has_ref:
        return ERR_NOREF
    pos = off + 1
    planes = np.empty((ns, n), np.uint8)
    dec = np.empty(TABSIZE, np.uint16)
    lens = np.empty(256, np.uint8)
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
            p[:] = blob[pos:pos + n]
        elif mode == MODE_CONST:
            if plen != 1:
                return ERR_LEN
            p[:] = blob[pos]
        elif mode == MODE_HUFF:
            st = decode_huff_stream(blob, pos, plen, p, n, lens, dec)
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
# parallel drivers (thin, not cached)
# ---------------------------------------------------------------------------
@njit(parallel=True, nogil=True)
def encode_all(data, ref, has_ref, total, chunk, unit, layout, ns, scratch, cap, sizes, chks):
    nch = sizes.shape[0]
    for c in prange(nch):
        start = c * chunk
        n = min(chunk, total - start)
        sz, ck = encode_chunk(data, ref, has_ref, start, n, unit, layout, ns, scratch, c * cap)
        sizes[c] = sz
        chks[c] = ck


@njit(parallel=True, nogil=True)
def gather_all(scratch, cap, sizes, offsets, out):
    nch = sizes.shape[0]
    for c in prange(nch):
        a = offsets[c]
        b = c * cap
        out[a:a + sizes[c]] = scratch[b:b + sizes[c]]


@njit(parallel=True, nogil=True)
def decode_all(blob, offsets, sizes, chks, total, chunk, unit, layout, ns, ref, has_ref, out, status):
    nch = sizes.shape[0]
    for c in prange(nch):
        start = c * chunk
        n = min(chunk, total - start)
        status[c] = decode_chunk(blob, offsets[c], sizes[c], n, unit, layout, ns,
                                 ref, has_ref, out, start, chks[c])


@njit(parallel=True, nogil=True)
def checksum_all(data, total, chunk, unit, chks):
    nch = chks.shape[0]
    for c in prange(nch):
        start = c * chunk
        n = min(chunk, total - start)
        chks[c] = checksum_units(data, start, n, unit)
