"""lmc kernels: the byte-stream chunk modes, alone and XOR (each unit, or its XOR with the reference,
split into 2 to 8 byte streams, each stream coded raw / constant / Huffman / rANS).  Holds their
histograms (``stream_count``, ``stream_hist``), the choice per stream of a coding from its histogram
(cheap estimates, no trial encoding), the stream writers (``write_planes``) and readers
(``decode_planes``), and the structural check of the stream records (``check_planes``).  The Huffman
coder is in ``kernels.huffman``, the rANS coder in ``kernels.rans``; splitting units into streams and merging them
back in ``kernels.base``."""

import numpy as np
from numba import njit

from .intrinsics import ld, load_u32, store_u32
from .base import (CHUNK_PRED, ERR_FREQ, ERR_LEN, ERR_MODE, ERR_RANS, ERR_TRAIL, ERR_TRUNC, ERR_VERSION,
                     LAYOUT_BF16, LAYOUT_F32, MODE_CONST, MODE_HUFF, MODE_RANS, MODE_RAW, NEAR_RAW_BITS,
                     NEAR_RAW_MIN, NO_MARGIN, OK, PROB_SCALE, RANS_L, RANS_SLACK, _inc, copy_bytes,
                     merge_bf16, nonzero_range)
from .rans import (cum_freqs, decode_rans_stream, freq_table_bytes, rans_cost_bits, rans_encode, rans_normalize,
                   rans_states_for, read_freq_table, states_ok, write_freq_table)
from .histo import histo4
from .restore import exp_restore
from .huffman import check_huff_stream, decode_huff_stream, huffman_lengths
from .huffenc import put_huff
from .hfixed import _plane_sample, _sample_entropy, fixed_code, near_fixed


# ---------------------------------------------------------------------------
# histograms: byte-stream counts straight from the units (no split into
# planes), in 4 partial tables (see kernels.base._inc)
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def stream_count(data, ref, use_ref, start, n, layout, hs):
    """Byte-stream counts of the units (XOR the reference when use_ref) in 4
    partial tables: hs[s * 1024 + (i % 4) * 256 + byte] (int32, zeroed here).
    The reference's unit is masked in the loop rather than chosen by an inlined
    helper: Numba counted references to the arrays at every element there (an
    atomic pair: 11 ns an element against 1.2 on a Zen 5 core)."""
    hs[:] = 0
    if layout == LAYOUT_F32:
        x = data[4 * start:4 * (start + n)].view(np.uint32)
        r = ref[4 * start:4 * (start + n)].view(np.uint32) if use_ref else x
        m = np.int64(0xFFFFFFFF) if use_ref else np.int64(0)
        for i in range(n):
            hb = (i & 3) << 8
            v = np.int64(ld(x, i)) ^ (np.int64(ld(r, i)) & m)
            _inc(hs, hb + ((v >> 23) & 0xFF))
            _inc(hs, 1024 + hb + (((v >> 24) & 0x80) | ((v >> 16) & 0x7F)))
            _inc(hs, 2048 + hb + ((v >> 8) & 0xFF))
            _inc(hs, 3072 + hb + (v & 0xFF))
        return
    x = data[2 * start:2 * (start + n)].view(np.uint16)
    r = ref[2 * start:2 * (start + n)].view(np.uint16) if use_ref else x
    m = np.int64(0xFFFF) if use_ref else np.int64(0)
    if layout == LAYOUT_BF16:
        for i in range(n):
            hb = (i & 3) << 8
            v = np.int64(ld(x, i)) ^ (np.int64(ld(r, i)) & m)
            _inc(hs, hb + ((v >> 7) & 0xFF))
            _inc(hs, 1024 + hb + (((v >> 8) & 0x80) | (v & 0x7F)))
    else:
        for i in range(n):
            hb = (i & 3) << 8
            v = np.int64(ld(x, i)) ^ (np.int64(ld(r, i)) & m)
            _inc(hs, hb + ((v >> 10) & 0x1F))
            _inc(hs, 1024 + hb + (((v >> 13) & 4) | ((v >> 8) & 3)))
            _inc(hs, 2048 + hb + (v & 0xFF))


# the samplers' tables of byte streams where each is apart (count_streams): 256 bins and a gap.  A sampler
# counts unit i of each group of 4 into a set of tables of its own, so that no count waits on the one before it
# (on the few bins of a weights chunk's high bytes its XOR counts took 5.9 us a chunk in one set, 3.2 in four)
XSTRIDE = 272


