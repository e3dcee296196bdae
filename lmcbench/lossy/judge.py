"""The resumed-training judge of a lossy method, shared by ``experiment=excp`` and ``experiment=lossy``.

A tinygpt series can be trained again, so a method is judged the way ExCP's authors judge theirs: the same
training (same seed, same data order) stops every ``resume_every`` checkpoints, compresses its checkpoint,
writes the *reconstruction* as a checkpoint folder and resumes from it. Until the first stop it is the
uncompressed run, so those checkpoints are the series' own. The final held-out loss of the run's last
checkpoint, as reconstructed, against the uncompressed run's is the method's loss change.

* :class:`ResumedRun` walks the compressed run's checkpoints (training between them where needed) and resumes
  from the reconstruction the caller hands back at each stop; it knows nothing of any method.
* :func:`judge_resumed` and :func:`judge_reconstruction` run one method's chain through it (or over the
  series as it is) and return one row per checkpoint.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

import numpy as np

from lmc.formats.trainer_folder import load_triples

from ..errors import ConfigError
from ..tinygpt.series import Series, ensure_series

from .chain import Chain, full_bytes, summarize, weights_of


def eval_arrays(opts: dict, weights: dict, n_batches: int) -> float:
    """Held-out loss of a model given as name -> weight array (tinygpt's evaluation, fixed windows)."""
    import torch

    from ..tinygpt import build_model, evaluate

    state = torch.random.get_rng_state()
    try:
        model = build_model(opts)
    finally:
        torch.random.set_rng_state(state)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(weights[name])))
    return float(evaluate(model, opts, n_batches=n_batches))


def resume_from(src_dir: str, recon: dict, out_dir: str, opts: dict, device: str = "cpu"):
    """Write the reconstruction as a checkpoint folder the trainer reads (the original's scheduler, step and
    data position; the reconstructed weights and moments) under ``out_dir/reconstructed`` and return a trainer
    resumed from that folder, its arithmetic on ``device``."""
    from ..tinygpt import Trainer

    live = Trainer.from_checkpoint(src_dir, opts)
    live.load_state(weights_of(recon), {n: r["exp_avg"] for n, r in recon.items()},
                    {n: r["exp_avg_sq"] for n, r in recon.items()})
    path = live.save_checkpoint(os.path.join(out_dir, "reconstructed"))
    del live
    return Trainer.from_checkpoint(path, opts, device=device)


@dataclass
class Stop:
    """One checkpoint of the compressed run: its index in the series, step, folder, whether the run resumes
    from its reconstruction here (then the caller sets ``recon``), and whether it is the series' own."""

    i: int
    step: int
    path: str
    resume: bool
    from_series: bool
    recon: dict | None = None


class ResumedRun:
    """The compressed run of a series: iterate to get each :class:`Stop`; at a stop with ``resume`` set the
    caller puts the reconstruction in ``stop.recon`` before asking for the next one. Checkpoints trained here
    go to ``out_dir/compressed_run`` and are removed once passed unless ``keep``."""

    def __init__(self, ckpts: list, opts: dict, resume_every: int, out_dir: str, keep: bool = False,
                 resume=None, device: str = "cpu"):
        self.ckpts, self.opts, self.K, self.out_dir, self.keep = ckpts, opts, resume_every, out_dir, keep
        self.work = os.path.join(out_dir, "compressed_run")
        self._resume = resume or (lambda src, recon, out, opts: resume_from(src, recon, out, opts, device))

    def resumes_at(self, i: int) -> bool:
        return i > 0 and i % self.K == 0 and i < len(self.ckpts) - 1

    def __iter__(self):
        trainer = None
        for i, (step, d) in enumerate(self.ckpts):
            if trainer is None:
                src = d
            else:
                trainer.train_until(step, out_dir=self.work, save=True)
                src = os.path.join(self.work, f"checkpoint-{step}")
            stop = Stop(i, step, src, self.resumes_at(i), trainer is None)
            yield stop
            if stop.resume:
                if stop.recon is None:
                    raise RuntimeError(f"resumed run: no reconstruction handed back at step {step}")
                trainer = self._resume(src, stop.recon, self.out_dir, self.opts)
            stop.recon = None
            if src.startswith(self.work) and not self.keep:
                shutil.rmtree(src, ignore_errors=True)
        if not self.keep:
            shutil.rmtree(os.path.join(self.out_dir, "reconstructed"), ignore_errors=True)
            shutil.rmtree(self.work, ignore_errors=True)


def _row(method, judged, step, triples, out, resumed, ev, recon_ev, base_ev):
    blob, recon, stats, ct, dt, first = out
    fb = full_bytes(triples)
    return {"method": method.name, "setting": method.setting, "judged": judged, "step": step,
            "first": first, "lossy": (not first) and method.lossy, "full_bytes": fb, "comp_bytes": len(blob),
            "ratio": fb / len(blob), "resumed_here": resumed, "eval_loss": ev, "eval_loss_recon": recon_ev,
            "baseline_loss": base_ev, "compress_s": round(ct, 3), "decompress_s": round(dt, 3), **summarize(stats)}


