"""AVX2 vector code: the 32-state rANS decoder and encoder (format 7) and the temporal mode's passes.

The same outputs as the scalar loops they replace, where SIMD is True (below); tests/test_rans32.py checks each
against its scalar loop and the frozen vectors in both builds:

- ``rounds32``: full rounds of 32 symbols of a 32-state stream decoded as four vectors (below);
- ``enc32``: the encoder's full rounds, four vectors a round (``_make_enc32``);
- ``tmask8``, ``trecon8``: the temporal decoder's context pass and raw-bit pass, eight units a vector (the
  encoder's symbol pass: ``kernels.tenc``).  Numba widens the scalar loops' integers to 64 bits (4 lanes to a
  vector, or none for the serial raw-bit reader); the units fit 32 bits, and so does every value they make.

The decoder:

Format 7 codes a rANS stream of at least ``LANES_MIN`` symbols with 32 interleaved states that share one stream
of 16-bit words, symbol ``i`` with state ``i mod 32`` (FORMAT.md, "rANS"): the same rule as format 2's 4 states,
so the scalar decoder (``rans.py``) is the plain loop over the symbols.  A round of 32 symbols has no dependency
between its states except the word pointer, so eight states are one ``<8 x i32>`` vector:

- the decode-table entries of the eight states are one hardware gather (``vpgatherdd``);
- the states that fall below 2^16 take the next words of the stream in lane order: the eight words at the
  pointer are loaded at once and moved to their lanes by ``vpermd`` with a permutation looked up from the
  comparison's 8-bit mask (``PERM``), or where the CPU has AVX-512 (``SIMD512``) the words the mask asks for are
  expanded into their lanes by ``vpexpandw``; the pointer advances by twice the mask's popcount.

This is the standard way to vectorise interleaved rANS with a shared stream; it gives byte for byte the symbols of
the scalar loop.  ``rounds32(blob, p, dtab, cb, out, xs, i0, rounds)`` runs ``rounds`` full rounds from symbol
``i0``; ``xs`` (uint32[32]) holds the states and is updated; ``cb`` (uint16) holds each symbol's decode-table base
(the context's table) or is an empty array for one table.  It returns the next word's position.  The caller
guarantees ``p + 64 * rounds + 16 <= blob.size`` (a round reads at most 32 words, and each vector reads 16 bytes
at the pointer) and that every ``cb[i] + 4095`` lies inside ``dtab``; nothing here checks bounds.

``SIMD`` is True where the host CPU has AVX2, the kernels are compiled (not ``NUMBA_DISABLE_JIT``), the checked
build is off (its bounds checks are the scalar loop's) and ``LMC_SIMD`` is not ``0``.  Elsewhere ``rounds32`` is
the scalar loop itself (same results), so every caller compiles on any CPU; with ``LMC_SIMD=0`` the kernels are
compiled and cached apart (Numba's cache does not record a global's value).  ``SIMD512`` (SIMD, AVX-512 F, BW, VL,
VBMI2, ``LMC_SIMD`` not ``avx2``, which is cached apart too): ``kernels.tfuse``'s fused decoder runs 16 lanes,
``kernels.wenc``'s encoder of byte streams 16 lanes with its table in registers, and ``rounds32`` takes its words
by ``vpexpandw``."""
import os

import numba
import numpy as np
from numba import njit

from .intrinsics import CHECKED, ld, load_u16

LANES = 32
RANS_L = 1 << 16


def _host_has(*features):
    """Whether the host CPU has every feature named (llvmlite's names)."""
    try:
        import llvmlite.binding as ll
        f = ll.get_host_cpu_features()
        return all(bool(f.get(k)) for k in features)
    except Exception:  # pragma: no cover - an llvmlite without the query
        return False


FORCED_OFF = os.environ.get("LMC_SIMD", "") == "0"
FORCED_AVX2 = os.environ.get("LMC_SIMD", "") == "avx2"
SIMD = (not numba.config.DISABLE_JIT) and not CHECKED and not FORCED_OFF and _host_has("avx2")
SIMD512 = SIMD and not FORCED_AVX2 and _host_has("avx512f", "avx512bw", "avx512vl", "avx512vbmi2")
if (FORCED_OFF or FORCED_AVX2) and not CHECKED and not numba.config.DISABLE_JIT:
    _base = numba.config.CACHE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    numba.config.CACHE_DIR = os.path.join(_base, "scalar" if FORCED_OFF else "avx2")


