"""Render ``lmcbench experiment=temporal`` into results/temporal/: every checkpoint coded against the one before
by LMC 0.2 (the previous checkpoint as context), LMC 0.1's per-chunk XOR choice, z4ai's ``compress_delta``,
zstd and ZipNN on the XOR delta, beside LMC alone and two bounds: the order-0 bound of the XOR delta's byte
planes and the bound given the reference (the byte planes coded with the reference's same byte, and whether the
higher bytes are unchanged, as context).

Re-render an existing run:  python experiments/temporal.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import KINDS, MiB, begin, finish, main, md_table  # noqa: E402
from lmcbench.report.facets import facet_grid, save, where  # noqa: E402

# (codec option, pipeline) -> method, in table order; a run may lack some (a peer that is not installed)
METHODS = {
    ("lmc", "raw"): "LMC alone",
    ("lmc_v1", "reference"): "LMC 0.1 (per-chunk XOR choice)",
    ("lmc", "reference"): "LMC 0.2 (reference)",
    ("lmc_fast", "reference"): "LMC fast (reference)",
    ("z4ai", "raw"): "z4ai alone",
    ("z4ai", "reference"): "z4ai delta",
    ("zstd", "delta_bytegroup"): "zstd, XOR + byte planes",
    ("zipnn", "delta"): "ZipNN, XOR",
}
OURS, PEER, OLD = "LMC 0.2 (reference)", "z4ai delta", "LMC 0.1 (per-chunk XOR choice)"
FAST = "LMC fast (reference)"   # lmc.compress(prefer="fast"): never the temporal mode
XOR_BOUND, COND_BOUND = "order-0 bound, XOR byte planes", "bound given the reference"
LATE = 0.75  # "late" steps: the last quarter of training (the learning rate's decay), where deltas pay most


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Verified rows of the methods above, each labelled; rows of a temporal pipeline without a reference (the
    first step) are left out, and so is the first step of every method, so that all compare the same steps."""
    ok = df[df["verified"] & df["comp_bytes"].notna()].copy()
    ok["method"] = [METHODS.get((c, t)) for c, t in zip(ok["codec"], ok["transform"])]
    ok = ok[ok["method"].notna()]
    first = ok["step"].min()
    return ok[ok["step"] > first]


def bounds(df: pd.DataFrame) -> pd.DataFrame:
    """The two bounds as pseudo-methods: the byte planes of the XOR delta (the ``delta_bytegroup`` rows of one
    codec): their per-block order-0 bound, and each plane given the same plane of the reference."""
    d = df[(df["transform"] == "delta_bytegroup") & df["verified"]]
    if d.empty:
        return d
    d = d[d["codec"] == d["codec"].iloc[0]]
    d = d[d["step"] > df["step"].min()]
    xor = d.assign(method=XOR_BOUND, comp_bytes=d["block_bound_bytes"])
    cond = d[pd.to_numeric(d["cond_bound_bytes"], errors="coerce").notna()]
    cond = cond.assign(method=COND_BOUND, comp_bytes=pd.to_numeric(cond["cond_bound_bytes"]))
    return pd.concat([xor, cond])


def ratios(t: pd.DataFrame, by) -> pd.DataFrame:
    g = t.groupby(by + ["method"])[["orig_bytes", "comp_bytes"]].sum().reset_index()
    g["ratio"] = g["orig_bytes"] / g["comp_bytes"]
    return g


def late_table(t: pd.DataFrame, late_from) -> pd.DataFrame:
    """Ratio per dtype, kind (and the whole checkpoint) and method over the late steps."""
    part = t[t["step"] >= late_from]
    per_kind = ratios(part, ["dtype", "kind"])
    whole = ratios(part, ["dtype"]).assign(kind="whole checkpoint")
    return pd.concat([per_kind, whole], ignore_index=True)


def versus(t: pd.DataFrame, late_from, a: str, b: str) -> pd.DataFrame:
    """Per dtype and kind: at how many late steps method ``a`` is no larger than ``b`` (summed over the tensors
    of each step), and the smallest and largest size ratio b / a."""
    part = t[(t["step"] >= late_from) & t["method"].isin([a, b])]
    s = part.groupby(["dtype", "kind", "step", "method"])["comp_bytes"].sum().unstack("method")
    if a not in s or b not in s:
        return pd.DataFrame()
    s = s.dropna(subset=[a, b])
    gain = s[b] / s[a]
    out = gain.groupby(["dtype", "kind"]).agg(steps="size", wins=lambda g: int((g >= 1).sum()), min="min",
                                              max="max")
    return out.reset_index()


