"""lmc kernels: the static rANS coder of format v2 (frequency tables, 4 interleaved states, the
context-keyed tables of the temporal mode): encoder and decoder, and the stream reader of a byte
stream coded with rANS (``decode_rans_stream``)."""

import numpy as np
from numba import njit

from ._intrinsics import ld, load_u16, load_u32, store_u16, store_u32
from ._intrinsics import st as put
from ._kbase import ERR_FREQ, ERR_RANS, OK, PROB_BITS, PROB_SCALE, RANS_L, _i4, nonzero_range


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
    lo, hi = nonzero_range(f, c0, nsym)
    b = 2
    for s in range(lo, hi + 1):
        b += 1 if f[c0 + s] < 128 else 2
    return b


@njit(nogil=True, cache=True)
def write_freq_table(f, c0, nsym, out, o):
    """lo, hi, then per symbol lo..hi its frequency: one byte if < 128, else
    two bytes 0x80 | f >> 8, f & 0xFF.  Returns the end position."""
    lo, hi = nonzero_range(f, c0, nsym)
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
    return rans_put_states(buf, p, x0, x1, x2, x3)


@njit(nogil=True, cache=True)
def rans_put_states(buf, p, x0, x1, x2, x3):
    """The encoder's 4 final states, u32 each, below buf[p] (they open the
    stream); returns the stream start p - 16."""
    p -= 16
    store_u32(buf, p, np.uint32(x0))
    store_u32(buf, p + 4, np.uint32(x1))
    store_u32(buf, p + 8, np.uint32(x2))
    store_u32(buf, p + 12, np.uint32(x3))
    return p


@njit(nogil=True, cache=True)
def rans_states(blob, pos, end):
    """The 4 initial states at blob[pos:pos + 16], read only if they lie inside the stream blob[pos:end];
    (ok, x0, x1, x2, x3), ok False where the stream is too short or a state is below 2^16."""
    if end - pos < 16:
        return False, np.int64(0), np.int64(0), np.int64(0), np.int64(0)
    x0 = np.int64(load_u32(blob, pos))
    x1 = np.int64(load_u32(blob, pos + 4))
    x2 = np.int64(load_u32(blob, pos + 8))
    x3 = np.int64(load_u32(blob, pos + 12))
    return x0 >= RANS_L and x1 >= RANS_L and x2 >= RANS_L and x3 >= RANS_L, x0, x1, x2, x3


@njit(nogil=True, cache=True)
def rans_decode(blob, pos, end, dtab, ctxs, use_ctx, out, n):
    """Decode n symbols from the rANS stream blob[pos:end] into out[0:n]
    (decode table dtab[ctxs[i] * 4096 ...] if use_ctx, else dtab[0:4096]).
    Every word read is checked against end; the stream must be consumed
    exactly and all 4 final states must equal 2^16."""
    ok, x0, x1, x2, x3 = rans_states(blob, pos, end)
    if not ok:
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
    return rans_tail(blob, p, end, x0, x1, x2, x3, i, n, dtab, ctxs, use_ctx, PROB_BITS, out)


@njit(nogil=True, cache=True)
def rans_tail(blob, p, end, x0, x1, x2, x3, i, n, dtab, ctxs, use_ctx, shift, out):
    """The symbols i..n-1 of a 4-state rANS stream whose states are x0..x3
    and next word is at blob[p] (after a fast loop has stopped within 8
    bytes of end), every word read checked against end; then the stream
    must be consumed exactly and all 4 final states must equal 2^16.
    Symbol i uses the table at dtab[ctxs[i] << shift] (use_ctx) or dtab[0]."""
    xs = _i4(x0, x1, x2, x3)
    while i < n:
        k = i & 3
        x = xs[k]
        t = 0
        if use_ctx:
            t = np.int64(ctxs[i]) << shift
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