def judge_resumed(method, ckpts: list, opts: dict, resume_every: int, n_batches: int, out_dir: str,
                  base_evals: dict, log=print, eval_every: bool = False, device: str = "cpu") -> list[dict]:
    """One method judged by resumed training: one row per checkpoint of the compressed run (``judged`` =
    ``resumed``). The held-out loss of the reconstruction is measured at the last checkpoint and at every
    resume (at every checkpoint with ``eval_every``); the live model's wherever the run left the series."""
    chain, rows, run = Chain(method), [], ResumedRun(ckpts, opts, resume_every, out_dir, device=device)
    t0 = time.time()
    for stop in run:
        triples = load_triples(stop.path)
        out = chain.add(triples)
        recon = out[1]
        last = stop.i == len(ckpts) - 1
        ev = base_evals.get(stop.step) if stop.from_series else eval_arrays(opts, weights_of(triples), n_batches)
        rev = eval_arrays(opts, weights_of(recon), n_batches) if (last or stop.resume or eval_every) else None
        rows.append(_row(method, "resumed", stop.step, triples, out, stop.resume, ev, rev, base_evals.get(stop.step)))
        if stop.resume:
            stop.recon = recon
        del triples, out, recon
    log(f"lossy: {method.label}: resumed run done in {time.time() - t0:.0f} s, final loss "
        f"{rows[-1]['eval_loss_recon']:.4f} vs {rows[-1]['baseline_loss']:.4f}")
    return rows


def judge_reconstruction(method, ckpts: list, opts: dict, n_batches: int, base_evals: dict,
                         log=print) -> list[dict]:
    """One method's chain over the uncompressed series (no training after any reconstruction; ``judged`` =
    ``reconstruction``): one row per checkpoint, the reconstruction's loss at the last one."""
    chain, rows = Chain(method), []
    for i, (step, d) in enumerate(ckpts):
        triples = load_triples(d)
        out = chain.add(triples)
        rev = eval_arrays(opts, weights_of(out[1]), n_batches) if i == len(ckpts) - 1 else None
        rows.append(_row(method, "reconstruction", step, triples, out, False, base_evals.get(step), rev,
                         base_evals.get(step)))
        del triples, out
    return rows


def frontier_row(rows: list[dict]) -> dict:
    """The frontier's row of one (method, setting, judged): the ratio is the mean over the chain's lossy
    checkpoints (all but the first, which is stored whole and lossless), ``ratio_total`` in total bytes; the
    final loss is the last checkpoint's reconstruction's."""
    later = [r for r in rows if not r["first"]] or rows
    last = rows[-1]
    return {"method": last["method"], "setting": last["setting"],
            "ratio": float(np.mean([r["ratio"] for r in later])),
            "ratio_total": sum(r["full_bytes"] for r in later) / sum(r["comp_bytes"] for r in later),
            "final_loss": last["eval_loss_recon"], "baseline_loss": last["baseline_loss"],
            "loss_change_pct": 100.0 * (last["eval_loss_recon"] / last["baseline_loss"] - 1.0),
            "judged": last["judged"], "checkpoints": len(later),
            "weight_rel_l2": float(np.mean([r["weight_rel_l2"] for r in later])),
            "exp_avg_rel_l2": float(np.mean([r["exp_avg_rel_l2"] for r in later])),
            "exp_avg_sq_rel_l2": float(np.mean([r["exp_avg_sq_rel_l2"] for r in later]))}


def open_series(source: dict, experiment: str, hint: str = "") -> Series:
    """The tinygpt series a ``source`` config names (``cache_dir``, ``train``, ``path``, ``steps``; the
    selection options do not apply to a whole-checkpoint method); another source type is refused: a lossy
    experiment resumes training from its reconstructions."""
    if source.get("type") != "tinygpt":
        raise ConfigError(f"experiment={experiment} resumes training, so it needs a tinygpt source "
                          f"(source=tinygpt or tinygpt_large){hint}")
    return Series.from_options(**{k: source.get(k) for k in ("cache_dir", "train", "path", "steps")})


def checkpoints_of(source: Series, experiment: str) -> list:
    """The series' (step, folder) pairs it selects, trained first if it is not cached; at least two."""
    ensure_series(source.path, source.train_opts)
    ckpts = [(s, d) for s, d in source.checkpoints() if source.steps is None or s in source.steps]
    if len(ckpts) < 2:
        raise ConfigError(f"experiment={experiment} needs a series of at least 2 checkpoints")
    return ckpts

