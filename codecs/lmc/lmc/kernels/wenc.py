"""AVX-512 code for the 32-state rANS encoder: a round is two vectors of 16 states. A byte stream's symbols take
their encoder entries from registers instead of a gather; 16-bit symbols from scalar loads.

``enc_rounds(syms, lo, et, buf, p, xl)`` does what ``simd.enc32`` does (``rans._tenc``'s full rounds below
symbol lo, from the last round down) and gives the same words and states. Where ``simd.SIMD512`` holds and the
symbols are bytes, it runs ``_make_wenc``'s loop if a window of 64 consecutive byte values (mod 256) holds all
but at most 1/WINDOW_OUT of the table's probability; otherwise it calls ``simd.enc32``. 16-bit symbols (the
temporal mode's joint symbols: 16 contexts of 33 or 65, too many for registers) take ``enc16``: 16 lanes whose
entries come from scalar loads put into the vector. On a Zen 5 core a 16-lane gather cost about a cycle an
element, as much as the rest of the step; with scalar loads the temporal symbols of bf16 and fp32 weights encode
in 0.37-0.38 ns an element against simd.enc32's 0.62 (the same words).

Why: the AVX2 encoder spends a third of its time in its gathers (``vpgatherdd``, one per eight symbols), and a
16-lane gather is slower still on the CPUs measured. A byte stream that rANS codes has a peaked distribution (an
exponent plane, the predicted exponent's residuals): its symbols lie, almost all, in a few dozen neighbouring
values. Their 64 entries (the encoder's f | cum << 13, and 1/f as a float) fit in eight ``zmm`` registers, and
``vpermi2d`` looks up 16 lanes in one of two 32-entry halves. A vector with a symbol outside the window takes the
gather and a division instead (a branch taken, on average, at most once in eight vectors: 16 lanes at
1/128 of the probability each; outliers that cluster may take it more often, never with other bytes).

One state's step, x the state, f and cum its symbol's frequency and start (as ``rans._renc2``):

- renormalise: lanes with x > (f << 20) - 1 emit x's low 16 bits and shift it right by 16; the emitting lanes'
  words, in lane order, go below the pointer by ``vpcompressw`` and a masked store of exactly those words (the
  scalar encoder takes lanes 31 .. 0 of a round, each pushing below the last: the same order in memory);
- x div f from a float product: x < f << 20 <= 2^32 after the renormalisation, so x / f < 2^20; float(x) times
  float(1/f) is within 3 * 2^-24 relative of x / f, so within 0.19 of it, and its integer part q0 is q - 1, q or
  q + 1; the remainder x - q0 f in [-f, 2f) (exact in 32-bit wrapping arithmetic) tells them apart;
- x' = q * 4096 + x mod f + cum.

Nothing here checks bounds: the caller passes lo <= syms.size, a multiple of 32, and a buffer whose bytes below p
take the words (at most 2 lo; simd.enc32, where it runs instead, also writes the 16 bytes below the last word)."""
import numpy as np
from numba import njit

from .simd import LANES, SIMD512, _Vec, enc32, enc_table, states32, states_back

WINDOW = 64
WINDOW_OUT = 128   # the window must hold all but 1/WINDOW_OUT of the 4096 units of probability


@njit(nogil=True, cache=True)
def window(et32):
    """The window for a byte stream's table et32 (256 entries): (off, table) where symbol s is entry
    (s + off) & 255 of the window when that is below WINDOW, table (uint32[2 * WINDOW]) the window's entries
    then the bits of float32(1 / f) for each; off = -1 if no window holds enough of the probability."""
    fr = np.zeros(512, np.int64)
    for s in range(256):
        fr[s] = et32[s] & 8191
        fr[s + 256] = fr[s]
    run = 0
    for s in range(WINDOW):
        run += fr[s]
    best = run
    start = 0
    for s in range(1, 256):
        run += fr[s + WINDOW - 1] - fr[s - 1]
        if run > best:
            best = run
            start = s
    tab = np.zeros(2 * WINDOW, np.uint32)
    if (4096 - best) * WINDOW_OUT > 4096:
        return -1, tab
    rc = np.zeros(WINDOW, np.float32)
    for k in range(WINDOW):
        e = et32[(start + k) & 255]
        tab[k] = e
        if e & 8191:
            rc[k] = np.float32(1.0) / np.float32(e & 8191)
    tab[WINDOW:] = rc.view(np.uint32)
    return (256 - start) & 255, tab