def _perm_table():
    """PERM[m * 8 + j]: for an 8-bit mask m of the lanes that take a word, the index of lane j's word among the
    eight loaded at the pointer (the number of set bits of m below j), 0 for a lane that takes none."""
    t = np.zeros(256 * 8, np.int32)
    for m in range(256):
        k = 0
        for j in range(8):
            if m >> j & 1:
                t[m * 8 + j] = k
                k += 1
    return t


PERM = _perm_table()


@njit(nogil=True, cache=True)
def scalar_rounds(blob, p, dtab, cb, out, xs, i0, rounds):
    """The rounds of ``rounds32`` one symbol at a time (the same words, in the same order)."""
    use_cb = cb.size > 0
    for i in range(i0, i0 + LANES * rounds):
        k = i & (LANES - 1)
        x = np.int64(xs[k])
        t = np.int64(0)
        if use_cb:
            t = np.int64(ld(cb, i))
        e = np.int64(ld(dtab, t + (x & 4095)))
        out[i] = e & 255
        x = (((e >> 8) & 4095) + 1) * (x >> 12) + (e >> 20)
        if x < RANS_L:
            x = (x << 16) | np.int64(load_u16(blob, p))
            p += 2
        xs[k] = np.uint32(x)
    return p


def rans_vstep(builder, e, x, q, bp, pp, permd, ctpop, expand=None):
    """LLVM IR of one decoder step of N rANS states x (<N x i32>) whose table entries are e: the states' next
    values, those below 2^16 refilled in lane order from the 16-bit words at bp + q (i8*, q an i64), and the next
    word's position.  N = 8: the words moved to their lanes by vpermd with pp[mask] (PERM as <8 x i32> vectors),
    or by ``expand`` where it is given (llvm.masked.expandload.v8i16: vpexpandw, AVX-512); N = 16: by ``expand``
    (llvm.masked.expandload.v16i16).  ctpop: llvm.ctpop.i32."""
    from llvmlite import ir
    N, I16, I32, I64 = x.type.count, ir.IntType(16), ir.IntType(32), ir.IntType(64)
    VN, VW = ir.VectorType(I32, N), ir.VectorType(I16, N)

    def splat(v):
        return ir.Constant(VN, [v] * N)

    f = builder.add(builder.and_(builder.lshr(e, splat(8)), splat(4095)), splat(1))
    x = builder.add(builder.mul(f, builder.lshr(x, splat(12))), builder.lshr(e, splat(20)))
    m = builder.icmp_unsigned("<", x, splat(RANS_L))
    bits = builder.zext(builder.bitcast(m, ir.IntType(N)), I32)
    if expand is None:
        wv = builder.load(builder.bitcast(builder.gep(bp, [q]), ir.PointerType(VW)), align=1)
        pv = builder.load(builder.gep(pp, [builder.zext(bits, I64)]), align=4)
        w = builder.call(permd, [builder.zext(wv, VN), pv])
    else:
        w = builder.zext(builder.call(expand, [builder.bitcast(builder.gep(bp, [q]), ir.PointerType(I16)), m,
                                               ir.Constant(VW, [0] * N)]), VN)
    step = builder.shl(builder.zext(builder.call(ctpop, [bits]), I64), ir.Constant(I64, 1))
    return builder.select(m, builder.or_(builder.shl(x, splat(16)), w), x), builder.add(q, step)


