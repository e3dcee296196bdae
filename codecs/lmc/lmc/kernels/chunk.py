"""lmc kernels: the chunk coder - ``encode_chunk`` (the mode choice: alone, XOR, temporal or stored)
and ``decode_chunk``; ``kernels.drivers`` runs them over ranges of chunks on lmc.api's threads.

All kernels are serial ``@njit(nogil=True, cache=True)`` functions (compiled
once, cached on disk).  Parallelism comes from running the chunk-range
drivers on several Python threads (they release the GIL); see
README for why ``parallel=True``/``prange`` drivers were not used (they cannot
be cached and re-optimise the whole inlined call tree on every process start:
~10 s per process).

All data buffers are flat ``uint8`` arrays; elements ("units") of 1, 2, 4 or
8 bytes are read with unaligned little-endian loads (see ``kernels.intrinsics``).

Memory safety: every kernel that reads a compressed blob validates each
length/offset against the chunk end *before* touching memory, and the
Huffman decoder only uses wide loads where the 8 bytes are known to lie
inside the sub-stream (slow byte-wise refill otherwise).

The kernel modules, each coder's encoder, decoder and check together:
``kernels.base`` (constants, error codes, checksum, stream split/merge),
``kernels.huffman`` (the Huffman coder; ``kernels.hfixed``, its decoder of a fixed-length code),
``kernels.rans`` (the rANS coder, and context
rANS: a table per context), ``kernels.streams`` (the alone and XOR chunk modes:
histograms, per-stream coding choice, stream writers and readers),
``kernels.temporal`` (the temporal chunk mode), ``kernels.mctx`` (the mantissa-context
chunk mode), ``kernels.joint`` (the joint-symbol chunk mode), ``kernels.delta`` (the delta chunk mode), this
module, ``kernels.check`` (the structural pre-pass) and ``kernels.drivers``, above it.  Each name is imported
from the module that defines it.
"""

import numpy as np
from numba import njit

from .intrinsics import load_u32
from .base import (CHUNK_ALONE, CHUNK_DELTA, CHUNK_JOINT, CHUNK_MCTX, CHUNK_PRED, CHUNK_STORED, CHUNK_TEMPORAL,
                   CHUNK_XOR, ERR_CHECKSUM, ERR_FLAGS, ERR_LEN, ERR_NOREF, ERR_PRED, ERR_TRAIL, ERR_TRUNC,
                   ERR_VERSION, LAYOUT_BF16, LAYOUT_F32, LAYOUT_PLANES, MODE_CONST, MODE_RAW, NO_MARGIN, OK, PREF_FAST,
                   PREF_SIZE, PRED_MARGIN, RANS_MARGIN, TEMPORAL_MARGIN, TEMPORAL_MARGIN7, checksum_units, ck_mode,
                   copy_bytes, merge_chunk, merge_f32, split_chunk, split_units, xor_into)
from .histo import histo4
from .streams import (_uses_rans, analysis_scratch, analyze_hist, analyze_planes, decode_bf16,
                      decode_planes, read_records, exp_residuals, exp_restore, pred_gain, stream_count, stream_hist,
                      write_planes, write_pred)
from .delta.encode import PLAN_OVER, delta_analyze, delta_build, delta_plan, delta_write, delta_z, stream_estimates
from .delta.decode import delta_decode
from .joint import JOINT_MIN, PRED_SURE, count_exponents, joint_alone, joint_analyze, joint_decode, joint_write
from .mctx import MCTX_MIN, mctx_decode, mctx_plan, mctx_write
from .temporal import (TSAMPLE_MIN, sample_tables, temporal_base, temporal_count, temporal_decode,
                       temporal_estimate, temporal_hist, temporal_sample, temporal_write)


