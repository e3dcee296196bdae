"""Would more rANS lanes make coding with a reference fast? (issue 21, target 2: a measurement, not a codec mode)

lmc's temporal mode (coding against the previous checkpoint) spends most of its decode in one loop: a rANS decoder
with 4 interleaved states sharing one stream of 16-bit words, a table lookup per symbol under the symbol's context,
and a data-dependent renormalisation. Issue 21 asks for that mode at half the speed of coding alone; it runs at
0.12-0.27x. The usual way out (SIMD rANS decoders) is many states whose renormalisations do not depend on each
other: each lane reads its own word stream, so a lane's step is the same branch-free arithmetic as every other
lane's and a compiler can turn the lanes into vector lanes (gathers for the table and the words).

This probe measures that on the temporal mode's own symbols: per 128 Ki-element chunk of a checkpoint pair (every
tensor of at least 65,536 elements, cast to bf16, R -> S), the joint (context, symbol) stream lmc's encoder makes,
its context tables, then

* ``4 states, shared stream``: lmc's encoder and decoder (``_krans._tenc`` / ``_tdsyms``), symbols only;
* ``N lanes, own streams`` (N = 8, 16, 32, 64): symbol i in lane i mod N, each lane a rANS stream of its own (32-bit
  state, 16-bit words, the same 12-bit tables), written back to back after a table of lane offsets; the decoder
  steps all N lanes per round, branch-free, each lane loading a word from its own stream and keeping it or not;
* the same with 32-bit words (states in [2^31, 2^63)): a lane's word is then one 32-bit load, which AVX gathers
  can do (they cannot gather 16-bit values);
* the 16-bit-word lanes (N = 16, 32, 64) stepped in AVX2 vectors of 8 lanes, written as LLVM IR through numba's
  ``@intrinsic``: the table entries and the words are gathered (``llvm.x86.avx2.gather.d.d.256``, a word only
  where its lane renormalises), states and word offsets stay in vector registers (only where the CPU has AVX2);

and reports the bytes (the lanes pay 4 bytes of state each and a partial word) and the one-thread decode speed
of the symbols, beside lmc's whole alone decode of the same tensors (S alone) and its whole decode with the
reference (S against R). Whether the lane loop vectorises is read from the compiled code (AVX gathers). Usage:

    python codecs/lmc/rans_lanes_probe.py SERIES_DIR [--pair 950:1000] [--repeat 5] [--lanes 8,16,32,64]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from numba import njit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmc  # noqa: E402
from lmc._intrinsics import load_u16, load_u32, store_u16, store_u32  # noqa: E402
from lmc._kbase import LAYOUT_BF16, NCTX, PROB_SCALE, RANS_L  # noqa: E402
from lmc._krans import build_rans_dtab  # noqa: E402
from lmc._krans import _enc_entry, _tdsyms, _tenc  # noqa: E402
from lmc._ktemporal import temporal_base, temporal_count, temporal_estimate, temporal_hist  # noqa: E402
from delta_probe import best  # noqa: E402  (best of `repeat` calls, seconds)

CHUNK = 131072
KS = 33  # bf16: 2W + 1 symbols per context


def load_pair(series, r, s, min_el=65536):
    import ml_dtypes
    from safetensors.numpy import load_file
    a = load_file(os.path.join(series, f"checkpoint-{r}", "model.safetensors"))
    b = load_file(os.path.join(series, f"checkpoint-{s}", "model.safetensors"))
    out = []
    for k, v in b.items():
        if v.dtype == np.float32 and v.size >= min_el:
            out.append((a[k].astype(ml_dtypes.bfloat16), v.astype(ml_dtypes.bfloat16)))
    return out


def chunk_symbols(x, r):
    """The temporal mode's per-chunk data: (n, jb joint symbols, cb context table offsets, syms, f, cm, dtab, et)."""
    xb, rb = x.reshape(-1).view(np.uint8), r.reshape(-1).view(np.uint8)
    n = x.size
    E = temporal_base(rb, 0, n, LAYOUT_BF16)
    jb = np.empty(n, np.uint16)
    low = np.empty(n, np.uint32)
    th = np.empty(4 * NCTX * 65, np.int32)
    temporal_count(xb, rb, 0, n, LAYOUT_BF16, E, jb, low, th)
    hist = np.empty(NCTX * 256, np.int64)
    temporal_hist(th, 16, hist)
    f = np.zeros(NCTX * 256, np.int64)
    cm = np.zeros(NCTX * 256, np.int64)
    _, cmask = temporal_estimate(hist, f, cm, 16)
    dtab = np.zeros(NCTX * PROB_SCALE, np.uint32)
    et = np.zeros(2 * NCTX * KS, np.uint64)
    for c in range(NCTX):
        if cmask >> c & 1:
            build_rans_dtab(f, cm, c << 8, dtab, c << 12)
            for s in range(KS):
                if f[(c << 8) + s] > 0:
                    _enc_entry(f[(c << 8) + s], cm[(c << 8) + s], 0, et, c * KS + s)
    ctx = (jb // KS).astype(np.uint16)
    syms = (jb % KS).astype(np.uint8)
    return n, jb, (ctx << 12).astype(np.uint16), syms, et, dtab


@njit(nogil=True, cache=True)
def _dsym(dtab, c, xl, out, i):
    """One rANS decode step of state xl with the context table at dtab[c:] (lmc's 12-bit tables): its symbol into
    out[i]; returns the state before renormalisation."""
    e = np.int64(dtab[np.int64(c) + (xl & 4095)])
    out[i] = e & 255
    return (((e >> 8) & 4095) + 1) * (xl >> 12) + (e >> 20)


@njit(nogil=True, cache=True)
def _renc_lane(x, fs, bias, buf, p):
    """One rANS encode step of a lane (as lmc's: x' = (x div f) * 4096 + x mod f + cum), pushing at most one
    16-bit word below buf[p]; returns (x, p)."""
    if x >= (fs << 20):
        p -= 2
        store_u16(buf, p, np.uint16(x & 0xFFFF))
        x >>= 16
    return (x // fs) * 4096 + (x % fs) + bias, p


@njit(nogil=True, cache=True)
def encode_lanes(jb, n, N, et, out):
    """N lane streams of jb[0:n] (symbol i in lane i % N) into out: u32 offsets of the N + 1 lane ends (relative
    to the table's end), then each lane's stream (its u32 final state, then its words in decoding order).
    Returns the total length."""
    tmp = np.empty(2 * (n // N + 2) + 8, np.uint8)
    o = 4 * (N + 1)
    for lane in range(N):
        p = tmp.size
        x = np.int64(RANS_L)
        last = lane + ((n - 1 - lane) // N) * N if n > lane else -1
        i = last
        while i >= 0:
            j = np.int64(jb[i])
            info = np.int64(et[2 * j + 1])
            fs = info >> 32
            cum = (info & 8191)
            if fs == 1:
                cum -= PROB_SCALE - 1   # (lmc's table: bias for f = 1 includes 4095)
            x, p = _renc_lane(x, fs, cum, tmp, p)
            i -= N
        L = tmp.size - p
        store_u32(out, 4 * lane, np.uint32(o - 4 * (N + 1)))
        store_u32(out, o, np.uint32(x))
        out[o + 4:o + 4 + L] = tmp[p:]
        o += 4 + L
    store_u32(out, 4 * N, np.uint32(o - 4 * (N + 1)))
    return o


@njit(nogil=True)
def decode_lanes(blob, n, N, cb, dtab, out, x, ptr):
    """Decode the N lane streams (blob as encode_lanes wrote it, with >= 2 bytes of padding after the end) into
    out[0:n]; x, ptr: int64[N] scratch.  Full rounds branch-free (a lane always loads the word at its pointer and
    keeps it or not); the last partial round per lane.  Returns 0, or 1 where a lane's stream does not end
    exactly in the initial state."""
    base = 4 * (N + 1)
    for lane in range(N):
        s = base + np.int64(load_u32(blob, 4 * lane))
        x[lane] = np.int64(load_u32(blob, s))
        ptr[lane] = s + 4
    rounds = n // N
    for g in range(rounds):
        i0 = g * N
        for lane in range(N):
            xl = x[lane]
            xl = _dsym(dtab, cb[i0 + lane], xl, out, i0 + lane)
            q = ptr[lane]
            w = np.int64(blob[q]) | (np.int64(blob[q + 1]) << 8)
            k = np.int64(xl < RANS_L)
            x[lane] = (xl << (k << 4)) | (w & -k)
            ptr[lane] = q + (k << 1)
    for i in range(rounds * N, n):
        lane = i - rounds * N
        xl = x[lane]
        xl = _dsym(dtab, cb[i], xl, out, i)
        if xl < RANS_L:
            xl = (xl << 16) | np.int64(load_u16(blob, ptr[lane]))
            ptr[lane] += 2
        x[lane] = xl
    bad = 0
    for lane in range(N):
        end = base + np.int64(load_u32(blob, 4 * (lane + 1)))
        if x[lane] != RANS_L or ptr[lane] != end:
            bad = 1
    return bad


def vectorised(fn):
    """Whether the compiled decoder uses AVX gathers (the lane loop vectorised). Numba cannot inspect cached code:
    a cached kernel (lmc's own decoder) is compiled again here, uncached, for its first signature."""
    if type(fn._cache).__name__ != "NullCache":
        sig = fn.signatures[0]
        fn = njit(nogil=True)(fn.py_func)
        fn.compile(sig)
    asm = "".join(fn.inspect_asm().values())
    return any(g in asm for g in ("vpgatherdd", "vpgatherqq", "vpgatherdq", "vpgatherqd"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("series")
    ap.add_argument("--pair", default="950:1000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--lanes", default="8,16,32,64")
    a = ap.parse_args()
    r, s = (int(v) for v in a.pair.split(":"))
    lanes = [int(v) for v in a.lanes.split(",")]
    pairs = load_pair(a.series, r, s)
    chunks = []
    for rt, st in pairs:
        rf, sf = rt.reshape(-1), st.reshape(-1)
        for c0 in range(0, sf.size, CHUNK):
            chunks.append(chunk_symbols(sf[c0:c0 + CHUNK], rf[c0:c0 + CHUNK]))
    n_all = sum(c[0] for c in chunks)
    mib = 2 * n_all / 2**20
    print(f"{a.series} {r} -> {s}: bf16 weights, {len(pairs)} tensors, {n_all} elements ({mib:.1f} MiB), "
          f"{len(chunks)} chunks of <= {CHUNK}; one thread, best of {a.repeat}")
    # lmc itself: whole decodes, alone and with the reference
    blobs_a = [lmc.compress(st, threads=1) for _, st in pairs]
    blobs_t = [lmc.compress(st, reference=rt, threads=1) for rt, st in pairs]
    ta = best(lambda: [lmc.decompress(b, threads=1) for b in blobs_a], a.repeat)
    tt = best(lambda: [lmc.decompress(b, reference=rt, threads=1) for b, (rt, _) in zip(blobs_t, pairs)], a.repeat)
    print(f"lmc {lmc.__version__} whole decode, S alone: {mib / ta:.0f} MiB/s; S against R: {mib / tt:.0f} MiB/s "
          f"({ta / tt:.2f}x of alone); ratio alone {2 * n_all / sum(map(len, blobs_a)):.4f}, "
          f"with R {2 * n_all / sum(map(len, blobs_t)):.4f}")
    # 4 states, shared stream (lmc's)
    enc4 = []
    for n, jb, cb, syms, et, dtab in chunks:
        buf = np.zeros(2 * n + 16, np.uint8)
        p = _tenc(jb, n, et, buf)
        enc4.append(np.ascontiguousarray(buf[p:]))
    outs = [np.empty(c[0], np.uint8) for c in chunks]

    def dec4():
        for (n, jb, cb, syms, et, dtab), b, o in zip(chunks, enc4, outs):
            if _tdsyms(b, 0, b.size, cb, n, dtab, o) != 0:
                raise SystemExit("4-state decode failed")
    dec4()
    for c, o in zip(chunks, outs):
        assert (o == c[3]).all()
    t4 = best(dec4, a.repeat)
    b4 = sum(b.size for b in enc4)
    print("| coding | rANS bytes | vs 4 states | symbols MiB/s | vs 4 states | vs lmc alone decode | vectorised |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print(f"| 4 states, shared stream (lmc) | {b4} | 1.0000 | {mib / t4:.0f} | 1.00x | {ta / t4:.2f}x | "
          f"{'yes' if vectorised(_tdsyms) else 'no'} |")

    def variant(label, blobs, decode_one, nbytes, vec):
        """Decode every chunk's blob with decode_one(chunk, blob, out) (0: ok), check the symbols, time it and
        print the row."""
        def dec():
            for c, b, o in zip(chunks, blobs, outs):
                if decode_one(c, b, o) != 0:
                    raise SystemExit(f"{label}: decode failed")
        dec()
        for c, o in zip(chunks, outs):
            assert (o == c[3]).all(), label
        t = best(dec, a.repeat)
        print(f"| {label} | {nbytes} | {nbytes / b4:.4f} | {mib / t:.0f} | {t4 / t:.2f}x | {ta / t:.2f}x | {vec} |")

    for N in lanes:
        x = np.empty(N, np.int64)
        ptr = np.empty(N, np.int64)
        encN = []
        for n, jb, cb, syms, et, dtab in chunks:
            out = np.zeros(4 * (N + 1) + 2 * n + 8 * N + 64, np.uint8)
            L = encode_lanes(jb, n, N, et, out)
            encN.append(np.ascontiguousarray(out[:L + 2]))   # (+2: the branch-free loads' padding)
        bN = sum(b.size - 2 for b in encN)
        variant(f"{N} lanes, own streams", encN, lambda c, b, o: decode_lanes(b, c[0], N, c[2], c[5], o, x, ptr),
                bN, "yes" if vectorised(decode_lanes) else "no")
        enc32 = []
        for n, jb, cb, syms, et, dtab in chunks:
            out = np.zeros(N + 1 + n // 2 + 4 * N + 16, np.uint32)
            L = encode_lanes32(jb, n, N, et, out)
            enc32.append(np.ascontiguousarray(out[:L + 1]))   # (+1 word: the branch-free loads' padding)
        variant(f"{N} lanes, own streams, 32-bit words", enc32,
                lambda c, b, o: decode_lanes32(b, c[0], N, c[2], c[5], o, x, ptr),
                sum(4 * (b.size - 1) for b in enc32), "yes" if vectorised(decode_lanes32) else "no")
        if N in (16, 32, 64) and _avx2():
            encV = [np.concatenate([b[:-2], np.zeros(4, np.uint8)]) for b in encN]   # (4 bytes of padding)
            xs = np.empty(N, np.uint32)
            ps = np.empty(N, np.int32)
            variant(f"{N} lanes, own streams, AVX2 vectors (LLVM IR by hand)", encV,
                    lambda c, b, o: decode_lanes_avx2(b, c[0], N, c[2], c[5], o, xs, ps), bN, "yes")


# --- variant: 32-bit words (states in [2^31, 2^63)), so a lane's word is one 32-bit gather ---------------------
L31 = 1 << 31


@njit(nogil=True, cache=True)
def encode_lanes32(jb, n, N, et, out):
    """As encode_lanes with 32-bit words: lane ends as word indexes (u32) after a table of N + 1 words."""
    tmp = np.empty(n // N + 4, np.uint32)
    o = N + 1
    for lane in range(N):
        p = tmp.size
        x = np.int64(L31)
        i = lane + ((n - 1 - lane) // N) * N if n > lane else -1
        while i >= 0:
            j = np.int64(jb[i])
            info = np.int64(et[2 * j + 1])
            fs = info >> 32
            cum = info & 8191
            if fs == 1:
                cum -= PROB_SCALE - 1
            if (x >> 51) >= fs:    # (x >= f * 2^51 without overflowing for f = 4096)
                p -= 1
                tmp[p] = np.uint32(x & 0xFFFFFFFF)
                x >>= 32
            x = (x // fs) * 4096 + (x % fs) + cum
            i -= N
        L = tmp.size - p
        out[lane] = np.uint32(o)
        out[o] = np.uint32(x & 0xFFFFFFFF)
        out[o + 1] = np.uint32(x >> 32)
        out[o + 2:o + 2 + L] = tmp[p:]
        o += 2 + L
    out[N] = np.uint32(o)
    return o


@njit(nogil=True)
def decode_lanes32(w, n, N, cb, dtab, out, x, ptr):
    """Decode encode_lanes32's streams (w: uint32 words, >= 1 word of padding after the end)."""
    for lane in range(N):
        s = np.int64(w[lane])
        x[lane] = np.int64(w[s]) | (np.int64(w[s + 1]) << 32)
        ptr[lane] = s + 2
    rounds = n // N
    for g in range(rounds):
        i0 = g * N
        for lane in range(N):
            xl = x[lane]
            xl = _dsym(dtab, cb[i0 + lane], xl, out, i0 + lane)
            q = ptr[lane]
            k = np.int64(xl < L31)
            x[lane] = (xl << (k << 5)) | (np.int64(w[q]) & -k)
            ptr[lane] = q + k
    for i in range(rounds * N, n):
        lane = i - rounds * N
        xl = x[lane]
        xl = _dsym(dtab, cb[i], xl, out, i)
        if xl < L31:
            xl = (xl << 32) | np.int64(w[ptr[lane]])
            ptr[lane] += 1
        x[lane] = xl
    bad = 0
    for lane in range(N):
        if x[lane] != L31 or ptr[lane] != np.int64(w[lane + 1]):
            bad = 1
    return bad


# --- variant: the same 16-bit-word lanes stepped in AVX2 vectors (8 lanes per vector, 2 or 4 vectors), written as
# LLVM IR through numba's @intrinsic: the table and the words are gathered with llvm.x86.avx2.gather.d.d.256 (base +
# index * scale, a lane loads only where its mask is set), states and word offsets stay in vector registers ----------
def _avx2():
    import llvmlite.binding as ll
    return bool(ll.get_host_cpu_features().get("avx2"))


def _make_rounds(H):
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
    I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    V8 = ir.VectorType(I32, 8)

    def splat(v):
        return ir.Constant(V8, [v] * 8)

    def gather(builder, base, idx, mask, scale):
        fnty = ir.FunctionType(V8, [V8, ir.PointerType(I8), V8, V8, I8])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx2.gather.d.d.256")
        return builder.call(fn, [splat(0), base, idx, mask, ir.Constant(I8, scale)])

    @intrinsic
    def rounds_fn(typingctx, blob, cb, dtab, out, xs, ps, rounds):
        """`rounds` rounds of 8H lanes: xs uint32[8H] states, ps int32[8H] byte offsets of each lane's next word
        in blob (updated in place); symbol g * 8H + lane to out."""
        sig = types.void(blob, cb, dtab, out, xs, ps, rounds)

        def codegen(context, builder, signature, args):
            def data(k, t):
                return builder.bitcast(context.make_array(signature.args[k])(context, builder, args[k]).data, t)
            bp, cbp = data(0, ir.PointerType(I8)), data(1, ir.PointerType(I16))
            dp, op = data(2, ir.PointerType(I8)), data(3, ir.PointerType(I8))
            xp, pp = data(4, ir.PointerType(V8)), data(5, ir.PointerType(V8))
            vx = [cgutils.alloca_once_value(builder, builder.load(builder.gep(xp, [ir.Constant(I32, h)]), align=4))
                  for h in range(H)]
            vp = [cgutils.alloca_once_value(builder, builder.load(builder.gep(pp, [ir.Constant(I32, h)]), align=4))
                  for h in range(H)]
            with cgutils.for_range(builder, args[6]) as loop:
                g = builder.mul(loop.index, ir.Constant(I64, 8 * H))
                for h in range(H):
                    i0 = builder.add(g, ir.Constant(I64, 8 * h))
                    cbv = builder.zext(builder.load(builder.bitcast(builder.gep(cbp, [i0]),
                                                                    ir.PointerType(ir.VectorType(I16, 8))), align=2), V8)
                    x, p = builder.load(vx[h]), builder.load(vp[h])
                    e = gather(builder, dp, builder.add(cbv, builder.and_(x, splat(4095))), splat(-1), 4)
                    builder.store(builder.trunc(e, ir.VectorType(I8, 8)),
                                  builder.bitcast(builder.gep(op, [i0]), ir.PointerType(ir.VectorType(I8, 8))), align=1)
                    f = builder.add(builder.and_(builder.lshr(e, splat(8)), splat(4095)), splat(1))
                    x = builder.add(builder.mul(f, builder.lshr(x, splat(12))), builder.lshr(e, splat(20)))
                    m = builder.icmp_unsigned("<", x, splat(RANS_L))
                    msk = builder.sext(m, V8)
                    w = builder.and_(gather(builder, bp, p, msk, 1), splat(0xFFFF))
                    builder.store(builder.select(m, builder.or_(builder.shl(x, splat(16)), w), x), vx[h])
                    builder.store(builder.add(p, builder.and_(msk, splat(2))), vp[h])
            for h in range(H):
                builder.store(builder.load(vx[h]), builder.gep(xp, [ir.Constant(I32, h)]), align=4)
                builder.store(builder.load(vp[h]), builder.gep(pp, [ir.Constant(I32, h)]), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return rounds_fn


if _avx2():
    _rounds16 = _make_rounds(2)
    _rounds32 = _make_rounds(4)
    _rounds64 = _make_rounds(8)

    @njit(nogil=True)
    def decode_lanes_avx2(blob, n, N, cb, dtab, out, xs, ps):
        """decode_lanes for N = 16, 32 or 64 (encode_lanes's layout, >= 4 bytes of padding after the end: a lane's
        word is a 4-byte gather), the full rounds in AVX2 vectors; xs uint32[N], ps int32[N] scratch."""
        base = 4 * (N + 1)
        for lane in range(N):
            s = base + np.int64(load_u32(blob, 4 * lane))
            xs[lane] = load_u32(blob, s)
            ps[lane] = np.int32(s + 4)
        rounds = n // N
        if N == 16:
            _rounds16(blob, cb, dtab, out, xs, ps, np.int64(rounds))
        elif N == 32:
            _rounds32(blob, cb, dtab, out, xs, ps, np.int64(rounds))
        else:
            _rounds64(blob, cb, dtab, out, xs, ps, np.int64(rounds))
        for i in range(rounds * N, n):
            lane = i - rounds * N
            xl = np.int64(xs[lane])
            xl = _dsym(dtab, cb[i], xl, out, i)
            if xl < RANS_L:
                xl = (xl << 16) | np.int64(load_u16(blob, np.int64(ps[lane])))
                ps[lane] += 2
            xs[lane] = np.uint32(xl)
        bad = 0
        for lane in range(N):
            if np.int64(xs[lane]) != RANS_L or np.int64(ps[lane]) != base + np.int64(load_u32(blob, 4 * (lane + 1))):
                bad = 1
        return bad


if __name__ == "__main__":
    main()
