"""lmc kernels: the byte streams of a chunk - the choice per stream of raw / constant / Huffman / rANS from
its histogram (cheap estimates, no trial encoding), and the stream writers (Huffman codes in ``_khuffman``,
the rANS coder in ``_krans``)."""

import numpy as np
from numba import njit

from ._intrinsics import store_u32
from ._kbase import MODE_CONST, MODE_HUFF, MODE_RANS, MODE_RAW, RANS_MARGIN, RANS_SLACK, copy_bytes
from ._krans import cum_freqs, freq_table_bytes, rans_cost_bits, rans_encode, rans_normalize, write_freq_table
from ._khuffman import _encode4, canonical_codes, histo4, huffman_lengths


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
