"""Format 7's 32-state rANS streams against format 6's 4 states, one thread, on a Trainer series' last two
checkpoints: ratio and compress / decompress MiB/s per (dtype, kind), alone and with the previous checkpoint as
reference, for prefer="speed" and "size"; then where a temporal chunk's decode spends its time (the symbols, which
the vectors speed up, against the whole chunk).

    cd codecs/lmc && python -m benchmarks.studies.bench_rans32 SERIES [--dtypes bf16,fp32] [--repeat 5]

SERIES: a folder of Trainer checkpoints (checkpoint-N/model.safetensors and optimizer.pt); tensors of at least
65,536 elements.  Run it twice, once with LMC_SIMD=0, to see the scalar build's figures."""
from __future__ import annotations

import argparse
import os
import re
import time

import ml_dtypes
import numpy as np

import lmc
from benchmarks.benchlib import best, load_tensors
from lmc.kernels import drivers as kdrivers
from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F32
from lmc.kernels import rans as krans
from lmc.kernels import simd
from lmc.kernels import temporal as ktemporal

KINDS = ("weight", "exp_avg", "exp_avg_sq")


def last_two(series):
    steps = sorted(int(m.group(1)) for d in os.listdir(series) if (m := re.fullmatch(r"checkpoint-(\d+)", d)))
    if len(steps) < 2:
        raise SystemExit(f"bench_rans32: {series}: needs two checkpoint-N folders")
    return steps[-2], steps[-1]


def measure(xs, refs, repeat, prefer):
    """Format 6 and 7 on the same tensors, their timings interleaved (6, 7, 6, 7, ...: the machine's noise falls
    on both alike), best of `repeat` per tensor: ((ratio, compress MiB/s, decompress MiB/s) for 6, the same for
    7)."""
    total = sum(x.nbytes for x in xs)
    size = [0, 0]
    tc = [0.0, 0.0]
    td = [0.0, 0.0]
    for x, r in zip(xs, refs):
        blobs = [lmc.compress(x, reference=r, threads=1, format_version=fv, prefer=prefer) for fv in (6, 7)]
        for j, blob in enumerate(blobs):
            if lmc.decompress(blob, reference=r, threads=1).tobytes() != x.tobytes():
                raise SystemExit("bench_rans32: round trip failed")
            size[j] += len(blob)
        bc = [np.inf, np.inf]
        bd = [np.inf, np.inf]
        for _ in range(repeat):
            for j, fv in enumerate((6, 7)):
                t0 = time.perf_counter()
                lmc.compress(x, reference=r, threads=1, format_version=fv, prefer=prefer)
                t1 = time.perf_counter()
                lmc.decompress(blobs[j], reference=r, threads=1)
                t2 = time.perf_counter()
                bc[j] = min(bc[j], t1 - t0)
                bd[j] = min(bd[j], t2 - t1)
        for j in (0, 1):
            tc[j] += bc[j]
            td[j] += bd[j]
    return [(total / size[j], total / tc[j] / 2 ** 20, total / td[j] / 2 ** 20) for j in (0, 1)]


