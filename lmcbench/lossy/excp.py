"""ExCP: lossy checkpoint compression by weight-momentum joint shrinking (Li et al., ICML 2024).

Pure numpy re-implementation of the codec as the authors run it, for one checkpoint of a chain of
checkpoints. ``W`` is a weight (float32), ``m`` its Adam ``exp_avg`` and ``v`` its ``exp_avg_sq``.

Algorithm (per parameter tensor)
--------------------------------
1. Residual against the *reconstructed* previous checkpoint: ``dW = W_t - W_ref`` (float32). The caller
   passes ``W_ref``; in a chain it must be the ``recon`` that encoding the previous checkpoint returned.
2. Weight pruning: ``s = min(max_scale, alpha / sqrt(mean(v)))`` (one scalar per tensor; ``s = max_scale``
   when ``mean(v)`` is 0 or not finite); keep ``dW`` where ``|dW| > median(|dW|) * s``.
   The median of an even count is the mean of the two middle values, computed in float64.
3. Moment pruning: keep ``m`` and ``v`` where ``|m| > beta * mean(|m|)`` AND the pruned ``dW`` is
   non-zero (one mask for both moments); zero elsewhere.
4. Non-uniform quantisation of the pruned ``dW``, ``m`` and ``v`` (each on its own): 1-D k-means on the
   non-zero values with ``2**bits - 1`` centroids; index 0 means zero, indices ``1..2**bits-1`` point
   into the centroid table. k-means runs on a seeded random subset of at most
   ``samples_per_centroid`` points per centroid, is initialised at the sample's quantiles
   ``(i + 0.5) / K``, re-seeds empty clusters at the sample points farthest from their centroid, and stops
   after ``kmeans_iters`` Lloyd iterations or earlier when nothing moves. Lloyd's local optima (two
   centroids sharing a cluster while two clusters share a centroid) are then repaired by deterministic
   merge-one-pair / split-one-cluster swaps, each followed by another Lloyd run and kept only when the
   squared error drops by more than 0.01 %. Centroids are stored as float16;
   every non-zero is then assigned to the nearest *stored* centroid (sorted table, ``np.searchsorted`` on
   the midpoints), so encoder and decoder agree bit for bit.

   Centroid scale (``scale_centroids``, default on; a deviation from "plain float16"): Adam's ``v`` is
   typically 1e-12..1e-6, below float16's smallest subnormal (6e-8), so plain float16 centroids would
   flush it to zero. With ``scale_centroids`` each table carries a power-of-two exponent ``e``
   (``max|x| * 2**-e`` lies in [2**14, 2**15)) and a centroid decodes to ``float32(c16) * 2**e``
   (``np.ldexp``): float16 precision, float32 range. ``scale_centroids=False`` stores plain float16
   (values clipped to +-65504) and decodes ``float32(c16)``.
5. Final archiver over the whole packed payload: ``lzma`` (xz, the 7-Zip stand-in), ``zstd``, ``lmc``
   (our lossless codec, on the payload as a uint8 array) or ``none``.
6. Reconstruction: ``W_t = W_ref + dequant(dW)`` (float32 add, only where the index is non-zero, so a
   pruned position keeps the exact bits of ``W_ref``); moments are the dequantised ``m`` and ``v``.

Special cases
-------------
* First checkpoint of a chain (``ref_weights is None``), or a parameter absent from ``ref_weights``: every
  array of that parameter is stored whole and lossless (mode ``raw``).
* Arrays that are not float32 (integer buffers, bf16/fp16 weights, ...) and empty arrays: ``raw``.
  A parameter whose *weight* is not float32 is stored ``raw`` entirely (moment pruning needs the weight
  mask).
* A weight without ``exp_avg_sq`` cannot be weight-pruned: its residual is kept wherever it changed and
  then quantised like any other. Without ``exp_avg`` the moments are not pruned (``v`` is quantised
  unpruned).
* "Kept as is": a tensor with at most ``2**bits - 1`` non-zeros after pruning, or whose non-zeros are not
  all finite (k-means cannot place inf/nan), is stored ``exact``: positions + float32 values, no table.
* Exact values of a *weight* are the values of ``W_t`` itself, not of ``dW``: float32 ``W_ref + (W_t -
  W_ref)`` is not always ``W_t`` (``ref=1e8, W=1`` gives 0), so storing ``W_t`` at the kept positions is
  what makes the exact mode bit-exact. The reconstruction is ``W_ref`` with those positions replaced.
* ``quantize=False`` stores every kept value exactly (mode ``exact``). With pruning off as well, the kept
  set is "every position whose bits differ from ``W_ref``" for weights and "every position whose bits are
  not +0.0" for moments, so ``W``, ``m`` and ``v`` come back bit-exact (-0.0, subnormals, inf and nan
  payloads included).

Container format (all integers little-endian)
---------------------------------------------
Header, 32 bytes (``struct`` ``<4sBBHQQII``):

=====  ====  ===========================================================
off    size  field
=====  ====  ===========================================================
0      4     magic ``b"ExCP"``
4      1     format version, 1
5      1     archiver id: 0 none, 1 lzma (xz container), 2 zstd, 3 lmc
6      2     reserved, 0
8      8     ``raw_len``: payload length after un-archiving
16     8     ``archived_len``: bytes that follow the header (the blob ends there exactly)
24     4     CRC-32 (``zlib.crc32``) of the payload
28     4     CRC-32 of the archived bytes (checked before the archiver sees them)
=====  ====  ===========================================================

Payload (what the archiver compresses): ``u32 toc_len``, ``toc_len`` bytes of UTF-8 JSON (the table of
contents), then the data region: the binary sections, back to back, in TOC order, with no gaps and
nothing after the last. No pickle anywhere. The TOC::

    {"format": "excp", "version": 1, "config": {...the ExCPConfig, for provenance...},
     "params": [{"name": str, "arrays": [entry, ...]}, ...]}

Each parameter lists its ``weight`` entry first, then optionally ``exp_avg`` / ``exp_avg_sq`` (same shape
as the weight). An entry is ``{"kind", "dtype", "shape", "mode", "sections": [[offset, length], ...]}``
(offsets relative to the data region) plus mode fields:

* ``raw`` -- one section: the array's bytes (C order, little-endian). Lossless, any supported dtype.
* ``zero`` -- no section; float32. A weight decodes to ``W_ref``, a moment to zeros.
* ``exact`` -- float32; fields ``count`` and ``positions`` (``"mask"``: ``ceil(numel/8)`` bytes of
  ``np.packbits`` bits, MSB first, pad bits zero; ``"u32"`` / ``"u64"``: strictly increasing flat
  indices); sections ``[positions, values]`` with ``count`` float32 values. Weights: ``W_ref`` with the
  values written at the positions; moments: zeros with the values written.
* ``quant`` -- float32; fields ``bits`` (2..8), ``n_centroids`` (1..2**bits-1, the table may be shorter
  than 2**bits-1 after dropping float16 duplicates) and ``exponent`` (the centroid scale, 0 when
  unscaled); sections ``[centroids, indices]``: ``n_centroids`` strictly increasing finite float16 values,
  then ``ceil(numel*bits/8)`` bytes of indices packed MSB first (for bits=4: two per byte, the first in
  the high nibble), pad bits zero, every index <= ``n_centroids``.

The decoder treats a blob as hostile: every length, offset, shape, type and index is checked before it is
used, and any problem raises one-line :class:`ExCPFormatError`. Allocations are bounded by the blob (the
payload is decompressed incrementally up to ``raw_len``, itself capped at ``MAX_PAYLOAD_BYTES``; with
``lmc`` the declared size must match lmc's own chunk table), by the caller's reference weights, or by a
section's length.

Configuration (:class:`ExCPConfig`)
-----------------------------------
``alpha`` (5e-5), ``max_scale`` (2.5): the weight-pruning scale. ``beta`` (2.0): the moment-pruning
factor. ``bits`` (4, in 2..8): bits per quantisation index. ``kmeans_iters`` (25),
``samples_per_centroid`` (256), ``seed`` (0): k-means. ``archiver`` ("lzma" | "zstd" | "lmc" | "none")
and ``archiver_level`` (None = 9 for lzma presets 0..9, 19 for zstd levels 1..22; must be None for lmc
and none). ``prune_weights``, ``prune_moments``, ``quantize`` (all True): switch the stages off for
ablations. ``scale_centroids`` (True): the power-of-two centroid scale described above.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import math
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, LmcbenchError

__all__ = [
    "ExCPConfig", "ExCPError", "ExCPFormatError", "Quantized",
    "prune_weight_mask", "prune_moment_mask", "kmeans_1d", "quantize", "dequantize",
    "pack_bits", "unpack_bits", "encode_checkpoint", "decode_checkpoint",
]


class ExCPError(LmcbenchError):
    """Invalid input given to the ExCP encoder or decoder (not a configuration problem)."""


class ExCPFormatError(ExCPError):
    """A blob that is not a valid ExCP container, or reference weights that do not fit it."""


MAGIC = b"ExCP"
VERSION = 1
_HEADER = struct.Struct("<4sBBHQQII")
HEADER_SIZE = _HEADER.size  # 32
MAX_PAYLOAD_BYTES = 1 << 35  # 32 GiB: the largest payload a blob may declare
_LMC_CHUNK = 131072  # chunk size (elements) used for the lmc archiver; the decoder requires it
_ARCHIVERS = {"none": 0, "lzma": 1, "zstd": 2, "lmc": 3}
_ARCHIVER_NAMES = {v: k for k, v in _ARCHIVERS.items()}
_LEVELS = {"lzma": (9, 0, 9), "zstd": (19, 1, 22)}  # default, lo, hi
KINDS = ("weight", "exp_avg", "exp_avg_sq")
_F32 = np.dtype(np.float32)


# ----------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ExCPConfig:
    """Every knob of the codec; see the module docstring. Construct via :meth:`from_dict` for checked input."""

    alpha: float = 5e-5
    beta: float = 2.0
    bits: int = 4
    max_scale: float = 2.5
    kmeans_iters: int = 25
    samples_per_centroid: int = 256
    seed: int = 0
    archiver: str = "lzma"
    archiver_level: int | None = None
    prune_weights: bool = True
    prune_moments: bool = True
    quantize: bool = True
    scale_centroids: bool = True

    def __post_init__(self):
        def num(name, lo, strict=False):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
                    or x < lo or (strict and x == lo):
                rel = ">" if strict else ">="
                raise ConfigError(f"excp: {name} must be a finite number {rel} {lo}, got {x!r}")

        def integer(name, lo, hi):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not lo <= x <= hi:
                raise ConfigError(f"excp: {name} must be an integer in [{lo}, {hi}], got {x!r}")

        num("alpha", 0.0)
        num("beta", 0.0)
        num("max_scale", 0.0)
        integer("bits", 2, 8)
        integer("kmeans_iters", 0, 10_000)
        integer("samples_per_centroid", 1, 1 << 24)
        integer("seed", 0, (1 << 63) - 1)
        for name in ("prune_weights", "prune_moments", "quantize", "scale_centroids"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"excp: {name} must be true or false, got {getattr(self, name)!r}")
        if self.archiver not in _ARCHIVERS:
            raise ConfigError(f"excp: unknown archiver {self.archiver!r} (known: {', '.join(_ARCHIVERS)})")
        if self.archiver in _LEVELS:
            if self.archiver_level is not None:
                integer("archiver_level", *_LEVELS[self.archiver][1:])
        elif self.archiver_level is not None:
            raise ConfigError(f"excp: archiver {self.archiver!r} takes no level, got {self.archiver_level!r}")

    @property
    def level(self) -> int | None:
        """The archiver level in effect (the default when ``archiver_level`` is None)."""
        if self.archiver not in _LEVELS:
            return None
        return _LEVELS[self.archiver][0] if self.archiver_level is None else int(self.archiver_level)

    @classmethod
    def from_dict(cls, d) -> "ExCPConfig":
        """Build from a mapping (e.g. a Hydra node); unknown keys or bad values raise :class:`ConfigError`."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ConfigError(f"excp: expected a mapping of options, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise ConfigError(f"excp: unknown option(s) {', '.join(unknown)} (known: {', '.join(known)})")
        return cls(**{str(k): v for k, v in d.items()})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------- pruning
