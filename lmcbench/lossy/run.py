"""``lmcbench experiment=excp``: ExCP judged by resumed training.

Three parts, all on a tinygpt series (it can be trained again, so training can resume):

1. **Baseline chain.** The uncompressed run is the cached series itself. Every checkpoint is compressed by
   ExCP as a chain (the first whole and lossless, each later one a residual against the *reconstructed*
   previous one), and also by "residual + archiver" (the same chain with pruning and quantisation off: the
   lossless baseline row of the paper's table).
2. **Compressed run.** The same training (same seed, same data order) that every ``resume_every`` checkpoints
   stops, compresses its checkpoint, writes the *reconstruction* as a checkpoint folder and resumes from it,
   as the paper does. Until the first stop it is the baseline run, so those checkpoints are taken from the
   series. Each of its checkpoints is compressed in its own chain; its held-out loss is measured on the live
   model and on the reconstruction.
3. **Sweep.** One knob at a time (alpha, beta, bits) around the main configuration, on a short chain of the
   baseline series' last checkpoints: ratio, reconstruction error and the held-out loss of the reconstructed
   last checkpoint.

Everything here is lossy and is written to its own files (``excp_*.csv``, ``summary.json``), never to the
lossless ``records.csv``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..bench.records import CsvAppender
from lmc.formats.trainer_folder import load_triples
from ..errors import ConfigError
from ..tinygpt.series import Series
from .chain import Chain, full_bytes, weights_of
from .chain import is_lossy as _is_lossy
from .chain import same_checkpoint as _same  # noqa: F401 - the name tests import from here
from .chain import summarize as _summ
from .excp import ExCPConfig, encode_checkpoint
from . import judge
from .judge import ResumedRun
from .judge import eval_arrays as _eval_arrays
from .judge import resume_from as _resume


@dataclass
class SweepConfig:
    """``excp.sweep``: one knob at a time around the main configuration, on the last ``steps`` checkpoints."""

    steps: int = 4
    alpha: list = field(default_factory=list)
    beta: list = field(default_factory=list)
    bits: list = field(default_factory=list)


@dataclass
class ExCPRunConfig:
    """The experiment's own ``excp.*`` options (the codec's are :class:`ExCPConfig`): where their defaults are
    written. ``conf/experiment/excp.yaml`` is a preset over these and :class:`ExCPConfig`; the overrides it
    makes on purpose are listed in ``tests/test_config_defaults.py``."""

    resume_every: int = 5
    eval_batches: int = 32
    keep_checkpoints: bool = False
    sweep: SweepConfig = field(default_factory=SweepConfig)


RUN_DEFAULTS = dataclasses.asdict(ExCPRunConfig())
CKPT_COLUMNS = ["run", "step", "lossy", "method", "full_bytes", "comp_bytes", "ratio", "resumed_here",
                "eval_loss", "eval_loss_recon", "weight_rel_l2", "exp_avg_rel_l2", "exp_avg_sq_rel_l2",
                "weight_kept", "moment_kept", "compress_s", "decompress_s"]
TENSOR_COLUMNS = ["run", "step", "method", "lossy", "name", "kind", "mode", "numel", "kept_fraction",
                  "pruned_fraction", "rel_l2", "max_abs", "payload_bytes"]
SWEEP_COLUMNS = ["knob", "alpha", "beta", "bits", "steps", "ratio", "ratio_total", "weight_rel_l2",
                 "exp_avg_rel_l2", "exp_avg_sq_rel_l2", "weight_kept", "moment_kept", "eval_loss_recon",
                 "eval_loss_orig"]


def _opts(c: dict) -> tuple[ExCPConfig, dict]:
    ex = dict(c.get("excp") or {})
    run = {k: ex.pop(k) for k in list(ex) if k in RUN_DEFAULTS}
    merged = {**RUN_DEFAULTS, **run}
    merged["sweep"] = {**RUN_DEFAULTS["sweep"], **(run.get("sweep") or {})}
    bad = sorted(set(merged["sweep"]) - set(RUN_DEFAULTS["sweep"]))
    if bad:
        raise ConfigError(f"excp.sweep: unknown option(s) {', '.join(bad)}; known: alpha, beta, bits, steps")
    k = merged["resume_every"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"excp.resume_every: expected a positive integer (checkpoints), got {k!r}")
    n = merged["eval_batches"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"excp.eval_batches: expected a positive integer, got {n!r}")
    s = merged["sweep"]["steps"]
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ConfigError(f"excp.sweep.steps: expected a positive integer (compressed checkpoints), got {s!r}")
    return ExCPConfig.from_dict(ex), merged


def open_series(source: dict) -> Series:
    return judge.open_series(source, "excp", "; compress any Trainer folder with lmcbench-excp compress")


def run_excp(cfg, out_dir: str, log=print) -> dict:
    """The whole experiment; writes ``excp_checkpoints.csv``, ``excp_tensors.csv``, ``excp_sweep.csv`` and
    ``summary.json`` into ``out_dir``."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    excp_cfg, ro = _opts(c)
    lossless_cfg = ExCPConfig.from_dict({**excp_cfg.to_dict(), "prune_weights": False, "prune_moments": False,
                                         "quantize": False})
    source = open_series(c["source"])
    opts = source.train_opts
    ckpts = judge.checkpoints_of(source, "excp")
    os.makedirs(out_dir, exist_ok=True)
    K, nb = ro["resume_every"], ro["eval_batches"]
    ck_out = CsvAppender(os.path.join(out_dir, "excp_checkpoints.csv"), CKPT_COLUMNS)
    t_out = CsvAppender(os.path.join(out_dir, "excp_tensors.csv"), TENSOR_COLUMNS)
    log(f"excp: {len(ckpts)} checkpoints of {source.path}; {excp_cfg}")

    def record(run, step, method, triples, chain, eval_loss=None, resumed=False, eval_recon=True):
        blob, recon, stats, ct, dt, first = chain.add(triples)
        lossy = not first and _is_lossy(chain.cfg)  # the first of a chain is stored whole and lossless
        fb = full_bytes(triples)
        row = {"run": run, "step": step, "lossy": lossy, "method": method if not first else f"{method} (first, lossless)",
               "full_bytes": fb, "comp_bytes": len(blob), "ratio": fb / len(blob), "resumed_here": resumed,
               "eval_loss": eval_loss, "compress_s": round(ct, 3), "decompress_s": round(dt, 3), **_summ(stats)}
        if eval_recon and lossy:
            row["eval_loss_recon"] = _eval_arrays(opts, weights_of(recon), nb)
        elif eval_recon:
            row["eval_loss_recon"] = eval_loss
        ck_out.write([row])
        t_out.write([{"run": run, "step": step, "method": method, "lossy": lossy, **s} for s in stats])
        return recon, row

    # 1. the baseline run and its two chains
    t_start = time.time()
    base_chain = Chain(excp_cfg)
    base_rows, early_rows, early, prev_triples = [], {}, {}, None
    for i, (step, d) in enumerate(ckpts):
        triples = load_triples(d)
        if i == 0:
            n_params = int(sum(t["weight"].size for t in triples.values()))
        ev = _eval_arrays(opts, weights_of(triples), nb)
        if i == len(ckpts) - 1:
            _archivers(triples, base_chain.ref, excp_cfg, step, out_dir, log)
        recon, row = record("baseline", step, "excp", triples, base_chain, ev)
        base_rows.append(row)
        if i <= K:  # the compressed run is this run until it first resumes: keep what it needs
            early_rows[i] = dict(row)
            if i >= K - 1:
                early[i] = recon
        del recon
        # the lossless row of the paper's table: the residual against the previous checkpoint + the archiver
        # (every resume_every-th checkpoint: it is slow and does not change along the run)
        if prev_triples is not None and (i % K == 0 or i == len(ckpts) - 1):
            res_chain = Chain(lossless_cfg)
            res_chain.follow(prev_triples)
            record("baseline", step, "residual+archiver", triples, res_chain, ev, eval_recon=False)
        prev_triples = triples
        log(f"excp: baseline step {step}: eval {ev:.4f}, ExCP {row['ratio']:.1f}x "
            f"(recon eval {row['eval_loss_recon']:.4f})")
        del triples

    # 2. the compressed run: stop every K checkpoints and resume from the reconstruction (lossy.judge)
    chain = Chain(excp_cfg)
    comp_rows = []
    for stop in ResumedRun(ckpts, opts, K, out_dir, keep=ro["keep_checkpoints"], resume=_resume):
        i, step, resume = stop.i, stop.step, stop.resume
        if i < K or (i == K and resume):
            # identical to the baseline run until the first resume: its rows and reconstruction are reused
            row = {**early_rows[i], "run": "compressed", "resumed_here": resume}
            ck_out.write([row])
            comp_rows.append(row)
            if i in early:  # the chain's state after this checkpoint
                chain.follow(early[i])
            if resume:
                log(f"excp: compressed run step {step}: as the baseline run; resuming from the reconstruction")
                stop.recon = early[i]
            early.pop(i, None)
            continue
        triples = load_triples(stop.path)
        ev = _eval_arrays(opts, weights_of(triples), nb)
        recon, row = record("compressed", step, "excp", triples, chain, ev, resumed=resume)
        comp_rows.append(row)
        log(f"excp: compressed run step {step}: eval {ev:.4f}, recon eval {row['eval_loss_recon']:.4f}, "
            f"ExCP {row['ratio']:.1f}x" + (" -> resuming from the reconstruction" if resume else ""))
        if resume:
            stop.recon = recon
        del triples, recon
    ck_out.close()
    t_out.close()

    # 3. the sweep, on the baseline's last checkpoints
    sweep_rows = _sweep(ckpts, excp_cfg, ro, opts, nb, out_dir, log)

    # the ExCP rows after the first of each chain (lossy or not: the configuration may switch every lossy stage off)
    lossy_comp = [r for r in comp_rows if r["method"] == "excp"]
    lossy_base = [r for r in base_rows if r["method"] == "excp"]
    summary = {
        "lossy": _is_lossy(excp_cfg),
        "config": excp_cfg.to_dict(), "resume_every": K, "eval_batches": nb,
        "n_params": n_params,
        "steps": [s for s, _ in ckpts],
        "ratio_full": float(np.mean([r["ratio"] for r in lossy_comp])),
        "ratio_full_total": float(sum(r["full_bytes"] for r in lossy_comp) / sum(r["comp_bytes"] for r in lossy_comp)),
        "ratio_full_baseline_chain": float(np.mean([r["ratio"] for r in lossy_base])),
        "final_eval_loss_baseline": base_rows[-1]["eval_loss"],
        "final_eval_loss_compressed": comp_rows[-1]["eval_loss_recon"],
        "final_eval_loss_compressed_live": comp_rows[-1]["eval_loss"],
        "seconds": round(time.time() - t_start, 1),
    }
    summary["final_eval_loss_rel_diff"] = (summary["final_eval_loss_compressed"] / summary["final_eval_loss_baseline"]
                                           - 1.0)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(f"excp: ratio_full {summary['ratio_full']:.1f}x, final eval loss {summary['final_eval_loss_compressed']:.4f} "
        f"vs {summary['final_eval_loss_baseline']:.4f} uncompressed ({100 * summary['final_eval_loss_rel_diff']:+.2f}%)")
    summary["sweep_rows"] = len(sweep_rows)
    return summary


