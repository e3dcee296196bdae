"""lmc kernels: the delta chunk mode of format v6, its decoder - the structural check (``check_delta``) and the
decoder (``delta_decode``).  The packed fields and their escapes: ``fields`` (the encoder finds them the same
way); the encoder and the mode itself: ``encode``; FORMAT.md, "Delta chunk".

The decoder reads the low byte streams in place where they are stored raw and decodes the others with lmc's
stream decoders; its other passes are branch-free loops over the elements.  The escapes are found 64 fields
at a time (a bit mask per block from word operations, ESC_K positions a block taken without a branch each),
checked against the count the chunk declares, and their units made after the others'."""

import numpy as np
from numba import njit

from ..intrinsics import load_u32
from ..base import ERR_DELTA, ERR_TRAIL, ERR_TRUNC, LAYOUT_F32, MODE_RAW, OK, _mono, _unmono
from ..streams import _read_record, check_records, decode_records
from .fields import ESC_K, _escape_masks, _escape_positions, delta_rows

@njit(nogil=True, cache=True)
def _delta_head(blob, pos, end, n, layout):
    """(status, W, c, q, m, the position after the 6-byte head, and delta_rows(c, q, n, W)) of a delta chunk
    body blob[pos:end] (after its mode byte)."""
    W = 32 if layout == LAYOUT_F32 else 16
    if pos + 6 > end:
        return ERR_TRUNC, W, 0, 0, 0, pos, (0, False, 0, 0, 0, 0)
    c = np.int64(blob[pos])
    q = np.int64(blob[pos + 1])
    m = np.int64(load_u32(blob, pos + 2))
    if c & 3 or c >= W or (q != 2 and q != 4 and q != 8) or m > n:
        return ERR_DELTA, W, 0, 0, 0, pos, (0, False, 0, 0, 0, 0)
    return OK, W, c, q, m, pos + 6, delta_rows(c, q, n, W)


@njit(nogil=True, cache=True)
def check_delta(blob, pos, end, n, layout, version, lens, f, cm, one):
    """Check a delta chunk body blob[pos:end] (after its mode byte) without decoding it: its head and
    stream records (check_records).  Returns a status."""
    st, W, c, q, m, pos, rows = _delta_head(blob, pos, end, n, layout)
    if st != OK:
        return st
    nb, nib, pr, npk, er, ne = rows
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
    st, W, c, q, m, pos, rows = _delta_head(blob, pos, end, n, layout)
    if st != OK:
        return st
    nb, nib, pr, npk, er, ne = rows
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
    """o[i] = field i of the packed stream, q = 2 or 4 (o: uint16 or uint32; the fields of a byte written as
    one wide store, so the loops vectorize)."""
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
                      | (((v >> np.uint64(4)) & np.uint64(3)) << np.uint64(32))
                      | ((v >> np.uint64(6)) << np.uint64(48)))
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