# Format 7 with a reference (prefer="speed"): every coding is first estimated from a sample (alone, XOR,
# temporal, delta: a few percent of a pass each) and only those within 1/GATE_MARGIN of the smallest estimate
# are counted exactly. On a training run's tensors one coding wins each kind by far more (weights: temporal;
# first moments: alone; second moments: delta), so a chunk counts one or two codings instead of all four; the
# estimates err by a percent or two (the temporal one leaves out its tables), and a coding that loses by less
# than the margin costs less than the margin if chosen. Where no exact count lands within the margin of the
# smallest estimate (a sample that misled), every coding is counted, as without the gate; where the alone
# coding was not counted and the chosen coding fails, it is counted then. So a misleading sample costs time,
# not bytes. The margin is the one the temporal mode must win by in format 7 (TEMPORAL_MARGIN7).
GATE_MARGIN = 32
XOR_GATE = 64


@njit(inline="always")
def gate_cut(est_a, est_t, est_x, n):
    """The gate's cut from the alone, temporal and XOR estimates, before the delta plan's (the limit the plan is
    told: where its estimate is above it, it is not the smallest and the cut stays the same); -1 where the chunk
    is not gated (not estimated, or too short to sample)."""
    if est_a < 0 or n < TSAMPLE_MIN:
        return np.int64(-1)
    lo = min(est_a, min(est_t, est_x))
    return lo + lo // GATE_MARGIN


