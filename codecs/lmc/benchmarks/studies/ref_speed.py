"""Coding against the previous checkpoint against coding alone, one thread, lmc's default format or ``--format N``
(issue 35's target: with a
reference, at least 0.5x the alone speed to compress and to decompress): per (dtype, kind) of a Trainer series'
last two checkpoints, compress and decompress MiB/s alone and against the previous step, their ratios, and the
sizes; after each dtype's kinds its whole checkpoint (their times and bytes summed).  Public API only, so it runs against any lmc on the path (an older commit's through PYTHONPATH).

    cd codecs/lmc && python -m benchmarks.studies.ref_speed SERIES [--kinds weight,exp_avg,exp_avg_sq]
        [--dtypes bf16,fp32] [--repeat 5] [--fresh-pages] [--format N]

SERIES: a folder of checkpoint-N/ (model.safetensors and optimizer.pt); tensors of at least 65,536 elements."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import ml_dtypes

import lmc
from benchmarks.benchlib import default_format, interleaved_best as best, keep_heap, load_tensors


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("series")
    p.add_argument("--kinds", default="weight,exp_avg,exp_avg_sq")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--format", type=int, default=None, help="format_version (default: lmc's default)")
    p.add_argument("--fresh-pages", action="store_true",
                   help="leave glibc's allocator as it is (its outputs then often land on fresh pages, whose faults "
                        "cost about as much as decoding into them, on both sides of every ratio)")
    a = p.parse_args()
    if not a.fresh_pages:  # (the first kind measured paid for fresh pages otherwise: see keep_heap)
        keep_heap(["-m", "benchmarks.studies.ref_speed", *sys.argv[1:]])
    steps = sorted(int(m.group(1)) for d in os.listdir(a.series) if (m := re.fullmatch(r"checkpoint-(\d+)", d)))
    if len(steps) < 2:
        raise SystemExit(f"ref_speed: {a.series}: needs two checkpoint-N folders")
    old, new = (load_tensors(os.path.join(a.series, f"checkpoint-{s}"), 65536) for s in steps[-2:])
    here = os.path.dirname(os.path.abspath(lmc.__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except OSError:
        rev = ""
    print(f"lmc from {here} ({rev or 'no git'}); checkpoint-{steps[-1]} alone and against checkpoint-{steps[-2]}; "
          f"one thread, format {a.format or 'default (' + str(default_format()) + ')'}, best of {a.repeat} "
          "(the four measurements interleaved); "
          f"{'fresh pages as glibc gives them' if a.fresh_pages else 'allocations up to 32 MiB kept on the heap'}")
    print("| dtype | kind | MiB | comp alone | comp ref | comp ref/alone | dec alone | dec ref | dec ref/alone | "
          "ratio alone | ratio ref |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    # every blob made and round-tripped before anything is timed: a warm-up of every size the timing will
    # allocate (the allocator hands the first kinds measured fresh pages otherwise: bf16 weights measured first
    # decoded alone at 1005 MiB/s, measured last at 2367)
    work = []
    fv = {} if a.format is None else {"format_version": a.format}
    for dt in a.dtypes.split(","):
        cast = (lambda t: t.astype(ml_dtypes.bfloat16)) if dt == "bf16" else (lambda t: t)
        for kind in a.kinds.split(","):
            xs = [cast(t) for t in new[kind]]
            rs = [cast(t) for t in old[kind]]
            ba = [lmc.compress(x, threads=1, **fv) for x in xs]
            br = [lmc.compress(x, reference=r, threads=1, **fv) for x, r in zip(xs, rs)]
            for x, r, b1, b2 in zip(xs, rs, ba, br):
                if (lmc.decompress(b1, threads=1).tobytes() != x.tobytes()
                        or lmc.decompress(b2, reference=r, threads=1).tobytes() != x.tobytes()):
                    raise SystemExit("ref_speed: round trip failed")
            work.append((dt, kind, xs, rs, ba, br))
    rows = []
    whole = {}
    for dt, kind, xs, rs, ba, br in work:
        tot = sum(x.nbytes for x in xs)
        ca, cr, da, dr = best([
            lambda: [lmc.compress(x, threads=1, **fv) for x in xs],
            lambda: [lmc.compress(x, reference=r, threads=1, **fv) for x, r in zip(xs, rs)],
            lambda: [lmc.decompress(b, threads=1) for b in ba],
            lambda: [lmc.decompress(b, reference=r, threads=1) for b, r in zip(br, rs)]], a.repeat)
        mib = tot / 2 ** 20
        row = dict(dtype=dt, kind=kind, mib=mib, comp_alone=mib / ca, comp_ref=mib / cr, dec_alone=mib / da,
                   dec_ref=mib / dr, ratio_alone=tot / sum(map(len, ba)), ratio_ref=tot / sum(map(len, br)))
        rows.append(row)
        _print_row(row, ca, cr, da, dr)
        # the dtype's whole checkpoint (every kind measured: the target's "fp32 whole checkpoint"): the kinds'
        # times and bytes summed, printed after its last kind
        acc = whole.setdefault(dt, dict(n=0, mib=0.0, t=[0.0] * 4, b=[0, 0, 0]))
        acc["n"] += 1
        acc["mib"] += mib
        acc["t"] = [u + v for u, v in zip(acc["t"], (ca, cr, da, dr))]
        acc["b"] = [u + v for u, v in zip(acc["b"], (tot, sum(map(len, ba)), sum(map(len, br))))]
        if acc["n"] == len(a.kinds.split(",")) > 1:
            ca, cr, da, dr = acc["t"]
            mib = acc["mib"]
            row = dict(dtype=dt, kind="whole", mib=mib, comp_alone=mib / ca, comp_ref=mib / cr, dec_alone=mib / da,
                       dec_ref=mib / dr, ratio_alone=acc["b"][0] / acc["b"][1], ratio_ref=acc["b"][0] / acc["b"][2])
            rows.append(row)
            _print_row(row, ca, cr, da, dr)
    print(json.dumps(rows))


def _print_row(row, ca, cr, da, dr):
    kind = "**whole** (the kinds above)" if row["kind"] == "whole" else row["kind"]
    print(f"| {row['dtype']} | {kind} | {row['mib']:.0f} | {row['comp_alone']:.0f} | {row['comp_ref']:.0f} | "
          f"{ca / cr:.2f}x | {row['dec_alone']:.0f} | {row['dec_ref']:.0f} | {da / dr:.2f}x | "
          f"{row['ratio_alone']:.4f} | {row['ratio_ref']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
