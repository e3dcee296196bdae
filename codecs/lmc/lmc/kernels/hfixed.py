"""lmc kernels: the fixed-length code, decoder (``fixed_decode4``) and encoder (``fixed_encode4``). A Huffman
payload whose every symbol of ``lo..hi`` has one length k (then hi - lo + 1 = 2^k; ``hfixed.fixed_code`` chooses
one where Huffman would save at most 1/32 of k bits a symbol) is read and written k bits a symbol with no table
walk: eight symbols of each sub-stream a step as one vector where ``simd.SIMD`` holds (``_make_fixed_groups``,
``_make_fixed_pack``), the scalar loops after them and elsewhere. ``huffman.decode_huff_stream`` and
``huffenc.put_huff`` call them; they give the bytes and statuses of the table walk and of ``huffenc._encode4``
(``tests/test_fixed_code.py``)."""
import numpy as np
from numba import njit

from .intrinsics import ld, load_u64, store_u32
from .base import ERR_PAD, ERR_STREAM, NEAR_RAW_BITS, OK, RANS_MARGIN, _slow_load, nonzero_range
from .simd import SIMD, _Vec


def _rounds(builder, k, c, vs):
    """The three rounds that spread eight k-bit fields (bits 0 .. 8k of a 64-bit lane) to its eight bytes, or
    gather them back: (keep, lane, width) of the halves, the quarters and the bytes, each a ``<4 x i64>``: keep
    the mask of the lower group of fields in each part (4, 2, 1 fields), lane the part's bits (32, 16, 8),
    width the group's bits (4k, 2k, k). Spreading moves the upper group from bit width to bit lane of each
    part; gathering moves it back."""
    one = c(1)
    m1 = builder.sub(builder.shl(one, builder.mul(k, c(4))), one)             # 4 fields
    m2 = builder.sub(builder.shl(one, builder.mul(k, c(2))), one)             # 2 fields, in each half
    m2 = builder.or_(m2, builder.shl(m2, c(32)))
    m3 = builder.sub(builder.shl(one, k), one)                                # 1 field, in each quarter
    m3 = builder.mul(m3, c(0x0001000100010001))
    return [(vs(m1), vs(c(32)), vs(builder.mul(k, c(4)))), (vs(m2), vs(c(16)), vs(builder.mul(k, c(2)))),
            (vs(m3), vs(c(8)), vs(k))]


def _setup(V, builder, k, lo, sp):
    """What the reader and the packer build first: (c, an i64 constant; the bit reversal of a ``<4 x i64>``; the
    three rounds (_rounds); 64 - 8k in the four lanes; lo in the 32 bytes; the four sub-streams' starts from sp,
    an i64*)."""
    ir = V.ir
    V4 = ir.VectorType(V.I64, 4)
    B32 = ir.VectorType(V.I8, 32)

    def c(v):
        return ir.Constant(V.I64, v)

    def vs(x):   # an i64 in the four lanes
        u = builder.insert_element(ir.Constant(V4, ir.Undefined), x, ir.Constant(V.I32, 0))
        return builder.shuffle_vector(u, u, ir.Constant(ir.VectorType(V.I32, 4), [0] * 4))

    rev = V.fn(builder, "llvm.bitreverse.v4i64", V4, [V4])
    u = builder.insert_element(ir.Constant(B32, ir.Undefined), builder.trunc(lo, V.I8), ir.Constant(V.I32, 0))
    vlo = builder.shuffle_vector(u, u, ir.Constant(ir.VectorType(V.I32, 32), [0] * 32))
    return (c, rev, _rounds(builder, k, c, vs), vs(builder.sub(c(64), builder.shl(k, c(3)))), vlo,
            [builder.load(builder.gep(sp, [c(j)])) for j in range(4)])


def _env():
    """What the reader's and the packer's builders start from: (numba's types, its intrinsic decorator, a _Vec,
    llvmlite's ir, cgutils, i8, i64, <4 x i64>, <32 x i8>)."""
    from numba import types
    from numba.extending import intrinsic
    V = _Vec()
    ir = V.ir
    return (types, intrinsic, V, ir, V.cg, V.I8, V.I64, ir.VectorType(V.I64, 4), ir.VectorType(V.I8, 32))