@njit(nogil=True, cache=True)
def encode_chunk(data, ref, has_ref, fv, pref, w, start, n, unit, layout, ns, out, o, planes, planes2,
                 jb, low, th, ha, hx, thist, tf, tcm, tbuf, rbuf, kbt, et, rplane, mh, mf, mcm, dsc, E0=-1):
    """Encode one chunk at out[o:] (planes, planes2: ns x >= n scratch;
    temporal scratch (float layouts with a reference and v2): jb, low: n
    u16 / u32; th: int32[4 * NCTX * 65]; ha, hx: int32[ns * 1024]; thist,
    tf, tcm: NCTX * 256 int64; tbuf: >= 2n + 16 bytes; rbuf: >= n * unit
    bytes; kbt: uint8[NCTX * 65]; et: uint64[2 * NCTX * 65]; out must have
    8 bytes of room past o + n * unit; rplane: >= n bytes where fv >= 3;
    mh: int64[4096], mf, mcm: int64[MCTX_K * 256] for the mantissa-context
    mode, jb then >= n u16 too; the delta mode (v6, a reference, float
    layouts): dsc = delta_scratch(...), one per driver; E0: the reference's context base where the driver took
    it (check.ref_pass), else -1).
    fv: the newest format version whose modes may be used (1, 2 or 3; 4:
    3's modes, the checksum over 64-bit words; 5: 4's and the
    mantissa-context mode, bf16, only where size comes first; 6: 5's and
    the delta mode); pref: PREF_SPEED, PREF_SIZE (every margin below is
    NO_MARGIN: a slower coding is taken whenever it is smaller) or PREF_FAST
    (never the temporal mode: with a reference the delta mode, which decodes
    at the byte-stream modes' speed, and no sampled estimates); w: the row length for the predicted-exponent
    mode (the shape's last dimension).  The mode is chosen from estimates: alone, predicted
    exponent (v3, float layouts, no reference), XOR (with a reference) or
    temporal (with a reference, float layouts), the smallest estimate
    winning; temporal only when it saves more than 1/TEMPORAL_MARGIN and
    the predicted exponent more than 1/PRED_MARGIN (they decode slower),
    unless sf.
    Returns (size, checksum, the format version the chunk needs)."""
    v2 = fv >= 2
    sf = pref == PREF_SIZE
    fast = pref == PREF_FAST
    wk = ck_mode(fv)  # format 4 and later: checksums over 64-bit words
    rm = 0 if not v2 else (NO_MARGIN if sf else RANS_MARGIN)
    pm = NO_MARGIN if sf else PRED_MARGIN
    tm = NO_MARGIN if sf else (TEMPORAL_MARGIN7 if fv >= 7 else TEMPORAL_MARGIN)
    h, lens, modes, sizes, f, cm = analysis_scratch(ns)
    # the reference's tables: their own where there is a reference, else the same arrays
    h2, lens2, modes2, sizes2, f2, cm2 = analysis_scratch(ns) if has_ref else (h, lens, modes, sizes, f, cm)
    E = 0
    cmask = 0
    raw = 0
    W = 32 if layout == LAYOUT_F32 else 16
    temporal = has_ref and v2 and layout != LAYOUT_PLANES
    nbytes = n * unit
    base = start * unit
    do_t = temporal
    do_x = has_ref
    do_d = temporal and fv >= 6
    cost_t = 0
    cost_d = 0
    db = 0
    dq = 8
    dm = 0
    dz, dpl, dhs, dh, dlens, dmodes, dsizes, df, dcm, dpos, dmk = dsc
    est_a = -1
    asplit = False   # the planes hold the chunk's units (split for the alone coding's counts)
    have_x = False   # the XOR coding counted (and planes2 split)
    fast_x = False   # prefer="fast" and the XOR coding may pay: counted exactly
    gate = False     # format 7, prefer="speed": only the codings whose estimates may win are counted
    sampled = False  # E and the temporal sample taken before the counts (not again in their loop)
    need_a = True    # the alone coding counted exactly
    gate_t = True
    gate_x = True
    est_t = 0
    est_x = 0
    cost_j = -1      # the joint-symbol mode (v9, bf16, alone): its plan
    jk = jb0 = jmode = jsize = 0
    jready = False
    g = h0 = 0.0     # the predicted-exponent mode's sampled gain and exponents' entropy where have_g (joint_analyze)
    have_g = False
    e0 = True        # the exponent plane counted (joint_analyze may leave it: see there)
    hj = h[0]
    lj = lens[0]
    if temporal:
        # the two full passes first (the chunk's checksum over the data, the context base over the reference):
        # they stream the chunk into the cache at the memory's bandwidth, where the sampled estimates below then
        # find their blocks (first, on a cold chunk, each sampled block waited for memory)
        chk = checksum_units(data, start, n, unit, wk)
        if do_d and not fast and fv >= 7 and not sf:
            E = E0 if E0 >= 0 else temporal_base(ref, start, n, layout)
    dplan = False    # db, dq and est_d hold an exact plan (False before one is made, and after PLAN_OVER)
    if do_d:
        if fast or fv < 7 or sf:
            db, dq, est_d = delta_plan(data, ref, start, n, layout, dhs)
            dplan = True
        if fast:
            # prefer="fast": the delta, alone and XOR codings estimated from
            # a sample (the XOR's with a margin of 1/16: the delta mode is
            # the one made for a reference); where the delta mode is larger
            # than one of the others it is not built and the chunk is coded
            # alone or by XOR (counted exactly, the XOR only where its
            # estimate is the smaller)
            est_a, est_x = stream_estimates(data, ref, start, n, layout, dhs)
            est_x += est_x // 16
            if est_a >= 0 and est_d > min(est_a, est_x):
                temporal = False
                do_d = False
                do_t = False
                fast_x = est_x < est_a
            est_a = min(est_a, est_x)
        elif fv >= 7 and not sf:
            sampled = True
            est_a, est_x0 = stream_estimates(data, ref, start, n, layout, dhs)
            est_t, est_x = temporal_sample(data, ref, start, n, layout, E, thist, tcm)
            # (with the bytes the sample leaves out: the 16 contexts' tables cost compressible chunks 2-4% above the
            # sample, which failed the gate's test below on 28 of 203 chunks of a bf16 model's weights, each then
            # counted in every coding; 11 with them)
            est_t += sample_tables(thist, W, n, fv) if est_t > 0 else 0
            # the delta plan last, told the gate's cut without it: where its estimate would be above that cut it
            # stops early with PLAN_OVER, and the delta coding is not counted (the same choices as a plan made
            # in full)
            cut = gate_cut(est_a, est_t, est_x, n)
            db, dq, est_d = delta_plan(data, ref, start, n, layout, dhs, cut)
            dplan = est_d != PLAN_OVER
            if cut >= 0:
                gate = True
                cut = gate_cut(min(est_a, est_d), est_t, est_x, n)   # (the same cut where est_d is above it)
                need_a = est_a <= cut
                do_d = est_d <= cut
                gate_t = est_t <= cut
                # the XOR coding wins only by being smaller than the alone coding (no margin), and their two
                # estimates come from the same sampled positions, so their ratio errs far less than either
                # estimate does (first moments: within 0.6-1.5% in 99% of chunks): it is counted only where
                # its estimate is within 1/XOR_GATE of the alone one's, as well as within the cut
                gate_x = est_x <= cut and est_x0 - est_x0 // XOR_GATE < est_a
    if temporal:
        # exact counts of the alone coding (format 7: where its estimate may
        # win) and of the delta coding; the XOR and temporal codings are
        # estimated on a sample first and analysed exactly only where they
        # may win; the chosen mode is split into planes afterwards
        have_d = False
        have_a = False
        have_t = False
        cost_a = 2 * nbytes + 64  # (not counted: larger than any coding)
        cost_x = cost_a + 1
        for rnd in range(2):
            if do_d and not have_d:
                have_d = True
                if not dplan:
                    db, dq, est_d = delta_plan(data, ref, start, n, layout, dhs)
                    dplan = True
                delta_z(data, ref, start, n, layout, dz)
                dm = delta_build(dz, n, 8 * unit, db, dq, dpl, dpos, dmk)
                cost_d = delta_analyze(dpl, n, 8 * unit, db, dq, dm, dh, dlens, dmodes, dsizes, df, dcm, rm, fast,
                                       fv)
                if fast:
                    # where the delta mode is clearly smaller than the alone and
                    # XOR codings' estimates, the alone coding is not counted (and
                    # no other mode tried)
                    if cost_d + cost_d // 16 < est_a and cost_d < nbytes:
                        e = delta_write(dpl, n, 8 * unit, db, dq, dm, dh, dlens, dmodes, dsizes, df, dcm, out, o,
                                        o + nbytes, tbuf, fv)
                        if e >= 0 and e - o < est_a:
                            return e - o, chk, 6
            if need_a and not have_a:
                have_a = True
                # as without a reference (analyze_planes): split into the planes it writes from, a plane sure
                # to be stored raw (near_raw: fp32's low mantissa bytes) not counted
                split_units(data[base:base + nbytes], n, unit, layout, planes)
                asplit = True
                h[:] = 0
                cost_a = analyze_planes(planes, n, ns, h, lens, modes, sizes, f, cm, rm, fv)
                if fv >= 9 and layout == LAYOUT_BF16 and n >= JOINT_MIN:
                    # (the joint-symbol mode is an alone coding too: never larger with a reference than without)
                    cost_j, jk, jb0, jmode, jsize, hj, lj = joint_alone(data, start, n, sf, modes[1] == MODE_RAW)
            best_e = cost_a
            if do_d:
                best_e = min(best_e, cost_d)
            if not fast and not gate and rnd == 0 and not sampled:
                E = E0 if E0 >= 0 else temporal_base(ref, start, n, layout)
                est_t, est_x = temporal_sample(data, ref, start, n, layout, E, thist, tcm)
            # (the sample's estimate leaves out the tables: up to format 6 it is
            # let within 1/16 above the best exact count; from 7 it must stay
            # 1/64 below it, half the margin the mode must win by)
            if fv >= 7 and not sf:
                do_t = not fast and gate_t and est_t + est_t // 64 < best_e
            else:
                do_t = not fast and est_t - est_t // 16 < best_e
            do_t = do_t or have_t
            if do_t and not have_t:
                have_t = True
                raw = temporal_count(data, ref, start, n, layout, E, jb, low, th)
                temporal_hist(th, W, thist)
                trans, cmask = temporal_estimate(thist, tf, tcm, W, n, fv)
                cost_t = 3 + trans + 4 + ((raw + 7) >> 3)
            # (fast: small chunks, not estimated, count the XOR coding exactly)
            do_x = have_x or (fast and est_a < 0) or (not fast and gate_x and est_x - est_x // 16
                                                      < (min(best_e, cost_t) if do_t else best_e))
            if do_x and not have_x:
                have_x = True
                # as the alone coding above: the planes it writes from, those sure to be stored raw not counted
                xor_into(rbuf, data, ref, base, nbytes)
                split_units(rbuf, n, unit, layout, planes2)
                h2[:] = 0
                cost_x = analyze_planes(planes2, n, ns, h2, lens2, modes2, sizes2, f2, cm2, 0 if fast else rm, fv)
            if not gate:
                break
            # the gate trusted the sample; where the smallest exact count is not within the margin of the
            # smallest estimate the sample misled it, and every coding is counted, as without the gate (a
            # misleading sample costs time, never bytes)
            lo_x = min(best_e, cost_t if do_t else best_e)
            lo_x = min(lo_x, cost_x if do_x else lo_x)
            if lo_x <= cut:
                break
            gate = False
            need_a = True
            do_d = True
            gate_t = True
            gate_x = True
    elif fv >= 9 and layout == LAYOUT_BF16 and n >= JOINT_MIN and not has_ref:
        # bf16 alone: mode 0 and the joint-symbol mode (k = 1 unless size comes first: its symbols decode
        # at 0.54 ns against 0.67 for k = 2, for 0.2% more bytes)
        chk, cost_a, cost_j, jk, jb0, jmode, jsize, hj, lj, jready, g, h0, have_g, e0 = joint_analyze(
            data, start, n, planes, h, lens, modes, sizes, f, cm, rm, fv, wk, w, pm)
        cost_x = cost_a
    else:
        chk = split_chunk(data, ref, False, start, n, unit, layout, planes, wk)
        cost_a = analyze_planes(planes, n, ns, h, lens, modes, sizes, f, cm, rm, fv)
        cost_x = cost_a
        if has_ref and (fast_x or not fast):
            split_chunk(data, ref, True, start, n, unit, layout, planes2, wk)
            cost_x = analyze_planes(planes2, n, ns, h2, lens2, modes2, sizes2, f2, cm2, 0 if fast else rm, fv)
    best = CHUNK_ALONE
    score = cost_a
    cost = cost_a
    # (the joint-symbol mode decided by a sample, jsize -1, is taken over mode 0 as the sample says, with or without a
    # reference and whether mode 0 was counted: so a chunk is never larger with a reference than without)
    if cost_j >= 0 and (jsize < 0 or cost_j < score):
        best = CHUNK_JOINT
        score = cost_j
        cost = cost_j
    # the predicted exponent (v3, alone): stream 0 replaced by its residuals
    hr = np.zeros((1, 4, 256), np.int64)
    lr = np.zeros((1, 256), np.uint8)
    mr = np.zeros(1, np.int64)
    sr = np.zeros(1, np.int64)
    fr = np.zeros(256, np.int64)
    cr = np.zeros(256, np.int64)
    # (first estimated on every 32nd exponent: where it cannot pay, as on
    # weights and first moments, the encoder spends ~1/32 of a pass on it).
    # With a reference it is the alone option too: a chunk coded with a
    # reference is never larger than the same chunk coded without one.
    split = not temporal or asplit
    if fv >= 3 and layout != LAYOUT_PLANES and n > 1 and temporal and need_a and not split:
        split_units(data[base:base + nbytes], n, unit, layout, planes)
        split = True
    if (need_a and not jready and fv >= 3 and layout != LAYOUT_PLANES and n > 1   # (jready: planes hold symbols)
            and (g if have_g else pred_gain(planes[0], n, w, 32)) * n > 8 * cost_a / pm):
        exp_residuals(planes[0], n, w, rplane)
        histo4(rplane, n, hr[0])
        rc = analyze_hist(hr, n, 1, lr, mr, sr, fr, cr, rm, 0, fv)
        if not e0 and n * h0 / 8 - rc <= PRED_SURE * (cost_a - (5 + sizes[0]) + rc + 4) / pm:
            # (the exponent plane left uncounted, but the sample's entropy of it does not clear the exact
            # residuals by far enough: counted now, and the modes compared as ever)
            e0 = True
            cost_a = score = cost = count_exponents(planes, n, h, lens, modes, sizes, f, cm, rm, fv)
        cost_p = cost_a - (5 + sizes[0]) + rc + 4
        every_const = mr[0] == MODE_CONST
        for s in range(1, ns):
            every_const = every_const and modes[s] == MODE_CONST
        if cost_p + cost_p // pm < score and not every_const:
            best = CHUNK_PRED
            score = cost_p
            cost = cost_p
    if not e0 and best != CHUNK_PRED:   # (the exponent plane left uncounted, and the mode not taken: counted now)
        e0 = True
        cost_a = score = cost = count_exponents(planes, n, h, lens, modes, sizes, f, cm, rm, fv)
    # the mantissa-context mode (v5, bf16, alone): only where size comes
    # first (it decodes symbol by symbol; it saves ~0.5% on weights)
    mE = 0
    mK = 1
    mmask = 1
    if sf and fv >= 5 and layout == LAYOUT_BF16 and n >= MCTX_MIN:
        cost_m, mE, mK, mmask = mctx_plan(planes[0], planes[1], n, 5 + sizes[0], mh, mf, mcm, fv)
        if cost_m < score:
            best = CHUNK_MCTX
            score = cost_m
            cost = cost_m
    alone = best  # the better alone coding (the fallback below)
    alone_cost = 1 + cost  # its chunk bytes: the mode byte and cost
    if fast:  # the delta mode first; the XOR coding must save 1/16 over it
        if do_d and cost_d < score:
            best = CHUNK_DELTA
            score = cost_d
            cost = cost_d
        if do_x and cost_x + cost_x // 16 < score:
            best = CHUNK_XOR
            score = cost_x
            cost = cost_x
    else:
        if do_x and cost_x < score:
            best = CHUNK_XOR
            score = cost_x
            cost = cost_x
        if do_d and cost_d < score:
            best = CHUNK_DELTA
            score = cost_d
            cost = cost_d
    if do_t:
        if cost_t + cost_t // tm < score:
            best = CHUNK_TEMPORAL
            cost = cost_t
    o0 = o
    lim = o + nbytes  # an encoded chunk must be smaller than a stored one
    e = -1
    if cost < nbytes:
        if best == CHUNK_TEMPORAL:
            e = temporal_write(E, cmask, jb, low, n, W, tf, tcm, raw, out, o, lim, tbuf, kbt, et, fv)
        elif best == CHUNK_XOR:
            if temporal and not have_x:   # (have_x: split when counted)
                xor_into(rbuf, data, ref, base, nbytes)
                split_units(rbuf, n, unit, layout, planes2)
            e = write_planes(CHUNK_XOR, planes2, n, ns, modes2, sizes2, h2, lens2, f2, cm2,
                              out, o, lim, tbuf, fv)
        elif best == CHUNK_DELTA:
            e = delta_write(dpl, n, 8 * unit, db, dq, dm, dh, dlens, dmodes, dsizes, df, dcm, out, o, lim, tbuf, fv)
        if not need_a and e < 0:  # the chosen coding failed and the alone coding was not counted: now
            need_a = True
            stream_count(data, ref, False, start, n, layout, ha)
            stream_hist(ha, ns, h)
            cost_a = analyze_hist(h, n, ns, lens, modes, sizes, f, cm, rm, 0, fv)
            alone_cost = 1 + cost_a
        # never larger than the alone encoding (exact unless it uses rANS)
        if best != alone and (e < 0 or e - o0 > alone_cost) and alone_cost <= nbytes:
            best = alone
            e = -1
        if best == CHUNK_JOINT:
            e = joint_write(data[base:base + nbytes].view(np.uint16), n, jk, jb0, jmode, jsize, hj, lj, planes[0],
                            planes[1], jready, out, o, lim, tbuf, fv)
            if e < 0:  # past lim: the plain alone coding (counted now where it was not), planes split again
                if jready:
                    stream_count(data, ref, False, start, n, layout, ha)
                    stream_hist(ha, ns, h)
                    cost_a = analyze_hist(h, n, ns, lens, modes, sizes, f, cm, rm, 0, fv)
                if cost_a < nbytes:
                    best = CHUNK_ALONE
                    split = False
        if best == CHUNK_MCTX:
            e = mctx_write(mE, mK, mmask, planes[0], planes[1], n, modes[0], sizes[0], h[0], lens[0], f[0:256],
                           cm[0:256], out, o, lim, mf, mcm, jb, et, tbuf, fv)
            if e < 0 and cost_a < nbytes:  # (its rANS estimate was short: the plain alone coding)
                best = CHUNK_ALONE
        if best == CHUNK_PRED:
            e = write_pred(planes, rplane, w, n, ns, modes, sizes, h, lens, f, cm, mr, sr, hr, lr, fr, cr,
                           out, o, lim, tbuf, fv)
            if e < 0 and not e0:   # (the plain alone coding next: its exponent plane counted)
                cost_a = count_exponents(planes, n, h, lens, modes, sizes, f, cm, rm, fv)
            if e < 0 and cost_a < nbytes:  # (its rANS estimate was short: the plain alone coding)
                best = CHUNK_ALONE
        if best == CHUNK_ALONE:
            if not split:
                split_units(data[base:base + nbytes], n, unit, layout, planes)
            e = write_planes(CHUNK_ALONE, planes, n, ns, modes, sizes, h, lens, f, cm,
                              out, o, lim, tbuf, fv)
    if e < 0:
        # stored chunk: the original units verbatim (never larger than input)
        out[o] = CHUNK_STORED
        copy_bytes(out, o + 1, data, base, nbytes)
        return 1 + nbytes, chk, 1
    if best == CHUNK_PRED:
        return e - o0, chk, 3
    if best == CHUNK_MCTX:
        return e - o0, chk, 5
    if best == CHUNK_JOINT:
        return e - o0, chk, 9
    if best == CHUNK_DELTA:
        return e - o0, chk, 6
    if best == CHUNK_TEMPORAL:
        used = True
    elif best == CHUNK_XOR:
        used = _uses_rans(modes2, ns)
    else:
        used = _uses_rans(modes, ns)
    return e - o0, chk, 2 if used else 1


