"""Where decompressing with a reference spends its time (issue 21, target 2): lmc alone against prefer="fast".

Usage: python delta_costs.py [SERIES_DIR] [--pairs R:S,...] [--kind weight] [--repeat R]

For step S coded against step R (one kind, every tensor of it concatenated, fp32 and a bf16 cast), one thread,
each figure the best of R calls, all in one run:
- decompress alone and with the reference (new output, as a user calls it);
- the same into a preallocated ``out=`` (without the output's allocation and first touch);
- the reference's hash (decompress reads the whole reference first to refuse a wrong one);
- the chunk decoders alone (``_kchunk.decode_range`` over every chunk, into a preallocated output: the kernel).
Every output is checked against the original.
"""
import argparse
import os
import sys

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmc  # noqa: E402
from bench import best  # noqa: E402
from bench_series import default_series, load_step  # noqa: E402
from lmc import _core  # noqa: E402
from lmc._kbase import ck_mode  # noqa: E402
from lmc._kchunk import decode_range  # noqa: E402


def kernel(blob, ref, out):
    """The chunk decoders over every chunk of blob into out (uint8), one thread; returns the statuses."""
    buf = np.frombuffer(blob, np.uint8)
    h = _core._parse_header(buf)
    has_ref = ref is not None
    ru = ref.reshape(-1).view(np.uint8) if has_ref else np.zeros(1, np.uint8)
    status = np.zeros(h["nch"], np.int64)
    decode_range(buf, h["offsets"], h["sizes"], h["chks"], h["total"], h["chunk"], h["unit"], h["layout"],
                 _core._nstreams(h["unit"], h["layout"]), ru, has_ref, out, status, h["version"],
                 np.zeros(1, np.int64), 0, h["nch"])
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("series", nargs="?")
    ap.add_argument("--pairs", default="500:550,950:1000")
    ap.add_argument("--kind", default="weight", choices=("weight", "exp_avg", "exp_avg_sq"))
    ap.add_argument("--repeat", type=int, default=9)
    a = ap.parse_args()
    folder = a.series or default_series()
    print(f"lmc {lmc.__version__}; series {folder}; kind {a.kind}; one thread, best of {a.repeat}; ms\n")
    print("| pair | dtype | MiB | decompress alone | with the reference (fast) | ratio | alone, out= | fast, out= "
          "| reference hash | kernel alone | kernel fast |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pair in a.pairs.split(","):
        p, s = (int(v) for v in pair.split(":"))
        r0 = load_step(os.path.join(folder, f"checkpoint-{p}"))[a.kind]
        x0 = load_step(os.path.join(folder, f"checkpoint-{s}"))[a.kind]
        for dtn, dt in (("bf16", ml_dtypes.bfloat16), ("fp32", np.float32)):
            x, r = x0.astype(dt), r0.astype(dt)
            ba = lmc.compress(x, threads=1)
            bf = lmc.compress(x, threads=1, reference=r, prefer="fast")
            o = np.empty_like(x)
            ou = o.reshape(-1).view(np.uint8)
            t = {}
            t["alone"], y = best(lambda: lmc.decompress(ba, threads=1), a.repeat)
            assert y.tobytes() == x.tobytes()
            t["fast"], y = best(lambda: lmc.decompress(bf, threads=1, reference=r), a.repeat)
            assert y.tobytes() == x.tobytes()
            t["alone_out"], _ = best(lambda: lmc.decompress(ba, threads=1, out=o), a.repeat)
            t["fast_out"], _ = best(lambda: lmc.decompress(bf, threads=1, reference=r, out=o), a.repeat)
            ru = r.reshape(-1).view(np.uint8)
            t["hash"], _ = best(lambda: _core._ref_hash(ru, x.size, _core.DEFAULT_CHUNK, x.itemsize, 1, ck_mode(6)),
                                a.repeat)
            t["k_alone"], st = best(lambda: kernel(ba, None, ou), a.repeat)
            assert not st.any() and o.tobytes() == x.tobytes()
            t["k_fast"], st = best(lambda: kernel(bf, r, ou), a.repeat)
            assert not st.any() and o.tobytes() == x.tobytes()
            ms = {k: f"{v * 1e3:.1f}" for k, v in t.items()}
            print(f"| {p}→{s} | {dtn} | {x.nbytes / 2**20:.1f} | {ms['alone']} | {ms['fast']} | "
                  f"{t['alone'] / t['fast']:.2f}x | {ms['alone_out']} | {ms['fast_out']} | {ms['hash']} | "
                  f"{ms['k_alone']} | {ms['k_fast']} |", flush=True)


if __name__ == "__main__":
    main()
