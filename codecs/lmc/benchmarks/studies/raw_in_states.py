"""A format change measured before it is made: the temporal mode's raw bits pushed into its 32 rANS states
instead of a raw bit stream of their own (weights against the previous checkpoint, one thread, AVX-512).

    cd codecs/lmc && python -m benchmarks.studies.raw_in_states SERIES [--dtypes bf16,fp32] [--repeat 5]

Why: coding bf16 weights against a reference spends most of its time in the symbol pass, and most of that pass
packs the raw bits (the k - 1 bits of |d| below its leading one) into one LSB-first stream (``kernels.tenc``):
a chain of scalar accumulator steps that vectors cannot take. Each state of an interleaved rANS coder is a stack
of bits, so a symbol's raw bits can go into its own state: uniform coding of kb bits (frequency 1 in 2^kb) is a
shift, exact, with the same 16-bit renormalisation. Each lane then codes its own bits, and nothing is serial
across lanes.

The rule this study codes (a candidate for a format version; every state as in FORMAT.md, "rANS"):

- encoder, element i (backwards, state x in [2^16, 2^32)): if x >= 2^(32 - kb), emit x's low 16 bits and
  shift x right by 16; x = x * 2^kb + bits; then the symbol is coded into x as now;
- decoder, element i: the symbol decoded and x renormalised as now; then bits = x mod 2^kb, x = x >> kb, and
  if x < 2^16, x = x << 16 | the next word. (kb <= 16: x >> kb >= 1 after the encoder's emission, so one
  word refills it.)

The words are read in groups of 16 states (elements 32 g + 16 h .. + 15 of round g): the group's 16 symbol
steps, in state order, then its 16 bit pops, in state order; a one-state-at-a-time coder that keeps that order
(``enc_scalar`` here) writes the vector loop's bytes, which the study checks on every chunk. Both forms carry
the 32 final states; the sizes differ by the raw stream's last byte and the coders' slack.

32-bit units have up to 31 raw bits: they are pushed as two parts, the bits above the 16th first, then the 16
or fewer below (the decoder pops the low part, refills, pops the high part, refills).

What it measures, per 131,072-element chunk of the series' last two checkpoints' weights (bf16 and fp32), every
chunk coded in the temporal mode, on the same data: the symbol pass as the encoder runs it now (bf16: the raw
bits packed in it) and with each element's bits kept apart (``tenc._make_tsyms8(..., pack=False)``); the
32-state rANS encoder as now (``rans.put_rans``: ``wenc.enc16``) and with the bits pushed (this module's loop);
the raw bits written as now (fp32: ``temporal._traw``); the decoder's fused pass as now
(``temporal.temporal_decode``, its tables read) and with the bits popped (this module's loop, its tables read).
Every chunk is decoded back by both and compared, and the scalar encoder's bytes with the vector one's. Needs
AVX-512 (``simd.SIMD512``): the loops here are its vector code, not the codec's."""
from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from lmc.kernels import temporal as kt
from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F32, NCTX, PROB_SCALE, checksum_units, copy_bytes
from lmc.kernels.check import ref_pass
from lmc.kernels.rans import _renc2, put_ctx_tables, put_rans, read_ctx_tables
from lmc.kernels.simd import LANES, SIMD512, _Vec, enc_table, rans_vstep
from lmc.kernels.tenc import _make_tsyms8
from lmc.kernels.wenc import _emit, _entries16, _fdiv_quotient, _push_step
from benchmarks.benchlib import keep_heap, last_two_weights

CHUNK = 131072


