"""lmc kernels: the joint-symbol mode's last decoder pass as AVX2 vector code (``merge_blocks``): for each whole
block of 128 elements, its raw fields unpacked from the blob, its symbols taken from the Huffman decoder's four
sub-stream buffers, and the units written, in registers, one pass (FORMAT.md, "Joint-symbol chunk").

The scalar decoder makes three passes over a chunk after the Huffman decode: the sub-streams interleaved into a
symbol plane (0.04 ns an element), the fields unpacked into a plane (0.09) and the two merged into units (0.07),
each writing a plane the next one reads back. Numba does not vectorise the three as one loop (a `/tmp` try ran
1.3x slower than the three). Here one 16-element group of a block is, for m = 0..7 (elements o + 16 m + j):

- its fields: byte 16 (m mod 4) + j of the block's 4-bit plane (its low nibble for m < 4, its high one after),
  with the 2-bit and 1-bit planes' bits where the fields have them, as ``kernels.joint._unpack_loop`` computes
  them;
- its symbols: element e's symbol is number e >> 2 of sub-stream e & 3, so the block's 128 are 32 bytes of
  each sub-stream buffer, interleaved once a block (a byte, then two bytes at a time: ``vpunpck``), and the
  group's 16 are bytes 16 m .. 16 m + 15 of that;
- its units: ``sign << 15 | ((b << 7) + (t << (7 - k))) & 0x7FFF | low bits``, sixteen 16-bit lanes.

Where the CPU has AVX-512 BW (``simd.SIMD512``) two groups are one 32-lane vector (groups m and m + 1 sit in
consecutive bytes of each field plane, so their fields are one 32-byte load), halving the instructions of the
units and of their checksum: with the symbols interleaved once a block, the pass went from 0.35 to 0.24 cycles
an element on a Zen 5 core (bf16 first moments and weights; it was 0.31 with 16 lanes).

The same units as the three passes (``tests/test_joint.py`` compares them on every k and on hand-made symbols
and fields). Where ``simd.SIMD`` is false, ``merge_blocks`` is never called. The caller guarantees that the
blocks' fields lie inside the blob, that each sub-stream buffer holds the symbols of the blocks and that dst
holds their units; nothing here checks bounds."""

import numpy as np
from numba import njit

from .base import _C3
from .simd import SIMD, SIMD512


def _i64(v):
    """v modulo 2^64 as a signed 64-bit value (an LLVM i64 constant)."""
    v %= 1 << 64
    return v - (1 << 64) if v >> 63 else v


