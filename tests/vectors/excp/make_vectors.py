"""Regenerate the frozen ExCP test vectors in this folder (the format is frozen in
lmcbench/lossy/excp/FORMAT.md; tests/test_excp_vectors.py decodes these blobs forever).

Run ONLY when the format version changes on purpose, or when an encoder-only choice changes the bytes
of a vector (then keep the old blobs, which must still decode, beside the new ones):
    python tests/vectors/excp/make_vectors.py

Files (everything seeded, nothing depends on the time or the machine):
    inputs.npz     the two checkpoints t0 and t1 (keys "t0|name|kind")
    NAME.excp      one blob per vector
    OUT.out.npz    the arrays decoding NAME.excp must give (keys "name|kind"; an absent key is None),
                   shared by the vectors with the same payload (same inputs and codec options); OUT "t0" or
                   "t1" means the checkpoint itself (a lossless vector), read from inputs.npz
    The .npz files are written with fixed zip timestamps, so regenerating gives the same bytes.
    manifest.json  per vector: the checkpoint encoded, the reference (None, or the weights decoded from
                   another vector), the ExCPConfig options, the archiver level in effect, the out file,
                   the blob size and its sha256; plus the parameter order and the non-numpy dtypes
"""
import hashlib
import io
import json
import os
import sys
import zipfile

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
from lmcbench.lossy.excp import ExCPConfig, encode_checkpoint  # noqa: E402

OUT = HERE
KINDS = ("weight", "exp_avg", "exp_avg_sq")

# name, checkpoint, reference (None or the vector whose decoded weights are the reference), options, out file
VECTORS = [
    ("first_none", "t0", None, {"archiver": "none"}, "t0"),  # every array raw: decodes to t0 itself
    ("resid_b4_none", "t1", "first_none", {"archiver": "none"}, "resid_b4"),
    ("resid_b4_zstd", "t1", "first_none", {"archiver": "zstd"}, "resid_b4"),
    ("resid_b4_lzma", "t1", "first_none", {"archiver": "lzma"}, "resid_b4"),
    ("resid_b4_lmc", "t1", "first_none", {"archiver": "lmc"}, "resid_b4"),
    ("resid_b3_zstd", "t1", "first_none", {"archiver": "zstd", "archiver_level": 3, "bits": 3}, "resid_b3"),
    ("resid_b8_none", "t1", "first_none", {"archiver": "none", "bits": 8}, "resid_b8"),
    ("resid_b4_unscaled_none", "t1", "first_none", {"archiver": "none", "scale_centroids": False},
     "resid_b4_unscaled"),
    ("resid_lossless_lmc", "t1", "first_none",
     {"archiver": "lmc", "prune_weights": False, "prune_moments": False, "quantize": False}, "t1"),  # bit-exact
]


