"""How fast the archive adds and restores a real training step against what its codec alone costs.

For two consecutive Trainer checkpoints L and N of a series (the model's safetensors and the optimizer's
torch file, as training writes them) and each thread count, best of --repeat:

- codec: lmc.compress of every tensor of N alone + every tensor of L against N's (the two codings an add
  makes), one tensor after another with lmc's own threads; decode: lmc.decompress of N's blobs;
- plain write: the bytes an add writes (both segments), written and fsynced; the bytes a restore writes;
- add: Archive.add of N onto an archive holding L (L's raw folder beside N, as in a training run);
- restore: Archive.restore of N and of L (coded against N);
- the add's and the restore's seconds per phase (summed over the pool's threads: Archive.last_phases);
- add in the background: the seconds ``Archive.add(..., background=True)`` blocks (N coded alone and
  committed) and the seconds until the re-coding of L behind it is done;
- with ``--peers``, the same step N made durable by the peers at the same thread count: ZipNN (every tensor,
  its own ``threads``, the blobs written and fsynced into one file; decompress) and torch DCP with its
  ZStandard extension (``FileSystemWriter(thread_count=...)``, save and load of N's tensors).

Usage: python codecs/lmc/benchmarks/archive_speed.py SERIES_FOLDER --steps L,N [--threads 1,2] [--peers] [--out DIR]
Uses lmc's public API only (and torch / safetensors to read the checkpoint's tensors for the codec baseline;
zipnn and torch's DCP for the peers).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import lmc
from lmc.archive import Archive


def tensors(folder):
    """{name: array} of a Trainer checkpoint's tensors as the archive codes them: safetensors tensors with
    their shapes, optimizer storages flat."""
    from safetensors.numpy import load_file
    import torch
    out = {}
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            for k, v in load_file(p).items():
                out[f"{name}:{k}"] = v
        elif name == "optimizer.pt":
            sd = torch.load(p, weights_only=True, map_location="cpu")
            for i, st in sd["state"].items():
                for k, v in st.items():
                    if torch.is_tensor(v) and v.numel() > 64:
                        out[f"{name}:{i}.{k}"] = v.contiguous().view(-1).numpy()
    return out


def best(fn, repeat):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def write_fsync(path, blobs):
    with open(path, "wb") as f:
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.unlink(path)


def plain_write(path, blobs):
    with open(path, "wb") as f:
        for b in blobs:
            f.write(b)
    os.unlink(path)


def folder_bytes(folder):
    out = []
    for d, _, names in os.walk(folder):
        for n in sorted(names):
            with open(os.path.join(d, n), "rb") as f:
                out.append(f.read())
    return out


def peers(nt, threads, repeat, scratch):
    """ZipNN and DCP + ZStandard making step N durable at ``threads`` threads: seconds and ratio."""
    r = {}
    raw = sum(v.nbytes for v in nt.values())
    try:
        from zipnn import ZipNN
    except ImportError:
        ZipNN = None
    if ZipNN is not None:
        zs = {}

        def zcodec(v):
            dt = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(str(v.dtype))
            key = dt or "byte"
            if key not in zs:
                zs[key] = (ZipNN(input_format="byte", bytearray_dtype=dt, threads=threads) if dt
                           else ZipNN(input_format="byte", threads=threads))
            return zs[key]

        zblobs = {}

        def zsave():
            for k, v in nt.items():
                zblobs[k] = zcodec(v).compress(v.tobytes())
            write_fsync(os.path.join(scratch, "zipnn"), zblobs.values())

        r["zipnn_save_s"] = best(zsave, repeat)
        r["zipnn_ratio"] = raw / sum(len(b) for b in zblobs.values())
        r["zipnn_decode_s"] = best(lambda: [zcodec(nt[k]).decompress(b) for k, b in zblobs.items()], repeat)
        assert all(np.frombuffer(zcodec(nt[k]).decompress(b), np.uint8).tobytes() == nt[k].tobytes()
                   for k, b in list(zblobs.items())[:4]), "zipnn round trip"
    try:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._extension import ZStandard
        zstd = ZStandard() if ZStandard.is_available() else None
    except ImportError:
        zstd = None
    if zstd is not None:
        import warnings

        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in nt.items()}
        path = os.path.join(scratch, "dcp-zstd")

        def dsave():
            shutil.rmtree(path, ignore_errors=True)
            subprocess.run(["sync"], check=False)
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, thread_count=threads, _extensions=[zstd]))

        r["dcp_zstd_save_s"] = best(dsave, repeat)
        r["dcp_zstd_ratio"] = raw / sum(len(b) for b in folder_bytes(path))
        blank = {k: torch.empty_like(v) for k, v in sd.items()}
        r["dcp_zstd_load_s"] = best(lambda: dcp.load(blank, storage_reader=dcp.FileSystemReader(path)), repeat)
        shutil.rmtree(path, ignore_errors=True)
    return r


def run(series, lstep, nstep, threads, repeat, scratch, with_peers=False):
    lf, nf = (os.path.join(series, f"checkpoint-{s}") for s in (lstep, nstep))
    lt, nt = tensors(lf), tensors(nf)
    r = {"threads": threads}
    blobs_n = {}

    def codec():
        for k, v in nt.items():
            blobs_n[k] = lmc.compress(v, threads=threads)
        for k, v in lt.items():
            lmc.compress(v, reference=nt.get(k), threads=threads)

    r["codec_s"] = best(codec, repeat)
    r["decode_s"] = best(lambda: [lmc.decompress(b, threads=threads) for b in blobs_n.values()], repeat)
    base = os.path.join(scratch, f"base-{threads}")
    Archive(base, threads=threads).add(lf)
    def add(tag, background):  # (seconds the call blocked, seconds until complete, its phases), one copy each
        runs = []
        for i in range(repeat):
            ap = os.path.join(scratch, f"{tag}-{threads}-{i}")
            shutil.copytree(base, ap)
            a = Archive(ap, threads=threads)
            subprocess.run(["sync"], check=False)
            t0 = time.perf_counter()
            a.add(nf, background=background)
            blocked = time.perf_counter() - t0
            a.wait()
            runs.append((blocked, time.perf_counter() - t0, a.last_phases))
        return min(runs, key=lambda x: x[0]), int(np.argmin([x[0] for x in runs]))

    (r["add_s"], _, r["add_phases"]), k = add("a", False)
    # the same add in the background: what the caller waits for, and when the re-coding behind it is done
    (r["add_bg_blocked_s"], r["add_bg_total_s"], _), _ = add("b", True)
    # peak memory of an add, in a child process (VmHWM: counts Numba's buffers and mapped pages)
    ap = os.path.join(scratch, f"a-{threads}-child")
    shutil.copytree(base, ap)
    code = ("import sys; from lmc.archive import Archive; "
            "rss0 = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')); "
            f"Archive({ap!r}, threads={threads}).add({nf!r}); "
            "print(rss0, next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    r["add_child_rss_before_mib"], r["add_child_peak_mib"] = int(out[0]) / 1024, int(out[1]) / 1024
    r["largest_tensor_mib"] = max(v.nbytes for v in nt.values()) / 2**20
    ap = os.path.join(scratch, f"a-{threads}-{k}")
    a = Archive(ap, threads=threads)
    segs = [open(os.path.join(ap, e["segment"]), "rb").read() for e in a.entries()]
    r["add_bytes_written"] = sum(len(s) for s in segs)
    r["write_fsync_s"] = best(lambda: write_fsync(os.path.join(scratch, "plain"), segs), repeat)
    restored = folder_bytes(nf)
    r["restore_bytes"] = sum(len(b) for b in restored)
    r["plain_write_s"] = best(lambda: plain_write(os.path.join(scratch, "plain"), restored), repeat)
    for which, step in (("restore", nstep), ("restore_prev", lstep)):
        ts, ph = [], []
        for i in range(repeat):
            out = os.path.join(scratch, f"r-{threads}-{step}-{i}")
            t0 = time.perf_counter()
            a.restore(step, out)
            ts.append(time.perf_counter() - t0)
            ph.append(a.last_phases)
            shutil.rmtree(out)
        k = int(np.argmin(ts))
        r[f"{which}_s"], r[f"{which}_phases"] = ts[k], ph[k]
    r["add_vs_codec_plus_write"] = r["add_s"] / (r["codec_s"] + r["write_fsync_s"])
    r["restore_vs_decode_plus_write"] = r["restore_s"] / (r["decode_s"] + r["plain_write_s"])
    # archive bytes against the codec's own blobs for the same codings (N alone + L against N)
    blob_bytes = sum(len(b) for b in blobs_n.values()) + sum(
        len(lmc.compress(v, reference=nt.get(k), threads=threads)) for k, v in lt.items())
    r["archive_over_blobs"] = r["add_bytes_written"] / blob_bytes
    r["mib_in"] = sum(len(b) for b in restored) / 2**20
    r["archive_ratio_n"] = sum(v.nbytes for v in nt.values()) / sum(len(b) for b in blobs_n.values())
    if with_peers:
        r.update(peers(nt, threads, repeat, scratch))
    for d in os.listdir(scratch):
        if d.startswith((f"a-{threads}-", f"b-{threads}-")) or d == f"base-{threads}":
            shutil.rmtree(os.path.join(scratch, d))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("series")
    ap.add_argument("--steps", required=True, help="L,N: two consecutive checkpoint steps")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for results.json and report.md")
    ap.add_argument("--scratch", default=None, help="where archives are written (default: a temporary folder)")
    ap.add_argument("--peers", action="store_true", help="also ZipNN and DCP + ZStandard at each thread count")
    a = ap.parse_args()
    lstep, nstep = (int(x) for x in a.steps.split(","))
    scratch = a.scratch or tempfile.mkdtemp(prefix="lmc-archive-speed-")
    os.makedirs(scratch, exist_ok=True)
    rows = []
    # warm-up: compile the kernels once on this data before timing
    run_dir = tempfile.mkdtemp(dir=scratch)
    Archive(os.path.join(run_dir, "w")).add(os.path.join(a.series, f"checkpoint-{lstep}"))
    shutil.rmtree(run_dir)
    for t in (int(x) for x in a.threads.split(",")):
        r = run(a.series, lstep, nstep, t, a.repeat, scratch, a.peers)
        rows.append(r)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    if a.scratch is None:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        commit = None
    meta = {"command": "python " + " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
            "git": commit,
            "cores": os.cpu_count(), "lmc": lmc.__version__, "python": platform.python_version(),
            "series": os.path.abspath(a.series), "steps": [lstep, nstep]}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(a.out, "report.md"), "w") as f:
            f.write(report(meta, rows))


def report(meta, rows):
    rows = sorted(rows, key=lambda r: r["threads"])
    L = [f"# Archive add and restore against the codec (lmc {meta['lmc']})", "",
         f"- command: `{meta['command']}`",
         f"- machine: {meta['machine']}, {meta['cores']} cores; python {meta['python']}; git {meta.get('git')}",
         f"- series: `{meta['series']}`, steps {meta['steps'][0]} -> {meta['steps'][1]}; "
         f"{rows[0]['mib_in']:.1f} MiB per step; best of each measurement", "",
         "| threads | codec s | + write&fsync s | add s | add / (codec + write) | decode s | + plain write s "
         "| restore s | restore / (decode + write) | restore prev s | archive / blobs | add peak RSS MiB |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        L.append(f"| {r['threads']} | {r['codec_s']:.3f} | {r['write_fsync_s']:.3f} | {r['add_s']:.3f} | "
                 f"{r['add_vs_codec_plus_write']:.2f} | {r['decode_s']:.3f} | {r['plain_write_s']:.3f} | "
                 f"{r['restore_s']:.3f} | {r['restore_vs_decode_plus_write']:.2f} | {r['restore_prev_s']:.3f} | "
                 f"{r['archive_over_blobs']:.4f} | {r['add_child_peak_mib']:.0f} |")
    for r in rows[1:]:
        b = rows[0]
        L += ["", f"Speed-up from {b['threads']} to {r['threads']} threads: add {b['add_s'] / r['add_s']:.2f}x, "
              f"restore {b['restore_s'] / r['restore_s']:.2f}x, codec {b['codec_s'] / r['codec_s']:.2f}x, "
              f"decode {b['decode_s'] / r['decode_s']:.2f}x"]
    L += ["", "Add in the background (`background=True`): what the caller waits for (N coded alone, committed) and "
          "when the re-coding of the previous step behind it is done:", "",
          "| threads | add s | background add: blocked s | background add: done s |", "|---:|---:|---:|---:|"]
    for r in rows:
        L.append(f"| {r['threads']} | {r['add_s']:.3f} | {r['add_bg_blocked_s']:.3f} | {r['add_bg_total_s']:.3f} |")
    if any("zipnn_save_s" in r or "dcp_zstd_save_s" in r for r in rows):
        L += ["", "Peers making step N durable at the same thread count (ZipNN: every tensor coded, the blobs "
              "written and fsynced; DCP + ZStandard: `dcp.save` with `FileSystemWriter(thread_count=threads)`). "
              "The archive's figures: its background add's blocked time (N alone, committed) and its full add "
              "(N alone + the previous step re-coded against it); ratio of N alone:", "",
              "| threads | lmc ratio | archive blocked s | archive add s | restore s | ZipNN ratio | ZipNN save s "
              "| ZipNN decode s | DCP+zstd ratio | DCP+zstd save s | DCP+zstd load s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        f = lambda r, k, n=3: f"{r[k]:.{n}f}" if k in r else "-"  # noqa: E731
        for r in rows:
            L.append(f"| {r['threads']} | {r['archive_ratio_n']:.4f} | {r['add_bg_blocked_s']:.3f} | "
                     f"{r['add_s']:.3f} | {r['restore_s']:.3f} | {f(r, 'zipnn_ratio', 4)} | {f(r, 'zipnn_save_s')} | "
                     f"{f(r, 'zipnn_decode_s')} | {f(r, 'dcp_zstd_ratio', 4)} | {f(r, 'dcp_zstd_save_s')} | "
                     f"{f(r, 'dcp_zstd_load_s')} |")
    L += ["", "Add peak RSS: VmHWM of a child process that imports lmc and adds the step (its RSS before the add: "
          f"{rows[0]['add_child_rss_before_mib']:.0f} MiB; the step's largest tensor: "
          f"{rows[0]['largest_tensor_mib']:.1f} MiB)."]
    L += ["", "## Where the time goes (seconds per phase, summed over the pool's threads; wall: the call)", ""]
    for r in rows:
        for which in ("add", "restore", "restore_prev"):
            ph = r[f"{which}_phases"]
            L.append(f"- {r['threads']} thread(s), {which}: " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
