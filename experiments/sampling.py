"""Render ``lmcbench experiment=sampling`` (``task: sample_check``) into results/sampling/: does a sampled
measurement's interval hold the ratio of the full one?

The run folder holds ``full/`` (every byte, as any run measures it), ``slices/`` (every slice of the sample's
frame, each compressed on its own as a sample compresses it: the population a sample is drawn from) and
``sample-<seed>/`` (a ``bench.sample`` run per seed). For every codec x pipeline x kind x dtype, over the steps
that every pipeline can use (the first has no reference), the report sets each sampled ratio and its interval
beside the full run's ratio and the every-slice ratio. Two things can put a full ratio outside an interval: the
sampling error the interval is about, and the *slicing effect* (a slice compressed alone against a whole tensor
compressed at once), which no interval from a sample can see; the every-slice run measures the second alone.

How often intervals hold (their calibration) is measured without compressing again: every unit of ``slices/``
was measured exactly as a sample measures it (the report checks that the sampled runs' rows equal its rows), so
a sample with any seed and fraction is a subset of its rows. ``sample_check.draws`` samples per fraction of
``sample_check.fractions`` (the run's config.yaml) are drawn with the plan's own rule
(:func:`lmcbench.bench.sample.choose`), each given its intervals as a report would.

Re-render an existing run:  python experiments/sampling.py RUN_DIR [OUT_DIR]
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import KINDS, finish, header, main, md_table  # noqa: E402
from lmcbench.bench.sample import choose, sample_size  # noqa: E402
from lmcbench.report import aggregate, comparable, load_records  # noqa: E402
from lmcbench.report.facets import facet_grid, save  # noqa: E402
from lmcbench.report.header import load as load_environment  # noqa: E402
from lmcbench.report.sampling import fmt_ci, intervals, ratio_intervals, t_quantile, unit_sums  # noqa: E402

BY = ["dtype", "kind", "transform", "codec_label"]
CAL_FRACTIONS = (0.05, 0.1, 0.2)
CAL_DRAWS = 400
CAL_RESAMPLES = 1000
UNIT = ["tensor", "kind", "cast", "slice"]


def _seed_dirs(run_dir: str) -> list[tuple[int, str]]:
    out = []
    for d in glob.glob(os.path.join(run_dir, "sample-*")):
        m = re.fullmatch(r"sample-(\d+)", os.path.basename(d))
        if m and os.path.exists(os.path.join(d, "records.csv")):
            out.append((int(m.group(1)), d))
    return sorted(out)


def _keys(df: pd.DataFrame) -> pd.Series:
    """The unit of each row (or plan line): tensor, kind, cast and slice."""
    cast = df["cast"].astype(object).fillna("").astype(str)
    return df["tensor"].astype(str) + "|" + df["kind"].astype(str) + "|" + cast + "|" + \
        df["slice"].astype("int64").astype(str)


def truths(full: pd.DataFrame, slices: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the full run's ratio and the every-slice run's."""
    f = aggregate(full, BY)[BY + ["ratio"]].rename(columns={"ratio": "full"})
    s = aggregate(slices, BY)[BY + ["ratio"]].rename(columns={"ratio": "slices"})
    return f.merge(s, on=BY, how="outer")


def seed_table(sample: pd.DataFrame, truth: pd.DataFrame, by=BY) -> pd.DataFrame:
    """Per cell of a sampled run: its ratio, t interval (and the percentile one), and whether each holds the
    full and the every-slice ratio."""
    ci = ratio_intervals(sample, by)
    pct = ratio_intervals(sample, by, method="percentile")[by + ["ratio_lo", "ratio_hi"]]
    t = ci.merge(pct.rename(columns={"ratio_lo": "p_lo", "ratio_hi": "p_hi"}), on=by).merge(truth, on=by)
    # simultaneous 95% intervals over the cells (Bonferroni: each at 1 - 0.05 / cells): "every cell's interval
    # holds" is one claim about all cells at once, which per-cell 95% intervals miss about once in twenty cells
    half = simultaneous_t(len(t), t["ratio_df"].to_numpy(float)) * t["ratio_se"].to_numpy(float)
    t["s_lo"], t["s_hi"] = t["ratio"] - half, t["ratio"] + half
    for what in ("full", "slices"):
        t[f"holds_{what}"] = (t["ratio_lo"] <= t[what]) & (t[what] <= t["ratio_hi"])
        t[f"p_holds_{what}"] = (t["p_lo"] <= t[what]) & (t[what] <= t["p_hi"])
        t[f"s_holds_{what}"] = (t["s_lo"] <= t[what]) & (t[what] <= t["s_hi"])
    t["error_pct"] = (t["ratio"] / t["full"] - 1) * 100
    t["half_width_pct"] = (t["ratio_hi"] - t["ratio_lo"]) / 2 / t["ratio"] * 100
    return t