@njit(inline="always")
def count_streams(hs, t, v, layout, P):
    """Count the bytes of unit v (or its XOR with the reference) in its byte streams as stream_count splits
    them, stream s at hs[t + P * s:] (one table per stream: the samplers' counts).  (Inlined: called, the
    temporal sample's counts took 1.2x the time.)"""
    if layout == LAYOUT_F32:
        hs[t + ((v >> 23) & 0xFF)] += 1
        hs[t + P + (((v >> 24) & 0x80) | ((v >> 16) & 0x7F))] += 1
        hs[t + 2 * P + ((v >> 8) & 0xFF)] += 1
        hs[t + 3 * P + (v & 0xFF)] += 1
    elif layout == LAYOUT_BF16:
        hs[t + ((v >> 7) & 0xFF)] += 1
        hs[t + P + (((v >> 8) & 0x80) | (v & 0x7F))] += 1
    else:
        hs[t + ((v >> 10) & 0x1F)] += 1
        hs[t + P + (((v >> 13) & 4) | ((v >> 8) & 3))] += 1
        hs[t + 2 * P + (v & 0xFF)] += 1


@njit(nogil=True, cache=True)
def stream_hist(hs, ns, h):
    """int32 stream counts hs[s * 1024 + k * 256 + c] -> int64 h[s, k, c]."""
    for s in range(ns):
        for k in range(4):
            for c in range(256):
                h[s, k, c] = hs[s * 1024 + k * 256 + c]


# ---------------------------------------------------------------------------
# stream analysis: the per-stream choice of raw / constant / Huffman / rANS, and the stream writers
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
    lo, hi = nonzero_range(lens, 0, 256)
    return 2 + (hi - lo + 2) // 2


@njit(nogil=True, cache=True)
def near_raw(p, n):
    """Whether plane p[:n] is sure to be stored raw: the order-0 entropy of a
    sample (64-byte blocks, one in every 1024 bytes), Miller-Madow corrected,
    is within NEAR_RAW_BITS of 8 bits.  No coding of the plane's bytes one at
    a time saves more than about 1% there (Huffman saves nothing), under
    the speed setting's 1/RANS_MARGIN for rANS; counting the whole plane
    (a third of the encoder's time on a bf16 mantissa plane) is skipped."""
    if n < NEAR_RAW_MIN:
        return False
    t, m = _plane_sample(p, n)
    return near_raw_counts(t, m)


@njit(nogil=True, cache=True)
def near_raw_counts(t, m):
    """near_raw's test on the counts t of a sample of m bytes."""
    return near_raw_entropy(_sample_entropy(t, m))


@njit(nogil=True, cache=True, inline="always")
def near_raw_entropy(ent):
    """near_raw's test on the sample's entropy."""
    return ent >= 8.0 - NEAR_RAW_BITS


@njit(nogil=True, cache=True)
def analysis_scratch(ns):
    """The tables analyze_planes and analyze_hist fill for ns planes: (h, lens, modes, sizes, f, cm)."""
    return (np.zeros((ns, 4, 256), np.int64), np.zeros((ns, 256), np.uint8), np.empty(ns, np.int64),
            np.empty(ns, np.int64), np.zeros(ns * 256, np.int64), np.zeros(ns * 256, np.int64))


@njit(nogil=True, cache=True)
def analyze_planes(planes, n, ns, h, lens, modes, sizes, f, cm, rm, fv):
    """Count the symbols of each plane per sub-stream into h (zeroed by the
    caller), then analyze_hist.  Except where size comes first (rm ==
    NO_MARGIN), a plane near_raw is not counted: it is stored raw; nor is one
    near_fixed: it takes the fixed-length code, its counts in h all on the
    range's first symbol (so that the writer's sub-stream sizes, counts times
    lengths, are right)."""
    return analyze_planes_but(planes, n, ns, h, lens, modes, sizes, f, cm, rm, fv, 0)


