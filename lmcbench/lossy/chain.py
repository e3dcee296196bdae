"""An ExCP *chain*: checkpoints compressed in step order, the first whole and lossless, each later one a
residual against the *reconstruction* of the previous one; and its decoding, in the same order.

The chain is a driver over the codec (:mod:`lmcbench.lossy.excp`: one checkpoint in, one container out) and
the checkpoint formats; the experiment (:mod:`lmcbench.lossy.run`) and ``lmcbench-excp``
(:mod:`lmcbench.lossy.cli`) both walk their checkpoints through it. A checkpoint here is a dict
``name -> {"weight", "exp_avg", "exp_avg_sq"}`` of numpy arrays (a moment may be None).
"""

from __future__ import annotations

import time

import numpy as np

from .excp import ExCPConfig, decode_checkpoint, encode_checkpoint


def weights_of(triples: dict) -> dict:
    """``name -> weight`` of a checkpoint: what the next checkpoint of a chain is a residual against."""
    return {n: t["weight"] for n, t in triples.items()}


def full_bytes(triples: dict) -> int:
    """Bytes of a checkpoint's arrays as they are (weights and both moments): the ratio's numerator."""
    return sum(a.nbytes for t in triples.values() for a in t.values() if a is not None)


def is_lossy(cfg: ExCPConfig) -> bool:
    """A residual is lossy unless pruning and quantisation are all off (then it is bit-exact)."""
    return bool(cfg.prune_weights or cfg.prune_moments or cfg.quantize)


def summarize(stats: list[dict]) -> dict:
    """Size-weighted reconstruction error and kept fractions of one checkpoint, per kind."""
    out = {}
    for kind in ("weight", "exp_avg", "exp_avg_sq"):
        s = [x for x in stats if x["kind"] == kind]
        n = sum(x["numel"] for x in s) or 1
        # the numel-weighted mean of the per-tensor relative L2 errors
        out[f"{kind}_rel_l2"] = sum(x["rel_l2"] * x["numel"] for x in s if np.isfinite(x["rel_l2"])) / n
        out[f"{kind}_kept"] = sum(x["kept_fraction"] * x["numel"] for x in s) / n
    out["moment_kept"] = (out.pop("exp_avg_kept") + out.pop("exp_avg_sq_kept")) / 2
    return out


def mode_counts(stats: list[dict]) -> dict:
    """``kind -> mode -> number of arrays`` of one checkpoint's per-array stats."""
    out: dict[str, dict[str, int]] = {}
    for s in stats:
        out.setdefault(s["kind"], {}).setdefault(s["mode"], 0)
        out[s["kind"]][s["mode"]] += 1
    return out


def same_checkpoint(a: dict, b: dict) -> bool:
    """Bit-exact equality of two decoded checkpoints: same names and kinds, and per array the same dtype, shape
    and bytes (0-dim arrays such as a scalar parameter included)."""
    def same(x, y) -> bool:
        if x is None or y is None:
            return x is None and y is None
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        return np.array_equal(np.ascontiguousarray(x).reshape(-1).view(np.uint8),
                              np.ascontiguousarray(y).reshape(-1).view(np.uint8))

    return a.keys() == b.keys() and all(a[n].keys() == b[n].keys() and all(same(a[n][k], b[n][k]) for k in a[n])
                                        for n in a)


class Chain:
    """One ExCP chain being written: each checkpoint a residual against the previous reconstruction.

    ``ref`` is the previous reconstruction's weights (None before the first checkpoint); :meth:`follow`
    continues the chain from a checkpoint reconstructed elsewhere.
    """

    def __init__(self, cfg: ExCPConfig):
        self.cfg = cfg
        self.ref = None

    def follow(self, triples: dict) -> None:
        """Make ``triples`` (a reconstruction, or an original for a lossless residual) the reference."""
        self.ref = weights_of(triples)

    def add(self, triples: dict):
        """Encode one checkpoint, decode the container again and check it gives the encoder's reconstruction;
        returns ``(blob, recon, stats, compress_s, decompress_s, first)``."""
        t0 = time.perf_counter()
        blob, recon, stats = encode_checkpoint(triples, self.ref, self.cfg)
        ct = time.perf_counter() - t0
        t0 = time.perf_counter()
        dec = decode_checkpoint(blob, self.ref)
        dt = time.perf_counter() - t0
        if not same_checkpoint(dec, recon):
            raise RuntimeError("excp: the decoded checkpoint differs from the encoder's reconstruction")
        first = self.ref is None
        self.follow(recon)
        return blob, recon, stats, ct, dt, first


class ChainDecoder:
    """One ExCP chain being read: each container decoded against the previous reconstruction."""

    def __init__(self):
        self.ref = None

    def decode(self, blob: bytes) -> dict:
        recon = decode_checkpoint(blob, self.ref)
        self.ref = weights_of(recon)
        return recon
