"""lmc kernels: the delta chunk mode of format v6 - fp32 / fp16 / bf16 coded against a reference (the
previous checkpoint) through byte streams only, so that it decodes at the speed of the byte-stream
modes: the plan from a sample (``delta_plan``), the streams (``delta_build``), the writer, the
structural check (``check_delta``) and the decoder (``delta_decode``).

Each element's change is z = zigzag(mono(x) - mono(r) mod 2^W), the same monotone map as the temporal
mode (``_ktemporal._mono``): a small step of a weight is a small z, also across zero.  z is cut at bit
8b: its b low bytes are b byte streams, and the high part h = z >> 8b (small where the plan is good) is
packed g = 8 / q elements to a byte in fields of q bits (q = 2, 4 or 8), a field holding min(h, 2^q - 1);
an element whose field is all ones (an escape) has h - (2^q - 1) in the escape streams, little-endian over
the unit - b bytes it may need.  Packing several small values into one byte lets a Huffman code spend
less than one bit per element where most elements barely move: a Huffman code cannot go below one bit a
symbol, and byte streams of z itself would (the reason the temporal mode used rANS).  Every stream is
an ordinary stream record (raw / constant / Huffman / rANS, ``_kstreams``); the decoder's other passes
are branch-free loops over the elements; the escapes are found 64 fields at a time (a bit mask per block,
ESC_K positions a block taken without a branch each) and fixed up alone.  FORMAT.md, "Delta chunk"."""

import numpy as np
from numba import njit

from ._intrinsics import ctz64, load_u32, load_u64, popcnt64, store_u32
from ._kbase import CHUNK_DELTA, ERR_DELTA, ERR_TRAIL, ERR_TRUNC, LAYOUT_BF16, LAYOUT_F32, MODE_HUFF, MODE_RAW, OK, _U0
from ._khuffman import histo4
from ._kstreams import (_read_record, _write_streams, analyze_hist, analyze_planes, check_records, count_streams,
                        decode_records)
from ._ktemporal import _mono, _unmono

DSAMPLE = 64            # the plan counts one 64-element block in DSAMPLE
DSAMPLE_MIN = 4096      # below this many elements the plan counts every element
DPLAN_TABLES = 8 + 3 * 8   # the plan's histograms (_plan)
FAST_RAW = 16           # prefer="fast": a Huffman stream saving less than 1/FAST_RAW is stored raw,
FAST_MIN_HUFF = 8192    # and so is one of fewer symbols (its decoder tables cost more than it saves)
ESC_K = 4               # escapes found per 64-field block without a branch each (_escape_positions)


@njit(nogil=True, cache=True)
def _log2_table(k):
    """log2(c) for c < k, by the compiled code's own log2 (what _hcost computes above the table)."""
    t = np.zeros(k, np.float64)
    for c in range(1, k):
        t[c] = np.log2(np.float64(c))
    return t


LOG2_K = 4096
_LOG2 = _log2_table(LOG2_K)   # (a constant of the compiled kernels)


@njit(nogil=True, cache=True)
def _hcost(hs, c0):
    """Estimated bits of a Huffman code of the counts hs[c0:c0+256]: each symbol at its information
    content but at least one bit (a Huffman code's floor, its largest loss on a skewed stream); 0 for one
    symbol or none.  (Cheap: no code is built, and a count's log2 is looked up.)"""
    tot = 0
    k = 0
    for s in range(256):
        tot += hs[c0 + s]
        k += np.int64(hs[c0 + s] > 0)
    if k <= 1:
        return 0
    lt = np.log2(np.float64(tot))
    bits = 0.0
    for s in range(256):
        c = hs[c0 + s]
        if c > 0:
            bits += c * max(1.0, lt - (_LOG2[c] if c < LOG2_K else np.log2(np.float64(c))))
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
def delta_plan(data, ref, start, n, layout, hs):
    """Choose the cut c (bits: 0, 4, .., W - 4) and field width q (2, 4 or 8) from a sample of z (every
    element below DSAMPLE_MIN, else one 64-element block in DSAMPLE): the estimated bits of the sampled low
    part's and packed streams' Huffman codes (_hcost), and the escapes priced as stored (ceil((W - c)
    / 8) bytes each: they cost the decoder a visit too).  hs: int64[>= DPLAN_TABLES * 256] scratch.
    Returns (c, q, the chunk's estimated bytes in that plan: the sample's bits scaled, no tables)."""
    if layout == LAYOUT_F32:
        return _plan(data[4 * start:4 * (start + n)].view(np.uint32), ref[4 * start:4 * (start + n)].view(np.uint32),
                     n, 32, hs)
    return _plan(data[2 * start:2 * (start + n)].view(np.uint16), ref[2 * start:2 * (start + n)].view(np.uint16),
                 n, 16, hs)


