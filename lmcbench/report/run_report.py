"""The run report: the table printed at the end of a run (:func:`summary_text`) and ``report.md`` with its
figures (:func:`render`)."""

from __future__ import annotations

import os

import pandas as pd

from .records import aggregate, comparable, kinds_in, load_records, load_streams, size_text
from .sampling import describe as describe_sample
from .sampling import fmt_ci, is_sampled, ratio_intervals


def ratio_cells(part: pd.DataFrame, agg: pd.DataFrame, by=("transform", "codec_label")) -> pd.DataFrame:
    """``agg`` with a ``ratio_ci`` column to pivot: the ratio, and for a sampled run its bootstrap interval."""
    if not is_sampled(part):
        return agg.assign(ratio_ci=[f"{v:.3f}" if pd.notna(v) else "" for v in agg["ratio"]])
    ci = ratio_intervals(part, list(by))
    agg = agg.merge(ci[list(by) + ["ratio_lo", "ratio_hi"]], on=list(by), how="left")
    return agg.assign(ratio_ci=[fmt_ci(r, lo, hi) for r, lo, hi in zip(agg["ratio"], agg["ratio_lo"], agg["ratio_hi"])])


def pivot(agg: pd.DataFrame, value: str, fmt="{:.3f}") -> pd.DataFrame:
    transforms = list(dict.fromkeys(agg["transform"]))
    codecs = list(dict.fromkeys(agg["codec_label"]))
    p = agg.pivot_table(index="codec_label", columns="transform", values=value, aggfunc="first")
    p = p.reindex(index=codecs, columns=transforms)
    return p.map(lambda v: "" if pd.isna(v) else fmt.format(v))


def summary_text(df: pd.DataFrame) -> str:
    """The table printed at the end of a run: ratio over all selected tensors, and compress speed."""
    ok = comparable(df)
    if ok.empty:
        return "no verified measurements"
    agg = ratio_cells(ok, aggregate(ok, ["transform", "codec_label"]))
    note = describe_sample(ok)
    lines = ([note, ""] if note else []) + [
             "ratio (orig/comp) over all selected tensors:", pivot(agg, "ratio_ci", "{}").to_string(), "",
             "compress MiB/s:", pivot(agg, "compress_MiBps", "{:.0f}").to_string(), "",
             "decompress MiB/s:", pivot(agg, "decompress_MiBps", "{:.0f}").to_string()]
    return "\n".join(lines)


def _md(p: pd.DataFrame, corner="codec") -> str:
    cols = [corner] + [str(c) for c in p.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["---:"] * len(p.columns)) + "|"]
    for idx, row in p.iterrows():
        out.append("| " + " | ".join([str(idx)] + [str(v) for v in row.values]) + " |")
    return "\n".join(out)


def render(run_dirs, out_dir: str, title: str = "lmcbench report", figures: bool = True,
           records: pd.DataFrame | None = None) -> str:
    """Write ``report.md`` (and figures) for the records in ``run_dirs`` into ``out_dir``; returns its path."""
    df = load_records(run_dirs) if records is None else records
    streams = load_streams(run_dirs)
    os.makedirs(out_dir, exist_ok=True)
    from . import header, shards

    env = header.load(run_dirs)
    ok = comparable(df)
    more = shards.check(run_dirs, df)  # a split series: every shard once, or a one-line error
    if env.get("peak_rss_mib"):
        more.append(f"- peak memory (RSS): {env['peak_rss_mib']:.0f} MiB; largest tensor "
                    f"{env.get('largest_tensor_mib', 0):.1f} MiB")
    n_fail = int((~df["verified"]).sum())
    steps = sorted(df["step"].unique())
    more.append(f"- {len(df)} measurements, {df[['tensor', 'kind']].drop_duplicates().shape[0]} tensors, steps "
                f"{', '.join(map(str, steps))}; round trips verified bit-exact: {len(df) - n_fail} of {len(df)}")
    if is_sampled(df):
        more.append(f"- **{describe_sample(df)}**; bytes, seconds and bounds below are the sample's estimates "
                    "for every selected tensor")
    lines = header.lines(title, env, runs=header.commands(run_dirs), more=more)
    if n_fail:
        bad = df[~df["verified"]].groupby(["codec_label", "transform"])["error"].first().reset_index()
        lines += ["## Failed round trips", "", _md(bad.set_index("codec_label"), "codec"), ""]
    if len(ok) < len(df[df["verified"]]):
        lines += [f"Aggregates leave out step {steps[0]} (the first step has no previous checkpoint to delta "
                  "against), so every transform is compared on the same data. Ratio = sum of original bytes / sum "
                  "of compressed bytes; MiB/s = original MiB / seconds, transform included. `bound` = the "
                  "order-0 entropy bound of the transform's streams; `bound given the reference` = the byte planes "
                  "coded by an adaptive coder with the previous checkpoint's same byte (and whether the higher "
                  "bytes are unchanged) as context.", ""]
    kinds = kinds_in(ok)  # sections in the order of the kinds, whatever the order of the rows (merged shards)
    sections = sorted(ok.groupby(["kind", "dtype"], sort=False), key=lambda g: kinds.index(g[0][0]))
    for (kind, dtype), part in sections:
        agg = ratio_cells(part, aggregate(part, ["transform", "codec_label"]))
        p = pivot(agg, "ratio_ci", "{}")
        bound = agg.groupby("transform", sort=False)["bound_ratio"].first().reindex(p.columns)
        p.loc["(order-0 bound)"] = [f"{v:.3f}" if pd.notna(v) else "" for v in bound.values]
        cond = agg.groupby("transform", sort=False)["cond_ratio"].first().reindex(p.columns)
        if cond.notna().any():
            p.loc["(bound given the reference)"] = [f"{v:.3f}" if pd.notna(v) else "" for v in cond.values]
        agg["speed"] = [f"{c:.0f} / {d:.0f}" if pd.notna(c) and pd.notna(d) else ""
                        for c, d in zip(agg["compress_MiBps"], agg["decompress_MiBps"])]
        lines += [f"## {kind} ({dtype})", "", f"Compression ratio, {_mib(part)} per step:", "", _md(p), "",
                  "Compress / decompress MiB/s:", "", _md(pivot(agg, "speed", "{}")), ""]
    summary = aggregate(df[df["verified"] & df["comp_bytes"].notna()],
                        ["step", "kind", "dtype", "transform", "codec_label"])
    summary.to_csv(os.path.join(out_dir, "summary.csv"), index=False, float_format="%.6g")
    lines += ["Per-step aggregates (every verified row, first step included): `summary.csv`.", ""]
    if figures:
        from . import plots

        made = plots.all_figures(df, streams, out_dir)
        if made:
            lines += ["## Figures", ""] + [f"![{os.path.splitext(m)[0]}]({m})" for m in made] + [""]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _mib(part: pd.DataFrame) -> str:
    per_step = part.groupby("step")["orig_bytes"].sum() / part.groupby("step")["codec_label"].nunique() / \
        part.groupby("step")["transform"].nunique()
    return size_text(float(per_step.mean()))
