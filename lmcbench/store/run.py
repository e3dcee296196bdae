"""``lmcbench experiment=checkpoint_store`` (``task: store``): the checkpoints of a training run saved again, in step
order, as its training loop would save them, by each way of saving one; bytes on disk, time blocked, time to
complete, restore time and bit-exactness.

Each checkpoint folder of the series is read into torch tensors (``model``: the weights of ``model.safetensors``;
``optimizer``: ``optimizer.pt`` read with ``weights_only=True``: AdamW's state and param groups), the weights cast to
the variant's dtype, and the state ``{"model": ..., "optimizer": ...}`` is saved by every method into its own folder
under ``<run>/checkpoints/<variant>/<method>/``. The replay waits for one save to complete before the next method
and the next step (a training loop with more compute between saves than a save takes; nothing else runs beside
it). The order of the methods rotates from step to step. At the middle step and the last one each method loads
its checkpoint back right after saving it (the files are in the page cache) and every tensor is compared bit for
bit with the state it was given. One process, no process group (DCP's ``no_dist`` path).

Written: ``store_checkpoints.csv`` (one row per variant x method x step) and ``summary.json``; never the lossless
grid's ``records.csv``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

from ..bench.records import CsvAppender
from lmc.memory import peak_above, reset_peak
from lmc.formats.trainer_folder import list_checkpoints, parse_steps
from ..errors import ConfigError, SourceError
from ..tinygpt.series import Series
from .methods import ALL, same_state, tensors_of, unavailable
from .options import VARIANTS, StoreConfig

COLUMNS = ["variant", "method", "step", "index", "keyframe", "state_bytes", "bytes", "blocked_s", "total_s", "restore",
           "restore_s", "verified", "save_peak_mib", "restore_peak_mib", "phases"]


def checkpoints_of(source: dict) -> list[tuple[int, str]]:
    """``[(step, folder)]`` of a tinygpt series (trained and cached if needed) or of a Trainer output folder
    (``source=hf_trainer source.path=DIR``), ``source.steps`` applied."""
    kind = source.get("type")
    if kind == "tinygpt":
        series = Series.from_options(**{k: source.get(k) for k in ("cache_dir", "train", "path", "steps")})
        series.ensure()
        ckpts, steps = series.checkpoints(), series.steps
    elif kind == "hf_trainer":
        path = source.get("path")
        if not path or path == "???":
            raise ConfigError("source.path must be given (a Trainer output folder: source.path=DIR)")
        ckpts, steps = list_checkpoints(os.path.expanduser(str(path))), parse_steps(source.get("steps"))
    else:
        raise ConfigError(f"experiment=checkpoint_store replays Trainer checkpoint folders: source=tinygpt, "
                          f"tinygpt_large or hf_trainer, not {kind!r}")
    ckpts = [(s, d) for s, d in ckpts if steps is None or s in steps]
    if not ckpts:
        raise ConfigError(f"source.steps: none of {steps} is in the series")
    return ckpts


def load_state(folder: str, weights_dtype: str) -> dict:
    """``{"model": weights, "optimizer": optimizer.pt}`` of a Trainer checkpoint folder as torch tensors, the floating
    point weights cast to ``weights_dtype``."""
    import torch
    from safetensors.torch import load_file

    st = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    binf = os.path.join(folder, "pytorch_model.bin")
    if os.path.exists(st):
        model = load_file(st)
    elif os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        model = {}
        for fn in files:
            model.update(load_file(os.path.join(folder, fn)))
    elif os.path.exists(binf):
        model = torch.load(binf, weights_only=True, map_location="cpu")
    else:
        raise SourceError(f"{folder}: no model.safetensors, sharded safetensors or pytorch_model.bin")
    opt_path = os.path.join(folder, "optimizer.pt")
    if not os.path.exists(opt_path):
        raise SourceError(f"{folder}: no optimizer.pt (the replay saves the weights and the optimizer state)")
    opt = torch.load(opt_path, weights_only=True, map_location="cpu")
    dt = getattr(torch, weights_dtype)
    model = {k: (v.to(dt) if v.is_floating_point() else v).contiguous() for k, v in model.items()}
    return {"model": model, "optimizer": opt}


def load_tiled(folders: list[str], weights_dtype: str) -> dict:
    """The states of ``folders`` (consecutive checkpoints) as one: every tensor with a first dimension is the
    concatenation of theirs along it; the others (0-dim step counters, param groups) are the first folder's."""
    import torch

    first = load_state(folders[0], weights_dtype)
    if len(folders) == 1:
        return first
    leaves = _leaves(first)
    parts = {p: [t] for p, t in leaves.items() if isinstance(t, torch.Tensor) and t.dim() > 0}
    for folder in folders[1:]:
        other = _leaves(load_state(folder, weights_dtype))
        for path, ts in parts.items():
            t = other.get(path)
            if not isinstance(t, torch.Tensor) or t.shape[1:] != ts[0].shape[1:] or t.dtype != ts[0].dtype:
                raise SourceError(f"{folder}: {'/'.join(map(str, path))} does not match the first checkpoint's "
                                  "(store.tile needs checkpoints of one model)")
            ts.append(t)
        del other
    for path, ts in parts.items():
        leaves[path] = torch.cat(ts)
        ts.clear()
    return _rebuild(first, leaves)