@njit(nogil=True, cache=True)
def _plan(x, r, n, W, hs):
    nc = W >> 2   # cuts c = 0, 4, .., W - 4 (index c >> 2)
    hs[:] = 0
    # tables: byte j of z at j * 256; the nibble pairs at bit 8j at (4 + j) * 256; the packed stream of
    # (c, qi) at (8 + 3 * (c >> 2) + qi) * 256
    esc = np.zeros(3 * nc, np.int64)
    z = np.empty(64, np.uint32)
    step = 1 if n < DSAMPLE_MIN else DSAMPLE
    m = 0
    for b0 in range(0, n - 7, 64 * step):
        e0 = (min(b0 + 64, n) - b0) & ~7
        _dz(x[b0:b0 + e0], r[b0:b0 + e0], e0, W, z)
        m += e0
        for j in range(W >> 3):
            for i in range(e0):
                hs[j * 256 + ((np.int64(z[i]) >> (8 * j)) & 255)] += 1
            for i in range(0, e0, 2):
                hs[(4 + j) * 256 + (((np.int64(z[i]) >> (8 * j)) & 15)
                                    | (((np.int64(z[i + 1]) >> (8 * j)) & 15) << 4))] += 1
        for ci in range(nc):
            t = (8 + 3 * ci) * 256
            sh = 4 * ci
            for i in range(0, e0, 4):
                h0 = np.int64(z[i]) >> sh
                h1 = np.int64(z[i + 1]) >> sh
                h2 = np.int64(z[i + 2]) >> sh
                h3 = np.int64(z[i + 3]) >> sh
                hs[t + (min(h0, 3) | (min(h1, 3) << 2) | (min(h2, 3) << 4) | (min(h3, 3) << 6))] += 1
                hs[t + 256 + (min(h0, 15) | (min(h1, 15) << 4))] += 1
                hs[t + 256 + (min(h2, 15) | (min(h3, 15) << 4))] += 1
                hs[t + 512 + min(h0, 255)] += 1
                hs[t + 512 + min(h1, 255)] += 1
                hs[t + 512 + min(h2, 255)] += 1
                hs[t + 512 + min(h3, 255)] += 1
    # the escapes (fields all ones), from the packed streams' counts
    for ci in range(nc):
        t = (8 + 3 * ci) * 256
        for v in range(256):
            esc[3 * ci] += hs[t + v] * (np.int64(v & 3 == 3) + np.int64((v >> 2) & 3 == 3)
                                        + np.int64((v >> 4) & 3 == 3) + np.int64(v >> 6 == 3))
            esc[3 * ci + 1] += hs[t + 256 + v] * (np.int64(v & 15 == 15) + np.int64(v >> 4 == 15))
        esc[3 * ci + 2] = hs[t + 512 + 255]
    best = np.int64(1) << 62
    bc = 0
    bq = 8
    for ci in range(nc):
        c = 4 * ci
        # the low part: its byte streams and nibble stream, as the packed stream (_hcost)
        low = 0
        for j in range(c >> 3):
            low += _hcost(hs, j * 256)
        if c & 4:
            low += _hcost(hs, (4 + (c >> 3)) * 256)
        for qi in range(3):
            bits = low + _hcost(hs, (8 + 3 * ci + qi) * 256) + esc[3 * ci + qi] * 8 * ((W - c + 7) >> 3)
            if bits < best:
                best = bits
                bc = c
                bq = 2 << qi
    if m == 0:
        return bc, bq, np.int64(0)
    return bc, bq, np.int64(best * (n / (8.0 * m))) + 6 + 5 * ((W >> 3) + 2)


