"""A lossy *chain*: checkpoints compressed in step order, the first whole and lossless, each later one coded
against the *reconstruction* of the previous one; and its decoding, in the same order.

The chain is a driver over a lossy method (:mod:`lmcbench.lossy.method`: one checkpoint and the previous
reconstruction in, one container out; ExCP, :mod:`lmcbench.lossy.excp`, is one) and the checkpoint formats; the experiment (:mod:`lmcbench.lossy.run`) and ``lmcbench-excp``
(:mod:`lmcbench.lossy.cli`) both walk their checkpoints through it. A checkpoint here is a dict
``name -> {"weight", "exp_avg", "exp_avg_sq"}`` of numpy arrays (a moment may be None).
"""

from __future__ import annotations

import time

import numpy as np

from .excp import ExCPConfig
from .method import as_method, weights_of  # noqa: F401 - weights_of: imported from here too


def full_bytes(triples: dict) -> int:
    """Bytes of a checkpoint's arrays as they are (weights and both moments): the ratio's numerator."""
    return sum(a.nbytes for t in triples.values() for a in t.values() if a is not None)


def is_lossy(cfg) -> bool:
    """A residual is lossy unless the method is configured bit-exact (ExCP: pruning and quantisation all off)."""
    return as_method(cfg).lossy


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
    """One chain being written by a lossy method (an :class:`ExCPConfig` is taken as the ExCP method): each
    checkpoint coded against the previous reconstruction.

    ``prev`` is the previous reconstruction (None before the first checkpoint), ``ref`` its weights;
    :meth:`follow` continues the chain from a checkpoint reconstructed elsewhere.
    """

    def __init__(self, method):
        self.method = as_method(method)
        self.prev = None

    @property
    def cfg(self):
        """The ExCP configuration of an ExCP chain (None for another method)."""
        return getattr(self.method, "cfg", None)

    @property
    def ref(self) -> dict | None:
        return weights_of(self.prev)

    @property
    def lossy(self) -> bool:
        return self.method.lossy

    def follow(self, triples: dict) -> None:
        """Make ``triples`` (a reconstruction, or an original for a lossless residual) the reference."""
        self.prev = triples

    def add(self, triples: dict):
        """Encode one checkpoint, decode the container again and check it gives the encoder's reconstruction;
        returns ``(blob, recon, stats, compress_s, decompress_s, first)``."""
        t0 = time.perf_counter()
        blob, recon, stats = self.method.encode(triples, self.prev)
        ct = time.perf_counter() - t0
        t0 = time.perf_counter()
        dec = self.method.decode(blob, self.prev)
        dt = time.perf_counter() - t0
        if not same_checkpoint(dec, recon):
            raise RuntimeError(f"{self.method.name}: the decoded checkpoint differs from the encoder's reconstruction")
        first = self.prev is None
        self.follow(recon)
        return blob, recon, stats, ct, dt, first


class ChainDecoder:
    """One chain being read: each container decoded against the previous reconstruction (ExCP by default)."""

    def __init__(self, method=None):
        self.method = as_method(ExCPConfig() if method is None else method)
        self.prev = None

    @property
    def ref(self) -> dict | None:
        return weights_of(self.prev)

    def decode(self, blob: bytes) -> dict:
        recon = self.method.decode(blob, self.prev)
        self.prev = recon
        return recon
