"""Format 10's zero mask on a Trainer series: bytes against format 9 and z4ai, and what the masked tensors cost
in time (lmc.zmask, FORMAT.md "Zero-mask blob").

    cd codecs/lmc && python -m benchmarks.studies.zero_mask SERIES [--steps 100,300] [--repeat 3]

Why: an embedding's rows for tokens the data never holds get no gradient, so both Adam moments keep them at
exactly 0 (the 300-step tinygpt series: 150 of its 256 byte tokens, 59% of the embedding's moments). lmc's
streams are order-0 per byte plane, where a 59% share of zero bytes among uniform mantissa bytes costs about
4.3 bits a byte instead of the 3.3 the non-zero bytes need; z4ai's order-1 coder sees the runs. At format 9 this
one tensor made fp32 ``exp_avg`` as a whole 0.03% larger than z4ai's (the only kind where lmc's default was).

What it prints, per dtype and kind over the chosen steps (every tensor with its shape, as the archive hands
them; bf16 the cast of the fp32 checkpoint): the ratio of lmc at format 9, at the default (10: the mask where it
pays), and of z4ai's ``compress`` where z4ai is installed; then each tensor the mask takes, with its bytes and,
one thread, best of ``--repeat``, its compress and decompress time at format 9 and at the default."""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

import ml_dtypes
import numpy as np

import lmc
from benchmarks.benchlib import best, load_tensors


def z4ai_size(a):
    try:
        import z4ai
    except ImportError:
        return None
    code = "bf16" if a.dtype == ml_dtypes.bfloat16 else "fp32"
    return len(z4ai.compress(a.tobytes(), dtype=code, threads=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("series", help="a Trainer output folder of checkpoint-<step>/ folders")
    ap.add_argument("--steps", default="", help="comma-separated steps (default: every checkpoint)")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls of each masked tensor (best; default 3)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        raise SystemExit(f"zero_mask: --repeat must be >= 1, got {args.repeat}")
    found = sorted(int(m.group(1)) for d in os.listdir(args.series)
                   if (m := re.fullmatch(r"checkpoint-(\d+)", d)))
    steps = [int(s) for s in args.steps.split(",") if s] or found
    missing = sorted(set(steps) - set(found))
    if missing:
        raise SystemExit(f"zero_mask: {args.series}: no checkpoint-N folder for steps {missing}")
    tot = collections.defaultdict(lambda: collections.Counter())
    wins = []
    for step in steps:
        kinds = load_tensors(os.path.join(args.series, f"checkpoint-{step}"), 1)
        for kind, arrays in kinds.items():
            for i, a32 in enumerate(arrays):
                for dt in ("fp32", "bf16"):
                    a = a32 if dt == "fp32" else a32.astype(ml_dtypes.bfloat16)
                    b9 = lmc.compress(a, format_version=9)
                    b = lmc.compress(a)
                    t = tot[(dt, kind)]
                    t["raw"] += a.nbytes
                    t["v9"] += len(b9)
                    t["now"] += len(b)
                    z = z4ai_size(a)
                    if z is not None:
                        t["z4ai"] += z
                    if lmc.info(b)["zero_mask"] is not None:
                        assert lmc.decompress(b).tobytes() == a.tobytes()
                        times = [best(lambda: lmc.compress(a, format_version=fv, threads=1), args.repeat)[0]
                                 for fv in (9, 10)]
                        times += [best(lambda: lmc.decompress(x, threads=1), args.repeat)[0] for x in (b9, b)]
                        wins.append((step, dt, kind, i, a.shape, len(b9), len(b), z, times))
    print(f"series {args.series}, steps {steps}; ratio = original / compressed bytes; one thread")
    print(f"{'dtype':6} {'kind':11} {'format 9':>9} {'default':>9} {'z4ai':>9} {'default/9':>10}")
    for (dt, kind), t in sorted(tot.items()):
        z = f"{t['raw'] / t['z4ai']:.4f}" if t["z4ai"] else "-"
        print(f"{dt:6} {kind:11} {t['raw'] / t['v9']:9.4f} {t['raw'] / t['now']:9.4f} {z:>9} "
              f"{t['now'] / t['v9']:10.5f}")
    print(f"\ntensors the mask takes ({len(wins)}): step dtype kind index shape, bytes at format 9 / default / z4ai, "
          "ms to compress at 9 / default, to decompress 9 / default")
    for step, dt, kind, i, shape, n9, n, z, tm in wins:
        print(f"  {step} {dt} {kind} {i} {shape}: {n9} / {n} / {z}; " + " / ".join(f"{1e3 * x:.2f}" for x in tm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
