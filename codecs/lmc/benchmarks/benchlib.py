"""Helpers the benchmark scripts share: timing, ZipNN, and reading a Hugging Face Trainer checkpoint series.

Imported by its plain name (``from benchlib import best``): a script run by its path has this folder first on
sys.path.
"""
import glob
import os
import time

import numpy as np


def best(f, repeat):
    """(the shortest of ``repeat`` calls of f() in seconds, the last call's result)."""
    ts = []
    r = None
    for _ in range(repeat):
        t = time.perf_counter()
        r = f()
        ts.append(time.perf_counter() - t)
    return min(ts), r


def measure_zipnn(z, x, repeat):
    """ZipNN (a ``zipnn.ZipNN``) on the array x: (ratio, best compress s, best decompress s), round trip checked."""
    buf = x.tobytes()
    tcs, tds, zb, d = [], [], None, None
    for _ in range(repeat):
        b = bytearray(buf)  # ZipNN modifies its input: a fresh copy per call, not timed
        t = time.perf_counter()
        zb = z.compress(b)
        tcs.append(time.perf_counter() - t)
        t = time.perf_counter()
        d = z.decompress(zb)
        tds.append(time.perf_counter() - t)
    if bytes(d) != buf:
        raise SystemExit("zipnn: round trip is not bit-exact")
    return len(buf) / len(zb), min(tcs), min(tds)


def default_series():
    """The most recent tinygpt series in lmcbench's cache (``$LMCBENCH_CACHE`` or ``~/.cache/lmcbench``,
    ``tinygpt-*/`` with ``checkpoint-<step>/`` folders). Found by its folder name: lmc's scripts never import
    lmcbench (it sits above lmc); ``lmcbench`` trains the series the first time it runs."""
    cache = os.environ.get("LMCBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmcbench")
    found = [d for d in glob.glob(os.path.join(cache, "tinygpt-*")) if glob.glob(os.path.join(d, "checkpoint-*"))]
    if not found:
        raise SystemExit(f"no SERIES_DIR given and no tinygpt series under {cache}: give a Trainer folder with "
                         "checkpoint-<step>/ folders (or run `lmcbench` once, which trains and caches one)")
    return max(found, key=os.path.getmtime)


def load_step(folder):
    """{kind: one fp32 array}: every weight of a Trainer checkpoint folder (model.safetensors, by name) and
    AdamW's exp_avg and exp_avg_sq (optimizer.pt, by parameter index), each kind concatenated flat."""
    import torch
    from safetensors.torch import load_file
    w = load_file(os.path.join(folder, "model.safetensors"))
    names = sorted(w)
    kinds = {"weight": [w[k].float().numpy().ravel() for k in names]}
    opt = torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True, map_location="cpu")
    st = opt["state"]
    for key in ("exp_avg", "exp_avg_sq"):
        kinds[key] = [st[i][key].float().numpy().ravel() for i in sorted(st)]
    return {k: np.concatenate(v).astype(np.float32) for k, v in kinds.items()}


def load_tensors(folder, min_el):
    """{kind: [arrays with their shapes]}: the fp32 weights of at least ``min_el`` elements of a Trainer
    checkpoint folder and AdamW's two moments of at least as many."""
    import torch
    from safetensors.numpy import load_file
    w = load_file(os.path.join(folder, "model.safetensors"))
    opt = torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True, map_location="cpu")
    kinds = {"weight": [v for v in w.values() if v.dtype == np.float32 and v.size >= min_el]}
    for k in ("exp_avg", "exp_avg_sq"):
        kinds[k] = [s[k].numpy() for s in opt["state"].values() if s[k].numel() >= min_el]
    return kinds


def blank_like(state):
    """A state dict's structure (nested dicts, lists and tuples) with an uninitialised tensor of the same dtype
    and shape in place of each tensor, other leaves kept: what a DCP load fills."""
    import torch
    from torch.utils._pytree import tree_map_only
    return tree_map_only(torch.Tensor, torch.empty_like, state)
