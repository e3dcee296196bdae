"""How far can bf16 weights go alone? (issue 21, target 1: "real bf16 weights at or above 1.52x"; a measurement)

lmc codes a bf16 element as two byte streams: the exponent (Huffman or rANS) and the sign with the 7 mantissa
bits (almost always raw). This measures, per 128 Ki-element chunk of real bf16 weights (every fp32 tensor of at
least 65,536 elements of a Trainer checkpoint, cast to bf16), the plug-in entropy in bits per element of:

* ``order-0 planes``: the exponent byte and the sign/mantissa byte, each order 0 (what lmc's streams can reach);
* ``exponent | left, up``: the exponent given its left and upper neighbours' exponents (16 x 16 classes, as a
  within-tensor context model would see them; 2-D tensors), the sign/mantissa byte order 0;
* ``sign+mantissa | exponent``: the sign/mantissa byte given the element's own exponent (within a binade a
  bell-shaped weight distribution is denser near zero, so the top mantissa bits are not uniform);
* ``sign + top k mantissa bits | exponent``, k = 1, 2, 3: only those coded with the exponent as context, the
  7 - k low mantissa bits raw; with the cost of the context tables (12 bits per symbol of every exponent value
  used in the chunk), which the rows above leave out.

Each is turned into the bf16 ratio it would give (16 bits over the bits per element). Usage:
    python codecs/lmc/benchmarks/bf16_context.py CHECKPOINT_DIR [--chunk 131072]
"""

from __future__ import annotations

import argparse
import os

import ml_dtypes
import numpy as np


def H(counts):
    c = counts[counts > 0].astype(np.float64)
    n = c.sum()
    return float(-(c * np.log2(c / n)).sum())


def cond(ctx, sym, nctx, nsym):
    """H(sym | ctx) in bits (total over the elements), and the number of (context, symbol) pairs used."""
    j = np.bincount(ctx * nsym + sym, minlength=nctx * nsym)
    return H(j) - H(np.bincount(ctx, minlength=nctx)), int(np.count_nonzero(j))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--chunk", type=int, default=131072)
    a = ap.parse_args()
    from safetensors.numpy import load_file
    w = load_file(os.path.join(a.folder, "model.safetensors"))
    rows = {"order-0 planes": 0.0, "exponent | left, up": 0.0, "sign+mantissa | exponent": 0.0}
    for k in (1, 2, 3):
        rows[f"sign + top {k} mantissa bits | exponent, with tables"] = 0.0
    n_all = 0
    n2d = 0
    h2d_0 = 0.0
    for v in w.values():
        if v.dtype != np.float32 or v.size < 65536:
            continue
        u = v.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)
        if u.ndim == 2 and u.shape[0] > 1 and u.shape[1] > 1:  # the neighbour context, whole tensor
            e2 = (u >> 7) & 0xFF
            x = e2[1:, 1:].ravel()
            lc = np.clip(e2[1:, :-1].ravel() - int(np.median(x)) + 8, 0, 15)
            uc = np.clip(e2[:-1, 1:].ravel() - int(np.median(x)) + 8, 0, 15)
            hc, _ = cond(lc * 16 + uc, x, 256, 256)
            rows["exponent | left, up"] += hc - H(np.bincount(x, minlength=256))  # the gain, added below
            n2d += x.size
            h2d_0 += H(np.bincount(x, minlength=256))
        flat = u.ravel()
        for c0 in range(0, flat.size, a.chunk):
            c = flat[c0:c0 + a.chunk]
            e = (c >> 7) & 0xFF
            sm = ((c >> 8) & 0x80) | (c & 0x7F)
            he = H(np.bincount(e, minlength=256))
            hsm = H(np.bincount(sm, minlength=256))
            n = c.size
            n_all += n
            rows["order-0 planes"] += he + hsm
            rows["sign+mantissa | exponent"] += he + cond(e, sm, 256, 256)[0]
            for k in (1, 2, 3):
                top = ((c >> 15) << k) | ((c >> (7 - k)) & ((1 << k) - 1))  # sign, then the top k mantissa bits
                hk, used = cond(e, top, 256, 1 << (k + 1))
                rows[f"sign + top {k} mantissa bits | exponent, with tables"] += he + hk + (7 - k) * n + 12 * used
    rows["exponent | left, up"] += rows["order-0 planes"]  # order-0 planes plus the (negative) context gain
    print(f"{a.folder}: bf16 weights, {n_all} elements ({n2d} in 2-D tensors with both neighbours), chunks of "
          f"{a.chunk}")
    print("| model | bits per element | bf16 ratio |\n|---|---:|---:|")
    for name, bits in rows.items():
        b = bits / n_all
        print(f"| {name} | {b:.4f} | {16 / b:.4f} |")


if __name__ == "__main__":
    main()
