"""Where the time of coding against a reference goes: the passes of the temporal chunk mode, one at a time, on a
Trainer series' weights (the last checkpoint against the one before, one thread), with the whole compress and
decompress, with the reference and alone, for scale.

    cd codecs/lmc && python -m benchmarks.studies.temporal_passes SERIES [--dtypes bf16,fp32] [--repeat 5]

Each pass is the kernel the encoder (``kernels.chunk.encode_chunk``, format 8, prefer "speed") or the decoder
(``kernels.temporal.temporal_decode``) calls, called here chunk by chunk on the same arrays in the same order, so
that a pass finds in the caches what it finds there.  Best of ``--repeat`` of each pass's sum over the chunks;
ns per element.  The weights' chunks are checked to be temporal ones (mode 3) first."""
from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np

import lmc
from lmc.api import _parse_header
from lmc.kernels import temporal as kt
from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F32, NCTX, PROB_SCALE, checksum_units, copy_bytes
from lmc.kernels.check import ref_pass
from lmc.kernels.chunk import gate_cut
from lmc.kernels.delta.encode import delta_plan, delta_scratch, stream_estimates
from lmc.kernels.rans import decode_ctx_stream, put_ctx_tables, put_rans, rans_states_for, read_ctx_tables
from lmc.kernels.simd import LANES, SIMD
from benchmarks.benchlib import keep_heap, last_two_weights

CHUNK = 131072
FORMAT = 8
PLAN = "delta mode's plan (sampled; stopped where it cannot come below the gate's cut)"


def chunks_of(blob):
    """(chunk size, [(offset, size) of each chunk payload]) from the blob's header (lmc.api's parser)."""
    h = _parse_header(np.frombuffer(blob, np.uint8))
    return h["chunk"], list(zip(h["offsets"].tolist(), h["sizes"].tolist()))


class Passes:
    """Each pass's seconds, summed over the chunks, best of the rounds."""

    def __init__(self):
        self.best, self.cur = {}, {}

    def __call__(self, name, t0):
        t = time.perf_counter()
        self.cur[name] = self.cur.get(name, 0.0) + t - t0
        return t

    def round(self):
        for k, v in self.cur.items():
            self.best[k] = min(self.best.get(k, v), v)
        self.cur = {}


def encoder(x, r, layout, W, repeat):
    unit = W // 8
    d8, r8 = x.view(np.uint8), r.view(np.uint8)
    m = CHUNK + 16
    dsc = delta_scratch(unit, m)
    jb, low = np.empty(m, np.uint16), np.empty(m, np.uint32)
    th = np.empty(4 * NCTX * 65, np.int32)
    thist, tf, tcm = (np.zeros(NCTX * 256, np.int64) for _ in range(3))
    et, kbt = np.zeros(2 * NCTX * 65, np.uint64), np.zeros(NCTX * 65, np.uint8)
    tbuf, out = np.empty(2 * m + 4 * LANES + 32, np.uint8), np.empty(unit * m + 64, np.uint8)
    ut = np.uint16 if W == 16 else np.uint32
    mb = 7 if layout == LAYOUT_BF16 else 23
    P = Passes()
    for _ in range(repeat + 1):   # (the first round compiles and warms up)
        for s in range(0, x.size, CHUNK):
            n = min(CHUNK, x.size - s)
            t = time.perf_counter()
            checksum_units(d8, s, n, unit, 3)
            t = P("chunk checksum", t)
            _, E = ref_pass(r8, s, n, unit, layout, 3)   # (as kernels.drivers.encode_range)
            t = P("reference pass (its chunk checksum and the context base, its largest exponent)", t)
            est_a, _ = stream_estimates(d8, r8, s, n, layout, dsc[2])
            t = P("alone and XOR estimates (sampled)", t)
            est_t, est_x = kt.temporal_sample(d8, r8, s, n, layout, E, thist, tcm)
            t = P("temporal and XOR estimates (sampled)", t)
            delta_plan(d8, r8, s, n, layout, dsc[2], gate_cut(est_a, est_t, est_x, n))   # (as encode_chunk)
            t = P(PLAN, t)
            kt._tsyms_all(x.view(ut)[s:s + n], r.view(ut)[s:s + n], n, W, mb, 0xFF, E, jb, low)
            t = P(SYMS, t)
            raw = kt.temporal_count(d8, r8, s, n, layout, E, jb, low, th)
            t = P("symbols, raw bits and their counts", t)
            kt.temporal_hist(th, W, thist)
            _, cmask = kt.temporal_estimate(thist, tf, tcm, W, n, FORMAT)
            t = P("tables quantised, size estimated", t)
            o = put_ctx_tables(tf, tcm, cmask, NCTX, 2 * W + 1, out, 4, unit * n, et, kbt, True)
            t = P("tables written", t)
            o = put_rans(jb, n, et, tbuf[:2 * n + 4 * LANES + 16], out, o, unit * n, (raw + 7) >> 3,
                         rans_states_for(n, FORMAT))
            t = P("rANS encoder (32 states)", t)
            if kt.packed(W):   # (packed by the symbol pass: copied)
                copy_bytes(out, o, low.view(np.uint8), 0, (raw + 7) >> 3)
            else:
                kt._traw(jb, low, n, kbt, out, o, 4 if W == 16 else 2)
            P("raw bits written", t)
        P.round()
    return P.best


WHOLE = ("the chunk decoded as the decoder does it (temporal_decode: one fused pass where the CPU has AVX2, "
         "16 lanes with AVX-512)")
SYMS = "symbols and raw bits (the symbol pass alone; with AVX2 it packs bf16's raw bits)"
APART = (SYMS, WHOLE)   # (rows not in the sum: they repeat others)


