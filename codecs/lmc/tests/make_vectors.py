"""Regenerate the frozen test vectors in tests/vectors/.

Run ONLY when the format version changes on purpose, or when an
encoder-only choice changes the bytes of a vector (then first copy the old
.lmc files, which must still decode, to tests/vectors/v1_legacy/ with an
entry in its manifest.json; test_vectors_legacy.py decodes them forever):
    python tests/make_vectors.py
Each vector: NAME.npy (input), NAME.lmc (blob), optional NAME.ref.npy
(reference), and an entry in manifest.json with the compress arguments.
"""
import json
import os
import sys

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import lmc  # noqa: E402

OUT = os.path.join(HERE, "vectors")


def weights(dt, n, seed, scale=0.02):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * scale).astype(np.float32).astype(dt)


def vectors():
    rng = np.random.default_rng(2024)
    bf = weights(ml_dtypes.bfloat16, 20001, 1)
    bf_ref = bf.copy()
    bf_ref.view(np.uint16)[::3] ^= 1
    f32 = weights(np.float32, 6007, 2)
    f32_ref = (f32 + weights(np.float32, 6007, 3, 1e-4)).astype(np.float32)
    yield "bf16_gauss", bf, None, 4096
    yield "bf16_delta", bf, bf_ref, 4096
    yield "f32_odd", f32, None, 2048
    yield "f32_delta", f32, f32_ref, 2048
    yield "f16_odd", weights(np.float16, 7777, 4), None, None
    yield "i8_small", rng.integers(-5, 6, 10003).astype(np.int8), None, 3000
    yield "u8_random", rng.integers(0, 256, 5001).astype(np.uint8), None, 1000
    yield "f64_2d", weights(np.float64, 1200, 5).reshape(30, 40), None, 500
    yield "i32_const", np.full(4097, -7, np.int32), None, 1024
    yield "bf16_scalar", np.array(1.5, ml_dtypes.bfloat16), None, None
    yield "f32_empty", np.zeros((0, 3), np.float32), None, None
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-44, 3.4e38] * 50,
                        np.float32)
    yield "f32_special", specials, None, 64


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = {}
    for name, x, ref, chunk in vectors():
        blob = lmc.compress(x, reference=ref, chunk_size=chunk)
        # ml_dtypes arrays are stored as their bit patterns (.npy cannot hold them)
        np.save(os.path.join(OUT, name + ".npy"), _savable(x))
        if ref is not None:
            np.save(os.path.join(OUT, name + ".ref.npy"), _savable(ref))
        with open(os.path.join(OUT, name + ".lmc"), "wb") as f:
            f.write(blob)
        manifest[name] = {"dtype": str(x.dtype), "chunk_size": chunk,
                          "reference": ref is not None, "size": len(blob)}
        print(f"{name:14s} {x.dtype!s:9s} {str(x.shape):10s} {x.nbytes:7d} -> {len(blob):7d}")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def _savable(x):
    if x.dtype == ml_dtypes.bfloat16:
        return x.view(np.uint16)
    return x


def load(name, entry, suffix=".npy"):
    a = np.load(os.path.join(OUT, name + suffix))
    if entry["dtype"] == "bfloat16":
        a = a.view(ml_dtypes.bfloat16)
    return a


if __name__ == "__main__":
    main()