def speeds(t: pd.DataFrame) -> pd.DataFrame:
    """One-thread MiB/s per dtype and method over every step with a reference (compress / decompress)."""
    g = t.groupby(["dtype", "method"])[["orig_bytes", "compress_s", "decompress_s", "threads"]].agg(
        {"orig_bytes": "sum", "compress_s": "sum", "decompress_s": "sum", "threads": "max"}).reset_index()
    g["compress"] = g["orig_bytes"] / MiB / g["compress_s"]
    g["decompress"] = g["orig_bytes"] / MiB / g["decompress_s"]
    return g


def relative_speed(t: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per dtype and kind (and the whole checkpoint): compress and decompress speed of method ``a`` over that of
    ``b`` on the same tensors and steps (a ratio of summed times)."""
    part = t[t["method"].isin([a, b])]
    rows = {}
    for (dt, kind), g in list(part.groupby(["dtype", "kind"])) + [((d, "whole checkpoint"), g)
                                                                  for d, g in part.groupby("dtype")]:
        s = g.groupby("method")[["compress_s", "decompress_s"]].sum()
        if a in s.index and b in s.index:
            rows[f"{dt} / {kind}"] = {"compress": f"{s.loc[b, 'compress_s'] / s.loc[a, 'compress_s']:.2f}x",
                                      "decompress": f"{s.loc[b, 'decompress_s'] / s.loc[a, 'decompress_s']:.2f}x"}
    return pd.DataFrame(rows).T


def _order(kinds) -> list:
    return [k for k in KINDS + ["whole checkpoint"] if k in set(kinds)] + sorted(set(kinds) - set(KINDS) -
                                                                               {"whole checkpoint"})


def render(run_dir: str, out_dir: str) -> str:
    df, _, env, lines = begin(
        run_dir, out_dir, "LMC: the previous checkpoint as context, and alone",
        "Every checkpoint coded against the one before (the first has none and is left out): LMC 0.2 with the "
        "reference (per chunk the smallest of alone, XOR, the temporal and the delta mode), LMC with "
        "prefer=\"fast\" (never the temporal mode, whose rANS decodes symbol by symbol: the delta mode, byte "
        "streams only), LMC 0.1's per-chunk XOR choice, "
        "z4ai's compress_delta, zstd on the XOR delta's byte planes and ZipNN on the XOR delta, beside LMC "
        "alone (lmc 0.3: with the predicted-exponent mode where a run's lmc has it) and z4ai's compress alone. "
        "Bounds: the per-block order-0 bound of the XOR delta's byte planes, and the bound given the "
        "reference (each byte plane coded by an adaptive coder with the previous checkpoint's same byte, and "
        "whether the higher bytes are unchanged, as context: the reach of a byte-context coder; a coder that "
        "models how values move can go below it). Ratio = original / compressed bytes; every round trip verified; one thread.")
    t = tidy(df)
    b = bounds(df)
    every = pd.concat([t, b], ignore_index=True)
    steps = sorted(t["step"].unique())
    late_from = steps[min(len(steps) - 1, int(LATE * len(steps)))]
    methods = [m for m in list(METHODS.values()) + [XOR_BOUND, COND_BOUND] if m in set(every["method"])]
    lt = late_table(every, late_from)
    lines += [f"## Late steps ({late_from} to {steps[-1]}): ratio", ""]
    for dt in dict.fromkeys(lt["dtype"]):
        p = lt[lt["dtype"] == dt].pivot_table(index="kind", columns="method", values="ratio")
        p = p.reindex(index=_order(p.index), columns=[m for m in methods if m in p.columns])
        lines += [f"{dt}:", "", md_table(p.map(lambda v: "" if pd.isna(v) else f"{v:.3f}"), "kind"), ""]
    for a, bb, what, since, ours in ((OURS, PEER, "z4ai's delta", late_from, "LMC 0.2"),
                                     (FAST, PEER, "z4ai's delta", steps[0], "LMC fast"),
                                     (OURS, OLD, "LMC 0.1's reference mode", late_from, "LMC 0.2"),
                                     ("LMC alone", "z4ai alone", "z4ai alone", steps[0], "LMC alone")):
        v = versus(t, since, a, bb)
        if v.empty:
            continue
        show = v.set_index([v.pop("dtype"), v.pop("kind")])
        show.index = [f"{d} / {k}" for d, k in show.index]
        show["min"] = show["min"].map(lambda x: f"{x:.3f}x")
        show["max"] = show["max"].map(lambda x: f"{x:.3f}x")
        span = "late steps" if since == late_from else "steps"
        show.columns = [span, f"steps where {ours} <= {what}", "smallest gain", "largest gain"]
        lines += [f"## {ours} against {what}, step by step", "",
                  f"Gain = the size of {what} / the size of {ours}, per step over all tensors of a kind"
                  f"{'' if since == late_from else ', every step'}.", "", md_table(show, "dtype / kind"), ""]
    sp = speeds(t)
    if not sp.empty:
        p = sp.pivot_table(index="method", columns="dtype", values=["compress", "decompress"])
        tab = pd.DataFrame({f"{dt} {w}": p[(w, dt)] for dt in dict.fromkeys(sp["dtype"])
                            for w in ("compress", "decompress") if (w, dt) in p})
        tab = tab.reindex([m for m in METHODS.values() if m in tab.index]).map(lambda v: f"{v:.0f}")
        lines += ["## Speed (MiB/s of original data, one thread, every step with a reference)", "",
                  "Small tensors weigh in the per-call overhead; compare rows of this run only.", "",
                  md_table(tab, "method"), ""]
        for m in (OURS, FAST):
            rel = relative_speed(t, m, "LMC alone")
            if not rel.empty:
                lines += [f"{m} against LMC alone, per kind (speed with the reference / speed alone, same "
                          "tensors and steps, every step; the issue's target is 0.5x):", "",
                          md_table(rel, "dtype / kind"), ""]
    by = ratios(every, ["dtype", "kind", "step"])
    made = [m for m in [_plot(by, methods, os.path.join(out_dir, "ratio_vs_step.png"))] if m]
    lines += ["## Figures", ""] + [f"![{m}]({m})" for m in made] + [""]
    by.to_csv(os.path.join(out_dir, "temporal.csv"), index=False, float_format="%.6g")
    lt.to_csv(os.path.join(out_dir, "late.csv"), index=False, float_format="%.6g")
    return finish(run_dir, out_dir, lines, copy=("summary.csv", "environment.json"))


STYLE = {"LMC alone": ("black", "-"), "z4ai alone": ("tab:green", ":"), OLD: ("tab:blue", "--"), OURS: ("tab:red", "-"),
         FAST: ("tab:red", "--"), PEER: ("tab:green", "-"),
         "zstd, XOR + byte planes": ("tab:orange", ":"), "ZipNN, XOR": ("tab:purple", ":"),
         XOR_BOUND: ("grey", "-."), COND_BOUND: ("tab:red", ":")}


def _plot(by: pd.DataFrame, methods, path):
    dtypes = list(dict.fromkeys(by["dtype"]))
    kinds = [k for k in KINDS if k in set(by["kind"])]
    if not dtypes or not kinds:
        return None

    def draw(ax, dt, kind):
        g = where(by, dtype=dt, kind=kind)
        if g.empty:
            return False
        for m in methods:
            s = g[g["method"] == m]
            if not s.empty:
                color, ls = STYLE.get(m, (None, "-"))
                ax.plot(s["step"], s["ratio"], color=color, ls=ls, marker="." if m == OURS else None, label=m)

    fig, axes = facet_grid(dtypes, kinds, draw, panel=(4.2, 3.0), title=lambda d, k: f"{k} ({d})",
                           row_label=lambda d: "ratio", legend=None)
    handles, labels = max((ax.get_legend_handles_labels() for ax in axes.ravel()), key=lambda hl: len(hl[1]))
    fig.legend(handles, labels, loc="upper center", ncol=4, frameon=False, fontsize=8)
    return save(fig, path, rect=(0, 0, 1, 1 - 0.5 / (3.0 * len(dtypes))))


if __name__ == "__main__":
    main(render, "temporal", __doc__)
