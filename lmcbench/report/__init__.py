"""Reports: pandas tables and matplotlib figures rendered next to the records.

Records of a sampled run (``bench.sample < 1``) are loaded as estimates of the whole checkpoint
(:func:`.sampling.estimated`), so every sum / sum below is the sample's ratio estimate; the run report then
gives each ratio its bootstrap interval and says in its header that the run was sampled."""

from __future__ import annotations

import glob
import json
import os

import pandas as pd

from ..errors import LmcbenchError
from lmc.formats.tensors import KINDS as KIND_ORDER
from ..transforms import Pipeline
from .sampling import describe as describe_sample
from .sampling import estimated, fmt_ci, is_sampled, ratio_intervals

MiB = 2**20


def record_files(paths) -> list[str]:
    """The ``records.csv`` files of run folders or files (a sweep folder is searched recursively)."""
    files = []
    for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths):
        p = str(p)
        if os.path.isdir(p):
            files.extend(sorted(glob.glob(os.path.join(p, "**", "records.csv"), recursive=True)))
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise LmcbenchError(f"{p}: no such file or folder")
    if not files:
        raise LmcbenchError(f"{paths}: no records.csv found")
    seen = set()  # a run named twice (a sweep folder and one of its runs) is read once
    return [f for f in files if not (os.path.realpath(f) in seen or seen.add(os.path.realpath(f)))]


def run_names(files: list[str]) -> dict[str, str]:
    """Each records file's run: its folder relative to the folder common to all (the ``run`` column)."""
    common = os.path.commonpath([os.path.dirname(x) for x in files]) or "."
    return {f: os.path.relpath(os.path.dirname(f), common) for f in files}


def load_records(paths) -> pd.DataFrame:
    """Records from run folders or ``records.csv`` files (a sweep folder is searched recursively); a sampled
    run's bytes and seconds are estimates for the whole checkpoint (:func:`.sampling.estimated`)."""
    files = record_files(paths)
    runs = run_names(files)
    frames = []
    for f in files:
        try:
            df = pd.read_csv(f, keep_default_na=False, na_values=[""], dtype={"shape": str, "cast": str})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise LmcbenchError(f"{f}: not a records file ({e})") from None
        if df.empty:
            continue
        df["run"] = runs[f]
        frames.append(df)
    if not frames:
        raise LmcbenchError(f"{paths}: the records are empty")
    df = pd.concat(frames, ignore_index=True)
    df["verified"] = df["verified"].astype(str).str.lower().eq("true")
    return estimated(df)


def load_streams(paths) -> pd.DataFrame | None:
    files = []
    for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths):
        p = str(p)
        if os.path.isdir(p):
            files.extend(sorted(glob.glob(os.path.join(p, "**", "streams.csv"), recursive=True)))
        elif os.path.isfile(p) and os.path.exists(os.path.join(os.path.dirname(p), "streams.csv")):
            files.append(os.path.join(os.path.dirname(p), "streams.csv"))
    frames = [pd.read_csv(f, keep_default_na=False, na_values=[""]) for f in files]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True).drop_duplicates() if frames else None


def temporal(df: pd.DataFrame) -> pd.Series:
    """Whether each row's pipeline takes a reference (:attr:`Pipeline.temporal`: a delta, or the previous step
    handed to the codec), from the recorded ``transform_config``."""
    configs = df["transform_config"].astype(str)
    return configs.map({c: _temporal(c) for c in configs.unique()}).astype(bool)


def _temporal(config: str) -> bool:
    try:
        return Pipeline.from_config("", json.loads(config) if config and config != "nan" else []).temporal
    except (ValueError, TypeError, LmcbenchError):
        return False


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """Rows to aggregate: verified ones, and when the grid has temporal pipelines, only the steps where every
    pipeline had a reference (the first step of a series has nothing to delta against)."""
    ok = df[df["verified"] & df["comp_bytes"].notna()].copy()
    if temporal(ok).any():
        first = ok.groupby(["tensor", "kind"])["step"].transform("min")
        ok = ok[ok["step"] > first]
    return ok


def aggregate(df: pd.DataFrame, by) -> pd.DataFrame:
    """Ratio and throughput of groups: sums of bytes and seconds, so big tensors weigh as they should."""
    if "cond_bound_bytes" not in df:  # records written before the bound given the reference existed
        df = df.assign(cond_bound_bytes=float("nan"))
    g = df.groupby(by, dropna=False, sort=False).agg(orig_bytes=("orig_bytes", "sum"), comp_bytes=("comp_bytes", "sum"),
                                         compress_s=("compress_s", "sum"), decompress_s=("decompress_s", "sum"),
                                         bound_bytes=("entropy_bound_bytes", "sum"),
                                         cond_bytes=("cond_bound_bytes", lambda v: v.sum(min_count=len(v))),
                                         rows=("orig_bytes", "size"))
    g["ratio"] = g["orig_bytes"] / g["comp_bytes"]
    g["bound_ratio"] = g["orig_bytes"] / g["bound_bytes"].where(g["bound_bytes"] > 0)
    g["cond_ratio"] = g["orig_bytes"] / g["cond_bytes"].where(g["cond_bytes"] > 0)
    g["compress_MiBps"] = g["orig_bytes"] / MiB / g["compress_s"].where(g["compress_s"] > 0)
    g["decompress_MiBps"] = g["orig_bytes"] / MiB / g["decompress_s"].where(g["decompress_s"] > 0)
    return g.reset_index()


def kinds_in(df) -> list[str]:
    """The kinds present in ``df``: weights, the Adam moments and other in that order, then any else met."""
    ks = list(dict.fromkeys(df["kind"]))
    return [k for k in KIND_ORDER if k in ks] + [k for k in ks if k not in KIND_ORDER]


def _order(values, preferred):
    vals = list(dict.fromkeys(values))
    return [v for v in preferred if v in vals] + [v for v in vals if v not in preferred]


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


def size_text(nbytes: float) -> str:
    """``nbytes`` in MiB (two decimals), or in KiB below 0.1 MiB."""
    v = nbytes / MiB
    return f"{v:.2f} MiB" if v >= 0.1 else f"{v * 1024:.0f} KiB"


__all__ = ["record_files", "run_names", "kinds_in", "load_records", "load_streams", "aggregate", "comparable", "pivot",
           "ratio_cells", "render", "summary_text", "temporal"]
