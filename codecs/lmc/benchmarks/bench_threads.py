"""lmc throughput against thread count, on a real checkpoint (and ZipNN's, if installed).

Usage:
    python codecs/lmc/benchmarks/bench_threads.py SERIES_DIR [--step N] [--threads 1,2,4,8,16] [--elements E] [--out DIR]
    python codecs/lmc/benchmarks/bench_threads.py --pack FILE SERIES_DIR [--step N] [--per-kind M]   # ship a sample elsewhere
    python codecs/lmc/benchmarks/bench_threads.py --packed FILE [--threads ...] [--out DIR]

SERIES_DIR is a Hugging Face Trainer folder (checkpoint-<step>/ with model.safetensors and optimizer.pt).
The measured "checkpoint" is the step's weights, exp_avg and exp_avg_sq in equal parts (as in a real
checkpoint: one of each per parameter), concatenated and tiled to ``--elements`` (lmc's chunks are coded
independently, so tiling changes no chunk's code, only how many chunks there are to share out), in fp32 and
in its bf16 cast; the previous step, treated the same, is the reference for the incremental rows.

For each dtype, mode (alone / with the previous step as reference) and thread count: ratio and the best of
``--repeat`` compress and decompress wall times, as GiB/s and GiB/s per thread. ZipNN 0.5 (C, one call per
array, its own ``threads``) runs beside it without a reference.  Every output is checked bit-exact.

``--pack`` writes a sample of the series (``--per-kind`` elements of each kind of both steps, lmc-coded)
into one ``.npz`` small enough to carry to a machine without the series; ``--packed`` measures from it.
Writes ``threads.csv`` and ``report.md`` into ``--out`` (and ``threads.png`` where matplotlib is present).
"""
import argparse
import csv
import os
import platform
import sys

import ml_dtypes
import numpy as np

import lmc
from benchlib import best, load_step, measure_zipnn

KINDS = ("weight", "exp_avg", "exp_avg_sq")
PAPER = {"compress": 2.78, "decompress": 3.76}  # GiB/s on 16 cores, LMC paper (fp32 checkpoints)


def _steps(folder):
    import re
    return sorted(int(m.group(1)) for p in os.listdir(folder)
                  if (m := re.fullmatch(r"checkpoint-(\d+)", p)))


def sample_from_series(folder, step, per_kind):
    """(current, reference) fp32 arrays: ``per_kind`` elements of each kind (None: all), weights first."""
    steps = _steps(folder)
    if not steps:
        raise SystemExit(f"{folder}: no checkpoint-<step> folders")
    cur = step or steps[-1]
    if cur not in steps or steps.index(cur) == 0:
        raise SystemExit(f"{folder}: step {cur} has no earlier step (steps: {steps})")
    prev = steps[steps.index(cur) - 1]
    out = []
    for s in (cur, prev):
        d = load_step(os.path.join(folder, f"checkpoint-{s}"))
        out.append(np.concatenate([d[k][:per_kind] for k in KINDS]))
    return out[0], out[1], f"{folder} step {cur} (reference: step {prev})"


