"""lmc kernels: the temporal chunk mode of format v2 - fp32 / fp16 / bf16 coded against a reference
(the previous checkpoint): its estimates (also the sampled estimate of the XOR mode that decides
whether to count it exactly), symbol pass and histograms, the writer (rANS streams and raw bits),
the structural check (``check_temporal``) and the decoder."""

import numpy as np
from numba import njit

from .intrinsics import f64_bits, ld, load_u16, load_u64, store_u16, store_u32, store_u64
from .intrinsics import st as put
from .base import (CHUNK_TEMPORAL, ERR_BITS, ERR_CTX, ERR_FREQ, ERR_RANS, ERR_TRUNC, LAYOUT_BF16, LAYOUT_F16,
                   LAYOUT_F32, NCTX, OK, PROB_BITS, _M32, _S8, _U0, _inc, _mono, _slow_load, _unmono, copy_bytes,
                   log2_count, nonzero_range)
from .rans import (_rans_len, check_ctx_stream, cum_freqs, decode_ctx_stream, freq_table_bytes, lanes_rest,
                   lanes_states, put_ctx_tables, put_rans, rans_cost_bits, rans_normalize, rans_states_for,
                   read_ctx_tables)
from .simd import LANES, SIMD, tmask8, trecon8
from .tenc import field_max, tsyms8
from .tfuse import fused_budget, fused_rounds
from .streams import XSTRIDE, count_streams


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
    """The largest finite exponent field of r[:n] (fields at bit mb, mask em; inf / NaN left out), 0 if none."""
    return field_max(r[:n], np.int64(em) << mb) >> mb


# Encoder.  The alone coding is counted exactly (kernels.streams.stream_count, no split
# into planes); the temporal and XOR codings are first estimated on a
# sample (temporal_sample) and counted exactly only where they may win
# (temporal_count: per element the joint symbol j = context * (2W + 1) +
# symbol, u16, and the bits of |d| below its leading one, u32).  Counts are
# kept in 4 partial tables (element i in table i % 4): consecutive elements
# never wait on each other's increment, and the Huffman sizes need the
# counts per sub-stream anyway.  Only the chosen mode is split into planes.


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


TBLOCK = 64   # the fewest elements a call of the vector raw-bit pass takes
SAMPLE = 32   # the estimates that decide which modes to analyse exactly use 1/SAMPLE
TSAMPLE_MIN = 64 * 4 * SAMPLE  # shorter chunks are not sampled (every mode is analysed)


@njit(nogil=True, cache=True)
def _ent_bits(cnt, c0, m):
    """Order-0 entropy (bits) of the counts cnt[c0:c0+m]."""
    tot = 0
    for s in range(m):
        tot += cnt[c0 + s]
    bits = 0.0
    if tot > 0:
        lt = log2_count(tot)
        for s in range(m):
            c = cnt[c0 + s]
            if c > 0:
                bits += c * (lt - log2_count(c))
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
    if n < TSAMPLE_MIN:  # small chunk: analyse every mode exactly
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
def sample_tables(ts, W, n, fv):
    """The bytes temporal_sample's estimate leaves out, from its counts ts: each context's table as
    write_freq_table writes it (a symbol 2 bytes where its share of the sample quantises to 128 or more), the
    rANS states and the chunk's head.  (Symbols the sample missed are missed here too.)"""
    KS = 2 * W + 1
    b = 7 + 4 * rans_states_for(n, fv)
    for c0 in range(0, NCTX * KS, KS):
        tot = ts[c0:c0 + KS].sum()
        if tot > 0:
            lo, hi = nonzero_range(ts, c0, KS)
            b += 2 + (hi - lo + 1)
            for s in range(lo, hi + 1):
                b += np.int64(ts[c0 + s] << PROB_BITS >= 128 * tot)
    return b