@njit(nogil=True, cache=True)
def stream_estimates(data, ref, start, n, layout, hs):
    """The alone and the XOR coding's bytes estimated from one 64-element block in DSAMPLE: the estimated
    Huffman sizes (_hcost, as the delta plan's) of their byte streams (as _kstreams.stream_count splits
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
    64-element block in DSAMPLE.  Returns the number of units counted."""
    m = 0
    for b0 in range(0, n - 63, 64 * DSAMPLE):
        for i in range(b0, b0 + 64):
            v = np.int64(x[i])
            count_streams(hs, 0, v, layout)
            count_streams(hs, 1024, v ^ np.int64(r[i]), layout)
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
def delta_rows(c, q, n, W):
    """(number of low byte streams, whether a nibble stream follows, the packed stream's row and length,
    the first escape row, the number of escape streams) of the plan (c, q); the rows of the low byte
    streams are 0.., the nibble stream's the next."""
    nb = c >> 3
    nib = (c & 4) != 0
    pr = nb + (1 if nib else 0)
    g = 8 // q
    return nb, nib, pr, (n + g - 1) // g, pr + 1, (W - c + 7) >> 3


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
def _word(pk, k, ns):
    """The packed bytes pk[k:k+8] as a little-endian word (zero past ns)."""
    if k + 8 <= ns:
        return load_u64(pk, k)
    w = _U0
    for t in range(ns - k):
        w |= np.uint64(pk[k + t]) << np.uint64(8 * t)
    return w


@njit(nogil=True, cache=True)
def _all_ones(w, q):
    """The all-ones q-bit fields of the word w: a bit at the lowest bit of each."""
    a = w & (w >> np.uint64(1))
    if q == 2:
        return a & np.uint64(0x5555555555555555)
    a &= a >> np.uint64(2)
    if q == 4:
        return a & np.uint64(0x1111111111111111)
    a &= a >> np.uint64(4)
    return a & np.uint64(0x0101010101010101)


@njit(nogil=True, cache=True)
def _escape_masks(pk, npk, q, mk):
    """mk[b] = the escapes among fields 64b .. 64b + 63 of the packed stream pk[0:npk] (_escapes64) for
    every block; returns the number of blocks (ceil(npk / 8q)).  The full blocks in a loop of word
    operations only (vectorizes)."""
    fb = 8 * q
    nf = npk // fb
    if q == 8:
        for b in range(nf):
            a = _U0
            for t in range(8):
                a |= _ff8(load_u64(pk, 64 * b + 8 * t)) << np.uint64(8 * t)
            mk[b] = a
    elif q == 4:
        for b in range(nf):
            a = _U0
            for t in range(4):
                a |= _gather(_all_ones(load_u64(pk, 32 * b + 8 * t), 4), 4) << np.uint64(16 * t)
            mk[b] = a
    else:
        for b in range(nf):
            mk[b] = (_gather(_all_ones(load_u64(pk, 16 * b), 2), 2)
                     | (_gather(_all_ones(load_u64(pk, 16 * b + 8), 2), 2) << np.uint64(32)))
    if nf * fb < npk:
        mk[nf] = _escapes64(pk, nf * fb, q, npk)
        return nf + 1
    return nf


