"""lmc kernels: the delta chunk mode of format v6, the encoder - fp32 / fp16 / bf16 coded against a reference
(the previous checkpoint) through byte streams only, so that it decodes at the speed of the byte-stream modes:
the plan from a sample (``delta_plan``), the alone and XOR codings' estimates for prefer="fast"
(``stream_estimates``), the streams (``delta_build``), their codings (``delta_analyze``) and the writer
(``delta_write``).  The packed fields: ``fields``; the structural check and the decoder: ``decode``.

Each element's change is z = zigzag(mono(x) - mono(r) mod 2^W), the same monotone map as the temporal
mode (``kernels.base._mono``): a small step of a weight is a small z, also across zero.  z is cut at a bit c
(a multiple of 4): its c // 8 low bytes are byte streams, a nibble stream follows where c % 8 = 4, and the
high part h = z >> c (small where the plan is good) is packed g = 8 / q elements to a byte in fields of q
bits (q = 2, 4 or 8), a field holding min(h, 2^q - 1); an element whose field is all ones (an escape) has
h - (2^q - 1) in the escape streams, little-endian over the bytes it may need.  Packing several small values
into one byte lets a Huffman code spend less than one bit per element where most elements barely move: a
Huffman code cannot go below one bit a symbol, and byte streams of z itself would (the reason the temporal
mode used rANS).  Every stream is an ordinary stream record (raw / constant / Huffman / rANS, ``kernels.streams``).
FORMAT.md, "Delta chunk"."""

import numpy as np
from numba import njit

from ..intrinsics import ctz64, popcnt64, store_u32
from ..base import CHUNK_DELTA, LAYOUT_BF16, LAYOUT_F32, MODE_HUFF, MODE_RAW, _mono, log2_count
from ..histo import histo4
from ..streams import _write_streams, analyze_hist, analyze_planes, count_streams
from .fields import ESC_K, _escape_masks, _escape_positions, delta_rows

DSAMPLE = 64            # the plan counts one 64-element block in DSAMPLE
DSAMPLE_MIN = 4096      # below this many elements the plan counts every element
DPLAN_TABLES = 8 + 3 * 8   # the plan's histograms (_plan)
PSTRIDE = 272   # _plan's tables of packed fields: 256 bins and a gap
PLAN_OVER = np.int64(1) << 62   # delta_plan's estimate where it stopped above its limit
FAST_RAW = 16           # prefer="fast": a Huffman stream saving less than 1/FAST_RAW is stored raw,
FAST_MIN_HUFF = 8192    # and so is one of fewer symbols (its decoder tables cost more than it saves)


@njit(nogil=True, cache=True)
def _hcost(hs, c0):
    """Estimated bits of a Huffman code of the counts hs[c0:c0+256]: each symbol at its information
    content but at least one bit (a Huffman code's floor, its largest loss on a skewed stream); 0 for one
    symbol or none.  (Cheap: no code is built, a count's log2 is looked up, and only the bins counted are
    visited, in order, found from a bitmap of them: the same sum as a loop over all 256 with a branch, which
    mispredicted on sparse tables.)"""
    tot = 0
    w0 = np.uint64(0)
    w1 = np.uint64(0)
    w2 = np.uint64(0)
    w3 = np.uint64(0)
    for s in range(64):   # (vectorizes)
        tot += hs[c0 + s] + hs[c0 + 64 + s] + hs[c0 + 128 + s] + hs[c0 + 192 + s]
        w0 |= np.uint64(hs[c0 + s] > 0) << np.uint64(s)
        w1 |= np.uint64(hs[c0 + 64 + s] > 0) << np.uint64(s)
        w2 |= np.uint64(hs[c0 + 128 + s] > 0) << np.uint64(s)
        w3 |= np.uint64(hs[c0 + 192 + s] > 0) << np.uint64(s)
    if popcnt64(w0) + popcnt64(w1) + popcnt64(w2) + popcnt64(w3) <= 1:
        return 0
    lt = np.log2(np.float64(tot))
    bits = 0.0
    for q in range(4):
        w = w0 if q == 0 else (w1 if q == 1 else (w2 if q == 2 else w3))
        while w != 0:
            c = hs[c0 + 64 * q + np.int64(ctz64(w))]
            w &= w - np.uint64(1)
            bits += c * max(1.0, lt - log2_count(c))
    return np.int64(bits)