def _make_fixed_groups():
    """``(buf, st, k, lo, out, ng) -> ng``: symbols 0 .. 8 ng - 1 of the four sub-streams of a fixed-length code of
    k bits (sub-stream j at buf[st[j]:]) interleaved into out[:32 ng], eight symbols of each sub-stream a step.
    Group g of a sub-stream is the k bytes at k g (8 k bits: byte-aligned). The four groups' 64-bit words are one
    ``<4 x i64>`` vector: its bits reversed (a field then holds its code's canonical value, the fields in reverse
    order) and shifted down by 64 - 8k, the eight k-bit fields spread to the eight bytes by three rounds of masks
    (halves, quarters, bytes), lo added and the 32 bytes put in output order by one shuffle. Generic LLVM vector
    operations only (no CPU-specific intrinsic). The caller guarantees 8 ng <= every sub-stream's symbols and
    k (ng - 1) + 8 <= every sub-stream's bytes; nothing here checks bounds."""
    types, intrinsic, V, ir, cgutils, I8, I64, V4, B32 = _env()

    @intrinsic
    def _fixed_groups(typingctx, buf, st, k, lo, out, ng):
        sig = types.int64(buf, st, k, lo, out, ng)

        def codegen(context, builder, signature, args):
            bp, sp, op = (V.data(context, builder, signature, args, j, t) for j, t in ((0, I8), (1, I64), (4, I8)))
            k, lo, ng = args[2], args[3], args[5]
            c, rev, rounds, down, vlo, starts = _setup(V, builder, k, lo, sp)
            # output byte 4 jj + j: sub-stream j's symbol jj, in byte 7 - jj of its lane
            perm = ir.Constant(ir.VectorType(V.I32, 32), [8 * (b % 4) + 7 - b // 4 for b in range(32)])
            with cgutils.for_range(builder, ng) as loop:
                off = builder.mul(loop.index, k)
                x = ir.Constant(V4, ir.Undefined)
                for j in range(4):
                    w = builder.load(builder.bitcast(builder.gep(bp, [builder.add(starts[j], off)]),
                                                     ir.PointerType(I64)), align=1)
                    x = builder.insert_element(x, w, ir.Constant(V.I32, j))
                t = builder.lshr(builder.call(rev, [x]), down)
                for keep, lane, width in rounds:   # the upper group of each lane to the lane's upper half
                    t = builder.or_(builder.and_(t, keep), builder.and_(builder.shl(t, builder.sub(lane, width)),
                                                                        builder.shl(keep, lane)))
                b = builder.add(builder.bitcast(t, B32), vlo)
                b = builder.shuffle_vector(b, b, perm)
                dst = builder.gep(op, [builder.shl(loop.index, c(5))])
                builder.store(b, builder.bitcast(dst, ir.PointerType(B32)), align=1)
            return ng
        return sig, codegen
    return _fixed_groups


def _make_fixed_pack():
    """``(p, k, lo, out, st, ng) -> ng``: the inverse of ``_make_fixed_groups``, for the encoder: symbols 0 .. 32 ng
    - 1 of p (symbol i in sub-stream i mod 4) packed into the four sub-streams of a fixed-length code of k bits at
    out[st[j]:], eight symbols of each a step: lo taken off, the 32 bytes put in lane order by one shuffle, the
    fields gathered by the three rounds in reverse, the bits reversed; one 8-byte store a sub-stream, whose last
    8 - k bytes are zero and are written over by the next step. The caller guarantees 32 ng <= p.size, every
    symbol in lo .. lo + 2^k - 1, and k (ng - 1) + 8 <= every sub-stream's bytes; nothing here checks bounds."""
    types, intrinsic, V, ir, cgutils, I8, I64, V4, B32 = _env()

    @intrinsic
    def _fixed_pack(typingctx, p, k, lo, out, st, ng):
        sig = types.int64(p, k, lo, out, st, ng)

        def codegen(context, builder, signature, args):
            pp, op, sp = (V.data(context, builder, signature, args, j, t) for j, t in ((0, I8), (3, I8), (4, I64)))
            k, lo, ng = args[1], args[2], args[5]
            c, rev, rounds, up, vlo, starts = _setup(V, builder, k, lo, sp)
            # lane j's byte b: sub-stream j's symbol 7 - b, input byte 4 (7 - b) + j
            perm = ir.Constant(ir.VectorType(V.I32, 32), [4 * (7 - b % 8) + b // 8 for b in range(32)])
            with cgutils.for_range(builder, ng) as loop:
                src = builder.gep(pp, [builder.shl(loop.index, c(5))])
                b = builder.sub(builder.load(builder.bitcast(src, ir.PointerType(B32)), align=1), vlo)
                t = builder.bitcast(builder.shuffle_vector(b, b, perm), V4)
                for keep, lane, width in reversed(rounds):   # each part's upper group back down to bit width
                    t = builder.or_(builder.and_(t, keep), builder.and_(builder.lshr(t, builder.sub(lane, width)),
                                                                        builder.shl(keep, width)))
                x = builder.call(rev, [builder.shl(t, up)])
                off = builder.mul(loop.index, k)
                for j in range(4):
                    dst = builder.gep(op, [builder.add(starts[j], off)])
                    builder.store(builder.extract_element(x, ir.Constant(V.I32, j)),
                                  builder.bitcast(dst, ir.PointerType(I64)), align=1)
            return ng
        return sig, codegen
    return _fixed_pack


if SIMD:
    _fixed_groups = _make_fixed_groups()
    _fixed_pack = _make_fixed_pack()
else:
    @njit(nogil=True, cache=True)
    def _fixed_groups(buf, st, k, lo, out, ng):   # (never called: SIMD is False)
        return 0

    @njit(nogil=True, cache=True)
    def _fixed_pack(p, k, lo, out, st, ng):   # (never called: SIMD is False)
        return 0


@njit(nogil=True, cache=True)
def fixed_encode4(p, n, k, lo, codes, lens, out, o, sub):
    """huffenc._encode4 for a code whose every length is k over lo .. lo + 2^k - 1 (every symbol of p[:n] in that
    range): the same sub-streams at out[o:] (sizes sub[0..3], exact), eight symbols of each a step as vectors where
    simd.SIMD holds, then symbol by symbol from codes (the reversed canonical codes) and lens. Never writes outside
    [o, o + sum(sub)). Returns the end, or -1 on a size mismatch (an internal error)."""
    st = np.empty(4, np.int64)
    q = o
    for j in range(4):
        st[j] = q
        q += sub[j]
    end = q
    g = 0
    lo_sub = min(min(sub[0], sub[1]), min(sub[2], sub[3]))
    if SIMD and lo_sub >= 8:
        g = _fixed_pack(p, np.int64(k), np.int64(lo), out, st, min((n >> 2) >> 3, (lo_sub - 8) // k + 1))
    for j in range(4):
        q = put_codes(p, 32 * g + j, n, codes, lens, out, st[j] + g * k, np.uint64(0), 0)
        if q != st[j] + sub[j]:
            return -1
    return end


@njit(nogil=True, cache=True, inline="always")
def put_codes(p, i, n, codes, lens, out, q, acc, nb):
    """The codes of symbols p[i], p[i + 4], .. below n (one sub-stream's; lens[c] bits each) appended LSB first
    to the nb pending bits of acc, written a byte at a time at out[q:], the last byte padded with zeros.
    Returns the next position."""
    for e in range(i, n, 4):
        c = p[e]
        acc |= codes[c] << np.uint64(nb)
        nb += lens[c]
        while nb >= 8:
            out[q] = np.uint8(acc & np.uint64(0xFF))
            q += 1
            acc >>= np.uint64(8)
            nb -= 8
    if nb > 0:
        out[q] = np.uint8(acc & np.uint64(0xFF))
        q += 1
    return q


@njit(nogil=True, cache=True)
def fixed_decode4(buf, st, ln, k, dec, out, n, tmp, inter=True):
    """huff_decode4 for a code whose every length is k (hfixed.fixed_code): symbol i of a sub-stream is the
    k bits at bit k * i, looked up in dec (dec[v] for v < 2^k: the symbol whose reversed code is v), with no
    serial walk. The same statuses as huff_decode4 (a sub-stream of c symbols must be (c k + 7) // 8 bytes,
    its padding bits zero), the same symbols in out (or in tmp's sub-stream rows where not inter)."""
    m = (n + 3) >> 2
    r = m + 16
    for j in range(4):
        c = (n + 3 - j) >> 2
        b = c * k
        if (b + 7) >> 3 != ln[j]:
            return ERR_STREAM
        if b & 7 and (buf[st[j] + ln[j] - 1] >> (b & 7)) != 0:
            return ERR_PAD
    t = np.empty(256, np.uint8)
    for v in range(1 << k):
        t[v] = np.uint8(dec[v] & 0xFF)
    mask = np.uint64((1 << k) - 1)
    g = 56 // k   # symbols per 8-byte load (the load's bit offset is < 8, and g k + 7 <= 63)
    q = n >> 2    # symbols every sub-stream has
    # whole groups of g symbols whose 8-byte loads lie inside every sub-stream (the shortest, the last)
    lim = min(q, ((ln[3] - 8) * 8 // k) // g * g) if ln[3] >= 8 else 0
    i = 0
    if SIMD and inter and ln[3] >= 8:
        # groups of eight symbols of every sub-stream as vectors, while each group's 8-byte loads lie inside
        # every sub-stream (group m at byte k m)
        i = 8 * _fixed_groups(buf, st, k, np.int64(t[0]), out, min(q >> 3, (ln[3] - 8) // k + 1))
    if inter:
        while i + g <= lim:
            b = i * k
            x0 = load_u64(buf, st[0] + (b >> 3)) >> np.uint64(b & 7)
            x1 = load_u64(buf, st[1] + (b >> 3)) >> np.uint64(b & 7)
            x2 = load_u64(buf, st[2] + (b >> 3)) >> np.uint64(b & 7)
            x3 = load_u64(buf, st[3] + (b >> 3)) >> np.uint64(b & 7)
            for j in range(g):
                sh = np.uint64(k * j)
                store_u32(out, 4 * (i + j), np.uint32(ld(t, (x0 >> sh) & mask))
                          | (np.uint32(ld(t, (x1 >> sh) & mask)) << 8)
                          | (np.uint32(ld(t, (x2 >> sh) & mask)) << 16)
                          | (np.uint32(ld(t, (x3 >> sh) & mask)) << 24))
            i += g
    # the rest symbol by symbol (a load of up to 8 bytes inside the sub-stream)
    for j in range(4):
        L = ln[j]
        sk = st[j]
        for a in range(i, (n + 3 - j) >> 2):
            b = a * k
            if (b >> 3) + 8 <= L:
                x = load_u64(buf, sk + (b >> 3)) >> np.uint64(b & 7)
            else:
                x = _slow_load(buf, sk, L, b >> 3) >> np.uint64(b & 7)
            s = t[x & mask]
            if inter:
                out[4 * a + j] = s
            else:
                tmp[j * r + a] = s
    return OK


@njit(nogil=True, cache=True)
def _plane_sample(p, n):
    """near_raw's sample of p[:n] (n >= 64): the counts of one 64-byte block in every 1024 bytes, and their number."""
    t = np.zeros(256, np.int64)
    m = 0
    for b0 in range(0, n - 63, 1024):
        for i in range(b0, b0 + 64):
            t[p[i]] += 1
        m += 64
    return t, m


@njit(nogil=True, cache=True)
def _sample_entropy(t, m):
    """The order-0 entropy of the sample counts t (m bytes), Miller-Madow corrected."""
    k = 0
    acc = 0.0
    for c in range(256):
        if t[c] > 0:
            k += 1
            acc += t[c] * np.log2(np.float64(t[c]))
    return np.log2(np.float64(m)) - acc / m + (k - 1) / (2.0 * m * np.log(2.0))


@njit(nogil=True, cache=True)
def near_fixed(p, n, t, ent):
    """(k, lo) where plane p[:n] is sure to take the fixed-length code of k bits over lo .. lo + 2^k - 1
    (fixed_code), else (0, 0): every byte of the plane in such a range, 2 <= k < 8 (exact: the plane's least and
    greatest byte), and ent, the entropy of near_raw's sample t (_sample_entropy), within NEAR_RAW_BITS of k
    bits, so that no Huffman code of it saves more than about 1/40 of k bits (fixed_code asks 1/32). Where it
    holds the plane is not counted (what its counting and Huffman coding cost: 0.6 ns an element of a second
    moment's sign and mantissa plane)."""
    lo, hi = nonzero_range(t, 0, 256)
    k = 2
    while (1 << k) < hi - lo + 1:
        k += 1
    if k >= 8 or ent < k - NEAR_RAW_BITS:
        return 0, 0
    mn = np.int64(255)
    mx = np.int64(0)
    for i in range(n):   # (branch-free: vectorizes)
        mn = min(mn, np.int64(p[i]))
        mx = max(mx, np.int64(p[i]))
    if mx - mn + 1 > 1 << k:
        return 0, 0
    return k, min(mn, 256 - (1 << k))


@njit(nogil=True, cache=True)
def fixed_code(freq, lens):
    """Where the symbols present lie in a range of 2^k < 256 values and the Huffman code lens saves at most
    1/RANS_MARGIN of a k-bit code's bits, lens becomes the k-bit code: every symbol of the range (present or
    not, inside 0..255) at length k, a complete code that the decoder reads k bits a symbol without a table
    walk (hfixed.fixed_decode4; the plane of a non-negative tensor's sign and 7 mantissa bits: Huffman saved
    0.3% of it and took 0.5 ns an element to decode). A code of 256 symbols is left alone: the raw stream is
    its fixed code, chosen where Huffman saves nothing. Returns whether lens changed."""
    lo, hi = nonzero_range(freq, 0, 256)
    k = 1
    while (1 << k) < hi - lo + 1:
        k += 1
    if k >= 8:
        return False
    tot = 0
    bits = 0
    for c in range(lo, hi + 1):
        tot += freq[c]
        bits += freq[c] * np.int64(lens[c])
    if k * tot > bits + bits // RANS_MARGIN:
        return False
    lo = min(lo, 256 - (1 << k))
    for c in range(256):
        lens[c] = np.uint8(k) if lo <= c < lo + (1 << k) else np.uint8(0)
    return True