def decoder(blob, x, r, layout, W, repeat):
    bb = np.frombuffer(blob, np.uint8)
    chunk, parts = chunks_of(blob)
    ut = np.uint16 if W == 16 else np.uint32
    mb = 7 if layout == LAYOUT_BF16 else 23
    f, cm = np.empty(NCTX * 256, np.int64), np.empty(NCTX * 256, np.int64)
    dtab = np.empty(NCTX * PROB_SCALE, np.uint32)
    cb, syms = np.empty(chunk + 16, np.uint16), np.empty(chunk + 16, np.uint8)
    o = np.empty_like(r).view(ut)
    total = r.size
    temporal = [c for c, (off, _) in enumerate(parts) if bb[off] == 3]   # (the other chunks are not timed)
    P = Passes()
    for _ in range(repeat + 1):
        for c in temporal:
            off, size = parts[c]
            s = c * chunk
            n = min(chunk, total - s)
            pos, end = off + 1, off + size
            E = np.int64(bb[pos])
            cmask = int(bb[pos + 1]) | int(bb[pos + 2]) << 8
            t = time.perf_counter()
            kt._tmask_all(r.view(ut)[s:s + n], n, E, mb, 0xFF, cb, o[s:s + n], W)
            t = P("contexts and mono(reference)", t)
            pos = read_ctx_tables(bb, pos + 3, end, cmask, NCTX, 2 * W, f, cm, dtab)
            t = P("tables read, decode tables built", t)
            st, q = decode_ctx_stream(bb, pos, end, cb, n, dtab, syms, rans_states_for(n, FORMAT))
            t = P("rANS decoder (32 states)", t)
            st2, iv = kt._trecon(bb, q, end, o[s:s + n], n, W, syms, 0, 0)
            kt._unmono_all(o[s + iv:s + n], n - iv, W)
            t = P("raw bits read, units made", t)
            st3 = kt.temporal_decode(bb, off + 1, end, n, layout, r.view(np.uint8), s, o.view(np.uint8), f, cm,
                                     dtab, cb, syms, FORMAT)
            P(WHOLE, t)
            if st != 0 or st2 != 0 or st3 != 0:
                raise SystemExit(f"temporal_passes: chunk {c} refused ({st}, {st2}, {st3})")
        P.round()
    for c in temporal:
        s = c * chunk
        if o[s:s + chunk].tobytes() != x.view(ut)[s:s + chunk].tobytes():
            raise SystemExit(f"temporal_passes: the passes did not decode chunk {c}")
    return P.best, sum(min(chunk, total - c * chunk) for c in temporal), len(temporal), len(parts)


def whole(x, r, repeat):
    """Best seconds of compress and decompress with the reference and alone (interleaved)."""
    b_ref, b_alone = lmc.compress(x, reference=r, threads=1), lmc.compress(x, threads=1)
    fns = {"compress, with the reference": lambda: lmc.compress(x, reference=r, threads=1),
           "compress, alone": lambda: lmc.compress(x, threads=1),
           "decompress, with the reference": lambda: lmc.decompress(b_ref, reference=r, threads=1),
           "decompress, alone": lambda: lmc.decompress(b_alone, threads=1)}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best, b_ref


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("series")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    keep_heap(["-m", "benchmarks.studies.temporal_passes", *sys.argv[1:]])
    steps, (old, new) = last_two_weights(a.series, "temporal_passes")
    print(f"checkpoint-{steps[-1]}'s weights against checkpoint-{steps[-2]}'s ({len(new)} tensors of at least "
          f"65,536 elements, joined); one thread; format {FORMAT}; vector kernels {'on' if SIMD else 'off'}; "
          f"best of {a.repeat}\n")
    for dt in a.dtypes.split(","):
        typ, layout, W = ((ml_dtypes.bfloat16, LAYOUT_BF16, 16) if dt == "bf16" else (np.float32, LAYOUT_F32, 32))
        x = np.concatenate([t.astype(typ).ravel() for t in new])
        r = np.concatenate([t.astype(typ).ravel() for t in old])
        w, blob = whole(x, r, a.repeat)
        ne = x.size
        modes = lmc.info(blob)["chunk_modes"]
        print(f"## {dt} weights: {ne:,} elements, {x.nbytes / 2**20:.1f} MiB, ratio with the reference "
              f"{x.nbytes / len(blob):.3f}; chunk modes with the reference: "
              + ", ".join(f"{m} x{k}" for m, k in modes.items()) + "\n")
        print("| call | ms | ns per element | MiB/s |\n|---|---:|---:|---:|")
        for k, v in w.items():
            print(f"| {k} | {v * 1e3:.1f} | {v / ne * 1e9:.2f} | {x.nbytes / 2**20 / v:.0f} |")
        dec, nd, nt, nch = decoder(blob, x, r, layout, W, a.repeat)
        for label, res, ne in (("encoder (every chunk)", encoder(x, r, layout, W, a.repeat), x.size),
                               (f"decoder ({nt} of {nch} chunks: those coded in the temporal mode)", dec, nd)):
            tot = sum(v for k, v in res.items() if k not in APART)
            print(f"\n| {label} | ms | ns per element | share |\n|---|---:|---:|---:|")
            for k, v in res.items():
                share = "" if k in APART else f"{v / tot * 100:.0f}%"
                print(f"| {k} | {v * 1e3:.2f} | {v / ne * 1e9:.2f} | {share} |")
            print(f"| sum | {tot * 1e3:.1f} | {tot / ne * 1e9:.2f} | |")
        print()


if __name__ == "__main__":
    main()