def simultaneous_t(cells: int, df) -> np.ndarray:
    """The t quantile of simultaneous 95% intervals over ``cells`` intervals (Bonferroni)."""
    return t_quantile(1 - 0.05 / (2 * max(1, cells)), df)


def same_as_slices(sample_raw: pd.DataFrame, slices_raw: pd.DataFrame) -> tuple[int, int]:
    """How many of a sampled run's rows the every-slice run has, and how many of them have the same original
    and compressed bytes (a sample measures a unit exactly as the every-slice run does)."""
    key = ["step", "tensor", "kind", "cast", "slice", "transform", "codec"]
    a = sample_raw.assign(cast=sample_raw["cast"].astype(object).fillna(""))
    b = slices_raw.assign(cast=slices_raw["cast"].astype(object).fillna(""))
    m = a.merge(b, on=key, suffixes=("", "_all"))
    same = (m["measured_orig_bytes"] == m["measured_orig_bytes_all"]) & \
        (m["measured_comp_bytes"] == m["measured_comp_bytes_all"])
    return len(a), int(same.sum())


def designs(strata, fractions) -> list[tuple[list[float], str]]:
    """The fractions grouped by the sample they draw: two fractions that give every stratum the same number of
    units (the floor of 2 on a small model: 5%, 10% and 20% of 6 units are all 2) draw the same units with the
    same seed, so they are one design, measured once. Returns [(fractions, "n of N per stratum")], in order."""
    sizes = pd.Series(np.asarray(strata, dtype=str)).value_counts(sort=False)
    out: dict[tuple, list[float]] = {}
    for f in fractions:
        out.setdefault(tuple(sample_size(f, int(n)) for n in sizes), []).append(float(f))
    label = []
    for key, fs in out.items():
        pairs = pd.Series([f"{n} of {N}" for n, N in zip(key, sizes) if N > 2]).value_counts()
        label.append((fs, ", ".join(f"{k} ({v} strata)" for k, v in pairs.items()) or "all"))
    return label


def calibration(slices: pd.DataFrame, frame: pd.DataFrame, truth: pd.DataFrame, fractions=CAL_FRACTIONS,
                draws: int = CAL_DRAWS, resamples: int = CAL_RESAMPLES) -> pd.DataFrame:
    """Samples drawn from the every-slice run's units with the plan's rule (``draws`` seeds per design), each
    with its t and percentile intervals: per design (the fractions that draw the same sample, :func:`designs`),
    method and cell, how often the interval holds the full and the every-slice ratio, its median half-width and
    the share of the bytes measured."""
    keys = pd.Categorical(_keys(slices), categories=_keys(frame).tolist())
    cells, o, c = unit_sums(slices, BY, keys.codes, len(frame))
    t = cells.merge(truth, on=BY, how="left")
    strata = frame["stratum"].to_numpy(object)
    nbytes = frame["bytes"].to_numpy(float)
    rows = []
    for fracs, units in designs(strata, fractions):
        frac = fracs[0]
        hits = {m: {w: np.zeros(len(t)) for w in ("full", "slices")} for m in ("t", "percentile")}
        width = {m: [] for m in hits}
        share = []
        every = 0  # draws whose simultaneous intervals hold the full ratio in every cell
        s_width = []
        for d in range(draws):
            chosen, w = choose(strata, frac, d)
            idx = np.flatnonzero(chosen)
            r = intervals(o[:, idx], c[:, idx], strata[idx], w[idx], resamples=resamples, seed=d)
            share.append(nbytes[idx].sum() / nbytes.sum())
            v = t["full"].to_numpy()
            sh = simultaneous_t(len(t), r["df"]) * r["se"]
            s_width.append(sh / r["ratio"])
            every += bool(np.all((r["ratio"] - sh <= v) & (v <= r["ratio"] + sh)))
            for m, (lo, hi) in (("t", (r["t_lo"], r["t_hi"])), ("percentile", (r["p_lo"], r["p_hi"]))):
                width[m].append((hi - lo) / 2 / r["ratio"])
                for what in ("full", "slices"):
                    v = t[what].to_numpy()
                    hits[m][what] += (lo <= v) & (v <= hi)
        for m in hits:
            per_cell = t[BY].assign(fraction=frac, fractions=" ".join(f"{f:g}" for f in fracs), units=units,
                                    method=m, draws=draws,
                                    holds_full=hits[m]["full"] / draws, holds_slices=hits[m]["slices"] / draws,
                                    median_half_width_pct=np.median(np.array(width[m]), axis=0) * 100,
                                    measured_share=float(np.mean(share)),
                                    every_cell_simultaneous=every / draws,
                                    simultaneous_median_half_width_pct=np.median(np.array(s_width), axis=0) * 100)
            rows.append(per_cell)
    return pd.concat(rows, ignore_index=True)


