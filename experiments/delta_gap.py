"""Render ``lmcbench experiment=delta_gap`` into results/delta_gap/: the ratio of the XOR and subtraction deltas
against a reference 1, 2, 4, 8 ... checkpoints back, and against the fraction of values that changed; and
LMC's adaptive per-chunk reference, which must never lose to compressing alone.

Re-render an existing run:  python experiments/delta_gap.py RUN_DIR [OUT_DIR]
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
from _common import KINDS, finish, header, load_run, main, md_table  # noqa: E402
from lmcbench.report.facets import facet_grid, save, where  # noqa: E402
from lmcbench.report.plots import kinds_in  # noqa: E402

MODES = {"delta": "XOR delta", "delta_sub": "subtraction delta", "reference": "adaptive (per-chunk XOR or not)"}
HEADER_SLACK = 8  # bytes: the reference hash an LMC blob coded against a reference carries in its header


def classify(transform_config: str) -> tuple[str, int]:
    """(mode, lag) of a pipeline from its recorded config: ('alone', 0), ('delta', k), ('delta_sub', k) or
    ('reference', k)."""
    steps = json.loads(transform_config) if isinstance(transform_config, str) and transform_config else []
    for t in steps:
        if t.get("id") == "delta":
            return ("delta" if t.get("mode", "xor") == "xor" else "delta_sub"), int(t.get("lag", 1))
        if t.get("id") == "reference":
            return "reference", int(t.get("lag", 1))
    return "alone", 0


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (tensor, step, pipeline) with mode and lag, verified rows only, of one codec: LMC when the
    run has it (the only codec that takes a reference), else the run's first codec."""
    codecs = list(dict.fromkeys(df["codec"]))
    codec = "lmc" if "lmc" in codecs else codecs[0]
    ok = df[df["verified"] & df["comp_bytes"].notna() & (df["codec"] == codec)].copy()
    ml = ok["transform_config"].map(classify)
    ok["mode"] = [m for m, _ in ml]
    ok["lag"] = [g for _, g in ml]
    ok["has_ref"] = ok["ref_step"].notna() & (ok["ref_step"].astype(str).str.strip() != "")
    return ok


def ratio_vs_lag(t: pd.DataFrame, min_step) -> pd.DataFrame:
    """Ratio per dtype, kind, mode and lag, over the steps from ``min_step`` on (where every lag has its
    reference, so that every column covers the same checkpoints)."""
    part = t[t["step"] >= min_step]
    alone = part[part["mode"] == "alone"]
    rows = []
    for (dt, kind), g in alone.groupby(["dtype", "kind"]):
        rows.append({"dtype": dt, "kind": kind, "mode": "alone", "lag": 0,
                     "ratio": g["orig_bytes"].sum() / g["comp_bytes"].sum()})
    d = part[(part["mode"] != "alone") & part["has_ref"]]
    for (dt, kind, mode, lag), g in d.groupby(["dtype", "kind", "mode", "lag"]):
        rows.append({"dtype": dt, "kind": kind, "mode": mode, "lag": lag,
                     "ratio": g["orig_bytes"].sum() / g["comp_bytes"].sum()})
    return pd.DataFrame(rows)


def by_step(t: pd.DataFrame) -> pd.DataFrame:
    """Ratio per dtype, kind, mode, lag and step (steps without their reference are left out)."""
    d = t[(t["mode"] == "alone") | t["has_ref"]]
    g = d.groupby(["dtype", "kind", "mode", "lag", "step"])[["orig_bytes", "comp_bytes"]].sum().reset_index()
    g["ratio"] = g["orig_bytes"] / g["comp_bytes"]
    return g


