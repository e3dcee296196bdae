"""Where the time of coding a second moment alone goes: the kernels the chunk coder runs on a predicted-exponent
chunk, one at a time, on the first chunk of the largest ``exp_avg_sq`` tensor (bf16 or fp32, with its rows) whose
first chunk takes that mode, with the whole chunk's compress and decompress for scale; then the rANS encoder of
its exponent residuals by each loop this CPU has (``wenc.enc_rounds``: the register-window loop where AVX-512 and
the window allow it; ``simd.enc32``: the AVX2 loop).

    cd codecs/lmc && python -m benchmarks.studies.pred_phases SERIES/checkpoint-N [--dtype bf16] [--repeat 30]

Best of ``--repeat`` calls each, ns per element.  The phases are those of ``kernels.chunk.encode_chunk`` for a
bf16 chunk (format 9, prefer "speed"): the joint-symbol mode's sampled estimate, the split into planes with the
checksum, the planes' counts (``analyze_planes``), the prediction's sampled gain, the residuals, their counts,
their coding choice, and the writer (``write_pred``: the residuals' stream, then the other planes)."""
from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

import lmc
from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F32, RANS_MARGIN, split_chunk
from lmc.kernels.histo import histo4
from lmc.kernels.joint import joint_estimate
from lmc.kernels.rans import _enc_entry, rans_encode
from lmc.kernels.simd import LANES, SIMD, SIMD512, enc32
from lmc.kernels.streams import analysis_scratch, analyze_hist, analyze_planes, exp_residuals, pred_gain, write_pred
from lmc.kernels.wenc import enc_rounds
from benchmarks.benchlib import best, keep_heap, load_tensors

FV = 9
CHUNK = 131072


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--repeat", type=int, default=30)
    a = p.parse_args()
    keep_heap(["-m", "benchmarks.studies.pred_phases", *sys.argv[1:]])
    bf = a.dtype == "bf16"
    dt, unit, layout = (ml_dtypes.bfloat16, 2, LAYOUT_BF16) if bf else (np.float32, 4, LAYOUT_F32)
    for t in sorted(load_tensors(a.checkpoint, 65536)["exp_avg_sq"], key=lambda v: -v.size):
        t = t.astype(dt)
        w = t.shape[-1]
        x = t[:max(1, CHUNK // w)]
        if "predicted" in lmc.info(lmc.compress(x, threads=1))["chunk_modes"]:
            break
    else:
        raise SystemExit("no exp_avg_sq tensor's first chunk takes the predicted-exponent mode")
    n = x.size
    d8 = x.ravel().view(np.uint8)
    ns = unit
    planes = np.zeros((ns, n + 16), np.uint8)
    ms = lambda f: best(f, a.repeat)[0] / n * 1e9   # noqa: E731
    blob = lmc.compress(x, threads=1)
    modes = lmc.info(blob)["chunk_modes"]
    print(f"{a.checkpoint}: exp_avg_sq {a.dtype} {t.shape}, first chunk {x.shape} ({n} elements), modes {modes}; "
          f"SIMD {SIMD}, SIMD512 {SIMD512}; best of {a.repeat}, ns an element")
    rows = []
    if bf:
        lj = np.zeros(256, np.uint8)
        rows.append(("joint_estimate (sampled)", ms(lambda: joint_estimate(x.ravel().view(np.uint16), n, lj))))
    rows.append(("split into planes + checksum",
                 ms(lambda: split_chunk(d8, d8, False, 0, n, unit, layout, planes, True))))
    h, lens, md, sizes, f, cm = analysis_scratch(ns)

    def count():
        h[:] = 0
        return analyze_planes(planes, n, ns, h, lens, md, sizes, f, cm, RANS_MARGIN, FV)
    rows.append(("analyze_planes (the planes' counts)", ms(count)))
    cost_a = count()
    rows.append(("pred_gain (sampled)", ms(lambda: pred_gain(planes[0], n, w, 32))))
    r = np.zeros(n + 16, np.uint8)
    rows.append(("exp_residuals", ms(lambda: exp_residuals(planes[0], n, w, r))))
    hr = np.zeros((1, 4, 256), np.int64)

    def hist():
        hr[:] = 0
        histo4(r, n, hr[0])
    rows.append(("histo4 (the residuals' counts)", ms(hist)))
    lr, mr, sr = np.zeros((1, 256), np.uint8), np.zeros(1, np.int64), np.zeros(1, np.int64)
    fr, cr = np.zeros(256, np.int64), np.zeros(256, np.int64)
    rows.append(("analyze_hist (the residuals' coding)",
                 ms(lambda: analyze_hist(hr, n, 1, lr, mr, sr, fr, cr, RANS_MARGIN, 0, FV))))
    out = np.zeros(n * unit + 64, np.uint8)
    tbuf = np.zeros(2 * n + 256, np.uint8)
    rows.append(("write_pred (the writer)", ms(lambda: write_pred(planes, r, w, n, ns, md, sizes, h, lens, f, cm, mr,
                                                                  sr, hr, lr, fr, cr, out, 0, out.size, tbuf, FV))))
    rows.append(("whole chunk: lmc.compress", ms(lambda: lmc.compress(x, threads=1))))
    rows.append(("whole chunk: lmc.decompress", ms(lambda: lmc.decompress(blob, threads=1))))
    for name, v in rows:
        print(f"  {name:<40} {v:6.3f}")
    print(f"  (alone cost {cost_a} bytes; the residuals' stream mode {mr[0]}: 3 is rANS)")
    if mr[0] != 3:
        return
    print("the residuals' rANS encoder (32 states), full rounds, ns an element:")
    et = np.zeros(512, np.uint64)
    for j in range(256):
        if fr[j] > 0:
            _enc_entry(fr[j], cr[j], 0, et, j)
    lo = (n // LANES) * LANES
    buf = np.zeros(2 * n + 256, np.uint8)
    xl = np.zeros(LANES, np.uint64)
    loops = [("wenc.enc_rounds", enc_rounds)] + ([("simd.enc32 (AVX2)", enc32)] if SIMD else [])
    for name, fn in loops:
        def run(fn=fn):
            xl[:] = 1 << 16
            return fn(r, lo, et, buf, buf.size, xl)
        print(f"  {name:<40} {ms(run):6.3f}")
    print(f"  {'rans_encode (the whole stream)':<40} {ms(lambda: rans_encode(r, r, False, n, fr, cr, buf, 32)):6.3f}")


if __name__ == "__main__":
    main()
