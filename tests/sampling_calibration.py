"""How often the sampled run's nominal-95% intervals hold the ratio on the small series of tests/test_sampling.py,
measured once over many samples; the test's coverage thresholds are derived from this file's output.

The population is the test's (:func:`build_series`: a 128 x 512 Linear trained with AdamW, three steps, cut into
4 KiB slices, zstd and lz4 on raw bytes, byte planes and the delta: 18 cells of kind x pipeline x codec). Every
slice is measured once; samples of ``FRACTION`` are then drawn from those measurements with the plan's own rule
(seeds 0 to draws - 1), each given its t interval as a report gives it (``RESAMPLES`` bootstrap resamples), and
each cell's coverage is the share of samples whose interval holds the cell's ratio.

The test draws ``TEST_DRAWS`` samples (seeds 0 to 199) and asserts, per cell, a coverage of at least the
``ALPHA / cells`` quantile of Binomial(TEST_DRAWS, p), p the cell's calibrated coverage, capped at the nominal
95% (a cell above nominal is held to nominal's bound, one below it to its own: the shortfall is stated here, not
hidden by the threshold); and for the mean over cells, the calibrated mean less z(1 - ALPHA) x the calibration's
standard deviation of a sample's mean over cells / sqrt(TEST_DRAWS). A correct implementation fails either with
probability below ALPHA = 0.001.

    python tests/sampling_calibration.py            # writes tests/sampling_calibration.json (about a minute)
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import NormalDist

import numpy as np

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "sampling_calibration.json"
SLICE_KIB = 4
QUICK = dict(warmup=0, repeats=1, budget_s=0.0, progress=False, xor_analysis=False)
FRACTION = 0.25
DRAWS = 4000
RESAMPLES = 300
TEST_DRAWS = 200
ALPHA = 0.001
NOMINAL = 0.95


def wide_model():
    """A model with enough bytes to cut into 4 KiB slices: ``3.weight`` is 128 x 512 fp32 (64 slices)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 512), nn.LayerNorm(512), nn.ReLU(), nn.Linear(512, 128))


def build_series(base: Path, sample: bool = True) -> dict:
    """A real (AdamW-trained) Trainer folder under ``base/out``, measured in full with the run cut into the
    sample's slices (so that the full ratio has no slicing effect: ``full``), every slice on its own (``slices``)
    and, with ``sample``, as a ``FRACTION`` sample with seed 0 (``sample-0``)."""
    from lmcbench.bench.options import BenchOptions
    from lmcbench.bench.runner import run
    from lmcbench.codecs import get_codec
    from lmcbench.report.header import collect
    from lmcbench.sources import get_source
    from lmcbench.transforms import Pipeline

    sys.path.insert(0, str(HERE))
    from lmcbench_testlib import make_trainer_folder

    make_trainer_folder(base / "out", steps=(10, 20, 30), model=wide_model())
    pipes = {"raw": Pipeline("raw", []), "bytegroup": Pipeline.from_config("bytegroup", [{"id": "bytegroup"}]),
             "delta": Pipeline.from_config("delta", [{"id": "delta"}])}
    codecs = {"zstd": get_codec({"id": "zstd"}), "lz4": get_codec({"id": "lz4"})}
    opts = dict(QUICK, chunk_mib=SLICE_KIB / 1024, sample_slice_kib=SLICE_KIB)
    runs = [("full", 1.0, False), ("slices", 1.0, True)] + ([("sample-0", FRACTION, False)] if sample else [])
    dirs = {}
    for name, sample, every in runs:
        d = base / "run" / name
        summary = run(get_source({"type": "hf_trainer", "path": str(base / "out")}), pipes, codecs,
                      BenchOptions(**opts, sample=sample), str(d), log=lambda m: None, every_slice=every)
        (d / "environment.json").write_text(json.dumps({**collect("lmcbench test-sampling", source="a small folder"),
                                                        **summary, "seconds": 1.0}))
        dirs[name] = d
    return dirs


