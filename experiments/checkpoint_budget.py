"""Render ``lmcbench experiment=checkpoint_budget`` into results/checkpoint_budget/: the LMC paper's motivation as a
calculator. For a model size, a checkpoint layout, a checkpoint interval, a core count and a storage bandwidth:
the time to compress and write one checkpoint with each codec, whether it is done before the next checkpoint is
due, and the most checkpoints per hour each codec allows.

The time model (``checkpoint_time``): the checkpoint is cut into units of ``cores x chunk_mib``; the cores compress
unit i+1 while unit i is written, a two-stage pipeline of n equal units, so

    time = max(C, W) + min(C, W) / n

with C = sum over the tensors of original bytes / (per-core speed x cores) (compression on every core, speed
scaled linearly with the cores: an upper bound on what the cores give), W = compressed bytes / bandwidth, and the
second term the pipeline fill (the first unit's compression before anything is written, or the last unit's write
after everything is compressed, whichever stage is the faster one). A checkpoint fits when time <= interval;
the most checkpoints per hour = 3600 / time (the next checkpoint cannot start before this one is written).

Ratios and speeds are measured in the run, per codec/transform pair, per kind of tensor (weight, exp_avg,
exp_avg_sq) and dtype (a sampled run's, ``bench.sample < 1``, are its estimates for every byte, and the report
says so and gives each ratio its 95% interval); a layout's kind and dtype that the run did not measure takes the pair's aggregate over
every kind of that dtype. The scenarios are the ``budget:`` key of the run's config.yaml (see
conf/experiment/checkpoint_budget.yaml, which is also the fallback for runs made without it).

Re-render an existing run:  python experiments/checkpoint_budget.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import MiB, begin, finish, main, md_table  # noqa: E402
from lmcbench.report.facets import save  # noqa: E402
from lmcbench.report.sampling import describe, fmt_ci, is_sampled, ratio_intervals  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PRESET = os.path.join(os.path.dirname(HERE), "conf", "experiment", "checkpoint_budget.yaml")
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
UNCOMPRESSED = "uncompressed (write only)"
GB = 1e9


# ------------------------------------------------------------------------------------------------------------
# the arithmetic (pure functions)
# ------------------------------------------------------------------------------------------------------------

def layout_bytes(params: float, layout: dict) -> dict:
    """Bytes of each kind of tensor in a checkpoint of ``params`` parameters: {kind: (dtype, bytes)}."""
    out = {}
    for kind, dtype in layout.items():
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"layout: unknown dtype {dtype!r} for {kind} (known: {', '.join(DTYPE_BYTES)})")
        out[kind] = (dtype, float(params) * DTYPE_BYTES[dtype])
    return out


def bytes_per_param(layout: dict) -> int:
    return sum(DTYPE_BYTES[d] for d in layout.values())


def pipeline_time(compress_s: float, write_s: float, units: int) -> float:
    """Two-stage pipeline (compress, write) over ``units`` equal units: the slower stage sets the pace, the faster
    one adds one unit's worth of time (filling the pipeline, or draining it)."""
    n = max(1, int(units))
    return max(compress_s, write_s) + min(compress_s, write_s) / n


def lookup(rates: dict, kind: str, dtype: str):
    """(ratio, compress MiB/s per core, what) for a kind and dtype from ``rates`` {(kind, dtype): (ratio, MiB/s)},
    falling back to the aggregate over every kind of that dtype, stored as ("all", dtype)."""
    if (kind, dtype) in rates:
        return (*rates[(kind, dtype)], kind)
    if ("all", dtype) in rates:
        return (*rates[("all", dtype)], "all kinds")
    return float("nan"), float("nan"), "not measured"