def never_loses(t: pd.DataFrame) -> pd.DataFrame:
    """Per kind and lag: the adaptive reference against LMC alone on every tensor of every step."""
    key = ["dtype", "tensor", "kind", "step"]
    alone = t[t["mode"] == "alone"].set_index(key)["comp_bytes"]
    xor = t[t["mode"] == "delta"].set_index(key + ["lag"])["comp_bytes"]
    rows = []
    for (dt, kind, lag), g in t[t["mode"] == "reference"].groupby(["dtype", "kind", "lag"]):
        g = g[g["has_ref"]].set_index(key)
        if g.empty:
            continue
        a = alone.reindex(g.index)
        x = xor.reindex([k + (lag,) for k in g.index]).to_numpy()
        excess = g["comp_bytes"].to_numpy() - a.to_numpy()
        best = pd.Series(x).where(pd.Series(x) < a.to_numpy(), a.to_numpy()).to_numpy()
        rows.append({"dtype": dt, "kind": kind, "lag": lag, "tensors x steps": len(g),
                     "larger than alone": int((excess > 0).sum()),
                     "most bytes over alone": int(max(0, excess.max())) if len(g) else 0,
                     "saved vs alone": 1 - g["comp_bytes"].sum() / a.sum(),
                     "saved vs best of alone/XOR per tensor": 1 - g["comp_bytes"].sum() / best.sum()})
    return pd.DataFrame(rows)


def changed_fraction(xor: pd.DataFrame) -> pd.DataFrame:
    g = xor.groupby(["dtype", "kind", "lag", "step"])[["numel", "changed_elems", "changed_bits"]].sum().reset_index()
    width = xor.groupby(["dtype"])["bit_flips"].first().map(lambda v: len(str(v).split("/")))
    g["changed"] = g["changed_elems"] / g["numel"]
    g["bits_changed"] = g["changed_bits"] / (g["numel"] * g["dtype"].map(width))
    return g


def render(run_dir: str, out_dir: str) -> str:
    df, _, env = load_run(run_dir)
    os.makedirs(out_dir, exist_ok=True)
    t = tidy(df)
    lags = sorted({int(x) for x in t.loc[t["mode"] != "alone", "lag"]})
    steps = sorted(t["step"].unique())
    min_step = steps[min(max(lags, default=1), len(steps) - 1)]
    lines = header("How far back can a delta's reference be?", env,
                   f"Each checkpoint coded by LMC against the same tensor {', '.join(map(str, lags))} checkpoints "
                   "back: as an XOR delta, as an integer subtraction delta, and with LMC's adaptive reference (each "
                   "chunk XORed only where that codes smaller); 'alone' is LMC on the checkpoint by itself. "
                   "Ratio = original / compressed bytes. Lossless, every round trip verified.")
    rv = ratio_vs_lag(t, min_step)
    lines += [f"## Ratio against the reference's distance (checkpoints from step {min_step} on, where every lag has "
              "its reference)", ""]
    for dt in dict.fromkeys(rv["dtype"]):
        p = rv[rv["dtype"] == dt].pivot_table(index=["kind", "mode"], columns="lag", values="ratio")
        p = p.reindex([(k, m) for k in KINDS + sorted(set(rv["kind"]) - set(KINDS)) for m in ["alone", *MODES]
                       if (k, m) in p.index])
        p.columns = ["alone" if c == 0 else f"lag {c}" for c in p.columns]
        p = p.map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
        p.index = [f"{k} / {MODES.get(m, m)}" for k, m in p.index]
        lines += [f"{dt}:", "", md_table(p, "kind / mode"), ""]
    nl = never_loses(t)
    if not nl.empty:
        worst = int(nl["most bytes over alone"].max())
        lines += ["## The adaptive reference never loses to compressing alone", "",
                  f"Over every tensor of every step and every lag, the adaptive reference was larger than LMC alone "
                  f"by at most {worst} bytes per tensor (the {HEADER_SLACK}-byte reference hash in its header). "
                  "Savings are of the total bytes; the last column compares with choosing, per tensor, the smaller "
                  "of alone and the XOR delta.", ""]
        show = nl.copy()
        for c in ("saved vs alone", "saved vs best of alone/XOR per tensor"):
            show[c] = show[c].map(lambda v: f"{100 * v:+.2f}%")
        show.index = [f"{d} / {k} / lag {g}" for d, k, g in zip(show.pop("dtype"), show.pop("kind"), show.pop("lag"))]
        lines += [md_table(show, "dtype / kind / lag"), ""]
    bs = by_step(t)
    made = [_plot_lag_steps(bs, os.path.join(out_dir, "ratio_vs_step_by_lag.png"))]
    xor_path = os.path.join(run_dir, "xor.csv")
    cf = pd.DataFrame()
    if os.path.exists(xor_path):
        xor = pd.read_csv(xor_path, dtype={"bit_flips": str})
        if "lag" not in xor:
            xor["lag"] = 1
        cf = changed_fraction(xor)
        made.append(_plot_changed(bs, cf, os.path.join(out_dir, "ratio_vs_changed.png")))
        last = cf[cf["step"] == cf["step"].max()].pivot_table(index=["dtype", "kind"], columns="lag", values="changed")
        last.columns = [f"lag {c}" for c in last.columns]
        last = last.map(lambda v: f"{v:.3f}")
        last.index = [" / ".join(i) for i in last.index]
        lines += [f"## Fraction of values changed at step {cf['step'].max()}", "", md_table(last, "dtype / kind"), ""]
    made = [m for m in made if m]
    lines += ["## Figures", ""] + [f"![{m}]({m})" for m in made] + [""]
    out = bs.merge(cf[["dtype", "kind", "lag", "step", "changed", "bits_changed"]], how="left", on=["dtype", "kind", "lag", "step"]) \
        if not cf.empty else bs
    out.to_csv(os.path.join(out_dir, "delta_gap.csv"), index=False, float_format="%.6g")
    if not nl.empty:
        nl.to_csv(os.path.join(out_dir, "never_loses.csv"), index=False, float_format="%.6g")
    return finish(run_dir, out_dir, lines, copy=("summary.csv", "environment.json"))