@njit(nogil=True, cache=True)
def _requires(version, since, layout_ok, ref_ok):
    """The status of a chunk mode that needs format ``since`` or later, a layout it codes and (ref_ok False)
    a reference it lacks: checked in that order."""
    if version < since:
        return ERR_VERSION
    if not layout_ok:
        return ERR_FLAGS
    if not ref_ok:
        return ERR_NOREF
    return OK


@njit(nogil=True, cache=True)
def chunk_head(blob, off, clen, n, unit, layout, has_ref, version):
    """The mode byte of chunk blob[off:off+clen] and what it requires: a
    temporal chunk format v2, a float layout and a reference, a
    predicted-exponent chunk format v3, a float layout and a row length > 0,
    a stored chunk 1 + n * unit bytes, an XOR chunk a reference.  Returns
    (status, mode)."""
    if clen < 1:
        return ERR_TRUNC, 0
    flags = np.int64(blob[off])
    if flags > 7:
        return ERR_FLAGS, 0
    st = OK
    if flags == CHUNK_JOINT:
        st = _requires(version, 9, layout == LAYOUT_BF16, True)
    elif flags == CHUNK_DELTA:
        st = _requires(version, 6, layout != LAYOUT_PLANES, has_ref)
    elif flags == CHUNK_MCTX:
        st = _requires(version, 5, layout == LAYOUT_BF16, True)
    elif flags == CHUNK_PRED:
        st = _requires(version, 3, layout != LAYOUT_PLANES, True)
        if st == OK and clen < 5:
            st = ERR_TRUNC
        elif st == OK and load_u32(blob, off + 1) == 0:
            st = ERR_PRED
    elif flags == CHUNK_TEMPORAL:
        st = _requires(version, 2, layout != LAYOUT_PLANES, has_ref)
    elif flags == CHUNK_STORED:
        if clen != 1 + n * unit:
            st = ERR_LEN
    elif flags == CHUNK_XOR and not has_ref:
        st = ERR_NOREF
    return st, (flags if st == OK else 0)


