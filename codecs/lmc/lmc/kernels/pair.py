"""lmc kernels: two predicted-exponent chunks decoded as a pair (``pred_pair``), their exponent planes restored
side by side.

``restore.exp_restore`` undoes the LOCO-I prediction along four chains, each serial: a step of the chains waits
on the one before (about four byte operations), so the pass runs at the latency of one step whatever the vector
width, 0.48 ns an element (Zen 5) and about 45% of decoding a bf16 second moment.  Two chunks' chains are
independent, so ``restore.exp_restore2`` runs both in one ``<8 x i8>`` vector at the cost of one: 0.26 ns an
element.  ``drivers.decode_range`` takes consecutive chunks as a pair where both are predicted-exponent chunks
of fp32 or bf16 units with the same row length (the chunks of one tensor); each chunk's streams are read as
``chunk.decode_chunk`` reads them, into a plane set of its own, then both are restored and merged, and each
chunk's checksum is checked.  Where either chunk is not such a chunk, or fails before its units are written, the
pair is left to ``decode_chunk`` one by one, which reports its error: the statuses, like the units, are those of
decoding each chunk alone."""
import numpy as np
from numba import njit

from .intrinsics import load_u32
from .base import CHUNK_PRED, ERR_CHECKSUM, LAYOUT_BF16, LAYOUT_F32, OK, checksum_units, ck_mode
from .restore import PAIR, exp_restore2
from .streams import bf16_merge, bf16_streams
from .chunk import chunk_head, f32_merge, f32_streams


@njit(nogil=True, cache=True)
def pairable(layout):
    """Whether chunks of this layout may be decoded in pairs (the scratch of a second plane set is needed)."""
    return PAIR and (layout == LAYOUT_F32 or layout == LAYOUT_BF16)


@njit(nogil=True, cache=True)
def pred_pair(blob, offsets, sizes, chks, c, chunk, total, unit, layout, has_ref, out, planes, planes2, dec, dec3,
              dec1, lens, tmp, version, f, cm, dtab, status):
    """Decode chunks c and c + 1 where both are predicted-exponent chunks with one row length w >= 4 (layout
    pairable), setting status[c] and status[c + 1]; returns False, having set nothing, where they are not such
    a pair or either fails before its units are written."""
    o0 = offsets[c]
    o1 = offsets[c + 1]
    s0 = sizes[c]
    s1 = sizes[c + 1]
    if s0 < 5 or s1 < 5 or blob[o0] != CHUNK_PRED or blob[o1] != CHUNK_PRED:
        return False
    w = np.int64(load_u32(blob, o0 + 1))
    if w < 4 or w != np.int64(load_u32(blob, o1 + 1)):
        return False
    a = c * chunk
    b = a + chunk
    n0 = min(chunk, total - a)
    n1 = min(chunk, total - b)
    if chunk_head(blob, o0, s0, n0, unit, layout, has_ref, version)[0] != OK:
        return False
    if chunk_head(blob, o1, s1, n1, unit, layout, has_ref, version)[0] != OK:
        return False
    q0 = np.full(4, -1, np.int64)
    q1 = np.full(4, -1, np.int64)
    if layout == LAYOUT_F32:
        if f32_streams(blob, o0 + 5, o0 + s0, n0, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab,
                       q0) != OK:
            return False
        if f32_streams(blob, o1 + 5, o1 + s1, n1, planes2, dec, dec3, dec1, lens, tmp, version, f, cm, dtab,
                       q1) != OK:
            return False
    else:
        st, q0[1] = bf16_streams(blob, o0 + 5, o0 + s0, n0, planes, dec, dec3, dec1, lens, tmp, version, f, cm,
                                 dtab)
        if st != OK:
            return False
        st, q1[1] = bf16_streams(blob, o1 + 5, o1 + s1, n1, planes2, dec, dec3, dec1, lens, tmp, version, f, cm,
                                 dtab)
        if st != OK:
            return False
    exp_restore2(planes[0], n0, planes2[0], n1, w)
    d0 = out[a * unit:(a + n0) * unit]
    d1 = out[b * unit:(b + n1) * unit]
    if layout == LAYOUT_F32:
        f32_merge(blob, q0, n0, planes, d0.view(np.uint32))
        f32_merge(blob, q1, n1, planes2, d1.view(np.uint32))
    else:
        bf16_merge(blob, q0[1], n0, planes, d0.view(np.uint16))
        bf16_merge(blob, q1[1], n1, planes2, d1.view(np.uint16))
    wk = ck_mode(version)
    status[c] = OK if checksum_units(out, a, n0, unit, wk) == chks[c] else ERR_CHECKSUM
    status[c + 1] = OK if checksum_units(out, b, n1, unit, wk) == chks[c + 1] else ERR_CHECKSUM
    return True
