"""lmc kernels: the mantissa-context chunk mode of format v5 (bfloat16, alone): the exponent stream as in
mode 0, then the sign and the top 3 mantissa bits of each element coded by rANS with a context taken from
the element's own exponent, the low 4 mantissa bits packed two to a byte.  Its planner (``mctx_plan``),
writer, structural check (``check_mctx``) and decoder.

Why: within one binade a bell-shaped weight distribution is denser towards zero, so the top mantissa bits
of the largest binades are not uniform, while those of small values (the flat middle of the bell) are.  The
contexts are the binades below a base E chosen per chunk by the encoder (``c = clamp(E - e, 0, K - 1)``):
measured on a 24M model's bf16 weights (``results/bf16_context``) the order-0 bound of the two byte streams
is 1.5194x and this model's 1.524x with its tables.  It decodes symbol by symbol (rANS), so it is taken only
where size comes first (``compress(prefer="size")``)."""

import numpy as np
from numba import njit

from .intrinsics import ld
from .intrinsics import st as put
from .base import CHUNK_MCTX, ERR_CTX, ERR_FREQ, ERR_LEN, ERR_MCTX, ERR_PAD, ERR_TRUNC, OK, PROB_BITS
from .rans import cum_freqs, freq_table_bytes, rans_cost_bits, rans_normalize, rans_states_for
from .streams import _decode_stream, _read_record, _write_stream, check_planes
from .rans import check_ctx_stream, decode_ctx_stream, put_ctx_tables, put_rans, read_ctx_tables

MCTX_K = 8          # at most 8 contexts
MCTX_NSYM = 16      # symbol: sign << 3 | top 3 mantissa bits
MCTX_MIN = 1024     # smaller chunks are not planned (tables cost more than the context saves)


@njit(nogil=True, cache=True)
def _sym(sm):
    """The symbol of a sign/mantissa byte (sign << 7 | 7 mantissa bits)."""
    return ((sm >> 7) << 3) | ((sm >> 4) & 7)


@njit(nogil=True, cache=True)
def mctx_hist(p0, p1, n, jh):
    """jh[e * 16 + t]: the chunk's (exponent, symbol) counts, from its two byte planes (int64[4096],
    zeroed here)."""
    jh[:] = 0
    for i in range(n):
        sm = np.int64(ld(p1, i))
        jh[(np.int64(ld(p0, i)) << 4) + _sym(sm)] += 1


@njit(nogil=True, cache=True)
def _ctx_counts(jh, P, E, K, c, row):
    """row[0:16]: the counts of context c under base E and K contexts (c = clamp(E - e, 0, K - 1));
    P[(e + 1) * 16 + s]: the counts of symbol s over the exponents 0..e."""
    if K == 1:
        for s in range(MCTX_NSYM):
            row[s] = P[(256 << 4) + s]
    elif c == 0:                       # e >= E
        for s in range(MCTX_NSYM):
            row[s] = P[(256 << 4) + s] - P[(E << 4) + s]
    elif c == K - 1:                   # e <= E - c
        lo = max(E - c + 1, 0)
        for s in range(MCTX_NSYM):
            row[s] = P[(lo << 4) + s]
    else:                              # e == E - c
        for s in range(MCTX_NSYM):
            row[s] = jh[((E - c) << 4) + s] if E - c >= 0 else 0


@njit(nogil=True, cache=True)
def _plan_cost(jh, P, E, K, row, fq, S):
    """Bytes of the context tables and the S-state rANS stream under (E, K) (estimate), and the context mask."""
    bits = 0.0
    tab = 0
    mask = 0
    for c in range(K):
        _ctx_counts(jh, P, E, K, c, row)
        if rans_normalize(row, 0, MCTX_NSYM, fq) > 0:
            mask |= 1 << c
            tab += freq_table_bytes(fq, 0, MCTX_NSYM)
            bits += rans_cost_bits(row, fq, 0, MCTX_NSYM)
    return tab + 4 * S + np.int64(np.ceil(bits / 8)), mask


