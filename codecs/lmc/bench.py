"""Benchmark lmc against ZipNN (if installed).

Usage: python bench.py [--n ELEMENTS] [--repeat R]

Prints ratio and compress/decompress MiB/s for lmc with 1 thread, lmc with
all threads and ZipNN with 1 thread, for bf16 and fp32 Gaussian-like weights,
plus the per-chunk order-0 entropy bound and first-call (compile) times.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def first_call_time():
    code = ("import time,numpy as np,ml_dtypes;t=time.perf_counter();import lmc;"
            "x=(np.random.randn(1000)*0.02).astype(ml_dtypes.bfloat16);"
            "lmc.decompress(lmc.compress(x));print(time.perf_counter()-t)")
    env = dict(os.environ)
    return float(subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env,
                                capture_output=True, text=True, check=True).stdout)


def cold_call_time():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        code = ("import time,numpy as np,ml_dtypes;t=time.perf_counter();import lmc;"
                "x=(np.random.randn(1000)*0.02).astype(ml_dtypes.bfloat16);"
                "lmc.decompress(lmc.compress(x));print(time.perf_counter()-t)")
        env = dict(os.environ, NUMBA_CACHE_DIR=d)
        return float(subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env,
                                    capture_output=True, text=True, check=True).stdout)


def entropy_bound(x, chunk):
    """Per-chunk order-0 entropy of the lmc byte streams (bytes)."""
    from lmc._kbase import split_chunk
    from lmc._core import _DTYPES, _dtype_code, _nstreams
    _, unit, layout = _DTYPES[_dtype_code(x.dtype)]
    ns = _nstreams(unit, layout)
    u8 = x.reshape(-1).view(np.uint8)
    total = x.size
    bits = 0.0
    for s in range(0, total, chunk):
        n = min(chunk, total - s)
        planes = np.empty((ns, n), np.uint8)
        split_chunk(u8, u8, False, s, n, unit, layout, planes, True)
        for p in planes:
            c = np.bincount(p, minlength=256)
            c = c[c > 0] / n
            bits += -(c * np.log2(c)).sum() * n
    return bits / 8


def best(f, repeat):
    ts = []
    r = None
    for _ in range(repeat):
        t = time.perf_counter()
        r = f()
        ts.append(time.perf_counter() - t)
    return min(ts), r


def measure_zipnn(z, x, repeat):
    """ZipNN (a ``zipnn.ZipNN``) on the array x: (ratio, best compress s, best decompress s), round trip checked."""
    buf = x.tobytes()
    tcs, tds, zb, d = [], [], None, None
    for _ in range(repeat):
        b = bytearray(buf)  # ZipNN modifies its input: a fresh copy per call, not timed
        t = time.perf_counter()
        zb = z.compress(b)
        tcs.append(time.perf_counter() - t)
        t = time.perf_counter()
        d = z.decompress(zb)
        tds.append(time.perf_counter() - t)
    if bytes(d) != buf:
        raise SystemExit("zipnn: round trip is not bit-exact")
    return len(buf) / len(zb), min(tcs), min(tds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32 * 2**20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import ml_dtypes
    import numba

    import lmc
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
