"""Helpers the benchmark scripts share: timing, ZipNN, and reading a Hugging Face Trainer checkpoint series.

Imported by its plain name (``from benchlib import best``): a script run by its path has this folder first on
sys.path.
"""
import glob
import importlib.util
import os
import sys
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


def default_format():
    """The format_version lmc.compress writes when not told (public API: its signature's default)."""
    import inspect

    import lmc
    return inspect.signature(lmc.compress).parameters["format_version"].default


def load_old(folder):
    """The ``lmc`` package in ``folder`` (an older commit's ``codecs/lmc``) imported as ``lmc_old``, beside this
    tree's ``lmc``."""
    spec = importlib.util.spec_from_file_location(
        "lmc_old", os.path.join(folder, "lmc", "__init__.py"),
        submodule_search_locations=[os.path.join(folder, "lmc")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["lmc_old"] = mod
    spec.loader.exec_module(mod)
    return mod


def interleaved_best(fs, repeat):
    """The best seconds of each function in ``fs``, timed in turn in each of ``repeat`` rounds: interleaved, so
    that a slow spell of the machine (on a shared VM, seconds long and up to 2x) falls on all of them rather
    than on whichever was timed during it. An entry may be a pair ``(prepare, f)``: ``f(prepare())`` is timed,
    ``prepare()`` (e.g. a fresh copy of an input the function modifies) is not. Each round starts one function
    further on, so that none is always the first after the others (whatever the one before leaves, freed memory
    or a cold cache, falls on each in turn)."""
    b = [float("inf")] * len(fs)
    for r in range(repeat):
        for k in range(len(fs)):
            i = (r + k) % len(fs)
            f = fs[i]
            prepare, f = f if isinstance(f, tuple) else (None, f)
            arg = () if prepare is None else (prepare(),)
            t = time.perf_counter()
            f(*arg)
            b[i] = min(b[i], time.perf_counter() - t)
    return b


HEAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def keep_heap(argv):
    """Run this process again (``argv``: the command line to exec) with glibc keeping every allocation up to
    32 MiB on its heap and never trimming it, unless that is already so. glibc otherwise hands a large output
    fresh pages (mmap) until a free raises its threshold, and returns the heap's free top to the system, so
    whether a decompress paid a page fault per 4 KiB of output depended on what the process had done before
    (bf16 weights decoded at 953 or 2382 MiB/s by the order of the kinds); a fault costs about as much as the
    decoding into the page, on both sides of every ratio."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        os.execve(sys.executable, [sys.executable, *argv], dict(os.environ, **HEAP_ENV))


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


def last_two_weights(series, who):
    """(the last two steps of a Trainer series folder of checkpoint-N/, the weights of load_tensors(..., 65536) of
    each: (before, last), (old, new)); ``who``: the error's prefix."""
    import re
    steps = sorted(int(m.group(1)) for d in os.listdir(series) if (m := re.fullmatch(r"checkpoint-(\d+)", d)))
    if len(steps) < 2:
        raise SystemExit(f"{who}: {series}: needs two checkpoint-N folders")
    old, new = (load_tensors(os.path.join(series, f"checkpoint-{s}"), 65536)["weight"] for s in steps[-2:])
    return (steps[-2], steps[-1]), (old, new)


def blank_like(state):
    """A state dict's structure (nested dicts, lists and tuples) with an uninitialised tensor of the same dtype
    and shape in place of each tensor, other leaves kept: what a DCP load fills."""
    import torch
    from torch.utils._pytree import tree_map_only
    return tree_map_only(torch.Tensor, torch.empty_like, state)
