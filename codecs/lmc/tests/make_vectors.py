"""Regenerate the frozen test vectors in tests/vectors/.

Run ONLY when the format version changes on purpose, or when an
encoder-only choice changes the bytes of a vector (then first copy the old
.lmc files, which must still decode, to tests/vectors/v1_legacy/ with an
entry in its manifest.json; test_vectors_legacy.py decodes them forever):
    python tests/make_vectors.py
Each vector: NAME.npy (input), NAME.lmc (blob), optional NAME.ref.npy
(reference), and an entry in manifest.json with the compress arguments.
Every input is written twice: NAME.lmc with format_version=3 (versions 1-3,
unit checksums: the oldest version its modes need) and NAME_v4.lmc with
format_version=4 (word checksums), whose entry names its "input"; then
NAME_v5.lmc with format_version=5 (the strong word checksums) and a
bfloat16 input a fourth time, NAME_v5s.lmc with prefer="size" (where its
chunks take the mantissa-context mode); NAME_v6.lmc with format_version=6
and a float input with a reference once more, NAME_v6f.lmc with
prefer="fast" (its chunks in the delta mode).  Format 7 (32-state rANS streams) has inputs of its own, whose
chunks are long enough for them: `python tests/make_vectors.py --v7` writes only those (NAME_v7.lmc with
prefer="speed" and NAME_v7s.lmc with prefer="size"), leaving the older vectors as they are.
Format 8 (version 7's chunks, a cheaper checksum): `python tests/make_vectors.py --v8` writes NAME_v8.lmc for
every input already frozen (with its chunk size and reference, prefer="speed"), and NAME_v8s.lmc
(prefer="size") for the bfloat16 ones, leaving the rest as it is.
Format 9 (the joint-symbol chunk mode, bfloat16): `python tests/make_vectors.py --v9` first writes the inputs of
its own (vectors_v9: weight-like chunks that take the mode, chunks for each k, exponent spans at and past the
mode's limit), then NAME_v9.lmc (prefer="speed": k = 1) for every input frozen by then, with its chunk size and
reference, and NAME_v9s.lmc (prefer="size": k = 1 to 3) for the bfloat16 ones, leaving the rest as it is.
Format 10 (the zero-mask blob): `python tests/make_vectors.py --v10` writes only its own inputs (vectors_v10:
tensors whose zeros the mask takes), NAME_v10.lmc each, leaving the rest as it is.
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


def train_pair(dt, n, seed, moved=0.3):
    """(x, ref): a weight-like reference and a next step in which a fraction
    `moved` of the values took a small update; special values (NaN, inf,
    +-0, denormals, sign crossings) in both."""
    rng = np.random.default_rng(seed)
    r = (rng.standard_normal(n) * 0.02).astype(np.float32)
    upd = (rng.standard_normal(n) * 2e-4 * (rng.random(n) < moved)).astype(np.float32)
    x = r + upd
    fin = np.finfo(np.dtype(dt)) if np.dtype(dt) != ml_dtypes.bfloat16 else ml_dtypes.finfo(dt)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(fin.smallest_subnormal),
                   -float(fin.smallest_subnormal), float(fin.max), 1e-4, -1e-4], np.float32)
    k = len(sp)
    r[:k] = sp
    x[:k] = sp[::-1]
    r[k:2 * k] = sp
    x[k:2 * k] = sp
    r[2 * k:3 * k] = 1e-5 * np.arange(-5, 5)   # sign crossings
    x[2 * k:3 * k] = -1e-5 * np.arange(-5, 5)
    with np.errstate(over="ignore"):
        return x.astype(dt), r.astype(dt)


def steps(dt, n, seed):
    """(x, ref): train_pair's special values, then stretches of a training step of different sizes (nothing,
    a few ulps, a larger step, a few elements moved far): the delta mode's cuts, field widths and escapes."""
    x, r = train_pair(dt, n, seed, moved=0.5)
    rng = np.random.default_rng(seed + 100)
    x32, r32 = x.astype(np.float32), r.astype(np.float32)
    q = n // 4
    x32[q:2 * q] = r32[q:2 * q]                                        # unchanged ...
    few = q + rng.choice(q, q // 50, replace=False)
    x32[few] = r32[few] * (1 + 0.02 * rng.standard_normal(few.size))   # ... but for a few
    x32[2 * q:3 * q] = r32[2 * q:3 * q] * (1 + 0.05 * rng.standard_normal(q))   # a larger step
    far = rng.choice(n, n // 200, replace=False)
    x32[far] = -r32[far] * 1e3                                        # far moves and sign flips
    x32[:30], r32[:30] = x.astype(np.float32)[:30], r.astype(np.float32)[:30]
    with np.errstate(over="ignore", invalid="ignore"):
        return x32.astype(dt), r32.astype(dt)


def second_moment(dt, rows, cols, seed, steps=4):
    """An Adam second-moment-like matrix: an EMA of squared gradients whose scale is a row factor times a
    column factor (as g = delta x^T makes it), so an exponent is predicted by its row and column neighbours."""
    rng = np.random.default_rng(seed)
    a = np.exp(rng.standard_normal((rows, 1)) * 1.5) * 1e-3
    b = np.exp(rng.standard_normal((1, cols)) * 1.5)
    v = np.zeros((rows, cols))
    for _ in range(steps):
        v = 0.999 * v + 0.001 * (a * b * rng.standard_normal((rows, cols))) ** 2
    return v.astype(np.float32).astype(dt)


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
    # format v2: temporal chunks (fp32 / fp16 / bf16), rANS streams, reference == x
    for name, dt, seed in [("bf16_train", ml_dtypes.bfloat16, 6), ("f32_train", np.float32, 7),
                           ("f16_train", np.float16, 8)]:
        x, r = train_pair(dt, 9001, seed)
        yield name, x, r, 4096
    x, r = train_pair(ml_dtypes.bfloat16, 3000, 9)
    yield "bf16_same", x, x.copy(), 1024
    sk = np.zeros(12000, np.int8)
    sk[rng.random(12000) < 0.03] = rng.integers(-3, 4, 12000)[:1].item() or 1
    sk[::97] = -2
    yield "i8_rans", sk, None, 6000
    i32 = rng.integers(-1000, 1000, 8000).astype(np.int32)
    i32r = i32.copy()
    i32r[rng.random(8000) < 0.02] ^= 4
    yield "i32_xor", i32, i32r, 4000
    # format v3: predicted-exponent chunks (rows of 96; a 1-D tensor: the left neighbour only)
    yield "bf16_sq2d", second_moment(ml_dtypes.bfloat16, 120, 96, 10), None, 4096
    yield "f32_sq2d", second_moment(np.float32, 96, 96, 11, steps=40), None, 4608
    yield "f16_sq2d", (second_moment(np.float32, 96, 96, 12, steps=40) * 1e5).astype(np.float16), None, 4608
    walk = np.exp(np.cumsum(np.random.default_rng(13).standard_normal(6000)) * 0.3) * 1e-4
    yield "bf16_walk1d", walk.astype(np.float32).astype(ml_dtypes.bfloat16), None, 2500
    # format v5: mantissa-context chunks (prefer="size"), the last one of odd length
    yield "bf16_mctx", weights(ml_dtypes.bfloat16, 2 * 16384 + 12001, 15), None, 16384
    # format v6: delta chunks (prefer="fast"), chunks of odd length
    for name, dt, seed in [("bf16_steps", ml_dtypes.bfloat16, 16), ("f32_steps", np.float32, 17),
                           ("f16_steps", np.float16, 18)]:
        x, r = steps(dt, 12003, seed)
        yield name, x, r, 1501


def vectors_v7():
    """Inputs for format 7: chunks of at least 8192 elements (rANS streams with 32 states), the last chunk of
    each shorter (and below 8192: 4 states), with and without a reference."""
    x, r = train_pair(ml_dtypes.bfloat16, 2 * 16384 + 9001, 19)
    yield "bf16_lanes", x, r, 16384
    x, r = train_pair(np.float32, 16384 + 12001, 20)
    yield "f32_lanes", x, r, 16384
    yield "f32_sq_lanes", second_moment(np.float32, 160, 128, 21, steps=40), None, 10240
    yield "bf16_mctx_lanes", weights(ml_dtypes.bfloat16, 2 * 32768 + 8200, 22), None, 32768
    sk = np.zeros(20000, np.int8)
    sk[np.random.default_rng(23).random(20000) < 0.05] = 3
    yield "i8_rans_lanes", sk, None, 20000


def _parity_exponents(rng, n, top):
    """bfloat16 bit patterns whose exponents are uniform on 0..top (both present; 0: zeros and subnormals), the
    top mantissa bit the exponent's parity, the other bits random: what the joint symbol codes (a bit an element
    less than mode 0) wherever it may, i.e. where the exponents span at most 128 values (top <= 127)."""
    e = rng.integers(0, top + 1, n)
    e[:2] = (0, top)
    m = (e & 1) << 6 | rng.integers(0, 64, n)
    return ((rng.integers(0, 2, n) << 15) | e << 7 | m).astype(np.uint16).view(ml_dtypes.bfloat16)


def vectors_v9():
    """Inputs for format 9's joint-symbol chunks (mode 7, bfloat16, alone), each last chunk of odd length and not a
    multiple of 128 (a last block of 128 fields with unused ones).  bf16_joint: weights in chunks of 16384, every
    chunk mode 7 (k = 1 with prefer="speed", 2 with "size").  bf16_joint_k: chunks of 4096 of Laplace, Gaussian
    and log-normal weights, for which "size" takes k = 1, 2 and 3.  bf16_joint_span: weights (mode 7), zeros
    beside the integers 1..100 (exponents 0 and 127..133: no k fits, mode 0), exponents 0..127 (the widest span
    k = 1 fits: base 0, symbols up to 255) and 0..128 (one more: mode 0), weights.  bf16_joint_far: weights beside
    an unrelated reference, so that every chunk is coded alone, in mode 7 (which does not use the reference) in a
    blob with one."""
    bf = ml_dtypes.bfloat16
    yield "bf16_joint", weights(bf, 2 * 16384 + 12001, 24), None, 16384
    rng = np.random.default_rng(25)
    c = 4096
    sign = np.where(rng.random(c + 4093) < 0.5, -1.0, 1.0)
    x = np.concatenate([rng.laplace(0, 0.02, c), rng.standard_normal(c) * 0.02,
                        np.exp(rng.standard_normal(c + 4093) * 0.5) * 0.02 * sign])
    yield "bf16_joint_k", x.astype(np.float32).astype(bf), None, c
    rng = np.random.default_rng(26)
    x = (rng.standard_normal(4 * c + 4093) * 0.02).astype(np.float32)
    x[c:2 * c] = np.where(rng.random(c) < 0.3, 0, rng.integers(1, 101, c))
    x = x.astype(bf)
    x[2 * c:3 * c] = _parity_exponents(rng, c, 127)
    x[3 * c:4 * c] = _parity_exponents(rng, c, 128)
    yield "bf16_joint_span", x, None, c
    n = 3 * c + 4093
    yield "bf16_joint_far", weights(bf, n, 27), weights(bf, n, 28), c


def main_v9():
    """Format 9's own inputs, then a version-9 blob of every input (the older blobs are left as they are: they
    must still decode and re-encode byte for byte with their own format_version)."""
    with open(os.path.join(OUT, "manifest.json")) as f:
        manifest = json.load(f)
    inputs = {}
    for name, e in sorted(manifest.items()):
        inputs.setdefault(e["input"], e)
    for name, x, ref, chunk in vectors_v9():
        np.save(os.path.join(OUT, name + ".npy"), _savable(x))
        if ref is not None:
            np.save(os.path.join(OUT, name + ".ref.npy"), _savable(ref))
        inputs[name] = {"dtype": str(x.dtype), "chunk_size": chunk, "reference": ref is not None}
    _write_version(inputs, manifest, 9)


def vectors_v10():
    """Format 10's inputs (the zero-mask blob): (name, x, None, chunk)."""
    rng = np.random.default_rng(1010)
    e = (np.abs(rng.standard_normal((64, 96))) * 1e-3 + 1e-7).astype(np.float32)
    e[rng.random(64) < 0.55] = 0          # an embedding's moment: rows the data never reached
    pr = (rng.standard_normal(6001) * 0.02).astype(np.float16)
    pr[rng.random(pr.size) < 0.5] = 0     # a pruned weight: zeros scattered, N not a multiple of 8
    pr.view(np.uint16)[1:40:13] = (0x8000, 0x0001, 0x7E01)   # -0.0, a denormal, a NaN: kept values
    ints = rng.integers(-3000, 3000, (48, 80)).astype(np.int32)
    ints[::2] = 0
    return [("f32_zmask", e, None, 4096), ("bf16_zmask", e.astype(ml_dtypes.bfloat16), None, 2048),
            ("f16_pruned", pr, None, 2500), ("i32_zmask", ints, None, 1000)]


def main_v10():
    """Format 10's own inputs, NAME_v10.lmc each (prefer "speed"; every one a zero-mask blob)."""
    with open(os.path.join(OUT, "manifest.json")) as f:
        manifest = json.load(f)
    inputs = {}
    for name, x, ref, chunk in vectors_v10():
        np.save(os.path.join(OUT, name + ".npy"), _savable(x))
        inputs[name] = {"dtype": str(x.dtype), "chunk_size": chunk, "reference": False}
    _write_version(inputs, manifest, 10, sizes=False)
    for name in inputs:
        assert lmc.info(open(os.path.join(OUT, name + "_v10.lmc"), "rb").read())["version"] == 10, name


def main_v7():
    with open(os.path.join(OUT, "manifest.json")) as f:
        manifest = json.load(f)
    for name, x, ref, chunk in vectors_v7():
        np.save(os.path.join(OUT, name + ".npy"), _savable(x))
        if ref is not None:
            np.save(os.path.join(OUT, name + ".ref.npy"), _savable(ref))
        for out, prefer in ((name + "_v7", "speed"), (name + "_v7s", "size")):
            blob = lmc.compress(x, reference=ref, chunk_size=chunk, format_version=7, prefer=prefer)
            with open(os.path.join(OUT, out + ".lmc"), "wb") as f:
                f.write(blob)
            manifest[out] = {"dtype": str(x.dtype), "chunk_size": chunk, "input": name, "format_version": 7,
                             "prefer": prefer, "reference": ref is not None, "size": len(blob)}
            print(f"{out:17s} {x.dtype!s:9s} {str(x.shape):10s} {x.nbytes:7d} -> {len(blob):7d}")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def _write_version(inputs, manifest, fv, sizes=True):
    """NAME_v{fv}.lmc (prefer "speed") of every input, and NAME_v{fv}s.lmc (prefer "size") of the bfloat16
    ones where ``sizes``, with their chunk size and reference; then the manifest."""
    for name, e in sorted(inputs.items()):
        x = load(name, e)
        ref = load(name, e, ".ref.npy") if e["reference"] else None
        runs = [(f"{name}_v{fv}", "speed")] + ([(f"{name}_v{fv}s", "size")] if e["dtype"] == "bfloat16" and sizes
                                               else [])
        for out, prefer in runs:
            blob = lmc.compress(x, reference=ref, chunk_size=e["chunk_size"], format_version=fv, prefer=prefer)
            with open(os.path.join(OUT, out + ".lmc"), "wb") as f:
                f.write(blob)
            manifest[out] = {"dtype": e["dtype"], "chunk_size": e["chunk_size"], "input": name,
                             "format_version": fv, "prefer": prefer, "reference": ref is not None,
                             "size": len(blob)}
            print(f"{out:20s} {x.dtype!s:9s} {str(x.shape):10s} {x.nbytes:7d} -> {len(blob):7d}")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def main_v8():
    with open(os.path.join(OUT, "manifest.json")) as f:
        manifest = json.load(f)
    inputs = {}
    for name, e in sorted(manifest.items()):
        inputs.setdefault(e["input"], e)
    _write_version(inputs, manifest, 8)


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = {}
    for name, x, ref, chunk in vectors():
        # ml_dtypes arrays are stored as their bit patterns (.npy cannot hold them)
        np.save(os.path.join(OUT, name + ".npy"), _savable(x))
        if ref is not None:
            np.save(os.path.join(OUT, name + ".ref.npy"), _savable(ref))
        runs = [(3, name, "speed"), (4, name + "_v4", "speed"), (5, name + "_v5", "speed"),
                (6, name + "_v6", "speed")]
        if x.dtype == ml_dtypes.bfloat16:
            runs.append((5, name + "_v5s", "size"))
        if ref is not None and x.dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
            runs.append((6, name + "_v6f", "fast"))
        for fv, out, prefer in runs:
            blob = lmc.compress(x, reference=ref, chunk_size=chunk, format_version=fv, prefer=prefer)
            with open(os.path.join(OUT, out + ".lmc"), "wb") as f:
                f.write(blob)
            manifest[out] = {"dtype": str(x.dtype), "chunk_size": chunk, "input": name, "format_version": fv,
                             "prefer": prefer, "reference": ref is not None, "size": len(blob)}
            print(f"{out:17s} {x.dtype!s:9s} {str(x.shape):10s} {x.nbytes:7d} -> {len(blob):7d}")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def _savable(x):
    if x.dtype == ml_dtypes.bfloat16:
        return x.view(np.uint16)
    return x


def load(name, entry, suffix=".npy"):
    a = np.load(os.path.join(OUT, entry.get("input", name) + suffix))
    if entry["dtype"] == "bfloat16":
        a = a.view(ml_dtypes.bfloat16)
    return a


if __name__ == "__main__":
    if "--v10" in sys.argv[1:]:
        main_v10()
    elif "--v9" in sys.argv[1:]:
        main_v9()
    elif "--v8" in sys.argv[1:]:
        main_v8()
    else:
        if "--v7" not in sys.argv[1:]:
            main()
        main_v7()
