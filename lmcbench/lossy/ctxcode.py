"""A context-adaptive binary range coder for the integer codes of a quantised residual (the ``ctx`` coding
of ``LOSSY_FORMAT.md`` version 2).

The codes of one array are read as a matrix of ``rows`` x ``cols`` (row-major; a 1-D array is one row) and
coded element by element in that order. Each code ``c`` is split into binary decisions, each coded with an
adaptive probability chosen by a context made of what is already coded (the left ``L`` and above ``A``
neighbours, running means of |code| along the row and down the column): a parameter's residual is not white
noise: its magnitude goes by rows and columns (Adam's step per input feature and per output unit), so they
predict whether a code is zero and how large it is. The decisions:

* ``c != 0``, context ``(level of the row's running mean |code|, level of the column's, min(|L| + |A|, 2))``;
* the sign (``c < 0``), context ``(sign L, sign A)`` (each -1, 0, 1);
* ``|c| > k`` for ``k = 1, 2, ..., 15`` while true (unary), context ``(min(k, 4) - 1,
  min(max(|L|, |A|), 3))``;
* from 16 on, ``v = |c| - 15`` in Elias-gamma form: ``b`` ones and a zero, ``b`` the position of v's top bit
  (a context per position), then v's ``b`` low bits, high to low (a context per position).

Probabilities are 12-bit (``P(bit = 0) = p / 4096``), start at 2048 and move by ``1/32`` of the distance to
the coded bit after each decision. The range coder has a 32-bit range and a carry-propagating low register;
its output starts with a zero byte and ends with 4 flush bytes. Encoder and decoder are the same model, so
the decoder reproduces the encoder's probabilities exactly; a decoder reading past the stream's end reads
zeros (a corrupt stream gives wrong codes, never a crash; the container's CRC refuses it first).
"""

from __future__ import annotations

import numpy as np
from numba import njit

PBITS = 12
PONE = 1 << PBITS
MOVE = 5
TOP = 1 << 24
UNARY = 16
GAMMA = 16           # at most this many gamma prefix bits (|c| < 16 + 2**16 covers int16)
# context table layout
NLEV = 5             # activity levels of a row's and a column's running mean |code|
Z0, NZ = 0, NLEV * NLEV * 3
S0, NS = Z0 + NZ, 9
U0, NU = S0 + NS, 4 * 4
G0, NG = U0 + NU, GAMMA + 1
B0, NB = G0 + NG, GAMMA + 1
NCTX = B0 + NB


@njit(cache=True, nogil=True)
def _ctx(codes, i, j, cols):
    """Magnitudes and signs of the coded neighbours of (i, j)."""
    base = i * cols + j
    left = codes[base - 1] if j > 0 else 0
    if i > 0:
        up = codes[base - cols]
        ul = codes[base - cols - 1] if j > 0 else 0
        ur = codes[base - cols + 1] if j + 1 < cols else 0
    else:
        up = 0
        ul = codes[base - 2] if j > 1 else 0   # one row: the element two to the left stands in
        ur = 0
    return left, up, abs(ul) + abs(ur)


@njit(cache=True, nogil=True)
def _lev(a):
    """The level of a running mean |code| (fixed point, 1.0 = 4096): below 0.1, 0.2, 0.4, 0.8, or above."""
    if a < 410:
        return 0
    if a < 819:
        return 1
    if a < 1638:
        return 2
    if a < 3277:
        return 3
    return 4


@njit(cache=True, nogil=True)
def _sgn(v):
    return 0 if v == 0 else (1 if v > 0 else 2)