@njit(nogil=True, cache=True)
def analyze_planes_but(planes, n, ns, h, lens, modes, sizes, f, cm, rm, fv, pre):
    """analyze_planes with the planes in the bit mask pre neither counted nor coded: raw in modes and sizes (an
    upper bound of their cost; the predicted-exponent mode replaces plane 0: kernels.joint.joint_analyze)."""
    skip, fixed = pre, 0
    fk = np.zeros(ns, np.int64)
    flo = np.zeros(ns, np.int64)
    for s in range(ns):
        if (pre >> s) & 1:
            continue
        if rm != NO_MARGIN and n >= NEAR_RAW_MIN:
            t, m = _plane_sample(planes[s], n)
            ent = _sample_entropy(t, m)
            if near_raw_entropy(ent):
                skip |= 1 << s
                continue
            fk[s], flo[s] = near_fixed(planes[s], n, t, ent)
            if fk[s] > 0:
                skip |= 1 << s
                fixed |= 1 << s
                continue
        histo4(planes[s], n, h[s])
    total = analyze_hist(h, n, ns, lens, modes, sizes, f, cm, rm, skip, fv)
    for s in range(ns):
        if (fixed >> s) & 1:
            k = fk[s]
            lens[s, :] = 0
            lens[s, flo[s]:flo[s] + (1 << k)] = k
            for j in range(4):
                h[s, j, flo[s]] = (n + 3 - j) >> 2
            size = _table_bytes(lens[s]) + 12 + _huff_sub_bytes(h[s], lens[s], np.empty(4, np.int64))
            if size < n:   # (as analyze_hist: raw where Huffman is not smaller)
                modes[s] = MODE_HUFF
                total += size - sizes[s]
                sizes[s] = size
    return total


@njit(nogil=True, cache=True)
def analyze_hist(h, n, ns, lens, modes, sizes, f, cm, rm, skip, fv):
    """Choose a mode per stream from its counts h[s, sub-stream, symbol];
    returns the total payload size (incl. the 5-byte stream headers).
    Huffman and raw sizes are exact; the rANS size (f, cm: its quantised
    table per stream at s * 256) is estimated from the quantised
    frequencies.  rm: 0, no rANS (format v1); else rANS is taken only when
    it saves more than 1/rm of the faster choice plus RANS_SLACK bytes
    (rm = RANS_MARGIN by default, NO_MARGIN where size comes first).
    skip: a bit mask of the streams stored raw without their counts; fv:
    the format version written (the number of rANS states, rans_states_for)."""
    freq = np.empty(256, np.int64)
    sub = np.empty(4, np.int64)
    total = 0
    for s in range(ns):
        if (skip >> s) & 1:
            modes[s] = MODE_RAW
            sizes[s] = n
            total += 5 + n
            continue
        for c in range(256):
            freq[c] = h[s, 0, c] + h[s, 1, c] + h[s, 2, c] + h[s, 3, c]
        m = huffman_lengths(freq, lens[s])
        if m == 1:
            modes[s] = MODE_CONST
            sizes[s] = 1
        else:
            if rm != NO_MARGIN:
                fixed_code(freq, lens[s])
            hs = _table_bytes(lens[s]) + 12 + _huff_sub_bytes(h[s], lens[s], sub)
            if hs < n:
                modes[s] = MODE_HUFF
                sizes[s] = hs
            else:
                modes[s] = MODE_RAW
                sizes[s] = n
            if rm > 0:
                rans_normalize(freq, 0, 256, f[256 * s:256 * s + 256])
                fs = f[256 * s:256 * s + 256]
                rs = (freq_table_bytes(fs, 0, 256) + 4 * rans_states_for(n, fv)
                      + np.int64(np.ceil(rans_cost_bits(freq, fs, 0, 256) / 8)))
                if rs + RANS_SLACK + sizes[s] // rm < sizes[s]:
                    modes[s] = MODE_RANS
                    sizes[s] = rs
                    cum_freqs(fs, 0, cm[256 * s:256 * s + 256])
        total += 5 + sizes[s]
    return total


@njit(nogil=True, cache=True)
def _write_stream(p, n, mode, size, h, lens, f, cm, out, o, lim, tbuf, fv):
    """Write one stream record at out[o:]; returns the end, or -1 if it
    would pass lim (the rANS size is only known after encoding)."""
    if mode == MODE_RANS:
        tb = freq_table_bytes(f, 0, 256)
        q = rans_encode(p, p, False, n, f, cm, tbuf, rans_states_for(n, fv))
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
    sub = np.empty(4, np.int64)
    _huff_sub_bytes(h, lens, sub)
    return put_huff(p, n, lens, sub, out, o, o + size, tbuf, False)


