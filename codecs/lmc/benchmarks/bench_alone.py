"""lmc alone (no reference) against its peers, per kind, on one real Trainer checkpoint: lmc's default (format 9
since lmc 0.4) against format 8 (the same without the bf16 joint-symbol mode: mode 0's exponent stream and a raw
sign/mantissa plane) and format 2 (lmc 0.2's modes, without the predicted exponent), lmc with ``prefer="size"`` (the slower codings
wherever they are smaller, and on bf16 format 5's mantissa-context mode), z4ai ``compress`` and ZipNN, one thread.

Usage: python codecs/lmc/benchmarks/bench_alone.py CHECKPOINT_DIR [--repeat R] [--runs K] [--min-elements N]
       [--untimed NAME,...] [--fresh-pages]

CHECKPOINT_DIR is a Hugging Face Trainer checkpoint folder (``model.safetensors`` + ``optimizer.pt``, as
``lmcbench`` writes for its tinygpt series, e.g. ``~/.cache/lmcbench/tinygpt-*/checkpoint-1000``). Every fp32
tensor of at least N elements (default 65536) with its shape: the weights and AdamW's two moments (mapped to
parameter names by order), as fp32 and cast to bf16. Per (dtype, kind): ratio of every codec (all tensors of the
kind together), then compress / decompress MiB/s with one thread in each of K runs (default 3): every codec's
compress and decompress timed in turn in each of R rounds (default 3), the best of each, so that a slow spell of
the machine falls on all of them; every round trip checked. Each run ends with lmc's default decompressing into
arrays allocated once (``out=``), and the default's speed over ZipNN's. The script runs itself with glibc
keeping allocations up to 32 MiB on its heap (``benchlib.keep_heap``; ``--fresh-pages`` leaves the allocator
alone: every codec's decompress then pays a page fault per 4 KiB of new output or not, by what the process did
before). Codecs named in ``--untimed`` (a name's start, e.g. ``z4ai``, whose compress runs at ~15-40 MiB/s)
give their ratio only.
"""
import argparse
import sys

import ml_dtypes
import numpy as np

import lmc
from benchlib import default_format, interleaved_best as best, keep_heap, load_tensors as load


PREPARE = {}  # codec -> what its compress is given (made outside the timing); default the array itself


def codecs(dtype):
    fv = default_format()
    out = {f"lmc {lmc.__version__} (default, format {fv})": (lambda a: lmc.compress(a, threads=1),
                                                             lambda b: lmc.decompress(b, threads=1)),
           "lmc format 8": (lambda a: lmc.compress(a, threads=1, format_version=8),
                            lambda b: lmc.decompress(b, threads=1)),
           "lmc format 2": (lambda a: lmc.compress(a, threads=1, format_version=2),
                            lambda b: lmc.decompress(b, threads=1)),
           f"lmc {lmc.__version__} prefer=size": (lambda a: lmc.compress(a, threads=1, prefer="size"),
                                   lambda b: lmc.decompress(b, threads=1))}
    try:
        import z4ai
        zd = "bf16" if dtype == ml_dtypes.bfloat16 else "fp32"
        out["z4ai compress"] = (lambda a: z4ai.compress(np.ascontiguousarray(a).tobytes(), dtype=zd, threads=1),
                                lambda b: z4ai.decompress(b))
    except ImportError:
        pass
    try:
        from zipnn import ZipNN
        z = ZipNN(input_format="byte", bytearray_dtype="bfloat16" if dtype == ml_dtypes.bfloat16 else "float32",
                  threads=1)
        # ZipNN may modify its input: it compresses a fresh copy, made before the clock starts (prepare)
        out["ZipNN"] = (lambda a: z.compress(a), lambda b: z.decompress(b))
        PREPARE["ZipNN"] = lambda a: bytearray(a.tobytes())
    except ImportError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--min-elements", type=int, default=65536)
    ap.add_argument("--untimed", default="", help="comma-separated starts of codec names to give the ratio only")
    ap.add_argument("--fresh-pages", action="store_true",
                    help="leave glibc's allocator as it is (outputs then often land on fresh pages: see keep_heap)")
    a = ap.parse_args()
    if not a.fresh_pages:
        keep_heap(sys.argv)
    untimed = tuple(u for u in a.untimed.split(",") if u)
    kinds = load(a.folder, a.min_elements)
    print(f"{a.folder}: tensors of >= {a.min_elements} elements; lmc {lmc.__version__}; one thread; codecs "
          f"interleaved in each of {a.repeat} rounds, best of each; "
          f"{'fresh pages as glibc gives them' if a.fresh_pages else 'allocations up to 32 MiB kept on the heap'}")
    for dtype in (np.float32, ml_dtypes.bfloat16):
        for kind, arrs in kinds.items():
            arrs = [x.astype(dtype) for x in arrs]
            mib = sum(x.nbytes for x in arrs) / 2**20
            cs = codecs(dtype)
            blobs = {}
            for name, (enc, dec) in cs.items():
                prep = PREPARE.get(name, lambda x: x)
                blobs[name] = [enc(prep(x)) for x in arrs]
                for x, b in zip(arrs, blobs[name]):
                    y = dec(b)
                    y = np.frombuffer(y, np.uint8) if isinstance(y, (bytes, bytearray, memoryview)) else np.asarray(y)
                    if y.reshape(-1).view(np.uint8).tobytes() != x.reshape(-1).view(np.uint8).tobytes():
                        raise SystemExit(f"{name}: round trip of a {kind} tensor is not bit-exact")
            ratio = {n: sum(x.nbytes for x in arrs) / sum(len(b) for b in bl) for n, bl in blobs.items()}
            print(f"\n{np.dtype(dtype).name} {kind}: {len(arrs)} tensors, {mib:.1f} MiB")
            print("  ratio   " + "  ".join(f"{n} {r:.4f}" for n, r in ratio.items()))
            first = next(iter(cs))
            cs = {n: c for n, c in cs.items() if not n.startswith(untimed)}
            for run in range(a.runs):
                fs = []
                for name, (enc, dec) in cs.items():
                    prep = PREPARE.get(name, lambda x: x)
                    fs.append((lambda prep=prep: [prep(x) for x in arrs], lambda ins, enc=enc: [enc(x) for x in ins]))
                    fs.append(lambda dec=dec, bl=blobs[name]: [dec(b) for b in bl])
                # the default's decompress again, into arrays allocated (and touched) once: what page faults
                # on a fresh output would cost
                outs = [np.ones_like(x) for x in arrs]
                fs.append(lambda: [lmc.decompress(b, threads=1, out=o) for b, o in zip(blobs[first], outs)])
                ts = best(fs, a.repeat)
                speed = {n: (mib / ts[2 * i], mib / ts[2 * i + 1]) for i, n in enumerate(cs)}
                row = [f"{n} {c:.0f}/{d:.0f}" for n, (c, d) in speed.items()]
                row.append(f"| {first} decompress into out=: {mib / ts[-1]:.0f}")
                if "ZipNN" in cs and first in cs:
                    (c, d), (zc, zd) = speed[first], speed["ZipNN"]
                    row.append(f"| default / ZipNN: compress {c / zc:.2f}x, decompress {d / zd:.2f}x")
                print(f"  run {run + 1}  MiB/s compress/decompress: " + "  ".join(row), flush=True)

if __name__ == "__main__":
    main()