def _median_abs(x: np.ndarray) -> float:
    """Median of |x| in float64 (np.partition; NaNs sort last, so they do not poison the threshold)."""
    a = np.abs(np.asarray(x).ravel())
    n = a.size
    if n == 0:
        return 0.0
    k = n // 2
    if n % 2:
        a.partition(k)  # in place: ``a`` is our own copy
        return float(a[k])
    a.partition([k - 1, k])
    return (float(a[k - 1]) + float(a[k])) / 2.0


def weight_prune_scale(v, alpha: float, max_scale: float) -> float:
    """``s = min(max_scale, alpha / sqrt(mean(v)))``; ``max_scale`` when mean(v) is 0, negative or not finite."""
    mv = float(np.mean(v, dtype=np.float64)) if np.size(v) else 0.0
    if not math.isfinite(mv) or mv <= 0.0:
        return float(max_scale)
    return min(float(max_scale), float(alpha) / math.sqrt(mv))


def prune_weight_mask(dW, v, alpha: float = 5e-5, max_scale: float = 2.5) -> np.ndarray:
    """Boolean mask of the residual entries ExCP keeps: ``|dW| > median(|dW|) * s`` (see module docstring)."""
    dW = np.asarray(dW)
    thr = np.float64(_median_abs(dW) * weight_prune_scale(v, alpha, max_scale))
    return np.abs(dW) > thr  # float32 vs float64 scalar: compared in float64


