"""Where lmc's alone coding spends its bits and time on the exponent stream, per kind of a real checkpoint.

Usage (from codecs/lmc, as a module: it reads the checkpoint with benchmarks/benchlib.py):
python -m benchmarks.studies.stream_costs CHECKPOINT_DIR [--min-elements N]

CHECKPOINT_DIR: a Hugging Face Trainer checkpoint folder (as for benchmarks/bench_alone.py). For every 128 Ki-element chunk
of every tensor of at least N elements (with its shape), cast to bf16: the exponent stream's order-0 entropy,
what Huffman (lmc's length-limited code) and a rANS stream (quantised to 4096, tables included) spend on it,
the entropy with the previous exponent as context (a table per context, clamped like the temporal mode's) and
the entropy of the predicted-exponent residuals (format 3); bits per element, summed over the chunks. Then, on
one chunk of the largest second moment, one thread, best of 50: ms per chunk to decode the exponent stream as
rANS, to undo the prediction (exp_restore), to compute the residuals (exp_residuals), and a whole lmc alone
decode of that chunk (format 2, all streams, checksum included).
"""
import argparse

import ml_dtypes
import numpy as np

import lmc
from benchmarks.benchlib import best, load_tensors
from lmc.kernels.huffman import huffman_lengths
from lmc.kernels.rans import (build_rans_dtab, cum_freqs, freq_table_bytes, rans_cost_bits, rans_decode, rans_encode,
                        rans_normalize)
from lmc.kernels.restore import exp_restore
from lmc.kernels.streams import exp_residuals

CHUNK = 1 << 17


def entropy_bits(sym, ctx=None, nctx=1):
    ctx = np.zeros(sym.size, np.int64) if ctx is None else ctx.astype(np.int64)
    c = np.bincount(ctx * 256 + sym, minlength=nctx * 256).reshape(nctx, 256).astype(float)
    tot = c.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(c > 0, c / np.maximum(tot, 1), 1.0)
    return float(-(c * np.log2(p)).sum())


def chunk_costs(e, w):
    n = e.size
    cnt = np.bincount(e, minlength=256).astype(np.int64)
    lens = np.zeros(256, np.uint8)
    huffman_lengths(cnt, lens)
    f = np.zeros(256, np.int64)
    rans_normalize(cnt, 0, 256, f)
    prev = np.concatenate([[e[0]], e[:-1]]).astype(np.int64)
    ctx = np.clip(int(e.max()) - prev, 0, 14)
    r = np.empty(n, np.uint8)
    exp_residuals(e, n, w, r)
    return np.array([entropy_bits(e), float((cnt * lens).sum()),
                     rans_cost_bits(cnt, f, 0, 256) + 8 * (freq_table_bytes(f, 0, 256) + 16),
                     entropy_bits(e, ctx, 15), entropy_bits(r)])


def best_ms(fn, repeat=50):
    """The shortest of ``repeat`` calls of fn(), in ms."""
    return 1e3 * best(fn, repeat)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--min-elements", type=int, default=65536)
    a = ap.parse_args()
    kinds = load_tensors(a.folder, a.min_elements)
    print(f"{a.folder}: bf16 cast, exponent stream, bits per element over 128 Ki chunks")
    print(f"{'kind':12s} {'entropy':>8s} {'Huffman':>8s} {'rANS':>8s} {'prev ctx':>8s} {'predicted':>9s}")
    for kind, arrs in kinds.items():
        acc, n = np.zeros(5), 0
        for x in arrs:
            u = x.astype(ml_dtypes.bfloat16).reshape(-1).view(np.uint16)
            w = x.shape[-1] if x.ndim >= 2 else x.size
            for s in range(0, u.size, CHUNK):
                e = ((u[s:s + CHUNK] >> 7) & 0xFF).astype(np.uint8)
                acc += chunk_costs(e, w)
                n += e.size
        print(f"{kind:12s} " + " ".join(f"{v / n:8.4f}" for v in acc[:4]) + f" {acc[4] / n:9.4f}")
    x = max(kinds["exp_avg_sq"], key=lambda t: t.size)
    w = x.shape[-1]
    xb = x.astype(ml_dtypes.bfloat16).reshape(-1)[:CHUNK // w * w].reshape(-1, w)
    e = ((xb.reshape(-1).view(np.uint16) >> 7) & 0xFF).astype(np.uint8)
    n = e.size
    cnt = np.bincount(e, minlength=256).astype(np.int64)
    f = np.zeros(256, np.int64)
    rans_normalize(cnt, 0, 256, f)
    cm = np.zeros(256, np.int64)
    cum_freqs(f, 0, cm)
    buf = np.empty(2 * n + 32, np.uint8)
    q = rans_encode(e, e, False, n, f, cm, buf, 4)
    dtab = np.empty(4096, np.uint32)
    build_rans_dtab(f, cm, 0, dtab, 0)
    out = np.empty(n + 16, np.uint8)
    r = np.empty(n, np.uint8)
    exp_residuals(e, n, w, r)
    work = r.copy()
    blob = lmc.compress(xb, threads=1, format_version=2)
    print(f"\none chunk of {n} elements (rows of {w}), ms: rANS decode of the exponent stream "
          f"{best_ms(lambda: rans_decode(buf, q, buf.size, dtab, out, False, out, n, 4)):.3f}, "
          f"exp_restore {best_ms(lambda: (work.__setitem__(slice(None), r), exp_restore(work, n, w))):.3f} "
          f"(with a copy of the residuals), exp_residuals {best_ms(lambda: exp_residuals(e, n, w, r)):.3f}, "
          f"lmc.decompress of the chunk (format 2) {best_ms(lambda: lmc.decompress(blob, threads=1)):.3f}")


if __name__ == "__main__":
    main()