def _make_enc(W, words=False):
    """``(jb, low, nr, et32b, buf, p, xs) -> p``: wenc._make_tenc16's loop with each element's low[i] (kb bits,
    kb at bit 26 of its entry) pushed into the state before its symbol: its bits above the 16th first (W = 32),
    then the 16 or fewer below; words (W = 32): only the part above the 16th where kb > 16 (low[i] holds it: the
    low 16 bits went to the word stream, ``split_words``)."""
    V = _Vec(lanes=16)
    ir, cg, splat = V.ir, V.cg, V.splat
    I16, I32, I64, VN = V.I16, V.I32, V.I64, V.VN

    @intrinsic
    def _enc(typingctx, jb, low, nr, et32b, buf, p, xs):
        sig = types.int64(jb, low, nr, et32b, buf, p, xs)

        def codegen(context, builder, signature, args):
            jp, lp, ep, bp, xp = (V.data(context, builder, signature, args, k, t)
                                  for k, t in ((0, I16), (1, VN), (3, I32), (4, V.I8), (6, VN)))
            vx = V.states(builder, xp, 2)
            pos = cg.alloca_once_value(builder, args[5])
            with cg.for_range(builder, args[2]) as loop:
                g = builder.mul(builder.sub(builder.sub(args[2], ir.Constant(I64, 1)), loop.index), ir.Constant(I64, 2))
                for h in (1, 0):
                    e = _entries16(V, builder, jp, ep, builder.mul(builder.add(g, ir.Constant(I64, h)),
                                                                  ir.Constant(I64, 16)))
                    bits = builder.load(builder.gep(lp, [builder.add(g, ir.Constant(I64, h))]), align=4)
                    kb = builder.lshr(e, splat(26))
                    x = builder.load(vx[h])

                    def push(x, kb, v):
                        # x >= 2^(32 - kb) emits its low 16 bits (in lane order, below the pointer); x = x << kb | v
                        top = builder.lshr(builder.lshr(x, splat(16)), builder.sub(splat(16), kb))
                        x = _emit(V, builder, x, builder.icmp_unsigned("!=", top, splat(0)), pos, bp)
                        return builder.or_(builder.shl(x, kb), v)
                    if words:
                        big = builder.icmp_unsigned(">", kb, splat(16))
                        kb = builder.select(big, builder.sub(kb, splat(16)), kb)
                    elif W == 32:   # (the bits above the 16th, then the 16 below)
                        big = builder.icmp_unsigned(">", kb, splat(16))
                        x = push(x, builder.select(big, builder.sub(kb, splat(16)), splat(0)),
                                 builder.select(big, builder.lshr(bits, splat(16)), splat(0)))
                        kb = builder.select(big, splat(16), kb)
                        bits = builder.and_(bits, splat(0xFFFF))
                    x = push(x, kb, bits)
                    x = _push_step(V, builder, builder.and_(e, splat((1 << 26) - 1)), x, pos, bp,
                                   _fdiv_quotient(V, builder))
                    builder.store(x, vx[h])
            V.put_states(builder, vx, xp)
            return builder.load(pos)
        return sig, codegen
    return _enc


