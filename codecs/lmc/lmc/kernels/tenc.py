"""lmc kernels: the temporal encoder's symbol pass as vectors (``tsyms8``), which packs 16-bit units' raw bits too.

``temporal._tsyms`` makes, for each unit, its joint symbol (context and step class) and the bits of |d| below
its leading one; the scalar encoder keeps those bits per element (``low``) and packs them into the chunk's raw
bit stream when it writes the chunk (``temporal._traw``: a table lookup and a shift per element, then a serial
accumulator).  Here eight units are one ``<8 x i32>`` vector (``simd._Vec``: context, monotone map, bit length
as the decoder's passes compute them; sixteen, ``<16 x i32>``, where the CPU has AVX-512: ``VLANES``) and, for
16-bit units, the raw bits leave the pass already packed, LSB-first, in the order ``_traw`` writes them:

- each lane's bit count kb = k - (k != 0) and value v < 2^kb are at hand (no lookup);
- the vector's values are joined in it as the stream holds them (``joined``, ``value``): pairs of 32-bit lanes in
  the 64-bit lanes (v0 | v1 << kb0), pairs of those within each 128 bits, then pairs of 128 bits, and with
  AVX-512 the two halves by a permute (at most 120 bits for 8 lanes, 240 for 16);
- the value joins the stream in the vector (``put``): shifted by the bit position's low 6 bits across the lanes
  (a funnel shift), the pending 64 bits or'ed into lane 0, the whole vector stored at the position's 8-byte
  word; the chain from one vector to the next is an add (the position) and a permute (the pending word).

On a Xeon core (Emerald Rapids) a bf16 pass took 1.16 ns an element against 0.61 without packing, where two 60-bit
values an 8-lane half, each taken to a scalar register and the accumulator (``temporal._put``'s step), took 1.61:
the scalar steps' instructions and the values' moves out of the vector set that speed, not their chains. With 8
lanes (AVX2 forms, the same CPU) 1.55 against 1.67. Packing in the pass (the first form) cost a bf16 pass 0.27 ns an
element and saved the writer's 0.47 on a Zen 5 core. For 32-bit units it cost 0.70 and saved 0.89, but only on the
chunks the temporal mode then wins (about two thirds of fp32 weights' chunks; the rest take the delta mode), so fp32
compress was slower with it: 32-bit units keep each element's bits in ``low`` as the scalar pass does (packed by
``_traw`` when the chunk is written). Joining four 32-bit lanes into 128-bit values before the accumulator did not
pay either (the scalar steps' instructions, not their chains, set the speed).

``tsyms8(x, r, n, W, mb, em, E, jb, low) -> (raw bits, units done)``: the first n & ~(VLANES - 1) units. W = 16:
their raw bits from bit 0 of ``low``'s bytes, the 8-byte word holding bit ``raw`` stored with zeros from that bit
on, so that a caller continues the stream there (``temporal._tsyms_all``); ``low`` needs ceil(raw / 8) + 64 bytes
(the vector stores past the end). W = 32: low[i] holds element i's raw bits. Nothing here checks bounds. Where
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
    NQ = N // 2
    VQ = ir.VectorType(I64, NQ)   # the N lanes as N / 2 of 64 bits

    def qs(v):
        return ir.Constant(VQ, [v] * NQ)

    def lanes(builder, v, idx, w=None):
        idx = list(idx)
        return builder.shuffle_vector(v, v if w is None else w, ir.Constant(ir.VectorType(I32, len(idx)), idx))

    def keep(builder, v, which):
        """v with its 64-bit lanes other than ``which`` zeroed."""
        m = ir.Constant(ir.VectorType(V.I1, NQ), [int(i in which) for i in range(NQ)])
        return builder.select(m, v, qs(0))

    def joined(builder, val, kb):
        """The N lanes' (value, bit count) pairs (16-bit units: at most 15 bits each) joined in order, as 64-bit
        lanes (lo, hi, bits): a value of at most 120 bits in lane 1 of each 128 bits (lanes 4h and 4h + 1 of the
        16-bit ones, h = 0 .. N / 8 - 1).  Pairs of lanes first, each 64-bit lane a pair of 32-bit ones (v0 | v1 <<
        kb0: no shuffle, where Intel's cores run shuffles on one port), then pairs of those within each 128 bits,
        then pairs of 128 bits."""
        v, k = builder.bitcast(val, VQ), builder.bitcast(kb, VQ)
        m32, c32 = qs(0xFFFFFFFF), qs(32)
        k0 = builder.and_(k, m32)
        u = builder.or_(builder.and_(v, m32), builder.shl(builder.lshr(v, c32), k0))
        lu = builder.add(k0, builder.lshr(k, c32))
        sw = [i ^ 1 for i in range(NQ)]   # (the other 64 bits of each 128)
        ls = lanes(builder, lu, sw)
        w = builder.or_(builder.shl(u, ls), lanes(builder, u, sw))   # odd lanes: the two of their 128 bits joined
        lw = builder.add(lu, ls)
        up = [(i + 2) % NQ for i in range(NQ)]   # (the next 128 bits)
        w2, l2 = lanes(builder, w, up), lanes(builder, lw, up)
        return builder.or_(w, builder.shl(w2, lw)), fshl(builder, qs(0), w2, lw), builder.add(lw, l2)

    def splat64(builder, v):
        return lanes(builder, builder.insert_element(ir.Constant(VQ, ir.Undefined), v, ir.Constant(I32, 0)), [0] * NQ)

    def fshl(builder, a, b, s):
        """(a << s) | (b >> (64 - s)) in each 64-bit lane, s in [0, 64) (a where s = 0): LLVM's funnel shift, one
        vpshldvq with AVX-512 VBMI2 (every CPU that runs the 16-lane loops: simd.SIMD512) where a shift pair and
        an or took three instructions (and IR's shift by 64 is poison)."""
        return builder.call(V.fn(builder, f"llvm.fshl.v{NQ}i64", VQ, [VQ, VQ, VQ]), [a, b, s])

    def permq(builder, v, idx):
        """v's 64-bit lanes picked by idx's (each taken mod NQ): vpermq (AVX-512) or vpermd on their halves."""
        if NQ == 8:
            return builder.call(V.fn(builder, "llvm.x86.avx512.permvar.di.512", VQ, [VQ, VQ]), [v, idx])
        V8 = ir.VectorType(I32, 8)
        i2 = builder.shl(idx, qs(1))
        dw = builder.bitcast(builder.or_(i2, builder.shl(builder.add(i2, qs(1)), qs(32))), V8)
        return builder.bitcast(builder.call(V.fn(builder, "llvm.x86.avx2.permd", V8, [V8, V8]),
                                            [builder.bitcast(v, V8), dw]), VQ)

    def value(builder, val, kb):
        """The vector's raw bits as one value from lane 0 on (at most 120 bits, N = 8; 240, N = 16) and their
        count (i64): ``joined``'s, the two of 16 lanes joined as the stream would (the second's lanes moved up by
        the first's bits >> 6 by a permute, then shifted)."""
        lo, hi, L = joined(builder, val, kb)
        if N == 8:
            return keep(builder, lanes(builder, lo, [1, 5, 0, 0], hi), (0, 1)), builder.extract_element(
                L, ir.Constant(I32, 1))
        b = keep(builder, lanes(builder, lo, [0, 0, 5, 13, 0, 0, 0, 0], hi), (2, 3))   # B at lanes 2, 3
        a = keep(builder, lanes(builder, lo, [1, 9, 0, 0, 0, 0, 0, 0], hi), (0, 1))    # A at lanes 0, 1
        la = lanes(builder, L, [1] * 8)
        t = builder.sub(ir.Constant(VQ, [i + 2 for i in range(8)]), builder.lshr(la, qs(6)))
        s = builder.and_(la, qs(63))
        # B << la: its lanes moved up by la >> 6 (the permute's zeros from b's lanes 0, 1 and 4 - 7), then s bits
        y = fshl(builder, permq(builder, b, t), permq(builder, b, builder.sub(t, qs(1))), s)
        return builder.or_(a, y), builder.extract_element(builder.add(la, lanes(builder, L, [5] * 8)),
                                                          ir.Constant(I32, 0))

    def put(builder, v, kv, accv, pos, bp):
        """The value v of kv bits (``value``) joins the stream at bit pos: shifted by pos & 63 across the lanes,
        the pending bits (accv's lane 0: the 64 from pos & ~63, zeros above pos) or'ed in, and stored at pos >> 6
        as one vector (its lanes past the value's end zeros, written over later); accv then holds the lane where
        the stream ends.  One step of the stream a vector, its chain a permute: two 60-bit steps an 8-lane half,
        each value taken out of the vector to a scalar register, took a Xeon core's bf16 pass 0.5 ns an element
        more (16 lanes)."""
        p0 = builder.load(pos)
        sv = splat64(builder, builder.and_(p0, ir.Constant(I64, 63)))
        vp = lanes(builder, v, [NQ] + list(range(NQ - 1)), qs(0))   # (lane i - 1's bits that pass into lane i)
        st = builder.or_(fshl(builder, v, vp, sv), builder.load(accv))
        at = builder.shl(builder.lshr(p0, ir.Constant(I64, 6)), ir.Constant(I64, 3))
        builder.store(st, builder.bitcast(builder.gep(bp, [at]), ir.PointerType(VQ)), align=1)
        p1 = builder.add(p0, kv)
        cc = builder.sub(builder.lshr(p1, ir.Constant(I64, 6)), builder.lshr(p0, ir.Constant(I64, 6)))
        builder.store(keep(builder, permq(builder, st, splat64(builder, cc)), (0,)), accv)
        builder.store(p1, pos)

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
            pos = V.cg.alloca_once_value(builder, ir.Constant(I64, 0))
            accv = V.cg.alloca_once_value(builder, qs(0))
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
                    put(builder, *value(builder, builder.xor(a, builder.shl(nz, kb)), kb), accv, pos, bp)
            if not pack:
                return V.hsum(builder, builder.load(tot), "add")
            p0 = builder.load(pos)
            at = builder.and_(builder.lshr(p0, ir.Constant(I64, 3)), ir.Constant(I64, ~7))
            builder.store(builder.extract_element(builder.load(accv), ir.Constant(I32, 0)),
                          builder.bitcast(builder.gep(bp, [at]), ir.PointerType(I64)), align=1)
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