def _leaves(obj, prefix=()) -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_leaves(v, prefix + (k,)))
        return out
    return {prefix: obj}


def _rebuild(obj, leaves, prefix=()):
    if isinstance(obj, dict):
        return {k: _rebuild(v, leaves, prefix + (k,)) for k, v in obj.items()}
    return leaves[prefix]


def _peak_mib(base: int | None):
    """MiB the peak RSS rose above ``base`` (lmc.memory.reset_peak) since; blank where not measured."""
    rise = peak_above(base)
    return "" if rise is None else round(rise / 2**20, 1)


def _warm_up(names, state, root: str, cfg: StoreConfig, log) -> None:
    """Every method once on the first state, and LMC with a reference on both dtypes, outside the measurement
    (Numba loads its compiled kernels on first use; ZipNN and DCP set themselves up)."""
    import numpy as np

    if any(n.startswith("lmc") for n in names):
        import ml_dtypes

        import lmc

        rng = np.random.default_rng(0)
        for dt in (np.float32, ml_dtypes.bfloat16):
            a = (rng.standard_normal(300_000) * 0.02).astype(dt)
            b = a.copy()
            b[::3] = (rng.standard_normal(100_000) * 0.02).astype(dt)
            for ref in (None, a):
                lmc.decompress(lmc.compress(b, reference=ref, threads=cfg.threads), reference=ref, threads=cfg.threads)
    for n in names:
        m = ALL[n](root, cfg)
        m.save(state, 0, True)
        m.restore(0, state)
        m.close()
    shutil.rmtree(root, ignore_errors=True)
    log(f"store: warmed up {len(names)} methods")


