"""Does the weights' delta predict Adam's first moment? (issue 21, item 5: a measurement, not a codec mode)

For each pair of consecutive checkpoints (t-1, t) of a Hugging Face Trainer series and each parameter,
``d = w_t - w_{t-1}`` (same parameter). AdamW moves a weight by ``-lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)``,
so where the decay term is small ``sign(d) = -sign(exp_avg)`` after one step; over a gap of many steps ``d``
is the sum of all of them. This measures, per byte plane as LMC groups them (fp32: exponent, sign + top 7
mantissa bits, mantissa byte 2, mantissa byte 3; bf16: exponent, sign + 7 mantissa bits; FORMAT.md), the
empirical entropy of ``exp_avg_t`` without context and given a context taken from ``d``:

* ``sign``: d > 0, d < 0, d == 0 (3 contexts);
* ``mag``: the binary exponent of |d| relative to the median exponent of the chunk's nonzero |d|, clipped to
  -4..+3 (8 classes), and d == 0 (9 contexts);
* ``sign+mag``: both (17 contexts).

Entropies are plug-in, one model per LMC chunk (131072 elements, per tensor), as LMC's static per-chunk
tables are. The coded cost counts the side information: every table of a chunk's plane costs
``256 + 12 * (distinct symbols)`` bits (a presence bitmap and a 12-bit frequency per symbol: LMC's rANS
table is 1-2 bytes per symbol), and the context model is taken per chunk and plane only where it is smaller
than the one-table coding (1 flag bit each), as LMC chooses its chunk modes. Savings are given as a fraction
of LMC's real coded size of exp_avg alone (``lmc.compress(exp_avg)``) and with the previous checkpoint's
exp_avg as reference.

The simplest candidate mode is measured in real bytes: ``sign_flip(exp_avg, d)`` XORs the sign bit of
exp_avg where d > 0 (then exp_avg's sign is mostly +), an involution (the decoder has d from the weights it
decoded first); the flipped tensors are coded with lmc alone and against the previous checkpoint's flipped
exp_avg.

bf16: exp_avg and both weights cast to bf16 (round to nearest even), d = bf16(w_t) - bf16(w_{t-1}) in fp32.

``--one-step S1,S2,..`` (the embedded tinygpt series only, ``--train-conf`` its preset) also resumes training
from checkpoint S in memory for one step and measures the pair (S, S+1): the delta of a single update, the
premise's ideal case. Nothing is written into the series folder.

The committed results/exp_avg_context/ (the 24M-parameter series, with one-step pairs from 50, 500 and 900):

    lmcbench experiment=exp_avg_context

On any Trainer folder (and the same as a script, without Hydra):
    lmcbench experiment=exp_avg_context source=hf_trainer source.path=DIR 'exp_avg_context.one_step=[]'
    python experiments/exp_avg_context.py SERIES_DIR --out results/exp_avg_context
        [--steps 100,150,..] [--tensors REGEX] [--one-step 100,500,900 --train-conf conf/source/tinygpt_large.yaml]

An experiment of lmcbench, not a script of lmc's: it resumes lmcbench's tinygpt Trainer (``--one-step``), and
lmc never imports lmcbench.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

import lmc

HERE = os.path.dirname(os.path.abspath(__file__))

CHUNK = 131072                # LMC's default chunk size in elements
N_MAG = 8                     # magnitude classes of d (exponent - chunk median, clipped to -4..+3)
MAG_LO = -4
ZERO_CTX = 2 * N_MAG          # the joint context of d == 0
N_JOINT = 2 * N_MAG + 1       # 17 joint contexts: 2 * mag + (d > 0), and d == 0
TABLE_BITMAP_BITS = 256       # side information of one table: a presence bitmap ...
TABLE_SYMBOL_BITS = 12        # ... and a 12-bit frequency per present symbol
# the marginal contexts as maps from the joint one
SIGN_OF = np.array([j % 2 for j in range(2 * N_MAG)] + [2], np.int64)           # 0: d < 0, 1: d > 0, 2: d == 0
MAG_OF = np.array([j // 2 for j in range(2 * N_MAG)] + [N_MAG], np.int64)       # 0..7, 8: d == 0
VARIANTS = {"none": np.zeros(N_JOINT, np.int64), "sign": SIGN_OF, "mag": MAG_OF, "sign+mag": np.arange(N_JOINT)}
COSTS = [*VARIANTS, "best"]   # the coded costs reported: each variant, and the smallest per chunk
PLANES = {"fp32": ["exponent", "sign+m7", "mant2", "mant3"], "bf16": ["exponent", "sign+m7"]}


# ------------------------------------------------------------------------------------------- the pieces
def planes(a: np.ndarray) -> list[np.ndarray]:
    """The byte streams LMC codes for a float32 or bfloat16 array (FORMAT.md, "Grouping into byte streams")."""
    a = np.ascontiguousarray(a).reshape(-1)
    if a.dtype == np.float32:
        v = a.view(np.uint32)
        return [((v >> 23) & 0xFF).astype(np.uint8), (((v >> 24) & 0x80) | ((v >> 16) & 0x7F)).astype(np.uint8),
                ((v >> 8) & 0xFF).astype(np.uint8), (v & 0xFF).astype(np.uint8)]
    if a.dtype == ml_dtypes.bfloat16:
        v = a.view(np.uint16)
        return [((v >> 7) & 0xFF).astype(np.uint8), (((v >> 8) & 0x80) | (v & 0x7F)).astype(np.uint8)]
    raise TypeError(f"planes: float32 or bfloat16, not {a.dtype}")


def sign_bit(a: np.ndarray) -> np.ndarray:
    """1 where the sign bit of a float32 / bfloat16 array is set (negative values, -0.0, negative NaNs)."""
    a = np.ascontiguousarray(a).reshape(-1)
    if a.dtype == np.float32:
        return (a.view(np.uint32) >> 31).astype(np.uint8)
    return (a.view(np.uint16) >> 15).astype(np.uint8)


def sign_flip(m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """exp_avg with its sign bit XORed where d > 0 (float32 or bfloat16, any shape); its own inverse.

    AdamW's step moves w against m, so sign(m) = -sign(d) mostly: flipped, m's sign is mostly +. Only the bit
    patterns are touched (NaN payloads, -0.0 and infinities come back exactly); d == 0 or NaN flips nothing."""
    m = np.ascontiguousarray(m)
    if m.shape != np.shape(d):
        raise ValueError(f"sign_flip: shapes {m.shape} and {np.shape(d)} differ")
    if m.dtype == np.float32:
        ut, bit = np.uint32, np.uint32(1 << 31)
    elif m.dtype == ml_dtypes.bfloat16:
        ut, bit = np.uint16, np.uint16(1 << 15)
    else:
        raise TypeError(f"sign_flip: float32 or bfloat16, not {m.dtype}")
    v = m.view(ut).copy()
    v[np.asarray(d) > 0] ^= bit
    return v.view(m.dtype)


def joint_context(d: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """The joint context (0..16) of every element from the delta d (fp32): ``2 * mag + (d > 0)`` where d != 0,
    mag = clip(exponent(|d|) - median exponent of the chunk's nonzero |d|, -4, +3) + 4; 16 where d == 0.
    The medians are side information of one byte per chunk (counted by the caller)."""
    d = np.asarray(d, np.float32).reshape(-1)
    nz = d != 0
    e = np.frexp(d)[1].astype(np.int64)
    out = np.full(d.size, ZERO_CTX, np.int64)
    for s in range(0, d.size, chunk):
        sl = slice(s, s + chunk)
        z = nz[sl]
        if not z.any():
            continue
        med = int(np.floor(np.median(e[sl][z])))
        mag = np.clip(e[sl][z] - med, MAG_LO, MAG_LO + N_MAG - 1) - MAG_LO
        out[sl][z] = 2 * mag + (d[sl][z] > 0)
    return out


def chunk_counts(sym: np.ndarray, ctx: np.ndarray, chunk: int = CHUNK, k: int = N_JOINT) -> np.ndarray:
    """Symbol counts per chunk and context: shape (chunks, k, 256)."""
    n = sym.size
    nch = max(1, -(-n // chunk))
    idx = ((np.arange(n, dtype=np.int64) // chunk) * k + ctx) * 256 + sym
    return np.bincount(idx, minlength=nch * k * 256).reshape(nch, k, 256)


def reduce_ctx(counts: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """Counts over a coarser context: joint context j goes to context mapping[j]."""
    out = np.zeros((counts.shape[0], int(mapping.max()) + 1, 256), np.int64)
    np.add.at(out, (slice(None), mapping), counts)
    return out


def entropy_bits(counts: np.ndarray) -> np.ndarray:
    """Plug-in code length in bits of each table's data: ``sum c * log2(n / c)`` over the last axis."""
    c = counts.astype(np.float64)
    n = c.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(c > 0, c * np.log2(np.where(c > 0, n / np.maximum(c, 1), 1.0)), 0.0)
    return t.sum(-1)


def table_bits(counts: np.ndarray) -> np.ndarray:
    """Side information of each table (0 for an empty one)."""
    distinct = (counts > 0).sum(-1)
    return np.where(distinct > 0, TABLE_BITMAP_BITS + TABLE_SYMBOL_BITS * distinct, 0)


def plane_costs(counts: np.ndarray) -> dict:
    """For every context variant: the plug-in data bits (sum over chunks) and the coded cost in bits (data +
    tables, the context model taken per chunk only where it beats one table, 1 flag bit per chunk; the
    median-exponent byte per chunk counted for the variants using mag)."""
    base = entropy_bits(counts.sum(1)) + table_bits(counts.sum(1))           # per chunk, one table
    out, each = {}, [base]
    for name, mp in VARIANTS.items():
        c = reduce_ctx(counts, mp)
        h = entropy_bits(c).sum(1)
        coded = h + table_bits(c).sum(1) + (8 if name in ("mag", "sign+mag") else 0)
        each.append(coded)
        out[name] = {"H": float(h.sum()),
                     "cost": float(base.sum()) if name == "none" else float((np.minimum(base, coded) + 1).sum())}
    # the smallest of the four per chunk (a 2-bit choice), e.g. mag for the exponent and sign for sign+m7
    out["best"] = {"H": min(out[v]["H"] for v in VARIANTS), "cost": float((np.min(each, axis=0) + 2).sum())}
    return out


# ------------------------------------------------------------------------------------------- one pair
def measure_pair(w_prev: dict, w_cur: dict, m_cur: dict, m_prev: dict | None, d_prev: dict | None,
                 dtype: str, lmc_bytes: bool = True) -> dict:
    """Totals over the tensors of one pair for one dtype ('fp32' or 'bf16'): per plane and variant the
    entropy and coded bits; element and sign-agreement counts; LMC's real bytes of exp_avg alone, with the
    previous exp_avg as reference, and of the sign-flipped exp_avg alone and against the previous flipped one
    (``d_prev``: the previous pair's deltas, None for the first pair)."""
    res = {"n": 0, "d_nonzero": 0, "agree": 0, "m_zero": 0, "planes": {},
           "lmc_alone": 0, "lmc_ref": 0, "flip_alone": 0, "flip_ref": 0}
    have_ref = m_prev is not None
    have_flip_ref = have_ref and d_prev is not None
    for name, m_raw in m_cur.items():
        m, d = cast(m_raw, dtype), delta(w_cur[name], w_prev[name], dtype)
        ctx = joint_context(d)
        res["n"] += m.size
        nz = d.reshape(-1) != 0
        sb = sign_bit(m)
        mz = (m.reshape(-1).astype(np.float32) == 0)
        res["m_zero"] += int(mz.sum())
        res["d_nonzero"] += int(nz.sum())
        # agreement: m's sign bit is set exactly where d > 0 (sign(m) = -sign(d)), among d != 0
        res["agree"] += int((sb[nz] == (d.reshape(-1)[nz] > 0)).sum())
        for i, p in enumerate(planes(m)):
            pc = plane_costs(chunk_counts(p, ctx))
            acc = res["planes"].setdefault(PLANES[dtype][i], {v: {"H": 0.0, "cost": 0.0} for v in COSTS})
            for v in COSTS:
                acc[v]["H"] += pc[v]["H"]
                acc[v]["cost"] += pc[v]["cost"]
        if lmc_bytes:
            f = sign_flip(m, d)
            res["lmc_alone"] += len(lmc.compress(m, threads=1))
            res["flip_alone"] += len(lmc.compress(f, threads=1))
            if have_ref:
                mp = cast(m_prev[name], dtype)
                res["lmc_ref"] += len(lmc.compress(m, reference=mp, threads=1))
                if have_flip_ref:
                    res["flip_ref"] += len(lmc.compress(f, reference=sign_flip(mp, d_prev[name]), threads=1))
    if not have_ref:
        res["lmc_ref"] = None
    if not have_flip_ref:
        res["flip_ref"] = None
    return res


def cast(a: np.ndarray, dtype: str) -> np.ndarray:
    a = np.ascontiguousarray(a, np.float32)
    return a if dtype == "fp32" else a.astype(ml_dtypes.bfloat16)


def delta(w_cur: np.ndarray, w_prev: np.ndarray, dtype: str) -> np.ndarray:
    """d = w_cur - w_prev in fp32, of the weights as stored in ``dtype`` (bf16: both cast first)."""
    if dtype == "fp32":
        return np.asarray(w_cur, np.float32) - np.asarray(w_prev, np.float32)
    return (cast(w_cur, "bf16").astype(np.float32) - cast(w_prev, "bf16").astype(np.float32))


# ------------------------------------------------------------------------------------------- the series
def load_step(folder: str, pattern) -> tuple[dict, dict]:
    """(weights, exp_avg) by parameter name, read with lmc.formats.trainer_folder (moments named by slot)."""
    from lmc.formats.trainer_folder import load_triples

    tr = load_triples(folder)
    w = {n: t["weight"] for n, t in tr.items() if t["exp_avg"] is not None and pattern.search(n)}
    m = {n: tr[n]["exp_avg"] for n in w}
    return w, m


def lr_ranges(series: str, steps: list[int]) -> dict:
    """step -> 'warm-up' (the logged learning rate still rising: up to its peak), 'decay' (below half the
    peak) or 'middle', from the last checkpoint's trainer_state.json; thirds of the steps when it has none."""
    lr = {}
    try:
        last = max(steps)
        with open(os.path.join(series, f"checkpoint-{last}", "trainer_state.json")) as f:
            for e in json.load(f).get("log_history", []):
                if "learning_rate" in e:
                    lr[int(e["step"])] = float(e["learning_rate"])
    except (OSError, ValueError):
        pass
    if not all(s in lr for s in steps):
        k = len(steps)
        return {s: ("warm-up" if i < k / 3 else "middle" if i < 2 * k / 3 else "decay") for i, s in enumerate(steps)}
    peak_step = max(lr, key=lr.get)
    peak = lr[peak_step]
    return {s: "warm-up" if s <= peak_step else "decay" if lr[s] < peak / 2 else "middle" for s in steps}


def one_step_pairs(series: str, steps: list[int], train: dict, pattern):
    """Yield (label, w_prev, w_cur, m_cur, m_prev): checkpoint S resumed (lmcbench's tinygpt Trainer) and
    trained one step further in memory."""
    import torch

    from lmcbench.tinygpt.config import TrainConfig
    from lmcbench.tinygpt.trainer import Trainer

    torch.set_num_threads(1)
    opts = TrainConfig.from_options(train).to_dict()
    for s in steps:
        tr = Trainer.from_checkpoint(os.path.join(series, f"checkpoint-{s}"), opts)
        w0, m0, _ = tr.state_arrays()
        tr.train_until(s + 1, save=False)
        w1, m1, _ = tr.state_arrays()
        keep = [n for n in w1 if n in m1 and pattern.search(n)]
        yield (f"{s}->{s + 1}", {n: w0[n] for n in keep}, {n: w1[n] for n in keep}, {n: m1[n] for n in keep},
               {n: m0[n] for n in keep})


def rows_of(label, step, rng, gap, dtype, r) -> list[dict]:
    base = {"pair": label, "step": step, "range": rng, "gap": gap, "dtype": dtype, "elements": r["n"],
            "d_nonzero": r["d_nonzero"], "sign_agree": r["agree"], "m_zero": r["m_zero"],
            "lmc_alone": r["lmc_alone"], "lmc_ref": r["lmc_ref"], "flip_alone": r["flip_alone"],
            "flip_ref": r["flip_ref"]}
    out = []
    for p, acc in r["planes"].items():
        row = dict(base, plane=p)
        for v in VARIANTS:
            row[f"H_{v}"] = round(acc[v]["H"], 1)
        for v in COSTS:
            row[f"cost_{v}"] = round(acc[v]["cost"], 1)
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------- report
def _pct(x):
    return "" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


RANGE_ORDER = ["warm-up", "middle", "decay", "one step: warm-up", "one step: middle", "one step: decay"]


def _ranges(part, tens, dtype, order):
    """(range, its rows of part, its tensors of that dtype) for each range in order that part has rows of."""
    for rng in order:
        g = part[part["range"] == rng]
        if not g.empty:
            yield rng, g, tens[(tens["dtype"] == dtype) & (tens["range"] == rng)]


def summarize(rows: list[dict]) -> tuple[list[str], dict]:
    """Markdown tables from the CSV rows; and per (dtype, range) the savings of each candidate as a fraction of
    LMC alone (the context models' coded bits, the sign-flip's real bytes)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    lines, saves = [], {}
    order = [r for r in RANGE_ORDER if r in set(df["range"])]
    tens = df.drop_duplicates(["pair", "dtype"])
    for dtype in ("fp32", "bf16"):
        part = df[df["dtype"] == dtype]
        if part.empty:
            continue
        lines += [f"### {dtype}", "",
                  ("Bits per element, per byte plane. `H`: plug-in entropy, one model per 131072-element chunk "
                  "(without context, and given each context from d); `coded`: with the tables' side information, "
                  "a context model taken per chunk only where it pays; `best`: the smallest of the four per chunk."),
                  "",
                  ("| range | pairs | plane | H | H \\| sign | H \\| mag | H \\| sign+mag | "
                  "coded: none | sign | mag | sign+mag | best |"),
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for rng, g, t in _ranges(part, tens, dtype, order):
            n = t["elements"].sum()
            for p in PLANES[dtype]:
                gp = g[g["plane"] == p]
                cells = [f"{gp[f'H_{v}'].sum() / n:.4f}" for v in VARIANTS]
                cells += [f"{gp[f'cost_{v}'].sum() / n:.4f}" for v in COSTS]
                lines.append(f"| {rng} | {gp['pair'].nunique()} | {p} | " + " | ".join(cells) + " |")
        lines += ["", ("Sign agreement (sign(exp_avg) = -sign(d), among d != 0); LMC's real size of exp_avg alone "
                  "and with the previous exp_avg as reference; the bits each context model saves (all planes, "
                  "coded) as a fraction of LMC alone, and (best) of LMC with reference; the sign-flip transform "
                  "in real LMC bytes (alone, and against the previous flipped exp_avg, vs LMC with reference):"), "",
                  ("| range | pairs | d != 0 | agree | LMC alone, bits/elt | LMC ref, bits/elt | saved: sign | "
                  "mag | sign+mag | best | best vs ref | flip, alone | flip, ref |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for rng, g, t in _ranges(part, tens, dtype, order):
            n = t["elements"].sum()
            alone = 8 * t["lmc_alone"].sum()
            tr = t[t["lmc_ref"].notna()]
            ref = 8 * tr["lmc_ref"].sum() if len(tr) else float("nan")
            fr = {v: (g["cost_none"].sum() - g[f"cost_{v}"].sum()) / alone for v in COSTS if v != "none"}
            gr = g[g["pair"].isin(tr["pair"])]
            best_ref = (gr["cost_none"].sum() - gr["cost_best"].sum()) / ref if len(tr) else None
            tf = t[t["flip_ref"].notna()]
            flip_ref = (1 - tf["flip_ref"].sum() / tf["lmc_ref"].sum()) if len(tf) else None
            flip_alone = 1 - t["flip_alone"].sum() / t["lmc_alone"].sum()
            saves[(dtype, rng)] = {"context (best)": fr["best"], "context vs ref": best_ref,
                                   "flip alone": flip_alone, "flip ref": flip_ref}
            lines.append(f"| {rng} | {t['pair'].nunique()} | {_pct(t['d_nonzero'].sum() / n)} | "
                         f"{_pct(t['sign_agree'].sum() / max(1, t['d_nonzero'].sum()))} | {alone / n:.3f} | "
                         f"{(ref / tr['elements'].sum()) if len(tr) else float('nan'):.3f} | "
                         + " | ".join(_pct(fr[v]) for v in ("sign", "mag", "sign+mag", "best"))
                         + f" | {_pct(best_ref)} | {_pct(flip_alone)} | {_pct(flip_ref)} |")
        lines.append("")
    return lines, saves


def verdict(saves: dict, threshold: float = 0.03) -> list[str]:
    """The >= 3% question per dtype and range, on the series' own pairs and on the one-step pairs."""
    out = ["## Verdict (threshold: 3% of LMC's exp_avg bytes)", ""]
    for (dt, rng), v in saves.items():
        vals = {k: x for k, x in v.items() if x is not None}
        k, x = max(vals.items(), key=lambda kv: kv[1])
        out.append(f"* {dt}, {rng}: largest saving {_pct(x)} ({k}): {'>= 3%' if x >= threshold else 'below 3%'}")
    series = [max(x for x in v.values() if x is not None) for (dt, rng), v in saves.items()
              if not rng.startswith("one step")]
    if series:
        out += ["", "On the series' consecutive checkpoints: "
                + ("some mode saves >= 3% in some range." if max(series) >= threshold
                   else f"no mode saves 3% in any range (largest {_pct(max(series))}).")]
    return out + [""]


def git_state() -> tuple[str, bool]:
    def run(*a):
        return subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True, check=False).stdout.strip()

    top = run("rev-parse", "--show-toplevel")
    if not top:  # an installed lmcbench, outside a checkout
        return "none (not a git checkout)", False
    mine = [os.path.relpath(__file__, top)]
    return run("rev-parse", "HEAD"), run("status", "--porcelain", "--", *mine) == ""


