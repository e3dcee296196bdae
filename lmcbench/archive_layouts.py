"""The archive on the layouts real training writes, beside the same tensors in the plain Trainer layout.

``python -m lmcbench.archive_layouts --run NAME=RUN_DIR[:SOURCE] ... --out DIR``

For each run folder (DeepSpeed ZeRO ``global_step<N>/``, a Trainer's ``checkpoint-<N>/`` around them, FSDP DCP
shards, torchtitan ``step-<N>/``), in one process:

- **archive**: every step folder appended with ``lmc.archive.Archive.add`` in step order (a fresh archive per
  thread count), timed per step; bytes the archive grew by; the opaque bytes (``entries()['opaque']``).
- **plain**: the same tensors, read by lmcbench's source for the layout (``deepspeed`` or ``dcp``: names
  recovered, every kind), written as a plain Trainer folder per step (``model.safetensors``: the weights;
  ``optimizer.pt``: ``{"state": {name: {kind: tensor}}}`` with the master weights, both moments and any other
  state) and archived the same way. The layouts' overhead (flat partitions, alignment padding, zip members) is
  what the ratio of the two shows.
- **zstd-3**: each file of the step compressed alone with zstd level 3 (what "compress every file" gives).

Throughput is the step's bytes in over the seconds ``add`` took, for ``--threads`` (default: 1 and all cores).
Writes ``layouts.csv`` (one row per run x step x threads) and ``layouts.md`` (the command, machine, commit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

LAYOUT_SOURCES = {"deepspeed": "lmcbench.sources.deepspeed:DeepSpeedSource", "dcp": "lmcbench.sources.dcp:DCPSource"}


def _source(kind: str, path: str):
    import importlib

    mod, cls = LAYOUT_SOURCES[kind].split(":")
    src = getattr(importlib.import_module(mod), cls)(path=path)
    src.step_major = True
    return src


def _torch_tensor(arr: np.ndarray):
    import torch

    from lmc.formats.dtypes import BY_NUMPY

    arr = np.ascontiguousarray(arr)
    row = BY_NUMPY[arr.dtype]
    u8 = torch.from_numpy(arr.reshape(-1).view(np.uint8).copy())
    return u8.view(getattr(torch, row.name)).reshape(arr.shape)


def write_plain(kind: str, run: str, out: str) -> list[tuple[int, str]]:
    """The tensors of a run, read by lmcbench's source, as plain Trainer folders ``out/checkpoint-<N>``."""
    import torch
    from safetensors.torch import save_file

    by_step: dict[int, dict] = {}
    for r in _source(kind, run):
        d = by_step.setdefault(r.step, {"w": {}, "o": {}})
        t = _torch_tensor(r.array)
        if r.kind == "weight":
            d["w"][r.name] = t
        else:
            d["o"].setdefault(r.name, {})[r.kind] = t
    folders = []
    for step in sorted(by_step):
        f = os.path.join(out, f"checkpoint-{step}")
        os.makedirs(f)
        if by_step[step]["w"]:
            save_file(by_step[step]["w"], os.path.join(f, "model.safetensors"), metadata={"format": "pt"})
        torch.save({"state": by_step[step]["o"], "param_groups": []}, os.path.join(f, "optimizer.pt"))
        folders.append((step, f))
    return folders


def _files(folder: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, ns in os.walk(folder) for n in ns)


def zstd3(folder: str) -> int:
    import zstandard

    c = zstandard.ZstdCompressor(level=3)
    n = 0
    for p in _files(folder):
        with open(p, "rb") as f:
            n += len(c.compress(f.read()))
    return n


def archive_series(folders, threads, scratch):
    """[(step, bytes_in, archive bytes, opaque, seconds)] of appending the folders to a fresh archive."""
    from lmc.archive import Archive

    path = tempfile.mkdtemp(dir=scratch, prefix="arc-")
    a = Archive(path, threads=threads)
    out = []
    for step, f in folders:
        t = time.perf_counter()
        a.add(f, step)
        dt = time.perf_counter() - t
        e = a.entries()[-1]
        out.append((step, e["bytes_in"], e["size"], e["opaque"], dt))
    shutil.rmtree(path)
    return out


