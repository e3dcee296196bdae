"""lmc kernels: the drivers over ranges of chunks that lmc.api runs on its threads (``encode_range``,
``gather_range``, ``decode_range``) and the stream decoders' scratch (``stream_scratch``); and, for the
fuzzer's checked build (LMC_CHECKED=1 with NUMBA_DISABLE_JIT=1), the kernels' numpy swapped for checked
arrays.  Above ``kernels.chunk``: see it for the conventions every kernel follows."""

import numpy as np
from numba import njit

from .base import LAYOUT_BF16, LAYOUT_PLANES, NCTX, PREF_SIZE, PROB_SCALE, TABSIZE, ck_mode, copy_bytes
from .check import ref_pass
from .simd import LANES
from .delta.encode import delta_scratch
from .mctx import MCTX_K
from .chunk import decode_chunk, encode_chunk
from .pair import pairable, pred_pair

# ---------------------------------------------------------------------------
# drivers over a range of chunks.  They release the GIL (nogil) and are run
# concurrently from a thread pool by lmc.api; each chunk is independent, so
# the output does not depend on the number of threads.
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def encode_range(data, ref, has_ref, fv, pref, w, total, chunk, unit, layout, ns, scratch, cap,
                 sizes, chks, used, rchks, c0, c1):
    """Encode chunks c0 .. c1 into scratch (chunk c at c * cap): their sizes, checksums and format versions
    needed; with a reference, rchks[c] = the checksum of the reference's chunk c (the reference's hash: lmc.api),
    taken just before the chunk is coded, so that the coder's passes over the reference find it in the cache
    (a pass of its own over the whole reference cost fp32 weights 0.17 ns an element), in the same pass as the
    temporal mode's context base (check.ref_pass), which the chunk coder is handed."""
    wk = ck_mode(fv)
    m = min(chunk, total) + 16
    planes = np.empty((ns, m + 112), np.uint8)   # (the joint-symbol mode's fields: a whole block of 128)
    planes2 = np.empty((ns, m if has_ref else 1), np.uint8)
    tm = m if (has_ref and fv >= 2 and layout != LAYOUT_PLANES) else 1
    rplane = np.empty(m if fv >= 3 else 1, np.uint8)
    mc = pref == PREF_SIZE and fv >= 5 and layout == LAYOUT_BF16   # the mantissa-context mode may be planned
    dm = m if (tm > 1 and fv >= 6) else 1   # the delta mode's scratch
    dsc = delta_scratch(unit, dm)
    # (jb: the temporal mode's joint symbols, or the mantissa-context mode's)
    jb = np.empty(m if tm > 1 or mc else 1, np.uint16)
    low = np.empty(tm, np.uint32)
    th = np.empty(4 * NCTX * 65, np.int32)
    ha = np.empty(ns * 1024, np.int32)
    hx = np.empty(ns * 1024, np.int32)
    thist = np.empty(NCTX * 256, np.int64)
    tf = np.zeros(NCTX * 256, np.int64)
    tcm = np.zeros(NCTX * 256, np.int64)
    et = np.zeros(2 * NCTX * 65, np.uint64)
    kbt = np.zeros(NCTX * 65, np.uint8)
    tbuf = np.empty(2 * m + 4 * LANES + 32, np.uint8)
    rbuf = np.empty(unit * tm + 16, np.uint8)
    mh = np.empty(4096 if mc else 1, np.int64)
    mf = np.zeros(MCTX_K * 256 if mc else 1, np.int64)
    mcm = np.zeros(MCTX_K * 256 if mc else 1, np.int64)
    for c in range(c0, c1):
        start = c * chunk
        n = min(chunk, total - start)
        E = -1   # (the temporal mode's context base, where ref_pass takes it)
        if has_ref:
            rchks[c], E = ref_pass(ref, start, n, unit, layout, wk)
        sz, ck, u = encode_chunk(data, ref, has_ref, fv, pref, w, start, n, unit, layout, ns, scratch,
                                 c * cap, planes, planes2, jb, low, th, ha, hx, thist, tf, tcm,
                                 tbuf[:2 * n + 4 * LANES + 16], rbuf, kbt, et, rplane, mh, mf, mcm, dsc, E)
        sizes[c] = sz
        chks[c] = ck
        used[c] = u