def pack(path, cur, ref, what):
    a = np.frombuffer(lmc.compress(cur), np.uint8)
    b = np.frombuffer(lmc.compress(ref, reference=cur), np.uint8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez(path, cur=a, ref=b, what=np.array(what))
    print(f"packed {cur.size} + {ref.size} elements into {path} ({(a.size + b.size) / 2**20:.1f} MiB)")


def unpack(path):
    with np.load(path) as z:
        cur = lmc.decompress(z["cur"].tobytes())
        ref = lmc.decompress(z["ref"].tobytes(), reference=cur)
        return cur, ref, str(z["what"])


def tile(x, n):
    reps = -(-n // x.size)
    return np.tile(x, reps)[:n].copy()


def zipnn_codec(dtname, threads):
    try:
        from zipnn import ZipNN
    except ImportError:
        return None
    return ZipNN(input_format="byte", bytearray_dtype={"fp32": "float32", "bf16": "bfloat16"}[dtname],
                 threads=threads)


def run(cur32, ref32, threads, repeat, with_zipnn):
    """Rows of (dtype, codec, mode, threads). The thread counts are interleaved within each repeat (1, 2, 4,
    ..., then again), so a shared machine's slow spells fall on every count alike; the best of the repeats is
    kept per cell."""
    rows = []
    for dtname, dt in (("fp32", np.float32), ("bf16", ml_dtypes.bfloat16)):
        x, r = cur32.astype(dt), ref32.astype(dt)
        gib = x.nbytes / 2**30
        w = np.zeros(4096, dt)
        lmc.decompress(lmc.compress(w, reference=w), reference=w)  # compile / load the kernels
        for mode, ref in (("alone", None), ("reference", r)):
            blob = lmc.compress(x, threads=threads[-1], reference=ref)
            y = np.empty_like(x)
            inf = float("inf")
            tc, td, to = ({t: inf for t in threads} for _ in range(3))
            for _ in range(repeat):
                for t in threads:
                    tc[t] = min(tc[t], best(lambda: lmc.compress(x, threads=t, reference=ref), 1)[0])
                    td[t] = min(td[t], best(lambda: lmc.decompress(blob, threads=t, reference=ref), 1)[0])
                    # into a caller's buffer (out=): no fresh pages to fault in, the kernels' own scaling
                    to[t] = min(to[t], best(lambda: lmc.decompress(blob, threads=t, reference=ref, out=y), 1)[0])
            for t in threads:  # byte-identical output for any thread count, and bit-exact round trips
                if lmc.compress(x, threads=t, reference=ref) != blob:
                    raise SystemExit(f"lmc {dtname} {mode}: {t} threads wrote a different blob")
                if lmc.decompress(blob, threads=t, reference=ref).tobytes() != x.tobytes():
                    raise SystemExit(f"lmc {dtname} {mode} {t} threads: round trip is not bit-exact")
            for t in threads:
                rows.append(dict(dtype=dtname, codec="lmc", mode=mode, threads=t, elements=x.size,
                                 ratio=x.nbytes / len(blob), compress_gibs=gib / tc[t], decompress_gibs=gib / td[t],
                                 decompress_out_gibs=gib / to[t]))
                print(_fmt(rows[-1]), flush=True)
        zs = {t: zipnn_codec(dtname, t) for t in threads} if with_zipnn else {}
        if zs and all(zs.values()):
            res = {t: (0, inf, inf) for t in threads}
            for _ in range(repeat):
                for t in threads:
                    ratio, c, d = measure_zipnn(zs[t], x, 1)
                    res[t] = (ratio, min(res[t][1], c), min(res[t][2], d))
            for t in threads:
                ratio, c, d = res[t]
                rows.append(dict(dtype=dtname, codec="zipnn", mode="alone", threads=t, elements=x.size,
                                 ratio=ratio, compress_gibs=gib / c, decompress_gibs=gib / d,
                                 decompress_out_gibs=float("nan")))
                print(_fmt(rows[-1]), flush=True)
    return rows


def _fmt(r):
    return (f"{r['dtype']:<5}{r['codec']:<6}{r['mode']:<10}{r['threads']:>3} thr  ratio {r['ratio']:.4f}  "
            f"compress {r['compress_gibs']:.3f} GiB/s  decompress {r['decompress_gibs']:.3f} GiB/s "
            f"(into out=: {r['decompress_out_gibs']:.3f})")


def machine():
    import numba
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs; python {platform.python_version()}, numpy {np.__version__}, "
            f"numba {numba.__version__} (NUMBA_NUM_THREADS {numba.config.NUMBA_NUM_THREADS}), lmc {lmc.__version__}")


def write(out, rows, what, args):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "threads.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    by = {(r["dtype"], r["codec"], r["mode"], r["threads"]): r for r in rows}
    lines = ["# lmc throughput against threads", "",
             f"- command: `python codecs/lmc/benchmarks/bench_threads.py {' '.join(args)}`",
             f"- machine: {machine()}",
             f"- data: {what}; weights, exp_avg and exp_avg_sq in equal parts, tiled to "
             f"{rows[0]['elements']:,} elements per dtype; best of the repeats; every round trip bit-exact", "",
             "| dtype | codec | mode | threads | ratio | compress GiB/s | decompress GiB/s | decompress into out= | "
             "speed-up c / d vs 1 thread | GiB/s per thread c / d |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        one = by.get((r["dtype"], r["codec"], r["mode"], 1))
        su = (f"{r['compress_gibs'] / one['compress_gibs']:.2f} / {r['decompress_gibs'] / one['decompress_gibs']:.2f}"
              if one else "")
        lines.append(f"| {r['dtype']} | {r['codec']} | {r['mode']} | {r['threads']} | {r['ratio']:.4f} | "
                     f"{r['compress_gibs']:.3f} | {r['decompress_gibs']:.3f} | "
                     f"{'' if r['decompress_out_gibs'] != r['decompress_out_gibs'] else format(r['decompress_out_gibs'], '.3f')}"
                     f" | {su} | "
                     f"{r['compress_gibs'] / r['threads']:.3f} / {r['decompress_gibs'] / r['threads']:.3f} |")
    tmax = max(r["threads"] for r in rows)
    lines += ["", f"The LMC paper: {PAPER['compress']} / {PAPER['decompress']} GiB/s compress / decompress on 16 "
              "cores (fp32 checkpoints)."]
    for dtname in ("fp32", "bf16"):
        r = by.get((dtname, "lmc", "alone", tmax))
        if r:
            lines.append(f"- {dtname}, lmc alone, {tmax} threads: {r['compress_gibs']:.2f} / "
                         f"{r['decompress_gibs']:.2f} GiB/s = {r['compress_gibs'] / PAPER['compress']:.2f}x / "
                         f"{r['decompress_gibs'] / PAPER['decompress']:.2f}x the paper's 16-core figures.")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        plot(rows, os.path.join(out, "threads.png"))
    except ImportError:
        pass
    print("\n".join(lines))


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, what in zip(axes, ("compress", "decompress")):
        for key in sorted({(r["dtype"], r["codec"], r["mode"]) for r in rows}):
            rs = sorted((r for r in rows if (r["dtype"], r["codec"], r["mode"]) == key), key=lambda r: r["threads"])
            ax.plot([r["threads"] for r in rs], [r[f"{what}_gibs"] for r in rs], marker="o",
                    ls="-" if key[1] == "lmc" else "--", label=" ".join(key))
        ax.axhline(PAPER[what], color="k", lw=0.8, ls=":", label="LMC paper, 16 cores")
        ax.set_xlabel("threads")
        ax.set_title(what)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GiB/s")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("series", nargs="?")
    ap.add_argument("--step", type=int)
    ap.add_argument("--pack")
    ap.add_argument("--packed")
    ap.add_argument("--per-kind", type=int, default=2 * 2**20)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--elements", type=int, default=48 * 2**20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-zipnn", action="store_true")
    ap.add_argument("--out", default="bench_threads_out")
    args = ap.parse_args()
    if args.packed:
        cur, ref, what = unpack(args.packed)
    elif args.series:
        cur, ref, what = sample_from_series(args.series, args.step, args.per_kind if args.pack else None)
    else:
        raise SystemExit("give SERIES_DIR or --packed FILE")
    if args.pack:
        return pack(args.pack, cur, ref, what)
    threads = [int(t) for t in args.threads.split(",")]
    rows = run(tile(cur, args.elements), tile(ref, args.elements), threads, args.repeat, not args.no_zipnn)
    write(args.out, rows, what, sys.argv[1:])


if __name__ == "__main__":
    main()
