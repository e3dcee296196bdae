"""Vector code for the 32-state rANS decoder (format 7): full rounds of 32 symbols stepped as four AVX2 vectors.

Format 7 codes a rANS stream of at least ``LANES_MIN`` symbols with 32 interleaved states that share one stream
of 16-bit words, symbol ``i`` with state ``i mod 32`` (FORMAT.md, "rANS"): the same rule as format 2's 4 states,
so the scalar decoder (``rans.py``) is the plain loop over the symbols.  A round of 32 symbols has no dependency
between its states except the word pointer, so eight states are one ``<8 x i32>`` vector:

- the decode-table entries of the eight states are one hardware gather (``vpgatherdd``);
- the states that fall below 2^16 take the next words of the stream in lane order: the eight words at the
  pointer are loaded at once and moved to their lanes by ``vpermd`` with a permutation looked up from the
  comparison's 8-bit mask (``PERM``), and the pointer advances by twice the mask's popcount.

This is the standard way to vectorise interleaved rANS with a shared stream; it gives byte for byte the symbols of
the scalar loop.  ``rounds32(blob, p, dtab, cb, out, xs, i0, rounds)`` runs ``rounds`` full rounds from symbol
``i0``; ``xs`` (uint32[32]) holds the states and is updated; ``cb`` (uint16) holds each symbol's decode-table base
(the context's table) or is an empty array for one table.  It returns the next word's position.  The caller
guarantees ``p + 64 * rounds + 16 <= blob.size`` (a round reads at most 32 words, and each vector reads 16 bytes
at the pointer) and that every ``cb[i] + 4095`` lies inside ``dtab``; nothing here checks bounds.

``SIMD`` is True where the host CPU has AVX2, the kernels are compiled (not ``NUMBA_DISABLE_JIT``), the checked
build is off (its bounds checks are the scalar loop's) and ``LMC_SIMD`` is not ``0``.  Elsewhere ``rounds32`` is
the scalar loop itself (same results), so every caller compiles on any CPU; with ``LMC_SIMD=0`` the kernels are
compiled and cached apart from the vector build (Numba's cache does not record a global's value)."""
import os

import numba
import numpy as np
from numba import njit

from .intrinsics import CHECKED, ld, load_u16

LANES = 32
RANS_L = 1 << 16


def _host_avx2():
    try:
        import llvmlite.binding as ll
        return bool(ll.get_host_cpu_features().get("avx2"))
    except Exception:  # pragma: no cover - an llvmlite without the query
        return False


FORCED_OFF = os.environ.get("LMC_SIMD", "") == "0"
SIMD = (not numba.config.DISABLE_JIT) and not CHECKED and not FORCED_OFF and _host_avx2()
if FORCED_OFF and not CHECKED and not numba.config.DISABLE_JIT:
    _base = numba.config.CACHE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    numba.config.CACHE_DIR = os.path.join(_base, "scalar")


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


def _make_rounds32(with_cb):
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    V8 = ir.VectorType(I32, 8)

    def splat(v):
        return ir.Constant(V8, [v] * 8)

    def fn(builder, name, ret, args):
        return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)

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
            vx = [cgutils.alloca_once_value(builder, builder.load(builder.gep(xp, [ir.Constant(I32, h)]), align=4))
                  for h in range(4)]
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
                    f = builder.add(builder.and_(builder.lshr(e, splat(8)), splat(4095)), splat(1))
                    x = builder.add(builder.mul(f, builder.lshr(x, splat(12))), builder.lshr(e, splat(20)))
                    m = builder.icmp_unsigned("<", x, splat(RANS_L))
                    bits = builder.zext(builder.bitcast(m, I8), I32)
                    q = builder.load(pos)
                    wv = builder.load(builder.bitcast(builder.gep(bp, [q]), ir.PointerType(ir.VectorType(I16, 8))),
                                      align=1)
                    pv = builder.load(builder.gep(pp, [builder.zext(bits, I64)]), align=4)
                    w = builder.call(permd, [builder.zext(wv, V8), pv])
                    builder.store(builder.select(m, builder.or_(builder.shl(x, splat(16)), w), x), vx[h])
                    step = builder.shl(builder.zext(builder.call(ctpop, [bits]), I64), ir.Constant(I64, 1))
                    builder.store(builder.add(q, step), pos)
            for h in range(4):
                builder.store(builder.load(vx[h]), builder.gep(xp, [ir.Constant(I32, h)]), align=4)
            return builder.load(pos)
        return sig, codegen
    return _rounds


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
else:
    rounds32 = scalar_rounds
