"""Sampled runs (``bench.sample < 1``) in reports: estimated totals, and bootstrap intervals for ratios.

A sampled run measures some slices (*units*) of each stratum (kind x dtype x tensor role; see
``lmcbench/bench/sample.py``) and records each unit's ``sample_weight`` = N_h / n_h, the number of units of its
stratum it stands for. :func:`estimated` turns the measured bytes and seconds into estimates of the whole
checkpoint's (each times its weight), keeping the measured ones in ``measured_*`` columns, so that every sum /
sum a report takes is the usual ratio estimator; :func:`lmcbench.report.load_records` applies it.

:func:`ratio_intervals` gives each ratio an interval from a *cluster* bootstrap: the resampled thing is the
unit, with all its rows (every step of that slice), never a single row, because the same region measured at
several steps is one observation of the checkpoint, not several. Units are resampled inside their stratum, as
the sample was drawn, with Rao and Wu's rescaling (J. Amer. Statist. Assoc. 83, 1988): n_h - 1 draws with
replacement from the n_h units and the weights rescaled, so that the bootstrap variance is the unbiased one for
sampling without replacement, finite-population correction included (a plain bootstrap of n units understates
it by (n - 1) / n). A stratum measured whole (n = N) has no sampling error and stays fixed. Each replicate's
ratio is sum(weight x original bytes) / sum(weight x compressed bytes): weighted by bytes.

The interval is the estimate -/+ t x the bootstrap standard error, with Satterthwaite's degrees of freedom (each
stratum brings n_h - 1, weighed by its share of the variance), the way survey statistics use replicate weights.
Percentiles of the replicates (``method="percentile"``) are the textbook bootstrap interval, but with a handful
of units per stratum (a small model's sample) they are too narrow: over 400 samples of 5% of the 24M series,
95% percentile intervals held the ratio of every slice 71 times in a hundred, the t intervals 96 times
(``results/sampling``; larger samples of that series, 3 and 4 of a role's 5 sampled layers, 92 and 91 times, below
nominal: likely the layers a sample leaves out differ from the rest more than the narrower interval reaches).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0
# the columns estimated from a sample (times the unit's weight); the measured bytes stay in measured_<column>
ESTIMATED = ["orig_bytes", "comp_bytes", "compress_s", "decompress_s", "compress_cpu_s", "decompress_cpu_s",
             "compress_s_min", "compress_s_max", "decompress_s_min", "decompress_s_max", "transform_s",
             "untransform_s", "entropy_bound_bytes", "block_bound_bytes", "cond_bound_bytes"]
_DESIGN = ["sample", "sample_seed", "sample_slice_kib"]  # one sample design (units of two designs differ)


def is_sampled(df: pd.DataFrame) -> bool:
    """Whether any row of ``df`` comes from a sampled run."""
    return "sample_weight" in df.columns and bool(df["sample_weight"].notna().any())


def estimated(df: pd.DataFrame) -> pd.DataFrame:
    """Records with bytes and seconds scaled to the whole checkpoint (rows of runs that measured everything
    unchanged); the measured values are kept as ``measured_orig_bytes`` and ``measured_comp_bytes``. Applying it
    twice changes nothing."""
    if not is_sampled(df) or "measured_orig_bytes" in df.columns:
        return df
    df = df.copy()
    w = pd.to_numeric(df["sample_weight"], errors="coerce").fillna(1.0)
    df["measured_orig_bytes"] = df["orig_bytes"]
    df["measured_comp_bytes"] = df["comp_bytes"]
    for c in ESTIMATED:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce") * w
    return df


def _units(df: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """A unit code for every row and, per unit, its stratum code and weight. A row of a run that measured
    everything is a unit of its own with weight 1 (measured whole: no sampling error)."""
    sampled = df["sample_weight"].notna() if "sample_weight" in df.columns else pd.Series(False, index=df.index)
    key = pd.Series(np.arange(len(df)).astype(str), index=df.index)  # unsampled rows: one unit each
    stratum = pd.Series("", index=df.index)
    if sampled.any():
        s = df[sampled]
        design = s[_DESIGN].astype(str).agg("|".join, axis=1)
        key[sampled] = design + "|" + s[["tensor", "kind"]].astype(str).agg("|".join, axis=1) + "|" + \
            s["cast"].astype(object).fillna("").astype(str) + "|" + s["slice"].astype(str)
        stratum[sampled] = design + "|" + s["stratum"].astype(str)
    codes, uniq = pd.factorize(key)
    units = pd.DataFrame({"code": codes, "stratum": stratum.values,
                          "weight": pd.to_numeric(df["sample_weight"], errors="coerce").fillna(1.0).values
                          if "sample_weight" in df.columns else 1.0}).drop_duplicates("code").sort_values("code")
    return codes, units.reset_index(drop=True)


def replicate_weights(strata, weights, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Rao-Wu bootstrap weights, units x resamples: per stratum of n >= 2 units sampled with weight w = N / n,
    counts r ~ Multinomial(n - 1, 1/n) and w* = w (1 - a + a n / (n - 1) r), a = sqrt(1 - n / N). Units of a
    stratum of one unit, or measured whole (w = 1), keep their weight."""
    strata = np.asarray(strata, dtype=object)
    weights = np.asarray(weights, dtype=float)
    rng = np.random.default_rng(seed)
    out = np.repeat(weights[:, None], resamples, axis=1)
    for idx in _strata_indices(strata):
        n, w = len(idx), float(weights[idx[0]])
        f = min(1.0, 1.0 / w)
        if n < 2 or f >= 1.0:
            continue
        counts = rng.multinomial(n - 1, np.full(n, 1.0 / n), size=resamples).T  # n x resamples
        a = np.sqrt(1.0 - f)
        out[idx] = weights[idx, None] * (1.0 - a + a * n / (n - 1) * counts)
    return out