def _size(kib: int) -> str:
    return f"{kib / 1024:g} MiB" if kib >= 1024 else f"{kib} KiB"


def _ratio(v) -> str:
    return "" if pd.isna(v) else f"{v:.4f}"


def _cells(t: pd.DataFrame) -> pd.DataFrame:
    """The seed-0 table as the report shows it."""
    out = pd.DataFrame({
        "dtype / kind": t["dtype"] + " " + t["kind"], "pipeline": t["transform"], "codec": t["codec_label"],
        "full run": t["full"].map(_ratio), "every slice": t["slices"].map(_ratio),
        "sample [95% interval]": [fmt_ci(r, lo, hi, 4) for r, lo, hi in zip(t["ratio"], t["ratio_lo"], t["ratio_hi"])],
        "error": t["error_pct"].map(lambda v: f"{v:+.2f}%"),
        "holds full": t["holds_full"].map({True: "yes", False: "**no**"}),
        "holds every slice": t["holds_slices"].map({True: "yes", False: "**no**"}),
        "simultaneous interval": [fmt_ci(r, lo, hi, 4) for r, lo, hi in zip(t["ratio"], t["s_lo"], t["s_hi"])],
        "simultaneous holds full": t["s_holds_full"].map({True: "yes", False: "**no**"})})
    return out.set_index("dtype / kind")


def _order(t: pd.DataFrame) -> pd.DataFrame:
    kinds = {k: i for i, k in enumerate(KINDS)}
    return t.assign(_k=t["kind"].map(kinds).fillna(99), _d=t["dtype"].map({"float32": 0}).fillna(1)) \
        .sort_values(["_d", "_k", "transform", "codec_label"], kind="stable").drop(columns=["_k", "_d"])


ABOUT = ("The same grid measured in full and from a sample of its slices (`bench.sample`). For each codec x "
         "pipeline x kind x dtype (over the steps every pipeline can use; the first has no reference): the full "
         "run's ratio, the ratio of every slice compressed on its own (what a sample estimates), and the "
         "sample's ratio with its 95% interval (a cluster bootstrap of the slices, t with Satterthwaite's "
         "degrees of freedom: `lmcbench/report/sampling.py`).")


