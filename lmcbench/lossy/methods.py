"""The lossy methods written in the LMCL container (``LOSSY_FORMAT.md``), beside ExCP (:mod:`.excp`):

* ``adam8bit`` -- what 8-bit optimizers store: weights lossless (LMC, against the previous weights), ``exp_avg``
  blockwise absmax int8, ``exp_avg_sq`` a blockwise companded (log) 8-bit code.
* ``sz3`` / ``zfp`` -- the error-bounded compressors of scientific computing (``pysz``, ``zfpy``) on the
  residual of every array against the previous reconstruction; the bound per array is ``rel`` times the
  largest |residual|.
* ``bitsnap`` -- BitSnap-style (from the paper's description): the weights' residual sparsified to its
  ``keep`` largest fraction by a bitmask (kept values exact), both moments cluster-quantised (``bits``).
* ``efq`` -- ours: the weights' residual against the previous *reconstruction* uniformly quantised (what a
  checkpoint drops is still in the next residual: error feedback), the step per tensor set by Adam's second
  moment (a Fisher estimate: ``alloc=fisher``) or by the residual's RMS (``alloc=rms``); the codes coded by
  a context-adaptive binary range coder whose contexts are the neighbouring codes (``coder=ctx``, mode
  ``ctxq``) or by LMC's entropy coder or zstd (``coder=generic``), whichever is smallest; ``exp_avg`` at ``m_bits`` (0: dropped, a resumed run
  rebuilds it within ~1/(1-beta1) steps) and ``exp_avg_sq`` as one log code per block of ``v_block``.

Each is a :class:`~lmcbench.lossy.method.Method`: the first checkpoint of a chain (and any parameter the
previous reconstruction lacks) is stored lossless.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .arrays import F32, decode_array, encode_array
from .container import LossyFormatError, decode_section, pack, unpack
from .method import Method

KINDS = ("weight", "exp_avg", "exp_avg_sq")


def _stats(name, kind, mode, x, rec, ref, nbytes) -> dict:
    xf = x.astype(np.float64).reshape(-1)
    rf = rec.astype(np.float64).reshape(-1)
    nx = float(np.linalg.norm(xf)) if x.dtype.kind == "f" else 0.0
    err = float(np.linalg.norm(rf - xf)) if x.dtype.kind == "f" else 0.0
    if kind == "weight" and ref is not None and ref.shape == x.shape:
        kept = float(np.mean(rec.reshape(-1) != ref.reshape(-1))) if x.size else 1.0
    else:
        kept = float(np.mean(rec.reshape(-1) != 0)) if x.size else 1.0
    return {"name": name, "kind": kind, "mode": mode, "numel": int(x.size), "kept_fraction": kept,
            "pruned_fraction": 0.0, "rel_l2": err / nx if nx > 0 else (0.0 if err == 0 else float("inf")),
            "max_abs": float(np.max(np.abs(rf - xf), initial=0)) if x.dtype.kind == "f" else 0.0,
            "payload_bytes": int(nbytes)}


class LMCLMethod(Method):
    """A method written in the LMCL container: subclasses say per array which mode codes it
    (:meth:`plan`); framing, the lossless first checkpoint, decoding and stats are here."""

    Options = None  # a frozen dataclass of the method's options

    def __init__(self, opts=None):
        self.opts = self.Options() if opts is None else opts

    @classmethod
    def from_dict(cls, d: dict | None):
        d = dict(d or {})
        known = [f.name for f in dataclasses.fields(cls.Options)]
        bad = sorted(str(k) for k in d if k not in known)
        if bad:
            raise ConfigError(f"{cls.name}: unknown option(s) {', '.join(bad)} (known: {', '.join(known)})")
        try:
            return cls(cls.Options(**d))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{cls.name}: {e}") from None

    @property
    def setting(self) -> str:
        return ",".join(f"{f.name}={getattr(self.opts, f.name)}" for f in dataclasses.fields(self.opts))

    def prepare(self, triples: dict, prev: dict) -> None:
        """Per-checkpoint encoder state (e.g. global scales) before :meth:`plan` is asked per array."""

    def plan(self, name: str, kind: str, x: np.ndarray, ref: np.ndarray, triples: dict) -> tuple[str, dict]:
        raise NotImplementedError  # pragma: no cover - interface

    def encode(self, triples: dict, prev: dict | None):
        entries, stored, recon, stats = [], [], {}, []
        if prev is not None:
            self.prepare(triples, prev)
        for name, t in triples.items():
            p = prev.get(name) if prev is not None else None
            recon[name] = {}
            for kind in KINDS:
                x = t.get(kind)
                if x is None:
                    recon[name][kind] = None
                    continue
                x = np.asarray(x)
                ref = p.get(kind) if p is not None else None
                if ref is not None and (ref.shape != x.shape or ref.dtype != F32):
                    ref = None
                lossless = p is None or x.dtype != F32 or x.size == 0 or not np.all(np.isfinite(x)) \
                    or (kind == "weight" and ref is None)
                mode, kw = ("lossless", {}) if lossless else self.plan(name, kind, x, ref, triples)
                if ref is None and mode in ("uniform", "bitmask"):
                    mode, kw = "lossless", {}
                e, b, rec = encode_array(mode, x, ref, **kw)
                entries.append({"name": name, "kind": kind, **e})
                stored += b
                recon[name][kind] = rec
                stats.append(_stats(name, kind, e["mode"], x, rec, ref, sum(len(s) for s in b)))
        return pack(self.name, self.setting, entries, stored), recon, stats

    def decode(self, blob, prev: dict | None) -> dict:
        toc, items = unpack(blob, self.name)
        recon: dict = {}
        for e, views in items:
            name, kind = e["name"], e["kind"]
            ref = None
            if prev is not None and isinstance(prev.get(name), dict):
                ref = prev[name].get(kind)
            try:
                secs = [decode_section(d, v) for d, v in zip(e["sections"], views)]
                arr = decode_array(e, secs, ref)
            except LossyFormatError as err:
                raise LossyFormatError(f"{name} {kind}: {err}") from None
            except Exception as err:  # noqa: BLE001 - third-party decoders raise anything on hostile input
                msg = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise LossyFormatError(f"{name} {kind}: corrupt section ({msg})") from None
            recon.setdefault(name, {"weight": None, "exp_avg": None, "exp_avg_sq": None})[kind] = arr
        return recon


def _positive(name, v, integer=False, lo=0.0):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= lo \
            or (integer and not isinstance(v, int)):
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {v!r}")


# ------------------------------------------------------------------------------------------ 8bit
@dataclass(frozen=True)
class Q8Options:
    block: int = 256   # elements per block (one float32 scale each)
    spo: int = 8       # exp_avg_sq's log code: steps per octave (255 codes: 2**(-254/spo) of the block max)

    def __post_init__(self):
        _positive("block", self.block, True)
        _positive("spo", self.spo, True)
        if self.spo > 64:
            raise ValueError("spo must be at most 64")


class Q8Method(LMCLMethod):
    name = "adam8bit"
    Options = Q8Options

    def plan(self, name, kind, x, ref, triples):
        if kind == "weight":
            return "lossless", {}
        if kind == "exp_avg":
            return "absmax", {"block": self.opts.block, "bits": 8}
        return "logblock", {"block": self.opts.block, "spo": self.opts.spo, "per_element": True}


# --------------------------------------------------------------------------------------- sz3, zfp
@dataclass(frozen=True)
class BoundOptions:
    rel: float = 1e-3  # error bound per array: rel * max |residual|

    def __post_init__(self):
        _positive("rel", self.rel)


def _bound(x, ref, rel):
    d = x if ref is None else x.astype(np.float64) - ref
    return float(rel * np.max(np.abs(d), initial=0))


class SZ3Method(LMCLMethod):
    name = "sz3"
    Options = BoundOptions

    def plan(self, name, kind, x, ref, triples):
        return "sz3", {"eb": _bound(x, ref, self.opts.rel), "floor0": kind == "exp_avg_sq"}


class ZFPMethod(LMCLMethod):
    name = "zfp"
    Options = BoundOptions

    def plan(self, name, kind, x, ref, triples):
        return "zfp", {"tol": _bound(x, ref, self.opts.rel), "floor0": kind == "exp_avg_sq"}


# --------------------------------------------------------------------------------------- bitsnap
@dataclass(frozen=True)
class BitSnapOptions:
    keep: float = 0.1  # fraction of the weights' residual kept (largest |residual|)
    bits: int = 4      # moments: 2**bits - 1 clusters

    def __post_init__(self):
        _positive("keep", self.keep)
        _positive("bits", self.bits, True)
        if self.keep > 1 or not 2 <= self.bits <= 8:
            raise ValueError("keep must lie in (0, 1] and bits in 2..8")


class BitSnapMethod(LMCLMethod):
    name = "bitsnap"
    Options = BitSnapOptions

    def plan(self, name, kind, x, ref, triples):
        if kind == "weight":
            return "bitmask", {"keep": self.opts.keep}
        return "cluster", {"bits": self.opts.bits, "log": kind == "exp_avg_sq"}


# ------------------------------------------------------------------------------------------ ours
@dataclass(frozen=True)
class EFQOptions:
    q: float = 1.0          # the weights' quantisation step, in units of the residual's RMS (see alloc)
    alloc: str = "fisher"   # fisher: step per tensor ~ 1/sqrt(mean exp_avg_sq), clipped to 8x either way; rms
    m_bits: int = 0         # exp_avg: 0 dropped, else blockwise absmax at this many bits (2..8)
    v_block: int = 64       # exp_avg_sq: one log code per block of this many elements (1: per element)
    coder: str = "ctx"      # the weights' codes: ctx (context coder, LMCL version 2) or generic (lmc / zstd)
    recon: str = "mid"      # ctx: a code decodes to its bin's middle (mid: as generic), its bin's mean (mean), or
    #                         the middle times the gain that keeps the residual along itself (gain)

    def __post_init__(self):
        _positive("q", self.q)
        _positive("v_block", self.v_block, True)
        if self.coder not in ("ctx", "generic"):
            raise ValueError(f"coder must be ctx or generic, got {self.coder!r}")
        if self.recon not in ("mid", "mean", "gain") or (self.recon != "mid" and self.coder != "ctx"):
            raise ValueError(f"recon must be mid, mean or gain (mean and gain need coder=ctx), got {self.recon!r}")
        if self.alloc not in ("fisher", "rms"):
            raise ValueError(f"alloc must be fisher or rms, got {self.alloc!r}")
        if isinstance(self.m_bits, bool) or not isinstance(self.m_bits, int) or self.m_bits not in (0, *range(2, 9)):
            raise ValueError(f"m_bits must be 0 or 2..8, got {self.m_bits!r}")


class EFQMethod(LMCLMethod):
    name = "efq"
    Options = EFQOptions

    def prepare(self, triples, prev):
        """The global residual RMS and mean second moment of the weights (float32 tensors with a reference)."""
        ss = n = vs = 0.0
        for name, t in triples.items():
            p = prev.get(name)
            w = t.get("weight")
            if p is None or w is None or p.get("weight") is None or p["weight"].shape != w.shape or w.dtype != F32:
                continue
            d = w.astype(np.float64) - p["weight"]
            ss += float(np.sum(d * d))
            n += d.size
            if t.get("exp_avg_sq") is not None:
                vs += float(np.sum(t["exp_avg_sq"], dtype=np.float64))
        self._rms = math.sqrt(ss / n) if n else 0.0
        self._vbar = vs / n if n else 0.0

    def plan(self, name, kind, x, ref, triples):
        o = self.opts
        if kind == "weight":
            d = x.astype(np.float64) - ref
            rms = float(np.sqrt(np.mean(d * d))) if d.size else 0.0
            if rms == 0 or self._rms == 0:
                return "lossless", {}
            v = triples[name].get("exp_avg_sq")
            if o.alloc == "fisher" and v is not None and self._vbar > 0 and np.mean(v) > 0:
                f = min(8.0, max(1 / 8, math.sqrt(self._vbar / float(np.mean(v, dtype=np.float64)))))
                step = o.q * self._rms * f
            else:
                step = o.q * rms
            return "uniform", {"step": step, "ctx": o.coder == "ctx", "table": o.recon}
        if kind == "exp_avg":
            return ("zero", {}) if o.m_bits == 0 else ("absmax", {"block": 256, "bits": o.m_bits})
        return "logblock", {"block": o.v_block, "spo": 8, "per_element": o.v_block == 1}


METHODS = {m.name: m for m in (Q8Method, SZ3Method, ZFPMethod, BitSnapMethod, EFQMethod)}
OPTIONAL = {"sz3": "pysz", "zfp": "zfpy"}  # the packages a method needs beyond lmcbench's own


def missing_package(method: str) -> str | None:
    """The package a method needs that is not installed (None when it can run)."""
    import importlib.util

    pkg = OPTIONAL.get(method)
    return pkg if pkg and importlib.util.find_spec(pkg) is None else None