@njit(nogil=True, cache=True)
def gather_range(scratch, cap, sizes, offsets, out, c0, c1):
    for c in range(c0, c1):
        a = offsets[c]
        b = c * cap
        copy_bytes(out, a, scratch, b, sizes[c])


@njit(nogil=True, cache=True)
def stream_scratch(ns, chunk, total):
    """The stream decoders' scratch for chunks of up to min(chunk, total) units: (planes ns + 3 x (m + 128),
    Huffman tables dec, dec3, dec1 and lens, the sub-stream buffer tmp, rANS tables f, cm and dtab for
    NCTX contexts)."""
    m = min(chunk, total)
    return (np.empty((ns + 3, m + 128), np.uint8), np.empty(TABSIZE, np.uint16), np.empty(TABSIZE, np.uint64),
            np.empty(TABSIZE, np.uint16), np.empty(256, np.uint8), np.empty(4 * (((m + 3) >> 2) + 16), np.uint8),
            np.empty(NCTX * 256, np.int64), np.empty(NCTX * 256, np.int64), np.empty(NCTX * PROB_SCALE, np.uint32))


@njit(nogil=True, cache=True)
def decode_range(blob, offsets, sizes, chks, total, chunk, unit, layout, ns, ref, has_ref,
                 out, status, version, stop, c0, c1):
    """Decode chunks c0..c1-1; stops (leaving their status 0) once stop[0]
    is set, which it does on its first failing chunk: the other drivers
    running in parallel stop too, so a refused blob is not decoded on."""
    planes, dec, dec3, dec1, lens, tmp, f, cm, dtab = stream_scratch(ns, chunk, total)
    cb = np.empty(min(chunk, total) + 16, np.uint16)
    syms = np.empty(min(chunk, total) + 16, np.uint8)
    # (two predicted-exponent chunks in a row are decoded as a pair, their exponents restored side by side:
    # kernels.pair; the second chunk's planes)
    two = pairable(layout) and c1 - c0 >= 2
    planes2 = np.empty((ns + 3, min(chunk, total) + 128) if two else (1, 1), np.uint8)
    c = c0
    while c < c1:
        if stop[0] != 0:
            return
        if two and c + 1 < c1 and pred_pair(blob, offsets, sizes, chks, c, chunk, total, unit, layout, has_ref,
                                            out, planes, planes2, dec, dec3, dec1, lens, tmp, version, f, cm, dtab,
                                            status):
            if status[c] != 0 or status[c + 1] != 0:
                stop[0] = 1
            c += 2
            continue
        start = c * chunk
        n = min(chunk, total - start)
        status[c] = decode_chunk(blob, offsets[c], sizes[c], n, unit, layout, ns,
                                 ref, has_ref, out, start, chks[c], planes, dec, dec3,
                                 dec1, lens, tmp, version, f, cm, dtab, cb, syms)
        if status[c] != 0:
            stop[0] = 1
        c += 1

def _checked_pure_python():
    """LMC_CHECKED=1 with NUMBA_DISABLE_JIT=1: the kernels allocate checked
    arrays (lmc.api passes its buffers as checked arrays too)."""
    from . import base, chunk, huffenc, huffman, intrinsics, joint, mctx, pair, rans, restore, streams, temporal
    from .delta import decode, encode, fields
    import sys
    for m in (restore, base, huffman, huffenc, rans, streams, temporal, mctx, joint, fields, encode, decode, chunk,
              pair, sys.modules[__name__]):
        m.np = intrinsics.checked_numpy


from .intrinsics import CHECKED as _CHECKED  # noqa: E402
from numba import config as _ncfg  # noqa: E402
if _CHECKED and _ncfg.DISABLE_JIT:  # pragma: no cover - the fuzzer's checked build
    _checked_pure_python()