def render(run_dir: str, out_dir: str) -> str:
    full_dir, slices_dir = os.path.join(run_dir, "full"), os.path.join(run_dir, "slices")
    seeds = _seed_dirs(run_dir)
    if not seeds or not os.path.exists(os.path.join(full_dir, "records.csv")):
        raise SystemExit(f"{run_dir}: expected full/ and sample-<seed>/ runs (lmcbench experiment=sampling)")
    os.makedirs(out_dir, exist_ok=True)
    env = load_environment(full_dir)
    lines = header("Sampled measurement against the full one", env, ABOUT)
    full_raw, slices_raw = load_records(full_dir), load_records(slices_dir)
    full, slices = comparable(full_raw), comparable(slices_raw)
    truth = truths(full, slices)
    runs = {s: load_records(d) for s, d in seeds}
    tables = {s: seed_table(comparable(df), truth) for s, df in runs.items()}
    per_step = {s: seed_table(comparable(df), truth_by_step(full, slices), BY + ["step"])
                for s, df in runs.items()}
    seed0 = min(tables)
    t0 = _order(tables[seed0])
    s0 = runs[seed0]
    frac, kib = float(s0["sample"].iloc[0]), int(s0["sample_slice_kib"].iloc[0])
    plan = pd.read_csv(os.path.join(seeds[0][1], "sample.csv"), keep_default_na=False, na_values=[""])
    measured = plan.loc[plan["selected"].astype(str).str.lower().eq("true"), "bytes"].sum() / plan["bytes"].sum()
    secs = {name: (load_environment(os.path.join(run_dir, name)).get("seconds") or float("nan"))
            for name in ["full", "slices"] + [f"sample-{s}" for s in runs]}
    n = len(t0)
    fractions, draws = _calibration_options(run_dir)
    cal = calibration(slices, plan, truth, fractions, draws)
    head = _headline(cal, frac)
    s_half = (t0["s_hi"] - t0["s_lo"]) / 2 / t0["ratio"] * 100
    expected = 0.95 * n
    lines += ["## Summary", "",
              f"- **How often a 95% interval holds** (measured: {head['draws']} samples of {frac * 100:g}% drawn "
              f"again from the every-slice run; units per stratum: {head['units']}): **the per-cell intervals held "
              f"the ratio {head['slices'] * 100:.1f}% of the time** against a nominal 95% (the full run's ratio: "
              f"{head['full'] * 100:.1f}%), the worst cell {head['worst'] * 100:.0f}%; median half-width "
              f"{head['width']:.2f}%. {_why(cal, head)}".rstrip(),
              f"- **seed {seed0}'s per-cell 95% intervals hold the full run's ratio in "
              f"{int(t0['holds_full'].sum())} of {n} cells** (a calibrated interval: about {expected:.0f}) and "
              f"the every-slice ratio in {int(t0['holds_slices'].sum())} of {n}; step by step "
              f"({len(per_step[seed0])} cells): {int(per_step[seed0]['holds_full'].sum())} and "
              f"{int(per_step[seed0]['holds_slices'].sum())}",
              f"- sample: {frac * 100:g}% of the {_size(kib)} "
              f"slices of each stratum (kind x dtype x tensor role, at least 2), seed {seed0}: "
              f"{plan['selected'].astype(str).str.lower().eq('true').sum()} of {len(plan)} slices, "
              f"{measured * 100:.1f}% of the bytes; {secs[f'sample-{seed0}']:.0f} s against "
              f"{secs['full']:.0f} s for the full run",
              f"- largest error against the full run: {t0['error_pct'].abs().max():.2f}%; median half-width of "
              f"the per-cell intervals {t0['half_width_pct'].median():.2f}%",
              f"- simultaneous 95% intervals (Bonferroni over the {n} cells, each at 1 - 0.05/{n}) hold the full "
              f"ratio in {int(t0['s_holds_full'].sum())} of {n} cells, and held every cell at once in "
              f"{head['every'] * 100:.1f}% of the samples; they are wide (median half-width {s_half.median():.2f}%, "
              f"up to {s_half.max():.1f}%, against {t0['half_width_pct'].median():.2f}% per cell), so that they "
              "hold says little about the estimate"]
    for s in sorted(runs):
        rows, same = same_as_slices(runs[s], slices_raw)
        lines.append(f"- seed {s}: {int(tables[s]['holds_full'].sum())} / {n} hold the full ratio "
                     f"(simultaneous: {int(tables[s]['s_holds_full'].sum())} / {n}), "
                     f"{int(tables[s]['holds_slices'].sum())} / {n} the every-slice ratio; its {rows} rows have the "
                     f"every-slice run's bytes in {same} ({secs[f'sample-{s}']:.0f} s)")
    lines += [""] + _calibration_lines(cal) + [
        "", f"## Seed {seed0}, cell by cell", "",
        "Ratio = original / compressed bytes over the steps every pipeline can use. *Error* = sample / full run "
        "- 1.", "", md_table(_cells(t0), "dtype / kind"), ""]
    lines += _slicing_lines(truth)
    t_all = pd.concat([t.assign(seed=s) for s, t in tables.items()], ignore_index=True)
    t_all.to_csv(os.path.join(out_dir, "sampling.csv"), index=False, float_format="%.6g")
    pd.concat([t.assign(seed=s) for s, t in per_step.items()], ignore_index=True).to_csv(
        os.path.join(out_dir, "sampling_by_step.csv"), index=False, float_format="%.6g")
    cal.to_csv(os.path.join(out_dir, "calibration.csv"), index=False, float_format="%.6g")
    plan.to_csv(os.path.join(out_dir, "sample.csv"), index=False)
    made = [m for m in (_plot_cells(t0, os.path.join(out_dir, "sampling.png")),
                        _plot_calibration(cal, os.path.join(out_dir, "calibration.png"))) if m]
    lines += ["## Figures", ""] + [f"![{m}]({m})" for m in made] + ["",
              "Files: `sampling.csv` (every seed's cells), `sampling_by_step.csv` (the same per step), "
              "`calibration.csv` (per fraction, method and cell), `sample.csv` (seed "
              f"{seed0}'s plan: every slice, its stratum and whether it was measured).", ""]
    with open(os.path.join(out_dir, "seconds.json"), "w") as f:
        json.dump(secs, f, indent=1)
    return finish(full_dir, out_dir, lines)


