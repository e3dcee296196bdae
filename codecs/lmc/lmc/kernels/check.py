"""lmc kernels: the structural pre-pass (``check_chunk``, driven over ranges of chunks by ``check_range``) and
the checksums of a reference's chunks (``checksum_range``; ``ref_pass``: one chunk's with the encoder's
context base, in one pass). Every chunk's layout is checked before the output is
allocated or any chunk is decoded (FORMAT.md, "Decoder obligations"), so a forged blob is refused at the cost of
its own bytes, not of the sizes its header claims. The checks are the decoder's own, done early; they only
reject blobs the decoder would reject too."""

import numpy as np
from numba import njit

from .base import (CHUNK_DELTA, CHUNK_JOINT, CHUNK_MCTX, CHUNK_PRED, CHUNK_STORED, CHUNK_TEMPORAL, CHUNK_XOR,
                   ERR_CHECKSUM, ERR_PRED, LAYOUT_BF16, LAYOUT_F16, LAYOUT_F32, NCTX, OK, _U0,
                   _fold_w, checksum_fill, checksum_units, ck_mode, csum_sums, merge_units)
from .streams import check_planes
from .delta.decode import check_delta
from .joint import check_joint
from .mctx import check_mctx
from .temporal import _fparams, check_temporal
from .chunk import chunk_head
from .tenc import field_max

RP_BLOCK = 16384   # ref_pass's block (bytes; a multiple of 8, the checksum's words, and so of every unit)
assert RP_BLOCK % 8 == 0


@njit(nogil=True, cache=True)
def check_chunk(blob, off, clen, n, unit, layout, ns, ref, has_ref, start, expected, version,
                lens, f, cm, one, ub):
    """Check chunk blob[off:off+clen] as far as it goes without decoding:
    modes, record lengths, Huffman and frequency tables, sub-stream and rANS
    stream sizes.  A chunk whose every stream is constant (also a rANS
    stream of one symbol) is verified completely: its checksum is computed
    from the constant (and the reference) without writing anything.
    Scratch: lens uint8[256], f, cm int64[NCTX * 256], one uint8[ns, 1],
    ub uint8[8].  Returns a status."""
    st, flags = chunk_head(blob, off, clen, n, unit, layout, has_ref, version)
    if st != OK:
        return st
    end = off + clen
    if flags == CHUNK_TEMPORAL:
        return check_temporal(blob, off + 1, end, layout, f, cm, n, version)
    if flags == CHUNK_DELTA:
        return check_delta(blob, off + 1, end, n, layout, version, lens, f, cm, one)
    if flags == CHUNK_MCTX:
        return check_mctx(blob, off + 1, end, n, version, lens, f, cm, one)
    if flags == CHUNK_JOINT:
        return check_joint(blob, off + 1, end, n, version, lens, f, cm, one)
    if flags == CHUNK_STORED:
        return OK
    delta = flags == CHUNK_XOR
    if flags == CHUNK_PRED:
        st, constant = check_planes(blob, off + 5, end, n, ns, version, lens, f, cm, one)
        if st != OK:
            return st
        return ERR_PRED if constant else OK
    st, constant = check_planes(blob, off + 1, end, n, ns, version, lens, f, cm, one)
    if st != OK:
        return st
    if constant and n > 0:
        merge_units(one, 1, unit, layout, ub)
        v = _U0
        for j in range(unit):
            v |= np.uint64(ub[j]) << np.uint64(8 * j)
        if checksum_fill(ref, delta, start, n, unit, v, ck_mode(version)) != expected:
            return ERR_CHECKSUM
    return OK


@njit(nogil=True, cache=True)
def check_range(blob, offsets, sizes, chks, total, chunk, unit, layout, ns, ref, has_ref,
                status, version, c0, c1):
    lens = np.empty(256, np.uint8)
    f = np.empty(NCTX * 256, np.int64)
    cm = np.empty(NCTX * 256, np.int64)
    one = np.zeros((ns, 1), np.uint8)
    ub = np.zeros(8, np.uint8)
    for c in range(c0, c1):
        start = c * chunk
        n = min(chunk, total - start)
        status[c] = check_chunk(blob, offsets[c], sizes[c], n, unit, layout, ns, ref, has_ref,
                                start, chks[c], version, lens, f, cm, one, ub)


@njit(nogil=True, cache=True)
def checksum_range(data, total, chunk, unit, wk, chks, c0, c1):
    for c in range(c0, c1):
        start = c * chunk
        n = min(chunk, total - start)
        chks[c] = checksum_units(data, start, n, unit, wk)


@njit(nogil=True, cache=True)
def ref_pass(ref, start, n, unit, layout, wk):
    """(the checksum of the reference's chunk, checksum_units's; the temporal mode's context base over it,
    temporal_base's, or -1 where the layout has none or the checksum is not format 8's): one pass over the chunk
    for both, where the encoder took the checksum and then the base in a pass each."""
    if wk != 3 or not (layout == LAYOUT_BF16 or layout == LAYOUT_F16 or layout == LAYOUT_F32):
        return checksum_units(ref, start, n, unit, wk), np.int64(-1)
    _, mb, em = _fparams(layout)
    nb = n * unit
    b = ref[start * unit:start * unit + nb]
    # blocks of RP_BLOCK bytes, each summed and then searched for its largest field while in L1, the fields as
    # vectors of 64 bytes where the CPU has them (tenc.field_max): on a Xeon core 0.12 against 0.24 ns a bf16
    # element, 0.47 against 0.63 fp32, where one loop took the fields in the checksum's 64-bit lanes
    s1 = _U0
    s2 = _U0
    M = np.int64(em) << mb
    E = np.int64(0)
    for o in range(0, nb, RP_BLOCK):
        e = min(nb, o + RP_BLOCK)
        s1, s2 = csum_sums(b[o:e], e - o, o >> 3, s1, s2)
        if unit == 4:
            E = max(E, field_max(b[o:e].view(np.uint32), M))
        else:
            E = max(E, field_max(b[o:e].view(np.uint16), M))
    return _fold_w(s1, s2, 3), E >> mb


from .intrinsics import CHECKED as _CHECKED  # noqa: E402
from numba import config as _ncfg  # noqa: E402
if _CHECKED and _ncfg.DISABLE_JIT:  # pragma: no cover - the fuzzer's checked build: checked arrays here too
    import sys  # noqa: E402
    from .intrinsics import checked_numpy  # noqa: E402
    sys.modules[__name__].np = checked_numpy