def _emit(V, builder, x, m, pos, bp):
    """The 16 lanes of x where m is set push their low 16 bits below the pointer (its stack slot ``pos``) in lane
    order, by ``vpcompressw`` and a masked store of exactly those words, and shift right by 16.  Returns x."""
    ir, I16, I32, I64 = V.ir, V.I16, V.I32, V.I64
    VW, VM = ir.VectorType(I16, 16), ir.VectorType(V.I1, 16)
    compress = V.fn(builder, "llvm.x86.avx512.mask.compress.v16i16", VW, [VW, VW, VM])
    mstore = V.fn(builder, "llvm.masked.store.v16i16.p0", ir.VoidType(), [VW, ir.PointerType(VW), I32, VM])
    ctpop = V.fn(builder, "llvm.ctpop.i32", I32, [I32])
    cnt = builder.call(ctpop, [builder.zext(builder.bitcast(m, I16), I32)])
    wp = builder.sub(builder.load(pos), builder.shl(builder.zext(cnt, I64), ir.Constant(I64, 1)))
    w = builder.call(compress, [builder.trunc(x, VW), ir.Constant(VW, ir.Undefined), m])
    first = builder.bitcast(builder.trunc(builder.sub(builder.shl(ir.Constant(I32, 1), cnt), ir.Constant(I32, 1)),
                                          I16), VM)
    builder.call(mstore, [w, builder.bitcast(builder.gep(bp, [wp]), ir.PointerType(VW)), ir.Constant(I32, 1), first])
    builder.store(wp, pos)
    return builder.select(m, builder.lshr(x, V.splat(16)), x)


def _push_step(V, builder, e, x, pos, bp, quotient):
    """One state step of 16 lanes, the two loops' shared part (``rans._renc2``'s): lanes with x > (f << 20) - 1
    push x's low 16 bits below the pointer (its stack slot ``pos``) in lane order, by ``vpcompressw`` and a masked
    store of exactly those words, and shift x right by 16; then x' = q * 4096 + x mod f + cum, from q0 =
    quotient(x, f) (q - 1, q or q + 1: the remainder tells them apart).  e: the lanes' entries f | cum << 13.
    Returns x'."""
    splat = V.splat
    f = builder.and_(e, splat(0x1FFF))
    x = _emit(V, builder, x, builder.icmp_unsigned(">", x, builder.sub(builder.shl(f, splat(20)), splat(1))), pos, bp)
    q0 = quotient(x, f)
    rem = builder.sub(x, builder.mul(q0, f))
    d = builder.sub(splat(4096), f)
    xb = builder.add(builder.add(builder.shl(q0, splat(12)), rem), builder.lshr(e, splat(13)))
    return builder.select(builder.icmp_signed("<", rem, splat(0)), builder.sub(xb, d),
                          builder.select(builder.icmp_signed(">=", rem, f), builder.add(xb, d), xb))


def _entries16(V, builder, jp, ep, i0):
    """The encoder entries ep[jp[i0 + k]] of 16 symbols (jp: i16*, ep: i32*) by scalar loads put into a vector:
    on a Zen 5 core a 16-lane gather (vpgatherdd, or two of 8 lanes) took about a cycle an element, as much as
    the rest of the step."""
    ir = V.ir
    e = ir.Constant(V.VN, ir.Undefined)
    for k in range(16):
        j = builder.zext(builder.load(builder.gep(jp, [builder.add(i0, ir.Constant(V.I64, k))])), V.I64)
        e = builder.insert_element(e, builder.load(builder.gep(ep, [j])), ir.Constant(V.I32, k))
    return e