@njit(nogil=True, cache=True)
def delta_z(data, ref, start, n, layout, z):
    """z[i] = zigzag(mono(x_i) - mono(r_i) mod 2^W) for the chunk's n units (z: uint32[>= n])."""
    if layout == LAYOUT_F32:
        _dz(data[4 * start:4 * (start + n)].view(np.uint32), ref[4 * start:4 * (start + n)].view(np.uint32),
            n, 32, z)
    else:
        _dz(data[2 * start:2 * (start + n)].view(np.uint16), ref[2 * start:2 * (start + n)].view(np.uint16),
            n, 16, z)


@njit(nogil=True, cache=True)
def _dz(x, r, n, W, z):
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    for i in range(n):  # branch-free: vectorizes
        d = (_mono(np.int64(x[i]), sb, mask) - _mono(np.int64(r[i]), sb, mask)) & mask
        neg = (d >> (W - 1)) & 1
        z[i] = np.uint32(((d << 1) & mask) ^ (-neg & mask))


@njit(nogil=True, cache=True)
def delta_plan(data, ref, start, n, layout, hs, limit=-1):
    """Choose the cut c (bits: 0, 4, .., W - 4) and field width q (2, 4 or 8) from a sample of z (every
    element below DSAMPLE_MIN, else one 64-element block in DSAMPLE): the estimated bits of the sampled low
    part's and packed streams' Huffman codes (_hcost), and the escapes priced as stored (ceil((W - c)
    / 8) bytes each: they cost the decoder a visit too).  hs: int64[>= DPLAN_TABLES * 256] scratch.
    Returns (c, q, the chunk's estimated bytes in that plan: the sample's bits scaled, no tables).
    limit in [0, 2^52): where the estimate would be larger than limit, (0, 8, PLAN_OVER), the search having started
    from the bits just above limit, so that it passes over every cut that cannot come below; where it would not,
    the same plan and estimate as without a limit."""
    if layout == LAYOUT_F32:
        return _plan(data[4 * start:4 * (start + n)].view(np.uint32), ref[4 * start:4 * (start + n)].view(np.uint32),
                     n, 32, hs, limit)
    return _plan(data[2 * start:2 * (start + n)].view(np.uint16), ref[2 * start:2 * (start + n)].view(np.uint16),
                 n, 16, hs, limit)