def coverage(dirs: dict, draws: int, resamples: int = RESAMPLES, fraction: float = FRACTION):
    """Per cell (BY of experiments/sampling.py) and per draw: whether the t interval of sample ``d`` (seeds 0 ..
    draws - 1) holds the full ratio. Returns (cells, hits: cells x draws booleans)."""
    import pandas as pd

    from lmcbench.bench.sample import choose
    from lmcbench.experiments import sampling as S
    from lmcbench.report import comparable, load_records
    from lmcbench.report.sampling import intervals, unit_sums

    full, slices = comparable(load_records(dirs["full"])), comparable(load_records(dirs["slices"]))
    plan = pd.read_csv(dirs["slices"] / "sample.csv", keep_default_na=False, na_values=[""])
    keys = pd.Categorical(S._keys(slices), categories=S._keys(plan).tolist())
    cells, o, c = unit_sums(slices, S.BY, keys.codes, len(plan))
    truth = cells.merge(S.truths(full, slices), on=S.BY, how="left")["full"].to_numpy()
    strata = plan["stratum"].to_numpy(object)
    hits = np.zeros((len(cells), draws), bool)
    for d in range(draws):
        chosen, w = choose(strata, fraction, d)
        idx = np.flatnonzero(chosen)
        r = intervals(o[:, idx], c[:, idx], strata[idx], w[idx], resamples=resamples, seed=d)
        hits[:, d] = (r["t_lo"] <= truth) & (truth <= r["t_hi"])
    return cells, hits


def binomial_lower(n: int, p: float, alpha: float) -> float:
    """The largest k / n with P(Binomial(n, p) < k) <= alpha."""
    cdf, k = 0.0, 0
    while k <= n:
        nxt = cdf + math.comb(n, k) * p ** k * (1 - p) ** (n - k)
        if nxt > alpha:
            break
        cdf, k = nxt, k + 1
    return k / n


def thresholds(per_cell, mean: float, sd_of_mean: float, test_draws: int = TEST_DRAWS, alpha: float = ALPHA):
    """The test's thresholds from the calibration: per cell and for the mean over cells (module docstring)."""
    per_cell = np.asarray(per_cell, float)
    cell = [binomial_lower(test_draws, min(p, NOMINAL), alpha / len(per_cell)) for p in per_cell]
    z = NormalDist().inv_cdf(1 - alpha)
    return cell, min(mean, NOMINAL) - z * sd_of_mean / math.sqrt(test_draws)


def main() -> None:
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = build_series(Path(tmp), sample=False)
        cells, hits = coverage(dirs, DRAWS)
    per_cell = hits.mean(axis=1)
    draw_means = hits.mean(axis=0)
    cell_t, mean_t = thresholds(per_cell, float(per_cell.mean()), float(draw_means.std(ddof=1)))
    from lmcbench.report.header import git_commit

    out = {"command": "python tests/sampling_calibration.py", "git_commit": git_commit(),
           "fraction": FRACTION, "draws": DRAWS, "seeds": f"0..{DRAWS - 1}", "resamples": RESAMPLES,
           "nominal": NOMINAL, "alpha": ALPHA, "test_draws": TEST_DRAWS,
           "mean_coverage": round(float(per_cell.mean()), 5),
           "sd_of_a_draws_mean_over_cells": round(float(draw_means.std(ddof=1)), 5),
           "worst_cell_coverage": round(float(per_cell.min()), 5),
           "test_threshold_mean": round(mean_t, 4), "seconds": round(time.time() - t0, 1),
           "cells": [{**{k: str(v) for k, v in row.items()}, "coverage": round(float(p), 5),
                      "test_threshold": thr}
                     for row, p, thr in zip(cells.to_dict("records"), per_cell, cell_t)]}
    OUTPUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{os.path.relpath(OUTPUT)}: mean coverage {out['mean_coverage']:.4f}, worst cell "
          f"{out['worst_cell_coverage']:.4f} over {DRAWS} samples ({out['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