def _make_blocks(w, P=1):
    """``(blob, q, tmp, r, nblk, bb, dst, acc) -> 0``: nblk whole blocks of fields w = 8 - k bits wide at
    blob[q:], their symbols in tmp (sub-stream s at tmp[s * r:]), their units to dst (uint16); bb = b << 7. acc
    (uint64[2]) gets the format-8 checksum's two word sums of the units added (``base._csum_words``: s1 the words,
    s2 the product of the halves of each word XOR its index times C3), the units' words numbered from 0.
    P: the 16-element groups a vector holds (1: AVX2; 2, 32 lanes of 16 bits: AVX-512 BW)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    k = 8 - w
    sh = 7 - k
    C3 = int(_C3)
    top = 4 if w == 5 else 6
    L = 16 * P
    I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    BL, HL, WL = ir.VectorType(I8, L), ir.VectorType(I16, L), ir.VectorType(I64, 4 * P)

    def bsplat(v):
        return ir.Constant(BL, [v] * L)

    def hsplat(v):
        return ir.Constant(HL, [v] * L)

    def idx(vals):
        vals = list(vals)
        return ir.Constant(ir.VectorType(I32, len(vals)), vals)

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
            bbv = builder.shuffle_vector(builder.insert_element(ir.Constant(HL, ir.Undefined), b16,
                                                                ir.Constant(I32, 0)),
                                         ir.Constant(HL, ir.Undefined), idx([0] * L))

            def vload(ptr, off, t):
                return builder.load(builder.bitcast(builder.gep(ptr, [off]), ir.PointerType(t)), align=1)

            def at(s, off):
                return builder.add(s, ir.Constant(I64, off))

            zip64 = idx((j >> 1) + 32 * (j & 1) for j in range(64))
            B32, H32 = ir.VectorType(I8, 32), ir.VectorType(I16, 32)
            ap = data(7, I64)
            s1 = cgutils.alloca_once_value(builder, ir.Constant(WL, [0] * (4 * P)))
            s2 = cgutils.alloca_once_value(builder, ir.Constant(WL, [0] * (4 * P)))
            ic = cgutils.alloca_once_value(builder, ir.Constant(WL, [_i64(h * C3) for h in range(4 * P)]))
            with cgutils.for_range(builder, nblk) as loop:
                g = loop.index
                s = builder.add(q, builder.mul(g, ir.Constant(I64, 16 * w)))
                # the fields of elements 16 m + j (m = 0..7) as vectors of P groups: group m's 4-bit field is
                # byte 16 (m mod 4) + j of the 4-bit plane, its low nibble for m < 4; its 2-bit field bits
                # 2 (m >> 1) of byte 64 + 16 (m & 1) + j; its 1-bit field bit m of byte 16 (w - 1) + j
                n4 = [vload(bp, at(s, L * i), BL) for i in range(4 // P)]
                f = [builder.and_(v, bsplat(15)) for v in n4] + [builder.lshr(v, bsplat(4)) for v in n4]
                if w >= 6:
                    t2 = [vload(bp, at(s, 64 + L * i), BL) for i in range(2 // P)]
                    for v in range(8 // P):
                        m = v * P
                        bits = builder.and_(builder.lshr(t2[m & 1 if P == 1 else 0], bsplat(2 * (m >> 1))),
                                            bsplat(3))
                        f[v] = builder.or_(f[v], builder.shl(bits, bsplat(4)))
                if w & 1:
                    u = vload(bp, at(s, 16 * (w - 1)), ir.VectorType(I8, 16))
                    if P == 2:   # (bit m of the first 16 lanes, bit m + 1 of the next)
                        u = builder.shuffle_vector(u, builder.lshr(u, ir.Constant(u.type, [1] * 16)), idx(range(32)))
                    for v in range(8 // P):
                        bit = builder.and_(builder.lshr(u, bsplat(v * P)), bsplat(1))
                        f[v] = builder.or_(f[v], builder.shl(bit, bsplat(top)))
                # the block's 128 symbols: 32 bytes of each sub-stream, interleaved a byte then two at a time
                sym0 = builder.mul(g, ir.Constant(I64, 32))
                sub = [vload(tp, builder.add(sym0, builder.mul(r, ir.Constant(I64, j))), B32) for j in range(4)]
                ab = builder.bitcast(builder.shuffle_vector(sub[0], sub[1], zip64), H32)
                cd = builder.bitcast(builder.shuffle_vector(sub[2], sub[3], zip64), H32)
                syms = builder.bitcast(builder.shuffle_vector(ab, cd, zip64), ir.VectorType(I8, 128))
                for v in range(8 // P):
                    t = builder.zext(builder.shuffle_vector(syms, syms, idx(range(L * v, L * v + L))), HL)
                    fv = builder.zext(f[v], HL)
                    unit = builder.or_(builder.shl(builder.lshr(fv, hsplat(sh)), hsplat(15)),
                                       builder.and_(builder.add(bbv, builder.shl(t, hsplat(sh))), hsplat(0x7FFF)))
                    unit = builder.or_(unit, builder.and_(fv, hsplat((1 << sh) - 1)))
                    o = builder.add(builder.mul(g, ir.Constant(I64, 128)), ir.Constant(I64, L * v))
                    builder.store(unit, builder.bitcast(builder.gep(dp, [o]), ir.PointerType(HL)), align=2)
                    words = builder.bitcast(unit, WL)   # (four units a word, little-endian, as in memory)
                    builder.store(builder.add(builder.load(s1), words), s1)
                    x = builder.xor(words, builder.load(ic))
                    prod = builder.mul(builder.and_(x, ir.Constant(WL, [0xFFFFFFFF] * (4 * P))),
                                       builder.lshr(x, ir.Constant(WL, [32] * (4 * P))))
                    builder.store(builder.add(builder.load(s2), prod), s2)
                    builder.store(builder.add(builder.load(ic), ir.Constant(WL, [_i64(4 * P * C3)] * (4 * P))), ic)
            for j, v in enumerate((s1, s2)):
                t = builder.load(v)
                tot = builder.extract_element(t, ir.Constant(I32, 0))
                for h in range(1, 4 * P):
                    tot = builder.add(tot, builder.extract_element(t, ir.Constant(I32, h)))
                a = builder.gep(ap, [ir.Constant(I64, j)])
                builder.store(builder.add(builder.load(a), tot), a)
            return ir.Constant(I64, 0)
        return sig, codegen
    return _blocks


if SIMD:
    # (32 lanes of 16 bits where the CPU has AVX-512 BW: the units and their checksum in half the instructions)
    _P = 2 if SIMD512 else 1
    _blocks7 = _make_blocks(7, _P)
    _blocks6 = _make_blocks(6, _P)
    _blocks5 = _make_blocks(5, _P)

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
