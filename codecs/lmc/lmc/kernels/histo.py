"""lmc kernels: a plane's symbol counts per sub-stream (``histo4``: h[k, s] += the count of symbol s at positions
i with i % 4 == k), the first pass of every chunk the encoder codes alone.

The plain loop adds one to a counter in memory per byte: a load and a store each, so it runs at about a byte a
cycle whatever the data (the store port is the bound; 8 or 16 tables instead of 4 do not help). The planes that
need counting most, the exponents, are skewed: a few values make nearly all of them. Where the CPU has AVX2
(``simd.SIMD``) and a sample of the plane finds its 16 commonest values covering at least 99% of it, 32 bytes
at a time are compared with those 16 values and each match counted in a byte lane of a vector (one compare and
one subtract per value and vector: no store), the lanes added into wide counters every 255 vectors, and the
bytes that match none of them (a bit mask per vector) counted one by one. The counts are exact either way; the
tests compare them with the plain loop's."""
import numpy as np
from numba import njit

from .intrinsics import ctz64
from .simd import SIMD, _Vec

TOP = 16          # values compared per vector
G = 4             # values per pass over a block
BLOCK = 255       # vectors between two flushes of the byte lanes (a lane counts at most 255)
MIN_N = 4096      # below this the plain loop
SAMPLE = 64       # every 64th byte sampled to choose the values


@njit(nogil=True, cache=True)
def histo4_plain(p, n, h):
    """h[k, s] += count of symbol s at positions i with i % 4 == k (n < 2^32:
    counted in 32-bit tables, ~20% faster on a skewed plane than in h's int64)."""
    t = np.zeros((4, 256), np.uint32)
    n4 = n & ~3
    for i in range(0, n4, 4):
        t[0, p[i]] += 1
        t[1, p[i + 1]] += 1
        t[2, p[i + 2]] += 1
        t[3, p[i + 3]] += 1
    for i in range(n4, n):
        t[i & 3, p[i]] += 1
    for k in range(4):
        for s in range(256):
            h[k, s] += t[k, s]