@njit(nogil=True, cache=True)
def mctx_plan(p0, p1, n, exp_bytes, jh, mf, mcm, fv):
    """Plan a mantissa-context chunk: the base E and context count K (the smallest estimate over every
    exponent of the chunk as E and K = 1..8), its tables (mf, mcm: int64[MCTX_K * 256], context c at
    c * 256) and its estimated size after the mode byte, given exp_bytes, the exponent's stream record (5 +
    payload); fv: the format version written.
    Returns (size, E, K, mask)."""
    mctx_hist(p0, p1, n, jh)
    P = np.zeros(257 << 4, np.int64)
    for e in range(256):
        for s in range(MCTX_NSYM):
            P[((e + 1) << 4) + s] = P[(e << 4) + s] + jh[(e << 4) + s]
    row = np.zeros(MCTX_NSYM, np.int64)
    fq = np.zeros(MCTX_NSYM, np.int64)
    bE = 0
    bK = 1
    S = rans_states_for(n, fv)
    best, bmask = _plan_cost(jh, P, 0, 1, row, fq, S)
    for E in range(256):
        if _empty(jh, E):
            continue               # (an exponent absent from the chunk is no better a base than its neighbour)
        for K in range(2, MCTX_K + 1):
            cost, mask = _plan_cost(jh, P, E, K, row, fq, S)
            if cost < best:
                best = cost
                bE = E
                bK = K
                bmask = mask
    mf[:] = 0
    mcm[:] = 0
    for c in range(bK):
        if bmask & (1 << c):
            _ctx_counts(jh, P, bE, bK, c, row)
            rans_normalize(row, 0, MCTX_NSYM, fq)
            for s in range(MCTX_NSYM):
                mf[(c << 8) + s] = fq[s]
            cum_freqs(mf, c << 8, mcm)
    # (E, K and the mask; the mode byte is left out, as the other modes' estimates leave it out)
    return 3 + exp_bytes + best + 4 + ((n + 1) >> 1), bE, bK, bmask


@njit(nogil=True, cache=True)
def _empty(jh, e):
    for s in range(MCTX_NSYM):
        if jh[(e << 4) + s] != 0:
            return False
    return True


@njit(nogil=True, cache=True)
def _ctx(e, E, K):
    return min(max(E - e, 0), K - 1)


@njit(nogil=True, cache=True)
def mctx_write(E, K, mask, p0, p1, n, mode0, size0, h0, lens0, f0, cm0, out, o, lim, mf, mcm, jb, et, tbuf, fv):
    """Write a mantissa-context chunk at out[o:]: header, the exponent's stream record (mode0, size0, h0,
    lens0, f0, cm0: its coding as analyze_hist chose it), the context tables (mf, mcm), the rANS stream and
    the nibbles.  Returns the end position, or -1 if it would pass lim.  jb: uint16[>= n], et:
    uint64[>= 2 * 128] scratch; tbuf: >= 2n + 128 bytes; fv: the format version written."""
    if o + 4 > lim:
        return -1
    out[o] = CHUNK_MCTX
    out[o + 1] = E
    out[o + 2] = K
    out[o + 3] = mask
    q = _write_stream(p0, n, mode0, size0, h0, lens0, f0, cm0, out, o + 4, lim, tbuf, fv)
    if q < 0:
        return -1
    q = put_ctx_tables(mf, mcm, mask, K, MCTX_NSYM, out, q, lim, et, np.zeros(1, np.uint8), False)
    if q < 0:
        return -1
    for i in range(n):
        e = np.int64(ld(p0, i))
        put(jb, i, np.uint16(_ctx(e, E, K) * MCTX_NSYM + _sym(np.int64(ld(p1, i)))))
    nb = (n + 1) >> 1
    q = put_rans(jb, n, et, tbuf, out, q, lim, nb, rans_states_for(n, fv))
    if q < 0:
        return -1
    for j in range(n >> 1):
        put(out, q + j, np.uint8((ld(p1, 2 * j) & 15) | ((ld(p1, 2 * j + 1) & 15) << 4)))
    if n & 1:
        out[q + nb - 1] = p1[n - 1] & 15
    return q + nb


@njit(nogil=True, cache=True)
def _head(blob, pos, end, n, version):
    """(status, E, K, mask, exponent record mode, its payload length) of the chunk body blob[pos:end] (after
    the mode byte): K in 1..8, the mask non-empty and inside the K contexts, the record inside the chunk."""
    if pos + 3 > end:
        return ERR_TRUNC, 0, 0, 0, 0, 0
    E = np.int64(blob[pos])
    K = np.int64(blob[pos + 1])
    mask = np.int64(blob[pos + 2])
    if K < 1 or K > MCTX_K or mask == 0 or (mask >> K) != 0:
        return ERR_MCTX, 0, 0, 0, 0, 0
    st, m0, l0 = _read_record(blob, pos + 3, end, n, version)
    return st, E, K, mask, m0, l0


