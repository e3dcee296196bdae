"""Child process for test_corruption: decodes thousands of damaged blobs.

Exit status 0 iff every blob either raised lmc.FormatError or decoded to
exactly the original.  Prints a summary line.  A crash shows as a signal.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lmc  # noqa: E402
from helpers import make  # noqa: E402
import ml_dtypes  # noqa: E402


def cases():
    rng = np.random.default_rng(1234)
    specs = [
        (make(ml_dtypes.bfloat16, 3001, seed=1), None, 700),
        (make(np.float32, 1501, seed=2), None, 512),
        (make(np.float16, 2001, seed=3), None, 1024),
        (make(np.int8, 4001, seed=4), None, 1000),
        (make(np.float32, 999, seed=5, kind="random"), None, 400),
        (np.full(2000, 7, np.uint8), None, 600),
    ]
    r = specs[0][0].copy()
    r.view(np.uint16)[::5] ^= 3
    specs.append((specs[0][0], r, 1000))
    # format v2: temporal chunks (bf16, fp32, fp16), rANS streams alone and under XOR
    from make_vectors import train_pair
    for dt, n, seed, chunk in [(ml_dtypes.bfloat16, 3001, 11, 700), (np.float32, 1501, 12, 512),
                               (np.float16, 2001, 13, 1024)]:
        x, ref = train_pair(dt, n, seed)
        specs.append((x, ref, chunk))
    sk = np.zeros(4000, np.int8)
    sk[::37] = 3
    specs.append((sk, None, 1500))
    i32 = rng.integers(-1000, 1000, 3000).astype(np.int32)
    i32r = i32.copy()
    i32r[::50] ^= 4
    specs.append((i32, i32r, 1000))
    for x, ref, chunk in specs:
        yield x, ref, lmc.compress(x, reference=ref, chunk_size=chunk), rng


def main(total):
    per = total // 12 + 1
    stats = {"error": 0, "exact": 0}
    for x, ref, blob, rng in cases():
        b0 = np.frombuffer(blob, np.uint8)
        for i in range(per):
            kind = i % 5
            if kind == 0:  # truncate
                bad = b0[: rng.integers(0, len(b0))].tobytes()
            elif kind == 1:  # single bit flip
                bb = b0.copy()
                p = rng.integers(0, len(bb))
                bb[p] ^= np.uint8(1 << rng.integers(0, 8))
                bad = bb.tobytes()
            elif kind == 2:  # several byte changes
                bb = b0.copy()
                for _ in range(rng.integers(1, 6)):
                    bb[rng.integers(0, len(bb))] = rng.integers(0, 256)
                bad = bb.tobytes()
            elif kind == 3:  # extend
                bad = blob + rng.integers(0, 256, rng.integers(1, 20), dtype=np.uint8).tobytes()
            else:  # garbage, sometimes with a valid prefix
                g = rng.integers(0, 256, rng.integers(0, 400), dtype=np.uint8).tobytes()
                bad = (blob[: rng.integers(0, 64)] + g) if i % 2 else g
            try:
                y = lmc.decompress(bad, reference=ref)
            except lmc.FormatError:
                stats["error"] += 1
                continue
            if y.dtype != x.dtype or y.shape != x.shape or y.tobytes() != x.tobytes():
                print("WRONG DATA RETURNED", kind, i, flush=True)
                return 2
            stats["exact"] += 1
    print("OK", stats, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2100))
