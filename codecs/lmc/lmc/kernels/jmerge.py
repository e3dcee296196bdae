"""lmc kernels: the joint-symbol mode's last decoder pass as AVX2 vector code (``merge_blocks``): for each whole
block of 128 elements, its raw fields unpacked from the blob, its symbols taken from the Huffman decoder's four
sub-stream buffers, and the units written, in registers, one pass (FORMAT.md, "Joint-symbol chunk").

The scalar decoder makes three passes over a chunk after the Huffman decode: the sub-streams interleaved into a
symbol plane (0.04 ns an element), the fields unpacked into a plane (0.09) and the two merged into units (0.07),
each writing a plane the next one reads back. Numba does not vectorise the three as one loop (a `/tmp` try ran
1.3x slower than the three). Here one 16-element vector of a block is, for m = 0..7 (elements o + 16 m + j):

- its fields: byte 16 (m mod 4) + j of the block's 4-bit plane (its low nibble for m < 4, its high one after),
  with the 2-bit and 1-bit planes' bits where the fields have them, as ``kernels.joint._unpack_loop`` computes
  them;
- its symbols: element e's symbol is number e >> 2 of sub-stream e & 3, so the 16 are four bytes of each
  sub-stream buffer, interleaved by one shuffle;
- its units: ``sign << 15 | ((b << 7) + (t << (7 - k))) & 0x7FFF | low bits``, sixteen 16-bit lanes.

The same units as the three passes (``tests/test_joint.py`` compares them on every k and on hand-made symbols
and fields). Where ``simd.SIMD`` is false, ``merge_blocks`` is never called. The caller guarantees that the
blocks' fields lie inside the blob, that each sub-stream buffer holds the symbols of the blocks and that dst
holds their units; nothing here checks bounds."""

import numpy as np
from numba import njit

from .base import _C3
from .simd import SIMD


def _i64(v):
    """v modulo 2^64 as a signed 64-bit value (an LLVM i64 constant)."""
    v %= 1 << 64
    return v - (1 << 64) if v >> 63 else v


