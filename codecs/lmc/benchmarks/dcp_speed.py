"""Save and load seconds of ``lmc.dcp.LMCStorageWriter``/``LMCStorageReader`` against plain DCP with torch's
ZStandard stream extension (and plain DCP uncompressed), on the same state dict: a small GPT's weights and its
AdamW moments after a few real training steps (~300 MiB of float32 by default), saved twice, the second save
against the first (``reference=``), as a training run saves its steps.

    python codecs/lmc/benchmarks/dcp_speed.py [--layers 6 --d 512 --vocab 8192] [--repeats 3] [--threads N]
                                              [--dcp-threads N] [--background] [--dir DIR]

Prints, per repeat and as the best of the repeats: plain DCP (save, load), DCP + ZStandard (save, load, size),
LMC (the first step saved alone, the second saved against it, which also re-codes the first against the second;
loading the newest, and the re-coded older one; sizes); then a per-phase breakdown of the LMC save against a
reference: the coding work alone (lmc.compress / lmc.decompress of every tensor, spread over a thread pool as
the writer does), to compare with the save's wall time. Uses only lmc's public API and torch."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.utils._pytree import tree_map_only

import lmc
from lmc.dcp import LMCStorageReader, LMCStorageWriter
from benchlib import blank_like as blank

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def gpt_state(vocab, d, layers, steps, seed=0):
    """A GPT (pre-LN blocks) and its AdamW optimizer after ``steps`` training steps on random tokens; returns
    (model, optimizer, step function)."""
    torch.manual_seed(seed)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.attn = torch.nn.MultiheadAttention(d, max(1, d // 64), batch_first=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.pos = torch.nn.Parameter(torch.zeros(128, d))
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln = torch.nn.LayerNorm(d)
            self.head = torch.nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx) + self.pos[: idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(seed)

    def step():
        idx = torch.randint(0, vocab, (4, 65), generator=g)
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).reshape(-1, vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(steps):
        step()
    return model, opt, step


def snapshot(model, opt):
    msd, osd = get_state_dict(model, opt)
    return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), {"model": msd, "optim": osd})


def tensors(o, prefix=""):
    if isinstance(o, torch.Tensor):
        yield prefix, o
    elif isinstance(o, dict):
        for k, v in o.items():
            yield from tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from tensors(v, f"{prefix}.{i}")


def folder_mib(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 2**20


CPU = {}  # the process's CPU seconds of each timed call, by label (all threads; other load on the machine
# stretches the wall time, not this)


def timed(fn, label=None):
    """Seconds of fn(), after os.sync() and a short pause: every timed save and load starts with no dirty pages
    of an earlier one (on a disk of capped bandwidth the writeback of the saves before would slow the next)."""
    os.sync()
    time.sleep(0.3)
    t, c = time.perf_counter(), time.process_time()
    fn()
    if label is not None:
        CPU.setdefault(label, []).append(time.process_time() - c)
    return time.perf_counter() - t


def phases(s1, s2, workers):
    """Seconds of the coding work of a save against a reference and of the loads, item by item on a pool of
    ``workers`` threads with one lmc thread each (what the writer and reader do with items under 32 MiB)."""
    a = {k: t.numpy() for k, t in tensors(s1) if t.dim() > 0}
    b = {k: t.numpy() for k, t in tensors(s2) if t.dim() > 0}
    keys = sorted(b, key=lambda k: -b[k].nbytes)
    out = {}
    with ThreadPoolExecutor(workers) as pool:
        def run(name, fn):
            t = time.perf_counter()
            res = dict(zip(keys, pool.map(fn, keys)))
            out[name] = time.perf_counter() - t
            return res

        alone1 = run("code step 1 alone (its first save)", lambda k: lmc.compress(a[k], threads=1))
        run("code step 2 alone", lambda k: lmc.compress(b[k], threads=1))
        run("decode step 1 (coded alone)", lambda k: lmc.decompress(alone1[k], threads=1))
        vs = run("code step 1 against step 2", lambda k: lmc.compress(a[k], reference=b[k], threads=1))
        run("decode step 1 through step 2", lambda k: lmc.decompress(vs[k], reference=b[k], threads=1))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="lmc threads (default: all cores)")
    p.add_argument("--dcp-threads", type=int, default=1,
                   help="FileSystemWriter thread_count for plain DCP and DCP + ZStandard (default 1, DCP's own)")
    p.add_argument("--prefer", default="speed", choices=["speed", "size", "fast"],
                   help="the writer's lmc.compress prefer (default: speed, lmc's default)")
    p.add_argument("--background", action="store_true",
                   help="also the save against the reference with background=True, the default where one process "
                        "saves (blocked and done seconds)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    a = p.parse_args(argv)
    try:
        from torch.distributed.checkpoint._extension import ZStandard
        zstd = ZStandard() if ZStandard.is_available() else None
    except ImportError:
        zstd = None
    model, opt, step = gpt_state(a.vocab, a.d, a.layers, steps=3)
    s1 = snapshot(model, opt)
    step()
    s2 = snapshot(model, opt)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors(s2))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"state: {nbytes / 2**20:.1f} MiB in {sum(1 for _ in tensors(s2))} tensors; torch {torch.__version__}, "
          f"lmc {lmc.__version__}, {cores} cores, lmc threads {a.threads or 'all'}, DCP thread_count {a.dcp_threads}, "
          f"prefer {a.prefer}")
    root = tempfile.mkdtemp(prefix="dcp_speed-", dir=a.dir)
    rows, save_phases = [], {}  # label -> [(seconds, LMCStorageWriter.last_phases)] of each repeat
    try:
        for r in range(a.repeats):
            row = {}
            d = os.path.join(root, f"r{r}")
            os.makedirs(d)
            plain, zs = f"{d}/plain", f"{d}/zstd"
            row["plain save"] = timed(lambda: dcp.save(
                s2, storage_writer=dcp.FileSystemWriter(plain, thread_count=a.dcp_threads)), "plain save")
            row["plain load"] = timed(lambda: dcp.load(blank(s2), storage_reader=dcp.FileSystemReader(plain)),
                                      "plain load")
            if zstd is not None:
                row["zstd save"] = timed(lambda: dcp.save(
                    s2, storage_writer=dcp.FileSystemWriter(zs, thread_count=a.dcp_threads, _extensions=[zstd])), "zstd save")
                row["zstd load"] = timed(lambda: dcp.load(blank(s2), storage_reader=dcp.FileSystemReader(zs)),
                                         "zstd load")
                row["zstd MiB"] = folder_mib(zs)
            def lmc_save(label, sd, path, **kw):
                w = LMCStorageWriter(path, threads=a.threads, prefer=a.prefer, **kw)
                row[label] = timed(lambda: dcp.save(sd, storage_writer=w), label)
                save_phases.setdefault(label, []).append((row[label], w.last_phases))

            lmc_save("lmc save alone", s1, f"{d}/step-1")
            # the re-coding of step 1 within the save (background=False; one process's default is behind it)
            lmc_save("lmc save vs ref", s2, f"{d}/step-2", reference=f"{d}/step-1", background=False)
            if a.background:  # the same save with the re-coding of the reference behind the call
                dcp.save(s1, storage_writer=LMCStorageWriter(f"{d}/bg-1", threads=a.threads, prefer=a.prefer))
                lmc_save("lmc bg save blocked", s2, f"{d}/bg-2", reference=f"{d}/bg-1", background=True)
                t1 = time.perf_counter()
                lmc.dcp.wait()
                row["lmc bg save done"] = row["lmc bg save blocked"] + time.perf_counter() - t1
                row["lmc bg MiB older"] = folder_mib(f"{d}/bg-1")
            row["lmc load newest"] = timed(lambda: dcp.load(
                blank(s2), storage_reader=LMCStorageReader(f"{d}/step-2", threads=a.threads)), "lmc load newest")
            row["lmc load older"] = timed(lambda: dcp.load(
                blank(s1), storage_reader=LMCStorageReader(f"{d}/step-1", threads=a.threads)), "lmc load older")
            row["lmc MiB newest"], row["lmc MiB older"] = folder_mib(f"{d}/step-2"), folder_mib(f"{d}/step-1")
            shutil.rmtree(d)
            rows.append(row)
            print(f"repeat {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        best = {k: min(row[k] for row in rows) for k in rows[0]}
        print("\nbest of", a.repeats, "(wall seconds, and the process's CPU seconds; MiB for sizes):")
        for k, v in best.items():
            print(f"  {k:18s} {v:8.2f}" + (f"   cpu {min(CPU[k]):6.2f}" if k in CPU else ""))
        if zstd is not None and a.background:
            print(f"  lmc bg save blocked / zstd save: {best['lmc bg save blocked'] / best['zstd save']:.2f}x")
        if zstd is not None:
            print(f"  lmc save vs ref / zstd save: {best['lmc save vs ref'] / best['zstd save']:.2f}x; "
                  f"lmc load newest / zstd load: {best['lmc load newest'] / best['zstd load']:.2f}x")
        best_ph = {label: min(runs, key=lambda x: x[0]) for label, runs in save_phases.items()}
        print("\nthe phases of the best of each LMC save (LMCStorageWriter.last_phases, seconds; 'code', 'hash' and "
              "the like are the workers' summed over threads, 'resolve', 'write', 'wait for workers', 'commit' and "
              "'metadata' the calling thread's):")
        labels = list(best_ph)
        print(f"  {'':36s} " + " ".join(f"{x[4:]:>17s}" for x in labels))
        for k in sorted({k for _, ph in best_ph.values() for k in ph}):
            print(f"  {k:36s} " + " ".join(f"{best_ph[x][1].get(k, 0.0):17.3f}" for x in labels))
        workers = a.threads or cores
        ph = phases(s1, s2, workers)
        print(f"\nphases ({workers} worker threads, one lmc thread each; seconds of wall time):")
        for k, v in ph.items():
            print(f"  {k:36s} {v:6.2f}")
        save_work = ph["code step 2 alone"] + ph["decode step 1 (coded alone)"] + ph["code step 1 against step 2"]
        print(f"  {'coding work of a save against a reference':36s} {save_work:6.2f} "
              f"(the save took {best['lmc save vs ref']:.2f}: checksums, files and DCP's planning are the rest)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
