"""lmc kernels: the Huffman decoder's multi-symbol table built as vectors (``multi8``), where ``simd.SIMD``.

``huffman.build_multi_table`` makes, for each of the 2048 values of 11 peeked bits, the entry of the up to four
symbols whose codes fit in them: a loop per entry that looks up a symbol, shifts its code out and looks up the
next, stopping at the first that does not fit.  Every chunk's Huffman stream builds its own table, and the build
cost about 4.3 us a chunk (Zen 5), 7% of decoding a 131072-element bf16 chunk.  Here eight entries are one
``<8 x i32>`` vector (sixteen, ``<16 x i32>``, where the CPU has AVX-512: ``simd.SIMD512``): the first symbols
are one load of the single-symbol table, the next three are gathers (``vpgatherdd`` from the 16-bit entries,
scale 2) with the stop kept as a lane mask, so each entry is the scalar loop's bit for bit
(``tests/test_multi_table.py`` compares them on random codes).  16 lanes: 2.4 us a table; 8: 2.8.

``multi8(dec, dec3) -> bool``: dec (uint16[>= 2048]) a complete single-symbol table (``build_decode_table``: every
entry's length is 1..11), dec3 (uint64[>= 2048]) its output.  The gathers read dec[idx >> L] with L >= 1, so
below entry 1024 (as 32-bit words: entries 0..1024).  Nothing here checks bounds.  Returns False, doing nothing,
where SIMD is False: the caller then takes the scalar loop."""
import numpy as np
from numba import njit

from .base import MAXLEN, TABSIZE
from .simd import SIMD, SIMD512, _Vec


def _make_multi8(N=8):
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(32, N)
    ir, cgutils, splat = V.ir, V.cg, V.splat
    I1, I8, I16, I32, I64, V8 = V.I1, V.I8, V.I16, V.I32, V.I64, V.VN
    V64 = ir.VectorType(I64, N)

    @intrinsic
    def _multi8(typingctx, dec, dec3):
        sig = types.void(dec, dec3)

        def codegen(context, builder, signature, args):
            dp = V.data(context, builder, signature, args, 0, ir.VectorType(I16, N))
            db = V.data(context, builder, signature, args, 0, I8)
            op = V.data(context, builder, signature, args, 1, V64)
            if N == 8:
                gth = V.fn(builder, "llvm.x86.avx2.gather.d.d.256", V8, [V8, ir.PointerType(I8), V8, V8, I8])

                def gather(idx):
                    return builder.call(gth, [splat(0), db, idx, splat(-1), ir.Constant(I8, 2)])
            else:
                VM = ir.VectorType(I1, N)
                gth = V.fn(builder, "llvm.x86.avx512.mask.gather.dpi.512", V8, [V8, ir.PointerType(I8), V8, VM, I32])

                def gather(idx):
                    return builder.call(gth, [splat(0), db, idx, ir.Constant(VM, [1] * N), ir.Constant(I32, 2)])
            lane = ir.Constant(V8, list(range(N)))
            with cgutils.for_range(builder, ir.Constant(I64, TABSIZE // N)) as loop:
                j = loop.index
                e = builder.zext(builder.load(builder.gep(dp, [j]), align=2), V8)
                idx = builder.add(V.vsplat(builder, builder.mul(j, ir.Constant(I64, N))), lane)
                tot = builder.lshr(e, splat(8))
                syms = builder.and_(e, splat(255))
                cnt = splat(1)
                ok = splat(-1)
                rest = builder.lshr(idx, tot)
                for c in (1, 2, 3):
                    e2 = builder.and_(gather(rest), splat(0xFFFF))
                    l2 = builder.lshr(e2, splat(8))
                    fits = builder.icmp_unsigned("<=", builder.add(tot, l2), splat(MAXLEN))
                    ok = builder.and_(ok, builder.sext(fits, V8))   # (all ones while every code so far fits)
                    syms = builder.or_(syms, builder.shl(builder.and_(builder.and_(e2, splat(255)), ok),
                                                         splat(8 * c)))
                    tot = builder.add(tot, builder.and_(l2, ok))
                    cnt = builder.sub(cnt, ok)
                    rest = builder.lshr(rest, l2)
                v = builder.or_(builder.zext(tot, V64),
                                builder.or_(builder.shl(builder.zext(syms, V64), ir.Constant(V64, [8] * N)),
                                            builder.shl(builder.zext(cnt, V64), ir.Constant(V64, [40] * N))))
                builder.store(v, builder.gep(op, [j]), align=8)
            return context.get_dummy_value()
        return sig, codegen
    return _multi8


if SIMD:
    _multi8 = _make_multi8(16 if SIMD512 else 8)

    @njit(nogil=True, cache=True)
    def multi8(dec, dec3):
        _multi8(dec, dec3)
        return True
else:
    @njit(nogil=True, cache=True)
    def multi8(dec, dec3):
        return False
