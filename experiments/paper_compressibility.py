"""Render ``lmcbench experiment=paper_compressibility`` into results/paper_compressibility/: per-stream order-0
entropy (per 64 KiB block) and compression ratio against training step, and the XOR analysis of consecutive
checkpoints (which fraction of elements, bytes and bits change, and at which bit positions).

Re-render an existing run:  python experiments/paper_compressibility.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import begin, finish, main, md_table  # noqa: E402
from lmcbench.report.facets import facet_grid, save, where  # noqa: E402
from lmcbench.report.plots import kinds_in  # noqa: E402

RATIO_ROWS = [("LMC", "lmc", "raw"), ("zstd-3, byte-grouped", "zstd", "bytegroup"),
              ("zstd-3, XOR delta + byte-grouped", "zstd", "delta_bytegroup")]


def ratio_by_step(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["verified"] & df["comp_bytes"].notna()]
    rows = []
    for label, codec, pipe in RATIO_ROWS:
        part = ok[(ok["codec"] == codec) & (ok["transform"] == pipe)]
        for (dtype, kind, step), g in part.groupby(["dtype", "kind", "step"]):
            rows.append({"dtype": dtype, "kind": kind, "step": step, "codec": label,
                         "ratio": g["orig_bytes"].sum() / g["comp_bytes"].sum()})
    return pd.DataFrame(rows)


def entropy_by_step(streams: pd.DataFrame, transform: str) -> pd.DataFrame:
    s = streams[streams["transform"] == transform]
    g = s.groupby(["dtype", "kind", "stream", "step"])[["bytes", "block_bound_bytes"]].sum().reset_index()
    g["bits_per_byte"] = 8 * g["block_bound_bytes"] / g["bytes"]
    return g


def xor_by_step(xor: pd.DataFrame) -> pd.DataFrame:
    g = xor.groupby(["dtype", "kind", "step"]).agg(
        numel=("numel", "sum"), changed_elems=("changed_elems", "sum"), changed_bytes=("changed_bytes", "sum"),
        changed_bits=("changed_bits", "sum"), width=("bit_flips", lambda v: len(str(v.iloc[0]).split("/")))
    ).reset_index()
    g["elements changed"] = g["changed_elems"] / g["numel"]
    g["bytes changed"] = g["changed_bytes"] / (g["numel"] * g["width"] // 8)
    g["bits changed"] = g["changed_bits"] / (g["numel"] * g["width"])
    return g


def bit_positions(xor: pd.DataFrame, dtype: str, kind: str) -> tuple[np.ndarray, list]:
    """Fraction of elements whose bit b flipped, per step (rows) and bit position (columns, MSB first)."""
    part = xor[(xor["dtype"] == dtype) & (xor["kind"] == kind)]
    steps = sorted(part["step"].unique())
    mats = []
    for st in steps:
        p = part[part["step"] == st]
        flips = np.sum([np.array(str(v).split("/"), dtype=np.int64) for v in p["bit_flips"]], axis=0)
        mats.append(flips / p["numel"].sum())
    return np.array(mats), steps


ABOUT = ("Every checkpoint of the series, weights and both Adam moments. Entropy is order-0, per 64 KiB "
         "block of each stream (8 bits per byte = incompressible); ratio = original / compressed bytes; "
         "the XOR analysis compares each checkpoint with the previous one.")


def render(run_dir: str, out_dir: str) -> str:
    df, streams, _, lines = begin(run_dir, out_dir, "Compressibility over training", ABOUT)
    xor_path = os.path.join(run_dir, "xor.csv")
    xor = pd.read_csv(xor_path, dtype={"bit_flips": str}) if os.path.exists(xor_path) else pd.DataFrame()
    if "lag" in xor:
        xor = xor[xor["lag"] == 1]  # consecutive checkpoints only (a run may also have compared further back)
    made = []
    rs = ratio_by_step(df)
    if not rs.empty:
        piv = rs.pivot_table(index=["dtype", "kind", "codec"], columns="step", values="ratio")
        steps = list(piv.columns)
        show = [steps[0], steps[len(steps) // 4], steps[len(steps) // 2], steps[-1]] if len(steps) > 4 else steps
        t = piv[sorted(set(show))].map(lambda v: f"{v:.3f}")
        t.index = [" / ".join(map(str, i)) for i in t.index]
        lines += ["## Compression ratio against step", "", md_table(t, "dtype / kind / codec"), ""]
        made.append(_plot_ratio(rs, os.path.join(out_dir, "ratio_vs_step.png")))
    if streams is not None and "block_bound_bytes" in streams:
        for tr in ("bytegroup", "expsplit_bytegroup", "delta_bytegroup"):
            e = entropy_by_step(streams, tr)
            if not e.empty:
                made.append(_plot_entropy(e, tr, os.path.join(out_dir, f"entropy_{tr}.png")))
    if not xor.empty:
        xs = xor_by_step(xor)
        last = xs.sort_values("step").groupby(["dtype", "kind"]).tail(1)
        first = xs.sort_values("step").groupby(["dtype", "kind"]).head(1)
        tab = pd.concat([first.assign(when="first"), last.assign(when="last")])
        tab = tab.set_index(["dtype", "kind", "when"])[["step", "elements changed", "bytes changed", "bits changed"]]
        tab = tab.sort_index()
        tab = tab.map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)
        tab.index = [" / ".join(map(str, i)) for i in tab.index]
        lines += ["## What changes between consecutive checkpoints (XOR)", "", md_table(tab, "dtype / kind"), ""]
        made.append(_plot_xor(xs, os.path.join(out_dir, "xor_vs_step.png")))
        made.append(_plot_bits(xor, os.path.join(out_dir, "xor_bit_positions.png")))
    made = [m for m in made if m]
    lines += ["## Figures", ""] + [f"![{m}]({m})" for m in made] + [""]
    # compact tables beside the report (the run folder keeps the per-tensor rows)
    if streams is not None and "block_bound_bytes" in streams:
        ent = pd.concat([entropy_by_step(streams, tr).assign(transform=tr) for tr in dict.fromkeys(streams["transform"])])
        ent.to_csv(os.path.join(out_dir, "entropy_by_step.csv"), index=False, float_format="%.6g")
    if not xor.empty:
        xs = xor_by_step(xor)
        bits = []
        for (d, k), _ in xs.groupby(["dtype", "kind"]):
            m, steps = bit_positions(xor, d, k)
            bits += [{"dtype": d, "kind": k, "step": st, "bit_flip_fraction": "/".join(f"{v:.4f}" for v in row)}
                     for st, row in zip(steps, m)]
        xs.merge(pd.DataFrame(bits), on=["dtype", "kind", "step"]).to_csv(
            os.path.join(out_dir, "xor_by_step.csv"), index=False, float_format="%.6g")
    return finish(run_dir, out_dir, lines, copy=("summary.csv", "environment.json"))


def _dtype_kind_grid(df, draw, path, suptitle, legend="first"):
    """One panel per dtype (rows) and kind (columns) of ``df``; ``draw(ax, part)`` plots the panel's rows, and
    a panel without rows (e.g. the Adam moments of a bf16 cast applied to weights only) is left blank."""
    def panel(ax, d, k):
        part = where(df, dtype=d, kind=k)
        if part.empty:
            return False
        draw(ax, part)

    fig, _ = facet_grid(list(dict.fromkeys(df["dtype"])), kinds_in(df), panel, title=lambda d, k: f"{k} ({d})",
                        legend=legend, sharex=True)
    return save(fig, path, suptitle=suptitle)


def _plot_ratio(rs, path):
    def draw(ax, part):
        for label, g in part.groupby("codec", sort=False):
            ax.plot(g["step"], g["ratio"], marker=".", label=label)

    return _dtype_kind_grid(rs, draw, path, "compression ratio against step")


def _plot_entropy(e, tr, path):
    def draw(ax, part):
        for st, g in part.groupby("stream", sort=False):
            ax.plot(g["step"], g["bits_per_byte"], marker=".", label=st)
        ax.set_ylim(0, 8.2)
        ax.legend(fontsize=6, ncol=2)

    return _dtype_kind_grid(e, draw, path, f"order-0 entropy per 64 KiB block, bits per byte, streams of {tr}",
                            legend=None)


def _plot_xor(xs, path):
    def draw(ax, part):
        g = part.sort_values("step")
        for col in ("elements changed", "bytes changed", "bits changed"):
            ax.plot(g["step"], g[col], marker=".", label=col)
        ax.set_ylim(0, 1.02)

    return _dtype_kind_grid(xs, draw, path, "fraction that changed since the previous checkpoint")


def _plot_bits(xor, path):
    pairs = [(d, k) for d in dict.fromkeys(xor["dtype"]) for k in kinds_in(xor[xor["dtype"] == d])]
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.6), squeeze=False)
    for ax, (d, k) in zip(axes[0], pairs):
        m, steps = bit_positions(xor, d, k)
        im = ax.imshow(m, aspect="auto", vmin=0, vmax=0.5, cmap="viridis",
                       extent=(-0.5, m.shape[1] - 0.5, steps[-1], steps[0]))
        ax.set_title(f"{k} ({d})", fontsize=9)
        ax.set_xlabel("bit: 0 = sign, exponent, mantissa")
    axes[0][0].set_ylabel("training step")
    fig.colorbar(im, ax=axes[0].tolist(), label="fraction of elements whose bit flipped")
    return save(fig, path, tight=False, bbox_inches="tight")


if __name__ == "__main__":
    main(render, "paper_compressibility", __doc__)
