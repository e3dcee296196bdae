"""lmc kernels: the delta mode's packed fields, shared by its encoder and decoder - the streams of a plan
(``delta_rows``) and the escapes found in the packed fields (``_escape_masks``, ``_escape_positions``).
FORMAT.md, "Delta chunk"."""

import numpy as np
from numba import njit

from ..intrinsics import ctz64, load_u64, popcnt64
from ..base import _U0

ESC_K = 4   # escapes found per 64-field block without a branch each (_escape_positions)


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
def _word(pk, k, ns):
    """The packed bytes pk[k:k+8] as a little-endian word (zero past ns)."""
    if k + 8 <= ns:
        return load_u64(pk, k)
    w = _U0
    for t in range(ns - k):
        w |= np.uint64(pk[k + t]) << np.uint64(8 * t)
    return w


@njit(nogil=True, cache=True)
def _ones_bits(w, q):
    """The all-ones q-bit fields of the word w: bit t set where field t is (64 / q bits, branch-free)."""
    if q == 8:   # bytes 0xff: a zero-byte test of ~w, the bytes' top bits gathered by a product
        v = ~w
        f = ~(((v & np.uint64(0x7F7F7F7F7F7F7F7F)) + np.uint64(0x7F7F7F7F7F7F7F7F)) | v) & np.uint64(0x8080808080808080)
        return ((f >> np.uint64(7)) * np.uint64(0x0102040810204080)) >> np.uint64(56)
    a = w & (w >> np.uint64(1))
    if q == 2:
        return _gather(a & np.uint64(0x5555555555555555), 2)
    a &= a >> np.uint64(2)
    return _gather(a & np.uint64(0x1111111111111111), 4)


@njit(nogil=True, cache=True)
def _escape_masks(pk, npk, q, mk):
    """mk[b] = the escapes among fields 64b .. 64b + 63 of the packed stream pk[0:npk] (bit t set where field
    64b + t is all ones; the bytes past npk read as zero) for every block; returns the number of blocks
    (ceil(npk / 8q)).  Word operations only: the full blocks' loop vectorizes."""
    fb = 8 * q
    nf = npk // fb
    sh = 64 // q   # fields a word
    for b in range(nf):
        a = _U0
        for t in range(q):
            a |= _ones_bits(load_u64(pk, fb * b + 8 * t), q) << np.uint64(sh * t)
        mk[b] = a
    if nf * fb == npk:
        return nf
    a = _U0
    for t in range(q):
        k = nf * fb + 8 * t
        if k < npk:
            a |= _ones_bits(_word(pk, k, npk), q) << np.uint64(sh * t)
    mk[nf] = a
    return nf + 1


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
def _gather(x, q):
    """The bits of x at 0, q, 2q, .. (64 / q of them; q = 2 or 4) to bits 0, 1, 2, ..."""
    if q == 2:
        x = (x | (x >> np.uint64(1))) & np.uint64(0x3333333333333333)
        x = (x | (x >> np.uint64(2))) & np.uint64(0x0F0F0F0F0F0F0F0F)
        x = (x | (x >> np.uint64(4))) & np.uint64(0x00FF00FF00FF00FF)
        x = (x | (x >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
        return (x | (x >> np.uint64(16))) & np.uint64(0xFFFFFFFF)
    x = (x | (x >> np.uint64(3))) & np.uint64(0x0303030303030303)
    x = (x | (x >> np.uint64(6))) & np.uint64(0x000F000F000F000F)
    x = (x | (x >> np.uint64(12))) & np.uint64(0x000000FF000000FF)
    return (x | (x >> np.uint64(24))) & np.uint64(0xFFFF)