ARCHIVERS = [("none", None), ("zstd", 3), ("zstd", 9), ("zstd", 19), ("lzma", 1), ("lzma", 6), ("lzma", 9),
             ("lmc", None)]


def _archivers(triples: dict, ref: dict, cfg: ExCPConfig, step: int, out_dir: str, log) -> None:
    """The final stage's choice on one checkpoint: the same ExCP payload through each archiver."""
    import lzma

    import zstandard

    payload, _, _ = encode_checkpoint(triples, ref, ExCPConfig.from_dict({**cfg.to_dict(), "archiver": "none",
                                                                          "archiver_level": None}))
    fb = full_bytes(triples)
    out = CsvAppender(os.path.join(out_dir, "excp_archivers.csv"), ["step", "archiver", "level", "comp_bytes", "ratio",
                                                            "seconds"])
    for name, level in ARCHIVERS:
        t0 = time.perf_counter()
        if name == "none":
            n = len(payload)
        elif name == "zstd":
            n = len(zstandard.ZstdCompressor(level=level).compress(payload))
        elif name == "lzma":
            n = len(lzma.compress(payload, preset=level))
        else:
            import lmc

            n = len(lmc.compress(np.frombuffer(payload, np.uint8), threads=1))
        sec = time.perf_counter() - t0
        out.write([{"step": step, "archiver": name, "level": "" if level is None else level, "comp_bytes": n,
                   "ratio": fb / n, "seconds": round(sec, 3)}])
        log(f"excp archiver {name}{'' if level is None else '-' + str(level)}: {fb / n:.1f}x in {sec:.1f} s")
    out.close()


