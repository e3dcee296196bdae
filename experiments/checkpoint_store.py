"""Render ``lmcbench experiment=checkpoint_store`` into results/checkpoint_store/: per weights dtype, a table of every
way of saving a checkpoint (mean bytes per checkpoint, ratio against torch.save, seconds the training loop is
blocked and seconds until the checkpoint is complete, restore seconds, bit-exactness), and one figure: bytes and
blocked seconds per checkpoint against step.

Re-render an existing run:  python experiments/checkpoint_store.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import MiB, finish, header, load_environment, md_table  # noqa: E402

LABELS = {
    "torch_save": "torch.save (one file)",
    "zstd_torch_save": "torch.save + zstd",
    "zipnn": "ZipNN per tensor",
    "dcp": "DCP FileSystemWriter",
    "dcp_zstd": "DCP + ZStandard extension",
    "lmc_archive": "LMC archive (Archive.add)",
    "lmc_archive_bg": "LMC archive via LMCArchiveCallback (worker thread)",
    "lmc_archive_behind": "LMC archive, Archive.add(background=True): the previous step re-coded behind",
    "lmc_dcp": "LMC DCP writer (dcp.save)",
    "lmc_dcp_behind": "LMC DCP writer, background=True: the previous step re-coded behind",
    "lmc_dcp_async": "LMC DCP writer (dcp.async_save)",
}
ASYNC = {"lmc_archive_bg", "lmc_archive_behind", "lmc_dcp_async", "lmc_dcp_behind"}


def load_rows(run_dir: str) -> pd.DataFrame:
    df = pd.read_csv(os.path.join(run_dir, "store_checkpoints.csv"), keep_default_na=False, na_values=[""])
    df["verified"] = df["verified"].map({True: True, False: False, "True": True, "False": False})
    return df


def method_table(df: pd.DataFrame) -> pd.DataFrame:
    """One variant's rows -> the report's table (formatted), one row per method in run order."""
    ref = df[df["method"] == "torch_save"]["bytes"].mean() if (df["method"] == "torch_save").any() else None
    rows = []
    for m in dict.fromkeys(df["method"]):
        part = df[df["method"] == m]
        b = part["bytes"].mean()
        rest = part[part["restore"].notna()]
        at = {r["restore"]: r for _, r in rest.iterrows()}
        ok = len(rest) > 0 and bool(rest["verified"].all())
        rows.append({"method": m,
                     "MiB per checkpoint": f"{b / MiB:.3f}",
                     "ratio vs torch.save": f"{ref / b:.3f}" if ref else "",
                     "blocked s": f"{part['blocked_s'].mean():.4f}",
                     "total save s": f"{part['total_s'].mean():.4f}",
                     "restore s (last)": f"{at['last']['restore_s']:.4f}" if "last" in at else "",
                     "restore s (middle)": f"{at['middle']['restore_s']:.4f}" if "middle" in at else "",
                     "verified": "yes" if ok else "**NO**"})
        for col, label in (("save_peak_mib", "save peak MiB (max)"), ("restore_peak_mib", "restore peak MiB (max)")):
            if col in part and part[col].notna().any():
                rows[-1][label] = f"{part[col].max():.0f}"
    return pd.DataFrame(rows).set_index("method")


def phase_lines(part: pd.DataFrame) -> list[str]:
    """Where each LMC method's save spends its time: mean seconds per phase over the steps (summed over the
    archive's threads, so phases can add up to more than the wall time; "behind": the re-code after the call
    returned)."""
    if "phases" not in part:
        return []
    out = []
    for m in dict.fromkeys(part["method"]):
        ph = [json.loads(x) for x in part[part["method"] == m]["phases"] if isinstance(x, str) and x]
        if not ph:
            continue
        keys = sorted({k for d in ph for k in d}, key=lambda k: (k.startswith("behind"), k == "wall", k))
        out.append(f"`{m}` seconds per phase (mean over {len(ph)} steps; summed over threads): "
                   + ", ".join(f"{k} {sum(d.get(k, 0.0) for d in ph) / len(ph):.3f}" for k in keys))
        out.append("")
    return out


def figure(df: pd.DataFrame, out_dir: str) -> str:
    variants = list(dict.fromkeys(df["variant"]))
    fig, axes = plt.subplots(2, len(variants), figsize=(6.5 * len(variants), 8), squeeze=False, sharex=True)
    for j, v in enumerate(variants):
        part = df[df["variant"] == v]
        for m in dict.fromkeys(part["method"]):
            p = part[part["method"] == m].sort_values("step")
            style = "--" if m in ASYNC else "-"
            axes[0][j].plot(p["step"], p["bytes"] / MiB, style, marker="o", ms=3, label=m)
            axes[1][j].plot(p["step"], p["blocked_s"], style, marker="o", ms=3, label=m)
        axes[0][j].set_title(f"weights {v}, moments fp32")
        axes[0][j].set_ylabel("MiB on disk per checkpoint")
        axes[1][j].set_ylabel("seconds the loop is blocked")
        axes[1][j].set_yscale("log")
        axes[1][j].set_xlabel("step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = os.path.join(out_dir, "bytes_and_blocked.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(run_dir: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    env = load_environment(run_dir)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    df = load_rows(run_dir)
    steps = summary["steps"]
    lines = header(
        "Saving checkpoints during training: bytes, blocked time, restore", env,
        "A training run's checkpoints saved again in step order, as its training loop would save them: the model "
        "weights and the AdamW state (both moments, fp32) as torch tensors, read from the series' Trainer folders "
        "(`optimizer.pt` with `weights_only=True`), saved by each method into its own folder. *Blocked*: seconds "
        "until the save call returns (for the synchronous methods, until the checkpoint is complete; the LMC archive "
        "includes writing the Trainer's folder, `model.safetensors` + `optimizer.pt`, which it then reads). *Total*: "
        "until the checkpoint is complete and durable (files fsynced; for `dcp.async_save` until its future "
        "resolves, for the callback until its worker has appended the step). *Restore*: loading the step back as "
        "torch tensors right after saving it (files in the page cache), compared bit for bit with what was saved.")
    tile = summary.get("tile", 1)
    tiled = []
    if tile > 1:
        largest = max((summary.get("largest_tensor_bytes") or {}).values(), default=0)
        tiled = [f"- **a tiled series**: each checkpoint is {tile} consecutive checkpoints of the series (steps "
                 f"{summary['series_steps'][0]}..{summary['series_steps'][-1]}) concatenated tensor by tensor along "
                 "the first dimension, named by the first one's step: the real tensors of a real training run, "
                 f"{tile} times the bytes, no repeated data, consecutive checkpoints still consecutive steps at every "
                 f"position; the largest tensor is {largest / MiB:.1f} MiB"]
    lines += ["## Setup", ""] + tiled + [
              f"- series: {summary.get('n_params', 0) / 1e6:.2f}M parameters, {len(steps)} checkpoints, steps "
              f"{steps[0]}..{steps[-1]}; restored: step {summary['restored_steps']['middle']} (middle) and "
              f"{summary['restored_steps']['last']} (last)",
              f"- LMC methods: each checkpoint against the previous one, a keyframe every "
              f"{summary['keyframe_every']} checkpoints; LMC and ZipNN threads: "
              f"{summary['threads'] or 'all cores'}; zstd level {summary['zstd_level']}",
              "- one process, no process group (DCP's `no_dist` path); every method saved and restored once on the "
              "first checkpoint before measuring (Numba's kernels, ZipNN, DCP set up); the order of the methods "
              "rotates from step to step; the replay waits for each save to complete before the next, and no "
              "training runs beside the saves (an async save's background work has the cores to itself)",
              "- `dcp.async_save` returns after DCP has staged the state (a copy of every tensor into new memory, "
              "torch's `_state_dict_stager`; profiled: nearly all of its blocked time), whatever the StorageWriter; "
              "on a model this small that copy costs about as much as a synchronous save",
              "- bytes: apparent sizes of the files a checkpoint adds (for the archive: what `run.lmca` grew by; the "
              "Trainer's raw folder it reads is not counted)",
              "- peak memory (where the columns show): how far the process's peak RSS rose above its RSS before the "
              "call (the peak reset through `/proc/self/clear_refs` before each save and each restore; RSS counts "
              "Numba's buffers and mapped file pages), until the save is complete (background work included); a "
              "restore's includes the restored state itself; `dcp.async_save`'s includes DCP's staged copy of the "
              "state"]
    for n in summary.get("notes") or []:
        lines.append(f"- note: {n}")
    lines.append("")
    for v in dict.fromkeys(df["variant"]):
        part = df[df["variant"] == v]
        sb = part["state_bytes"].iloc[0]
        lines += [f"## Weights {v}, moments fp32 ({sb / MiB:.3f} MiB of tensors per checkpoint)", "",
                  md_table(method_table(part), "method"), ""]
        arch = part[part["method"] == "lmc_archive"].set_index("step")["bytes"]
        ts = part[part["method"] == "torch_save"].set_index("step")["bytes"]
        if len(arch) and len(ts):
            later = [s for s in arch.index if s != steps[0]]
            smaller = all(arch[s] < ts[s] for s in later)
            for m in ("lmc_dcp", "lmc_archive"):
                p = part[part["method"] == m].sort_values("step")
                if len(p) > 1:
                    lines += [f"`{m}` blocked s from the first step to the last: "
                              + ", ".join(f"{x:.3f}" for x in p["blocked_s"]), ""]
            lines += [f"LMC archive smaller than torch.save at every step after the first: "
                      f"{'yes' if smaller else 'NO'} (ratio {min(ts[s] / arch[s] for s in later):.3f} to "
                      f"{max(ts[s] / arch[s] for s in later):.3f})" if later else "", ""]
        lines += phase_lines(part)  # (every LMC method that reports its phases, with or without lmc_archive)
    lines += ["## Method names", ""] + [f"- `{m}`: {LABELS[m]}" for m in dict.fromkeys(df["method"]) if m in LABELS]
    lines += ["", f"![bytes and blocked seconds per checkpoint]({os.path.basename(figure(df, out_dir))})", ""]
    return finish(run_dir, out_dir, lines, copy=("environment.json", "summary.json", "store_checkpoints.csv"))


if __name__ == "__main__":
    from _common import main

    main(render, "checkpoint_store", __doc__)