def main(argv=None, command=None, train=None):
    """The script's command line; ``command`` (the line the report names) and ``train`` (the tinygpt training
    options of ``--one-step``, instead of ``--train-conf``) are given by :func:`run`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("series", help="a Hugging Face Trainer output folder with checkpoint-<step>/")
    ap.add_argument("--out", default="results/exp_avg_context")
    ap.add_argument("--steps", default=None, help="comma-separated checkpoint steps (default: all)")
    ap.add_argument("--tensors", default="", help="regex on parameter names (default: all)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--one-step", default="", help="steps S to resume and train one step (tinygpt series)")
    ap.add_argument("--train-conf", default="", help="the tinygpt preset the series was trained with")
    ap.add_argument("--no-lmc", action="store_true", help="skip the real LMC bytes (entropies only)")
    a = ap.parse_args(argv)
    from lmc.formats.trainer_folder import list_checkpoints

    series = os.path.abspath(os.path.expanduser(a.series))
    found = [s for s, _ in list_checkpoints(series)]
    steps = [int(s) for s in a.steps.split(",")] if a.steps else found
    pattern = re.compile(a.tensors)
    dtypes = a.dtypes.split(",")
    ranges = lr_ranges(series, found)
    commit, clean = git_state()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    t0 = time.time()
    prev = prev_d = None
    for s in steps:
        w, m = load_step(os.path.join(series, f"checkpoint-{s}"), pattern)
        if prev is not None:
            pw, pm, ps = prev
            for dt in dtypes:
                r = measure_pair(pw, w, m, pm, prev_d.get(dt) if prev_d else None, dt, not a.no_lmc)
                rows += rows_of(f"{ps}->{s}", s, ranges[s], s - ps, dt, r)
            prev_d = {dt: {n: delta(w[n], pw[n], dt) for n in w} for dt in dtypes}
            print(f"{ps}->{s} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        prev = (w, m, s)
    if a.one_step:
        if train is None:
            import yaml

            if not a.train_conf:
                raise SystemExit("--one-step needs --train-conf (the tinygpt preset the series was trained with)")
            with open(a.train_conf) as f:
                train = yaml.safe_load(f).get("train")
        for label, w0, w1, m1, m0 in one_step_pairs(series, [int(x) for x in a.one_step.split(",")], train,
                                                    pattern):
            for dt in dtypes:
                r = measure_pair(w0, w1, m1, m0, None, dt, not a.no_lmc)
                s0 = int(label.split("->")[0])
                rows += rows_of(label, s0 + 1, f"one step: {ranges[s0]}", 1, dt, r)
            print(f"{label} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    with open(os.path.join(a.out, "exp_avg_context.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    lines, saves = summarize(rows)
    cmd = command or "OMP_NUM_THREADS=1 python " + " ".join(
        ["experiments/exp_avg_context.py"] + list(argv if argv is not None else sys.argv[1:]))
    rng_text = ", ".join(f"{k}: {', '.join(str(s) for s in steps[1:] if ranges[s] == k) or 'none'}"
                         for k in ("warm-up", "middle", "decay"))
    head = ["# exp_avg given the weights' delta (issue 21, item 5)", "",
            (f"Series: `{series}` ({len(steps)} checkpoints: {steps[0]}..{steps[-1]}; tensors: "
             f"{a.tensors or 'all'}). Pairs by the step t of their later checkpoint and the logged learning "
             f"rate (warm-up: up to its peak; decay: below half the peak): {rng_text}."
             + (f" One-step pairs: from checkpoints {a.one_step}, resumed and trained one step in memory."
                if a.one_step else "")), "",
            f"Command: `{cmd}`  ",
            (f"Commit: `{commit}` ({'clean' if clean else 'SCRIPT MODIFIED'}), lmc "
             f"{getattr(lmc, '__version__', '?')}, {time.time() - t0:.0f} s."), "",
            ("Method (docstring of `experiments/exp_avg_context.py`): per pair (t-1, t), d = w_t - w_{t-1} of the "
             "same parameter; contexts from d: sign (d > 0, d < 0, d == 0), magnitude class (exponent of |d| "
             "relative to the chunk's median, 8 classes, and d == 0), both (17). `saved` = (coded bits without "
             "context - with it) / LMC's real bits of exp_avg alone; `best vs ref`: the best saving over LMC's "
             "size with the previous exp_avg as reference (an upper bound: it assumes the saving adds to what "
             "the reference gives); `flip`: the sign-flip transform coded by LMC, 1 - flipped bytes / plain bytes "
             "(alone; and against the previous exp_avg flipped by its own delta, vs plain LMC with reference). "
             "The mantissa planes mant2/mant3 are noise: their drop of `H` under a context is the plug-in "
             "estimate's bias, which the table costs in `coded` pay for."), ""]
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("\n".join(head + lines + verdict(saves)))
    print(os.path.join(a.out, "README.md"))
    return rows, saves


def run(c: dict, out: str) -> str:
    """``lmcbench experiment=exp_avg_context`` (``task: experiment``): the study on the configured source (a
    tinygpt series, trained first where it is missing, or a Trainer folder: ``source=hf_trainer``) with the
    preset's ``exp_avg_context`` options, written into ``out``; returns the report's path."""
    from lmcbench.errors import ConfigError
    from lmcbench.sources import get_source

    src = get_source(c["source"])
    if src.source_type not in ("tinygpt", "hf_trainer"):
        raise ConfigError(f"experiment exp_avg_context: a tinygpt or hf_trainer source (a Trainer folder), "
                          f"got {src.source_type}")
    o = c.get("exp_avg_context") or {}
    train = None
    if src.source_type == "tinygpt":
        from lmcbench.tinygpt.series import ensure_series

        ensure_series(src.path, src.train_opts)
        train = src.train_opts
    elif o.get("one_step"):
        raise ConfigError("exp_avg_context.one_step resumes lmcbench's tinygpt Trainer: a tinygpt source only "
                          "('exp_avg_context.one_step=[]')")
    argv = [src.path, "--out", out, "--dtypes", ",".join(o.get("dtypes") or ["fp32", "bf16"])]
    if o.get("steps"):
        argv += ["--steps", ",".join(str(s) for s in o["steps"])]
    if o.get("tensors"):
        argv += ["--tensors", o["tensors"]]
    if o.get("one_step"):
        argv += ["--one-step", ",".join(str(s) for s in o["one_step"])]
    if not o.get("lmc", True):
        argv += ["--no-lmc"]
    main(argv, command=" ".join(["lmcbench"] + sys.argv[1:]), train=train)
    return os.path.join(out, "README.md")


if __name__ == "__main__":
    main()