def _plot_lag_steps(bs, path):
    pairs = [(d, k) for d in dict.fromkeys(bs["dtype"]) for k in kinds_in(bs[bs["dtype"] == d])]
    modes = [m for m in MODES if m in set(bs["mode"])]
    if not pairs or not modes:
        return None
    cmap = plt.get_cmap("viridis")
    lags = sorted({int(x) for x in bs.loc[bs["mode"] != "alone", "lag"]})

    def draw(ax, m, pair):
        d, k = pair
        a = where(bs, dtype=d, kind=k, mode="alone")
        ax.plot(a["step"], a["ratio"], color="black", lw=1.5, label="alone")
        for n, lag in enumerate(lags):
            g = where(bs, dtype=d, kind=k, mode=m, lag=lag)
            ax.plot(g["step"], g["ratio"], marker=".", color=cmap(n / max(1, len(lags) - 1) * 0.9), label=f"lag {lag}")

    fig, _ = facet_grid(modes, pairs, draw, panel=(3.8, 2.9), title=lambda m, p: f"{p[1]} ({p[0]}): {MODES[m]}",
                        title_size=8, row_label=lambda m: "ratio", sharex=True)
    return save(fig, path, suptitle="ratio against step, reference 1, 2, 4, 8 ... checkpoints back (LMC)")


def _plot_changed(bs, cf, path):
    pairs = [(d, k) for d in dict.fromkeys(bs["dtype"]) for k in kinds_in(bs[bs["dtype"] == d])]
    m = bs[bs["mode"].isin(["delta", "delta_sub", "reference"])].merge(cf, on=["dtype", "kind", "lag", "step"])
    if m.empty:
        return None
    xs = [("changed", "fraction of values changed"), ("bits_changed", "fraction of bits changed")]
    fig, axes = plt.subplots(len(xs), len(pairs), figsize=(3.8 * len(pairs), 3.2 * len(xs)), squeeze=False,
                             layout="constrained")
    marks = {"delta": "o", "delta_sub": "^", "reference": "s"}
    for row, (col, label) in zip(axes, xs):
        for ax, (d, k) in zip(row, pairs):
            for mode, g in m[(m["dtype"] == d) & (m["kind"] == k)].groupby("mode"):
                sc = ax.scatter(g[col], g["ratio"], c=g["lag"], cmap="viridis", marker=marks[mode], s=14,
                                label=MODES[mode], norm=matplotlib.colors.LogNorm(1, max(2, m["lag"].max())))
            ax.set_title(f"{k} ({d})", fontsize=9)
            ax.set_xlabel(label)
            ax.ticklabel_format(axis="x", useOffset=False)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("ratio")
    axes[0][0].legend(fontsize=6)
    fig.colorbar(sc, ax=axes.ravel().tolist(), label="lag (checkpoints back)")
    return save(fig, path, tight=False, bbox_inches="tight")


if __name__ == "__main__":
    main(render, "delta_gap", __doc__)