def _make_rounds32(with_cb):
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    V = _Vec(32)
    I8, I16, I32, I64, V8, splat, fn = V.I8, V.I16, V.I32, V.I64, V.VN, V.splat, V.fn

    @intrinsic
    def _rounds(typingctx, blob, p, dtab, cb, out, xs, perm, i0, rounds):
        sig = types.int64(blob, p, dtab, cb, out, xs, perm, i0, rounds)

        def codegen(context, builder, signature, args):
            def data(k, t):
                ary = context.make_array(signature.args[k])(context, builder, args[k])
                return builder.bitcast(ary.data, t)

            bp = data(0, ir.PointerType(I8))
            dp = data(2, ir.PointerType(I8))
            cbp = data(3, ir.PointerType(I16))
            op = data(4, ir.PointerType(I8))
            xp = data(5, ir.PointerType(V8))
            pp = data(6, ir.PointerType(V8))
            gather = fn(builder, "llvm.x86.avx2.gather.d.d.256", V8, [V8, ir.PointerType(I8), V8, V8, I8])
            permd = fn(builder, "llvm.x86.avx2.permd", V8, [V8, V8])
            ctpop = fn(builder, "llvm.ctpop.i32", I32, [I32])
            # with AVX-512 (VL, VBMI2) the words go to their lanes by vpexpandw from memory: no table load on the
            # states' chain (0.47 -> 0.42 ns an element on a second moment's exponent residuals)
            W8 = ir.VectorType(I16, 8)
            expand = (fn(builder, "llvm.masked.expandload.v8i16", W8, [ir.PointerType(I16), ir.VectorType(V.I1, 8), W8])
                      if SIMD512 else None)
            vx = V.states(builder, xp, 4)
            pos = cgutils.alloca_once_value(builder, args[1])
            with cgutils.for_range(builder, args[8]) as loop:
                g = builder.add(args[7], builder.mul(loop.index, ir.Constant(I64, LANES)))
                for h in range(4):
                    i = builder.add(g, ir.Constant(I64, 8 * h))
                    x = builder.load(vx[h])
                    idx = builder.and_(x, splat(4095))
                    if with_cb:
                        cbv = builder.load(builder.bitcast(builder.gep(cbp, [i]),
                                                           ir.PointerType(ir.VectorType(I16, 8))), align=2)
                        idx = builder.add(idx, builder.zext(cbv, V8))
                    e = builder.call(gather, [splat(0), dp, idx, splat(-1), ir.Constant(I8, 4)])
                    builder.store(builder.trunc(e, ir.VectorType(I8, 8)),
                                  builder.bitcast(builder.gep(op, [i]), ir.PointerType(ir.VectorType(I8, 8))),
                                  align=1)
                    x, q = rans_vstep(builder, e, x, builder.load(pos), bp, pp, permd, ctpop, expand)
                    builder.store(x, vx[h])
                    builder.store(q, pos)
            V.put_states(builder, vx, xp)
            return builder.load(pos)
        return sig, codegen
    return _rounds