def _fdiv_quotient(V, builder):
    """_push_step's quotient as simd._make_enc32 takes it: one float32 division of 16 lanes."""
    F16 = V.ir.VectorType(V.ir.FloatType(), 16)
    return lambda x, f: builder.fptosi(builder.fdiv(builder.uitofp(x, F16), builder.sitofp(f, F16)), V.VN)


def _make_wenc():
    """The loop: ``(syms, nr, tab, et32, buf, p, xs, off) -> p``: nr rounds of byte symbols syms from the last
    round down, tab and off from ``window``, et32 the whole table (for vectors that leave the window), xs
    (uint32[32]) the states, updated."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(lanes=16)
    ir, cgutils, splat = V.ir, V.cg, V.splat
    I1, I8, I16, I32, I64, VN = V.I1, V.I8, V.I16, V.I32, V.I64, V.VN
    F16 = ir.VectorType(ir.FloatType(), 16)
    VB = ir.VectorType(I8, 16)
    VM = ir.VectorType(I1, 16)

    @intrinsic
    def _wenc(typingctx, syms, nr, tab, et32, buf, p, xs, off):
        if not all(isinstance(a, types.Array) and a.layout == "C" for a in (syms, tab, et32, buf, xs)):
            return None   # (the loop reads its arrays' data as contiguous: any other layout is a typing error)
        sig = types.int64(syms, nr, tab, et32, buf, p, xs, off)

        def codegen(context, builder, signature, args):
            sp, tp, ep, bp, xp = (V.data(context, builder, signature, args, k, t)
                                  for k, t in ((0, I8), (2, VN), (3, I8), (4, I8), (6, VN)))
            vperm2 = V.fn(builder, "llvm.x86.avx512.vpermi2var.d.512", VN, [VN, VN, VN])
            gth = V.fn(builder, "llvm.x86.avx512.mask.gather.dpi.512", VN, [VN, ir.PointerType(I8), VN, VM, I32])
            T = [builder.load(builder.gep(tp, [ir.Constant(I32, k)]), align=4) for k in range(8)]
            voff = V.vsplat(builder, args[7])
            one = ir.Constant(F16, [1.0] * 16)
            vx = V.states(builder, xp, 2)
            ev = cgutils.alloca_once(builder, VN)
            rv = cgutils.alloca_once(builder, F16)
            pos = cgutils.alloca_once_value(builder, args[5])
            with cgutils.for_range(builder, args[1]) as loop:
                g = builder.mul(builder.sub(builder.sub(args[1], ir.Constant(I64, 1)), loop.index),
                                ir.Constant(I64, 32))
                for h in (1, 0):
                    sv = builder.zext(builder.load(builder.bitcast(builder.gep(sp, [builder.add(g, ir.Constant(
                        I64, 16 * h))]), ir.PointerType(VB)), align=1), VN)
                    idx = builder.and_(builder.add(sv, voff), splat(255))
                    hi = builder.icmp_unsigned(">", idx, splat(31))
                    builder.store(builder.select(hi, builder.call(vperm2, [T[2], idx, T[3]]),
                                                 builder.call(vperm2, [T[0], idx, T[1]])), ev)
                    builder.store(builder.bitcast(builder.select(hi, builder.call(vperm2, [T[6], idx, T[7]]),
                                                                 builder.call(vperm2, [T[4], idx, T[5]])), F16), rv)
                    out = builder.bitcast(builder.icmp_unsigned(">", idx, splat(WINDOW - 1)), I16)
                    with cgutils.if_unlikely(builder, builder.icmp_unsigned("!=", out, ir.Constant(I16, 0))):
                        eg = builder.call(gth, [splat(0), ep, sv, ir.Constant(VM, [1] * 16), ir.Constant(I32, 4)])
                        builder.store(eg, ev)
                        builder.store(builder.fdiv(one, builder.uitofp(builder.and_(eg, splat(0x1FFF)), F16)), rv)
                    r = builder.load(rv)
                    x = _push_step(V, builder, builder.load(ev), builder.load(vx[h]), pos, bp,
                                   lambda x, f: builder.fptoui(builder.fmul(builder.uitofp(x, F16), r), VN))
                    builder.store(x, vx[h])
            V.put_states(builder, vx, xp)
            return builder.load(pos)
        return sig, codegen
    return _wenc


def _make_tenc16():
    """The loop for 16-bit (joint) symbols: ``(jb, nr, et32, buf, p, xs) -> p``, nr rounds of jb from the last
    round down, et32 (``simd.enc_table``) looked up by scalar loads, x div f by a float32 division;
    the words as ``_make_wenc``'s (``vpcompressw`` and a masked store)."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec(lanes=16)
    ir, cgutils = V.ir, V.cg
    I16, I32, I64, VN = V.I16, V.I32, V.I64, V.VN

    @intrinsic
    def _tenc16(typingctx, jb, nr, et32, buf, p, xs):
        if not all(isinstance(a, types.Array) and a.layout == "C" for a in (jb, et32, buf, xs)):
            return None
        sig = types.int64(jb, nr, et32, buf, p, xs)

        def codegen(context, builder, signature, args):
            jp, ep, bp, xp = (V.data(context, builder, signature, args, k, t)
                              for k, t in ((0, I16), (2, I32), (3, V.I8), (5, VN)))
            vx = V.states(builder, xp, 2)
            pos = cgutils.alloca_once_value(builder, args[4])
            with cgutils.for_range(builder, args[1]) as loop:
                g = builder.mul(builder.sub(builder.sub(args[1], ir.Constant(I64, 1)), loop.index),
                                ir.Constant(I64, 2))
                for h in (1, 0):
                    e = _entries16(V, builder, jp, ep, builder.mul(builder.add(g, ir.Constant(I64, h)),
                                                                  ir.Constant(I64, 16)))
                    x = _push_step(V, builder, e, builder.load(vx[h]), pos, bp, _fdiv_quotient(V, builder))
                    builder.store(x, vx[h])
            V.put_states(builder, vx, xp)
            return builder.load(pos)
        return sig, codegen
    return _tenc16


