"""How fast the archive adds and restores a real training step against what its codec alone costs.

For two consecutive Trainer checkpoints L and N of a series (the model's safetensors and the optimizer's
torch file, as training writes them) and each thread count, best of --repeat:

- codec: lmc.compress of every tensor of N alone + every tensor of L against N's (the two codings an add
  makes), one tensor after another with lmc's own threads; decode: lmc.decompress of N's blobs;
- plain write: the bytes an add writes (both segments), written and fsynced; the bytes a restore writes;
- add: Archive.add of N onto an archive holding L (L's raw folder beside N, as in a training run);
- restore: Archive.restore of N and of L (coded against N);
- the add's and the restore's seconds per phase (summed over the pool's threads: Archive.last_phases).

Usage: python codecs/lmc/benchmarks/archive_speed.py SERIES_FOLDER --steps L,N [--threads 1,2] [--out DIR]
Uses lmc's public API only (and torch / safetensors to read the checkpoint's tensors for the codec baseline).
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


def run(series, lstep, nstep, threads, repeat, scratch):
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
    adds, phases = [], []
    for i in range(repeat):
        ap = os.path.join(scratch, f"a-{threads}-{i}")
        shutil.copytree(base, ap)
        a = Archive(ap, threads=threads)
        subprocess.run(["sync"], check=False)
        t0 = time.perf_counter()
        a.add(nf)
        adds.append(time.perf_counter() - t0)
        phases.append(a.last_phases)
    k = int(np.argmin(adds))
    r["add_s"], r["add_phases"] = adds[k], phases[k]
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
    for d in os.listdir(scratch):
        if d.startswith(f"a-{threads}-") or d == f"base-{threads}":
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
        r = run(a.series, lstep, nstep, t, a.repeat, scratch)
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
    if len(rows) > 1:
        L += ["", f"Speed-up from {rows[0]['threads']} to {rows[-1]['threads']} threads: add "
              f"{rows[0]['add_s'] / rows[-1]['add_s']:.2f}x, restore {rows[0]['restore_s'] / rows[-1]['restore_s']:.2f}x, "
              f"codec {rows[0]['codec_s'] / rows[-1]['codec_s']:.2f}x"]
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