@njit(nogil=True, cache=True)
def _escape_positions(mk, nbk, pos, lim):
    """pos[0:k] = the fields of the escapes of the nbk block masks mk, in order; returns k, or -1 where
    there are more than lim (pos: int64[>= lim + ESC_K]).  ESC_K positions a block are written whether
    or not there are as many (those past the block's count are overwritten or unused): a branch that
    mispredicts only in the rare block with more."""
    j = 0
    for b in range(nbk):
        a = mk[b]
        pc = popcnt64(a)
        if j + pc > lim:
            return -1
        i0 = 64 * b
        for t in range(ESC_K):
            pos[j + t] = i0 + ctz64(a)
            a &= a - np.uint64(1)
        if pc > ESC_K:
            jj = j + ESC_K
            while a != _U0:
                pos[jj] = i0 + ctz64(a)
                jj += 1
                a &= a - np.uint64(1)
        j += pc
    return j


@njit(nogil=True, cache=True)
def _ff8(w):
    """The bytes of w that are 0xff: bit t set where byte t is (_all_ones and _gather of q = 8, in fewer
    operations)."""
    v = ~w
    f = ~(((v & np.uint64(0x7F7F7F7F7F7F7F7F)) + np.uint64(0x7F7F7F7F7F7F7F7F)) | v) & np.uint64(0x8080808080808080)
    return ((f >> np.uint64(7)) * np.uint64(0x0102040810204080)) >> np.uint64(56)


@njit(nogil=True, cache=True)
def _escapes64(pk, k, q, npk):
    """The escapes among the 64 fields of the packed bytes pk[k:k + 8q] (zero past npk): bit t set where
    field t is all ones (branch-free: each word's _all_ones bits gathered to the low bits)."""
    a = _U0
    nw = q   # words of 64 fields
    sh = 64 // q
    for t in range(nw):
        b = k + 8 * t
        w = _all_ones(load_u64(pk, b) if b + 8 <= npk else _word(pk, b, npk), q) if b < npk else _U0
        a |= _gather(w, q) << np.uint64(sh * t)
    return a