@njit(nogil=True, cache=True)
def _tsample(x, r, n, layout, E, ts, xs):
    W, mb, em = _fparams(layout)
    # the sampled units copied side by side, their joint symbols and raw bits made by the symbol pass (vectors
    # where the CPU has them: the same symbols as element by element here, which took 1.2-1.4x the time), then each
    # table counted in a loop of its own: incremented in the same loop (a count of each table an element, on the
    # few bins a chunk's samples hit) the counts of bf16 chunks took 5.7x the time on a Zen 5 core (1.05 against
    # 0.19 ns an element of the chunk; the same counts)
    cap = (n // (4 * SAMPLE) + 1) * 4
    xv = np.empty(cap, x.dtype)
    rv = np.empty(cap, x.dtype)
    m = 0
    for g in range(0, n - 3, 4 * SAMPLE):
        for u in range(4):
            xv[m + u] = x[g + u]
            rv[m + u] = r[g + u]
        m += 4
    tk = np.empty(m, np.uint16)
    low = np.empty(m + 16, np.uint32)
    raw = _tsyms_all(xv, rv, m, W, mb, em, E, tk, low)
    for j in range(m):
        ts[np.int64(tk[j])] += 1
    # the XOR's byte streams (as streams.count_streams splits them), unit u of each group into the u-th set of
    # tables (streams.XSTRIDE)
    xt = np.zeros(16 * XSTRIDE, np.int32)
    for j in range(0, m, 4):
        for u in range(4):
            count_streams(xt, 4 * u * XSTRIDE, np.int64(xv[j + u]) ^ np.int64(rv[j + u]), layout, XSTRIDE)
    for s in range(4):
        for b in range(256):
            xs[256 * s + b] = (np.int64(xt[s * XSTRIDE + b]) + np.int64(xt[(4 + s) * XSTRIDE + b])
                               + np.int64(xt[(8 + s) * XSTRIDE + b]) + np.int64(xt[(12 + s) * XSTRIDE + b]))
    return raw, m


@njit(inline="always")
def packed(W):
    """Whether the symbol pass leaves the raw bits packed in low's bytes (_tsyms_all) for W-bit units."""
    return SIMD and W == 16


@njit(nogil=True, cache=True)
def _tsyms_all(x, r, n, W, mb, em, E, jb, low):
    """_tsyms over n units.  Where the CPU has AVX2 (SIMD) all but the last n % tenc.VLANES (8, or 16 with AVX-512)
    are vectors (kernels.tenc.tsyms8), which for 16-bit units pack their raw bits too: low's bytes (low: uint32[>=
    n + 16]) then hold the chunk's raw bit stream as _traw writes it; elsewhere low[i] holds element i's raw bits.
    Returns the raw bits."""
    if not SIMD:
        return _tsyms(x, r, n, W, mb, em, E, jb, low)
    raw, m = tsyms8(x, r, n, W, mb, em, E, jb, low)
    if not packed(W):   # (32-bit units: see kernels.tenc)
        return raw + _tsyms(x[m:], r[m:], n - m, W, mb, em, E, jb[m:], low[m:])
    rb = low.view(np.uint8)
    lt = np.empty(16, np.uint32)
    t = _tsyms(x[m:], r[m:], n - m, W, mb, em, E, jb[m:], lt)
    _tpack(rb, raw, jb[m:], lt, n - m, W)
    return raw + t


@njit(nogil=True, cache=True)
def _tpack(rb, bit, jb, lt, m, W):
    """The raw bits of m (< 16) more elements (symbols jb, bits lt) appended to the stream in rb, whose first
    `bit` bits are written (zeros above them in their byte); room as _traw's."""
    KS = 2 * W + 1
    q = bit >> 3
    nb = bit & 7
    acc = np.uint64(rb[q]) & np.uint64((1 << nb) - 1)
    for i in range(m):
        s = np.int64(jb[i]) % KS
        k = (s + 1) >> 1
        acc |= np.uint64(lt[i]) << np.uint64(nb)
        acc, nb, q = _spill(acc, nb + k - np.int64(k != 0), rb, q)
    while nb > 0:
        rb[q] = np.uint8(acc & np.uint64(0xFF))
        q += 1
        acc >>= _S8
        nb -= 8


@njit(nogil=True, cache=True)
def temporal_count(data, ref, start, n, layout, E, jb, low, th):
    """Joint symbols jb and raw bits low (uint32[>= n + 16]; packed where SIMD and W = 16: _tsyms_all) of the
    chunk, their counts in 4 partial tables th (int32[4 * NCTX * (2W + 1)], zeroed here).  Returns the raw bits."""
    W, mb, em = _fparams(layout)
    th[:] = 0
    NK = NCTX * (2 * W + 1)
    if W == 32:
        x = data[4 * start:4 * (start + n)].view(np.uint32)
        r = ref[4 * start:4 * (start + n)].view(np.uint32)
        raw = _tsyms_all(x, r, n, W, mb, em, E, jb, low)
    else:
        x16 = data[2 * start:2 * (start + n)].view(np.uint16)
        r16 = ref[2 * start:2 * (start + n)].view(np.uint16)
        raw = _tsyms_all(x16, r16, n, W, mb, em, E, jb, low)
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
def temporal_estimate(hist, f, cm, W, n, fv):
    """Quantise the context tables (f, cm) and estimate the rANS part of n
    symbols in format fv: returns (bytes of tables + rANS stream, context
    mask)."""
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
    return tab + 4 * rans_states_for(n, fv) + np.int64(np.ceil(bits / 8)), mask


@njit(nogil=True, cache=True)
def _spill(acc, nb, out, q):
    """_tpack's one-element step: the accumulator's low 4 bytes stored at q (speculatively), and moved past where
    nb >= 32; returns (acc, nb, q)."""
    store_u32(out, q, np.uint32(acc & _M32))
    g = np.int64(nb >= 32)
    return acc >> np.uint64(g << 5), nb - (g << 5), q + (g << 2)


@njit(inline="always")
def _put(acc, p, v, k, out, o):
    """_traw's step with the absolute bit position p: v (k <= 62 bits) joins the pending bits of acc (those
    from bit p & ~63), whose 8 bytes are stored at o + (p >> 3 & ~7) (speculatively); where the step crosses into
    the next 8 bytes acc keeps v's bits past them.  The chains from one step to the next are an add (p) and an or
    with a select (acc); a carried bit count instead took a compare, a shift and a subtract more a step (fp32
    weights' raw bits: 0.87 ns an element against 0.62).  Returns (acc, p)."""
    sh = np.uint64(p & 63)
    lo = acc | (v << sh)
    store_u64(out, o + ((p >> 3) & ~7), lo)
    p1 = p + k
    hi = (v >> np.uint64(1)) >> (np.uint64(63) - sh)   # (the bits of v past the 8 bytes: none where sh = 0)
    return hi if (p1 >> 6) != (p >> 6) else lo, p1


@njit(nogil=True, cache=True)
def _traw(jb, low, n, kbt, out, o, group):
    """The raw bits (low[i], kbt[jb[i]] of them) LSB-first at out[o:];
    returns the end.  Stores 8 bytes at a time speculatively: out must
    have 8 bytes of room past the end.  ``group``: the bits of that many
    elements (4 for 16-bit units, at most 15 bits each; 2 for 32-bit units,
    at most 31; 1: one at a time) are joined before they meet the
    accumulator, which then waits on one step per group instead of one per
    element (the step is the writer's critical path: _put's)."""
    acc = _U0
    p = 0   # the bits written (from out[o]); acc holds those from bit p & ~63, zeros above
    i = 0
    if group == 4:   # 16-bit units: at most 60 bits
        while i + 4 <= n:
            k0 = np.int64(ld(kbt, np.int64(ld(jb, i))))
            k1 = np.int64(ld(kbt, np.int64(ld(jb, i + 1))))
            k2 = np.int64(ld(kbt, np.int64(ld(jb, i + 2))))
            k3 = np.int64(ld(kbt, np.int64(ld(jb, i + 3))))
            v = (np.uint64(ld(low, i)) | (np.uint64(ld(low, i + 1)) << np.uint64(k0))
                 | (np.uint64(ld(low, i + 2)) << np.uint64(k0 + k1))
                 | (np.uint64(ld(low, i + 3)) << np.uint64(k0 + k1 + k2)))
            acc, p = _put(acc, p, v, k0 + k1 + k2 + k3, out, o)
            i += 4
    elif group == 2:   # 32-bit units: at most 62 bits
        while i + 2 <= n:
            k0 = np.int64(ld(kbt, np.int64(ld(jb, i))))
            k1 = np.int64(ld(kbt, np.int64(ld(jb, i + 1))))
            acc, p = _put(acc, p, np.uint64(ld(low, i)) | (np.uint64(ld(low, i + 1)) << np.uint64(k0)), k0 + k1,
                          out, o)
            i += 2
    while i < n:   # (the last n % group one at a time)
        acc, p = _put(acc, p, np.uint64(ld(low, i)), np.int64(ld(kbt, np.int64(ld(jb, i)))), out, o)
        i += 1
    store_u64(out, o + ((p >> 3) & ~7), acc)   # (the pending bits, zeros after them)
    return o + ((p + 7) >> 3)


@njit(nogil=True, cache=True)
def temporal_write(E, cmask, jb, low, n, W, f, cm, rawbits, out, o, lim, tbuf, kbt, et, fv):
    """Write a temporal chunk at out[o:] without passing lim (out must have 8
    bytes of room past lim; tbuf: >= 2n + 128 bytes, kbt: uint8[NCTX * (2W +
    1)] and et: uint64[2 * NCTX * (2W + 1)] scratch; fv: the format
    version written).  Returns the end position, or -1 if it does not fit."""
    KS = 2 * W + 1
    if o + 4 > lim:
        return -1
    out[o] = CHUNK_TEMPORAL
    out[o + 1] = E
    store_u16(out, o + 2, np.uint16(cmask))
    o = put_ctx_tables(f, cm, cmask, NCTX, KS, out, o + 4, lim, et, kbt, True)
    if o < 0:
        return -1
    nraw = (rawbits + 7) >> 3
    o = put_rans(jb, n, et, tbuf, out, o, lim, nraw, rans_states_for(n, fv))
    if o < 0:
        return -1
    if packed(W):   # (by the symbol pass: _tsyms_all)
        copy_bytes(out, o, low.view(np.uint8), 0, nraw)
        q = o + nraw
    else:
        q = _traw(jb, low, n, kbt, out, o, 4 if W == 16 else 2)
    if q != o + nraw:  # pragma: no cover - would be a bug
        return -1
    return q


@njit(nogil=True, cache=True)
def check_temporal(blob, pos, end, layout, f, cm, n, version):
    """Check a temporal chunk body blob[pos:end] (after its mode byte)
    without decoding it: the context tables, the rANS stream's size and
    initial states (f, cm: int64[NCTX * 256] scratch).  Returns a status."""
    W = 32 if layout == LAYOUT_F32 else 16
    if pos + 3 > end:
        return ERR_TRUNC
    cmask = np.int64(blob[pos + 1]) | (np.int64(blob[pos + 2]) << 8)
    return check_ctx_stream(blob, pos + 3, end, cmask, NCTX, 2 * W, f, cm, rans_states_for(n, version))[0]


# Decoder: a vectorized pass checks the context mask, one loop decodes the
# symbols (context from the reference through a 256-entry table, 4 or 32
# interleaved rANS states), one loop reads the raw bits and writes the units.
# Where the CPU has AVX2, a 32-state chunk's rounds go through the three as
# one vector pass (kernels.tfuse) while their words and raw bytes certainly
# lie inside the blob; the rest through the three.
@njit(nogil=True, cache=True)
def temporal_decode(blob, pos, end, n, layout, ref, start, out, f, cm, dtab, cb, syms, version):
    """Decode a temporal chunk body blob[pos:end] (after the mode byte) into
    out (units from start); cb: uint16[>= n], syms: uint8[>= n] scratch.
    Returns a status (checksum not checked here)."""
    W, mb, em = _fparams(layout)
    if pos + 3 > end:
        return ERR_TRUNC
    E = np.int64(blob[pos])
    cmask = np.int64(load_u16(blob, pos + 1))
    S = rans_states_for(n, version)
    if W == 32:
        return _tdec(blob, pos + 3, end, n, W, mb, em, E, cmask, ref[4 * start:4 * (start + n)].view(np.uint32),
                     out[4 * start:4 * (start + n)].view(np.uint32), f, cm, dtab, cb, syms, S)
    return _tdec(blob, pos + 3, end, n, W, mb, em, E, cmask, ref[2 * start:2 * (start + n)].view(np.uint16),
                 out[2 * start:2 * (start + n)].view(np.uint16), f, cm, dtab, cb, syms, S)


@njit(nogil=True, cache=True)
def _tdec(blob, pos, end, n, W, mb, em, E, cmask, r, o, f, cm, dtab, cb, syms, S):
    """A temporal chunk body from its tables on (r, o: the chunk's reference and output units): the fused pass
    where the CPU has AVX2 and the stream has 32 states, else the three passes."""
    if SIMD and S == LANES:
        return _tdec_fused(blob, pos, end, n, W, mb, em, E, cmask, r, o, f, cm, dtab, cb, syms)
    return _tdec_three(blob, pos, end, n, W, mb, em, E, cmask, r, o, f, cm, dtab, cb, syms, S)


@njit(nogil=True, cache=True)
def _tdec_three(blob, pos, end, n, W, mb, em, E, cmask, r, o, f, cm, dtab, cb, syms, S):
    """The three passes: contexts (checked against cmask), symbols, raw bits."""
    if _tmask_all(r, n, E, mb, em, cb, o, W) != cmask:
        return ERR_CTX
    pos = read_ctx_tables(blob, pos, end, cmask, NCTX, 2 * W, f, cm, dtab)
    if pos < 0:
        return ERR_FREQ
    st, q = decode_ctx_stream(blob, pos, end, cb, n, dtab, syms, S)
    if st != OK:
        return st
    # (_trecon's vector blocks write the units of the first iv elements; the rest are still monotone)
    st, iv = _trecon(blob, q, end, o, n, W, syms, 0, 0)
    _unmono_all(o[iv:], n - iv, W)
    return st


@njit(nogil=True, cache=True)
def _tdec_fused(blob, pos, end, n, W, mb, em, E, cmask, r, o, f, cm, dtab, cb, syms):
    """A 32-state chunk: its first m = 32 g elements' rounds through kernels.tfuse, the rest through the three
    passes from element m.  The same statuses as _tdec_three: ERR_CTX wherever the contexts differ from cmask (checked
    before anything past the fused rounds is decoded; where the tables or the stream's head fail, the contexts
    are taken first)."""
    st = OK
    p = read_ctx_tables(blob, pos, end, cmask, NCTX, 2 * W, f, cm, dtab)
    R = _rans_len(blob, p, end) if p >= 0 else -1
    xs = np.empty(LANES, np.uint32)
    if p < 0:
        st = ERR_FREQ
    elif R < 0:
        st = ERR_TRUNC
    elif not lanes_states(blob, p + 4, p + 4 + R, xs):
        st = ERR_RANS
    if st != OK:
        return ERR_CTX if _tmask_all(r, n, E, mb, em, cb, o, W) != cmask else st
    rs = p + 4 + R          # the raw bits: blob[rs:end]
    L = end - rs
    io = np.empty(2, np.int64)
    io[0] = p + 4 + 4 * LANES
    io[1] = 0
    g = 0
    full = n // LANES
    used = np.int64(0)
    while g < full:
        k = fused_budget(full - g, rs - io[0], L, io[1], W)
        if k <= 0:
            break
        used |= fused_rounds(blob, io, rs, dtab, r, o, xs, g * LANES, k, mb, em, E, W)
        g += k
    m = g * LANES
    if (used | _tmask_all(r[m:], n - m, E, mb, em, cb[m:], o[m:], W)) != cmask:
        return ERR_CTX
    st = lanes_rest(blob, io[0], rs, dtab, cb[:n], syms, xs, g, n)
    if st != OK:
        return st
    st, iv = _trecon(blob, rs, end, o, n, W, syms, m, io[1])
    _unmono_all(o[iv:], n - iv, W)
    return st


@njit(nogil=True, cache=True)
def _tmask_all(r, n, E, mb, em, cb, o, W):
    """_tmask over n units: where the CPU has AVX2, all but the last n % 8 as vectors (kernels.simd.tmask8)."""
    used, m = tmask8(r, n, mb, em, E, cb, o, W)
    return used | _tmask(r[m:], n - m, E, mb, em, cb[m:], o[m:], W)


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
def _trecon(blob, bs, end, o, n, W, syms, i0, b0):
    """Raw bits blob[bs:end] + symbols i0 .. n - 1, from bit b0: o[i] = mono(r[i]) -> mono(r[i]) + d
    (mod 2^W; _unmono_all then gives the units).  The fast
    loop reads 8 bytes at bit b (branch-free) while they lie inside the
    raw stream; the rest byte by byte with checks.  Where the CPU has AVX2
    the first blocks go to the vector pass, which writes the units
    themselves.  Returns (status, the elements the vector pass wrote)."""
    mask = (np.int64(1) << W) - 1
    L = end - bs
    b = b0
    i = i0
    # per symbol: leading one | raw bit count << 32 | negative << 40
    stab = np.empty(256, np.int64)
    for s in range(256):
        k = min((s + 1) >> 1, W)
        neg = np.int64(s != 0) & (1 - (s & 1))
        stab[s] = ((np.int64(1) << k) >> 1) | ((k - np.int64(k != 0)) << 32) | (neg << 40)
    # where the CPU has AVX2, runs of vectors of 8 elements (kernels.simd.trecon8) as long as their bits (<= W - 1
    # each) and the 36 bytes read at the last vector certainly lie inside the raw stream: each run takes as many
    # vectors as the bytes left allow at W - 1 bits an element, so a chunk takes a few runs (most elements have
    # far fewer bits)
    if SIMD:
        while True:
            nv = min((n - i) >> 3, (L - (b >> 3) - 40) // (W - 1))
            if nv < TBLOCK // 8:
                break
            b += trecon8(blob, bs + (b >> 3), b & 7, o, syms, i, nv, W)
            i += 8 * nv
    iv = i
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
            return ERR_BITS, iv
        acc = np.int64(_slow_load(blob, bs, L, b >> 3) >> np.uint64(b & 7))
        a = ((np.int64(1) << k) >> 1) | (acc & ((np.int64(1) << kb) - 1))
        b += kb
        d = (a ^ -neg) + neg
        o[i] = (np.int64(o[i]) + d) & mask
        i += 1
    if (b + 7) >> 3 != L:
        return ERR_BITS, iv
    if b & 7:
        if (blob[bs + L - 1] >> (b & 7)) != 0:
            return ERR_BITS, iv
    return OK, iv