def _strata_indices(strata) -> list[np.ndarray]:
    """The positions of each sampled stratum's units, in order of first appearance ('' = measured whole)."""
    codes, names = pd.factorize(pd.Series(strata, dtype=object))
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return [order[bounds[i]:bounds[i + 1]] for i, name in enumerate(names) if name != ""]


def intervals(o: np.ndarray, c: np.ndarray, strata, weights, level: float = LEVEL, resamples: int = RESAMPLES,
              seed: int = SEED, method: str = "t") -> dict:
    """The ratio estimate of each group and its interval, from arrays: ``o`` and ``c`` (groups x units) hold
    the measured original and compressed bytes of each unit (summed over its rows), ``strata`` and ``weights``
    each unit's stratum ('' for a unit measured whole) and weight N / n.

    ``method="t"``: estimate -/+ t(df) x the bootstrap standard error, df by Satterthwaite from each stratum's
    share of the bootstrap variance (each has n_h - 1 degrees of freedom); ``"percentile"``: the bootstrap
    replicates' percentiles. Returns arrays ``ratio``, ``lo``, ``hi`` (the method's), ``se``, ``df``, and both
    methods' bounds (``t_lo``, ``t_hi``, ``p_lo``, ``p_hi``)."""
    if method not in ("t", "percentile"):
        raise ValueError(f"method: expected 't' or 'percentile', got {method!r}")
    weights = np.asarray(weights, dtype=float)
    cw = c @ weights
    ratio = (o @ weights) / cw
    rw = replicate_weights(strata, weights, resamples, seed)
    reps = (o @ rw) / (c @ rw)
    se = reps.std(axis=1, ddof=1) if resamples > 1 else np.zeros(len(ratio))
    # each stratum's share of the variance: the linearised ratio's deviation from the stratum's resampling alone
    resid = (o - ratio[:, None] * c) / cw[:, None]
    shares, dfs = [], []
    for idx in _strata_indices(strata):
        if len(idx) < 2 or not np.any(rw[idx] != weights[idx, None]):
            continue
        shares.append((resid[:, idx] @ (rw[idx] - weights[idx, None])).var(axis=1))
        dfs.append(len(idx) - 1)
    if shares:
        v, d = np.array(shares), np.array(dfs, dtype=float)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            df = v.sum(axis=0) ** 2 / (v ** 2 / d).sum(axis=0)
        df = np.where(np.isfinite(df), np.maximum(df, 1.0), np.inf)
    else:
        df = np.full(len(ratio), np.inf)
    plo, phi = np.quantile(reps, [(1 - level) / 2, 1 - (1 - level) / 2], axis=1)
    half = t_quantile(1 - (1 - level) / 2, df) * se
    tlo, thi = ratio - half, ratio + half
    lo, hi = (plo, phi) if method == "percentile" else (tlo, thi)
    return {"ratio": ratio, "lo": lo, "hi": hi, "se": se, "df": df, "t_lo": tlo, "t_hi": thi, "p_lo": plo, "p_hi": phi}