@njit(nogil=True, cache=True)
def write_planes(flag, planes, n, ns, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv):
    """Chunk mode byte + the ns stream records; -1 if past lim."""
    if o + 1 > lim:
        return -1
    out[o] = flag
    return _write_streams(planes, 0, n, ns, modes, sizes, h, lens, f, cm, out, o + 1, lim, tbuf, fv)


@njit(nogil=True, cache=True)
def _write_streams(planes, s0, n, ns, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv):
    """The stream records s0..ns-1 of planes at out[o:]; -1 if past lim."""
    for s in range(s0, ns):
        o = _write_stream(planes[s], n, modes[s], sizes[s], h[s], lens[s],
                          f[256 * s:256 * s + 256], cm[256 * s:256 * s + 256], out, o, lim, tbuf, fv)
        if o < 0:
            return -1
    return o


@njit(nogil=True, cache=True)
def _uses_rans(modes, ns):
    for s in range(ns):
        if modes[s] == MODE_RANS:
            return True
    return False


# ---------------------------------------------------------------------------
# the predicted-exponent chunk mode (format v3): stream 0 (the exponent) of an
# alone chunk as residuals of the LOCO-I median predictor over the tensor's
# rows, with the neighbour 4 to the left (row length w from the shape):
#   pred_i = 0 (i < 4);  p[i-4] (4 <= i < w + 4);
#   median(a, b, a + b - c), a = p[i-4], b = p[i-w], c = p[i-w-4] (after).
# The left neighbour at distance 4 rather than 1 costs ~0.007 bits per
# exponent on Adam second moments and gives the decoder 4 independent
# dependency chains instead of one (FORMAT.md, "Predicted-exponent chunk"); the
# decoder's pass, exp_restore, is kernels.restore's.
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _med8(a, b, c):
    """restore._med of three bytes as a byte: min(a, b) if c >= max(a, b), max(a, b)
    if c <= min(a, b), else a + b - c (then in [min, max]: its value mod 256
    is exact).  Selects on bytes: the encoder's loop over it vectorises."""
    lo = min(a, b)
    hi = max(a, b)
    t = np.uint8(a + b - c)
    return lo if c >= hi else (hi if c <= lo else t)


@njit(nogil=True, cache=True)
def exp_residuals(p, n, w, r):
    """r[i] = (p[i] - pred_i) mod 256 for i < n (predictor above)."""
    lim = min(w + 4, n)
    for i in range(min(4, n)):
        r[i] = p[i]
    for i in range(4, lim):
        r[i] = np.uint8(p[i] - p[i - 4])
    m = n - lim
    if m <= 0:
        return
    a = p[lim - 4:n - 4]
    b = p[lim - w:n - w]
    c = p[lim - w - 4:n - w - 4]
    v = p[lim:n]
    q = r[lim:n]
    for k in range(m):
        q[k] = np.uint8(v[k] - _med8(a[k], b[k], c[k]))


@njit(nogil=True, cache=True, inline="always")
def _ex(p, i, sh):
    return np.uint8((np.int64(p[i]) >> sh) & 255)


@njit(nogil=True, cache=True)
def pred_gain(p, n, w, step, sh=0):
    """Estimated bits per exponent the prediction saves (order-0 entropy of
    the exponents minus that of the residuals), from every step-th element
    past the first 4 (in the first row the residual is against the element
    4 to the left, as exp_residuals; a 1-D tensor is one row); 1.0 when the
    sample is too small to tell.  p: the exponent plane, or the units with
    the exponent at bit sh (bf16: 7)."""
    return pred_gain_h0(p, n, w, step, sh)[0]


@njit(nogil=True, cache=True)
def pred_gain_h0(p, n, w, step, sh):
    """(pred_gain, the sample's entropy of the exponents: bits an exponent; 0.0 where the sample is too small)."""
    he = np.zeros(256, np.int64)
    hr = np.zeros(256, np.int64)
    m = 0
    lim = min(w + 4, n)
    for i in range(4, n, step):
        v = _ex(p, i, sh)
        he[v] += 1
        if i < lim:
            hr[np.uint8(v - _ex(p, i - 4, sh))] += 1
        else:
            hr[np.uint8(v - _med8(_ex(p, i - 4, sh), _ex(p, i - w, sh), _ex(p, i - w - 4, sh)))] += 1
        m += 1
    if m < 256:
        return 1.0, 0.0
    d = e = 0.0
    for s in range(256):
        if he[s] > 0:
            t = he[s] * np.log2(he[s] / m)
            d, e = d - t, e - t
        if hr[s] > 0:
            d += hr[s] * np.log2(hr[s] / m)
    return d / m, e / m


