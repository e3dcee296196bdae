"""Figures: ratio against step, the ratio/throughput trade-off front, per-stream entropy against step."""

from __future__ import annotations

import os

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .records import aggregate, comparable, kinds_in  # noqa: E402, F401 - kinds_in is used here and by experiments/
from .facets import facet_grid, save, where  # noqa: E402


def ratio_vs_step(df: pd.DataFrame, path: str) -> bool:
    ok = df[df["verified"] & df["comp_bytes"].notna() & (df["codec"] != "memcpy")]
    if ok.empty or ok["step"].nunique() < 2:
        return False
    codecs = list(dict.fromkeys(ok["codec_label"]))
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(codecs)}

    def draw(ax, kind, tr):
        part = where(ok, kind=kind, transform=tr)
        if not part.empty:
            agg = aggregate(part, ["codec_label", "step"])
            for c, g in agg.groupby("codec_label", sort=False):
                ax.plot(g["step"], g["ratio"], marker=".", color=colors[c], label=c)

    transforms = list(dict.fromkeys(ok["transform"]))
    fig, _ = facet_grid(kinds_in(ok), transforms, draw, panel=(3.2, 2.6), col_titles=True,
                        row_label=lambda kind: f"{kind}\nratio", legend="figure", sharex=True)
    save(fig, path, rect=(0, 0, 1, 0.95))
    return True


def tradeoff(df: pd.DataFrame, path: str) -> bool:
    ok = comparable(df)
    ok = ok[ok["codec"] != "memcpy"]
    if ok.empty:
        return False
    agg = aggregate(ok, ["codec_label", "transform"])
    codecs = list(dict.fromkeys(agg["codec_label"]))
    transforms = list(dict.fromkeys(agg["transform"]))
    markers = "osD^v<>pPX*h"
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(codecs)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, col, name in ((axes[0], "compress_MiBps", "compress"), (axes[1], "decompress_MiBps", "decompress")):
        for _, r in agg.iterrows():
            ax.scatter(r[col], r["ratio"], color=colors[r["codec_label"]],
                       marker=markers[transforms.index(r["transform"]) % len(markers)], s=40)
        # the Pareto front: no other point is both faster and smaller
        pts = agg[[col, "ratio"]].dropna().sort_values(col, ascending=False).values
        front, best = [], -1.0
        for x, y in pts:
            if y > best:
                front.append((x, y))
                best = y
        if front:
            ax.plot(*zip(*front), color="grey", lw=1, ls="--", zorder=0, label="front")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(f"{name} throughput (MiB/s, log)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("compression ratio")
    from matplotlib.lines import Line2D

    h = [Line2D([], [], color=colors[c], marker="o", ls="", label=c) for c in codecs]
    h += [Line2D([], [], color="k", marker=markers[i % len(markers)], ls="", label=t) for i, t in enumerate(transforms)]
    fig.legend(handles=h, loc="center right", frameon=False, fontsize=8)
    save(fig, path, suptitle="ratio against throughput (all selected tensors)", rect=(0, 0, 0.85, 1))
    return True


def entropy_vs_step(streams: pd.DataFrame | None, path: str) -> bool:
    if streams is None or streams.empty or streams["step"].nunique() < 2:
        return False
    s = streams.copy()
    if "sample_weight" in s.columns:  # a sampled run's streams stand for their stratum's
        s["bytes"] = s["bytes"] * s["sample_weight"].fillna(1.0)
    s["bits_total"] = s["entropy_bits"] * s["bytes"]
    transforms = [t for t in dict.fromkeys(s["transform"]) if s[s["transform"] == t]["stream"].nunique() > 1]
    if not transforms:
        return False
    kinds = kinds_in(s)

    def draw(ax, kind, tr):
        g = where(s, kind=kind, transform=tr).groupby(["stream", "step"], sort=False)[["bits_total", "bytes"]]
        g = g.sum().reset_index()
        for st, gg in g.groupby("stream", sort=False):
            ax.plot(gg["step"], gg["bits_total"] / gg["bytes"], marker=".", label=st)
        ax.set_ylim(0, 8.2)
        if kind == kinds[0]:
            ax.legend(fontsize=7, ncol=2)

    fig, _ = facet_grid(kinds, transforms, draw, panel=(3.4, 2.6), col_titles=True,
                        row_label=lambda kind: f"{kind}\nbits per byte", legend=None, sharex=True, sharey=True)
    save(fig, path, suptitle="order-0 entropy of each stream against step (8 = incompressible)",
         rect=(0, 0, 1, 0.96))
    return True


def all_figures(df, streams, out_dir) -> list[str]:
    made = []
    for name, fn, arg in (("ratio_vs_step.png", ratio_vs_step, df), ("tradeoff.png", tradeoff, df),
                          ("entropy_vs_step.png", entropy_vs_step, streams)):
        if fn(arg, os.path.join(out_dir, name)):
            made.append(name)
    return made