if SIMD512:
    _wenc = _make_wenc()
    _tenc16 = _make_tenc16()

    @njit(nogil=True, cache=True)
    def enc16(jb, lo, et, buf, p, xl):
        """simd.enc32's rounds for 16-bit symbols (jb: uint16) by _make_tenc16's loop."""
        x32 = states32(xl)
        p = _tenc16(np.ascontiguousarray(jb), np.int64(lo // LANES), enc_table(et), buf, np.int64(p), x32)
        states_back(x32, xl)
        return p

    @njit(nogil=True, cache=True)
    def enc_rounds(syms, lo, et, buf, p, xl):
        """simd.enc32's rounds (see the module's docstring for which loop runs)."""
        if lo <= 0:
            return p
        if syms.itemsize == 2:
            return enc16(syms, lo, et, buf, p, xl)
        if syms.itemsize != 1 or et.size < 512:   # (byte symbols: a table of 256 entries, two u64 each)
            return enc32(syms, lo, et, buf, p, xl)
        et32 = enc_table(et)
        off, tab = window(et32)
        if off < 0:
            return enc32(syms, lo, et, buf, p, xl)
        x32 = states32(xl)
        p = _wenc(syms, np.int64(lo // LANES), tab, et32, buf, np.int64(p), x32, np.int64(off))
        states_back(x32, xl)
        return p
else:
    @njit(nogil=True, cache=True)
    def enc_rounds(syms, lo, et, buf, p, xl):
        return enc32(syms, lo, et, buf, p, xl)