@njit(nogil=True, cache=True)
def write_pred(planes, rplane, w, n, ns, modes, sizes, h, lens, f, cm, mr, sr, hr, lr, fr, cr, out, o, lim, tbuf,
               fv):
    """A predicted-exponent chunk at out[o:]: mode byte, u32 row length w, the
    residual stream (coding mr/sr/hr/lr/fr/cr) and streams 1.. of planes;
    -1 if past lim."""
    if o + 5 > lim:
        return -1
    out[o] = CHUNK_PRED
    store_u32(out, o + 1, np.uint32(w))
    o = _write_stream(rplane, n, mr[0], sr[0], hr[0], lr[0], fr, cr, out, o + 5, lim, tbuf, fv)
    if o < 0:
        return -1
    return _write_streams(planes, 1, n, ns, modes, sizes, h, lens, f, cm, out, o, lim, tbuf, fv)


# ---------------------------------------------------------------------------
# stream readers: decoding, and the structural check of the pre-pass
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _read_record(blob, pos, end, n, version):
    """The header of the stream record at blob[pos:end] (mode byte, u32
    payload length): checks that the payload lies inside end, the lengths of
    raw (n) and constant (1) streams, that rANS is allowed (format v2) and
    the mode known.  Returns (status, mode, payload length)."""
    if pos + 5 > end:
        return ERR_TRUNC, 0, 0
    mode = np.int64(blob[pos])
    plen = np.int64(load_u32(blob, pos + 1))
    if plen > end - pos - 5:
        return ERR_TRUNC, 0, 0
    if mode == MODE_RAW:
        if plen != n:
            return ERR_LEN, 0, 0
    elif mode == MODE_CONST:
        if plen != 1:
            return ERR_LEN, 0, 0
    elif mode == MODE_RANS:
        if version < 2:
            return ERR_VERSION, 0, 0
    elif mode != MODE_HUFF:
        return ERR_MODE, 0, 0
    return OK, mode, plen


@njit(nogil=True, cache=True)
def _decode_stream(blob, pos, plen, mode, p, n, lens, dec, dec3, dec1, tmp, f, cm, dtab, version):
    """Decode the payload blob[pos:pos+plen] of a stream record (its header
    read by _read_record) into p[:n].  Returns a status."""
    if mode == MODE_RAW:
        copy_bytes(p, 0, blob, pos, n)
    elif mode == MODE_CONST:
        p[:n] = blob[pos]  # fill (fast)
    elif mode == MODE_HUFF:
        return decode_huff_stream(blob, pos, plen, p, n, lens, dec, dec3, dec1, tmp)
    else:  # MODE_RANS
        return decode_rans_stream(blob, pos, plen, p, n, f, cm, dtab, version)
    return OK


@njit(nogil=True, cache=True)
def decode_planes(blob, pos, end, n, ns, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab):
    """Read the ns stream records of an alone or XOR chunk (blob[pos:end],
    after its mode byte) into planes[s, :n]; the scratch is decode_chunk's.
    Returns a status."""
    st, pos = decode_records(blob, pos, end, n, ns, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab)
    if st != OK:
        return st
    if pos != end:
        return ERR_TRAIL
    return OK


@njit(nogil=True, cache=True)
def decode_records(blob, pos, end, n, ns, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab):
    """Read ns stream records of n symbols each from blob[pos:end] into
    planes[s, :n].  Returns (status, the position after them)."""
    return read_records(blob, pos, end, n, ns, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab,
                        np.empty(0, np.int64))


@njit(nogil=True, cache=True)
def read_records(blob, pos, end, n, ns, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, raw_at):
    """decode_records; where raw_at has ns entries, a raw stream s >= 1 is left in the blob, its payload's
    position in raw_at[s] (-1 for the others)."""
    for s in range(ns):
        st, mode, plen = _read_record(blob, pos, end, n, version)
        if st != OK:
            return st, pos
        pos += 5
        keep = raw_at.size == ns and s > 0 and mode == MODE_RAW
        if raw_at.size == ns:
            raw_at[s] = pos if keep else -1
        if not keep:
            st = _decode_stream(blob, pos, plen, mode, planes[s], n, lens, dec, dec3, dec1, tmp, f, cm, dtab,
                                version)
            if st != OK:
                return st, pos
        pos += plen
    return OK, pos


