"""Render ``lmcbench experiment=paper_lmc_vs_bz2`` into results/paper_lmc_vs_bz2/: LMC against byte-grouped
BZ2 (ratio and seconds per GiB, compress and decompress) at each step and dtype, and the rest of the field.

Re-render an existing run:  python experiments/paper_lmc_vs_bz2.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lmcbench.report.facets import save  # noqa: E402
from _common import GiB, begin, finish, main, md_table  # noqa: E402

FIELD = [("LMC", "lmc", "raw"), ("BZ2-9, byte-grouped", "bz2", "bytegroup"),
         ("zstd-3, byte-grouped", "zstd", "bytegroup"), ("ZipNN", "zipnn", "raw"), ("OpenZL", "openzl", "raw")]


def per_step(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["verified"] & df["comp_bytes"].notna()]
    rows = []
    for label, codec, pipe in FIELD:
        part = ok[(ok["codec"] == codec) & (ok["transform"] == pipe)]
        for (dtype, step), g in part.groupby(["dtype", "step"]):
            o = g["orig_bytes"].sum()
            rows.append({"dtype": dtype, "step": step, "codec": label, "ratio": o / g["comp_bytes"].sum(),
                         "compress s/GiB": g["compress_s"].sum() / (o / GiB),
                         "decompress s/GiB": g["decompress_s"].sum() / (o / GiB)})
    return pd.DataFrame(rows)


ABOUT = ("The LMC paper's headline on a real training series: LMC's ratio against byte-grouped BZ2's, and the time "
         "each takes per GiB of checkpoint (one thread), at an early, a middle and the final checkpoint; every round "
         "trip verified.")


def render(run_dir: str, out_dir: str) -> str:
    df, _, _, lines = begin(run_dir, out_dir, "LMC against BZ2", ABOUT)
    t = per_step(df)
    if not t.empty:
        for dtype, part in t.groupby("dtype", sort=False):
            lmc, bz2 = part[part["codec"] == "LMC"].set_index("step"), part[part["codec"] == "BZ2-9, byte-grouped"].set_index("step")
            if not lmc.empty and not bz2.empty:
                head = pd.DataFrame({
                    "LMC ratio": lmc["ratio"].map("{:.4f}".format), "BZ2 ratio": bz2["ratio"].map("{:.4f}".format),
                    "LMC / BZ2 size": (bz2["ratio"] / lmc["ratio"]).map("{:.3f}".format),
                    "compress: BZ2 s / LMC s": (bz2["compress s/GiB"] / lmc["compress s/GiB"]).map("{:.0f}x".format),
                    "decompress: BZ2 s / LMC s": (bz2["decompress s/GiB"] / lmc["decompress s/GiB"]).map("{:.0f}x".format)})
                lines += [f"## {dtype}: the headline", "", md_table(head, "step"), ""]
            field = part.pivot_table(index="codec", columns="step", values="ratio").map("{:.4f}".format)
            speed = part.groupby("codec")[["compress s/GiB", "decompress s/GiB"]].mean().map("{:.2f}".format)
            lines += [f"### {dtype}: ratio of the field by step", "", md_table(field, "codec"), "",
                      f"### {dtype}: seconds per GiB (mean over steps, one thread)", "", md_table(speed, "codec"), ""]
        _figure(t, os.path.join(out_dir, "lmc_vs_bz2.png"))
        lines += ["![ratio and time](lmc_vs_bz2.png)", ""]
    t.to_csv(os.path.join(out_dir, "lmc_vs_bz2.csv"), index=False, float_format="%.6g")
    return finish(run_dir, out_dir, lines)


def _figure(t, path):
    dtypes = list(dict.fromkeys(t["dtype"]))
    fig, axes = plt.subplots(1, 1 + len(dtypes), figsize=(5 * (1 + len(dtypes)), 4))
    for ax, dtype in zip(axes[:-1], dtypes):
        for codec, g in t[t["dtype"] == dtype].groupby("codec", sort=False):
            ax.plot(g["step"], g["ratio"], marker="o", label=codec)
        ax.set_title(f"ratio against step ({dtype})")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    m = t.groupby(["codec", "dtype"], sort=False)[["compress s/GiB", "decompress s/GiB"]].mean().reset_index()
    labels = [f"{c} ({d})" for c, d in zip(m["codec"], m["dtype"])]
    ax = axes[-1]
    ax.barh(labels, m["compress s/GiB"], label="compress")
    ax.barh(labels, m["decompress s/GiB"], left=m["compress s/GiB"], label="decompress")
    ax.set_xscale("log")
    ax.set_xlabel("seconds per GiB, one thread (log)")
    ax.legend(fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    save(fig, path)


if __name__ == "__main__":
    main(render, "paper_lmc_vs_bz2", __doc__)