@njit(nogil=True, cache=True)
def _tail_checks(blob, q, end, n):
    """The nibbles at blob[q:end]: exactly ceil(n / 2) bytes, an unused final high nibble zero."""
    if end - q != (n + 1) >> 1:
        return ERR_LEN
    if n & 1 and (blob[end - 1] >> 4) != 0:
        return ERR_PAD
    return OK


@njit(nogil=True, cache=True)
def check_mctx(blob, pos, end, n, version, lens, f, cm, one):
    """Structural check of a mantissa-context chunk body blob[pos:end] (after the mode byte), nothing
    decoded: header, the exponent's stream record (as check_planes), the context tables, the rANS stream's
    length and initial states and the nibbles' length.  Returns a status."""
    st, E, K, mask, m0, l0 = _head(blob, pos, end, n, version)
    if st != OK:
        return st
    pos += 3
    st, _c = check_planes(blob, pos, pos + 5 + l0, n, 1, version, lens, f, cm, one)
    if st != OK:
        return st
    st, q = check_ctx_stream(blob, pos + 5 + l0, end, mask, K, MCTX_NSYM - 1, f, cm, rans_states_for(n, version))
    if st != OK:
        return st
    return _tail_checks(blob, q, end, n)


@njit(nogil=True, cache=True)
def _contexts(p0, n, E, K, cb):
    """cb[i] = context of exponent p0[i] << 12; returns the set of contexts (branch-free: vectorizes)."""
    used = np.int32(0)
    E32 = np.int32(E)
    k1 = np.int32(K - 1)
    for i in range(n):
        c = min(max(E32 - np.int32(p0[i]), np.int32(0)), k1)
        used |= np.int32(1) << c
        cb[i] = np.uint16(c << PROB_BITS)
    return np.int64(used)


@njit(nogil=True, cache=True)
def _merge(p0, syms, blob, q, n, dst):
    """dst[i] = sign << 15 | exponent << 7 | top 3 mantissa bits << 4 | nibble (q: the nibbles' start,
    ceil(n / 2) bytes known inside the blob)."""
    for j in range(n >> 1):
        b = np.int64(ld(blob, q + j))
        i = 2 * j
        t = np.int64(ld(syms, i))
        put(dst, i, np.uint16(((t >> 3) << 15) | (np.int64(ld(p0, i)) << 7) | ((t & 7) << 4) | (b & 15)))
        t = np.int64(ld(syms, i + 1))
        put(dst, i + 1, np.uint16(((t >> 3) << 15) | (np.int64(ld(p0, i + 1)) << 7) | ((t & 7) << 4) | (b >> 4)))
    if n & 1:
        i = n - 1
        t = np.int64(syms[i])
        dst[i] = np.uint16(((t >> 3) << 15) | (np.int64(p0[i]) << 7) | ((t & 7) << 4) | (np.int64(blob[q + (i >> 1)]) & 15))


@njit(nogil=True, cache=True)
def mctx_decode(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, cb, syms, dst):
    """Decode a mantissa-context chunk body blob[pos:end] (after the mode byte) into dst (uint16[n]).
    Returns a status (checksum not checked here)."""
    st, E, K, mask, m0, l0 = _head(blob, pos, end, n, version)
    if st != OK:
        return st
    pos += 3
    st = _decode_stream(blob, pos + 5, l0, m0, planes[0], n, lens, dec, dec3, dec1, tmp, f, cm, dtab, version)
    if st != OK:
        return st
    pos += 5 + l0
    if _contexts(planes[0], n, E, K, cb) != mask:
        return ERR_CTX
    pos = read_ctx_tables(blob, pos, end, mask, K, MCTX_NSYM - 1, f, cm, dtab)
    if pos < 0:
        return ERR_FREQ
    st, q = decode_ctx_stream(blob, pos, end, cb, n, dtab, syms, rans_states_for(n, version))
    if st != OK:
        return st
    st = _tail_checks(blob, q, end, n)    # (the nibbles' bounds, before _merge reads them)
    if st != OK:
        return st
    _merge(planes[0], syms, blob, q, n, dst)
    return OK