def _make_blocks(w):
    """``(blob, q, tmp, r, nblk, bb, dst, acc) -> 0``: nblk whole blocks of fields w = 8 - k bits wide at
    blob[q:], their symbols in tmp (sub-stream s at tmp[s * r:]), their units to dst (uint16); bb = b << 7. acc
    (uint64[2]) gets the format-8 checksum's two word sums of the units added (``base._csum_words``: s1 the words,
    s2 the product of the halves of each word XOR its index times C3), the units' words numbered from 0."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    k = 8 - w
    sh = 7 - k
    C3 = int(_C3)
    top = 4 if w == 5 else 6
    I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    B16, H16, B4 = ir.VectorType(I8, 16), ir.VectorType(I16, 16), ir.VectorType(I8, 4)

    def bsplat(v):
        return ir.Constant(B16, [v] * 16)

    def hsplat(v):
        return ir.Constant(H16, [v] * 16)

    @intrinsic
    def _blocks(typingctx, blob, q, tmp, r, nblk, bb, dst, acc):
        sig = types.int64(blob, q, tmp, r, nblk, bb, dst, acc)

        def codegen(context, builder, signature, args):
            def data(j, t):
                ary = context.make_array(signature.args[j])(context, builder, args[j])
                return builder.bitcast(ary.data, ir.PointerType(t))

            bp, tp, dp = data(0, I8), data(2, I8), data(6, I16)
            q, r, nblk = args[1], args[3], args[4]
            b16 = builder.trunc(args[5], I16)
            bbv = builder.shuffle_vector(builder.insert_element(ir.Constant(H16, ir.Undefined), b16,
                                                                ir.Constant(I32, 0)),
                                         ir.Constant(H16, ir.Undefined), ir.Constant(ir.VectorType(I32, 16), [0] * 16))

            def vload(ptr, off, t):
                return builder.load(builder.bitcast(builder.gep(ptr, [off]), ir.PointerType(t)), align=1)

            perm = ir.Constant(ir.VectorType(I32, 16), [4 * (j & 3) + (j >> 2) for j in range(16)])
            W4 = ir.VectorType(I64, 4)
            ap = data(7, I64)
            s1 = cgutils.alloca_once_value(builder, ir.Constant(W4, [0] * 4))
            s2 = cgutils.alloca_once_value(builder, ir.Constant(W4, [0] * 4))
            ic = cgutils.alloca_once_value(builder, ir.Constant(W4, [_i64(h * C3) for h in range(4)]))
            with cgutils.for_range(builder, nblk) as loop:
                g = loop.index
                s = builder.add(q, builder.mul(g, ir.Constant(I64, 16 * w)))
                n4 = [vload(bp, builder.add(s, ir.Constant(I64, 16 * i)), B16) for i in range(4)]
                f = [builder.and_(n4[i], bsplat(15)) for i in range(4)] + [builder.lshr(n4[i], bsplat(4))
                                                                           for i in range(4)]
                if w >= 6:
                    t2 = [vload(bp, builder.add(s, ir.Constant(I64, 64 + 16 * i)), B16) for i in range(2)]
                    for m in range(8):
                        bits = builder.and_(builder.lshr(t2[m & 1], bsplat(2 * (m >> 1))), bsplat(3))
                        f[m] = builder.or_(f[m], builder.shl(bits, bsplat(4)))
                if w & 1:
                    u = vload(bp, builder.add(s, ir.Constant(I64, 16 * (w - 1))), B16)
                    for m in range(8):
                        bit = builder.and_(builder.lshr(u, bsplat(m)), bsplat(1))
                        f[m] = builder.or_(f[m], builder.shl(bit, bsplat(top)))
                sym0 = builder.mul(g, ir.Constant(I64, 32))
                for m in range(8):
                    at = builder.add(sym0, ir.Constant(I64, 4 * m))
                    parts = [vload(tp, builder.add(at, builder.mul(r, ir.Constant(I64, j))), B4) for j in range(4)]
                    lo = builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(I32, 8), list(range(8))))
                    hi = builder.shuffle_vector(parts[2], parts[3], ir.Constant(ir.VectorType(I32, 8), list(range(8))))
                    t = builder.zext(builder.shuffle_vector(lo, hi, perm), H16)
                    fv = builder.zext(f[m], H16)
                    unit = builder.or_(builder.shl(builder.lshr(fv, hsplat(sh)), hsplat(15)),
                                       builder.and_(builder.add(bbv, builder.shl(t, hsplat(sh))), hsplat(0x7FFF)))
                    unit = builder.or_(unit, builder.and_(fv, hsplat((1 << sh) - 1)))
                    o = builder.add(builder.mul(g, ir.Constant(I64, 128)), ir.Constant(I64, 16 * m))
                    builder.store(unit, builder.bitcast(builder.gep(dp, [o]), ir.PointerType(H16)), align=2)
                    words = builder.bitcast(unit, W4)   # (four units a word, little-endian, as in memory)
                    builder.store(builder.add(builder.load(s1), words), s1)
                    x = builder.xor(words, builder.load(ic))
                    prod = builder.mul(builder.and_(x, ir.Constant(W4, [0xFFFFFFFF] * 4)),
                                       builder.lshr(x, ir.Constant(W4, [32] * 4)))
                    builder.store(builder.add(builder.load(s2), prod), s2)
                    builder.store(builder.add(builder.load(ic), ir.Constant(W4, [_i64(4 * C3)] * 4)), ic)
            for j, v in enumerate((s1, s2)):
                t = builder.load(v)
                tot = builder.extract_element(t, ir.Constant(I32, 0))
                for h in range(1, 4):
                    tot = builder.add(tot, builder.extract_element(t, ir.Constant(I32, h)))
                at = builder.gep(ap, [ir.Constant(I64, j)])
                builder.store(builder.add(builder.load(at), tot), at)
            return ir.Constant(I64, 0)
        return sig, codegen
    return _blocks


if SIMD:
    _blocks7 = _make_blocks(7)
    _blocks6 = _make_blocks(6)
    _blocks5 = _make_blocks(5)

    @njit(nogil=True, cache=True)
    def merge_blocks(blob, q, tmp, r, nblk, k, b, dst, acc):
        """The units of the nblk whole blocks of a joint-symbol chunk (k, b its header) into dst[:128 nblk], the
        fields at blob[q:], the symbols in the Huffman decoder's sub-stream buffers (tmp, stride r); their
        checksum's word sums added to acc (uint64[2])."""
        if k == 1:
            _blocks7(blob, np.int64(q), tmp, np.int64(r), np.int64(nblk), np.int64(b << 7), dst, acc)
        elif k == 2:
            _blocks6(blob, np.int64(q), tmp, np.int64(r), np.int64(nblk), np.int64(b << 7), dst, acc)
        else:
            _blocks5(blob, np.int64(q), tmp, np.int64(r), np.int64(nblk), np.int64(b << 7), dst, acc)
else:
    @njit(nogil=True, cache=True)
    def merge_blocks(blob, q, tmp, r, nblk, k, b, dst, acc):   # (never called: SIMD is False)
        pass