def _calibration_options(run_dir: str) -> tuple[tuple, int]:
    from omegaconf import OmegaConf

    p = os.path.join(run_dir, "config.yaml")
    opts = (OmegaConf.load(p).get("sample_check") or {}) if os.path.exists(p) else {}
    return tuple(float(f) for f in opts.get("fractions") or CAL_FRACTIONS), int(opts.get("draws") or CAL_DRAWS)


def truth_by_step(full: pd.DataFrame, slices: pd.DataFrame) -> pd.DataFrame:
    f = aggregate(full, BY + ["step"])[BY + ["step", "ratio"]].rename(columns={"ratio": "full"})
    s = aggregate(slices, BY + ["step"])[BY + ["step", "ratio"]].rename(columns={"ratio": "slices"})
    return f.merge(s, on=BY + ["step"], how="outer")


def _design_table(cal: pd.DataFrame) -> pd.DataFrame:
    return cal.groupby(["fractions", "method"], sort=False).agg(
        fraction=("fraction", "first"), units=("units", "first"), draws=("draws", "first"),
        measured=("measured_share", "first"), full=("holds_full", "mean"), slices=("holds_slices", "mean"),
        worst=("holds_slices", "min"), width=("median_half_width_pct", "median"),
        every=("every_cell_simultaneous", "first")).reset_index()


def _headline(cal: pd.DataFrame, frac: float) -> dict:
    """The t intervals' calibration for the design that ``frac`` draws (else the first design)."""
    g = _design_table(cal)
    g = g[g["method"] == "t"]
    mine = g[g["fractions"].map(lambda fs: any(abs(float(f) - frac) < 1e-12 for f in fs.split()))]
    return (mine if len(mine) else g).iloc[0].to_dict()


def _why(cal: pd.DataFrame, head: dict) -> str:
    """Why the headline design's intervals hold less often than nominal, and what more units per stratum do
    ("" when they hold at least 94.5% of the time)."""
    if head["slices"] >= 0.945:
        return ""
    g = _design_table(cal)
    more = g[(g["method"] == "t") & (g["measured"] > head["measured"] + 1e-9)]
    text = (f"Below nominal because the sample has few units in each stratum ({head['units']}): a stratum's spread "
            "is estimated from those few values (1 degree of freedom from 2 units), and the units of a role (a "
            "tensor per layer) are not alike, so a sample that leaves out an unusual one gets an interval too "
            "narrow to reach the ratio; the t quantile (Satterthwaite's degrees of freedom) widens the interval "
            "for the first, not for the second.")
    if len(more):
        text += " With more units per stratum: " + "; ".join(
            f"{r.units}: {r.slices * 100:.1f}% ({r.measured * 100:.0f}% of the bytes)" for r in more.itertuples()) + "."
    return text


def _calibration_lines(cal: pd.DataFrame) -> list[str]:
    g = _design_table(cal)
    tab = pd.DataFrame({
        "fraction": g["fractions"].map(lambda fs: ", ".join(f"{float(f) * 100:g}%" for f in fs.split())),
        "units per stratum": g["units"], "interval": g["method"],
        "bytes measured": g["measured"].map(lambda v: f"{v * 100:.1f}%"),
        "holds the every-slice ratio": g["slices"].map(lambda v: f"**{v * 100:.1f}%**"),
        "holds the full ratio": g["full"].map(lambda v: f"{v * 100:.1f}%"),
        "worst cell (every slice)": g["worst"].map(lambda v: f"{v * 100:.0f}%"),
        "median half-width": g["width"].map(lambda v: f"{v:.2f}%"),
        "every cell, simultaneous": [f"{v * 100:.1f}%" if m == "t" else "" for v, m in zip(g["every"], g["method"])]
    }).set_index("fraction")
    return ["## How often the intervals hold", "",
            f"{int(g['draws'].iloc[0])} samples per design drawn from the every-slice run's units with the plan's "
            f"own rule (seeds 0 to {int(g['draws'].iloc[0]) - 1}; no compression repeated), each with its 95% "
            f"intervals ({CAL_RESAMPLES} bootstrap resamples): the share of samples x cells whose interval holds the "
            "ratio (nominal: 95%), and the worst cell's share. Fractions that give every stratum the same number "
            "of units draw the same samples and share a row (*units per stratum*: n of N, over the strata of more "
            "than 2 units; strata of 1 or 2 units are measured whole). The full run's ratio also differs by the "
            "slicing effect (below) where the unit is smaller than the run's slice. *Every cell, simultaneous*: "
            "the share of samples in which the simultaneous intervals (Bonferroni over the cells) held the full "
            "ratio in every cell at once.", "", md_table(tab, "fraction")]