def run_store(cfg, out_dir: str, log=print) -> dict:
    """The whole replay; writes ``store_checkpoints.csv`` and ``summary.json`` into ``out_dir``."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    sc = StoreConfig.from_options(c.get("store"))
    series = checkpoints_of(c["source"])
    if sc.tile > len(series):
        raise ConfigError(f"store.tile: {sc.tile} is more than the {len(series)} checkpoints of the series")
    # tiled: checkpoint j is series checkpoints j..j+tile-1 (labelled by the first one's step)
    ckpts = [(series[j][0], [d for _, d in series[j:j + sc.tile]]) for j in range(len(series) - sc.tile + 1)]
    notes, names = [], []
    for n in sc.methods:
        why = unavailable(n)
        if why:
            notes.append(f"{n} skipped: its library is not installed ({why})")
            log(f"note: store: {notes[-1]}")
        else:
            names.append(n)
    if not names:
        raise ConfigError("store.methods: none of the selected methods can run here")
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.join(out_dir, "checkpoints")
    out = CsvAppender(os.path.join(out_dir, "store_checkpoints.csv"), COLUMNS)
    mid, last = (len(ckpts) - 1) // 2, len(ckpts) - 1
    t_start = time.time()
    summary = {"steps": [s for s, _ in ckpts], "methods": names, "variants": sc.variants, "notes": notes,
               "keyframe_every": sc.keyframe_every, "threads": sc.threads, "zstd_level": sc.zstd_level,
               "tile": sc.tile, "series_steps": [s for s, _ in series],
               "restored_steps": {"middle": ckpts[mid][0], "last": ckpts[last][0]}, "state_bytes": {}, "table": {}}
    log(f"store: {len(ckpts)} checkpoints ({ckpts[0][1][0]} ...{f', each {sc.tile} tiled' if sc.tile > 1 else ''}), methods {', '.join(names)}, "
        f"variants {', '.join(sc.variants)}")
    try:
        for variant in sc.variants:
            rows, largest = _variant(variant, ckpts, names, sc, work, out, (mid, last), log,
                                     warm=variant == sc.variants[0])
            summary["state_bytes"][variant] = rows[0]["state_bytes"]
            summary.setdefault("largest_tensor_bytes", {})[variant] = largest
            summary["table"][variant] = table(rows, names)
            if not sc.keep_checkpoints:
                shutil.rmtree(os.path.join(work, variant), ignore_errors=True)
    finally:
        out.close()
        if not sc.keep_checkpoints:
            shutil.rmtree(work, ignore_errors=True)
    summary["n_params"] = _n_params(ckpts[0][1][0]) * sc.tile
    summary["seconds"] = round(time.time() - t_start, 1)
    summary["verified"] = all(r["verified"] for t in summary["table"].values() for r in t.values())
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def _n_params(folder: str) -> int:
    return int(sum(t.numel() for t in load_state(folder, "float32")["model"].values()))


def _variant(variant, ckpts, names, sc, work, out, restore_at, log, warm) -> list[dict]:
    dtype = VARIANTS[variant]
    root = os.path.join(work, variant)
    shutil.rmtree(root, ignore_errors=True)
    if warm:
        _warm_up(names, load_state(ckpts[0][1][0], dtype), os.path.join(work, "warmup"), sc, log)
    methods = {n: ALL[n](root, sc) for n in names}
    rows = []
    try:
        for i, (step, folders) in enumerate(ckpts):
            state = load_tiled(folders, dtype)
            sizes = [t.numel() * t.element_size() for t in tensors_of(state)]
            state_bytes = sum(sizes)
            keyframe = i % sc.keyframe_every == 0
            order = names[i % len(names):] + names[:i % len(names)]
            done = []
            for n in order:
                m = methods[n]
                base = reset_peak()
                blocked, total, nbytes = m.save(state, step, keyframe)  # (returns once the save is complete)
                row = {"variant": variant, "method": n, "step": step, "index": i, "keyframe": keyframe,
                       "state_bytes": state_bytes, "bytes": nbytes, "blocked_s": round(blocked, 5),
                       "total_s": round(total, 5), "restore": "", "restore_s": "", "verified": "",
                       "save_peak_mib": _peak_mib(base), "restore_peak_mib": "",
                       "phases": json.dumps(m.phases, sort_keys=True) if m.phases else ""}
                m.phases = None
                if i in restore_at:
                    base = reset_peak()
                    t0 = time.perf_counter()
                    got = m.restore(step, state)
                    row["restore_s"] = round(time.perf_counter() - t0, 5)
                    row["restore_peak_mib"] = _peak_mib(base)  # (the restored state itself included)
                    row["verified"] = same_state(got, state)
                    row["restore"] = "last" if i == restore_at[1] else "middle"
                    del got
                    if not row["verified"]:
                        log(f"store: WARNING: {variant} {n} step {step} did not restore bit-exactly")
                if not sc.keep_checkpoints:
                    m.discard([s for s, _ in ckpts[:i]], {step})
                done.append(row)
            done.sort(key=lambda r: names.index(r["method"]))
            out.write(done)
            largest = max(sizes)
            rows.extend(done)
            ts = rows_for(done, "torch_save")
            log(f"store: {variant} step {step}: " + ", ".join(
                f"{r['method']} {r['bytes'] / 2**20:.2f} MiB {r['blocked_s']:.3f}/{r['total_s']:.3f} s" for r in done)
                + (f" (torch.save {ts['bytes'] / 2**20:.2f} MiB)" if ts else ""))
            del state
    finally:
        for m in methods.values():
            m.close()
    return rows, largest


def rows_for(rows, method):
    return next((r for r in rows if r["method"] == method), None)


def table(rows: list[dict], names: list[str]) -> dict:
    """Per method: mean bytes per checkpoint, ratio against torch.save, mean blocked and total seconds, restore
    seconds at the middle and last steps, whether every restore was bit-exact (what the report's table shows)."""
    def mean(xs):
        return sum(xs) / len(xs)

    ref = [r["bytes"] for r in rows if r["method"] == "torch_save"]
    out = {}
    for n in names:
        rs = [r for r in rows if r["method"] == n]
        restored = {r["restore"]: r for r in rs if r["restore"]}
        b = mean([r["bytes"] for r in rs])
        out[n] = {"mean_bytes": b, "ratio_vs_torch_save": mean(ref) / b if ref else None,
                  "mean_blocked_s": mean([r["blocked_s"] for r in rs]), "mean_total_s": mean([r["total_s"] for r in rs]),
                  "restore_last_s": restored["last"]["restore_s"] if "last" in restored else None,
                  "restore_middle_s": restored["middle"]["restore_s"] if "middle" in restored else None,
                  "verified": bool(restored) and all(r["verified"] for r in restored.values())}
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: lmcbench experiment=checkpoint_store")