def checkpoint_time(params: float, layout: dict, rates: dict | None, cores: int, bandwidth_GBps: float,
                    chunk_mib: float = 64) -> dict:
    """Compress and write one checkpoint. ``rates`` = {(kind, dtype): (ratio, compress MiB/s per core)} of one
    codec, or None for writing it uncompressed."""
    if cores < 1 or bandwidth_GBps <= 0 or params <= 0:
        raise ValueError("cores, bandwidth and parameters must be positive")
    orig = comp = compress_s = 0.0
    for kind, (dtype, nbytes) in layout_bytes(params, layout).items():
        ratio, speed = (1.0, math.inf) if rates is None else lookup(rates, kind, dtype)[:2]
        orig += nbytes
        comp += nbytes / ratio
        compress_s += 0.0 if math.isinf(speed) else nbytes / MiB / (speed * cores)
    write_s = comp / (bandwidth_GBps * GB)
    units = math.ceil(orig / (cores * chunk_mib * MiB))
    total = pipeline_time(compress_s, write_s, units)
    return {"orig_bytes": orig, "comp_bytes": comp, "ratio": orig / comp if comp else float("nan"),
            "compress_s": compress_s, "write_s": write_s, "units": units, "total_s": total,
            "bound": "compress" if compress_s > write_s else "write",
            "per_hour": 3600.0 / total if total > 0 else math.inf}


def fits(total_s: float, interval_s: float) -> bool:
    """Done before the next checkpoint is due (NaN, for a codec that was not measured, never fits)."""
    return bool(total_s <= interval_s)


def min_interval_s(total_s: float) -> float:
    """The shortest checkpoint interval a codec allows: one checkpoint must be written before the next starts."""
    return total_s


# ------------------------------------------------------------------------------------------------------------
# from records to rates
# ------------------------------------------------------------------------------------------------------------

def rates_from_records(df: pd.DataFrame) -> pd.DataFrame:
    """Ratio and single-core compress/decompress MiB/s per (pair, kind, dtype), plus kind "all" per dtype.

    A multi-threaded measurement is divided by its thread count (per-core speed). Records of a sampled run (as
    ``load_records`` gives them: estimates for every byte) also get each ratio's interval, ``ratio_lo`` and
    ``ratio_hi`` (NaN for a run that measured everything)."""
    ok = df[df["verified"] & df["comp_bytes"].notna() & (df["codec"] != "memcpy")].copy()
    cols = ["pair", "kind", "dtype", "ratio", "ratio_lo", "ratio_hi", "c_mibs_core", "d_mibs_core", "threads",
            "orig_bytes"]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    ok["pair"] = ok["codec_label"].astype(str) + " (" + ok["transform"].astype(str) + ")"
    ok["c_core_s"] = ok["compress_s"] * ok["threads"].fillna(1).clip(lower=1)
    ok["d_core_s"] = ok["decompress_s"] * ok["threads"].fillna(1).clip(lower=1)
    frames = []
    for kind_col in ("kind", None):
        by = ["pair", "kind", "dtype"] if kind_col else ["pair", "dtype"]
        g = ok.groupby(by, sort=False).agg(orig_bytes=("orig_bytes", "sum"), comp_bytes=("comp_bytes", "sum"),
                                           c_core_s=("c_core_s", "sum"), d_core_s=("d_core_s", "sum"),
                                           threads=("threads", "max")).reset_index()
        if is_sampled(ok):
            ci = ratio_intervals(ok, by)
            g = g.merge(ci[by + ["ratio_lo", "ratio_hi"]], on=by, how="left")
        else:
            g = g.assign(ratio_lo=float("nan"), ratio_hi=float("nan"))
        if not kind_col:
            g["kind"] = "all"
        frames.append(g)
    r = pd.concat(frames, ignore_index=True)
    r["ratio"] = r["orig_bytes"] / r["comp_bytes"]
    r["c_mibs_core"] = r["orig_bytes"] / MiB / r["c_core_s"].where(r["c_core_s"] > 0)
    r["d_mibs_core"] = r["orig_bytes"] / MiB / r["d_core_s"].where(r["d_core_s"] > 0)
    return r[cols]


def rates_by_pair(r: pd.DataFrame) -> dict:
    """{pair: {(kind, dtype): (ratio, compress MiB/s per core)}}."""
    out: dict = {}
    for row in r.itertuples(index=False):
        out.setdefault(row.pair, {})[(row.kind, row.dtype)] = (float(row.ratio), float(row.c_mibs_core))
    return out