@njit(nogil=True, cache=True)
def decode_chunk(blob, off, clen, n, unit, layout, ns, ref, has_ref, out, start, expected,
                 planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, cb, syms):
    """Decode one chunk (blob[off:off+clen]) into out; planes (ns + 3 x >= n+16),
    dec (uint16[2048]), dec3 (uint64[2048]) and lens (uint8[256]) are
    scratch.  Returns a status."""
    st, flags = chunk_head(blob, off, clen, n, unit, layout, has_ref, version)
    if st != OK:
        return st
    wk = ck_mode(version)  # format 4 and 5: checksums over 64-bit words
    end = off + clen
    if flags == CHUNK_TEMPORAL:
        st = temporal_decode(blob, off + 1, end, n, layout, ref, start, out, f, cm, dtab, cb,
                             syms, version)
    elif flags == CHUNK_DELTA:
        st = delta_decode(blob, off + 1, end, n, layout, ref, start, out, planes, dec, dec3, dec1, lens, tmp,
                          version, f, cm, dtab)
    elif flags == CHUNK_JOINT:
        base = start * 2
        # (joint_decode returns the chunk's checksum, taken in its vector pass as the units are written)
        st, chk = joint_decode(blob, off + 1, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab,
                               out[base:base + 2 * n].view(np.uint16))
        if st != OK:
            return st
        return OK if chk == expected else ERR_CHECKSUM
    elif flags == CHUNK_MCTX:
        base = start * 2
        st = mctx_decode(blob, off + 1, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, cb, syms,
                         out[base:base + 2 * n].view(np.uint16))
    elif flags == CHUNK_STORED:
        copy_bytes(out, start * unit, blob, off + 1, n * unit)
    else:
        delta = flags == CHUNK_XOR
        pos = off + 1
        w = 0
        if flags == CHUNK_PRED:
            pos = off + 5
            w = np.int64(load_u32(blob, off + 1))
        if layout != LAYOUT_F32 and layout != LAYOUT_BF16:
            st = decode_planes(blob, pos, end, n, ns, planes, dec, dec3, dec1, lens, tmp, version, f, cm,
                               dtab)
            if st != OK:
                return st
            if flags == CHUNK_PRED:
                exp_restore(planes[0], n, w)
            # the planes' merge computes the checksum as it writes
            chk = merge_chunk(planes, n, out, ref, delta, start, unit, layout, wk)
            return OK if chk == expected else ERR_CHECKSUM
        base = start * unit   # fp32 and bf16: merged into the units as their streams are read
        dst = out[base:base + unit * n]
        if layout == LAYOUT_F32:
            st = decode_f32(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, w,
                            dst.view(np.uint32))
        else:
            st = decode_bf16(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, w,
                             dst.view(np.uint16))
        if st == OK and delta:
            xor_into(dst, out, ref, base, unit * n)
    if st != OK:
        return st
    return OK if checksum_units(out, start, n, unit, wk) == expected else ERR_CHECKSUM


