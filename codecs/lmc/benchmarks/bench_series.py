"""lmc 0.2 on a real checkpoint series: the last step against the one before.

Usage: python codecs/lmc/benchmarks/bench_series.py [SERIES_DIR] [--repeat R] [--step N]

SERIES_DIR: a Hugging Face Trainer folder with checkpoint-<step>/
(model.safetensors, optimizer.pt); default: the embedded tinygpt series
(the newest tinygpt-*/ under ~/.cache/lmcbench, as lmcbench trains and caches it).  For each kind
(weight, exp_avg, exp_avg_sq), all tensors of the kind concatenated, in fp32
and in a bf16 cast, prints the ratio of lmc alone, of the lmc 0.1 choice
(alone / XOR per chunk, format-v1 modes only), of lmc 0.2 with the previous
step as reference, of z4ai.compress_delta (if installed), and one-thread
compress / decompress MiB/s of lmc without and with the reference; then the
whole fp32 checkpoint (all three kinds).
"""
import argparse
import glob
import os
import re

import ml_dtypes
import numpy as np

import lmc
from benchlib import best, default_series, load_step

try:
    import z4ai
except ImportError:  # pragma: no cover
    z4ai = None


def measure(x, r, repeat, zdt):
    mib = x.nbytes / 2**20
    out = {}
    tca, a = best(lambda: lmc.compress(x, threads=1), repeat)
    tda, ya = best(lambda: lmc.decompress(a, threads=1), repeat)
    v1 = lmc.compress(x, threads=1, reference=r, format_version=1)  # the lmc 0.1 encoder
    tcr, b = best(lambda: lmc.compress(x, threads=1, reference=r), repeat)
    tdr, yb = best(lambda: lmc.decompress(b, threads=1, reference=r), repeat)
    assert ya.tobytes() == x.tobytes() and yb.tobytes() == x.tobytes()
    assert lmc.decompress(v1, reference=r).tobytes() == x.tobytes()
    out.update(alone=x.nbytes / len(a), v01=x.nbytes / len(v1), v02=x.nbytes / len(b),
               sizes=(len(a), len(v1), len(b)),
               c_alone=mib / tca, d_alone=mib / tda, c_ref=mib / tcr, d_ref=mib / tdr)
    if z4ai is not None:
        try:
            zb = z4ai.compress_delta(x.tobytes(), r.tobytes(), dtype=zdt)
            out["z4ai"] = x.nbytes / len(zb)
            zsize = len(zb)
        except Exception as e:  # pragma: no cover
            print(f"  z4ai failed: {e!r}")
            zsize = None
        out["zsize"] = zsize
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("series", nargs="?")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--step", type=int, default=None, help="step to code (default: the last)")
    args = ap.parse_args()
    folder = args.series or default_series()
    steps = sorted(int(re.search(r"checkpoint-(\d+)$", p).group(1))
                   for p in glob.glob(os.path.join(folder, "checkpoint-*")))
    cur = args.step or steps[-1]
    prev = steps[steps.index(cur) - 1]
    print(f"lmc {lmc.__version__}; series {folder}; step {cur} against step {prev}; "
          f"1 thread, best of {args.repeat}; z4ai {getattr(z4ai, '__version__', 'missing')}")
    X = load_step(os.path.join(folder, f"checkpoint-{cur}"))
    R = load_step(os.path.join(folder, f"checkpoint-{prev}"))
    x0 = np.zeros(1000, ml_dtypes.bfloat16)
    for dt in (np.float32, ml_dtypes.bfloat16):  # compile / load the kernels first
        lmc.decompress(lmc.compress(x0.astype(dt), reference=x0.astype(dt)), reference=x0.astype(dt))
    hdr = (f"{'kind':<11}{'dtype':<6}{'MiB':>6}{'alone':>8}{'v0.1 ref':>9}{'v0.2 ref':>9}"
           f"{'gain':>7}{'z4ai':>7}{'comp':>7}{'comp+r':>7}{'dec':>7}{'dec+r':>7}  (MiB/s)")
    print(hdr)
    tot = {}
    for dtname, dt, zdt in (("fp32", np.float32, "fp32"), ("bf16", ml_dtypes.bfloat16, "bf16")):
        for kind in ("weight", "exp_avg", "exp_avg_sq"):
            x = X[kind].astype(dt)
            r = R[kind].astype(dt)
            m = measure(x, r, args.repeat, zdt)
            z = f"{m['z4ai']:>7.2f}" if m.get("z4ai") else f"{'-':>7}"
            print(f"{kind:<11}{dtname:<6}{x.nbytes / 2**20:>6.2f}{m['alone']:>8.3f}{m['v01']:>9.3f}"
                  f"{m['v02']:>9.3f}{m['v02'] / m['v01']:>7.3f}{z}{m['c_alone']:>7.0f}"
                  f"{m['c_ref']:>7.0f}{m['d_alone']:>7.0f}{m['d_ref']:>7.0f}")
            t = tot.setdefault(dtname, [0, 0, 0, 0, 0])
            t[0] += x.nbytes
            for j in range(3):
                t[j + 1] += m["sizes"][j]
            t[4] = t[4] + m["zsize"] if (m.get("zsize") and t[4] is not None) else None
    for dtname, t in tot.items():
        z = f", z4ai {t[0] / t[4]:.3f}" if t[4] else ""
        print(f"whole {dtname} checkpoint (weights + both moments): alone {t[0] / t[1]:.3f}, "
              f"v0.1 ref {t[0] / t[2]:.3f}, v0.2 ref {t[0] / t[3]:.3f} "
              f"(gain {t[2] / t[3]:.3f}x){z}")


if __name__ == "__main__":
    main()
