"""lmc kernels: the temporal decoder's three passes as one vector pass (``fused_rounds``): for each round of 32
elements of a 32-state chunk (format 7 on), the contexts from the reference, the rANS symbols, the raw bits and
the units, in registers (FORMAT.md, "Temporal chunk").  Where the CPU has AVX-512 (``simd.SIMD512``) a round is
two vectors of 16 lanes (``_make_fused(W, 16)``: the words go to their lanes by ``vpexpandw``, the raw bits come
from a 64-byte window); elsewhere with AVX2 it is four of 8, as below.  Both give the same units, states and
positions (``tests/test_tfuse.py`` runs its tests on both where the CPU has AVX-512).

The unfused decoder (``kernels.temporal``) makes three passes over a chunk: the contexts and mono(reference)
into two planes (``simd.tmask8``), the symbols into a third (``simd.rounds32``, reading the first) and the raw
bits into the units (``simd.trecon8``, reading the other two back). A round here is four vectors of eight
elements; for each:

- the eight reference units, their contexts (``_Vec.context``; the set of contexts seen is returned, which the
  caller compares with the chunk's mask) and mono(reference);
- one rANS step of eight states as ``simd.rounds32`` takes it, the table of each element's context at
  ``dtab[context << 12]``: a gather, the states below 2^16 refilled in lane order from the words at the pointer
  (``vpermd`` with ``simd.PERM``);
- the symbols' raw bits as ``simd.trecon8`` reads them (a prefix sum of the bit counts, the 32 or 36 bytes at
  the vector's first bit moved to the lanes by ``vpermd``), and the unit unmono(mono(reference) + d) stored.

The loop is software-pipelined: an iteration issues round g's four gathers, then the raw bits of round g - 1
(which do not wait on them), then round g's state steps. In that order the raw bits fill the gathers' latency;
with each round's three parts in a row the loop was slower than the three passes.

The same units and the same state, word position and bit position as the three passes (``tests/test_tfuse.py``).
Where ``simd.SIMD`` is false ``fused_rounds`` is never called. The caller guarantees that every word and raw byte
read lies inside the blob (a round reads at most 32 words; an 8-lane vector 16 bytes at the word pointer and 32
(W = 16) or 36 (W = 32) bytes at its first raw bit, a 16-lane one the words it takes and 64 bytes: WORD_SLACK,
RAW_SLACK), that dtab holds 16 tables of 4096 entries, and that ref and out hold the rounds' units; nothing here
checks bounds."""

import numpy as np
from numba import njit

from .simd import PERM, SIMD, SIMD512, _Vec, rans_vstep

# how far past a round's share the last vector's loads reach (fused_budget): an 8-lane vector loads 16 bytes at
# the word pointer and 32 or 36 at its first raw bit, a 16-lane one the words it takes and 64
WORD_SLACK = 32 if SIMD512 else 16
RAW_SLACK = 72 if SIMD512 else 40


