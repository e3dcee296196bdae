"""lmc kernels: the predicted-exponent mode's decoder pass, ``exp_restore`` (the inverse of
``streams.exp_residuals``; FORMAT.md, "Predicted-exponent chunk"): each exponent is its residual plus the LOCO-I
median of its left neighbour (4 back), its up neighbour (w back, w the row length) and its up-left one (w + 4
back), taken modulo 256.

The left neighbour 4 back makes four chains (element i in chain i mod 4), each serial: the pass is bound by the
latency of one step, not by its instructions.  Where ``simd.SIMD`` holds, one step of the four chains is one
``<4 x i8>`` vector (``_make_steps4``) and the median is taken in a form whose path from the left neighbour is three
byte operations long, and the residual's addition a fourth: with ``a`` the left, ``b`` the up and ``c`` the
up-left neighbour,

    median(a, b, a + b - c) = min(max(a, b), a +sat (b -sat c))   where b >= c,
                              max(min(a, b), a -sat (c -sat b))   where b < c,

(``+sat``, ``-sat``: unsigned byte addition and subtraction that saturate at 255 and 0; ``b -sat c`` and the
choice come from the row above, off the chain; the two operations on ``a`` in each line run side by side, then
the min or max, then the choice).  ``tests/test_restore.py`` checks the identity on all 2^24 byte triples, and
the vector loop against the scalar one.  On this project's 2-core AMD EPYC the pass took 0.40 ns an element
against 1.17 for the scalar loop (a 131,072-element chunk, one thread) with the earlier form
``max(a, min(a +sat (b -sat c), b))`` / ``min(a, max(a -sat (c -sat b), b))``, whose three operations on the
chain ran one after another.  Elsewhere, and where w < 4 (the
up neighbours of a step's elements are then inside the step), the scalar loop runs.

A step waits on the one before whatever the vector's width, so two planes' chains share one: ``exp_restore2``
restores two chunks' exponents (``kernels.pair``) in ``<8 x i8>`` steps, 0.26 ns an element against 0.48 for
each alone (Zen 5)."""

import numpy as np
from numba import njit

from .intrinsics import ld
from .intrinsics import st as put
from .simd import SIMD


@njit(nogil=True, cache=True)
def _med(a, b, c):
    """The LOCO-I median of a, b and a + b - c, branch-free."""
    return max(min(a, b), min(max(a, b), a + b - c))


@njit(nogil=True, cache=True)
def scalar_steps(p, i, n, w):
    """The four chains from element i (w + 4 <= i, 4 <= i) while i + 4 <= n, for any w >= 1; returns the next
    element.  The chains' last values are kept in registers; each element is stored at once (with w < 4 the next
    element's up neighbour is this one)."""
    # (ld / put: no wrap-around test of each index for a negative value, which Numba adds where it cannot
    # prove an index non-negative, as here i - w: half the pass's time; every index below is in 0 .. n - 1)
    a0 = np.int32(ld(p, i - 4))
    a1 = np.int32(ld(p, i - 3))
    a2 = np.int32(ld(p, i - 2))
    a3 = np.int32(ld(p, i - 1))
    while i + 4 <= n:
        u = i - w
        a0 = (np.int32(ld(p, i)) + _med(a0, np.int32(ld(p, u)), np.int32(ld(p, u - 4)))) & 255
        put(p, i, np.uint8(a0))
        a1 = (np.int32(ld(p, i + 1)) + _med(a1, np.int32(ld(p, u + 1)), np.int32(ld(p, u - 3)))) & 255
        put(p, i + 1, np.uint8(a1))
        a2 = (np.int32(ld(p, i + 2)) + _med(a2, np.int32(ld(p, u + 2)), np.int32(ld(p, u - 2)))) & 255
        put(p, i + 2, np.uint8(a2))
        a3 = (np.int32(ld(p, i + 3)) + _med(a3, np.int32(ld(p, u + 3)), np.int32(ld(p, u - 1)))) & 255
        put(p, i + 3, np.uint8(a3))
        i += 4
    return i