class _Vec:
    """LLVM IR pieces shared by the vector kernels below (llvmlite is imported where they are built): N = 8 lanes
    of 32 bits (AVX2), or 16 (AVX-512: what ``kernels.tfuse`` and ``kernels.wenc`` use); ``VN`` is the
    ``<N x i32>`` vector."""

    def __init__(self, W=32, lanes=8):
        from llvmlite import ir
        from numba.core import cgutils
        self.ir, self.cg = ir, cgutils
        self.I1, self.I8, self.I16, self.I32, self.I64 = (ir.IntType(w) for w in (1, 8, 16, 32, 64))
        self.N = lanes
        self.VN = ir.VectorType(self.I32, lanes)
        self.U = ir.IntType(W)            # the unit
        self.VU = ir.VectorType(self.U, lanes)
        self.W = W

    def splat(self, v):
        return self.ir.Constant(self.VN, [v & 0xFFFFFFFF] * self.N)

    def states(self, builder, xp, count):
        """A loop's rANS states: the count vectors at xp (a pointer to vectors), each in a stack slot that LLVM
        keeps in a register."""
        ir = self.ir
        return [self.cg.alloca_once_value(builder, builder.load(builder.gep(xp, [ir.Constant(self.I32, h)]),
                                                                align=4)) for h in range(count)]

    def put_states(self, builder, vx, xp):
        """The states back to xp after the loop."""
        for h, v in enumerate(vx):
            builder.store(builder.load(v), builder.gep(xp, [self.ir.Constant(self.I32, h)]), align=4)

    def vsplat(self, builder, v):
        """An i64 argument truncated to 32 bits in every lane."""
        ir = self.ir
        u = builder.insert_element(ir.Constant(self.VN, ir.Undefined), builder.trunc(v, self.I32),
                                   ir.Constant(self.I32, 0))
        return builder.shuffle_vector(u, u, ir.Constant(self.VN, [0] * self.N))

    def data(self, context, builder, signature, args, k, t):
        """Argument k's (an array's) data as a pointer to t."""
        ary = context.make_array(signature.args[k])(context, builder, args[k])
        return builder.bitcast(ary.data, self.ir.PointerType(t))

    def fn(self, builder, name, ret, argtys):
        return self.cg.get_or_insert_function(builder.module, self.ir.FunctionType(ret, argtys), name)

    def units(self, builder, ptr, j):
        """N units at vector j of ptr, zero-extended to 32 bits."""
        v = builder.load(builder.gep(ptr, [j]), align=1)
        return builder.zext(v, self.VN) if self.W == 16 else v

    def context(self, builder, rv, vmb, vem, vE):
        """The temporal context of each reference unit: clamp(E - e, 0, 14), 15 where e is all ones."""
        e = builder.and_(builder.lshr(rv, vmb), vem)
        c = builder.sub(vE, e)
        c = builder.select(builder.icmp_signed("<", c, self.splat(0)), self.splat(0), c)
        c = builder.select(builder.icmp_signed(">", c, self.splat(14)), self.splat(14), c)
        return builder.select(builder.icmp_unsigned("==", e, vem), self.splat(15), c)

    def mono(self, builder, v, inverse=False):
        """The monotone map (base._mono): every bit flipped where v's sign bit is set, else the sign bit; its
        inverse (base._unmono): the sign bit flipped where it is set, else every bit."""
        sb, mask = self.splat(1 << (self.W - 1)), self.splat((1 << self.W) - 1)
        set_ = builder.icmp_unsigned("!=", builder.and_(v, sb), self.splat(0))
        return builder.xor(v, builder.select(set_, sb, mask) if inverse else builder.select(set_, mask, sb))

    def bit_length(self, builder, a, nz):
        """The bit length of each lane of a (unsigned, at most 2^(W - 1); nz: 1 where a != 0, else 0, and the
        length 0 there), from the exponent of its float32 conversion: AVX2 has no vector count of leading zeros
        (LLVM's emulation takes about a dozen instructions).  A float32 holds 24 bits exactly: W = 32 converts a's
        top 24 bits where a has more, and adds 8."""
        ir, splat = self.ir, self.splat
        t, big = a, None
        if self.W > 24:
            h = builder.lshr(a, splat(8))
            big = builder.icmp_unsigned("!=", h, splat(0))
            t = builder.select(big, h, a)
        e = builder.lshr(builder.bitcast(builder.sitofp(t, ir.VectorType(ir.FloatType(), self.N)), self.VN), splat(23))
        k = builder.sub(e, splat(126))
        if big is not None:
            k = builder.add(k, builder.select(big, splat(8), splat(0)))
        return builder.and_(k, builder.sub(splat(0), nz))

    def raw_diffs(self, builder, sv, t0, rawp, permd, psllv):
        """One vector of the temporal decoder's raw-bit reading (``temporal._trecon``'s rule): the signed
        differences d of eight elements whose symbols are sv, their raw bits from bit t0 (i64) of rawp (i8*);
        returns (d, the bits read, i64).  Element i's bits start where those of the elements before it end: a
        prefix sum of the bit counts (three shifts and adds); the eight elements' bits (<= 8 (W - 1), from bit
        t0 & 7 of byte t0 >> 3) lie in the 32 bytes there (W = 16; W = 32: the 36), loaded once, each lane's two
        32-bit words at its bit position moved to it by vpermd (a gather costs several times as much on some
        CPUs) and joined by shifts (psllv gives 0 for a shift of 32).  With 16 lanes (permd, psllv: the AVX-512
        forms) the sixteen elements' bits (<= 7 + 16 (W - 1)) lie in the 64 bytes there, for either W."""
        ir, splat, I64, V8, W, N = self.ir, self.splat, self.I64, self.VN, self.W, self.N
        zero = splat(0)
        k = builder.lshr(builder.add(sv, splat(1)), splat(1))
        k = builder.select(builder.icmp_unsigned(">", k, splat(W)), splat(W), k)
        nz = builder.zext(builder.icmp_unsigned("!=", k, zero), V8)
        kb = builder.sub(k, nz)
        even = builder.icmp_unsigned("==", builder.and_(sv, splat(1)), zero)
        neg = builder.zext(builder.and_(builder.icmp_unsigned("!=", sv, zero), even), V8)
        inc = kb
        for sh in (1, 2, 4, 8)[:N.bit_length() - 1]:   # inclusive prefix sum of the bit counts across the lanes
            mv = builder.shuffle_vector(zero, inc, ir.Constant(V8, [N + j - sh if j >= sh else 0 for j in range(N)]))
            inc = builder.add(inc, mv)
        start = builder.gep(rawp, [builder.lshr(t0, ir.Constant(I64, 3))])
        win = builder.load(builder.bitcast(start, ir.PointerType(V8)), align=1)
        rel = builder.add(self.vsplat(builder, builder.and_(t0, ir.Constant(I64, 7))), builder.sub(inc, kb))
        dw = builder.lshr(rel, splat(5))
        shv = builder.and_(rel, splat(31))
        if W == 16 or N == 16:   # (word dw + 1 <= 4; 16 lanes: <= 15)
            hi = builder.call(permd, [win, builder.add(dw, splat(1))])
        else:         # (word dw + 1 <= 8: from the 32 bytes 4 further on)
            win4 = builder.load(builder.bitcast(builder.gep(start, [ir.Constant(I64, 4)]), ir.PointerType(V8)),
                                align=1)
            hi = builder.call(permd, [win4, dw])
        v = builder.or_(builder.lshr(builder.call(permd, [win, dw]), shv),
                        builder.call(psllv, [hi, builder.sub(splat(32), shv)]))
        a = builder.or_(builder.and_(v, builder.sub(builder.shl(splat(1), kb), splat(1))), builder.shl(nz, kb))
        d = builder.add(builder.xor(a, builder.sub(zero, neg)), neg)
        return d, builder.zext(builder.extract_element(inc, ir.Constant(self.I32, N - 1)), I64)

    def hsum(self, builder, v, op):
        """The N lanes of v combined by builder.op (add, or_), as i64."""
        t = builder.extract_element(v, self.ir.Constant(self.I32, 0))
        for h in range(1, self.N):
            t = getattr(builder, op)(t, builder.extract_element(v, self.ir.Constant(self.I32, h)))
        return builder.zext(t, self.I64)


