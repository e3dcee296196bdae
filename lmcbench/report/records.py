"""Records and streams read back from run folders (a sampled run's as estimates of the whole checkpoint), and
the aggregates every report is made of: comparable rows, sums of bytes and seconds by group, the kinds present."""

from __future__ import annotations

import glob
import json
import os

import pandas as pd

from ..errors import LmcbenchError
from lmc.formats.tensors import KINDS as KIND_ORDER
from ..transforms import Pipeline
from .sampling import estimated

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


def size_text(nbytes: float) -> str:
    """``nbytes`` in MiB (two decimals), or in KiB below 0.1 MiB."""
    v = nbytes / MiB
    return f"{v:.2f} MiB" if v >= 0.1 else f"{v * 1024:.0f} KiB"
