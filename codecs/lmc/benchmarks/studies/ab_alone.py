"""Two lmc copies coding alone, per tensor with its shape (as the archive hands them: the predicted-exponent mode
needs the rows), one thread, interleaved in one process: compress and decompress MiB/s of each (dtype, kind) of
one checkpoint, and new / old.  Every blob of the new copy must equal the old one's unless ``--bytes-may-change``.

    cd codecs/lmc && python -m benchmarks.studies.ab_alone OLD SERIES/checkpoint-N [--repeat 7]

OLD: a folder holding an older ``lmc`` package (``git archive REV codecs/lmc/lmc | tar -x``, then its
``codecs/lmc``), imported beside this tree's ``lmc`` (benchlib's ``load_old``); tensors of at least
65,536 elements."""
from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

import lmc
from benchmarks.benchlib import interleaved_best, keep_heap, load_old, load_tensors


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("checkpoint")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--kinds", default="exp_avg_sq,exp_avg,weight")
    p.add_argument("--bytes-may-change", action="store_true")
    a = p.parse_args()
    keep_heap(["-m", "benchmarks.studies.ab_alone", *sys.argv[1:]])
    old = load_old(a.old)
    tensors = load_tensors(a.checkpoint, 65536)
    print(f"{a.checkpoint}: old {a.old}, new {lmc.__file__}; one thread, best of {a.repeat} interleaved, MiB/s")
    for kind in a.kinds.split(","):
        for name, dt in (("bf16", ml_dtypes.bfloat16), ("fp32", np.float32)):
            xs = [t.astype(dt) for t in tensors[kind]]
            blobs = {}
            for tag, m in (("old", old), ("new", lmc)):
                blobs[tag] = [m.compress(x, threads=1) for x in xs]
                for b, x in zip(blobs[tag], xs):
                    assert m.decompress(b, threads=1).tobytes() == x.tobytes()
            same = all(bytes(u) == bytes(v) for u, v in zip(blobs["old"], blobs["new"]))
            if not same and not a.bytes_may_change:
                raise SystemExit(f"{kind} {name}: the new copy writes other bytes (--bytes-may-change to time it)")
            fs = []
            for tag, m in (("old", old), ("new", lmc)):
                fs.append(lambda m=m: [m.compress(x, threads=1) for x in xs])
                fs.append(lambda m=m, bl=blobs[tag]: [m.decompress(b, threads=1) for b in bl])
            t = interleaved_best(fs, a.repeat)
            mib = sum(x.nbytes for x in xs) / 2**20
            c0, d0, c1, d1 = (mib / s for s in t)
            print(f"{kind:<11}{name:<5} compress {c0:7.0f} -> {c1:7.0f} ({c1 / c0:.3f}x)   "
                  f"decompress {d0:7.0f} -> {d1:7.0f} ({d1 / d0:.3f}x)   "
                  f"{'same bytes' if same else 'other bytes'}", flush=True)


if __name__ == "__main__":
    main()