def _make_cmp16():
    """``_cmp16(p, i0, nvec, syms, acc, masks)``: for the nvec (<= 255) vectors of 32 bytes at p[i0:], lane l of
    acc[j] (uint8[16 * 32]) += the number of those vectors whose byte l is syms[j]; masks[v] (uint32) = the bits
    of vector v's bytes equal to none of syms. The caller guarantees i0 + 32 nvec <= p.size."""
    from numba import types
    from numba.extending import intrinsic

    vec = _Vec()
    ir, cgutils = vec.ir, vec.cg
    I1, I8, I32, I64 = vec.I1, vec.I8, vec.I32, vec.I64
    V = ir.VectorType(I8, 32)
    B = ir.VectorType(I1, 32)

    @intrinsic
    def _cmp16(typingctx, p, i0, nvec, syms, acc, masks):
        sig = types.void(p, i0, nvec, syms, acc, masks)

        def codegen(context, builder, signature, args):
            pp, sp, ap, mp = (vec.data(context, builder, signature, args, k, t)
                              for k, t in ((0, I8), (3, I8), (4, V), (5, I32)))
            zero = ir.Constant(ir.VectorType(I32, 32), [0] * 32)
            zeros = ir.Constant(B, [0] * 32)
            base = builder.gep(pp, [args[1]])
            # TOP / G passes of G values over the block (in L1 by then): with 4 counting vectors and 4 values a
            # pass, LLVM's two-vector unrolled loop stays in the 16 vector registers; with 8 or 16 a pass it
            # spilled to memory every vector (131,072 bytes: 26 us with 4 a pass, 49 with 16, as the plain loop)
            for g in range(TOP // G):
                svec = []
                for j in range(G * g, G * g + G):
                    s = builder.load(builder.gep(sp, [ir.Constant(I64, j)]))
                    u = builder.insert_element(ir.Constant(V, ir.Undefined), s, ir.Constant(I32, 0))
                    svec.append(builder.shuffle_vector(u, u, zero))
                accs = [cgutils.alloca_once_value(builder, builder.load(builder.gep(ap, [ir.Constant(I64, j)]),
                                                                        align=1))
                        for j in range(G * g, G * g + G)]
                with cgutils.for_range(builder, args[2]) as loop:
                    at = builder.gep(base, [builder.mul(loop.index, ir.Constant(I64, 32))])
                    v = builder.load(builder.bitcast(at, ir.PointerType(V)), align=1)
                    hit = zeros
                    for j in range(G):
                        eq = builder.icmp_unsigned("==", v, svec[j])
                        builder.store(builder.sub(builder.load(accs[j]), builder.sext(eq, V)), accs[j])
                        hit = builder.or_(hit, eq)
                    bits = builder.bitcast(hit, I32)
                    mq = builder.gep(mp, [loop.index])
                    if g == 0:
                        builder.store(bits, mq)
                    elif g == TOP // G - 1:
                        builder.store(builder.not_(builder.or_(builder.load(mq), bits)), mq)
                    else:
                        builder.store(builder.or_(builder.load(mq), bits), mq)
                for j in range(G):
                    builder.store(builder.load(accs[j]), builder.gep(ap, [ir.Constant(I64, G * g + j)]), align=1)
            return context.get_dummy_value()
        return sig, codegen
    return _cmp16


if SIMD:
    _cmp16 = _make_cmp16()

    @njit(nogil=True, cache=True)
    def _histo4_top(p, n, h, syms):
        nv = n >> 5
        acc = np.zeros(TOP * 32, np.uint8)
        cnt = np.zeros(TOP * 32, np.int64)
        masks = np.empty(BLOCK, np.uint32)
        v = 0
        while v < nv:
            b = min(BLOCK, nv - v)
            acc[:] = 0
            _cmp16(p, np.int64(v * 32), np.int64(b), syms, acc, masks)
            for q in range(TOP * 32):
                cnt[q] += acc[q]
            for q in range(b):
                m = np.uint64(masks[q])
                while m:
                    i = (v + q) * 32 + ctz64(m)
                    h[i & 3, p[i]] += 1
                    m &= m - np.uint64(1)
            v += b
        for i in range(nv * 32, n):
            h[i & 3, p[i]] += 1
        for j in range(TOP):
            for q in range(32):
                h[q & 3, syms[j]] += cnt[j * 32 + q]
else:
    @njit(nogil=True, cache=True)
    def _histo4_top(p, n, h, syms):   # (never called: SIMD is False)
        histo4_plain(p, n, h)


@njit(nogil=True, cache=True)
def top_values(p, n):
    """The TOP commonest values of every SAMPLE-th byte of p[:n] (all distinct, the rarest possibly never seen)
    and whether they make at least 99% of the sample. A sample with more distinct values than TOP plus the 1%
    it may miss cannot be covered: refused without sorting (a plane of noisy bytes costs the sample only)."""
    c = np.zeros(256, np.int64)
    for i in range(0, n, SAMPLE):
        c[p[i]] += 1
    ns = (n + SAMPLE - 1) // SAMPLE
    distinct = 0
    for v in range(256):
        distinct += c[v] > 0
    if distinct > TOP + ns // 100:
        return np.zeros(TOP, np.uint8), False
    order = np.argsort(-c, kind="mergesort")
    syms = np.empty(TOP, np.uint8)
    cover = 0
    for j in range(TOP):
        syms[j] = order[j]
        cover += c[order[j]]
    return syms, cover * 100 >= 99 * ns


@njit(nogil=True, cache=True)
def histo4(p, n, h):
    """h[k, s] += count of symbol s at positions i with i % 4 == k: by vectors where the CPU has AVX2 and the
    plane is skewed (see the module), else by the plain loop; the same counts."""
    if SIMD and n >= MIN_N:
        syms, skewed = top_values(p, n)
        if skewed:
            _histo4_top(p, n, h, syms)
            return
    histo4_plain(p, n, h)