def _make_trecon8(W):
    """The temporal decoder's raw-bit pass (``temporal._trecon``'s fast loop) for W-bit units, eight per vector:
    ``(blob, q, bit, o, syms, i0, nvec) -> bits read``: each vector's differences d by ``_Vec.raw_diffs``, and
    o[i] (mono(r[i])) becomes unmono(o[i] + d), the unit.  From byte q, bit `bit` (< 8), symbols i0 ..
    i0 + 8 nvec.  The caller guarantees that every byte read lies
    inside the raw stream (q + nvec * (W - 1) + 32 <= its end); nothing here checks bounds."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(W)
    ir, I64, V8, splat = V.ir, V.I64, V.VN, V.splat

    @intrinsic
    def _trecon8(typingctx, blob, q, bit, o, syms, i0, nvec):
        sig = types.int64(blob, q, bit, o, syms, i0, nvec)

        def codegen(context, builder, signature, args):
            bp = builder.gep(V.data(context, builder, signature, args, 0, V.I8), [args[1]])
            op = V.data(context, builder, signature, args, 3, V.U)
            sp = V.data(context, builder, signature, args, 4, V.I8)
            psllv = V.fn(builder, "llvm.x86.avx2.psllv.d.256", V8, [V8, V8])
            permd = V.fn(builder, "llvm.x86.avx2.permd", V8, [V8, V8])
            mask = splat((1 << W) - 1)
            tot = V.cg.alloca_once_value(builder, args[2])
            with V.cg.for_range(builder, args[6]) as loop:
                i = builder.add(args[5], builder.mul(loop.index, ir.Constant(I64, 8)))
                sv = builder.zext(builder.load(builder.bitcast(builder.gep(sp, [i]),
                                                               ir.PointerType(ir.VectorType(V.I8, 8))), align=1), V8)
                t0 = builder.load(tot)
                d, nbits = V.raw_diffs(builder, sv, t0, bp, permd, psllv)
                ov = builder.bitcast(builder.gep(op, [i]), ir.PointerType(V.VU))
                m = builder.load(ov, align=1)
                if W == 16:
                    m = builder.zext(m, V8)
                # o holds mono(r); the unit is unmono(mono(r) + d)
                y = V.mono(builder, builder.and_(builder.add(m, d), mask), inverse=True)
                builder.store(builder.trunc(y, V.VU) if W == 16 else y, ov, align=1)
                builder.store(builder.add(t0, nbits), tot)
            return builder.sub(builder.load(tot), args[2])
        return sig, codegen
    return _trecon8


def _make_tmask8(W):
    """The temporal decoder's context pass (``temporal._tmask``) for W-bit units, eight per vector:
    ``(r, n8, mb, em, E, cb, o) -> the set of contexts`` over the first n8 (a multiple of 8) units: cb[i] = the
    context of r[i] << 12, o[i] = mono(r[i])."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(W)
    ir, splat = V.ir, V.splat

    @intrinsic
    def _tmask8(typingctx, r, n8, mb, em, E, cb, o):
        sig = types.int64(r, n8, mb, em, E, cb, o)

        def codegen(context, builder, signature, args):
            rp = V.data(context, builder, signature, args, 0, V.VU)
            cp = V.data(context, builder, signature, args, 5, ir.VectorType(V.I16, 8))
            op = V.data(context, builder, signature, args, 6, V.VU)
            vmb, vem, vE = (V.vsplat(builder, args[k]) for k in (2, 3, 4))
            used = V.cg.alloca_once_value(builder, splat(0))
            with V.cg.for_range(builder, builder.udiv(args[1], ir.Constant(V.I64, 8))) as loop:
                j = loop.index
                rv = V.units(builder, rp, j)
                c = V.context(builder, rv, vmb, vem, vE)
                builder.store(builder.or_(builder.load(used), builder.shl(splat(1), c)), used)
                builder.store(builder.trunc(builder.shl(c, splat(12)), ir.VectorType(V.I16, 8)),
                              builder.gep(cp, [j]), align=1)
                m = V.mono(builder, rv)
                builder.store(builder.trunc(m, V.VU) if W == 16 else m, builder.gep(op, [j]), align=1)
            return V.hsum(builder, builder.load(used), "or_")
        return sig, codegen
    return _tmask8