def prune_moment_mask(m, weight_mask, beta: float = 2.0) -> np.ndarray:
    """Mask kept for both moments: ``|m| > beta * mean(|m|)`` and the pruned weight residual is non-zero."""
    m = np.asarray(m)
    weight_mask = np.asarray(weight_mask, dtype=bool)
    if weight_mask.shape != m.shape:
        raise ExCPError(f"moment pruning: weight mask shape {weight_mask.shape} != moment shape {m.shape}")
    a = np.abs(m)
    thr = np.float64(beta) * (np.mean(a, dtype=np.float64) if a.size else 0.0)
    return (a > thr) & weight_mask


# ----------------------------------------------------------------------------------- quantisation
def _nearest(sorted_centroids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index (0-based) of the nearest value in a sorted 1-D table, via midpoints (ties go to the lower one)."""
    c = np.asarray(sorted_centroids, dtype=np.float64)
    mid = (c[:-1] + c[1:]) * 0.5
    return np.searchsorted(mid, x, side="left")


def kmeans_1d(values, n_centroids: int, iters: int = 25, samples_per_centroid: int = 256,
              seed: int = 0) -> np.ndarray:
    """1-D k-means (Lloyd) on a seeded random subset; returns sorted, distinct float16 centroids.

    At most ``n_centroids`` centroids come back: fewer when the data has fewer distinct values or when
    centroids coincide after the float16 rounding. Values must be finite. (:func:`quantize` scales the
    float64 centroids before rounding them to float16; this plain version rounds them directly.)
    """
    return np.unique(_kmeans_1d_f64(values, n_centroids, iters, samples_per_centroid, seed).astype(np.float16))


def _kmeans_1d_f64(values, n_centroids: int, iters: int, samples_per_centroid: int, seed: int) -> np.ndarray:
    """The k-means of :func:`kmeans_1d`, returning sorted distinct float64 centroids."""
    x = np.asarray(values).ravel()
    if n_centroids < 1 or iters < 0 or samples_per_centroid < 1:
        raise ValueError("kmeans_1d: need n_centroids >= 1, iters >= 0, samples_per_centroid >= 1")
    if x.size == 0:
        return np.zeros(0, np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("kmeans_1d: values must be finite")
    k = int(n_centroids)
    m = k * int(samples_per_centroid)
    if x.size > m:
        rng = np.random.default_rng(seed)
        x = x[rng.choice(x.size, size=m, replace=False)]
    s = np.sort(x.astype(np.float64))
    distinct = np.unique(s)
    if distinct.size <= k:
        return distinct
    c = _lloyd(np.unique(np.quantile(s, (np.arange(k) + 0.5) / k)), s, k, iters)
    return _swap_refine(c, s, k, iters)


def _lloyd(c: np.ndarray, s: np.ndarray, k: int, iters: int) -> np.ndarray:
    """Lloyd iterations on the sorted sample ``s``; empty clusters are re-seeded, duplicates merged.

    ``s`` is sorted, so every cluster is a contiguous run whose ends are found by searching the
    midpoints in ``s`` (K binary searches, not N) and whose sum is one ``np.add.reduceat``."""
    for _ in range(iters):
        c = _reseed(c, s, k)
        bounds = np.searchsorted(s, (c[:-1] + c[1:]) * 0.5, side="right")
        starts = np.concatenate([[0], bounds])
        cnt = np.diff(np.concatenate([starts, [s.size]]))
        ne = cnt > 0
        new = np.unique(np.add.reduceat(s, starts[ne]) / cnt[ne])
        if new.size == c.size and np.array_equal(new, c):
            break
        c = new
    return _reseed(c, s, k)


def _sse_table(s: np.ndarray):
    """Prefix sums of the (centred) sorted sample; ``sse(a, b)`` = squared error of s[a:b] about its mean."""
    z = s - s.mean()
    p1 = np.concatenate([[0.0], np.cumsum(z)])
    p2 = np.concatenate([[0.0], np.cumsum(z * z)])

    def sse(a, b):
        a, b = np.asarray(a), np.asarray(b)
        n = np.maximum(b - a, 1)
        return np.maximum((p2[b] - p2[a]) - (p1[b] - p1[a]) ** 2 / n, 0.0)

    def mean(a, b):
        return (p1[b] - p1[a]) / max(b - a, 1) + s.mean()

    return sse, mean


def _swap_refine(c: np.ndarray, s: np.ndarray, k: int, iters: int) -> np.ndarray:
    """Escape Lloyd's local optima (two centroids in one cluster while two clusters share one): merge the
    cheapest adjacent pair of clusters, split the cluster that gains most from a split, re-run Lloyd, and
    keep the result only if the total squared error dropped by more than 0.01 %. Deterministic; at most
    ``k`` rounds (on smooth data the first swap usually does not pay, so this costs one extra Lloyd run)."""
    if c.size < 3 or iters == 0:
        return c
    sse, mean = _sse_table(s)
    n = s.size

    def total(cc):
        return float(np.sum((s - cc[_nearest(cc, s)]) ** 2))

    best = total(c)
    for _ in range(k):
        kk = c.size
        bounds = np.concatenate([[0], np.searchsorted(s, (c[:-1] + c[1:]) * 0.5, side="right"), [n]])
        seg = sse(bounds[:-1], bounds[1:])
        # best split of every cluster: t strictly inside [bounds[i], bounds[i+1])
        t = np.arange(1, n)
        owner = np.searchsorted(bounds, t, side="right") - 1
        inside = t > bounds[owner]
        t, owner = t[inside], owner[inside]
        cost = sse(bounds[owner], t) + sse(t, bounds[owner + 1])
        split = np.full(kk, np.inf)
        np.minimum.at(split, owner, cost)
        gain = seg - split  # -inf where a cluster cannot be split
        i = int(np.argmax(gain))
        merge = sse(bounds[:-2], bounds[2:]) - seg[:-1] - seg[1:]  # merging clusters j and j+1
        merge[max(i - 1, 0):i + 1] = np.inf
        j = int(np.argmin(merge))
        if not gain[i] > merge[j]:
            break
        ti = t[owner == i][np.argmin(cost[owner == i])]
        keep = np.ones(kk, bool)
        keep[[i, j, j + 1]] = False
        cand = np.concatenate([c[keep], [mean(bounds[j], bounds[j + 2]), mean(bounds[i], ti),
                                         mean(ti, bounds[i + 1])]])
        cand = _lloyd(np.unique(cand), s, k, iters)
        err = total(cand)
        if not err < best * (1.0 - 1e-4):  # stop once a swap no longer pays
            break
        c, best = cand, err
    return c


def _reseed(c: np.ndarray, s: np.ndarray, k: int) -> np.ndarray:
    """Top ``c`` up to ``k`` centroids with the sample points farthest from their nearest centroid."""
    need = k - c.size
    if need <= 0:
        return c
    err = np.abs(s - c[_nearest(c, s)])
    order = np.argsort(-err, kind="stable")
    cand = s[order][err[order] > 0]
    if cand.size == 0:
        return c
    _, first = np.unique(cand, return_index=True)
    cand = cand[np.sort(first)][:need]
    return np.unique(np.concatenate([c, cand]))


@dataclass(frozen=True)
class Quantized:
    """Output of :func:`quantize`: flat uint8 ``indices`` (0 = zero), sorted float16 ``centroids`` and
    the power-of-two ``exponent`` of the table (value of index i>0 = float32(centroids[i-1]) * 2**exponent)."""

    indices: np.ndarray
    centroids: np.ndarray
    exponent: int


def _centroid_table(centroids16: np.ndarray, exponent: int) -> np.ndarray:
    """Dequantisation table, float32: [0, c_1 * 2**e, ..., c_K * 2**e]."""
    t = np.zeros(centroids16.size + 1, np.float32)
    t[1:] = np.ldexp(centroids16.astype(np.float32), int(exponent))
    return t


def quantize(x, bits: int = 4, *, iters: int = 25, samples_per_centroid: int = 256, seed: int = 0,
             scale_centroids: bool = True) -> Quantized:
    """Quantise the non-zeros of ``x`` (any shape; zeros map to index 0) to ``2**bits - 1`` float16 centroids.

    Non-zero values must be finite. Each non-zero gets the index of the nearest *stored* centroid
    (after float16 rounding and scaling), so :func:`dequantize` reproduces exactly what was measured.
    """
    if not 2 <= bits <= 8:
        raise ValueError(f"quantize: bits must be in 2..8, got {bits}")
    flat = np.asarray(x).ravel()
    nzpos = np.flatnonzero(flat)
    vals = flat[nzpos]
    idx = np.zeros(flat.size, np.uint8)
    if vals.size == 0:
        return Quantized(idx, np.zeros(0, np.float16), 0)
    if not np.all(np.isfinite(vals)):
        raise ValueError("quantize: non-zero values must be finite")
    c = _kmeans_1d_f64(vals, (1 << bits) - 1, iters, samples_per_centroid, seed)
    if scale_centroids:
        exponent = math.frexp(float(np.max(np.abs(vals))))[1] - 15  # max|x| * 2**-e in [2**14, 2**15)
        c16 = np.unique(np.ldexp(c, -exponent).astype(np.float16))
    else:
        exponent = 0
        c16 = np.unique(np.clip(c, -65504.0, 65504.0).astype(np.float16))
    c16 = c16[np.isfinite(c16)]
    table = _centroid_table(c16, exponent)[1:]
    _, first = np.unique(table, return_index=True)  # float32 underflow can merge neighbours
    if first.size != c16.size:
        c16 = c16[np.sort(first)]
        table = table[np.sort(first)]
    idx[nzpos] = (_nearest(table, vals) + 1).astype(np.uint8)
    return Quantized(idx, c16, int(exponent))


def dequantize(indices, centroids, exponent: int = 0, shape=None) -> np.ndarray:
    """float32 values of ``indices`` (0 -> 0.0, i -> float32(centroids[i-1]) * 2**exponent)."""
    idx = np.asarray(indices, dtype=np.uint8)
    c16 = np.asarray(centroids, dtype=np.float16).ravel()
    if idx.size and int(idx.max()) > c16.size:
        raise ExCPFormatError(f"quantisation index {int(idx.max())} points past the {c16.size}-entry centroid table")
    out = _centroid_table(c16, exponent)[idx]
    return out.reshape(shape) if shape is not None else out


def pack_bits(idx, b: int) -> bytes:
    """Pack indices (each < 2**b) at ``b`` bits each, MSB first; b=4 puts the first index in the high nibble."""
    if not 2 <= b <= 8:
        raise ValueError(f"pack_bits: b must be in 2..8, got {b}")
    a = np.asarray(idx).ravel()
    if a.size and (a.min() < 0 or a.max() >= (1 << b)):
        raise ValueError(f"pack_bits: indices must lie in [0, {(1 << b) - 1}]")
    a = a.astype(np.uint8)
    if b == 8:
        return a.tobytes()
    if b == 4:
        if a.size % 2:
            a = np.concatenate([a, np.zeros(1, np.uint8)])
        return ((a[0::2] << 4) | a[1::2]).astype(np.uint8).tobytes()
    bits = np.unpackbits(a[:, None], axis=1)[:, 8 - b:]  # MSB-first bits of each index
    return np.packbits(bits.ravel()).tobytes()


def unpack_bits(buf, b: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``n`` indices of ``b`` bits. The length must be exactly
    ``ceil(n*b/8)`` and the pad bits zero, else :class:`ExCPFormatError`."""
    if not 2 <= b <= 8:
        raise ExCPFormatError(f"bit width {b} is outside 2..8")
    if n < 0:
        raise ExCPFormatError(f"negative index count {n}")
    raw = np.frombuffer(buf, np.uint8)
    need = (n * b + 7) // 8
    if raw.size != need:
        raise ExCPFormatError(f"packed index section holds {raw.size} bytes, {n} indices of {b} bits need {need}")
    if b == 8:
        return raw.copy()
    if b == 4:
        out = np.empty(2 * raw.size, np.uint8)
        out[0::2] = raw >> 4
        out[1::2] = raw & 0x0F
        if n % 2 and out[-1]:
            raise ExCPFormatError("non-zero pad bits after the packed indices")
        return out[:n]
    bits = np.unpackbits(raw)
    if bits[n * b:].any():
        raise ExCPFormatError("non-zero pad bits after the packed indices")
    bits = bits[:n * b].reshape(n, b)
    weights = (1 << np.arange(b - 1, -1, -1)).astype(np.uint8)
    return (bits * weights).sum(axis=1, dtype=np.uint16).astype(np.uint8)


# ---------------------------------------------------------------------------------------- dtypes
def _dtype_table() -> dict:
    names = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
    table = {n: np.dtype(n) for n in names}
    try:
        import ml_dtypes
        for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            if hasattr(ml_dtypes, n):
                table[n] = np.dtype(getattr(ml_dtypes, n))
    except ImportError:  # pragma: no cover - ml_dtypes is a project dependency
        pass
    return table


_DTYPES = _dtype_table()


def _dtype_name(dt: np.dtype) -> str | None:
    for name, d in _DTYPES.items():
        if d == dt or (dt.kind in "biufc" and d == dt.newbyteorder("=")):
            return name
    return None


def _le(dt: np.dtype) -> np.dtype:
    return dt.newbyteorder("<") if dt.kind in "biufc" else dt


# ------------------------------------------------------------------------------------- encoding
class _PayloadWriter:
    def __init__(self):
        self.sections: list[bytes] = []
        self.cursor = 0

    def add(self, data: bytes) -> list[int]:
        self.sections.append(data)
        ref = [self.cursor, len(data)]
        self.cursor += len(data)
        return ref


def _exact_positions(mask_flat: np.ndarray, numel: int) -> tuple[str, bytes]:
    """Smallest encoding of a set of flat positions: packed bit mask or u32/u64 index list."""
    pos = np.flatnonzero(mask_flat)
    width = 4 if numel <= 0xFFFFFFFF else 8
    if pos.size * width < (numel + 7) // 8:
        return ("u32", pos.astype("<u4").tobytes()) if width == 4 else ("u64", pos.astype("<u8").tobytes())
    return "mask", np.packbits(mask_flat).tobytes()


def _entry_raw(w: _PayloadWriter, kind: str, a: np.ndarray) -> tuple[dict, float]:
    name = _dtype_name(a.dtype)
    if name is None:
        raise ExCPError(f"{kind}: unsupported dtype {a.dtype}")
    data = np.ascontiguousarray(a).astype(_le(a.dtype), copy=False).tobytes()
    return {"kind": kind, "dtype": name, "shape": list(a.shape), "mode": "raw", "sections": [w.add(data)]}, 1.0


def _entry_lossy(w: _PayloadWriter, kind: str, shape, keep: np.ndarray, exact_src: np.ndarray,
                 qsrc: np.ndarray | None, cfg: ExCPConfig) -> tuple[dict, float]:
    """One float32 array in mode zero / exact / quant.

    ``keep``: flat bool mask of the stored positions. ``exact_src``: flat float32 values to store in exact
    mode (W_t for weights, the moment itself otherwise). ``qsrc``: flat float32 values to quantise
    (dW for weights), or None for exact storage (quantize=False)."""
    numel = keep.size
    head = {"kind": kind, "dtype": "float32", "shape": list(shape)}
    count = int(np.count_nonzero(keep))
    kept = count / numel if numel else 0.0
    if count == 0:
        return {**head, "mode": "zero", "sections": []}, kept
    if qsrc is not None:
        vals = qsrc[keep]
        if count > (1 << cfg.bits) - 1 and np.all(np.isfinite(vals)):
            q = quantize(np.where(keep, qsrc, np.float32(0)), cfg.bits, iters=cfg.kmeans_iters,
                         samples_per_centroid=cfg.samples_per_centroid, seed=cfg.seed,
                         scale_centroids=cfg.scale_centroids)
            secs = [w.add(q.centroids.astype("<f2").tobytes()), w.add(pack_bits(q.indices, cfg.bits))]
            return {**head, "mode": "quant", "bits": cfg.bits, "n_centroids": int(q.centroids.size),
                    "exponent": q.exponent, "sections": secs}, kept
    pos_kind, pos_bytes = _exact_positions(keep, numel)
    secs = [w.add(pos_bytes), w.add(exact_src[keep].astype("<f4").tobytes())]
    return {**head, "mode": "exact", "count": count, "positions": pos_kind, "sections": secs}, kept


def _as_array(x, what: str) -> np.ndarray:
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - anything that is not array-like
        raise ExCPError(f"{what}: not an array ({e})") from None
    if a.dtype == object or _dtype_name(a.dtype) is None:
        raise ExCPError(f"{what}: unsupported dtype {a.dtype}")
    return a


def _encode_param(w: _PayloadWriter, name: str, arrs: dict, ref, cfg: ExCPConfig) -> tuple[list, dict]:
    W = arrs["weight"]
    m, v = arrs.get("exp_avg"), arrs.get("exp_avg_sq")
    entries, kept = [], {}
    lossy = ref is not None and W.dtype == _F32 and W.size > 0
    if not lossy:
        for kind, a in (("weight", W), ("exp_avg", m), ("exp_avg_sq", v)):
            if a is not None:
                e, kept[kind] = _entry_raw(w, kind, a)
                entries.append(e)
        return entries, kept

    Wf = W.ravel()
    reff = ref.ravel()
    with np.errstate(over="ignore", invalid="ignore"):  # inf/nan residuals are handled (stored exactly)
        dW = Wf - reff  # float32
    if cfg.prune_weights and v is not None:
        wkeep = prune_weight_mask(dW, v, cfg.alpha, cfg.max_scale)
    else:  # every position whose bits changed (bit-exact in exact mode, -0.0/nan included)
        wkeep = Wf.view(np.uint32) != reff.view(np.uint32)
    if cfg.quantize:
        wkeep &= dW != 0
    e, kept["weight"] = _entry_lossy(w, "weight", W.shape, wkeep, Wf, dW if cfg.quantize else None, cfg)
    entries.append(e)

    mkeep = None
    if cfg.prune_moments and m is not None:
        mkeep = prune_moment_mask(m.ravel(), wkeep & (dW != 0), cfg.beta)
    for kind, a in (("exp_avg", m), ("exp_avg_sq", v)):
        if a is None:
            continue
        if a.dtype != _F32:
            e, kept[kind] = _entry_raw(w, kind, a)
        else:
            af = a.ravel()
            if cfg.quantize:
                keep = (af != 0) if mkeep is None else (mkeep & (af != 0))
            else:
                keep = (af.view(np.uint32) != 0) if mkeep is None else mkeep
            e, kept[kind] = _entry_lossy(w, kind, a.shape, keep, af, af if cfg.quantize else None, cfg)
        entries.append(e)
    return entries, kept


def _check_inputs(tensors, ref_weights) -> tuple[dict, dict | None]:
    if not isinstance(tensors, Mapping):
        raise ExCPError("tensors must be a mapping name -> {weight, exp_avg, exp_avg_sq}, "
                        f"got {type(tensors).__name__}")
    if ref_weights is not None and not isinstance(ref_weights, Mapping):
        raise ExCPError(f"ref_weights must be a mapping name -> array or None, got {type(ref_weights).__name__}")
    out = {}
    for name, arrs in tensors.items():
        if not isinstance(name, str):
            raise ExCPError(f"parameter names must be strings, got {name!r}")
        if not isinstance(arrs, Mapping):
            raise ExCPError(f"{name}: expected a mapping with weight / exp_avg / exp_avg_sq")
        extra = sorted(str(k) for k in arrs if k not in KINDS)
        if extra:
            raise ExCPError(f"{name}: unknown entries {', '.join(extra)} (known: {', '.join(KINDS)})")
        if arrs.get("weight") is None:
            raise ExCPError(f"{name}: no weight")
        d = {k: (None if arrs.get(k) is None else _as_array(arrs[k], f"{name}.{k}")) for k in KINDS}
        for k in ("exp_avg", "exp_avg_sq"):
            if d[k] is not None and d[k].shape != d["weight"].shape:
                raise ExCPError(f"{name}.{k}: shape {d[k].shape} differs from the weight's {d['weight'].shape}")
        out[name] = d
    refs = None
    if ref_weights is not None:
        refs = {}
        for name, d in out.items():
            r = ref_weights.get(name)
            if r is None or d["weight"].dtype != _F32:
                refs[name] = None
                continue
            r = _as_float32_ref(r, name, d["weight"].shape, ExCPError)
            refs[name] = r
    return out, refs


def _as_float32_ref(r, name: str, shape, err) -> np.ndarray:
    try:
        r = np.asarray(r, dtype=np.float32)
    except Exception:  # noqa: BLE001
        raise err(f"{name}: reference weight is not a float array") from None
    if r.shape != tuple(shape):
        raise err(f"{name}: reference weight has shape {r.shape}, the checkpoint has {tuple(shape)}")
    return r


def _rel_err(rec: np.ndarray, orig: np.ndarray) -> tuple[float, float]:
    """(||rec - orig|| / ||orig||, max |rec - orig|) in float64 over float32 arrays; bit-identical
    elements (nan and inf included) count as error 0."""
    if orig.size == 0:
        return 0.0, 0.0
    o = np.ascontiguousarray(orig, dtype=np.float32).ravel()
    r = np.ascontiguousarray(rec, dtype=np.float32).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        o64 = o.astype(np.float64)
        d = r - o64
        if not np.all(np.isfinite(d)):
            d[r.view(np.uint32) == o.view(np.uint32)] = 0.0
        num = math.sqrt(float(np.dot(d, d)))
        den = math.sqrt(float(np.dot(o64, o64)))
        mx = float(np.max(np.abs(d)))
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return rel, mx


def encode_checkpoint(tensors, ref_weights, cfg: ExCPConfig | None = None):
    """Compress one checkpoint. Returns ``(blob, recon, stats)``.

    ``tensors``: name -> {"weight": array, "exp_avg": array|None, "exp_avg_sq": array|None}.
    ``ref_weights``: name -> reconstructed previous weight (or None / absent: that parameter is stored
    lossless); ``None`` altogether = first checkpoint of a chain (everything lossless).
    ``recon``: name -> {"weight", "exp_avg", "exp_avg_sq"} exactly as :func:`decode_checkpoint` returns it.
    ``stats``: one dict per stored array: name, kind, dtype, mode, numel, kept_fraction, pruned_fraction,
    rel_l2, max_abs, payload_bytes (its sections, before the archiver), plus bits / n_centroids in
    quant mode. The caller's arrays are never modified.
    """
    cfg = ExCPConfig() if cfg is None else cfg
    if not isinstance(cfg, ExCPConfig):
        cfg = ExCPConfig.from_dict(cfg)
    params, refs = _check_inputs(tensors, ref_weights)
    w = _PayloadWriter()
    toc_params, kept_all = [], {}
    for name, arrs in params.items():
        entries, kept = _encode_param(w, name, arrs, None if refs is None else refs[name], cfg)
        toc_params.append({"name": name, "arrays": entries})
        kept_all[name] = kept
    toc = {"format": "excp", "version": VERSION, "config": cfg.to_dict(), "params": toc_params}
    payload = _build_payload(toc, w.sections)
    recon = _decode_payload(payload, refs)
    stats = []
    for p in toc_params:
        name = p["name"]
        for e in p["arrays"]:
            kind = e["kind"]
            orig, rec = params[name][kind], recon[name][kind]
            rel, mx = (0.0, 0.0) if e["mode"] == "raw" else _rel_err(rec, orig)
            k = kept_all[name][kind]
            st = {"name": name, "kind": kind, "dtype": e["dtype"], "mode": e["mode"], "numel": int(orig.size),
                  "kept_fraction": k, "pruned_fraction": 1.0 - k, "rel_l2": rel, "max_abs": mx,
                  "payload_bytes": sum(s[1] for s in e["sections"])}
            if e["mode"] == "quant":
                st.update(bits=e["bits"], n_centroids=e["n_centroids"])
            stats.append(st)
    blob = _pack_container(payload, cfg.archiver, cfg.level)
    return blob, recon, stats


def _build_payload(toc: dict, sections) -> bytes:
    t = json.dumps(toc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return b"".join([struct.pack("<I", len(t)), t, *sections])


def _pack_container(payload: bytes, archiver: str, level: int | None) -> bytes:
    if archiver == "none":
        archived = payload
    elif archiver == "lzma":
        archived = lzma.compress(payload, format=lzma.FORMAT_XZ, preset=level)
    elif archiver == "zstd":
        import zstandard
        archived = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(payload)
    elif archiver == "lmc":
        import lmc
        archived = lmc.compress(np.frombuffer(payload, np.uint8), chunk_size=_LMC_CHUNK)
    else:
        raise ExCPError(f"unknown archiver {archiver!r}")
    header = _HEADER.pack(MAGIC, VERSION, _ARCHIVERS[archiver], 0, len(payload), len(archived),
                          zlib.crc32(payload), zlib.crc32(archived))
    return header + archived


# ------------------------------------------------------------------------------------- decoding
def _unpack_container(blob) -> tuple[bytes, str]:
    """Check the header and both checksums, un-archive; returns (payload, archiver name)."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ExCPFormatError(f"expected a bytes-like blob, got {type(blob).__name__}")
    try:
        mv = memoryview(blob).cast("B")
    except (TypeError, ValueError) as e:
        raise ExCPFormatError(f"blob is not a contiguous byte buffer ({e})") from None
    if len(mv) < HEADER_SIZE:
        raise ExCPFormatError(f"truncated blob: {len(mv)} bytes, the header alone needs {HEADER_SIZE}")
    magic, version, arch, reserved, raw_len, arch_len, raw_crc, arch_crc = _HEADER.unpack(mv[:HEADER_SIZE])
    if magic != MAGIC:
        raise ExCPFormatError(f"not an ExCP blob (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ExCPFormatError(f"unsupported ExCP format version {version} (this reader knows {VERSION})")
    if arch not in _ARCHIVER_NAMES:
        raise ExCPFormatError(f"unknown archiver id {arch}")
    if reserved:
        raise ExCPFormatError("reserved header field is not zero")
    if arch_len != len(mv) - HEADER_SIZE:
        what = "truncated" if arch_len > len(mv) - HEADER_SIZE else "trailing bytes in"
        raise ExCPFormatError(f"{what} blob: header declares {arch_len} archived bytes, "
                              f"{len(mv) - HEADER_SIZE} follow it")
    if raw_len > MAX_PAYLOAD_BYTES:
        raise ExCPFormatError(f"declared payload of {raw_len} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
    archived = bytes(mv[HEADER_SIZE:])
    if zlib.crc32(archived) != arch_crc:
        raise ExCPFormatError("checksum mismatch in the archived data (corrupt blob)")
    name = _ARCHIVER_NAMES[arch]
    try:
        payload = _unarchive(name, archived, raw_len)
    except ExCPFormatError:
        raise
    except Exception as e:  # noqa: BLE001 - third-party decompressors raise anything on hostile input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExCPFormatError(f"{name} archive is corrupt: {msg}") from None
    if len(payload) != raw_len:
        raise ExCPFormatError(f"{name} archive holds {len(payload)} payload bytes, the header declares {raw_len}")
    if zlib.crc32(payload) != raw_crc:
        raise ExCPFormatError("checksum mismatch in the payload (corrupt blob)")
    return payload, name


def _unarchive(name: str, archived: bytes, raw_len: int) -> bytes:
    if name == "none":
        return archived
    if name == "lzma":
        d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        out = d.decompress(archived, max_length=raw_len + 1)
        if len(out) > raw_len or not d.eof or d.unused_data:
            raise ExCPFormatError("lzma archive does not end where the payload does")
        return out
    if name == "zstd":
        import zstandard
        fp = zstandard.get_frame_parameters(archived)
        if fp.content_size != raw_len:
            raise ExCPFormatError(f"zstd frame declares {fp.content_size} bytes, the header {raw_len}")
        parts, total = [], 0
        with zstandard.ZstdDecompressor().stream_reader(archived, read_across_frames=False) as r:
            while total <= raw_len:
                chunk = r.read(min(1 << 24, raw_len + 1 - total))
                if not chunk:
                    break
                parts.append(chunk)
                total += len(chunk)
        return b"".join(parts)
    if name == "lmc":
        import lmc
        info = lmc.info(archived)
        shape = tuple(info["shape"])
        if np.dtype(info["dtype"]) != np.uint8 or shape != (raw_len,) or info.get("has_reference") \
                or info["chunk_size"] != _LMC_CHUNK:
            raise ExCPFormatError(f"lmc archive header ({info['dtype']}, shape {shape}) does not match "
                                  f"a {raw_len}-byte payload")
        return np.asarray(lmc.decompress(archived)).tobytes()
    raise ExCPFormatError(f"unknown archiver {name!r}")  # pragma: no cover


def _fail(where: str, msg: str):
    raise ExCPFormatError(f"{where}: {msg}")


def _toc_int(d: dict, key: str, lo: int, hi: int, where: str) -> int:
    x = d.get(key)
    if type(x) is not int or not lo <= x <= hi:
        _fail(where, f"{key} must be an integer in [{lo}, {hi}], got {_short(x)}")
    return x


def _short(x) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


_ENTRY_KEYS = {
    "raw": set(),
    "zero": set(),
    "exact": {"count", "positions"},
    "quant": {"bits", "n_centroids", "exponent"},
}
_N_SECTIONS = {"raw": 1, "zero": 0, "exact": 2, "quant": 2}


def _decode_payload(payload, refs) -> dict:
    """Parse and validate a payload; ``refs``: name -> float32 reference (or None) / None for no refs."""
    mv = memoryview(payload)
    if len(mv) < 4:
        raise ExCPFormatError(f"payload of {len(mv)} bytes is too short for its table of contents")
    (toc_len,) = struct.unpack("<I", mv[:4])
    if toc_len > len(mv) - 4:
        raise ExCPFormatError(f"table of contents length {toc_len} exceeds the {len(mv) - 4} payload bytes")
    try:
        toc = json.loads(bytes(mv[4:4 + toc_len]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ExCPFormatError(f"table of contents is not valid JSON ({type(e).__name__})") from None
    data = mv[4 + toc_len:]
    if not isinstance(toc, dict) or set(toc) != {"format", "version", "config", "params"}:
        raise ExCPFormatError("table of contents lacks or has unexpected top-level keys")
    if toc["format"] != "excp" or toc["version"] != VERSION or type(toc["version"]) is not int:
        raise ExCPFormatError(f"table of contents has format {_short(toc['format'])} version {_short(toc['version'])}")
    if not isinstance(toc["config"], dict) or not isinstance(toc["params"], list):
        raise ExCPFormatError("table of contents: config must be an object and params a list")
    cursor = 0
    out = {}
    for i, p in enumerate(toc["params"]):
        if not isinstance(p, dict) or set(p) != {"name", "arrays"} or not isinstance(p["name"], str) \
                or not isinstance(p["arrays"], list):
            raise ExCPFormatError(f"table of contents: parameter #{i} is malformed")
        name = p["name"]
        if name in out:
            _fail(name, "parameter listed twice")
        arrays = {k: None for k in KINDS}
        if not p["arrays"] or not isinstance(p["arrays"][0], dict) or p["arrays"][0].get("kind") != "weight":
            _fail(name, "the weight entry must come first")
        if len(p["arrays"]) > len(KINDS):
            _fail(name, "too many arrays")
        wshape = None
        for e in p["arrays"]:
            where = f"{name}.{e.get('kind') if isinstance(e, dict) else '?'}"
            if not isinstance(e, dict):
                _fail(where, "entry is not an object")
            kind = e.get("kind")
            if kind not in KINDS or arrays[kind] is not None:
                _fail(where, "unknown or repeated array kind")
            mode = e.get("mode")
            if mode not in _ENTRY_KEYS:
                _fail(where, f"unknown mode {_short(mode)}")
            if set(e) != {"kind", "dtype", "shape", "mode", "sections"} | _ENTRY_KEYS[mode]:
                _fail(where, f"unexpected fields for mode {mode}")
            shape = e["shape"]
            if not isinstance(shape, list) or len(shape) > 32 \
                    or any(type(s) is not int or s < 0 for s in shape):
                _fail(where, f"bad shape {_short(shape)}")
            numel = math.prod(shape)  # Python int: no overflow
            if math.prod(d for d in shape if d) > MAX_PAYLOAD_BYTES * 8:  # zero dims do not hide huge ones
                _fail(where, f"shape {_short(shape)} is implausibly large")
            if kind != "weight" and shape != wshape:
                _fail(where, f"shape {_short(shape)} differs from the weight's {wshape}")
            dt = e["dtype"]
            if not isinstance(dt, str) or dt not in _DTYPES:
                _fail(where, f"unknown dtype {_short(dt)}")
            if mode != "raw" and dt != "float32":
                _fail(where, f"mode {mode} needs dtype float32, got {dt}")
            secs = e["sections"]
            if not isinstance(secs, list) or len(secs) != _N_SECTIONS[mode]:
                _fail(where, f"mode {mode} needs {_N_SECTIONS[mode]} sections")
            views = []
            for s in secs:
                if not isinstance(s, list) or len(s) != 2 or any(type(x) is not int for x in s):
                    _fail(where, f"bad section {_short(s)}")
                off, ln = s
                if off != cursor or ln < 0 or off + ln > len(data):
                    _fail(where, f"section [{off}, {ln}] is out of place (expected offset {cursor}, "
                                 f"{len(data)} data bytes)")
                views.append(data[off:off + ln])
                cursor = off + ln
            base = None
            if mode != "raw" and kind == "weight":
                r = None if refs is None else refs.get(name)
                if r is None:
                    _fail(name, "stored as a residual but no reference weight was given")
                base = _as_float32_ref(r, name, shape, ExCPFormatError)
            arrays[kind] = _decode_entry(where, e, mode, shape, numel, _DTYPES[dt], views, base)
            if kind == "weight":
                wshape = shape
        out[name] = arrays
    if cursor != len(data):
        raise ExCPFormatError(f"{len(data) - cursor} unaccounted bytes after the last section")
    return out


def _decode_entry(where, e, mode, shape, numel, dt, views, base) -> np.ndarray:
    if mode == "raw":
        if len(views[0]) != numel * dt.itemsize:
            _fail(where, f"raw section holds {len(views[0])} bytes, shape {shape} of {dt} needs {numel * dt.itemsize}")
        a = np.frombuffer(views[0], dtype=_le(dt)).astype(dt).reshape(shape)
        if dt == np.bool_ and numel and np.frombuffer(views[0], np.uint8).max() > 1:
            _fail(where, "bool array holds bytes other than 0 and 1")
        return a
    # base is the float32 reference for weights, zeros for moments; its size is checked or bounded
    if base is not None:
        out = base.ravel().copy()
    else:
        out = None
    if mode == "zero":
        return (out if out is not None else np.zeros(numel, np.float32)).reshape(shape)
    if mode == "exact":
        count = _toc_int(e, "count", 1, numel, where)
        pk = e["positions"]
        pbuf, vbuf = views
        if pk == "mask":
            if len(pbuf) != (numel + 7) // 8:
                _fail(where, f"position mask holds {len(pbuf)} bytes, {numel} positions need {(numel + 7) // 8}")
            bits = np.unpackbits(np.frombuffer(pbuf, np.uint8))
            if bits[numel:].any():
                _fail(where, "non-zero pad bits after the position mask")
            pos = np.flatnonzero(bits[:numel])
            if pos.size != count:
                _fail(where, f"position mask marks {pos.size} positions, count says {count}")
        elif pk in ("u32", "u64"):
            width = 4 if pk == "u32" else 8
            if len(pbuf) != count * width:
                _fail(where, f"position list holds {len(pbuf)} bytes, {count} {pk} positions need {count * width}")
            pos = np.frombuffer(pbuf, "<u4" if width == 4 else "<u8")
            if pos.size and (np.any(pos[1:] <= pos[:-1]) or int(pos[-1]) >= numel):
                _fail(where, "positions are not strictly increasing within the array")
            pos = pos.astype(np.intp)
        else:
            _fail(where, f"unknown positions encoding {_short(pk)}")
        if len(vbuf) != 4 * count:
            _fail(where, f"value section holds {len(vbuf)} bytes, {count} float32 values need {4 * count}")
        if out is None:
            out = np.zeros(numel, np.float32)
        out[pos] = np.frombuffer(vbuf, "<f4")
        return out.reshape(shape)
    # quant
    bits = _toc_int(e, "bits", 2, 8, where)
    k = _toc_int(e, "n_centroids", 1, (1 << bits) - 1, where)
    exponent = _toc_int(e, "exponent", -200, 200, where)
    cbuf, ibuf = views
    if len(cbuf) != 2 * k:
        _fail(where, f"centroid section holds {len(cbuf)} bytes, {k} float16 centroids need {2 * k}")
    c16 = np.frombuffer(cbuf, "<f2").astype(np.float16)
    c32 = c16.astype(np.float32)
    if not np.all(np.isfinite(c32)) or np.any(c32[1:] <= c32[:-1]):
        _fail(where, "centroids are not finite and strictly increasing")
    if len(ibuf) != (numel * bits + 7) // 8:
        _fail(where, f"index section holds {len(ibuf)} bytes, {numel} indices of {bits} bits need "
                     f"{(numel * bits + 7) // 8}")
    try:
        idx = unpack_bits(ibuf, bits, numel)
        vals = dequantize(idx, c16, exponent)
    except ExCPFormatError as err:
        _fail(where, str(err))
    if out is None:
        return vals.reshape(shape)
    nz = idx != 0
    out[nz] = out[nz] + vals[nz]
    return out.reshape(shape)


def decode_checkpoint(blob, ref_weights=None) -> dict:
    """Decode a blob from :func:`encode_checkpoint`; returns name -> {"weight", "exp_avg", "exp_avg_sq"}.

    ``ref_weights`` must hold the same reference weights the encoder was given (name -> array) for every
    parameter stored as a residual; wrong shapes or a missing reference raise :class:`ExCPFormatError`,
    as does anything wrong with the blob.
    """
    if ref_weights is not None and not isinstance(ref_weights, Mapping):
        raise ExCPFormatError(f"ref_weights must be a mapping name -> array, got {type(ref_weights).__name__}")
    payload, _ = _unpack_container(blob)
    return _decode_payload(payload, ref_weights)
