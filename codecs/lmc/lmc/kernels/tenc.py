"""lmc kernels: the temporal encoder's symbol pass as vectors (``tsyms8``), which packs 16-bit units' raw bits too.

``temporal._tsyms`` makes, for each unit, its joint symbol (context and step class) and the bits of |d| below
its leading one; the scalar encoder keeps those bits per element (``low``) and packs them into the chunk's raw
bit stream when it writes the chunk (``temporal._traw``: a table lookup and a shift per element, then a serial
accumulator).  Here eight units are one ``<8 x i32>`` vector (``simd._Vec``: context, monotone map, bit length
as the decoder's passes compute them; sixteen, ``<16 x i32>``, where the CPU has AVX-512: ``VLANES``) and, for
16-bit units, the raw bits leave the pass already packed, LSB-first, in the order ``_traw`` writes them:

- each lane's bit count kb = k - (k != 0) and value v < 2^kb are at hand (no lookup);
- neighbouring lanes are joined in the vector: v0 | v1 << kb0 (four joins of at most 30 bits, then two of at
  most 60 in 64-bit lanes), each half of a 16-lane vector as an 8-lane one;
- each joined value meets the accumulator once (``temporal._put``'s step, kept with the absolute bit position, so that
  the chains from one value to the next are an add and an or with a select): two steps per eight units, where
  ``_traw`` takes one per four after four lookups.

Packing here costs a bf16 symbol pass 0.27 ns an element and saves the writer's 0.47 (Zen 5). For 32-bit units
it cost 0.70 and saved 0.89, but only on the chunks the temporal mode then wins (about two thirds of fp32
weights' chunks; the rest take the delta mode), so fp32 compress was slower with it: 32-bit units keep each
element's bits in ``low`` as the scalar pass does (packed by ``_traw`` when the chunk is written).  Joining four
32-bit lanes into 128-bit values before the accumulator did not pay either (the scalar steps' instructions, not
their chains, set the speed).

``tsyms8(x, r, n, W, mb, em, E, jb, low) -> (raw bits, units done)``: the first n & ~(VLANES - 1) units.  W = 16:
their raw bits from bit 0 of ``low``'s bytes, the 8-byte word holding bit ``raw`` stored with zeros from that bit
on, so that a caller continues the stream there (``temporal._tsyms_all``); ``low`` needs ceil(raw / 8) + 8
bytes.  W = 32: low[i] holds element i's raw bits.  Nothing here checks bounds.  Where
``simd.SIMD`` is false it does nothing and returns (0, 0): the scalar loop takes every unit.
``tests/test_rans32.py`` checks the symbols and the bytes against the scalar loop and ``_traw``.

``field_max(u, M)``: the largest exponent field of a chunk's reference units (the context base ``E``) as vectors
of 64 bytes, for ``temporal._tbase`` and the encoder's pass over the reference (``check.ref_pass``)."""
import numpy as np
from numba import njit

from .simd import SIMD, SIMD512, _Vec


