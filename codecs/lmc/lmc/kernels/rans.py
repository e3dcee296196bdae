"""lmc kernels: the static rANS coder of format v2 (frequency tables, 4 interleaved states): encoder and
decoder, the stream reader of a byte stream coded with rANS (``decode_rans_stream``), and context rANS
(a table per context: the temporal and the mantissa-context modes' streams, written, read and checked)."""

import numpy as np
from numba import njit

from .intrinsics import ld, load_u16, load_u32, mulhi64, store_u16, store_u32
from .intrinsics import st as put
from .simd import LANES, SIMD, rounds32
from .wenc import enc_rounds
from .base import (ERR_FREQ, ERR_RANS, ERR_TRUNC, OK, PROB_BITS, PROB_SCALE, RANS_L, _S32, _i4, copy_bytes,
                     log2_count, nonzero_range)


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
    """Ideal coded size (bits) of the counts under the quantised f (f <= PROB_SCALE: its log2 looked up, the
    same value as computed)."""
    bits = 0.0
    for s in range(nsym):
        c = cnt[c0 + s]
        if c > 0:
            bits += c * (PROB_BITS - log2_count(f[c0 + s]))
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
    f[c0:c0 + 256] = 0
    cm[c0:c0 + 256] = 0
    tot = 0
    bad = False
    for s in range(lo, hi + 1):
        # (a value's length by a select, not a branch: one or two bytes at random cost a misprediction each;
        # the tests of the end are branches that only a truncated table takes)
        if pos >= end:
            return -1
        b = np.int64(blob[pos])
        two = b >> 7
        if pos + two >= end:
            return -1
        w = ((b & 0x7F) << 8) | np.int64(blob[min(pos + 1, end - 1)])
        v = w if two else b
        bad |= two == 1 and (w < 128 or w > PROB_SCALE)
        pos += 1 + two
        f[c0 + s] = v
        cm[c0 + s] = tot
        tot += v
    if bad or tot != PROB_SCALE or f[c0 + lo] == 0 or f[c0 + hi] == 0:
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
    validated table (sum 4096: every store inside dtab[t0:t0 + 4096]).  The
    entry as a running u32 sum and an unchecked store: the loop becomes
    vector stores (an indexed store with j << 20 converted per entry did
    not; 6x as fast, a tenth of a bf16 temporal chunk's decode)."""
    for s in range(256):
        fs = f[c0 + s]
        if fs > 0:
            k = t0 + cm[c0 + s]
            v = np.uint32(s | ((fs - 1) << 8))
            put(dtab, k, v)
            for j in range(1, fs):  # (v stays below 2^32: at most 4095 << 20 added)
                v += np.uint32(1 << 20)
                put(dtab, k + j, v)


# Format 7: a stream of at least LANES_MIN symbols has LANES (32) states, which a round of 32 symbols steps as
# vectors (kernels.simd); a shorter one keeps 4 (32 states cost 112 bytes more).
LANES_MIN = 8192


@njit(nogil=True, cache=True)
def rans_states_for(n, version):
    """The number of interleaved states of a rANS stream of n symbols in a blob of format `version`."""
    if version >= 7 and n >= LANES_MIN:
        return LANES
    return 4


@njit(nogil=True, cache=True)
def rans_encode(syms, ctxs, use_ctx, n, f, cm, buf, S):
    """Encode syms[0:n] (table ctxs[i] if use_ctx else 0) backwards with S (4 or 32) states; the stream (S u32
    final states, then the 16-bit words in decoding order) is placed at the end of buf (len >= 2n + 4S).
    Returns its start.  (The context coder's encoder, _tenc, with an entry per symbol of f's tables.)"""
    et = np.zeros(2 * f.size, np.uint64)
    for j in range(f.size):
        if f[j] > 0:
            _enc_entry(f[j], cm[j], 0, et, j)
    if not use_ctx:
        return _tenc(syms, n, et, buf, S)
    jb = np.empty(n, np.int64)
    for i in range(n):
        jb[i] = (np.int64(ctxs[i]) << 8) + np.int64(syms[i])
    return _tenc(jb, n, et, buf, S)


@njit(nogil=True, cache=True)
def rans_put_states(buf, p, x0, x1, x2, x3):
    """The encoder's 4 final states, u32 each, below buf[p] (they open the stream); returns the start p - 16."""
    for k, x in enumerate((x0, x1, x2, x3)):
        store_u32(buf, p - 16 + 4 * k, np.uint32(x))
    return p - 16


@njit(nogil=True, cache=True)
def rans_states(blob, pos, end):
    """The 4 initial states at blob[pos:pos + 16], read only if they lie inside the stream blob[pos:end];
    (ok, x0, x1, x2, x3, the position of the first word after them), ok False where the stream is too short
    or a state is below 2^16."""
    if end - pos < 16:
        return False, np.int64(0), np.int64(0), np.int64(0), np.int64(0), pos + 16
    x0 = np.int64(load_u32(blob, pos))
    x1 = np.int64(load_u32(blob, pos + 4))
    x2 = np.int64(load_u32(blob, pos + 8))
    x3 = np.int64(load_u32(blob, pos + 12))
    return x0 >= RANS_L and x1 >= RANS_L and x2 >= RANS_L and x3 >= RANS_L, x0, x1, x2, x3, pos + 16


@njit(nogil=True, cache=True)
def states_ok(blob, pos, end, S):
    """Whether the S initial states at blob[pos:] lie inside the stream blob[pos:end] and are each >= 2^16."""
    if end - pos < 4 * S:
        return False
    for k in range(S):
        if np.int64(load_u32(blob, pos + 4 * k)) < RANS_L:
            return False
    return True


@njit(inline="always")
def _renorm(x, blob, p):
    """State x renormalised without a branch: below 2^16 it takes the 16-bit word at blob[p] (2 bytes known
    inside the stream).  Returns (x, the next word's position)."""
    g = np.int64(x < RANS_L)
    return (x << (g << 4)) | (np.int64(load_u16(blob, p)) & -g), p + (g << 1)


@njit(nogil=True, cache=True)
def lanes_decode(blob, pos, end, dtab, cb, out, n):
    """Decode n symbols from the 32-state rANS stream blob[pos:end] into out[0:n] (symbol i with the table at
    dtab[cb[i]:], or dtab[0:4096] where cb is empty)."""
    xs = np.empty(LANES, np.uint32)
    ok = lanes_states(blob, pos, end, xs)
    return lanes_rest(blob, pos + 4 * LANES, end, dtab, cb, out, xs, 0, n) if ok else ERR_RANS


@njit(nogil=True, cache=True)
def lanes_states(blob, pos, end, xs):
    """The 32 initial states at blob[pos:] into xs; False where they do not lie inside end or one is below 2^16."""
    if end - pos < 4 * LANES:
        return False
    for k in range(LANES):
        x = load_u32(blob, pos + 4 * k)
        if np.int64(x) < RANS_L:
            return False
        xs[k] = x
    return True


@njit(nogil=True, cache=True)
def lanes_rest(blob, p, end, dtab, cb, out, xs, g, n):
    """Symbols 32 g .. n - 1 of a 32-state stream (states xs, the next word at blob[p]) into out (as
    lanes_decode).  Full rounds go to simd.rounds32 in blocks whose words lie inside the stream (a round reads
    <= 32 words, a vector 16 bytes at the pointer); the rest one symbol at a time, every word checked against
    end.  The stream must be consumed exactly and all 32 final states must equal 2^16."""
    use_cb = cb.size > 0
    full = n // LANES
    while g < full:
        r = min(full - g, (end - p - 16) // (2 * LANES))
        if r <= 0:
            break
        p = rounds32(blob, p, dtab, cb, out, xs, g * LANES, r)
        g += r
    for i in range(g * LANES, n):
        k = i & (LANES - 1)
        x, p = _checked_step(np.int64(xs[k]), np.int64(cb[i]) if use_cb else np.int64(0), dtab, out, i,
                             blob, p, end)
        if x < 0:
            return ERR_RANS
        xs[k] = np.uint32(x)
    if p != end:
        return ERR_RANS
    for k in range(LANES):
        if np.int64(xs[k]) != RANS_L:
            return ERR_RANS
    return OK


_NO_CB = np.zeros(0, np.uint16)


@njit(inline="always")
def _checked_step(x, t, dtab, out, i, blob, p, end):
    """Symbol i from state x with the table at dtab[t:] into out[i], the state renormalised from the word at
    blob[p] only if it lies inside end.  Returns (state, the next word's position), the state -1 where the
    word would pass end."""
    e = np.int64(dtab[t + (x & 4095)])
    out[i] = e & 255
    x = (((e >> 8) & 4095) + 1) * (x >> 12) + (e >> 20)
    if x < RANS_L:
        if p + 2 > end:
            return np.int64(-1), p
        x = (x << 16) | np.int64(load_u16(blob, p))
        p += 2
    return x, p


@njit(nogil=True, cache=True)
def rans_decode(blob, pos, end, dtab, ctxs, use_ctx, out, n, S):
    """Decode n symbols from the S-state rANS stream blob[pos:end] into out[0:n]
    (decode table dtab[ctxs[i] * 4096 ...] if use_ctx, else dtab[0:4096]).
    Every word read is checked against end; the stream must be consumed
    exactly and all S final states must equal 2^16."""
    if S != 4:
        if use_ctx:
            cb = np.empty(n, np.uint16)
            for i in range(n):
                cb[i] = np.uint16(np.int64(ctxs[i]) << PROB_BITS)
            return lanes_decode(blob, pos, end, dtab, cb, out, n)
        return lanes_decode(blob, pos, end, dtab, _NO_CB, out, n)
    ok, x0, x1, x2, x3, p = rans_states(blob, pos, end)
    if not ok:
        return ERR_RANS
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
        x0, p = _renorm(x0, blob, p)
        x1, p = _renorm(x1, blob, p)
        x2, p = _renorm(x2, blob, p)
        x3, p = _renorm(x3, blob, p)
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
        x, p = _checked_step(xs[k], np.int64(ctxs[i]) << shift if use_ctx else np.int64(0), dtab, out, i,
                             blob, p, end)
        if x < 0:
            return ERR_RANS
        xs[k] = x
        i += 1
    if p != end:
        return ERR_RANS
    for k in range(4):
        if xs[k] != RANS_L:
            return ERR_RANS
    return OK


@njit(nogil=True, cache=True)
def decode_rans_stream(blob, pos, plen, p, n, f, cm, dtab, version):
    """Stream mode 3: frequency table, then the rANS stream (to the end of
    the payload)."""
    end = pos + plen
    q = read_freq_table(blob, pos, end, 255, f, 0, cm)
    if q < 0:
        return ERR_FREQ
    build_rans_dtab(f, cm, 0, dtab, 0)
    return rans_decode(blob, q, end, dtab, p, False, p, n, rans_states_for(n, version))


# ---------------------------------------------------------------------------
# context rANS: symbols each coded with the table of their context (the
# temporal mode's and the mantissa-context mode's streams).  An encoder
# table entry per (context, symbol) j (_enc_entry), a joint-symbol encoder
# (_tenc), the context tables and the stream written (put_ctx_tables,
# put_rans), read (read_ctx_tables, decode_ctx_stream) and checked without
# decoding (check_ctx_stream).
# ---------------------------------------------------------------------------
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
def _tenc(jb, n, et, buf, S):
    """rANS-encode the joint symbols jb[0:n] backwards into the end of buf
    with S states (as rans_encode, with the packed table et).  Returns the
    stream start."""
    p = buf.size
    if S != 4:
        xl = np.empty(S, np.uint64)
        xl[:] = np.uint64(RANS_L)
        # (where the CPU has AVX2, the full rounds of 32 below the last partial one as vectors: wenc.enc_rounds)
        lo = (n // LANES) * LANES if SIMD and S == LANES else 0
        for i in range(n - 1, lo - 1, -1):
            j = np.int64(ld(jb, i))
            k = i & (S - 1)
            xl[k], p = _renc2(xl[k], ld(et, 2 * j), ld(et, 2 * j + 1), buf, p)
        if lo > 0:
            p = enc_rounds(jb, lo, et, buf, p, xl)
        p -= 4 * S
        for k in range(S):
            store_u32(buf, p + 4 * k, np.uint32(xl[k]))
        return p
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
    return rans_put_states(buf, p, x0, x1, x2, x3)


@njit(nogil=True, cache=True)
def put_ctx_tables(f, cm, cmask, nctx, nsym, out, o, lim, et, kbt, raw_bits):
    """The frequency tables of the contexts in cmask (context c at f[c * 256:], nsym symbols) at out[o:], and
    each present symbol's encoder entry et[c * nsym + s]; raw_bits: the temporal mode's symbols, whose k - 1 raw
    bits go to kbt[c * nsym + s] and the entry (else none).  Returns the end, or -1 if it would pass lim."""
    for c in range(nctx):
        if cmask & (1 << c):
            if o + freq_table_bytes(f, c << 8, nsym) > lim:
                return -1
            o = write_freq_table(f, c << 8, nsym, out, o)
            for s in range(nsym):
                fs = f[(c << 8) + s]
                if fs > 0:
                    kb = 0
                    if raw_bits:
                        k = (s + 1) >> 1
                        kb = k - np.int64(k != 0)
                        kbt[c * nsym + s] = kb
                    _enc_entry(fs, cm[(c << 8) + s], kb, et, c * nsym + s)
    return o


@njit(nogil=True, cache=True)
def put_rans(jb, n, et, tbuf, out, o, lim, tail, S):
    """rANS-encode the joint symbols jb[0:n] with S states (packed table et; tbuf: >= 2n + 4S bytes) and write
    u32 R and the stream at out[o:], if they and `tail` more bytes fit before lim.  Returns the end, or -1."""
    p = _tenc(jb, n, et, tbuf, S)
    R = tbuf.size - p
    if o + 4 + R + tail > lim:
        return -1
    store_u32(out, o, np.uint32(R))
    copy_bytes(out, o + 4, tbuf, p, R)
    return o + 4 + R


@njit(nogil=True, cache=True)
def _rans_len(blob, pos, end):
    """The length R of the rANS stream (u32 at blob[pos], the stream after
    it), or -1 where the length or the stream would pass end."""
    if pos + 4 > end:
        return -1
    R = np.int64(load_u32(blob, pos))
    if R > end - pos - 4:
        return -1
    return R


@njit(nogil=True, cache=True)
def read_ctx_tables(blob, pos, end, cmask, nctx, maxsym, f, cm, dtab):
    """The frequency tables of the contexts in cmask at blob[pos:end] into f, cm (context c at c * 256) and
    their decode tables dtab[c << 12:]; returns the end, or -1 for an invalid table."""
    for c in range(nctx):
        if cmask & (1 << c):
            pos = read_freq_table(blob, pos, end, maxsym, f, c << 8, cm)
            if pos < 0:
                return -1
            build_rans_dtab(f, cm, c << 8, dtab, c << PROB_BITS)
    return pos


@njit(nogil=True, cache=True)
def check_ctx_stream(blob, pos, end, cmask, nctx, maxsym, f, cm, S):
    """Check, without decoding, the context tables in cmask and the u32 R + rANS stream after them at
    blob[pos:end] (R inside end, S initial states >= 2^16).  Returns (status, the stream's end)."""
    for c in range(nctx):
        if cmask & (1 << c):
            pos = read_freq_table(blob, pos, end, maxsym, f, 0, cm)
            if pos < 0:
                return ERR_FREQ, 0
    R = _rans_len(blob, pos, end)
    if R < 0:
        return ERR_TRUNC, 0
    if not states_ok(blob, pos + 4, pos + 4 + R, S):    # (4S bytes of states, each >= 2^16)
        return ERR_RANS, 0
    return OK, pos + 4 + R


@njit(nogil=True, cache=True)
def _tdstep(x, i, cb, dtab, syms, blob, p):
    """Symbol i from state x (table of its context, at cb[i]), renormalised
    from blob[p] (2 bytes known inside the blob); returns (x, p)."""
    e = np.int64(ld(dtab, np.int64(ld(cb, i)) + (x & 4095)))
    put(syms, i, e & 255)
    x = (((e >> 8) & 4095) + 1) * (x >> 12) + (e >> 20)
    return _renorm(x, blob, p)


@njit(nogil=True, cache=True)
def _tdsyms(blob, pos, end, cb, n, dtab, syms, S):
    """The n symbols of the S-state rANS stream blob[pos:end] into syms
    (symbol i with the context table at dtab[cb[i]:]).  Every word read is
    checked against end; the stream must be consumed exactly and all S
    final states must equal 2^16."""
    if S != 4:
        return lanes_decode(blob, pos, end, dtab, cb[:n], syms, n)
    ok, x0, x1, x2, x3, p = rans_states(blob, pos, end)
    if not ok:
        return ERR_RANS
    i = 0
    n4 = n & ~3
    while i < n4 and p + 8 <= end:   # <= 4 words per 4 symbols
        x0, p = _tdstep(x0, i, cb, dtab, syms, blob, p)
        x1, p = _tdstep(x1, i + 1, cb, dtab, syms, blob, p)
        x2, p = _tdstep(x2, i + 2, cb, dtab, syms, blob, p)
        x3, p = _tdstep(x3, i + 3, cb, dtab, syms, blob, p)
        i += 4
    return rans_tail(blob, p, end, x0, x1, x2, x3, i, n, dtab, cb, True, 0, syms)


@njit(nogil=True, cache=True)
def decode_ctx_stream(blob, pos, end, cb, n, dtab, syms, S):
    """u32 R and the S-state rANS stream after it at blob[pos:end]: its n symbols into syms (symbol i with the
    table at dtab[cb[i]:]).  Returns (status, the stream's end)."""
    R = _rans_len(blob, pos, end)
    if R < 0:
        return ERR_TRUNC, 0
    return _tdsyms(blob, pos + 4, pos + 4 + R, cb, n, dtab, syms, S), pos + 4 + R
