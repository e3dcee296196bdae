"""lmc kernels: the Huffman encoder - the 4-way interleaved coder (``_encode4``) and the writer of a Huffman
payload (``put_huff``), with sub-stream sizes known from the counts or found by coding; the codes are
``kernels.huffman``'s."""

import numpy as np
from numba import njit

from .intrinsics import ld, store_u32, store_u64
from .base import _U0, _i4, _u4, copy_bytes, nonzero_range
from .hfixed import fixed_encode4, put_codes
from .huffman import canonical_codes


@njit(nogil=True, cache=True)
def _encode4(p, n, codes, lens, out, o, sub, free=False):
    """Encode the n symbols of p into 4 interleaved LSB-first sub-streams
    (symbol i -> sub-stream i % 4) written back to back at out[o:], whose
    exact byte sizes sub[0..3] are known in advance (codes: uint64[256],
    lens: int64[256], every length <= MAXLEN = 11).  Never writes outside
    [o, o + sum(sub)).  Returns the end position (or -1 on a size mismatch,
    which would be an internal error).  free: sub holds upper bounds, and
    each sub-stream's size is written back to it."""
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
    # blocks of 20 symbols, 5 per sub-stream: < 8 pending bits + 5 codes of
    # <= 11 bits fit the 64-bit accumulator, flushed by one 8-byte store
    nblk = n // 20
    j = 0
    while j < nblk:
        # a block advances a sub-stream by <= 7 bytes: the 8-byte stores of
        # the next g blocks stay inside every sub-stream (no check per block)
        g = min(min(en0 - q0, en1 - q1), min(en2 - q2, en3 - q3)) - 8
        if g < 0:
            break
        g = min(g // 7 + 1, nblk - j)
        for jj in range(j, j + g):
            i = 20 * jj
            for t in range(5):
                c0 = ld(p, i + 4 * t)
                c1 = ld(p, i + 4 * t + 1)
                c2 = ld(p, i + 4 * t + 2)
                c3 = ld(p, i + 4 * t + 3)
                a0 |= ld(codes, c0) << np.uint64(n0)
                a1 |= ld(codes, c1) << np.uint64(n1)
                a2 |= ld(codes, c2) << np.uint64(n2)
                a3 |= ld(codes, c3) << np.uint64(n3)
                n0 += ld(lens, c0)
                n1 += ld(lens, c1)
                n2 += ld(lens, c2)
                n3 += ld(lens, c3)
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
        j += g
    qs = _i4(q0, q1, q2, q3)
    accs = _u4(a0, a1, a2, a3)
    nbs = _i4(n0, n1, n2, n3)
    ens = _i4(en0, en1, en2, en3)
    starts = _i4(o, en0, en1, en2)
    for k in range(4):
        q = put_codes(p, 20 * j + k, n, codes, lens, out, qs[k], accs[k], nbs[k])
        if free:
            sub[k] = q - starts[k]
        elif q != ens[k]:
            return -1
    return en3


@njit(nogil=True, cache=True)
def put_huff(p, n, lens, sub, out, o, lim, tbuf, free):
    """A Huffman payload (FORMAT.md: lo, hi, the code lengths, the jump table, the 4 sub-streams) of p[:n]
    at out[o:] with code lengths lens and sub-stream sizes sub; where free, sub holds one upper bound for all
    four and the sub-streams are first coded into tbuf (>= 4 bounds), their sizes found so.  Returns the
    end, or -1 past lim."""
    codes = np.empty(256, np.uint64)
    canonical_codes(lens, codes)
    ln = np.empty(256, np.int64)
    for s in range(256):
        ln[s] = lens[s]
    ub = sub[0]
    if free:
        _encode4(p, n, codes, ln, tbuf, 0, sub, True)   # (sub-stream k at k * ub)
    lo, hi = nonzero_range(lens, 0, 256)
    nbt = (hi - lo + 2) // 2
    if o + 14 + nbt + sub[0] + sub[1] + sub[2] + sub[3] > lim:
        return -1
    out[o] = lo
    out[o + 1] = hi
    o += 2
    for j in range(nbt):
        out[o + j] = np.uint8(lens[lo + 2 * j] | ((lens[lo + 2 * j + 1] if lo + 2 * j + 1 <= hi else 0) << 4))
    o += nbt
    for k in range(3):
        store_u32(out, o + 4 * k, np.uint32(sub[k]))
    o += 12
    if not free:
        k = ln[lo]
        fixed = hi - lo + 1 == 1 << k
        for s in range(lo, hi + 1):
            fixed = fixed and ln[s] == k
        if fixed:   # every symbol of the range at length k (hfixed.fixed_code): packed without table lookups
            return fixed_encode4(p, n, k, lo, codes, ln, out, o, sub)
        return _encode4(p, n, codes, ln, out, o, sub)
    for k in range(4):
        copy_bytes(out, o, tbuf, k * ub, sub[k])
        o += sub[k]
    return o
