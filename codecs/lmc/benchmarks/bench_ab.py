"""Before/after speed of two lmc copies on the checkpoint series of bench_series.py.

Usage: python codecs/lmc/benchmarks/bench_ab.py OLD_DIR [--repeat R]

OLD_DIR holds an older ``lmc`` package (e.g. ``git archive <rev> codecs/lmc/lmc | tar -x``
then the ``codecs/lmc`` folder); it is imported as ``lmc_old`` next to this
tree's ``lmc``.  Both are timed interleaved in one process (one thread,
median or best of R) on every (dtype, kind) of bench_series.py: compress and
decompress MiB/s without and with the reference, and the speed with a
reference relative to the speed without one.  Blob sizes are printed
for both, so that a change of ratio shows.
"""
import argparse
import os
import time

import ml_dtypes
import numpy as np

import lmc
from benchlib import default_series, load_old, load_step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--series", default=None)
    ap.add_argument("--stat", choices=("median", "best"), default="median",
                    help="median or best (min) of the repeats; on a loaded machine the best "
                         "is the least disturbed run")
    args = ap.parse_args()
    old = load_old(args.old)
    folder = args.series or default_series()
    steps = sorted(int(p.split("-")[-1]) for p in os.listdir(folder) if p.startswith("checkpoint-"))
    X = load_step(os.path.join(folder, f"checkpoint-{steps[-1]}"))
    R = load_step(os.path.join(folder, f"checkpoint-{steps[-2]}"))
    stat = np.median if args.stat == "median" else np.min
    print(f"step {steps[-1]} against {steps[-2]}; 1 thread, {args.stat} of {args.repeat}, MiB/s; "
          "r/a = speed with the reference / without")
    print(f"{'kind':<11}{'dtype':<6}{'ver':<5}{'bytes+r':>9}{'comp':>7}{'comp+r':>7}{'r/a':>6}"
          f"{'dec':>7}{'dec+r':>7}{'r/a':>6}")

    def t(f):
        s = time.perf_counter()
        f()
        return time.perf_counter() - s
    for dtname, dt in (("fp32", np.float32), ("bf16", ml_dtypes.bfloat16)):
        for kind in ("weight", "exp_avg", "exp_avg_sq"):
            x = X[kind].astype(dt)
            r = R[kind].astype(dt)
            mib = x.nbytes / 2**20
            vers = (("old", old), ("new", lmc))
            blobs = {}
            for name, M in vers:
                a = M.compress(x, threads=1)
                b = M.compress(x, threads=1, reference=r)
                assert M.decompress(b, threads=1, reference=r).tobytes() == x.tobytes()
                blobs[name] = (a, b)
            ts = {(name, k): [] for name, _ in vers for k in range(4)}
            for _ in range(args.repeat):
                for name, M in vers:
                    a, b = blobs[name]
                    ts[name, 0].append(t(lambda: M.compress(x, threads=1)))
                    ts[name, 1].append(t(lambda: M.compress(x, threads=1, reference=r)))
                    ts[name, 2].append(t(lambda: M.decompress(a, threads=1)))
                    ts[name, 3].append(t(lambda: M.decompress(b, threads=1, reference=r)))
            for name, _ in vers:
                s = [mib / stat(ts[name, k]) for k in range(4)]
                print(f"{kind:<11}{dtname:<6}{name:<5}{len(blobs[name][1]):>9}{s[0]:>7.0f}{s[1]:>7.0f}"
                      f"{s[1] / s[0]:>6.2f}{s[2]:>7.0f}{s[3]:>7.0f}{s[3] / s[2]:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