def ratio_intervals(df: pd.DataFrame, by, level: float = LEVEL, resamples: int = RESAMPLES,
                    seed: int = SEED, method: str = "t") -> pd.DataFrame:
    """Per group of ``by``: the estimated ratio (sum orig / sum comp, weighted), its interval (``ratio_lo``,
    ``ratio_hi``: :func:`intervals`; NaN where nothing in the group was sampled), the bootstrap standard error
    ``ratio_se``, the degrees of freedom ``ratio_df`` and the number of ``units`` it rests on. Give it every
    row the groups draw on: the units and their strata are read from them."""
    by = [by] if isinstance(by, str) else list(by)
    ok = df[df["verified"] & df["comp_bytes"].notna()] if "verified" in df.columns else df[df["comp_bytes"].notna()]
    cols = by + ["ratio", "ratio_lo", "ratio_hi", "ratio_se", "ratio_df", "units"]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    codes, units = _units(ok)
    keys, o, c = unit_sums(ok, by, codes, len(units))
    strata = units["stratum"].to_numpy(object)
    r = intervals(o, c, strata, units["weight"].to_numpy(float), level, resamples, seed, method)
    sampled = (o[:, strata != ""] > 0).any(axis=1)
    return keys.assign(ratio=r["ratio"], ratio_lo=np.where(sampled, r["lo"], np.nan),
                       ratio_hi=np.where(sampled, r["hi"], np.nan), ratio_se=r["se"],
                       ratio_df=r["df"], units=(o > 0).sum(axis=1))[cols]


def unit_sums(df: pd.DataFrame, by, codes, n_units: int):
    """The groups of ``by`` (a frame of their keys, in order of appearance) and, per group and unit (``codes``:
    each row's unit, 0 .. n_units - 1), the measured original and compressed bytes: (keys, o, c)."""
    by = [by] if isinstance(by, str) else list(by)
    orig = pd.to_numeric(df["measured_orig_bytes" if "measured_orig_bytes" in df else "orig_bytes"]).to_numpy(float)
    comp = pd.to_numeric(df["measured_comp_bytes" if "measured_comp_bytes" in df else "comp_bytes"]).to_numpy(float)
    groups = df.groupby(by, sort=False, dropna=False).ngroup().to_numpy()
    o = np.zeros((int(groups.max()) + 1, n_units))
    c = np.zeros_like(o)
    np.add.at(o, (groups, np.asarray(codes)), orig)
    np.add.at(c, (groups, np.asarray(codes)), comp)
    return df.groupby(by, sort=False, dropna=False).size().reset_index()[by], o, c


def t_quantile(p: float, df) -> np.ndarray:
    """Student's t quantile (0.5 < p < 1) for degrees of freedom ``df`` (at least 1; inf: the normal's),
    interpolated in log(df) from :func:`t_quantile_exact` on a grid of 6001 points (relative error below 1e-5)."""
    df = np.maximum(np.atleast_1d(np.asarray(df, dtype=float)), 1.0)
    log_df, t = _t_table(float(p))
    out = np.interp(np.log(np.minimum(df, np.exp(log_df[-1]))), log_df, t)
    return np.where(df > np.exp(log_df[-1]), _normal_quantile(p), out)