@njit(nogil=True, cache=True)
def fused_budget(rounds, words, raw, bit, W):
    """How many of ``rounds`` fused rounds may run with ``words`` bytes of the rANS stream left past the word
    pointer and ``raw`` bytes of raw bits from the first, ``bit`` of them read: a round reads at most 32 words
    (64 bytes) and 32 (W - 1) raw bits, and its last vector's loads reach WORD_SLACK and RAW_SLACK further."""
    return min(rounds, (words - WORD_SLACK) // 64, (raw - (bit >> 3) - RAW_SLACK) // (4 * (W - 1)))


def _make_fused(W, lanes):
    """``(blob, io, rs, dtab, ref, out, xs, perm, i0, rounds, mb, em, E) -> the set of contexts``: ``rounds``
    rounds from element i0 (a multiple of 32) of W-bit units; io (int64[2]): the next rANS word's position in
    blob and the raw bits read from byte rs, both updated; xs (uint32[32]) the states, updated.  ``lanes`` 8: a
    round is four AVX2 vectors, the rANS words put in their lanes by ``vpermd`` with ``perm`` (``simd.PERM``);
    16: two AVX-512 vectors, the words expanded into their lanes by ``vpexpandw`` (``perm`` unused).  Either way
    the states below 2^16 of a vector take the words at the pointer in lane order, then those of the next vector:
    the same words to the same states."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(W, lanes)
    ir, I1, I8, I16, I32, I64, VN, splat = V.ir, V.I1, V.I8, V.I16, V.I32, V.I64, V.VN, V.splat
    nv, lg = 32 // lanes, lanes.bit_length() - 1
    VW, VM = ir.VectorType(I16, lanes), ir.VectorType(I1, lanes)

    @intrinsic
    def _fused(typingctx, blob, io, rs, dtab, ref, out, xs, perm, i0, rounds, mb, em, E):
        sig = types.int64(blob, io, rs, dtab, ref, out, xs, perm, i0, rounds, mb, em, E)

        def codegen(context, builder, signature, args):
            def data(k, t):
                return V.data(context, builder, signature, args, k, t)

            bp, iop, dp = data(0, I8), data(1, I64), data(3, I8)
            rp, op, xp, pp = data(4, V.VU), data(5, V.VU), data(6, VN), data(7, ir.VectorType(I32, 8))
            rawp = builder.gep(bp, [args[2]])
            zero, mask = splat(0), splat((1 << W) - 1)
            if lanes == 8:
                gth = V.fn(builder, "llvm.x86.avx2.gather.d.d.256", VN, [VN, ir.PointerType(I8), VN, VN, I8])
                permd = V.fn(builder, "llvm.x86.avx2.permd", VN, [VN, VN])
                psllv = V.fn(builder, "llvm.x86.avx2.psllv.d.256", VN, [VN, VN])
                ctpop = V.fn(builder, "llvm.ctpop.i32", I32, [I32])

                def gather(idx):
                    return builder.call(gth, [zero, dp, idx, splat(-1), ir.Constant(I8, 4)])

                def vstep(e, x, q):
                    return rans_vstep(builder, e, x, q, bp, pp, permd, ctpop)
            else:
                gth = V.fn(builder, "llvm.x86.avx512.mask.gather.dpi.512", VN, [VN, ir.PointerType(I8), VN, VM, I32])
                permd = V.fn(builder, "llvm.x86.avx512.permvar.si.512", VN, [VN, VN])
                psllv = V.fn(builder, "llvm.x86.avx512.psllv.d.512", VN, [VN, VN])
                expand = V.fn(builder, "llvm.masked.expandload.v16i16", VW, [ir.PointerType(I16), VM, VW])
                ctpop = V.fn(builder, "llvm.ctpop.i32", I32, [I32])

                def gather(idx):
                    return builder.call(gth, [zero, dp, idx, ir.Constant(VM, [1] * 16), ir.Constant(I32, 4)])

                def vstep(e, x, q):
                    return rans_vstep(builder, e, x, q, bp, pp, permd, ctpop, expand)
            vmb, vem, vE = (V.vsplat(builder, args[k]) for k in (10, 11, 12))
            vx = V.states(builder, xp, nv)
            pos = V.cg.alloca_once_value(builder, builder.load(iop))
            tot = V.cg.alloca_once_value(builder, builder.load(builder.gep(iop, [ir.Constant(I32, 1)])))
            used = V.cg.alloca_once_value(builder, zero)
            # the previous round's symbols, for its raw bits (stage B; its reference units are loaded again: fewer
            # vectors live across the loop, which spilled them)
            svp = [V.cg.alloca_once_value(builder, zero) for h in range(nv)]

            def vec(g, h):
                return builder.lshr(builder.add(g, ir.Constant(I64, lanes * h)), ir.Constant(I64, lg))

            def stage_a(g):
                """Round g's contexts and table entries (the gathers, issued first)."""
                es = []
                for h in range(nv):
                    c = V.context(builder, V.units(builder, rp, vec(g, h)), vmb, vem, vE)
                    builder.store(builder.or_(builder.load(used), builder.shl(splat(1), c)), used)
                    es.append(gather(builder.add(builder.and_(builder.load(vx[h]), splat(4095)),
                                                 builder.shl(c, splat(12)))))
                return es

            def stage_c(es):
                """Round g's state steps (simd.rounds32's), its symbols and units kept for stage B."""
                for h in range(nv):
                    x, q = vstep(es[h], builder.load(vx[h]), builder.load(pos))
                    builder.store(x, vx[h])
                    builder.store(q, pos)
                    builder.store(builder.and_(es[h], splat(255)), svp[h])

            def stage_b(g):
                """The raw bits and units of the round at g whose symbols stage C kept (simd.trecon8's reading)."""
                for h in range(nv):
                    j = vec(g, h)
                    sv, rv = builder.load(svp[h]), V.units(builder, rp, j)
                    t0 = builder.load(tot)
                    d, nbits = V.raw_diffs(builder, sv, t0, rawp, permd, psllv)
                    y = V.mono(builder, builder.and_(builder.add(V.mono(builder, rv), d), mask), inverse=True)
                    builder.store(builder.trunc(y, V.VU) if W == 16 else y, builder.gep(op, [j]), align=1)
                    builder.store(builder.add(t0, nbits), tot)

            # software-pipelined: round g's gathers, then round g - 32's raw bits (independent of them: they fill
            # the gathers' latency), then round g's state steps
            stage_c(stage_a(args[8]))
            with V.cg.for_range(builder, builder.sub(args[9], ir.Constant(I64, 1))) as loop:
                g = builder.add(args[8], builder.mul(builder.add(loop.index, ir.Constant(I64, 1)),
                                                     ir.Constant(I64, 32)))
                es = stage_a(g)
                stage_b(builder.sub(g, ir.Constant(I64, 32)))
                stage_c(es)
            stage_b(builder.add(args[8], builder.mul(builder.sub(args[9], ir.Constant(I64, 1)),
                                                     ir.Constant(I64, 32))))
            V.put_states(builder, vx, xp)
            builder.store(builder.load(pos), iop)
            builder.store(builder.load(tot), builder.gep(iop, [ir.Constant(I32, 1)]))
            return V.hsum(builder, builder.load(used), "or_")
        return sig, codegen
    return _fused


if SIMD:
    _fused16 = _make_fused(16, 16 if SIMD512 else 8)
    _fused32 = _make_fused(32, 16 if SIMD512 else 8)
    _PERM = PERM

    @njit(nogil=True, cache=True)
    def fused_rounds(blob, io, rs, dtab, ref, out, xs, i0, rounds, mb, em, E, W):
        """``rounds`` fused rounds from element i0 (see _make_fused); returns the set of contexts seen."""
        if W == 16:
            return _fused16(blob, io, np.int64(rs), dtab, ref, out, xs, _PERM, np.int64(i0), np.int64(rounds),
                            np.int64(mb), np.int64(em), np.int64(E))
        return _fused32(blob, io, np.int64(rs), dtab, ref, out, xs, _PERM, np.int64(i0), np.int64(rounds),
                        np.int64(mb), np.int64(em), np.int64(E))
else:
    @njit(nogil=True, cache=True)
    def fused_rounds(blob, io, rs, dtab, ref, out, xs, i0, rounds, mb, em, E, W):   # (never called: no SIMD)
        return np.int64(0)
