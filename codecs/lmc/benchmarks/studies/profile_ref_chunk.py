"""Where the encoder's time goes on one chunk coded with a reference: each kernel the chunk coder calls, timed on
its own (one thread, best of --repeat), beside the whole `lmc.compress` of that chunk with and without the
reference.

    cd codecs/lmc && python -m benchmarks.studies.profile_ref_chunk SERIES [--steps 950,1000] [--repeat 15]

SERIES: a folder of Trainer checkpoints; the chunk is the first 131,072 elements of the step's largest weight,
its reference the same elements of the earlier step, as fp32 and cast to bf16.  Internal kernels: their
signatures follow the checkout this runs in."""
from __future__ import annotations

import argparse
import os
import time

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

import lmc
from lmc.kernels import base as B
from lmc.kernels import streams as S
from lmc.kernels import temporal as T
from lmc.kernels.delta import encode as DE


def best_ms(fn, repeat):
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return 1e3 * min(t)


def profile(x, r, layout, unit, ns, repeat):
    n = x.size
    xd = np.frombuffer(x.tobytes(), np.uint8)
    rd = np.frombuffer(r.tobytes(), np.uint8)
    W = 8 * unit
    ms = {"compress with the reference": best_ms(lambda: lmc.compress(x, reference=r, threads=1), repeat),
          "compress alone": best_ms(lambda: lmc.compress(x, threads=1), repeat),
          "checksum_units": best_ms(lambda: B.checksum_units(xd, 0, n, unit, 2), repeat)}
    hs = np.zeros(ns * 1024, np.int32)
    ms["stream_count (alone counts)"] = best_ms(lambda: S.stream_count(xd, rd, False, 0, n, layout, hs), repeat)
    dz, dpl, dhs, dh, dlens, dmodes, dsizes, df, dcm, dpos, dmk = DE.delta_scratch(unit, n + 16)
    ms["delta_plan"] = best_ms(lambda: DE.delta_plan(xd, rd, 0, n, layout, dhs), repeat)
    db, dq, _est = DE.delta_plan(xd, rd, 0, n, layout, dhs)
    ms["delta_z"] = best_ms(lambda: DE.delta_z(xd, rd, 0, n, layout, dz), repeat)
    ms["delta_build"] = best_ms(lambda: DE.delta_build(dz, n, W, db, dq, dpl, dpos, dmk), repeat)
    dm = DE.delta_build(dz, n, W, db, dq, dpl, dpos, dmk)
    ms["delta_analyze"] = best_ms(lambda: DE.delta_analyze(dpl, n, W, db, dq, dm, dh, dlens, dmodes, dsizes, df,
                                                           dcm, 32, False, 6), repeat)
    E = T.temporal_base(rd, 0, n, layout)
    thist = np.zeros(16 * 256, np.int64)
    tcm = np.zeros(16 * 256, np.int64)
    tf = np.zeros(16 * 256, np.int64)
    ms["temporal_base + temporal_sample"] = best_ms(
        lambda: (T.temporal_base(rd, 0, n, layout), T.temporal_sample(xd, rd, 0, n, layout, E, thist, tcm)), repeat)
    jb = np.empty(n + 16, np.uint16)
    low = np.empty(n + 16, np.uint32)
    th = np.empty(4 * 16 * 65, np.int32)
    ms["temporal_count"] = best_ms(lambda: T.temporal_count(xd, rd, 0, n, layout, E, jb, low, th), repeat)
    raw = T.temporal_count(xd, rd, 0, n, layout, E, jb, low, th)
    T.temporal_hist(th, W, thist)
    _tr, cmask = T.temporal_estimate(thist, tf, tcm, W, n, 6)
    out = np.zeros(n * unit + 64, np.uint8)
    tbuf = np.zeros(2 * n + 200, np.uint8)
    kbt = np.zeros(16 * 65, np.uint8)
    et = np.zeros(2 * 16 * 65, np.uint64)
    ms["temporal_write (rANS + raw bits)"] = best_ms(
        lambda: T.temporal_write(E, cmask, jb, low, n, W, tf, tcm, raw, out, 0, out.size - 8, tbuf, kbt, et, 6),
        repeat)
    return ms


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("series")
    p.add_argument("--steps", default="950,1000")
    p.add_argument("--repeat", type=int, default=15)
    a = p.parse_args()
    s0, s1 = a.steps.split(",")
    w0 = load_file(os.path.join(a.series, f"checkpoint-{s0}", "model.safetensors"))
    w1 = load_file(os.path.join(a.series, f"checkpoint-{s1}", "model.safetensors"))
    k = max(w1, key=lambda k: w1[k].size)
    print(f"{a.series}: {k} {w1[k].shape}, checkpoint-{s1} against checkpoint-{s0}; lmc {lmc.__version__}; "
          f"ms per chunk of 131,072 elements, one thread, best of {a.repeat}")
    for name, dt, layout, unit, ns in (("bf16", ml_dtypes.bfloat16, B.LAYOUT_BF16, 2, 2),
                                       ("fp32", np.float32, B.LAYOUT_F32, 4, 4)):
        x = w1[k].astype(dt).reshape(-1)[:131072]
        r = w0[k].astype(dt).reshape(-1)[:131072]
        ms = profile(x, r, layout, unit, ns, a.repeat)
        print(f"{name}:")
        for key, v in ms.items():
            print(f"  {key:34s} {v:7.3f}")


if __name__ == "__main__":
    main()