@njit(cache=True, nogil=True)
def encode(codes, rows, cols):
    """The stream of ``codes`` (int32, ``rows * cols`` of them); an empty array when it would exceed 2 bytes
    per code (the raw int16 size: not worth it)."""
    n = rows * cols
    cap = 2 * n + 64
    out = np.zeros(cap, np.uint8)
    pos = 0
    probs = np.full(NCTX, PONE // 2, np.int32)
    low = np.uint64(0)
    rng = np.uint64(0xFFFFFFFF)
    cache = np.uint64(0)
    csize = 1
    overflow = False
    bits = np.zeros(2 + UNARY + 2 * GAMMA + 2, np.int32)
    ctxs = np.zeros(2 + UNARY + 2 * GAMMA + 2, np.int32)
    colm = np.zeros(cols, np.int64)
    rowm = 0
    for idx in range(n):
        nbits = 0
        # the decisions of this code, as (context, bit) pairs
        if True:
            i = idx // cols
            j = idx - i * cols
            if j == 0:
                rowm = 0
            c = codes[idx]
            left, up, diag = _ctx(codes, i, j, cols)
            zc = Z0 + (_lev(rowm) * NLEV + _lev(colm[j])) * 3 + min(abs(left) + abs(up), 2)
            a = min(abs(c), 8) << 12
            rowm += (a - rowm) >> 4
            colm[j] += (a - colm[j]) >> 2
            ctxs[nbits] = zc
            bits[nbits] = 1 if c != 0 else 0
            nbits += 1
            if c != 0:
                ctxs[nbits] = S0 + _sgn(left) * 3 + _sgn(up)
                bits[nbits] = 1 if c < 0 else 0
                nbits += 1
                m = abs(c)
                nb = min(max(abs(left), abs(up)), 3)
                k = 1
                while k < UNARY:
                    ctxs[nbits] = U0 + (min(k, 4) - 1) * 4 + nb
                    bits[nbits] = 1 if m > k else 0
                    nbits += 1
                    if m <= k:
                        break
                    k += 1
                if m >= UNARY:
                    v = m - UNARY + 1          # >= 1
                    b = 0
                    t = v
                    while t > 1:
                        t >>= 1
                        b += 1
                    for g in range(b):
                        ctxs[nbits] = G0 + g
                        bits[nbits] = 1
                        nbits += 1
                    ctxs[nbits] = G0 + b
                    bits[nbits] = 0
                    nbits += 1
                    for g in range(b - 1, -1, -1):
                        ctxs[nbits] = B0 + g
                        bits[nbits] = (v >> g) & 1
                        nbits += 1
        for q in range(nbits):
            p = probs[ctxs[q]]
            bound = (rng >> np.uint64(PBITS)) * np.uint64(p)
            if bits[q] == 0:
                rng = bound
                probs[ctxs[q]] = p + ((PONE - p) >> MOVE)
            else:
                low += bound
                rng -= bound
                probs[ctxs[q]] = p - (p >> MOVE)
            while rng < np.uint64(TOP):
                rng = (rng << np.uint64(8)) & np.uint64(0xFFFFFFFF)
                low, cache, csize, pos, full = _shift_low(low, cache, csize, out, pos, cap)
                overflow = overflow or full
            if overflow:
                return np.zeros(0, np.uint8)
    # flush: 5 shifts
    for _ in range(5):
        low, cache, csize, pos, full = _shift_low(low, cache, csize, out, pos, cap)
        if full:
            return np.zeros(0, np.uint8)
    return out[:pos].copy()


@njit(cache=True, nogil=True, inline="always")
def _shift_low(low, cache, csize, out, pos, cap):
    """Shift the low register out a byte (with the pending carry bytes); ``full``: ``out`` has no room."""
    full = False
    if low < np.uint64(0xFF000000) or low >= np.uint64(1 << 32):
        carry = low >> np.uint64(32)
        temp = cache
        while True:
            if pos >= cap:
                full = True
                break
            out[pos] = np.uint8((temp + carry) & np.uint64(0xFF))
            pos += 1
            temp = np.uint64(0xFF)
            csize -= 1
            if csize == 0:
                break
        cache = (low >> np.uint64(24)) & np.uint64(0xFF)
    csize += 1
    low = (low & np.uint64(0x00FFFFFF)) << np.uint64(8)
    return low, cache, csize, pos, full


@njit(cache=True, nogil=True)
def _bit(probs, c, st, data):
    """One decision; ``st`` = [range, code, position] (uint64)."""
    p = probs[c]
    bound = (st[0] >> np.uint64(PBITS)) * np.uint64(p)
    if st[1] < bound:
        st[0] = bound
        probs[c] = p + ((PONE - p) >> MOVE)
        b = 0
    else:
        st[1] -= bound
        st[0] -= bound
        probs[c] = p - (p >> MOVE)
        b = 1
    while st[0] < np.uint64(TOP):
        st[0] = (st[0] << np.uint64(8)) & np.uint64(0xFFFFFFFF)
        nxt = np.uint64(data[st[2]]) if st[2] < data.size else np.uint64(0)
        st[1] = ((st[1] << np.uint64(8)) | nxt) & np.uint64(0xFFFFFFFF)
        st[2] += np.uint64(1)
    return b


@njit(cache=True, nogil=True)
def decode(data, rows, cols):
    """``rows * cols`` codes (int32) from a stream of :func:`encode`, and the bytes it read (past the end
    counts: a stream shorter than its codes need reads more than it has)."""
    n = rows * cols
    codes = np.zeros(n, np.int32)
    probs = np.full(NCTX, PONE // 2, np.int32)
    st = np.zeros(3, np.uint64)
    st[0] = np.uint64(0xFFFFFFFF)
    colm = np.zeros(cols, np.int64)
    rowm = 0
    for _ in range(5):
        nxt = np.uint64(data[st[2]]) if st[2] < data.size else np.uint64(0)
        st[1] = ((st[1] << np.uint64(8)) | nxt) & np.uint64(0xFFFFFFFF)
        st[2] += np.uint64(1)
    for idx in range(n):
        i = idx // cols
        j = idx - i * cols
        if j == 0:
            rowm = 0
        left, up, diag = _ctx(codes, i, j, cols)
        zc = Z0 + (_lev(rowm) * NLEV + _lev(colm[j])) * 3 + min(abs(left) + abs(up), 2)
        if _bit(probs, zc, st, data) == 0:
            rowm += (0 - rowm) >> 4
            colm[j] += (0 - colm[j]) >> 2
            continue
        neg = _bit(probs, S0 + _sgn(left) * 3 + _sgn(up), st, data)
        nb = min(max(abs(left), abs(up)), 3)
        m = 1
        while m < UNARY:
            if _bit(probs, U0 + (min(m, 4) - 1) * 4 + nb, st, data) == 0:
                break
            m += 1
        if m == UNARY:
            b = 0
            while b < GAMMA and _bit(probs, G0 + b, st, data) == 1:
                b += 1
            v = 1
            for g in range(b - 1, -1, -1):
                v = (v << 1) | _bit(probs, B0 + g, st, data)
            m = UNARY + v - 1
        codes[idx] = -m if neg else m
        a = min(m, 8) << 12
        rowm += (a - rowm) >> 4
        colm[j] += (a - colm[j]) >> 2
    return codes, int(st[2])