def measure(name: str, run: str, kind: str, threads: list[int], scratch: str) -> list[dict]:
    from lmc.archive import step_folders

    folders = [(s, os.path.join(run, n)) for s, n in step_folders(run)]
    if not folders:
        raise SystemExit(f"{run}: no step folders")
    plain_dir = tempfile.mkdtemp(dir=scratch, prefix="plain-")
    plain = write_plain(kind, run, plain_dir)
    if [s for s, _ in plain] != [s for s, _ in folders]:
        raise SystemExit(f"{run}: the source read steps {[s for s, _ in plain]}, the folders are {folders}")
    # warm-up: Numba compiles on first use
    archive_series(folders[:1], threads[0], scratch)
    rows = []
    z = {s: zstd3(f) for s, f in folders}
    for th in threads:
        lay = archive_series(folders, th, scratch)
        pl = archive_series(plain, th, scratch)
        for (s, bin_, out, opq, sec), (_, pbin, pout, _popq, psec) in zip(lay, pl):
            rows.append({"run": name, "source": kind, "step": s, "threads": th, "bytes_in": bin_,
                         "archive_bytes": out, "opaque_bytes": opq, "archive_s": sec,
                         "plain_bytes_in": pbin, "plain_archive_bytes": pout, "plain_archive_s": psec,
                         "zstd3_bytes": z[s]})
    shutil.rmtree(plain_dir)
    return rows


def render(df, argv: list[str], note: str | None = None, commit: str = "") -> str:
    from .report.header import cores, cpu_name, library_versions
    from .tinygpt.corpus import corpus_id

    lines = ["# The archive on real training layouts, beside the same tensors in the plain Trainer layout", "",
             "- command: `python -m lmcbench.archive_layouts " + " ".join(argv) + "`",
             f"- machine: {cpu_name()}, {cores()} cores; lmcbench git {commit}; "
             f"run {time.strftime('%Y-%m-%d %H:%M:%S')}",
             "- libraries: " + ", ".join(f"{k} {v}" for k, v in sorted(library_versions().items())),
             f"- tinygpt corpus: {corpus_id()}",
             *([f"- {note}"] if note else []), "",
             "Per run: bytes of the step folders, the archive of them (each tensor against the previous step), "
             "the opaque share (bytes stored as plain bytes: configs, RNG, pickles, zip directories), the same "
             "tensors in the plain Trainer layout archived the same way, and every file compressed alone with "
             "zstd-3. Layout/plain: the layout's archive over the plain one's (1.000: no cost from the layout). "
             "Throughput: bytes in per second of `Archive.add`.", ""]
    for th, g in df.groupby("threads"):
        lines += [f"## {th} thread{'s' if th > 1 else ''}", "",
                  "| run | steps | MiB in | archive MiB | ratio | opaque % | plain MiB in | plain archive MiB | "
                  "layout/plain | zstd-3 MiB | archive < zstd-3 every step | MiB/s | plain MiB/s | MiB/s vs plain |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
        for run, r in g.groupby("run", sort=False):
            mib = 2.0 ** 20
            bin_, out, pout = r.bytes_in.sum(), r.archive_bytes.sum(), r.plain_archive_bytes.sum()
            speed, pspeed = bin_ / r.archive_s.sum() / mib, r.plain_bytes_in.sum() / r.plain_archive_s.sum() / mib
            lines.append(f"| {run} | {len(r)} | {bin_ / mib:.2f} | {out / mib:.2f} | {bin_ / out:.3f} | "
                         f"{100 * r.opaque_bytes.sum() / bin_:.2f} | {r.plain_bytes_in.sum() / mib:.2f} | "
                         f"{pout / mib:.2f} | {out / pout:.3f} | {r.zstd3_bytes.sum() / mib:.2f} | "
                         f"{'yes' if (r.archive_bytes < r.zstd3_bytes).all() else 'no'} | {speed:.1f} | "
                         f"{pspeed:.1f} | {speed / pspeed:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    import pandas as pd

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m lmcbench.archive_layouts", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, metavar="NAME=DIR:SOURCE",
                   help="a run folder and the lmcbench source that reads its layout (deepspeed or dcp)")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", default=f"1,{os.cpu_count()}")
    p.add_argument("--scratch", default=None, help="where archives are built (default: a temporary folder)")
    p.add_argument("--note", default=None, help="a line for the report's header (e.g. how the runs were made)")
    a = p.parse_args(argv)
    from .report.header import git_commit

    commit = git_commit()  # before anything is written (the outputs may be tracked files)
    threads = sorted({int(t) for t in a.threads.split(",")})
    os.makedirs(a.out, exist_ok=True)
    scratch = tempfile.mkdtemp(dir=a.scratch, prefix="lmc-layouts-")
    rows = []
    try:
        for spec in a.run:
            name, _, rest = spec.partition("=")
            run, _, kind = rest.rpartition(":")
            if kind not in LAYOUT_SOURCES or not name or not os.path.isdir(run):
                raise SystemExit(f"--run {spec}: expected NAME=DIR:SOURCE with SOURCE one of {sorted(LAYOUT_SOURCES)}")
            rows += measure(name, run, kind, threads, scratch)
            print(f"{name}: done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(a.out, "layouts.csv"), index=False)
    md = render(df, argv, a.note, commit)
    with open(os.path.join(a.out, "layouts.md"), "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
