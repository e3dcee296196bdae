"""Save and restore cost along an archive's chain, for this lmc and an older one, in one run.

    python codecs/lmc/benchmarks/bench_chain.py RUN_DIR --out DIR [--before GIT_REV] [--keyframe-every 10] [--threads N]
                                     [--dcp]

RUN_DIR holds checkpoint folders (`checkpoint-<N>/`, `step-<N>/`...). For each implementation (this checkout's
lmc, and with --before the lmc of that git revision, checked out into a temporary worktree), a child process
appends every folder to a fresh archive in step order with `reference_folder=None` (the previous step's raw
folder is taken as gone, as after the Trainer's `save_total_limit` rotation: whatever reference a step needs
comes from the archive), timing each add and reading its peak resident memory (VmHWM, reset before each add
through /proc/self/clear_refs); then restores every step, timing each. The children run one after the other on
the same folders. Writes `chain.csv` (one row per implementation x step), `chain.md` and `chain.png` (add and
restore seconds against the step's position).

`--dcp`: the same for `lmc.dcp`: each Trainer folder's state (`model.safetensors` weights, `optimizer.pt` read
with `weights_only=True`) saved with `dcp.save(..., LMCStorageWriter(step-<N>, reference=the previous one,
max_chain=K))`, one process (`no_dist`); then each loaded back with `LMCStorageReader`, and the last one saved
plain and loaded with DCP's own FileSystemReader for comparison.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import blank_like as blank  # imported before --lmc-path is put first on sys.path


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(run_dir, out_json, keyframe_every, threads, scratch):
    import lmc
    from lmc.archive import Archive
    folders = _folders(run_dir)
    # warm-up (Numba compiles on first use; an older checkout has no cache): the first two
    # folders through a throwaway archive, added and restored
    w = Archive(os.path.join(scratch, "warm"), keyframe_every=keyframe_every, threads=threads)
    for step, f in folders[:2]:
        w.add(f, step, reference_folder=None)
    for step, _ in folders[:2]:
        w.restore(step, os.path.join(scratch, f"warm-{step}"))
    shutil.rmtree(os.path.join(scratch, "warm"))
    for step, _ in folders[:2]:
        shutil.rmtree(os.path.join(scratch, f"warm-{step}"))
    arc = os.path.join(scratch, "arc")
    a = Archive(arc, keyframe_every=keyframe_every, threads=threads)
    rows = []
    prev_total = 0
    for i, (step, f) in enumerate(folders):
        _reset_peak()
        t = time.perf_counter()
        a.add(f, step, reference_folder=None)
        dt = time.perf_counter() - t
        total = sum(os.path.getsize(os.path.join(arc, n)) for n in os.listdir(arc))
        bytes_in = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(f) for n in ns)
        rows.append({"step": step, "index": i, "add_s": dt, "add_peak_mib": _peak_mib(), "bytes_in": bytes_in,
                     "archive_total_bytes": total, "archive_growth_bytes": total - prev_total})
        prev_total = total
    es = {e["step"]: e for e in a.entries()}
    for r in rows:
        out = os.path.join(scratch, f"r{r['step']}")
        _reset_peak()
        t = time.perf_counter()
        a.restore(r["step"], out)
        r["restore_s"] = time.perf_counter() - t
        r["restore_peak_mib"] = _peak_mib()
        r["depth"] = es[r["step"]]["depth"]
        r["keyframe"] = es[r["step"]]["keyframe"]
        shutil.rmtree(out)
    with open(out_json, "w") as f:
        json.dump({"lmc": getattr(lmc, "__version__", "?"), "lmc_file": lmc.__file__, "rows": rows}, f)


def _dcp_depth(path):
    """How many checkpoints a load of `path` decodes through (its reference chain, itself excluded)."""
    n, seen = 0, set()
    while True:
        with open(os.path.join(path, "lmc-metadata.json")) as f:
            ref = json.load(f).get("reference")
        if not ref or path in seen:
            return n
        seen.add(path)
        path, n = os.path.normpath(os.path.join(path, ref["path"])), n + 1


def worker_dcp(run_dir, out_json, keyframe_every, threads, scratch):
    import warnings

    import lmc
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from lmc.dcp import LMCStorageReader, LMCStorageWriter
    warnings.filterwarnings("ignore")
    folders = _folders(run_dir)

    def state_of(f):
        return {"model": load_file(os.path.join(f, "model.safetensors")),
                "optim": torch.load(os.path.join(f, "optimizer.pt"), weights_only=True, map_location="cpu")}

    def save(st, path, prev):
        dcp.save(st, storage_writer=LMCStorageWriter(path, reference=prev, max_chain=keyframe_every,
                                                     threads=threads), no_dist=True)

    for i, (step, f) in enumerate(folders[:2]):  # warm-up (Numba compiles on first use)
        save(state_of(f), os.path.join(scratch, f"warm-{i}"), os.path.join(scratch, "warm-0") if i else None)
    for i in range(2):
        dcp.load(blank(state_of(folders[0][1])), storage_reader=LMCStorageReader(os.path.join(scratch, f"warm-{i}")),
                 no_dist=True)
    for i in range(2):
        shutil.rmtree(os.path.join(scratch, f"warm-{i}"))
    rows, prev = [], None
    for i, (step, f) in enumerate(folders):
        st = state_of(f)
        path = os.path.join(scratch, f"step-{step}")
        _reset_peak()
        t = time.perf_counter()
        save(st, path, prev)
        dt = time.perf_counter() - t
        bytes_in = sum(t.numel() * t.element_size() for t in _tensors(st))
        rows.append({"step": step, "index": i, "add_s": dt, "add_peak_mib": _peak_mib(), "bytes_in": bytes_in})
        prev = path
        del st
    for r, (step, f) in zip(rows, folders):
        path = os.path.join(scratch, f"step-{step}")
        target = blank(state_of(f))
        _reset_peak()
        t = time.perf_counter()
        dcp.load(target, storage_reader=LMCStorageReader(path), no_dist=True)
        r["restore_s"] = time.perf_counter() - t
        r["restore_peak_mib"] = _peak_mib()
        r["depth"] = _dcp_depth(path)
        r["keyframe"] = r["depth"] == 0
        del target
    total = 0
    for r in rows:
        d = os.path.join(scratch, f"step-{r['step']}")
        r["archive_growth_bytes"] = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
        total += r["archive_growth_bytes"]
        r["archive_total_bytes"] = total
    # the last state saved plain and loaded with DCP's own reader
    st = state_of(folders[-1][1])
    plain = os.path.join(scratch, "plain")
    dcp.save(st, storage_writer=dcp.FileSystemWriter(plain), no_dist=True)
    target = blank(st)
    t = time.perf_counter()
    dcp.load(target, storage_reader=dcp.FileSystemReader(plain), no_dist=True)
    plain_s = time.perf_counter() - t
    with open(out_json, "w") as f:
        json.dump({"lmc": getattr(lmc, "__version__", "?"), "lmc_file": lmc.__file__, "rows": rows,
                   "plain_load_s": plain_s}, f)


def _tensors(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _folders(run_dir):
    folders = []
    for name in os.listdir(run_dir):
        digits = "".join(c for c in name if c.isdigit())
        if digits and os.path.isdir(os.path.join(run_dir, name)) and name.rstrip("0123456789") in (
                "checkpoint-", "step-", "global_step", "step"):
            folders.append((int(digits), os.path.join(run_dir, name)))
    return sorted(folders)


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--before", default=None, metavar="GIT_REV")
    p.add_argument("--keyframe-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dcp", action="store_true", help="lmc.dcp's writer and reader instead of the archive")
    p.add_argument("--lmc-path", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scratch", default=None)
    a = p.parse_args(argv)
    if a.worker:
        if a.lmc_path:  # import lmc from there, ahead of an editable install's finder
            sys.meta_path[:] = [f for f in sys.meta_path
                                if "editable" not in (getattr(f, "__module__", "") or "").lower()]
            sys.path.insert(0, a.lmc_path)
        (worker_dcp if a.dcp else worker)(a.run_dir, a.worker, a.keyframe_every, a.threads, a.scratch)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    repo = _git("rev-parse", "--show-toplevel", cwd=here)
    head = _git("rev-parse", "--short", "HEAD", cwd=repo)
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=repo))
    impls = [(f"this ({head}{'+dirty' if dirty else ''})", os.path.join(repo, "codecs", "lmc"))]
    tmp = tempfile.mkdtemp(prefix="lmc-chain-", dir=a.scratch)
    try:
        if a.before:
            wt = os.path.join(tmp, "before")
            _git("worktree", "add", "--detach", wt, a.before, cwd=repo)
            impls.insert(0, (f"before ({_git('rev-parse', '--short', a.before, cwd=repo)})",
                             os.path.join(wt, "codecs", "lmc")))
        results = {}
        for label, path in impls:
            scratch = tempfile.mkdtemp(dir=tmp)
            js = os.path.join(tmp, f"{len(results)}.json")
            env = dict(os.environ, PYTHONPATH=path + os.pathsep + os.environ.get("PYTHONPATH", ""))
            cmd = [sys.executable, os.path.abspath(__file__), a.run_dir, "--out", a.out, "--worker", js,
                   "--scratch", scratch, "--keyframe-every", str(a.keyframe_every), "--lmc-path", path]
            if a.threads:
                cmd += ["--threads", str(a.threads)]
            if a.dcp:
                cmd += ["--dcp"]
            subprocess.run(cmd, env=env, check=True)
            with open(js) as f:
                results[label] = json.load(f)
            if not results[label]["lmc_file"].startswith(path):
                raise SystemExit(f"{label}: imported lmc from {results[label]['lmc_file']}, not {path}")
            shutil.rmtree(scratch)
            print(f"{label}: done", file=sys.stderr, flush=True)
    finally:
        if a.before:
            subprocess.run(["git", "worktree", "remove", "--force", os.path.join(tmp, "before")], cwd=repo,
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _write(a, results, argv if argv is not None else sys.argv[1:])


def _write(a, results, argv):
    import csv
    os.makedirs(a.out, exist_ok=True)
    rows = [{"impl": label, **r} for label, res in results.items() for r in res["rows"]]
    with open(os.path.join(a.out, "chain.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import platform
    title = ("Save and load cost along an lmc.dcp chain" if a.dcp else "Save and restore cost along an archive's chain")
    lines = [f"# {title}", "",
             f"- command: `python codecs/lmc/benchmarks/bench_chain.py {' '.join(argv)}`",
             f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"run {time.strftime('%Y-%m-%d %H:%M:%S')}",
             (f"- max_chain {a.keyframe_every}; `dcp.save` with `LMCStorageWriter(reference=the previous checkpoint)`, "
              "`dcp.load` with `LMCStorageReader`, one process; " if a.dcp else
              f"- keyframe every {a.keyframe_every}; every add with `reference_folder=None` (references from the "
              "archive); ") + "peak memory: the process's VmHWM, reset before each add and restore", "",
             "| implementation | steps | MiB in | archive MiB | add s (first / median / max) | add peak MiB (max) | "
             "restore s: latest | restore s: median over steps | restore s: max | max depth |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    import statistics as st
    for label, res in results.items():
        rs = res["rows"]
        adds = [r["add_s"] for r in rs]
        lines.append(
            f"| {label} | {len(rs)} | {sum(r['bytes_in'] for r in rs) / 2**20:.1f} | "
            f"{rs[-1]['archive_total_bytes'] / 2**20:.1f} | {adds[0]:.2f} / {st.median(adds[1:] or adds):.2f} / "
            f"{max(adds):.2f} | {max(r['add_peak_mib'] for r in rs):.0f} | {rs[-1]['restore_s']:.2f} | "
            f"{st.median(r['restore_s'] for r in rs):.2f} | {max(r['restore_s'] for r in rs):.2f} | "
            f"{max(r['depth'] for r in rs)} |")
    for label, res in results.items():
        if "plain_load_s" in res:
            lines.append(f"\n{label}: the last state saved plain and loaded with DCP's FileSystemReader: "
                         f"{res['plain_load_s']:.2f} s (LMC, the same state: {res['rows'][-1]['restore_s']:.2f} s).")
    keyf = [r for r in rows if r["keyframe"]]
    if keyf:
        lines += ["", f"Restoring a keyframe (median over implementations and keyframes): "
                      f"{st.median(r['restore_s'] for r in keyf):.2f} s."]
    with open(os.path.join(a.out, "chain.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for label, res in results.items():
        rs = res["rows"]
        ax[0].plot([r["index"] for r in rs], [r["add_s"] for r in rs], marker="o", label=label)
        ax[1].plot([r["index"] for r in rs], [r["restore_s"] for r in rs], marker="o", label=label)
    ax[0].set(title="add (s)", xlabel="checkpoint (in order)")
    ax[1].set(title="restore (s)", xlabel="checkpoint (in order)")
    ax[1].axvline(len(rs) - 1, color="grey", lw=0.5)
    for x in ax:
        x.grid(alpha=0.3)
        x.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "chain.png"), dpi=110)


if __name__ == "__main__":
    main()