def temporal_profile(x, r, fv, repeat):
    """(elements/s of a temporal chunk's whole decode, symbols/s of its rANS stream alone) for the first chunk of
    x against r, or None where that chunk is not temporal."""
    n = min(x.size, 131072)
    x, r = x.reshape(-1)[:n], r.reshape(-1)[:n]
    blob = lmc.compress(x, reference=r, format_version=fv, threads=1)
    h = lmc.api._parse_header(blob)
    bb = np.frombuffer(blob, np.uint8)
    off, clen = int(h["offsets"][0]), int(h["sizes"][0])
    if bb[off] != 3:
        return None
    unit = x.dtype.itemsize
    layout = {4: LAYOUT_F32, 2: LAYOUT_BF16}[unit]
    planes, dec, dec3, dec1, lens, tmp, f, cm, dtab = kdrivers.stream_scratch(2, 131072, n)
    cb = np.empty(n + 16, np.uint16)
    syms = np.empty(n + 16, np.uint8)
    ref = np.frombuffer(r.tobytes(), np.uint8)
    out = np.zeros(unit * n, np.uint8)

    def whole():
        return ktemporal.temporal_decode(bb, off + 1, off + clen, n, layout, ref, 0, out, f, cm, dtab, cb, syms, fv)
    if whole() != 0:
        raise SystemExit("bench_rans32: temporal decode failed")
    cmask = int(bb[off + 2]) | int(bb[off + 3]) << 8
    q = krans.read_ctx_tables(bb, off + 4, off + clen, cmask, 16, 16 * unit, f, cm, dtab)   # (maxsym 2W)
    S = krans.rans_states_for(n, fv)

    def symbols():
        return krans.decode_ctx_stream(bb, q, off + clen, cb, n, dtab, syms, S)
    if symbols()[0] != 0:
        raise SystemExit("bench_rans32: symbol decode failed")
    return n / best(whole, repeat * 4)[0], n / best(symbols, repeat * 4)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("series")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--profile-only", action="store_true", help="only the temporal chunk's decode profile")
    p.add_argument("--kinds", default=",".join(KINDS))
    a = p.parse_args()
    s0, s1 = last_two(a.series)
    old, new = (load_tensors(os.path.join(a.series, f"checkpoint-{s}"), 65536) for s in (s0, s1))
    print(f"series {a.series}: checkpoint-{s1} alone and against checkpoint-{s0}; {sum(map(len, new.values()))} tensors; "
          f"lmc {lmc.__version__}, SIMD {simd.SIMD} (LMC_SIMD={os.environ.get('LMC_SIMD', '')!r}), one thread, "
          f"best of {a.repeat} compress and decompress calls, format 6 and 7 interleaved")
    print("| dtype | kind | coding | prefer | fv6 ratio | fv7 ratio | fv6 comp | fv7 comp | fv6 dec | fv7 dec | dec fv7/fv6 |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for dt in ([] if a.profile_only else a.dtypes.split(",")):
        cast = (lambda t: t.astype(ml_dtypes.bfloat16)) if dt == "bf16" else (lambda t: t)
        for kind in a.kinds.split(","):
            xs = [cast(t) for t in new[kind]]
            rs = [cast(t) for t in old[kind]]
            for coding, refs in (("alone", [None] * len(xs)), ("vs previous", rs)):
                for prefer in ("speed", "size"):
                    r6, r7 = measure(xs, refs, a.repeat, prefer)
                    print(f"| {dt} | {kind} | {coding} | {prefer} | {r6[0]:.4f} | {r7[0]:.4f} | {r6[1]:.0f} | "
                          f"{r7[1]:.0f} | {r6[2]:.0f} | {r7[2]:.0f} | {r7[2] / r6[2]:.2f}x |", flush=True)
    print("\nA temporal chunk's decode (the largest weight, its first chunk of 131,072 elements against the "
          "previous checkpoint; M per second):")
    k = max(range(len(new["weight"])), key=lambda j: new["weight"][j].size)
    for dt in a.dtypes.split(","):
        cast = (lambda t: t.astype(ml_dtypes.bfloat16)) if dt == "bf16" else (lambda t: t)
        for fv in (6, 7):
            res = temporal_profile(cast(new["weight"][k]), cast(old["weight"][k]), fv, a.repeat)
            if res is None:
                print(f"  {dt} fv{fv}: the chunk is not temporal")
                continue
            w, s = res
            print(f"  {dt} fv{fv} ({krans.rans_states_for(131072, fv)} states): whole chunk {w / 1e6:.0f} "
                  f"Melem/s, its symbols alone {s / 1e6:.0f} Msym/s (the symbols {w / s:.0%} of the chunk's time)")


if __name__ == "__main__":
    main()
