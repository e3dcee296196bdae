"""Save and restore cost along an archive's chain, for this lmc and an older one, in one run.

    python codecs/lmc/bench_chain.py RUN_DIR --out DIR [--before GIT_REV] [--keyframe-every 10] [--threads N]

RUN_DIR holds checkpoint folders (`checkpoint-<N>/`, `step-<N>/`...). For each implementation (this checkout's
lmc, and with --before the lmc of that git revision, checked out into a temporary worktree), a child process
appends every folder to a fresh archive in step order with `reference_folder=None` (the previous step's raw
folder is taken as gone, as after the Trainer's `save_total_limit` rotation: whatever reference a step needs
comes from the archive), timing each add and reading its peak resident memory (VmHWM, reset before each add
through /proc/self/clear_refs); then restores every step, timing each. The children run one after the other on
the same folders. Writes `chain.csv` (one row per implementation x step), `chain.md` and `chain.png` (add and
restore seconds against the step's position).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


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
    folders = []
    for name in os.listdir(run_dir):
        digits = "".join(c for c in name if c.isdigit())
        if digits and os.path.isdir(os.path.join(run_dir, name)) and name.rstrip("0123456789") in (
                "checkpoint-", "step-", "global_step", "step"):
            folders.append((int(digits), os.path.join(run_dir, name)))
    folders.sort()
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
    p.add_argument("--lmc-path", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scratch", default=None)
    a = p.parse_args(argv)
    if a.worker:
        if a.lmc_path:  # import lmc from there, ahead of an editable install's finder
            sys.meta_path[:] = [f for f in sys.meta_path
                                if "editable" not in (getattr(f, "__module__", "") or "").lower()]
            sys.path.insert(0, a.lmc_path)
        worker(a.run_dir, a.worker, a.keyframe_every, a.threads, a.scratch)
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
    lines = ["# Save and restore cost along an archive's chain", "",
             f"- command: `python codecs/lmc/bench_chain.py {' '.join(argv)}`",
             f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"run {time.strftime('%Y-%m-%d %H:%M:%S')}",
             f"- keyframe every {a.keyframe_every}; every add with `reference_folder=None` (references from the "
             "archive); peak memory: the process's VmHWM, reset before each add and restore", "",
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