def _make_tsyms8(W, N=8, pack=None):
    """``(x, r, nv, mb, em, E, jb, low) -> raw bits`` for W-bit units over the first nv (a multiple of N), N
    units a vector (8: AVX2; 16: AVX-512); pack (default: W == 16): the raw bits packed into low's bytes, else
    low[i] holds element i's (as for 32-bit units)."""
    pack = W == 16 if pack is None else pack
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(W, N)
    ir, V8, splat, I32, I64 = V.ir, V.VN, V.splat, V.I32, V.I64
    VL = ir.VectorType(I64, 4)

    def lanes(builder, v, idx):
        idx = list(idx)
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, len(idx)), idx))

    def joined(builder, lv, kb):
        """The (value, bit count) pairs, i64, of the N lanes (16-bit units: at most 15 bits each) joined in
        order: N / 4 of at most 60 bits, each group of eight lanes joined apart (sixteen lanes are two halves:
        joined across the whole vector the bf16 pass took 0.69 ns an element, by halves 0.58)."""
        out = []
        for g in range(N // 8):
            v8 = lv if N == 8 else lanes(builder, lv, range(8 * g, 8 * g + 8))
            k8 = kb if N == 8 else lanes(builder, kb, range(8 * g, 8 * g + 8))
            ev, od = lanes(builder, v8, range(0, 8, 2)), lanes(builder, v8, range(1, 8, 2))
            ke, ko = lanes(builder, k8, range(0, 8, 2)), lanes(builder, k8, range(1, 8, 2))
            u = builder.zext(builder.or_(ev, builder.shl(od, ke)), VL)
            lu = builder.zext(builder.add(ke, ko), VL)
            w = builder.or_(lanes(builder, u, (0, 2)), builder.shl(lanes(builder, u, (1, 3)), lanes(builder, lu, (0, 2))))
            lw = builder.add(lanes(builder, lu, (0, 2)), lanes(builder, lu, (1, 3)))
            out += [(builder.extract_element(w, ir.Constant(I32, h)), builder.extract_element(lw, ir.Constant(I32, h)))
                    for h in range(2)]
        return out

    @intrinsic
    def _tsyms8(typingctx, x, r, n8, mb, em, E, jb, low):
        sig = types.int64(x, r, n8, mb, em, E, jb, low)

        def codegen(context, builder, signature, args):
            xp = V.data(context, builder, signature, args, 0, V.VU)
            rp = V.data(context, builder, signature, args, 1, V.VU)
            jp = V.data(context, builder, signature, args, 6, ir.VectorType(V.I16, N))
            bp = V.data(context, builder, signature, args, 7, V.I8)
            lp = V.data(context, builder, signature, args, 7, V8)
            tot = V.cg.alloca_once_value(builder, splat(0))
            vmb, vem, vE = (V.vsplat(builder, args[k]) for k in (3, 4, 5))
            mask = splat((1 << W) - 1)
            c0, c1, c63 = (ir.Constant(I64, v) for v in (0, 1, 63))
            acc, pos = (V.cg.alloca_once_value(builder, c0) for _ in range(2))
            with V.cg.for_range(builder, builder.udiv(args[2], ir.Constant(I64, N))) as loop:
                j = loop.index
                xv, rv = V.units(builder, xp, j), V.units(builder, rp, j)
                c = V.context(builder, rv, vmb, vem, vE)
                d = builder.and_(builder.sub(V.mono(builder, xv), V.mono(builder, rv)), mask)
                neg = builder.and_(builder.lshr(d, splat(W - 1)), splat(1))
                a = builder.and_(builder.add(builder.xor(d, builder.sub(splat(0), neg)), neg), mask)
                nz = builder.zext(builder.icmp_unsigned("!=", a, splat(0)), V8)
                k = V.bit_length(builder, a, nz)
                sym = builder.add(builder.mul(c, splat(2 * W + 1)),
                                  builder.add(builder.sub(builder.add(k, k), nz), neg))
                builder.store(builder.trunc(sym, ir.VectorType(V.I16, N)), builder.gep(jp, [j]), align=1)
                kb = builder.sub(k, nz)
                if not pack:   # (each element's bits kept: see the module's text)
                    builder.store(builder.xor(a, builder.shl(nz, kb)), builder.gep(lp, [j]), align=1)
                    builder.store(builder.add(builder.load(tot), kb), tot)
                else:
                    for v, kv in joined(builder, builder.xor(a, builder.shl(nz, kb)), kb):
                        # v joins the bits pending in acc, those from bit (p & ~63); acc stored at byte
                        # p >> 3 & ~7; where the 64 bits are complete acc keeps v's bits past them.  The chains
                        # from one value to the next: p + k (one add) and acc (an or and a select).
                        p0, a0 = builder.load(pos), builder.load(acc)
                        sh = builder.and_(p0, c63)
                        lo = builder.or_(a0, builder.shl(v, sh))
                        hi = builder.lshr(builder.lshr(v, c1), builder.sub(c63, sh))
                        at = builder.and_(builder.lshr(p0, ir.Constant(I64, 3)), ir.Constant(I64, ~7))
                        builder.store(lo, builder.bitcast(builder.gep(bp, [at]), ir.PointerType(I64)), align=1)
                        p1 = builder.add(p0, kv)
                        g = builder.icmp_unsigned("!=", builder.lshr(p1, ir.Constant(I64, 6)),
                                                  builder.lshr(p0, ir.Constant(I64, 6)))
                        builder.store(builder.select(g, hi, lo), acc)
                        builder.store(p1, pos)
            if not pack:
                return V.hsum(builder, builder.load(tot), "add")
            p0 = builder.load(pos)
            at = builder.and_(builder.lshr(p0, ir.Constant(I64, 3)), ir.Constant(I64, ~7))
            builder.store(builder.load(acc), builder.bitcast(builder.gep(bp, [at]), ir.PointerType(I64)), align=1)
            return p0
        return sig, codegen
    return _tsyms8


@njit(nogil=True, cache=True)
def _fmax_tail(u, i0, M):
    """field_max over u[i0:] element by element (branch-free: the loop vectorizes in wide lanes)."""
    m = np.int64(0)
    for i in range(i0, u.size):
        v = np.int64(u[i]) & M
        m = max(m, v & -np.int64(v != M))
    return m


def _make_fmax(W):
    """``(u, nv, M) -> the largest u[i] & M other than M (0 if none)`` over the first nv * 512 / W units of u:
    64 bytes a vector, unsigned W-bit lanes (generic vector IR: AVX2 takes a vector as two halves)."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(W)
    ir, cg, L = V.ir, V.cg, 512 // W
    VT = ir.VectorType(V.U, L)

    @intrinsic
    def _fmax(typingctx, u, nv, M):
        if not (isinstance(u, types.Array) and u.layout == "C"):
            return None   # (the loop reads the array's data as contiguous: any other layout is a typing error)
        sig = types.int64(u, nv, M)

        def codegen(context, builder, signature, args):
            p = V.data(context, builder, signature, args, 0, VT)
            m1 = builder.insert_element(ir.Constant(VT, ir.Undefined), builder.trunc(args[2], V.U),
                                        ir.Constant(V.I32, 0))
            vm = builder.shuffle_vector(m1, m1, ir.Constant(ir.VectorType(V.I32, L), [0] * L))
            zero = ir.Constant(VT, [0] * L)
            acc = cg.alloca_once_value(builder, zero)
            with cg.for_range(builder, args[1]) as loop:
                v = builder.and_(builder.load(builder.gep(p, [loop.index]), align=1), vm)
                v = builder.select(builder.icmp_unsigned("!=", v, vm), v, zero)
                a = builder.load(acc)
                builder.store(builder.select(builder.icmp_unsigned(">", v, a), v, a), acc)
            red = V.fn(builder, f"llvm.vector.reduce.umax.v{L}i{W}", V.U, [VT])
            return builder.zext(builder.call(red, [builder.load(acc)]), V.I64)
        return sig, codegen
    return _fmax


if SIMD:
    _fmax16 = _make_fmax(16)
    _fmax32 = _make_fmax(32)

    @njit(nogil=True, cache=True)
    def field_max(u, M):
        """The largest u[i] & M other than M over u (uint16 or uint32), 0 if none: the temporal mode's context
        base (temporal._tbase) with M the exponent field, as vectors (a Xeon core: 0.03 ns a bf16 element against
        0.27 element by element, where Numba widens the units to 32 or 64-bit lanes)."""
        c = np.ascontiguousarray(u)   # (the vector loops read contiguous data: a copy only if u is not)
        if c.itemsize == 2:
            i0 = (c.size >> 5) << 5
            m = _fmax16(c, np.int64(c.size >> 5), np.int64(M))
        elif c.itemsize == 4:
            i0 = (c.size >> 4) << 4
            m = _fmax32(c, np.int64(c.size >> 4), np.int64(M))
        else:
            i0 = 0
            m = np.int64(0)
        return max(m, _fmax_tail(c, i0, M))

    # units a vector: 16 where the CPU has AVX-512 (fp32 weights' symbol pass 0.41 -> 0.23 ns an element on a Zen 5
    # core; bf16 0.70 -> 0.58, their raw bits joined by halves: ``joined``), else 8
    VLANES = 16 if SIMD512 else 8
    _tsyms8_16 = _make_tsyms8(16, VLANES)
    _tsyms8_32 = _make_tsyms8(32, VLANES)

    @njit(nogil=True, cache=True)
    def tsyms8(x, r, n, W, mb, em, E, jb, low):
        nv = n & ~(VLANES - 1)
        if nv == 0:
            return np.int64(0), np.int64(0)
        if W == 16:
            return _tsyms8_16(x, r, np.int64(nv), np.int64(mb), np.int64(em), np.int64(E), jb, low), np.int64(nv)
        return _tsyms8_32(x, r, np.int64(nv), np.int64(mb), np.int64(em), np.int64(E), jb, low), np.int64(nv)
else:
    VLANES = 8

    @njit(nogil=True, cache=True)
    def tsyms8(x, r, n, W, mb, em, E, jb, low):
        return np.int64(0), np.int64(0)

    @njit(nogil=True, cache=True)
    def field_max(u, M):
        return _fmax_tail(u, 0, M)