def budget_table(rates: dict, budget: dict) -> pd.DataFrame:
    """Every scenario x codec (and the uncompressed write) x interval, one row each."""
    rows = []
    pairs = [(UNCOMPRESSED, None)] + list(rates.items())
    for model, params in budget["models"].items():
        for lname, layout in budget["layouts"].items():
            for cores in budget["cores"]:
                for bw in budget["bandwidth_GBps"]:
                    for pair, rt in pairs:
                        e = checkpoint_time(float(params), dict(layout), rt, int(cores), float(bw),
                                            float(budget.get("chunk_mib", 64)))
                        for interval in budget["intervals_s"]:
                            rows.append({"model": model, "params": float(params), "layout": lname,
                                         "bytes_per_param": bytes_per_param(layout), "cores": int(cores),
                                         "bandwidth_GBps": float(bw), "codec": pair, **e,
                                         "interval_s": float(interval), "fits": fits(e["total_s"], float(interval))})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------------------

def load_budget(run_dir: str) -> tuple[dict, str]:
    from omegaconf import OmegaConf

    p = os.path.join(run_dir, "config.yaml")
    if os.path.exists(p):
        b = OmegaConf.load(p).get("budget")
        if b is not None:
            return OmegaConf.to_container(b, resolve=True), "the run's config.yaml"
    return OmegaConf.to_container(OmegaConf.load(PRESET)["budget"], resolve=True), os.path.relpath(PRESET, os.path.dirname(HERE))


def _fmt_s(s: float) -> str:
    if not np.isfinite(s):
        return "–"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def _interval(s: float) -> str:
    return f"{s / 60:g} min" if s % 60 == 0 else f"{s:g} s"


ABOUT = ("How long it takes to compress and write one checkpoint of a large model with each codec, and how often one "
         "could checkpoint at most. Ratios and per-core compress speeds are measured in this run; model sizes, "
         "layouts, intervals, cores and bandwidths are the scenarios of the `budget:` key ({origin}).")


def render(run_dir: str, out_dir: str) -> str:
    budget, origin = load_budget(run_dir)
    df, _, _, lines = begin(run_dir, out_dir, "Checkpoint budget: does compression fit between two checkpoints?",
                            ABOUT.format(origin=origin))
    r = rates_from_records(df)
    rates = rates_by_pair(r)
    intervals = [float(i) for i in budget["intervals_s"]]
    lines += ["## The model", "",
              "A checkpoint is cut into units of `cores x chunk_mib` "
              f"(chunk_mib = {budget.get('chunk_mib', 64)}); the cores compress unit i+1 while unit i is written:",
              "", "    time = max(C, W) + min(C, W) / n", "",
              "- C = original bytes / (measured single-core compress MiB/s x cores): **speed scaled linearly with the "
              "cores**, an upper bound (no parallel loss, the cores do nothing else);",
              "- W = compressed bytes / bandwidth (1 GB = 10^9 bytes), compressed bytes = original bytes / measured "
              "ratio, per kind of tensor and dtype;",
              "- n = number of units; the second term fills the pipeline (or drains it), whichever stage is faster;",
              "- it *fits* when time <= the interval; the most checkpoints per hour = 3600 / time.",
              "", f"{len(df)} measurements, {int((~df['verified']).sum())} failed round trips.", ""]
    if is_sampled(df):
        lines += [f"**A sampled run** ({describe(df)}): every ratio, speed and time below is its estimate for every "
                  "byte of the measured checkpoints; the measured rates give each ratio its 95% interval.", ""]
    if r.empty:
        lines += ["No verified measurement: nothing to compute.", ""]
    else:
        lines += ["## Measured rates", "",
                  "Ratio per kind and dtype; compress MiB/s of one core over every kind (a multi-threaded "
                  "measurement divided by its threads).", ""]
        t = r.copy()
        t["col"] = t["kind"] + " " + t["dtype"]
        t["cell"] = [fmt_ci(v, lo, hi) for v, lo, hi in zip(t["ratio"], t["ratio_lo"], t["ratio_hi"])]
        ratio = t.pivot_table(index="pair", columns="col", values="cell", aggfunc="first", sort=False)
        ratio = ratio.map(lambda v: "" if pd.isna(v) else v)
        allk = t[t["kind"] == "all"]
        for dtype, g in allk.groupby("dtype", sort=False):
            ratio[f"MiB/s/core {dtype}"] = g.set_index("pair")["c_mibs_core"].reindex(ratio.index).map(
                lambda v: "" if pd.isna(v) else f"{v:.0f}")
        lines += [md_table(ratio, "codec (transform)"), ""]
        full = budget_table(rates, budget)
        full.to_csv(os.path.join(out_dir, "budget.csv"), index=False, float_format="%.6g")
        lines += ["## Time per checkpoint", "",
                  "Each cell: time to compress and write one checkpoint, the stage that bounds it (C = compression, "
                  "W = write), and the most checkpoints per hour; **does not fit** lists the intervals it misses "
                  f"(intervals: {', '.join(_interval(i) for i in intervals)}). Every row of every scenario: "
                  "`budget.csv`.", ""]
        one = full[full["interval_s"] == intervals[0]]
        for (model, lname), part in one.groupby(["model", "layout"], sort=False):
            p0 = part.iloc[0]
            tb = {}
            for (cores, bw), g in part.groupby(["cores", "bandwidth_GBps"], sort=False):
                col = f"{cores} cores, {bw:g} GB/s"
                for e in g.itertuples(index=False):
                    miss = [_interval(i) for i in intervals if not fits(e.total_s, i)]
                    cell = f"{_fmt_s(e.total_s)} {'C' if e.bound == 'compress' else 'W'}, {e.per_hour:.0f}/h" \
                        if np.isfinite(e.total_s) else "not measured"
                    if miss and np.isfinite(e.total_s):
                        cell += f", **does not fit {' / '.join(miss)}**"
                    tb.setdefault(e.codec, {})[col] = cell
                    tb[e.codec]["ratio"] = f"{e.ratio:.3f}" if np.isfinite(e.ratio) else ""
            tb = pd.DataFrame(tb).T
            tb = tb[["ratio"] + [c for c in tb.columns if c != "ratio"]]
            lines += [f"### {model} parameters, {lname} ({p0['bytes_per_param']} bytes/parameter, "
                      f"{p0['orig_bytes'] / GB:.0f} GB per checkpoint)", "", md_table(tb, "codec (transform)"), ""]
        fig = _figure(full, budget, os.path.join(out_dir, "checkpoint_budget.png"))
        if fig:
            lines += [f"![time per checkpoint]({fig})", ""]
    if is_sampled(df):  # the records as measured (loaded, they hold the estimates), and the sample's plan
        return finish(run_dir, out_dir, lines, copy=("environment.json", "records.csv", "sample.csv"))
    keep = df.drop(columns=["run"], errors="ignore")
    keep.to_csv(os.path.join(out_dir, "records.csv"), index=False)
    return finish(run_dir, out_dir, lines)