@njit(nogil=True, cache=True)
def bf16_streams(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab):
    """decode_bf16's streams: the exponents into planes[0], the sign/mantissa stream into planes[1] unless it is
    raw.  Returns (status, the raw stream's position in blob or -1)."""
    st, m0, l0 = _read_record(blob, pos, end, n, version)
    if st != OK:
        return st, -1
    q0 = pos + 5
    st, m1, l1 = _read_record(blob, q0 + l0, end, n, version)
    if st != OK:
        return st, -1
    q1 = q0 + l0 + 5
    if q1 + l1 != end:
        return ERR_TRAIL, -1
    st = _decode_stream(blob, q0, l0, m0, planes[0], n, lens, dec, dec3, dec1, tmp, f, cm, dtab, version)
    if st != OK or m1 == MODE_RAW:
        return st, q1
    st = _decode_stream(blob, q1, l1, m1, planes[1], n, lens, dec, dec3, dec1, tmp, f, cm, dtab, version)
    return st, -1


@njit(nogil=True, cache=True)
def bf16_merge(blob, q1, n, planes, dst):
    """The units of a bf16 chunk from its exponent plane and its sign/mantissa stream (raw at blob[q1:] where
    q1 >= 0, else planes[1])."""
    if q1 >= 0:
        merge_bf16(planes[0], blob[q1:q1 + n], n, dst)
    else:
        merge_bf16(planes[0], planes[1], n, dst)


@njit(nogil=True, cache=True)
def decode_bf16(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, w, dst):
    """decode_planes and merge_units for a bf16 alone, predicted (w > 0: the
    row length) or XOR chunk into dst (uint16[n]; XOR chunks: before the
    reference is applied), a raw sign/mantissa stream (the common case)
    merged straight from the blob, without a copy.  Returns a status."""
    st, q1 = bf16_streams(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab)
    if st != OK:
        return st
    if w > 0:
        exp_restore(planes[0], n, w)
    bf16_merge(blob, q1, n, planes, dst)
    return OK


@njit(nogil=True, cache=True)
def check_planes(blob, pos, end, n, ns, version, lens, f, cm, one):
    """Check the ns stream records of an alone or XOR chunk (blob[pos:end],
    after its mode byte) without decoding them: modes, record lengths,
    Huffman and frequency tables, sub-stream and rANS stream sizes.
    Returns (status, constant): constant when every stream is constant
    (also a rANS stream of one symbol), its symbol then in one[s, 0]."""
    st, constant, pos = check_records(blob, pos, end, n, ns, version, lens, f, cm, one)
    if st != OK:
        return st, False
    if pos != end:
        return ERR_TRAIL, False
    return OK, constant


@njit(nogil=True, cache=True)
def check_records(blob, pos, end, n, ns, version, lens, f, cm, one):
    """check_planes for ns records of n symbols at blob[pos:end]; returns
    (status, constant, the position after them)."""
    constant = True
    for s in range(ns):
        st, mode, plen = _read_record(blob, pos, end, n, version)
        if st != OK:
            return st, False, pos
        pos += 5
        if mode == MODE_RAW:
            constant = False
        elif mode == MODE_CONST:
            one[s, 0] = blob[pos]
        elif mode == MODE_HUFF:
            st = check_huff_stream(blob, pos, plen, n, lens)
            if st != OK:
                return st, False, pos
            constant = False
        else:  # MODE_RANS
            q = read_freq_table(blob, pos, pos + plen, 255, f, 0, cm)
            if q < 0:
                return ERR_FREQ, False, pos
            S = rans_states_for(n, version)
            if not states_ok(blob, q, pos + plen, S):
                return ERR_RANS, False, pos
            lo = np.int64(blob[pos])
            if f[lo] == PROB_SCALE:
                # one symbol: the states never change and no word is read, so
                # the stream is the S states, each 2^16 (else rans_decode fails)
                if pos + plen - q != 4 * S:
                    return ERR_RANS, False, pos
                for k in range(S):
                    if np.int64(load_u32(blob, q + 4 * k)) != RANS_L:
                        return ERR_RANS, False, pos
                one[s, 0] = lo
            else:
                constant = False
        pos += plen
    return OK, constant, pos