def _make_steps4(two=False):
    """``(p, i, k, w) -> i + 4 k``: k steps of the four chains from element i, one ``<4 x i8>`` vector a step
    (the caller guarantees w >= 4, i >= w + 4 and i + 4 k <= p.size; nothing here checks bounds).  two:
    ``(p, q, i, k, w)``, the same steps of two planes with the same row length side by side in one ``<8 x i8>``
    vector (i + 4 k <= q.size too): their chains are independent, so a step of both takes the time of one."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    V4 = ir.VectorType(I8, 4)
    L = 8 if two else 4
    VL = ir.VectorType(I8, L)
    P4 = ir.PointerType(V4)

    def codegen(context, builder, signature, args):
        np_ = 2 if two else 1
        bases = [builder.bitcast(context.make_array(signature.args[h])(context, builder, args[h]).data,
                                 ir.PointerType(I8)) for h in range(np_)]
        i0, k, w = args[np_], args[np_ + 1], args[np_ + 2]
        sat = {op: cgutils.get_or_insert_function(builder.module, ir.FunctionType(VL, [VL, VL]),
                                                  f"llvm.{op}.sat.v{L}i8") for op in ("uadd", "usub")}

        def load(j):
            vs = [builder.load(builder.bitcast(builder.gep(b, [j]), P4), align=1) for b in bases]
            if not two:
                return vs[0]
            return builder.shuffle_vector(vs[0], vs[1], ir.Constant(ir.VectorType(I32, 8), list(range(8))))

        def store(v, j):
            for h, b in enumerate(bases):
                part = v if not two else builder.shuffle_vector(
                    v, v, ir.Constant(ir.VectorType(I32, 4), list(range(4 * h, 4 * h + 4))))
                builder.store(part, builder.bitcast(builder.gep(b, [j]), P4), align=1)

        def umin(x, y):
            return builder.select(builder.icmp_unsigned("<", x, y), x, y)

        def umax(x, y):
            return builder.select(builder.icmp_unsigned(">", x, y), x, y)

        left = cgutils.alloca_once_value(builder, load(builder.sub(i0, ir.Constant(I64, 4))))
        with cgutils.for_range(builder, k) as loop:
            i = builder.add(i0, builder.shl(loop.index, ir.Constant(I64, 2)))
            u = builder.sub(i, w)
            b = load(u)
            c = load(builder.sub(u, ir.Constant(I64, 4)))
            r = load(i)
            a = builder.load(left)
            up = umin(umax(a, b), builder.call(sat["uadd"], [a, builder.call(sat["usub"], [b, c])]))
            down = umax(umin(a, b), builder.call(sat["usub"], [a, builder.call(sat["usub"], [c, b])]))
            y = builder.add(r, builder.select(builder.icmp_unsigned(">", c, b), down, up))
            store(y, i)
            builder.store(y, left)
        return builder.add(i0, builder.shl(k, ir.Constant(I64, 2)))

    if two:
        @intrinsic
        def _steps8(typingctx, p, q, i0, k, w):
            return types.int64(p, q, i0, k, w), codegen
        return _steps8

    @intrinsic
    def _steps4(typingctx, p, i0, k, w):
        return types.int64(p, i0, k, w), codegen
    return _steps4


if SIMD:
    _steps4 = _make_steps4()
    _steps8 = _make_steps4(True)

    @njit(nogil=True, cache=True)
    def vector_steps(p, i, n, w):
        """scalar_steps for w >= 4, one vector a step (the same bytes)."""
        return _steps4(p, np.int64(i), np.int64((n - i) >> 2), np.int64(w))

    @njit(nogil=True, cache=True)
    def pair_steps(p, q, i, m, w):
        """vector_steps of two planes side by side while i + 4 <= m (m <= both sizes; w >= 4)."""
        return _steps8(p, q, np.int64(i), np.int64((m - i) >> 2), np.int64(w))
else:
    vector_steps = scalar_steps

    @njit(nogil=True, cache=True)
    def pair_steps(p, q, i, m, w):   # (never called: PAIR is False)
        return i

PAIR = SIMD   # exp_restore2 takes two planes' chains side by side


@njit(nogil=True, cache=True)
def _head(p, n, w):
    """The elements before w + 4 (the left neighbour alone); returns w + 4 or n."""
    lim = min(w + 4, n)
    for i in range(4, lim):
        p[i] = np.uint8((np.int32(p[i]) + np.int32(p[i - 4])) & 255)
    return lim


@njit(nogil=True, cache=True)
def _rest(p, i, n, w):
    """The elements from i (>= w + 4) on."""
    if i < n:
        i = vector_steps(p, i, n, w) if w >= 4 else scalar_steps(p, i, n, w)
    for j in range(i, n):
        p[j] = np.uint8((np.int32(p[j]) + _med(np.int32(p[j - 4]), np.int32(p[j - w]),
                                                np.int32(p[j - w - 4]))) & 255)


@njit(nogil=True, cache=True)
def exp_restore(p, n, w):
    """Undo exp_residuals in place (p[:n] holds the residuals; w >= 1)."""
    _rest(p, _head(p, n, w), n, w)


@njit(nogil=True, cache=True)
def exp_restore2(p, n, q, m, w):
    """exp_restore of two planes with the same row length, p[:n] and q[:m]: where PAIR and w >= 4, their chains
    run side by side (pair_steps) up to the shorter one's end, then each alone (the same bytes)."""
    a = _head(p, n, w)
    b = _head(q, m, w)
    if PAIR and w >= 4 and a < n and b < m:
        a = pair_steps(p, q, a, min(n, m), w)
        b = a
    _rest(p, a, n, w)
    _rest(q, b, m, w)
