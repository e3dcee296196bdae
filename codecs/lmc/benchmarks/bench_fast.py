"""Coding with a reference at half the alone speed? (issue 21, target 2): lmc's prefer="fast" against lmc alone.

Usage: python codecs/lmc/benchmarks/bench_fast.py [SERIES_DIR] [--repeat R] [--runs K] [--steps N | --pairs R:S,...]

SERIES_DIR: a Hugging Face Trainer folder with checkpoint-<step>/ (model.safetensors, optimizer.pt); default: the
embedded tinygpt series (the newest tinygpt-*/ under ~/.cache/lmcbench, as lmcbench caches it).  For the last N steps, each
against the one before (or the pairs given: S coded against R), per kind (weight, exp_avg, exp_avg_sq: every tensor of the kind concatenated), in fp32 and
in a bf16 cast: the ratio of lmc alone, of lmc with the reference (prefer="speed", the default: the temporal mode
where it saves 1/64, else the delta, XOR or alone coding) and with prefer="fast" (never the temporal mode), and of
z4ai.compress_delta (if installed); then one-thread compress and decompress speed of each lmc coding, every time
the best of R calls, the speeds with the reference over the speed alone measured in the same run, K runs (the
machine is shared: only a ratio from one run is compared).  Every round trip is checked.
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

KINDS = ("weight", "exp_avg", "exp_avg_sq")
CODINGS = ("alone", "speed", "fast")   # lmc alone; with the reference, prefer="speed" / "fast"


def blobs(x, r):
    return {"alone": lmc.compress(x, threads=1), "speed": lmc.compress(x, threads=1, reference=r),
            "fast": lmc.compress(x, threads=1, reference=r, prefer="fast")}


def timings(x, r, repeat):
    """(compress s, decompress s) of each coding, best of repeat."""
    out = {}
    for c in CODINGS:
        ref = None if c == "alone" else r
        pref = "fast" if c == "fast" else "speed"
        tc, b = best(lambda: lmc.compress(x, threads=1, reference=ref, prefer=pref), repeat)
        td, y = best(lambda: lmc.decompress(b, threads=1, reference=ref), repeat)
        assert y.tobytes() == x.tobytes()
        out[c] = (tc, td)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("series", nargs="?")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="the last N steps, each against the one before")
    ap.add_argument("--pairs", default=None, help="R:S,... : step S against step R (instead of --steps)")
    a = ap.parse_args()
    folder = a.series or default_series()
    steps = sorted(int(re.search(r"checkpoint-(\d+)$", p).group(1))
                   for p in glob.glob(os.path.join(folder, "checkpoint-*")))
    pairs = [(steps[i - 1], steps[i]) for i in range(max(1, len(steps) - a.steps), len(steps))]
    if a.pairs:
        pairs = [tuple(int(v) for v in p.split(":")) for p in a.pairs.split(",")]
    print(f"lmc {lmc.__version__}; series {folder}; steps {', '.join(f'{s} against {p}' for p, s in pairs)}; "
          f"1 thread, best of {a.repeat}, {a.runs} runs; z4ai {getattr(z4ai, '__version__', 'missing')}")
    data = {}
    loaded = {s: load_step(os.path.join(folder, f"checkpoint-{s}")) for s in sorted({s for p in pairs for s in p})}
    for dtn, dt in (("fp32", np.float32), ("bf16", ml_dtypes.bfloat16)):
        for kind in KINDS:
            xs = [loaded[s][kind].astype(dt) for _, s in pairs]
            rs = [loaded[p][kind].astype(dt) for p, _ in pairs]
            data[dtn, kind] = (xs, rs)
    x0 = np.zeros(4096, np.float32)
    for dt in (np.float32, ml_dtypes.bfloat16):   # compile / load the kernels first
        for pref in ("speed", "fast"):
            lmc.decompress(lmc.compress(x0.astype(dt), reference=x0.astype(dt), prefer=pref), reference=x0.astype(dt))

    print("\n## Ratio (original / compressed bytes, over the steps)\n")
    print("| dtype | kind | lmc alone | lmc + ref (speed) | lmc + ref (fast) | z4ai delta | fast / z4ai delta | "
          "chunk modes (fast) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    whole = {}
    for (dtn, kind), (xs, rs) in data.items():
        size = dict.fromkeys(CODINGS + ("z4ai",), 0)
        nbytes = 0
        modes = {}
        for x, r in zip(xs, rs):
            bl = blobs(x, r)
            for c, b in bl.items():
                size[c] += len(b)
                y = lmc.decompress(b, reference=None if c == "alone" else r)
                assert y.tobytes() == x.tobytes()
            for m, k in lmc.info(bl["fast"])["chunk_modes"].items():
                modes[m] = modes.get(m, 0) + k
            nbytes += x.nbytes
            if z4ai is not None:
                size["z4ai"] += len(z4ai.compress_delta(x.tobytes(), r.tobytes(), dtype=dtn, threads=1))
        w = whole.setdefault(dtn, dict.fromkeys(size, 0) | {"n": 0})
        for c in size:
            w[c] += size[c]
        w["n"] += nbytes
        z = f"{nbytes / size['z4ai']:.3f}" if size["z4ai"] else "-"
        zr = f"{size['z4ai'] / size['fast']:.3f}x" if size["z4ai"] else "-"
        ms = ", ".join(f"{m} {k}" for m, k in sorted(modes.items()))
        print(f"| {dtn} | {kind} | {nbytes / size['alone']:.3f} | {nbytes / size['speed']:.3f} | "
              f"{nbytes / size['fast']:.3f} | {z} | {zr} | {ms} |")
    for dtn, w in whole.items():
        z = f"{w['n'] / w['z4ai']:.3f}" if w["z4ai"] else "-"
        zr = f"{w['z4ai'] / w['fast']:.3f}x" if w["z4ai"] else "-"
        print(f"| {dtn} | whole checkpoint | {w['n'] / w['alone']:.3f} | {w['n'] / w['speed']:.3f} | "
              f"{w['n'] / w['fast']:.3f} | {z} | {zr} | |")

    print("\n## Speed with the reference / speed alone (one thread; per run: compress, decompress)\n")
    print("| dtype | kind | MiB | alone MiB/s (c / d) | speed: c | speed: d | fast: c | fast: d |")
    print("|---|---|---:|---:|---|---|---|---|")
    tot = {}   # per dtype and run: each coding's (compress s, decompress s) summed over the kinds
    for (dtn, kind), (xs, rs) in data.items():
        runs = []
        for k in range(a.runs):
            t = {c: (0.0, 0.0) for c in CODINGS}
            for x, r in zip(xs, rs):
                tt = timings(x, r, a.repeat)
                t = {c: _add(t[c], tt[c]) for c in CODINGS}
            runs.append(t)
            acc = tot.setdefault(dtn, [])
            if len(acc) <= k:
                acc.append({c: (0.0, 0.0) for c in CODINGS})
            acc[k] = {c: _add(acc[k][c], t[c]) for c in CODINGS}
        mib = sum(x.nbytes for x in xs) / 2**20
        al = runs[0]["alone"]
        print(f"| {dtn} | {kind} | {mib:.1f} | {mib / al[0]:.0f} / {mib / al[1]:.0f} | {_speed_cols(runs)} |")
    for dtn, runs in tot.items():
        print(f"| {dtn} | whole checkpoint | | | {_speed_cols(runs)} |")


def _add(a, b):
    return a[0] + b[0], a[1] + b[1]


def _speed_cols(runs):
    """The table's last four columns: per coding with the reference and direction, every run's time alone over
    its time with the reference (a speed ratio)."""
    return " | ".join(" / ".join(f"{r['alone'][j] / r[c][j]:.2f}x" for r in runs)
                      for c in ("speed", "fast") for j in (0, 1))

if __name__ == "__main__":
    main()