def _sweep(ckpts, base_cfg: ExCPConfig, ro: dict, opts: dict, nb: int, out_dir: str, log) -> list[dict]:
    sw = ro["sweep"]
    points = []
    for knob in ("alpha", "beta", "bits"):
        for v in sw.get(knob) or []:
            points.append((knob, ExCPConfig.from_dict({**base_cfg.to_dict(), knob: v})))
    if not points:
        return []
    points.insert(0, ("main", base_cfg))
    tail = ckpts[-(sw["steps"] + 1):]
    data = [load_triples(d) for _, d in tail]
    orig_eval = _eval_arrays(opts, weights_of(data[-1]), nb)
    rows = []
    out = CsvAppender(os.path.join(out_dir, "excp_sweep.csv"), SWEEP_COLUMNS)
    for knob, cfg in points:
        chain = Chain(cfg)
        per, sizes, last_recon = [], [], None
        for triples in data:
            blob, recon, stats, _, _, first = chain.add(triples)
            if not first:
                per.append((full_bytes(triples), stats))
                sizes.append(len(blob))
                last_recon = recon
        summ = [_summ(s) for _, s in per]
        row = {"knob": knob, "alpha": cfg.alpha, "beta": cfg.beta, "bits": cfg.bits,
               "steps": "/".join(str(s) for s, _ in tail[1:]),
               "ratio": float(np.mean([fb / sz for (fb, _), sz in zip(per, sizes)])),
               "ratio_total": sum(fb for fb, _ in per) / sum(sizes),
               "eval_loss_recon": _eval_arrays(opts, weights_of(last_recon), nb),
               "eval_loss_orig": orig_eval,
               **{k: float(np.mean([s[k] for s in summ])) for k in summ[0]}}
        out.write([row])
        rows.append(row)
        log(f"excp sweep {knob}: alpha {cfg.alpha:g} beta {cfg.beta:g} bits {cfg.bits}: {row['ratio']:.1f}x, "
            f"recon eval {row['eval_loss_recon']:.4f} (original {orig_eval:.4f})")
    out.close()
    return rows


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: lmcbench experiment=excp")