def _permr_table():
    """PERMR[m * 8 + j]: for an 8-bit mask m of the lanes that emit a word, the lane whose word goes to position j
    of eight, the emitted words at the top positions (8 - popcount(m) .. 7) in lane order; 0 below them."""
    t = np.zeros(256 * 8, np.int32)
    for m in range(256):
        sel = [j for j in range(8) if m >> j & 1]
        for q, j in enumerate(sel):
            t[m * 8 + 8 - len(sel) + q] = j
    return t


PERMR = _permr_table()


def _make_enc32():
    """The 32-state rANS encoder's full rounds (``rans._tenc``), four 8-lane vectors a round, from the last round
    down: ``(jb, nr, et32, buf, p, xs, permr) -> p``.  et32[j] = f | cum << 13 of joint symbol j; xs (uint32[32])
    the states, updated.  A lane renormalises where x > (f << 20) - 1: its low 16 bits go to the word stream
    below p, the emitting lanes of a vector in lane order (``vpermd`` by PERMR moves them to the top of eight
    words stored at p - 16), as the scalar loop, which takes the lanes from the highest down, writes them; then
    x = (x div f) * 4096 + x mod f + cum, the quotient from a float32 division corrected by one step either way
    from the remainder (exact: see the comment in the loop).
    The buffer needs 16 bytes below the final p (the stored words below it are overwritten or lie outside the
    stream); nothing here checks bounds."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec()
    ir, cgutils, splat = V.ir, V.cg, V.splat
    I8, I16, I32, I64, V8 = V.I8, V.I16, V.I32, V.I64, V.VN
    F8 = ir.VectorType(ir.FloatType(), 8)

    @intrinsic
    def _enc32(typingctx, jb, nr, et32, buf, p, xs, permr):
        sig = types.int64(jb, nr, et32, buf, p, xs, permr)

        def codegen(context, builder, signature, args):
            jp, ep, bp, xp, pp = (V.data(context, builder, signature, args, k, t)
                                  for k, t in ((0, I16), (2, I8), (3, I8), (5, V8), (6, V8)))
            gather = V.fn(builder, "llvm.x86.avx2.gather.d.d.256", V8, [V8, ir.PointerType(I8), V8, V8, I8])
            permd = V.fn(builder, "llvm.x86.avx2.permd", V8, [V8, V8])
            ctpop = V.fn(builder, "llvm.ctpop.i32", I32, [I32])
            vx = V.states(builder, xp, 4)
            pos = cgutils.alloca_once_value(builder, args[4])
            with cgutils.for_range(builder, args[1]) as loop:
                g = builder.mul(builder.sub(builder.sub(args[1], ir.Constant(I64, 1)), loop.index),
                                ir.Constant(I64, 32))
                for h in (3, 2, 1, 0):
                    i = builder.add(g, ir.Constant(I64, 8 * h))
                    jv = builder.zext(builder.load(builder.bitcast(builder.gep(jp, [i]),
                                                                   ir.PointerType(ir.VectorType(I16, 8))),
                                                   align=1), V8)
                    e = builder.call(gather, [splat(0), ep, jv, splat(-1), ir.Constant(I8, 4)])
                    f = builder.and_(e, splat(0x1FFF))
                    cum = builder.lshr(e, splat(13))
                    x = builder.load(vx[h])
                    m = builder.icmp_unsigned(">", x, builder.sub(builder.shl(f, splat(20)), splat(1)))
                    bits = builder.zext(builder.bitcast(m, I8), I32)
                    q = builder.load(pos)
                    pv = builder.load(builder.gep(pp, [builder.zext(bits, I64)]), align=4)
                    w = builder.call(permd, [builder.and_(x, splat(0xFFFF)), pv])
                    dst = builder.bitcast(builder.gep(bp, [builder.sub(q, ir.Constant(I64, 16))]),
                                          ir.PointerType(ir.VectorType(I16, 8)))
                    builder.store(builder.trunc(w, ir.VectorType(I16, 8)), dst, align=1)
                    step = builder.shl(builder.zext(builder.call(ctpop, [bits]), I64), ir.Constant(I64, 1))
                    builder.store(builder.sub(q, step), pos)
                    x = builder.select(m, builder.lshr(x, splat(16)), x)
                    # q = x div f by one float32 division of the eight lanes and a correction: x < f * 2^20 after
                    # the renormalisation, so q < 2^20 and the float quotient (two roundings of 2^-24 each) is
                    # within 1/8 of x / f; its integer part q0 is q - 1, q or q + 1, told apart by the remainder
                    # x - q0 * f (in [-f, 2f): exact in 32-bit wrapping arithmetic)
                    q0 = builder.fptosi(builder.fdiv(builder.uitofp(x, F8), builder.sitofp(f, F8)), V8)
                    rem = builder.sub(x, builder.mul(q0, f))
                    qv = builder.add(builder.sub(q0, builder.zext(builder.icmp_signed("<", rem, splat(0)), V8)),
                                     builder.zext(builder.icmp_signed(">=", rem, f), V8))
                    x = builder.add(builder.add(x, cum), builder.mul(qv, builder.sub(splat(4096), f)))
                    builder.store(x, vx[h])
            V.put_states(builder, vx, xp)
            return builder.load(pos)
        return sig, codegen
    return _enc32


@njit(nogil=True, cache=True)
def states32(xl):
    """rans._tenc's 32 states (uint64) as the vector encoders' uint32 array."""
    x32 = np.empty(LANES, np.uint32)
    for k in range(LANES):
        x32[k] = np.uint32(xl[k])
    return x32


@njit(nogil=True, cache=True)
def states_back(x32, xl):
    """The vector encoders' states back into rans._tenc's."""
    for k in range(LANES):
        xl[k] = np.uint64(x32[k])


@njit(nogil=True, cache=True)
def enc_table(et):
    """rans._tenc's packed table et (two u64 an entry) as one u32 an entry, f | cum << 13 (rans._enc_entry's
    bias is cum, or cum + 4095 where f = 1)."""
    et32 = np.empty(et.size // 2, np.uint32)
    for j in range(et.size // 2):
        info = et[2 * j + 1]
        fs = np.int64(info >> np.uint64(32))
        cum = np.int64(info & np.uint64(8191)) - 4095 * np.int64(fs == 1)
        et32[j] = np.uint32(fs | (max(cum, 0) << 13))
    return et32


if SIMD:
    _rounds_cb = _make_rounds32(True)
    _rounds_o0 = _make_rounds32(False)
    _PERM = PERM

    @njit(nogil=True, cache=True)
    def rounds32(blob, p, dtab, cb, out, xs, i0, rounds):
        if rounds <= 0:
            return p
        if cb.size > 0:
            return _rounds_cb(blob, np.int64(p), dtab, cb, out, xs, _PERM, np.int64(i0), np.int64(rounds))
        return _rounds_o0(blob, np.int64(p), dtab, cb, out, xs, _PERM, np.int64(i0), np.int64(rounds))

    _trecon8_16 = _make_trecon8(16)
    _trecon8_32 = _make_trecon8(32)

    @njit(nogil=True, cache=True)
    def trecon8(blob, q, bit, o, syms, i0, nvec, W):
        """The raw-bit pass over symbols i0 .. i0 + 8 nvec as vectors (see _make_trecon8); returns the bits read."""
        if W == 16:
            return _trecon8_16(blob, np.int64(q), np.int64(bit), o, syms, np.int64(i0), np.int64(nvec))
        return _trecon8_32(blob, np.int64(q), np.int64(bit), o, syms, np.int64(i0), np.int64(nvec))

    _enc32 = _make_enc32()
    _PERMR = PERMR

    @njit(nogil=True, cache=True)
    def _enc32_u16(j16, nr, et, buf, p, xl):
        x32 = states32(xl)
        p = _enc32(j16, np.int64(nr), enc_table(et), buf, np.int64(p), x32, _PERMR)
        states_back(x32, xl)
        return p

    @njit(nogil=True, cache=True)
    def enc32(jb, lo, et, buf, p, xl):
        """The 32-state encoder's full rounds below symbol lo (a multiple of 32) as vectors (see _make_enc32),
        from rans._tenc's table et and states xl (uint64[32], updated); returns the new p."""
        if lo <= 0:
            return p
        if jb.itemsize == 2:
            return _enc32_u16(jb.view(np.uint16), lo // LANES, et, buf, p, xl)
        # (rans_encode's byte symbols or (context, symbol) pairs: below 2^16)
        return _enc32_u16(jb[:lo].astype(np.uint16), lo // LANES, et, buf, p, xl)

    _tmask8_16 = _make_tmask8(16)
    _tmask8_32 = _make_tmask8(32)

    @njit(nogil=True, cache=True)
    def tmask8(r, n, mb, em, E, cb, o, W):
        """The context pass over the first n & ~7 units as vectors; returns (the set of contexts, units done)."""
        n8 = n & ~7
        if n8 == 0:
            return np.int64(0), np.int64(0)
        if W == 16:
            return _tmask8_16(r, np.int64(n8), np.int64(mb), np.int64(em), np.int64(E), cb, o), np.int64(n8)
        return _tmask8_32(r, np.int64(n8), np.int64(mb), np.int64(em), np.int64(E), cb, o), np.int64(n8)

else:
    rounds32 = scalar_rounds

    @njit(nogil=True, cache=True)
    def trecon8(blob, q, bit, o, syms, i0, nvec, W):   # (never called: SIMD is False)
        return np.int64(0)

    @njit(nogil=True, cache=True)
    def tmask8(r, n, mb, em, E, cb, o, W):
        return np.int64(0), np.int64(0)

    @njit(nogil=True, cache=True)
    def enc32(jb, lo, et, buf, p, xl):   # (never called: SIMD is False)
        return p