@functools.lru_cache(maxsize=8)
def _t_table(p: float):
    log_df = np.linspace(0.0, np.log(1e7), 6001)
    return log_df, t_quantile_exact(p, np.exp(log_df))


def t_quantile_exact(p: float, df) -> np.ndarray:
    """Student's t quantile by bisection on its distribution function 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2
    (I: the regularised incomplete beta function)."""
    df = np.atleast_1d(np.asarray(df, dtype=float))
    out = np.full(df.shape, _normal_quantile(p))
    fin = np.isfinite(df)
    if fin.any():
        nu = df[fin]
        lo, hi = np.zeros_like(nu), np.full_like(nu, 1e4)
        for _ in range(64):
            mid = (lo + hi) / 2
            upper = 0.5 * _betainc(nu / 2, 0.5, nu / (nu + mid * mid))  # P(T > mid)
            below = upper > 1 - p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out[fin] = (lo + hi) / 2
    return out


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def _betainc(a, b, x):
    """The regularised incomplete beta function I_x(a, b), elementwise (continued fraction, modified Lentz)."""
    a, b, x = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float), np.asarray(x, float))
    lgamma = np.vectorize(math.lgamma)
    with np.errstate(divide="ignore"):
        front = np.exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * np.log(x) + b * np.log1p(-x))
    swap = x > (a + 1) / (a + b + 2)  # the fraction converges fast below this point; use the symmetry above it
    aa, bb, xx = np.where(swap, b, a), np.where(swap, a, b), np.where(swap, 1 - x, x)
    cf = _beta_fraction(aa, bb, xx)
    val = front * cf / aa
    return np.clip(np.where(swap, 1 - val, val), 0.0, 1.0)


def _beta_fraction(a, b, x, iterations: int = 300):
    tiny = 1e-300
    c = np.ones_like(x)
    d = 1 - (a + b) * x / (a + 1)
    d = 1 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    for m in range(1, iterations + 1):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1 + num / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            h = h * d * c
        if np.all(np.abs(d * c - 1) < 1e-15):
            break
    return h


def fmt_ci(ratio: float, lo: float, hi: float, digits: int = 3) -> str:
    """``1.362 [1.351, 1.374]`` (the ratio alone where there is no interval)."""
    if pd.isna(ratio):
        return ""
    if pd.isna(lo) or pd.isna(hi):
        return f"{ratio:.{digits}f}"
    return f"{ratio:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def describe(df: pd.DataFrame, level: float = LEVEL, resamples: int = RESAMPLES) -> str:
    """One line for a report's header: what was sampled and what the intervals are ("" for a full run)."""
    if not is_sampled(df):
        return ""
    s = df[df["sample_weight"].notna()]
    parts = []
    for (frac, seed, kib), g in s.groupby(_DESIGN, sort=False):
        size = f"{kib / 1024:g} MiB" if kib >= 1024 else f"{kib:g} KiB"
        units = g.drop_duplicates(["tensor", "kind", "cast", "slice"])
        total = units.groupby("stratum")["sample_weight"].agg(lambda v: v.iloc[0] * len(v)).sum()
        parts.append(f"{frac * 100:g}% of {size} slices, seed {int(seed)} ({len(units)} of {total:.0f} slices "
                     "measured)")
    return (f"sampled: {'; '.join(parts)}; ratios are estimates for the whole checkpoint, intervals are "
            f"{level * 100:g}% bootstrap (the slices resampled within their strata, {resamples} times; t with "
            "Satterthwaite's degrees of freedom)")


__all__ = ["describe", "estimated", "fmt_ci", "intervals", "is_sampled", "ratio_intervals", "replicate_weights",
           "t_quantile", "t_quantile_exact", "unit_sums"]
