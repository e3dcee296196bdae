"""Merging a split series: the runs of ``source.shard=i/n`` jobs hold disjoint parts of one series' tensors.

A run records in ``environment.json`` its ``series`` (a digest of its configuration less the shard, the same for
every job of one series) and, when sharded, its ``shard`` (index, count, and the tensors and bytes it kept of
the series').
Before a merge is reported, :func:`check` makes sure each split series is there whole: all ``n`` shards, each
exactly once, agreeing on the series, no tensor in two of them, and not beside a run of the whole series.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict

import pandas as pd

from ..errors import LmcbenchError


def _environment(records_file: str) -> dict:
    try:
        with open(os.path.join(os.path.dirname(records_file), "environment.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _label(env: dict) -> str:
    """The command of a shard's series: its job's overrides less ``source.shard``."""
    rest = re.sub(r"(^|\s)source\.shard=\S+", " ", env.get("job_overrides") or "").split()
    return f"lmcbench {' '.join(rest)}".strip()


def check(run_dirs, df: pd.DataFrame) -> list[str]:
    """Report-header bullets for the sharded runs among ``run_dirs`` (none when there are none). Merging more
    than one run, each split series must be complete: a one-line :class:`LmcbenchError` names what is wrong."""
    from .records import record_files, run_names, size_text

    files = record_files(run_dirs)
    runs = run_names(files)
    envs = {runs[f]: _environment(f) for f in files}
    split = {r: e for r, e in envs.items() if e.get("shard")}
    if not split:
        return []
    if len(files) == 1:
        (s,) = (e["shard"] for e in split.values())
        return [f"- shard {s['index']}/{s['count']} of a split series: {s['tensors']} of its {s['series_tensors']} "
                f"tensors ({size_text(s['bytes'])} of {size_text(s['series_bytes'])} over all steps); "
                f"`lmcbench-report` over the {s['count']} shard runs merges them"]
    series: dict[str, list[str]] = defaultdict(list)
    for r, e in split.items():
        series[e.get("series", "")].append(r)
    lines = []
    for sid, members in series.items():
        members.sort(key=lambda r: split[r]["shard"]["index"])
        shards = [split[r]["shard"] for r in members]
        what = f"the series of run {members[0]} (`{_label(split[members[0]])}`)"
        counts = sorted({s["count"] for s in shards})
        if len(counts) > 1:
            raise LmcbenchError(f"{what} is split into different numbers of shards ({', '.join(map(str, counts))}) "
                                f"by runs {', '.join(members)}")
        n = counts[0]
        seen = Counter(s["index"] for s in shards)
        twice = sorted(i for i, c in seen.items() if c > 1)
        if twice:
            where = [r for r in members if split[r]["shard"]["index"] == twice[0]]
            raise LmcbenchError(f"shard {twice[0]}/{n} of {what} is in {len(where)} runs ({', '.join(where)}); "
                                "merge each shard once")
        missing = [f"{i}/{n}" for i in range(n) if i not in seen]
        if missing:
            raise LmcbenchError(f"{what}: shard(s) {', '.join(missing)} missing (have {len(seen)} of {n}); "
                                "merge the runs of every shard")
        total = {s["series_tensors"] for s in shards}
        kept = sum(s["tensors"] for s in shards)
        if len(total) > 1 or kept != next(iter(total)):
            raise LmcbenchError(f"the shards of {what} disagree on the series ({kept} tensors in the shards, "
                                f"{sorted(total)} in the series): it changed between the jobs")
        whole = sorted(r for r, e in envs.items() if not e.get("shard") and e.get("series") == sid)
        if whole:
            raise LmcbenchError(f"{what} is both whole (run {whole[0]}) and split into shards: merge one or the other")
        part = df[df["run"].isin(members)]
        owners = part[["run", "tensor", "kind", "cast"]].drop_duplicates()
        dup = owners[owners.duplicated(["tensor", "kind", "cast"], keep=False)]
        if not dup.empty:
            t = dup.iloc[0]
            raise LmcbenchError(f"tensor {t['tensor']} ({t['kind']}) of {what} is in more than one shard "
                                f"({', '.join(sorted(dup[dup['tensor'] == t['tensor']]['run']))})")
        lines.append(f"- merged from {n} shards (`source.shard=0/{n}` ... `{n - 1}/{n}`) of one series"
                     + (f" (`{_label(split[members[0]])}`)" if len(series) > 1 else "")
                     + f": {kept} tensors, each in exactly one shard")
    return lines


__all__ = ["check"]