@njit(nogil=True, cache=True)
def _plan(x, r, n, W, hs, limit):
    nc = W >> 2   # cuts c = 0, 4, .., W - 4 (index c >> 2)
    # tables (each zeroed when first counted): byte j of z at j * 256; the nibble pairs at bit 8j at (4 + j) *
    # 256; the packed stream of (c, qi) at (8 + 3 * (c >> 2) + qi) * 256
    step = 1 if n < DSAMPLE_MIN else DSAMPLE
    zs = np.empty((n // (64 * step) + 1) * 64, np.uint32)   # the sample's z, its blocks one after another
    m = 0
    for b0 in range(0, n - 7, 64 * step):
        e0 = (min(b0 + 64, n) - b0) & ~7   # (a multiple of 8: the blocks joined keep every pair and group of 4)
        _dz(x[b0:b0 + e0], r[b0:b0 + e0], e0, W, zs[m:m + e0])
        m += e0
    sc = n / (8.0 * max(m, 1))
    head = 6 + 5 * ((W >> 3) + 2)
    # above[b]: the sampled z of more than b bits (z >= 2^b), each an escape in every field of q bits at a cut c
    # with c + q <= b (z >= 2^(c + q) > (2^q - 1) << c); counted by comparisons (they vectorize), not by a
    # count of each bit length
    above = np.zeros(W + 2, np.int64)
    for b in range(W):
        t = np.uint32(1) << np.uint32(b)
        a = 0
        for i in range(m):
            a += np.int64(zs[i] >= t)
        above[b] = a
    best = np.int64(1) << 62
    if m == 0 or limit >= np.int64(1) << 52:
        limit = -1   # (the estimate is then 0; a limit so large bounds nothing)
    if limit >= 0:   # bits whose estimate is above limit (int(bits * sc) does not decrease as the bits grow)
        best = max(np.int64((limit - head) / sc) - 2, 0)
        while np.int64(best * sc) + head <= limit:
            best += 1
    bc = 0
    bq = 8
    nib = 0
    low = 0   # the low part below the cut: its byte streams (and nibble stream), as the packed stream (_hcost)
    # The cuts in order, each table counted when a cut first needs it.  The plan is the one of counting every
    # table: a cut or a width is passed over only where a bound below its bits is not below the best so far
    # (the low part grows with the cut, so at a whole byte where it alone reaches the best no later cut can win).
    # A cut's packed fields are counted into seven tables of their own (PSTRIDE apart), one per field and group
    # position, so that no count waits on the one before it (the plan of a bf16 chunk: 7.1 against 9.1 us)
    pt = np.empty(7 * PSTRIDE, np.int32)
    for ci in range(nc):
        c = 4 * ci
        j = c >> 3
        if c & 4:
            hs[(4 + j) * 256:(5 + j) * 256] = 0
            for i in range(0, m, 2):
                hs[(4 + j) * 256 + (((np.int64(zs[i]) >> (8 * j)) & 15)
                                    | (((np.int64(zs[i + 1]) >> (8 * j)) & 15) << 4))] += 1
            nib = _hcost(hs, (4 + j) * 256)
        elif c > 0:   # byte j - 1 joins the low part of every cut from c on
            hs[(j - 1) * 256:j * 256] = 0
            for i in range(m):
                hs[(j - 1) * 256 + ((np.int64(zs[i]) >> (8 * (j - 1))) & 255)] += 1
            low += _hcost(hs, (j - 1) * 256)
            if low >= best:
                break
        lo = low + nib if c & 4 else low
        # a bound below each field width's bits at this cut: the low part and the escapes that are certain (the
        # packed stream costs 0 bits or more); a cut none of whose widths can come below the best so far is not
        # counted (the plan is the one of counting every cut: a skipped width's bits are >= best)
        sb = 8 * ((W - c + 7) >> 3)
        if min(lo + above[min(c + 2, W)] * sb, min(lo + above[min(c + 4, W)] * sb,
                                                    lo + above[min(c + 8, W)] * sb)) >= best:
            continue
        t = (8 + 3 * ci) * 256
        sh = 4 * ci
        pt[:] = 0
        for i in range(0, m, 4):
            h0 = np.int64(zs[i]) >> sh
            h1 = np.int64(zs[i + 1]) >> sh
            h2 = np.int64(zs[i + 2]) >> sh
            h3 = np.int64(zs[i + 3]) >> sh
            pt[(min(h0, 3) | (min(h1, 3) << 2) | (min(h2, 3) << 4) | (min(h3, 3) << 6))] += 1
            pt[PSTRIDE + (min(h0, 15) | (min(h1, 15) << 4))] += 1
            pt[2 * PSTRIDE + (min(h2, 15) | (min(h3, 15) << 4))] += 1
            pt[3 * PSTRIDE + min(h0, 255)] += 1
            pt[4 * PSTRIDE + min(h1, 255)] += 1
            pt[5 * PSTRIDE + min(h2, 255)] += 1
            pt[6 * PSTRIDE + min(h3, 255)] += 1
        # the tables joined, and the escapes (fields all ones) from the packed streams' counts
        e2 = 0
        e4 = 0
        for v in range(256):
            h2v = np.int64(pt[v])
            h4v = np.int64(pt[PSTRIDE + v]) + np.int64(pt[2 * PSTRIDE + v])
            hs[t + v] = h2v
            hs[t + 256 + v] = h4v
            hs[t + 512 + v] = (np.int64(pt[3 * PSTRIDE + v]) + np.int64(pt[4 * PSTRIDE + v])
                               + np.int64(pt[5 * PSTRIDE + v]) + np.int64(pt[6 * PSTRIDE + v]))
            e2 += h2v * (np.int64(v & 3 == 3) + np.int64((v >> 2) & 3 == 3)
                         + np.int64((v >> 4) & 3 == 3) + np.int64(v >> 6 == 3))
            e4 += h4v * (np.int64(v & 15 == 15) + np.int64(v >> 4 == 15))
        for qi in range(3):
            esc = e2 if qi == 0 else (e4 if qi == 1 else hs[t + 512 + 255])
            bits = lo + _hcost(hs, (8 + 3 * ci + qi) * 256) + esc * sb
            if bits < best:
                best = bits
                bc = c
                bq = 2 << qi
                limit = -1   # (a plan below the limit found)
    if limit >= 0:
        return 0, 8, PLAN_OVER
    if m == 0:
        return bc, bq, np.int64(0)
    return bc, bq, np.int64(best * sc) + head


@njit(nogil=True, cache=True)
def stream_estimates(data, ref, start, n, layout, hs):
    """The alone and the XOR coding's bytes estimated from one 64-element block in DSAMPLE: the estimated
    Huffman sizes (_hcost, as the delta plan's) of their byte streams (as kernels.streams.stream_count splits
    them), scaled, plus the stream headers; below DSAMPLE_MIN elements (-1, -1) (not estimated).
    hs: int64[>= 8 * 256] scratch."""
    if n < DSAMPLE_MIN:
        return np.int64(-1), np.int64(-1)
    hs[:] = 0
    if layout == LAYOUT_F32:
        m = _count_sample(data[4 * start:4 * (start + n)].view(np.uint32),
                          ref[4 * start:4 * (start + n)].view(np.uint32), n, layout, hs)
        ns = 4
    else:
        m = _count_sample(data[2 * start:2 * (start + n)].view(np.uint16),
                          ref[2 * start:2 * (start + n)].view(np.uint16), n, layout, hs)
        ns = 2 if layout == LAYOUT_BF16 else 3
    ba = 0
    bx = 0
    for s in range(ns):
        ba += _hcost(hs, 256 * s)
        bx += _hcost(hs, 1024 + 256 * s)
    sc = n / (8.0 * m)
    return np.int64(ba * sc) + 5 * ns, np.int64(bx * sc) + 5 * ns


@njit(nogil=True, cache=True)
def _count_sample(x, r, n, layout, hs):
    """stream_estimates' counts: of the units x (tables at hs[0:]) and of x ^ r (at hs[1024:]), one
    64-element block in DSAMPLE.  Returns the number of units counted.  (In one set of tables: four, as
    temporal._tsample counts its XOR, took as long here.)"""
    m = 0
    for b0 in range(0, n - 63, 64 * DSAMPLE):
        for i in range(b0, b0 + 64):
            v = np.int64(x[i])
            count_streams(hs, 0, v, layout, 256)
            count_streams(hs, 1024, v ^ np.int64(r[i]), layout, 256)
        m += 64
    return m


@njit(nogil=True, cache=True)
def delta_scratch(unit, m):
    """The encoder's scratch for the delta mode, one set per chunk-range driver (m: the largest chunk + 16, or
    1 where the mode cannot be taken): (z, the stream rows, the plan's and the samplers' counts, per stream
    row the analysis' counts, code lengths, modes, sizes, rANS tables and cumulative frequencies, and the
    escapes' positions and block masks)."""
    r = unit + 2
    k = r if m > 1 else 1
    return (np.empty(m, np.uint32), np.empty((r, m), np.uint8), np.empty(DPLAN_TABLES * 256 if m > 1 else 1, np.int64),
            np.empty((k, 4, 256), np.int64), np.empty((k, 256), np.uint8), np.empty(k, np.int64), np.empty(k, np.int64),
            np.zeros(k * 256, np.int64), np.zeros(k * 256, np.int64), np.empty(m + ESC_K, np.int64),
            np.empty((m >> 6) + 2, np.uint64))


@njit(nogil=True, cache=True)
def delta_build(z, n, W, c, q, dpl, pos, mk):
    """The streams of the plan (c, q) into dpl rows (delta_rows): the c // 8 low byte streams (n bytes),
    the nibble stream where c % 8 = 4 (ceil(n / 2) bytes), the packed stream (ceil(n / g) bytes, unused
    fields of the last byte zero) and the ceil((W - c) / 8) escape streams (m bytes each).  Returns m, the
    number of escapes (pos: int64[>= n + ESC_K], mk: uint64[>= n / 64 + 2] scratch)."""
    nb, nib, pr, npk, er, ne = delta_rows(c, q, n, W)
    for j in range(nb):
        p = dpl[j]
        for i in range(n):
            p[i] = np.uint8((z[i] >> (8 * j)) & 255)
    if nib:
        p = dpl[nb]
        s8 = 8 * nb
        for k in range(n >> 1):
            p[k] = np.uint8(((z[2 * k] >> s8) & 15) | (((z[2 * k + 1] >> s8) & 15) << 4))
        if n & 1:
            p[n >> 1] = np.uint8((z[n - 1] >> s8) & 15)
    sh = c
    M = (np.int64(1) << q) - 1
    pk = dpl[pr]
    if q == 8:
        for i in range(n):
            pk[i] = np.uint8(min(np.int64(z[i]) >> sh, M))
    elif q == 4:
        for k in range(n >> 1):
            pk[k] = np.uint8(min(np.int64(z[2 * k]) >> sh, M) | (min(np.int64(z[2 * k + 1]) >> sh, M) << 4))
        if n & 1:
            pk[n >> 1] = np.uint8(min(np.int64(z[n - 1]) >> sh, M))
    else:
        for k in range(n >> 2):
            i = 4 * k
            pk[k] = np.uint8(min(np.int64(z[i]) >> sh, M) | (min(np.int64(z[i + 1]) >> sh, M) << 2)
                             | (min(np.int64(z[i + 2]) >> sh, M) << 4) | (min(np.int64(z[i + 3]) >> sh, M) << 6))
        if n & 3:
            acc = 0
            for i in range(n & ~3, n):
                acc |= min(np.int64(z[i]) >> sh, M) << (2 * (i & 3))
            pk[n >> 2] = np.uint8(acc)
    # the escapes, in order, found as the decoder finds them
    m = _escape_positions(mk, _escape_masks(pk, npk, q, mk), pos, n)
    for t in range(m):
        e = (np.int64(z[pos[t]]) >> sh) - M
        for j in range(ne):
            dpl[er + j, t] = np.uint8((e >> (8 * j)) & 255)
    return m


@njit(nogil=True, cache=True)
def delta_analyze(dpl, n, W, c, q, m, h, lens, modes, sizes, f, cm, rm, fast, fv):
    """Per-stream codings of the built streams (analyze_planes on the low part and the escapes, the packed
    stream counted whole; h, lens, modes, sizes, f, cm sized for W / 8 + 2 streams).  fast
    (prefer="fast"): no rANS, and a Huffman stream that saves less than 1/FAST_RAW of its bytes, or has
    fewer than FAST_MIN_HUFF symbols, is stored raw (decoding it would cost more than a raw copy gains).
    Returns the chunk's estimated bytes after its mode byte (c, q, m and the records), as the other modes'
    analyses count them."""
    if fast:
        rm = 0
    h[:] = 0   # (the driver's scratch: counted into by analyze_planes)
    nb, nib, pr, npk, er, ne = delta_rows(c, q, n, W)
    cost = 6 + analyze_planes(dpl[0:nb], n, nb, h[0:nb], lens[0:nb], modes[0:nb], sizes[0:nb], f[0:256 * nb],
                              cm[0:256 * nb], rm, fv)
    if nib:
        s = nb
        cost += analyze_planes(dpl[s:s + 1], (n + 1) >> 1, 1, h[s:s + 1], lens[s:s + 1], modes[s:s + 1],
                               sizes[s:s + 1], f[256 * s:256 * s + 256], cm[256 * s:256 * s + 256], rm, fv)
    s = pr
    h[s] = 0
    histo4(dpl[s], npk, h[s])   # (never near raw where it pays: counted without analyze_planes' sample)
    cost += analyze_hist(h[s:s + 1], npk, 1, lens[s:s + 1], modes[s:s + 1], sizes[s:s + 1],
                         f[256 * s:256 * s + 256], cm[256 * s:256 * s + 256], rm, 0, fv)
    if m > 0:
        s = er
        cost += analyze_planes(dpl[s:s + ne], m, ne, h[s:s + ne], lens[s:s + ne], modes[s:s + ne],
                               sizes[s:s + ne], f[256 * s:256 * (s + ne)], cm[256 * s:256 * (s + ne)], rm, fv)
    if fast:
        for s in range(er + (ne if m > 0 else 0)):
            k = n if s < nb else ((n + 1) >> 1 if s < pr else (npk if s == pr else m))
            if modes[s] == MODE_HUFF and (sizes[s] > k - k // FAST_RAW or k < FAST_MIN_HUFF):
                cost += k - sizes[s]
                modes[s] = MODE_RAW
                sizes[s] = k
    return cost


@njit(nogil=True, cache=True)
def delta_write(dpl, n, W, c, q, m, h, lens, modes, sizes, f, cm, out, o, lim, tbuf, fv):
    """Write the delta chunk at out[o:] (mode byte, c, q, u32 m, the records); -1 past lim."""
    if o + 7 > lim:
        return -1
    nb, nib, pr, npk, er, ne = delta_rows(c, q, n, W)
    out[o] = CHUNK_DELTA
    out[o + 1] = c
    out[o + 2] = q
    store_u32(out, o + 3, np.uint32(m))
    o += 7
    o = _write_streams(dpl, 0, n, nb, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv)
    if o >= 0 and nib:
        o = _write_streams(dpl, nb, (n + 1) >> 1, nb + 1, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv)
    if o >= 0:
        o = _write_streams(dpl, pr, npk, pr + 1, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv)
    if o < 0 or m == 0:
        return o
    return _write_streams(dpl, er, m, er + ne, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv)
