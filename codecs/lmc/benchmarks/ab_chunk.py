"""64 Ki- against 128 Ki-element chunks: size and speed of lmc alone and with the previous step as reference.

A series sample packed by bench_threads.py (``--pack``), tiled to 48 Mi elements, in fp32 and bf16, at 1 and 16
threads: per chunk size the blob's bytes and the best of 7 compress / decompress (into ``out=``) times as GiB/s,
the two chunk sizes interleaved; then the 64 Ki blob's size over the 128 Ki one and the speed ratios.

Usage (repository root): python codecs/lmc/benchmarks/ab_chunk.py [PACKED] (default .devdata/series_sample.npz)
Made results/lmc_threads/chunk_size.md.
"""
import sys
import time

import ml_dtypes
import numpy as np

import lmc
from bench_threads import tile, unpack

N = 48 * 2**20
CS = (65536, 131072)


def t1(f):
    s = time.perf_counter()
    f()
    return time.perf_counter() - s


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cur, ref, _ = unpack(argv[0] if argv else ".devdata/series_sample.npz")
    cur, ref = tile(cur, N), tile(ref, N)
    for dt in (np.float32, ml_dtypes.bfloat16):
        x, r = cur.astype(dt), ref.astype(dt)
        gib = x.nbytes / 2**30
        for mode, rr in (("alone", None), ("ref", r)):
            for th in (1, 16):
                blobs = {c: lmc.compress(x, chunk_size=c, reference=rr) for c in CS}
                y = np.empty_like(x)
                tc = {c: 9e9 for c in CS}
                td = dict(tc)
                for _ in range(7):
                    for c in CS:
                        tc[c] = min(tc[c], t1(lambda: lmc.compress(x, chunk_size=c, reference=rr, threads=th)))
                        td[c] = min(td[c], t1(lambda: lmc.decompress(blobs[c], reference=rr, threads=th, out=y)))
                assert y.tobytes() == x.tobytes()
                print(np.dtype(dt).name, mode, th, "thr", " | ".join(
                    f"chunk {c}: {len(blobs[c])} B c {gib/tc[c]:.3f} d {gib/td[c]:.3f} GiB/s" for c in CS),
                    f"| size 64K/128K {len(blobs[65536])/len(blobs[131072]):.4f} speed c {tc[131072]/tc[65536]:.3f} d {td[131072]/td[65536]:.3f}",
                    flush=True)


if __name__ == "__main__":
    main()