def _make_dec(W, words=False):
    """``(blob, io, dtab, ref, out, xs, rounds, E) -> contexts seen``: tfuse._make_fused(W, 16)'s round without
    its raw bit stream: after each symbol's step its bits are popped from the state (16 or fewer, then, W = 32,
    the rest), each pop followed by a refill; words (W = 32): where kb > 16 the low 16 bits come from the word
    stream at wd (its position io[1]) by vpexpandw, and only the rest from the state."""
    V = _Vec(W, 16)
    ir, I8, I16, I32, I64, VN, splat = V.ir, V.I8, V.I16, V.I32, V.I64, V.VN, V.splat
    VW, VM = ir.VectorType(I16, 16), ir.VectorType(V.I1, 16)

    @intrinsic
    def _dec(typingctx, blob, io, dtab, ref, out, xs, rounds, E, wd):
        sig = types.int64(blob, io, dtab, ref, out, xs, rounds, E, wd)

        def codegen(context, builder, signature, args):
            def data(k, t):
                return V.data(context, builder, signature, args, k, t)
            bp, iop, dp, rp, op, xp = data(0, I8), data(1, I64), data(2, I8), data(3, V.VU), data(4, V.VU), data(5, VN)
            zero, one = splat(0), ir.Constant(VM, [1] * 16)
            gth = V.fn(builder, "llvm.x86.avx512.mask.gather.dpi.512", VN, [VN, ir.PointerType(I8), VN, VM, I32])
            expand = V.fn(builder, "llvm.masked.expandload.v16i16", VW, [ir.PointerType(I16), VM, VW])
            ctpop = V.fn(builder, "llvm.ctpop.i32", I32, [I32])
            vmb, vem, vE = splat(7 if W == 16 else 23), splat(255), V.vsplat(builder, args[7])
            vx = V.states(builder, xp, 2)
            pos = V.cg.alloca_once_value(builder, builder.load(iop))
            wpos = V.cg.alloca_once_value(builder, builder.load(builder.gep(iop, [ir.Constant(I32, 1)])))
            wdp = data(8, I8)
            used = V.cg.alloca_once_value(builder, zero)
            with V.cg.for_range(builder, args[6]) as loop:
                for h in range(2):
                    j = builder.add(builder.mul(loop.index, ir.Constant(I64, 2)), ir.Constant(I64, h))
                    rv = V.units(builder, rp, j)
                    c = V.context(builder, rv, vmb, vem, vE)
                    builder.store(builder.or_(builder.load(used), builder.shl(splat(1), c)), used)
                    x = builder.load(vx[h])
                    slot = builder.add(builder.and_(x, splat(4095)), builder.shl(c, splat(12)))
                    e = builder.call(gth, [zero, dp, slot, one, ir.Constant(I32, 4)])
                    x, q = rans_vstep(builder, e, x, builder.load(pos), bp, None, None, ctpop, expand)
                    sv = builder.and_(e, splat(255))
                    k = builder.lshr(builder.add(sv, splat(1)), splat(1))
                    nz = builder.zext(builder.icmp_unsigned("!=", k, zero), VN)
                    kb = builder.sub(k, nz)

                    def pop(x, q, kb):
                        v = builder.and_(x, builder.sub(builder.shl(splat(1), kb), splat(1)))
                        x = builder.lshr(x, kb)
                        m = builder.icmp_unsigned("<", x, splat(1 << 16))
                        w = builder.zext(builder.call(expand, [builder.bitcast(builder.gep(bp, [q]),
                                                                               ir.PointerType(I16)),
                                                               m, ir.Constant(VW, [0] * 16)]), VN)
                        cnt = builder.call(ctpop, [builder.zext(builder.bitcast(m, I16), I32)])
                        return (v, builder.select(m, builder.or_(builder.shl(x, splat(16)), w), x),
                                builder.add(q, builder.shl(builder.zext(cnt, I64), ir.Constant(I64, 1))))
                    if W == 16:
                        bits, x, q = pop(x, q, kb)
                    elif words:
                        big = builder.icmp_unsigned(">", kb, splat(16))
                        wq = builder.load(wpos)
                        lw = builder.zext(builder.call(expand, [builder.bitcast(builder.gep(wdp, [wq]),
                                                                                ir.PointerType(I16)),
                                                                big, ir.Constant(VW, [0] * 16)]), VN)
                        cnt = builder.call(ctpop, [builder.zext(builder.bitcast(big, I16), I32)])
                        builder.store(builder.add(wq, builder.shl(builder.zext(cnt, I64), ir.Constant(I64, 1))), wpos)
                        hi, x, q = pop(x, q, builder.select(big, builder.sub(kb, splat(16)), kb))
                        bits = builder.select(big, builder.or_(builder.shl(hi, splat(16)), lw), hi)
                    else:
                        big = builder.icmp_unsigned(">", kb, splat(16))
                        bits, x, q = pop(x, q, builder.select(big, splat(16), kb))
                        hi, x, q = pop(x, q, builder.select(big, builder.sub(kb, splat(16)), splat(0)))
                        bits = builder.or_(bits, builder.shl(hi, splat(16)))
                    builder.store(x, vx[h])
                    builder.store(q, pos)
                    neg = builder.zext(builder.and_(builder.icmp_unsigned("!=", sv, zero), builder.icmp_unsigned(
                        "==", builder.and_(sv, splat(1)), zero)), VN)
                    a = builder.or_(bits, builder.shl(nz, kb))
                    d = builder.add(builder.xor(a, builder.sub(zero, neg)), neg)
                    y = V.mono(builder, builder.and_(builder.add(V.mono(builder, rv), d), splat((1 << W) - 1)),
                               inverse=True)
                    builder.store(builder.trunc(y, V.VU) if W == 16 else y, builder.gep(op, [j]), align=1)
            V.put_states(builder, vx, xp)
            builder.store(builder.load(pos), iop)
            builder.store(builder.load(wpos), builder.gep(iop, [ir.Constant(I32, 1)]))
            return V.hsum(builder, builder.load(used), "or_")
        return sig, codegen
    return _dec