def checkpoints():
    """Two small checkpoints t0 -> t1 of a 'model' that reaches every mode of the container."""
    rng = np.random.default_rng(2024)

    def f32(x):
        return np.asarray(x, dtype=np.float32)

    def moments(shape):
        m = f32(rng.laplace(size=shape) * 1e-4)  # heavy-tailed: enough survive the moment pruning
        v = f32(rng.random(shape) * 1e-8 + 1e-12)  # exp_avg_sq-like: below float16's smallest subnormal
        return m, v

    def step(w, scale):
        return f32(w + f32(rng.standard_normal(w.shape) * scale))

    attn = f32(rng.standard_normal((32, 16)) * 0.02)
    ln = f32(1.0 + rng.standard_normal(16) * 0.01)
    emb = f32(rng.standard_normal((40, 8)) * 0.02)
    frozen = f32(rng.standard_normal(8))
    odd = f32([1.0, -2.0, 0.5, 1e8, 3.0, -0.0, 7.0, 1e-40])
    sparse = f32(rng.standard_normal(256) * 0.02)  # 3 changes: u32 positions
    half = (rng.standard_normal((4, 4)) * 0.02).astype(ml_dtypes.bfloat16)
    t0 = {
        "attn.w": {"weight": attn, **dict(zip(KINDS[1:], moments(attn.shape)))},
        "ln.b": {"weight": ln, **dict(zip(KINDS[1:], moments(ln.shape)))},
        "emb": {"weight": emb},  # no optimizer state
        "frozen": {"weight": frozen, "exp_avg": f32(np.zeros(8)), "exp_avg_sq": f32(np.zeros(8))},
        "odd": {"weight": odd, **dict(zip(KINDS[1:], moments(odd.shape)))},
        "sparse": {"weight": sparse},
        "steps": {"weight": np.array([7, -1, 1 << 40], np.int64)},
        "half": {"weight": half, **dict(zip(KINDS[1:], moments(half.shape)))},
    }
    sp = sparse.copy()
    sp[[3, 17, 250]] += f32(1e-3)
    t1 = {
        "attn.w": {"weight": step(attn, 1e-4), **dict(zip(KINDS[1:], moments(attn.shape)))},
        "ln.b": {"weight": step(ln, 1e-4), **dict(zip(KINDS[1:], moments(ln.shape)))},
        "emb": {"weight": step(emb, 1e-4)},
        "frozen": {k: a.copy() for k, a in t0["frozen"].items()},  # unchanged: mode zero
        "odd": {"weight": f32([1.0, np.nan, 0.5, 1.0, np.inf, 0.0, -np.inf, 2e-40]),
                **dict(zip(KINDS[1:], moments(odd.shape)))},
        "sparse": {"weight": sp},
        "steps": {"weight": np.array([8, -1, 1 << 40], np.int64)},
        "half": {"weight": (half.astype(np.float32) + 1e-3).astype(ml_dtypes.bfloat16),
                 **dict(zip(KINDS[1:], moments(half.shape)))},
    }
    return {"t0": t0, "t1": t1}


def _savable(a):
    return a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a


def _flat(tree, prefix=""):
    """{"prefix|name|kind": array} of a checkpoint tree (absent and None kinds left out)."""
    return {f"{prefix}{n}|{k}": a for n, d in tree.items() for k, a in d.items() if a is not None}


def _save(path, arrays):
    """np.savez_compressed, but with fixed zip timestamps (np.load reads it as any .npz)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for key, a in arrays.items():
            buf = io.BytesIO()
            np.save(buf, _savable(a), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, buf.getvalue())


def load_tree(path, manifest, prefix=""):
    """The tree saved by :func:`_save`: name -> {kind: array or None} in the manifest's parameter order."""
    bf16 = set(manifest["bfloat16"])
    out = {}
    with np.load(path, allow_pickle=False) as z:
        for n in manifest["params"]:
            out[n] = {}
            for k in KINDS:
                key = f"{n}|{k}"
                a = z[prefix + key] if prefix + key in z.files else None
                out[n][k] = a.view(ml_dtypes.bfloat16) if a is not None and key in bf16 else a
    return out


def load_manifest():
    with open(os.path.join(OUT, "manifest.json")) as f:
        return json.load(f)


def main():
    ckpts = checkpoints()
    params = list(ckpts["t0"])
    _save(os.path.join(OUT, "inputs.npz"), {k: a for t, tree in ckpts.items() for k, a in _flat(tree, t + "|").items()})
    manifest = {"params": params,
                "bfloat16": sorted(k for t in ckpts.values() for k, a in _flat(t).items()
                                   if a.dtype == ml_dtypes.bfloat16),
                "vectors": {}}
    recons, outs = {}, dict(ckpts)
    for name, ckpt, ref, opts, out in VECTORS:
        refs = None if ref is None else {n: d["weight"] for n, d in recons[ref].items()}
        cfg = ExCPConfig(**opts)
        blob, recon, _ = encode_checkpoint(ckpts[ckpt], refs, cfg)
        recons[name] = recon
        if out in outs:  # the same expected arrays as another vector (or the checkpoint itself)
            assert _flat(outs[out]).keys() == _flat(recon).keys(), name
            assert all(a.dtype == _flat(recon)[k].dtype and a.tobytes() == _flat(recon)[k].tobytes()
                       for k, a in _flat(outs[out]).items()), name
        else:
            outs[out] = recon
            _save(os.path.join(OUT, out + ".out.npz"), _flat(recon))
        with open(os.path.join(OUT, name + ".excp"), "wb") as f:
            f.write(blob)
        manifest["vectors"][name] = {"checkpoint": ckpt, "reference": ref, "options": opts, "level": cfg.level,
                                     "out": out, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        print(f"{name:24s} {len(blob):6d} bytes")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
