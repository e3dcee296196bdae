"""What a second thread can buy on this machine: each stage of a restore, alone, at one and at two threads.

A restore decodes every tensor of a step, hashes it and writes it into the restored file. Its speed-up from one
thread to two is bounded by the speed-up of each of those stages on the machine it runs on, measured here on the
same bytes (a real Trainer step's tensors), interleaved (one thread, then two, ``--rounds`` times; best of
each):

- ``alu``: an integer kernel on 16 KiB of data (in L1): what the cores give when memory is not involved;
- ``copy``: the step's bytes copied from one array into another (``np.copyto`` in pieces of 1 MiB);
- ``write``: the step's bytes written into one new file with ``os.pwrite`` (pieces of 1 MiB; page cache, no
  fsync), as a restore writes its file;
- ``hash``: XXH3-128 of each tensor (the archive's check);
- ``decode fresh``: ``lmc.decompress`` of each tensor's blob into memory it has not touched before;
- ``decode reused``: the same into one buffer per thread (as the archive's restore decodes);
- ``restore stages``: decode into the thread's buffer, hash, pwrite into one file: the restore's work without
  its index, reads and checks.

Two threads share the work by tensor (or by 1 MiB piece), as the archive's pool does.

Usage (from codecs/lmc): python -m benchmarks.studies.two_threads [CHECKPOINT_FOLDER] [--rounds 7] [--passes 3]
"""
import argparse
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import xxhash

import lmc
from benchmarks.benchlib import default_series

PIECE = 1 << 20


@numba.njit(nogil=True, cache=True)
def _alu(a, reps):
    s0 = s1 = s2 = s3 = np.uint64(0)
    for _ in range(reps):
        for i in range(0, a.size, 4):
            s0 += a[i] * np.uint64(3) ^ s1
            s1 += a[i + 1] * np.uint64(5)
            s2 += a[i + 2] * np.uint64(7) ^ s3
            s3 += a[i + 3] * np.uint64(9)
    return s0 + s1 + s2 + s3


def step_arrays(folder):
    """Every tensor of a Trainer checkpoint (safetensors weights, the optimizer's tensors), as numpy arrays."""
    import torch
    from safetensors.numpy import load_file
    out = []
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            out += list(load_file(p).values())
        elif name == "optimizer.pt":
            for st in torch.load(p, weights_only=True, map_location="cpu")["state"].values():
                out += [v.numpy() for v in st.values() if torch.is_tensor(v) and v.numel() > 64]
    return out


PASSES = 1


def run(jobs, workers):
    """Seconds to run every job (a no-argument function) on ``workers`` threads, PASSES times over."""
    jobs = list(jobs) * PASSES
    t = time.perf_counter()
    if workers == 1:
        for j in jobs:
            j()
    else:
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(lambda j: j(), jobs))
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="a Trainer checkpoint folder (default: the newest step of the "
                    "newest cached tinygpt series)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=3, help="each timing covers the step this many times (longer "
                    "timings are steadier on a shared machine)")
    a = ap.parse_args()
    global PASSES
    PASSES = a.passes
    folder = a.folder
    if folder is None:
        series = default_series()
        folder = max((os.path.join(series, d) for d in os.listdir(series) if d.startswith("checkpoint-")),
                     key=lambda d: int(d.rsplit("-", 1)[1]))
    arrays = step_arrays(folder)
    blobs = [lmc.compress(x, threads=1) for x in arrays]
    flat = np.concatenate([x.reshape(-1).view(np.uint8) for x in arrays])
    offs = np.concatenate([[0], np.cumsum([x.nbytes for x in arrays])])
    dst = np.empty_like(flat)
    dst[:] = 0  # touched: a copy's destination is resident
    pieces = [(o, min(o + PIECE, flat.size)) for o in range(0, flat.size, PIECE)]
    l1 = np.arange(2048, dtype=np.uint64)
    _alu(l1, 1)
    tls = threading.local()

    def buf(n):
        b = getattr(tls, "b", None)
        if b is None or b.size < n:
            b = tls.b = np.zeros(max(n, 8 << 20), np.uint8)
        return b[:n]

    def dec_into(i, out):
        return lmc.decompress(blobs[i], threads=1, out=out.view(arrays[i].dtype).reshape(arrays[i].shape))

    tmpdir = tempfile.mkdtemp(prefix="two-threads-")
    path = os.path.join(tmpdir, "out")

    def with_file(make_jobs):
        def go(workers):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                return run(make_jobs(fd), workers)
            finally:
                os.close(fd)
                os.unlink(path)
        return go

    def restore_jobs(fd):
        def job(i):
            out = buf(arrays[i].nbytes)
            dec_into(i, out)
            xxhash.xxh3_128_digest(out)
            os.pwrite(fd, out, int(offs[i]))
        return [lambda i=i: job(i) for i in range(len(arrays))]

    stages = {
        "alu": lambda w: run([lambda: _alu(l1, 4000)] * 64, w),
        "copy": lambda w: run([lambda p=p: np.copyto(dst[p[0]:p[1]], flat[p[0]:p[1]]) for p in pieces], w),
        "write": with_file(lambda fd: [lambda p=p: os.pwrite(fd, flat[p[0]:p[1]], p[0]) for p in pieces]),
        "hash": lambda w: run([lambda x=x: xxhash.xxh3_128_digest(x) for x in arrays], w),
        "decode fresh": lambda w: run([lambda i=i: lmc.decompress(blobs[i], threads=1)
                                       for i in range(len(arrays))], w),
        "decode reused": lambda w: run([lambda i=i: dec_into(i, buf(arrays[i].nbytes))
                                        for i in range(len(arrays))], w),
        "restore stages": with_file(restore_jobs),
    }
    best = {(s, w): float("inf") for s in stages for w in (1, 2)}
    for _ in range(a.rounds):
        for s, f in stages.items():
            for w in (1, 2):
                best[s, w] = min(best[s, w], f(w))
    os.rmdir(tmpdir)
    mib = flat.size / 2**20
    print(f"# one thread against two, per stage: {folder}")
    print(f"\n{len(arrays)} tensors, {mib:.1f} MiB, each timing {a.passes} passes over them; best of {a.rounds} "
          f"interleaved rounds; "
          f"{os.cpu_count()} CPUs; numba {numba.__version__}\n")
    print("| stage | 1 thread s | 2 threads s | speed-up |")
    print("|---|---:|---:|---:|")
    for s in stages:
        print(f"| {s} | {best[s, 1]:.4f} | {best[s, 2]:.4f} | {best[s, 1] / best[s, 2]:.2f}x |")


if __name__ == "__main__":
    main()