if SIMD512:
    _s16, _s32 = _make_tsyms8(16, 16, pack=False), _make_tsyms8(32, 16, pack=False)
    _e16, _e32, _e32w = _make_enc(16), _make_enc(32), _make_enc(32, words=True)
    _d16, _d32, _d32w = _make_dec(16), _make_dec(32), _make_dec(32, words=True)

    @njit(nogil=True)
    def syms_apart(x, r, E, jb, low):
        if x.itemsize == 2:
            return _s16(x, r, np.int64(x.size), np.int64(7), np.int64(255), np.int64(E), jb, low)
        return _s32(x, r, np.int64(x.size), np.int64(23), np.int64(255), np.int64(E), jb, low)

    @njit(nogil=True)
    def enc_bits(jb, low, et, buf, xs, W, words):
        et32b = enc_table(et)   # (with each entry's kb at bit 26)
        for j in range(et32b.size):
            et32b[j] |= np.uint32((et[2 * j + 1] >> np.uint64(26)) & np.uint64(31)) << np.uint32(26)
        if W == 16:
            return _e16(jb, low, np.int64(jb.size // 32), et32b, buf, np.int64(buf.size), xs)
        if words:
            return _e32w(jb, low, np.int64(jb.size // 32), et32b, buf, np.int64(buf.size), xs)
        return _e32(jb, low, np.int64(jb.size // 32), et32b, buf, np.int64(buf.size), xs)

    @njit(nogil=True)
    def dec_bits(blob, dtab, ref, out, xs, E, wd, words):
        io = np.zeros(2, np.int64)
        if ref.itemsize == 2:
            _d16(blob, io, dtab, ref, out, xs, np.int64(ref.size // 32), np.int64(E), wd)
        elif words:
            _d32w(blob, io, dtab, ref, out, xs, np.int64(ref.size // 32), np.int64(E), wd)
        else:
            _d32(blob, io, dtab, ref, out, xs, np.int64(ref.size // 32), np.int64(E), wd)
        return io[0], io[1]


@njit(nogil=True)
def split_words(jb, low, et, wd):
    """Where an element has more than 16 raw bits, their low 16 to the word stream wd (in element order) and the
    rest kept in low; returns the words (a scalar pass here; a symbol pass would store them as it goes)."""
    nw = 0
    for i in range(jb.size):
        kb = np.int64(et[2 * np.int64(jb[i]) + 1] >> np.uint64(26)) & 31
        v = low[i]
        big = kb > 16
        wd[nw] = np.uint16(v & 0xFFFF)
        nw += big
        low[i] = v >> 16 if big else v
    return nw


@njit(nogil=True)
def _push(x, kb, v, buf, p):
    if x >> np.uint64(32 - kb):
        p -= 2
        buf[p] = np.uint8(x & np.uint64(255))
        buf[p + 1] = np.uint8((x >> np.uint64(8)) & np.uint64(255))
        x >>= np.uint64(16)
    return (x << np.uint64(kb)) | np.uint64(v), p


@njit(nogil=True)
def enc_scalar(jb, low, et, buf, xl, words):
    """The vector encoder's bytes one state at a time (xl: uint64[32] states, updated); returns the start."""
    p = buf.size
    for g in range(jb.size - 32, -1, -32):
        for h in (1, 0):
            # (popped after the symbols, so pushed before them: the bits above the 16th, then those below)
            for part in (1, 0):
                for k in range(15, -1, -1):
                    i = g + 16 * h + k
                    kb = np.int64(et[2 * np.int64(jb[i]) + 1] >> np.uint64(26)) & 31
                    v = np.int64(low[i])
                    if words:   # (one part: the bits above the 16th, or all of them)
                        if part == 1:
                            continue
                        kb = kb - 16 if kb > 16 else kb
                    elif part == 1:
                        kb, v = (kb - 16, v >> 16) if kb > 16 else (0, 0)
                    else:
                        kb, v = min(kb, 16), v & 0xFFFF
                    xl[16 * h + k], p = _push(xl[16 * h + k], kb, v, buf, p)
            for k in range(15, -1, -1):
                j = 2 * np.int64(jb[g + 16 * h + k])
                xl[16 * h + k], p = _renc2(xl[16 * h + k], et[j], et[j + 1], buf, p)
    return p


def study(x, r, W, repeat):
    """Best seconds of each pass over the whole chunks (the last partial chunk left out), and the bytes of each
    coding's rANS stream and raw bits."""
    layout, mb, unit = (LAYOUT_BF16, 7, 2) if W == 16 else (LAYOUT_F32, 23, 4)
    x8, r8 = x.view(np.uint8), r.view(np.uint8)
    nch = x.size // CHUNK
    jb, low = np.empty(CHUNK + 16, np.uint16), np.empty(CHUNK + 16, np.uint32)
    jb2, low2 = np.empty(CHUNK, np.uint16), np.empty(CHUNK, np.uint32)
    th = np.empty(4 * NCTX * 65, np.int32)
    thist, tf, tcm, f2, cm2 = (np.zeros(NCTX * 256, np.int64) for _ in range(5))
    et, kbt = np.zeros(2 * NCTX * 65, np.uint64), np.zeros(NCTX * 65, np.uint8)
    tbuf, out = np.empty(4 * CHUNK + 256, np.uint8), np.empty(unit * CHUNK + 64, np.uint8)
    dtab, o = np.empty(NCTX * PROB_SCALE, np.uint32), np.empty_like(x[:CHUNK])
    cb, sy = np.empty(CHUNK + 16, np.uint16), np.empty(CHUNK + 16, np.uint8)
    t = dict.fromkeys(("symbol pass (now; bf16: its raw bits packed in it)", "rANS encoder (now)",
                       "raw bits written (now)", "symbol pass, each element's bits kept",
                       "rANS encoder, the bits pushed into the states", "decoder, fused (now)",
                       "decoder, fused, the bits popped from the states")
                      + (("word stream: the low 16 bits split off (a scalar pass)",
                          "word stream: rANS encoder, the rest pushed into the states",
                          "word stream: decoder, fused") if W == 32 else ()), float("inf"))
    wd = np.empty(CHUNK, np.uint16)
    size_now = size_new = size_words = 0

    def bits_form(words, nw=0):
        """The chunk's bits in the states (words: fp32's low 16 bits in the word stream): encoded, checked against
        the scalar encoder (first round), decoded and compared; (encoder s, decoder s, stream bytes with R and
        the states)."""
        xl = np.full(32, np.uint32(1 << 16))
        t0 = time.perf_counter()
        p = enc_bits(jb2, low2, et, tbuf, xl, W, words)
        t1 = time.perf_counter()
        stream = tbuf[p:].copy()
        if rep == 0:
            xs64 = np.full(32, np.uint64(1 << 16))
            ps = enc_scalar(jb2, low2, et, tbuf, xs64, words)
            if not (ps == p and np.array_equal(tbuf[ps:], stream) and np.array_equal(xs64, xl)):
                raise SystemExit(f"raw_in_states: chunk {c}: the scalar and vector encoders differ")
        x2 = xl.copy()
        o[:] = 0
        t2 = time.perf_counter()
        read_ctx_tables(out, 0, tend, cmask, NCTX, 2 * W, f2, cm2, dtab)   # (as temporal_decode reads them)
        q, qw = dec_bits(stream, dtab, rs, o, x2, E, wd.view(np.uint8), words)
        t3 = time.perf_counter()
        if q != stream.size or qw != 2 * nw or not (x2 == 1 << 16).all() or not np.array_equal(o, xs):
            raise SystemExit(f"raw_in_states: chunk {c}: the bits in the states did not decode back")
        return t1 - t0, t3 - t2, 4 + stream.size + 4 * 32
    for rep in range(repeat + 1):   # (the first round compiles and warms up)
        cur = dict.fromkeys(t, 0.0)
        for c in range(nch):
            s = c * CHUNK
            xs, rs = x[s:s + CHUNK], r[s:s + CHUNK]
            checksum_units(x8, s, CHUNK, unit, 3)   # (the encoder's first passes: the chunk in the cache, as there)
            E = ref_pass(r8, s, CHUNK, unit, layout, 3)[1]
            t0 = time.perf_counter()
            raw = kt._tsyms_all(xs, rs, CHUNK, W, mb, 0xFF, E, jb, low)
            t1 = time.perf_counter()
            kt.temporal_count(x8, r8, s, CHUNK, layout, E, jb, low, th)
            kt.temporal_hist(th, W, thist)
            _, cmask = kt.temporal_estimate(thist, tf, tcm, W, CHUNK, 9)
            tend = put_ctx_tables(tf, tcm, cmask, NCTX, 2 * W + 1, out, 0, unit * CHUNK, et, kbt, True)
            t2 = time.perf_counter()
            o1 = put_rans(jb, CHUNK, et, tbuf[:2 * CHUNK + 4 * LANES + 16], out, tend, unit * CHUNK, (raw + 7) >> 3,
                          32)
            t3 = time.perf_counter()
            if kt.packed(W):   # (as temporal_write: the symbol pass packed them)
                copy_bytes(out, o1, low.view(np.uint8), 0, (raw + 7) >> 3)
                o2 = o1 + ((raw + 7) >> 3)
            else:
                o2 = kt._traw(jb, low, CHUNK, kbt, out, o1, 2)
            t4 = time.perf_counter()
            syms_apart(xs, rs, E, jb2, low2)
            t5 = time.perf_counter()
            blob_now = np.concatenate([np.frombuffer(bytes([3, E, cmask & 255, cmask >> 8]), np.uint8), out[:o2]])
            t8 = time.perf_counter()
            st = kt.temporal_decode(blob_now, 1, blob_now.size, CHUNK, layout, rs.view(np.uint8), 0,
                                    o.view(np.uint8), f2, cm2, dtab, cb, sy, 9)
            t9 = time.perf_counter()
            if st != 0 or not np.array_equal(o, xs):
                raise SystemExit(f"raw_in_states: chunk {c}: the current decoder did not give it back ({st})")
            enc, dec, sb = bits_form(False)
            dt = [t1 - t0, t3 - t2, t4 - t3, t5 - t4, enc, t9 - t8, dec]
            if rep == 0:
                size_now += o2 - tend
                size_new += sb
            if W == 32:   # the low 16 bits of the elements with more apart, in a word stream
                t12 = time.perf_counter()
                nw = split_words(jb2, low2, et, wd)
                t13 = time.perf_counter()
                enc, dec, sb = bits_form(True, nw)
                dt += [t13 - t12, enc, dec]
                if rep == 0:
                    size_words += sb + 4 + 2 * nw
            for k, v in zip(t, dt):
                cur[k] += v
        if rep:
            t = {k: min(v, cur[k]) for k, v in t.items()}
    return t, nch * CHUNK, size_now, size_new, size_words


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("series")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    if a.repeat < 1 or not set(a.dtypes.split(",")) <= {"bf16", "fp32"}:
        raise SystemExit("raw_in_states: --dtypes takes bf16 and fp32, --repeat 1 or more")
    if not SIMD512:
        raise SystemExit("raw_in_states: needs a CPU with AVX-512 (its loops are AVX-512 code)")
    keep_heap(["-m", "benchmarks.studies.raw_in_states", *sys.argv[1:]])
    steps, (old, new) = last_two_weights(a.series, "raw_in_states")
    print(f"checkpoint-{steps[-1]}'s weights against checkpoint-{steps[-2]}'s, the chunks of {CHUNK:,} elements "
          f"(the last partial one left out); one thread; best of {a.repeat}; every chunk decoded back by both, and "
          f"the scalar encoder's bytes compared with the vector one's")
    for dt in a.dtypes.split(","):
        typ, W, ut = (ml_dtypes.bfloat16, 16, np.uint16) if dt == "bf16" else (np.float32, 32, np.uint32)
        x = np.concatenate([v.astype(typ).ravel() for v in new]).view(ut)
        r = np.concatenate([v.astype(typ).ravel() for v in old]).view(ut)
        t, ne, size_now, size_new, size_words = study(x, r, W, a.repeat)
        print(f"\n## {dt} weights: {ne:,} elements\n\n| pass | ms | ns per element |\n|---|---:|---:|")
        for k, v in t.items():
            print(f"| {k} | {v * 1e3:.2f} | {v / ne * 1e9:.3f} |")
        v = list(t.values())
        now, new_ = sum(v[:3]), sum(v[3:5])
        print(f"\nencoder, the passes above: now {now / ne * 1e9:.3f}, bits in the states {new_ / ne * 1e9:.3f} ns "
              f"an element ({(now - new_) / ne * 1e9:+.3f} saved); decoder now {v[5] / ne * 1e9:.3f}, bits in the "
              f"states {v[6] / ne * 1e9:.3f}")
        print(f"bytes of the rANS stream and the raw bits (the tables apart): now {size_now:,}, bits in the states "
              f"{size_new:,} ({(size_new / size_now - 1) * 100:+.3f}%)")
        if W == 32:
            print(f"word stream: encoder {(v[3] + v[7] + v[8]) / ne * 1e9:.3f} ns an element (with the split as a "
                  f"scalar pass of its own), decoder "
                  f"{v[9] / ne * 1e9:.3f}; bytes {size_words:,} ({(size_words / size_now - 1) * 100:+.3f}%)")


if __name__ == "__main__":
    main()