@njit(nogil=True, cache=True)
def f32_streams(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, q):
    """decode_f32's streams: the exponents into planes[0], each other stream into planes[s] unless it is raw
    (then q[s] >= 0: its position in blob).  Returns a status."""
    st, pos = read_records(blob, pos, end, n, 4, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, q)
    if st == OK and pos != end:
        return ERR_TRAIL
    return st


@njit(nogil=True, cache=True)
def f32_merge(blob, q, n, planes, dst):
    """The units of an fp32 chunk from its planes; where the three mantissa streams are raw (the common case)
    merged straight from the blob, without a copy."""
    if q[1] >= 0 and q[2] >= 0 and q[3] >= 0:
        merge_f32(planes[0], blob[q[1]:q[1] + n], blob[q[2]:q[2] + n], blob[q[3]:q[3] + n], n, dst)
        return
    for s in range(1, 4):
        if q[s] >= 0:
            copy_bytes(planes[s], 0, blob, q[s], n)
    merge_f32(planes[0], planes[1], planes[2], planes[3], n, dst)


@njit(nogil=True, cache=True)
def decode_f32(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, w, dst):
    """decode_planes and merge_units for an fp32 alone, predicted (w > 0: the row length) or XOR chunk into dst
    (uint32[n]; XOR chunks: before the reference is applied).  Returns a status."""
    q = np.empty(4, np.int64)
    st = f32_streams(blob, pos, end, n, planes, dec, dec3, dec1, lens, tmp, version, f, cm, dtab, q)
    if st != OK:
        return st
    if w > 0:
        exp_restore(planes[0], n, w)
    f32_merge(blob, q, n, planes, dst)
    return OK