def _slicing_lines(truth: pd.DataFrame) -> list[str]:
    t = truth.assign(effect=(truth["slices"] / truth["full"] - 1) * 100)
    t["pair"] = t["codec_label"] + " (" + t["transform"] + ")"
    p = t.pivot_table(index="pair", columns=["dtype", "kind"], values="effect", sort=False)
    p.columns = [f"{k} {d}" for d, k in p.columns]
    return ["## The slicing effect", "",
            "Every slice compressed on its own against the full run (whole tensors, up to `chunk_mib`): every-slice "
            "ratio / full ratio - 1. A codec that cuts its input into blocks of its own (LMC, ZipNN) does not see "
            "it; an LZ coder's window and its per-call headers do, most of all on byte planes.", "",
            md_table(p.map(lambda v: "" if pd.isna(v) else f"{v:+.2f}%"), "codec (pipeline)"), ""]


def _plot_cells(t: pd.DataFrame, path: str):
    dtypes = list(dict.fromkeys(t["dtype"]))
    kinds = [k for k in KINDS if k in set(t["kind"])]
    pairs = list(dict.fromkeys(t["codec_label"] + "\n" + t["transform"]))

    def draw(ax, dt, kind):
        g = t[(t["dtype"] == dt) & (t["kind"] == kind)]
        if g.empty:
            return False
        g = g.set_index(g["codec_label"] + "\n" + g["transform"]).reindex(pairs)
        x = np.arange(len(pairs))
        y = (g["ratio"] / g["full"] - 1) * 100
        err = np.vstack([g["ratio"] - g["ratio_lo"], g["ratio_hi"] - g["ratio"]]) / g["full"].to_numpy() * 100
        miss = ~g["holds_full"].fillna(False).astype(bool).to_numpy()
        ax.errorbar(x[~miss], y[~miss], yerr=err[:, ~miss], fmt="o", color="black", ms=3, capsize=2,
                    label="sample, 95% interval")
        ax.errorbar(x[miss], y[miss], yerr=err[:, miss], fmt="o", color="tab:red", ms=3, capsize=2,
                    label="interval misses the full ratio")
        ax.plot(x, (g["slices"] / g["full"] - 1) * 100, "x", color="tab:blue", label="every slice")
        ax.axhline(0, color="grey", lw=1)
        ax.set_xticks(x)
        ax.set_xticklabels(pairs, fontsize=6, rotation=90)

    fig, _ = facet_grid(dtypes, kinds, draw, panel=(4.4, 3.4), title=lambda d, k: f"{k} ({d})",
                        row_label=lambda d: "% from the full run's ratio", xlabel="", legend="figure")
    return save(fig, path, rect=(0, 0, 1, 0.94))


def _plot_calibration(cal: pd.DataFrame, path: str):
    g = cal.groupby(["fraction", "method"]).agg(full=("holds_full", "mean"), slices=("holds_slices", "mean"),
                                                width=("median_half_width_pct", "median")).reset_index()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for m, color in (("t", "black"), ("percentile", "tab:orange")):
        s = g[g["method"] == m]
        axes[0].plot(s["fraction"] * 100, s["slices"] * 100, "o-", color=color, label=f"{m}: every-slice ratio")
        axes[0].plot(s["fraction"] * 100, s["full"] * 100, "s--", color=color, label=f"{m}: full ratio")
        axes[1].plot(s["fraction"] * 100, s["width"], "o-", color=color, label=m)
    axes[0].axhline(95, color="grey", lw=1, ls=":")
    axes[0].set_ylabel("% of intervals holding the ratio")
    axes[1].set_ylabel("median half-width (% of the ratio)")
    for ax in axes:
        ax.set_xlabel("sample fraction (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path, suptitle="95% intervals over repeated samples")


if __name__ == "__main__":
    main(render, "sampling", __doc__)