@njit(nogil=True, cache=True)
def _gather(x, q):
    """The bits of x at 0, q, 2q, .. (64 / q of them) to bits 0, 1, 2, ..."""
    if q == 2:
        x = (x | (x >> np.uint64(1))) & np.uint64(0x3333333333333333)
        x = (x | (x >> np.uint64(2))) & np.uint64(0x0F0F0F0F0F0F0F0F)
        x = (x | (x >> np.uint64(4))) & np.uint64(0x00FF00FF00FF00FF)
        x = (x | (x >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
        return (x | (x >> np.uint64(16))) & np.uint64(0xFFFFFFFF)
    if q == 4:
        x = (x | (x >> np.uint64(3))) & np.uint64(0x0303030303030303)
        x = (x | (x >> np.uint64(6))) & np.uint64(0x000F000F000F000F)
        x = (x | (x >> np.uint64(12))) & np.uint64(0x000000FF000000FF)
        return (x | (x >> np.uint64(24))) & np.uint64(0xFFFF)
    x = (x | (x >> np.uint64(7))) & np.uint64(0x0003000300030003)
    x = (x | (x >> np.uint64(14))) & np.uint64(0x0000000F0000000F)
    return (x | (x >> np.uint64(28))) & np.uint64(0xFF)


@njit(nogil=True, cache=True)
def delta_analyze(dpl, n, W, c, q, m, h, lens, modes, sizes, f, cm, rm, fast):
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
                              cm[0:256 * nb], rm)
    if nib:
        s = nb
        cost += analyze_planes(dpl[s:s + 1], (n + 1) >> 1, 1, h[s:s + 1], lens[s:s + 1], modes[s:s + 1],
                               sizes[s:s + 1], f[256 * s:256 * s + 256], cm[256 * s:256 * s + 256], rm)
    s = pr
    h[s] = 0
    histo4(dpl[s], npk, h[s])   # (never near raw where it pays: counted without analyze_planes' sample)
    cost += analyze_hist(h[s:s + 1], npk, 1, lens[s:s + 1], modes[s:s + 1], sizes[s:s + 1],
                         f[256 * s:256 * s + 256], cm[256 * s:256 * s + 256], rm, 0)
    if m > 0:
        s = er
        cost += analyze_planes(dpl[s:s + ne], m, ne, h[s:s + ne], lens[s:s + ne], modes[s:s + ne],
                               sizes[s:s + ne], f[256 * s:256 * (s + ne)], cm[256 * s:256 * (s + ne)], rm)
    if fast:
        for s in range(er + (ne if m > 0 else 0)):
            k = n if s < nb else ((n + 1) >> 1 if s < pr else (npk if s == pr else m))
            if modes[s] == MODE_HUFF and (sizes[s] > k - k // FAST_RAW or k < FAST_MIN_HUFF):
                cost += k - sizes[s]
                modes[s] = MODE_RAW
                sizes[s] = k
    return cost


@njit(nogil=True, cache=True)
def delta_write(dpl, n, W, c, q, m, h, lens, modes, sizes, f, cm, out, o, lim, tbuf):
    """Write the delta chunk at out[o:] (mode byte, c, q, u32 m, the records); -1 past lim."""
    if o + 7 > lim:
        return -1
    nb, nib, pr, npk, er, ne = delta_rows(c, q, n, W)
    out[o] = CHUNK_DELTA
    out[o + 1] = c
    out[o + 2] = q
    store_u32(out, o + 3, np.uint32(m))
    o += 7
    o = _write_streams(dpl, 0, n, nb, modes, sizes, h, lens, f, cm, out, o, lim, tbuf)
    if o >= 0 and nib:
        o = _write_streams(dpl, nb, (n + 1) >> 1, nb + 1, modes, sizes, h, lens, f, cm, out, o, lim, tbuf)
    if o >= 0:
        o = _write_streams(dpl, pr, npk, pr + 1, modes, sizes, h, lens, f, cm, out, o, lim, tbuf)
    if o < 0 or m == 0:
        return o
    return _write_streams(dpl, er, m, er + ne, modes, sizes, h, lens, f, cm, out, o, lim, tbuf)


@njit(nogil=True, cache=True)
def _delta_head(blob, pos, end, n, W):
    """(status, c, q, m) of a delta chunk body blob[pos:end] (after its mode byte)."""
    if pos + 6 > end:
        return ERR_TRUNC, 0, 0, 0
    c = np.int64(blob[pos])
    q = np.int64(blob[pos + 1])
    m = np.int64(load_u32(blob, pos + 2))
    if c & 3 or c >= W or (q != 2 and q != 4 and q != 8) or m > n:
        return ERR_DELTA, 0, 0, 0
    return OK, c, q, m


@njit(nogil=True, cache=True)
def check_delta(blob, pos, end, n, layout, version, lens, f, cm, one):
    """Check a delta chunk body blob[pos:end] (after its mode byte) without decoding it: its head and
    stream records (check_records).  Returns a status."""
    W = 32 if layout == LAYOUT_F32 else 16
    st, c, q, m = _delta_head(blob, pos, end, n, W)
    if st != OK:
        return st
    pos += 6
    nb, nib, pr, npk, er, ne = delta_rows(c, q, n, W)
    st, _, pos = check_records(blob, pos, end, n, nb, version, lens, f, cm, one)
    if st == OK and nib:
        st, _, pos = check_records(blob, pos, end, (n + 1) >> 1, 1, version, lens, f, cm, one)
    if st == OK:
        st, _, pos = check_records(blob, pos, end, npk, 1, version, lens, f, cm, one)
    if st == OK and m > 0:
        st, _, pos = check_records(blob, pos, end, m, ne, version, lens, f, cm, one)
    if st != OK:
        return st
    return OK if pos == end else ERR_TRAIL


@njit(nogil=True, cache=True)
def delta_decode(blob, pos, end, n, layout, ref, start, out, planes, dec, dec3, dec1, lens, tmp, version, f,
                 cm, dtab):
    """Decode a delta chunk body blob[pos:end] (after the mode byte) into out (units from start); planes:
    >= W / 8 + 3 rows of >= n + 16 bytes.  Returns a status (checksum not checked here)."""
    W = 32 if layout == LAYOUT_F32 else 16
    st, c, q, m = _delta_head(blob, pos, end, n, W)
    if st != OK:
        return st
    pos += 6
    nb, nib, pr, npk, er, ne = delta_rows(c, q, n, W)
    nr = planes[(W >> 3) + 2]   # the nibble stream, one nibble a byte (zero where there is none)
    # low byte streams all raw (as prefer="fast" writes them): read in place
    raw = np.zeros(3, np.int64)
    q0 = pos
    for j in range(nb):
        st, mode, plen = _read_record(blob, q0, end, n, version)
        if st != OK:
            return st
        raw[j] = q0 + 5 if mode == MODE_RAW else -1
        q0 += 5 + plen
    inplace = nb > 0 and raw[0] >= 0 and (nb < 2 or raw[1] >= 0) and (nb < 3 or raw[2] >= 0)
    if inplace:
        pos = q0
    else:
        st, pos = decode_records(blob, pos, end, n, nb, planes[0:nb], dec, dec3, dec1, lens, tmp, version, f,
                                 cm, dtab)
        if st != OK:
            return st
    if nib:
        nh = (n + 1) >> 1
        st, mode, plen = _read_record(blob, pos, end, nh, version)
        if st != OK:
            return st
        if mode == MODE_RAW:
            st = _unpack_nib(blob[pos + 5:pos + 5 + nh], n, nr)
            pos += 5 + plen
        else:
            st, pos = decode_records(blob, pos, end, nh, 1, planes[nb:nb + 1], dec, dec3, dec1, lens, tmp,
                                     version, f, cm, dtab)
            if st == OK:
                st = _unpack_nib(planes[nb], n, nr)
        if st != OK:
            return st
    st, pos = decode_records(blob, pos, end, npk, 1, planes[pr:pr + 1], dec, dec3, dec1, lens, tmp, version, f,
                             cm, dtab)
    if st != OK:
        return st
    if m > 0:
        st, pos = decode_records(blob, pos, end, m, ne, planes[er:er + ne], dec, dec3, dec1, lens, tmp, version,
                                 f, cm, dtab)
        if st != OK:
            return st
    if pos != end:
        return ERR_TRAIL
    pk = planes[pr]
    g = 8 // q
    if n % g:  # the last byte's unused fields are zero
        if (np.int64(pk[npk - 1]) >> (q * (n % g))) != 0:
            return ERR_DELTA
    if W == 32:
        o32 = out[4 * start:4 * (start + n)].view(np.uint32)
        r32 = ref[4 * start:4 * (start + n)].view(np.uint32)
        if inplace:
            return _units(pk, npk, q, planes, c, nib, er, ne, m, n, W, o32, r32, blob[raw[0]:raw[0] + n],
                          blob[max(raw[1], 0):max(raw[1], 0) + n], blob[max(raw[2], 0):max(raw[2], 0) + n], nr)
        return _units(pk, npk, q, planes, c, nib, er, ne, m, n, W, o32, r32, planes[0], planes[1], planes[2], nr)
    o16 = out[2 * start:2 * (start + n)].view(np.uint16)
    r16 = ref[2 * start:2 * (start + n)].view(np.uint16)
    if inplace:
        return _units(pk, npk, q, planes, c, nib, er, ne, m, n, W, o16, r16, blob[raw[0]:raw[0] + n], blob[0:0],
                      blob[0:0], nr)
    return _units(pk, npk, q, planes, c, nib, er, ne, m, n, W, o16, r16, planes[0], planes[1], planes[2], nr)


@njit(nogil=True, cache=True)
def _unpack_nib(src, n, nr):
    """nr[i] = nibble i of src (element 2j in the low nibble of byte j; two nibbles written as one uint16, so
    the loop vectorizes); the unused high nibble of an odd count must be zero.  Returns a status."""
    n2 = n & ~1
    w16 = nr[0:n2].view(np.uint16)
    for k in range(n2 >> 1):
        v = np.uint16(src[k])
        w16[k] = (v & np.uint16(15)) | ((v >> np.uint16(4)) << np.uint16(8))
    if n & 1:
        v = src[n >> 1]
        if v >> 4:
            return ERR_DELTA
        nr[n - 1] = v
    return OK


@njit(nogil=True, cache=True)
def _units(pk, npk, q, planes, c, nib, er, ne, m, n, W, o, r, l0, l1, l2, nr):
    """The decoded streams -> the units o (against r; l0..l2: the low byte streams, decoded or in the
    blob; nr: the nibble stream, one a byte): the fields into o, the escapes' values added, then the units
    (branch-free loops but the escapes': vectorize).  Returns a status."""
    # the escapes: h = 2^q - 1 + e, which must fit the W - c bits above the cut (all checked first, in a
    # loop that vectorizes)
    M = (np.int64(1) << q) - 1
    hv = _escape_values(planes, er, ne, m, M)
    if m > 0 and (_maxv(hv) >> (W - c)) != 0:
        return ERR_DELTA
    mk = np.empty(npk // (8 * q) + 1, np.uint64)
    pos = np.empty(m + ESC_K, np.int64)
    j = _escape_positions(mk, _escape_masks(pk, npk, q, mk), pos, m)
    if j != m:
        return ERR_DELTA
    if q == 8:   # the units from the packed bytes themselves (an escape's field is all ones), then the escapes'
        _finish(o, pk, r, n, W, c, nib, l0, l1, l2, nr)
        _finish_at(o, pos, hv, m, r, W, c, nib, l0, l1, l2, nr)
    else:        # the fields unpacked, the escapes' values put in, then the units
        _unpack(pk, n, q, o)
        for t in range(m):
            o[pos[t]] = hv[t]
        _finish(o, o, r, n, W, c, nib, l0, l1, l2, nr)
    return OK


@njit(nogil=True, cache=True)
def _unpack(pk, n, q, o):
    """o[i] = field i of the packed stream (o: uint16 or uint32; the fields of a byte written as one wide
    store, so the loops vectorize)."""
    if q == 8:
        for i in range(n):
            o[i] = pk[i]
        return
    g = 8 // q
    nf = n - n % g
    if o.itemsize == 2 and q == 4:
        w32 = o[0:nf].view(np.uint32)
        for k in range(nf >> 1):
            v = np.uint32(pk[k])
            w32[k] = (v & np.uint32(15)) | ((v >> np.uint32(4)) << np.uint32(16))
    elif o.itemsize == 2:
        w64 = o[0:nf].view(np.uint64)
        for k in range(nf >> 2):
            v = np.uint64(pk[k])
            w64[k] = ((v & np.uint64(3)) | (((v >> np.uint64(2)) & np.uint64(3)) << np.uint64(16))
                      | (((v >> np.uint64(4)) & np.uint64(3)) << np.uint64(32)) | ((v >> np.uint64(6)) << np.uint64(48)))
    elif q == 4:
        w64 = o[0:nf].view(np.uint64)
        for k in range(nf >> 1):
            v = np.uint64(pk[k])
            w64[k] = (v & np.uint64(15)) | ((v >> np.uint64(4)) << np.uint64(32))
    else:
        w64 = o[0:nf].view(np.uint64)
        for k in range(nf >> 2):
            v = np.uint64(pk[k])
            w64[2 * k] = (v & np.uint64(3)) | (((v >> np.uint64(2)) & np.uint64(3)) << np.uint64(32))
            w64[2 * k + 1] = ((v >> np.uint64(4)) & np.uint64(3)) | ((v >> np.uint64(6)) << np.uint64(32))
    for i in range(nf, n):
        o[i] = (pk[i // g] >> (q * (i % g))) & ((1 << q) - 1)


@njit(nogil=True, cache=True)
def _escape_values(planes, er, ne, m, M):
    """h = M + e of the m escapes (e little-endian over the rows er..er+ne-1)."""
    hv = np.empty(m, np.int64)
    e0 = planes[er]
    for j in range(m):
        hv[j] = M + np.int64(e0[j])
    for t in range(1, ne):
        et = planes[er + t]
        for j in range(m):
            hv[j] += np.int64(et[j]) << (8 * t)
    return hv


@njit(nogil=True, cache=True)
def _maxv(a):
    mx = a[0]
    for i in range(1, a.size):
        mx = max(mx, a[i])
    return mx


@njit(nogil=True, inline="always")
def _finish(o, fld, r, n, W, c, nib, l0, l1, l2, nr):
    """o[i] = the unit of the field h = fld[i] (o itself, or the packed bytes where q = 8): z = h << c | the
    low part (c // 8 bytes, then the nibble where c % 8 = 4), x = unmono(mono(r) + unzigzag(z)); one loop
    per number of low bytes, branch-free: they vectorize (inlined, so that where fld is o the compiler sees
    one array: a loop reading and writing one array needs no overlap check)."""
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    nb = c >> 3
    s8 = 8 * nb
    nm = np.int64(15) if nib else np.int64(0)   # (nr holds zeros where there is no nibble stream)
    if nb == 0:
        for i in range(n):
            o[i] = _unit((np.int64(fld[i]) << c) | ((np.int64(nr[i]) & nm) << s8), np.int64(r[i]), sb, mask)
    elif nb == 1:
        for i in range(n):
            o[i] = _unit((np.int64(fld[i]) << c) | np.int64(l0[i]) | ((np.int64(nr[i]) & nm) << s8),
                         np.int64(r[i]), sb, mask)
    elif nb == 2:
        for i in range(n):
            o[i] = _unit((np.int64(fld[i]) << c) | np.int64(l0[i]) | (np.int64(l1[i]) << 8)
                         | ((np.int64(nr[i]) & nm) << s8), np.int64(r[i]), sb, mask)
    else:
        for i in range(n):
            o[i] = _unit((np.int64(fld[i]) << c) | np.int64(l0[i]) | (np.int64(l1[i]) << 8)
                         | (np.int64(l2[i]) << 16) | ((np.int64(nr[i]) & nm) << s8), np.int64(r[i]), sb, mask)


@njit(nogil=True, cache=True)
def _finish_at(o, pos, hv, m, r, W, c, nib, l0, l1, l2, nr):
    """_finish of the m escapes only: o[pos[t]] = the unit of h = hv[t]."""
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    nb = c >> 3
    nm = np.int64(15) if nib else np.int64(0)
    for t in range(m):
        i = pos[t]
        lo = (np.int64(nr[i]) & nm) << (8 * nb)
        if nb > 0:
            lo |= np.int64(l0[i])
        if nb > 1:
            lo |= np.int64(l1[i]) << 8
        if nb > 2:
            lo |= np.int64(l2[i]) << 16
        o[i] = _unit((hv[t] << c) | lo, np.int64(r[i]), sb, mask)


@njit(nogil=True, inline="always")
def _unit(zv, rv, sb, mask):
    """The unit x = unmono(mono(r) + unzigzag(z)) mod 2^W of z (its bits past W dropped) and the
    reference unit r (branch-free)."""
    zv &= mask
    d = (zv >> 1) ^ (-(zv & 1) & mask)
    return _unmono((_mono(rv, sb, mask) + d) & mask, sb, mask)
