"""Benchmark lmc against ZipNN (if installed).

Usage: python codecs/lmc/benchmarks/bench.py [--n ELEMENTS] [--repeat R]

Prints ratio and compress/decompress MiB/s for lmc with 1 thread, lmc with
all threads and ZipNN with 1 thread, for bf16 and fp32 Gaussian-like weights,
plus the per-chunk order-0 entropy bound and first-call (compile) times.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

import lmc
from benchlib import best, measure_zipnn

# the children import the lmc this process imported
LMC_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lmc.__file__)))


def first_call_time():
    code = ("import time,numpy as np,ml_dtypes;t=time.perf_counter();import lmc;"
            "x=(np.random.randn(1000)*0.02).astype(ml_dtypes.bfloat16);"
            "lmc.decompress(lmc.compress(x));print(time.perf_counter()-t)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([LMC_ROOT, os.environ.get("PYTHONPATH", "")]))
    return float(subprocess.run([sys.executable, "-c", code], env=env,
                                capture_output=True, text=True, check=True).stdout)


def cold_call_time():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        code = ("import time,numpy as np,ml_dtypes;t=time.perf_counter();import lmc;"
                "x=(np.random.randn(1000)*0.02).astype(ml_dtypes.bfloat16);"
                "lmc.decompress(lmc.compress(x));print(time.perf_counter()-t)")
        env = dict(os.environ, NUMBA_CACHE_DIR=d,
                   PYTHONPATH=os.pathsep.join([LMC_ROOT, os.environ.get("PYTHONPATH", "")]))
        return float(subprocess.run([sys.executable, "-c", code], env=env,
                                    capture_output=True, text=True, check=True).stdout)


def planes(x):
    """The byte planes lmc codes a bf16 or fp32 array's elements in (FORMAT.md): the exponent byte, the sign with
    the top 7 mantissa bits, and for fp32 the two low mantissa bytes."""
    if x.dtype.itemsize == 2:  # bf16
        u = x.reshape(-1).view(np.uint16)
        return [((u >> 7) & 0xFF).astype(np.uint8), (((u >> 8) & 0x80) | (u & 0x7F)).astype(np.uint8)]
    u = x.reshape(-1).view(np.uint32)
    return [((u >> 23) & 0xFF).astype(np.uint8), (((u >> 24) & 0x80) | ((u >> 16) & 0x7F)).astype(np.uint8),
            ((u >> 8) & 0xFF).astype(np.uint8), (u & 0xFF).astype(np.uint8)]


def entropy_bound(x, chunk):
    """Per-chunk order-0 entropy of the lmc byte streams (bytes)."""
    total = x.size
    bits = 0.0
    for p in planes(x):
        for s in range(0, total, chunk):
            n = min(chunk, total - s)
            c = np.bincount(p[s:s + n], minlength=256)
            c = c[c > 0] / n
            bits += -(c * np.log2(c)).sum() * n
    return bits / 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32 * 2**20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import ml_dtypes
    import numba

    print(f"lmc {lmc.__version__}, numba {numba.__version__}, "
          f"threads available {numba.config.NUMBA_NUM_THREADS}")
    print(f"first call in a fresh process (import + compile/load): "
          f"with on-disk cache {first_call_time():.2f} s, cold cache {cold_call_time():.2f} s")
    try:
        from zipnn import ZipNN
    except ImportError:
        ZipNN = None
    rng = np.random.default_rng(0)
    for name, dt, zname, n in [("bf16", ml_dtypes.bfloat16, "bfloat16", args.n),
                               ("fp32", np.float32, "float32", args.n // 2)]:
        x = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(dt)
        mib = x.nbytes / 2**20
        print(f"\n{name}: {n} elements, {mib:.0f} MiB; "
              f"order-0 entropy bound ratio {x.nbytes / entropy_bound(x, 131072):.4f}")
        print(f"{'codec':<18}{'ratio':>8}{'comp MiB/s':>12}{'decomp MiB/s':>14}")
        for label, th in [("lmc 1 thread", 1), (f"lmc {numba.config.NUMBA_NUM_THREADS} threads", None)]:
            lmc.decompress(lmc.compress(x[:1000], threads=th), threads=th)
            tc, blob = best(lambda: lmc.compress(x, threads=th), args.repeat)
            td, y = best(lambda: lmc.decompress(blob, threads=th), args.repeat)
            assert np.array_equal(x.view(np.uint8), y.view(np.uint8))
            print(f"{label:<18}{x.nbytes / len(blob):>8.4f}{mib / tc:>12.0f}{mib / td:>14.0f}")
        if ZipNN is not None:
            ratio, tc, td = measure_zipnn(ZipNN(input_format="byte", bytearray_dtype=zname, threads=1), x,
                                          args.repeat)
            print(f"{'zipnn 1 thread':<18}{ratio:>8.4f}{mib / tc:>12.0f}{mib / td:>14.0f}")


if __name__ == "__main__":
    main()
