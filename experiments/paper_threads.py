"""Render ``lmcbench experiment=paper_threads`` into results/paper_threads/: LMC compress and decompress
throughput against thread count, per core, beside the LMC paper's 16-core figures (and ZipNN's scaling).

Re-render an existing run:  python experiments/paper_threads.py RUN_DIR [OUT_DIR]
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

PAPER = {"compress": 2.78, "decompress": 3.76, "cores": 16}
def scaling(df: pd.DataFrame) -> pd.DataFrame:
    """GiB/s and GiB/s per thread for every (dtype, codec id, thread count), over all tensors of the run."""
    ok = df[df["verified"] & df["comp_bytes"].notna() & (df["transform"] == "raw")].copy()
    ok["family"] = ok["codec_label"].str.extract(r"^([a-z0-9]+)", expand=False)
    g = ok.groupby(["dtype", "family", "threads"]).agg(orig=("orig_bytes", "sum"), c=("compress_s", "sum"),
                                                        d=("decompress_s", "sum")).reset_index()
    g = g.drop_duplicates(["dtype", "family", "threads"])
    g["compress GiB/s"] = g["orig"] / GiB / g["c"]
    g["decompress GiB/s"] = g["orig"] / GiB / g["d"]
    g["compress GiB/s/core"] = g["compress GiB/s"] / g["threads"]
    g["decompress GiB/s/core"] = g["decompress GiB/s"] / g["threads"]
    return g


ABOUT = ("Compress and decompress throughput of LMC (and ZipNN) at each thread count, over every tensor of the "
         "checkpoint, and per core; the LMC paper reports 2.78 / 3.76 GiB/s on 16 cores, i.e. "
         f"{PAPER['compress'] / 16:.3f} / {PAPER['decompress'] / 16:.3f} GiB/s per core.")


def render(run_dir: str, out_dir: str) -> str:
    df, _, _, lines = begin(run_dir, out_dir, "Throughput against threads", ABOUT)
    g = scaling(df)
    if not g.empty:
        t = g.set_index(["dtype", "family", "threads"])[["compress GiB/s", "decompress GiB/s", "compress GiB/s/core",
                                                         "decompress GiB/s/core"]].map(lambda v: f"{v:.3f}")
        t.index = [f"{d} / {f} / {n}" for d, f, n in t.index]
        lines += [md_table(t, "dtype / codec / threads"), ""]
        lmc = g[g["family"] == "lmc"]
        for dtype, part in lmc.groupby("dtype"):
            one = part[part["threads"] == 1]
            top = part[part["threads"] == part["threads"].max()]
            if not one.empty and not top.empty and int(top["threads"].iloc[0]) > 1:
                n = int(top["threads"].iloc[0])
                lines.append(f"- {dtype}: {n} threads give {float(top['compress GiB/s'].iloc[0] / one['compress GiB/s'].iloc[0]):.2f}x "
                             f"compress and {float(top['decompress GiB/s'].iloc[0] / one['decompress GiB/s'].iloc[0]):.2f}x "
                             f"decompress over one thread; one core does {float(one['compress GiB/s'].iloc[0]) / (PAPER['compress'] / 16):.1f}x / "
                             f"{float(one['decompress GiB/s'].iloc[0]) / (PAPER['decompress'] / 16):.1f}x the paper's per-core rate.")
        lines.append("")
        lines += ["![per-core throughput](threads.png)", ""]
        _figure(g, os.path.join(out_dir, "threads.png"))
    g.to_csv(os.path.join(out_dir, "threads.csv"), index=False, float_format="%.6g")
    return finish(run_dir, out_dir, lines)


def _figure(g, path):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, what in zip(axes, ("compress", "decompress")):
        for (dtype, fam), part in g.groupby(["dtype", "family"]):
            part = part.sort_values("threads")
            ax.plot(part["threads"], part[f"{what} GiB/s/core"], marker="o", label=f"{fam} {dtype}")
        ax.axhline(PAPER[what] / PAPER["cores"], color="k", ls="--", lw=1, label="LMC paper, 16 cores")
        ax.set_title(f"{what}: GiB/s per core")
        ax.set_xlabel("threads")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, path)


if __name__ == "__main__":
    main(render, "paper_threads", __doc__)