def _figure(full: pd.DataFrame, budget: dict, path: str) -> str | None:
    fb = budget.get("figure") or {}
    cores = int(fb.get("cores", budget["cores"][0]))
    bw = float(fb.get("bandwidth_GBps", budget["bandwidth_GBps"][0]))
    d = full[(full["cores"] == cores) & (full["bandwidth_GBps"] == bw)]
    d = d[d["interval_s"] == d["interval_s"].min()]
    if d.empty or not np.isfinite(d["total_s"]).any():
        return None
    models = list(dict.fromkeys(d["model"]))
    layouts = list(dict.fromkeys(d["layout"]))
    codecs = list(dict.fromkeys(d["codec"]))
    fig, axes = plt.subplots(1, len(models), figsize=(max(6.0, 0.9 * len(codecs) + 2) * len(models), 4.6),
                             squeeze=False)
    width = 0.8 / len(layouts)
    for ax, model in zip(axes[0], models):
        for j, lname in enumerate(layouts):
            g = d[(d["model"] == model) & (d["layout"] == lname)].set_index("codec").reindex(codecs)
            ax.bar([i + j * width for i in range(len(codecs))], g["total_s"].fillna(0).values, width, label=lname)
        for k, interval in enumerate(sorted(float(i) for i in budget["intervals_s"])):
            ax.axhline(interval, color="k", ls=["--", ":", "-."][k % 3], lw=1, label=f"interval {_interval(interval)}")
        ax.set_yscale("log")
        ax.set_xticks([i + width * (len(layouts) - 1) / 2 for i in range(len(codecs))])
        ax.set_xticklabels(codecs, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("seconds per checkpoint (compress + write)")
        ax.set_title(f"{model} parameters, {cores} cores, {bw:g} GB/s", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save(fig, path)


if __name__ == "__main__":
    main(render, "checkpoint_budget", __doc__)
