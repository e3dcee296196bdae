"""``lmcbench experiment=lossy``: the lossy frontier, every method at several settings on one tinygpt series,
judged by resumed training (:func:`~.judge.judge_resumed`) and, beside it, by the reconstruction alone
(:func:`~.judge.judge_reconstruction`).

Writes, into its output folder: ``frontier.csv`` (one row per method, setting and judgement: ``method``,
``setting``, ``ratio``, ``final_loss``, ``baseline_loss``, ``loss_change_pct``, ``judged`` and more),
``lossy_checkpoints.csv`` (one row per checkpoint of every chain) and ``summary.json``. Rows are appended as
each point finishes, so a cut-short run keeps what it measured. Nothing here writes the lossless
``records.csv``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from lmc.formats.trainer_folder import load_triples

from ..bench.records import CsvAppender
from ..errors import ConfigError
from ..tinygpt.series import Series
from . import judge
from .judge import eval_arrays, frontier_row, judge_reconstruction, judge_resumed
from .method import make_method
from .methods import missing_package
from .chain import weights_of

FRONTIER_COLUMNS = ["method", "setting", "ratio", "final_loss", "baseline_loss", "loss_change_pct", "judged",
                    "ratio_total", "checkpoints", "weight_rel_l2", "exp_avg_rel_l2", "exp_avg_sq_rel_l2", "seconds"]
CKPT_COLUMNS = ["method", "setting", "judged", "step", "first", "lossy", "full_bytes", "comp_bytes", "ratio",
                "resumed_here", "eval_loss", "eval_loss_recon", "baseline_loss", "weight_rel_l2", "exp_avg_rel_l2",
                "exp_avg_sq_rel_l2", "weight_kept", "moment_kept", "compress_s", "decompress_s"]
JUDGEMENTS = ("resumed", "reconstruction")
DEFAULTS = {"resume_every": 2, "eval_batches": 16, "judged": list(JUDGEMENTS), "methods": {}, "common": {},
            "only": None, "device": "cpu"}


def options(c: dict) -> dict:
    """The checked ``lossy.*`` options of a config dict, and the methods they name (built, so a bad option
    fails before any training): ``{..., "points": [(method name, Method)]}``."""
    o = {**DEFAULTS, **(c.get("lossy") or {})}
    bad = sorted(set(o) - set(DEFAULTS))
    if bad:
        raise ConfigError(f"lossy: unknown option(s) {', '.join(bad)}; known: {', '.join(DEFAULTS)}")
    for k in ("resume_every", "eval_batches"):
        v = o[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"lossy.{k}: expected a positive integer, got {v!r}")
    o["device"] = _device(o["device"])
    if not o["judged"] or any(j not in JUDGEMENTS for j in o["judged"]):
        raise ConfigError(f"lossy.judged: a non-empty list of {', '.join(JUDGEMENTS)}, got {o['judged']!r}")
    if not isinstance(o["methods"], dict) or not isinstance(o["common"], dict):
        raise ConfigError("lossy.methods: a mapping method -> list of settings; lossy.common: method -> options")
    only = o["only"]
    if only is not None and (not isinstance(only, list) or any(n not in o["methods"] for n in only)):
        raise ConfigError(f"lossy.only: a list of the methods in lossy.methods ({', '.join(o['methods'])}), "
                          f"got {only!r}")
    points, skipped = [], {}
    for name, settings in o["methods"].items():
        if settings is None or (only is not None and name not in only):
            continue
        if not isinstance(settings, list):
            raise ConfigError(f"lossy.methods.{name}: expected a list of settings (mappings), got {settings!r}")
        miss = missing_package(name)
        if miss:
            skipped[name] = (f"{name} needs the Python package {miss}, which is not installed "
                             f"(pip install 'lmcbench[lossy]'); skipped")
            continue
        for s in settings:
            if not isinstance(s, dict):
                raise ConfigError(f"lossy.methods.{name}: a setting is a mapping of options, got {s!r}")
            points.append((name, make_method({"method": name, **(o["common"].get(name) or {}), **s})))
    if not points:
        raise ConfigError("lossy.methods: no method to run")
    o["points"], o["skipped"] = points, skipped
    return o


def _device(v) -> str:
    """``lossy.device``: the torch device the resumed runs train on (``cpu``, ``cuda``, ``cuda:1``, ...). The
    methods and the held-out losses stay on the CPU; only the training between checkpoints moves."""
    import torch

    try:
        if not isinstance(v, str):
            raise TypeError("not a string")
        torch.device(v)
    except (TypeError, RuntimeError) as e:
        raise ConfigError(f"lossy.device: expected a torch device name such as cpu or cuda, got {v!r} ({e})") \
            from None
    return v


def open_series(source: dict) -> Series:
    return judge.open_series(source, "lossy")


def run_frontier(c: dict, out_dir: str, log=print) -> dict:
    """The whole frontier into ``out_dir``; returns the summary (also written as ``summary.json``)."""
    o = options(c)
    for msg in o["skipped"].values():
        log(f"lossy: {msg}")
    source = open_series(c["source"])
    opts = source.train_opts
    ckpts = judge.checkpoints_of(source, "lossy")
    os.makedirs(out_dir, exist_ok=True)
    for name in ("frontier.csv", "lossy_checkpoints.csv"):
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    nb, K = o["eval_batches"], o["resume_every"]
    t_start = time.time()
    base = {}
    for step, d in ckpts:
        base[step] = eval_arrays(opts, weights_of(load_triples(d)), nb)
    log(f"lossy: {len(ckpts)} checkpoints of {source.path}; uncompressed final loss {base[ckpts[-1][0]]:.4f}; "
        f"{len(o['points'])} points x {len(o['judged'])} judgements")
    summary = {"series": source.path, "train": opts, "steps": [s for s, _ in ckpts],
               "n_params": int(sum(t["weight"].size for t in load_triples(ckpts[0][1]).values())),
               "resume_every": K, "eval_batches": nb, "device": o["device"], "baseline_losses": {str(k): v for k, v in base.items()},
               "skipped": o["skipped"], "points": 0, "seconds": None, "complete": False}
    _write_summary(out_dir, summary)  # written again at the end: a cut-short run can still be rendered
    fr = CsvAppender(os.path.join(out_dir, "frontier.csv"), FRONTIER_COLUMNS)
    ck = CsvAppender(os.path.join(out_dir, "lossy_checkpoints.csv"), CKPT_COLUMNS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lmcbench-lossy-") as work:
        for name, method in o["points"]:
            for judged in o["judged"]:
                t0 = time.time()
                if judged == "resumed":
                    per = judge_resumed(method, ckpts, opts, K, nb, work, base, log=log, device=o["device"])
                else:
                    per = judge_reconstruction(method, ckpts, opts, nb, base, log=log)
                row = {**frontier_row(per), "seconds": round(time.time() - t0, 1)}
                fr.write([row])
                ck.write([{k: r.get(k) for k in CKPT_COLUMNS} for r in per])
                rows.append(row)
                log(f"lossy: {method.label} ({judged}): {row['ratio']:.1f}x, final loss {row['final_loss']:.4f} "
                    f"({row['loss_change_pct']:+.2f}%)")
    fr.close()
    ck.close()
    summary.update(points=len(rows), seconds=round(time.time() - t_start, 1), complete=True)
    _write_summary(out_dir, summary)
    return summary


def _write_summary(out_dir: str, summary: dict) -> None:
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
