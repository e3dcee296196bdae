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
   (``np.ldexp``): float16 precision, float32 range. ``e`` lies in [-163, 113] (``EXPONENT_MIN``,
   ``EXPONENT_MAX``: from the smallest float32 subnormal to the largest float32); at ``e = 113`` (values
   within 0.03 % of float32's maximum) centroids are clipped to +-32752 so that no scaled centroid rounds
   to inf. ``scale_centroids=False`` stores plain float16 (values clipped to +-65504) and decodes
   ``float32(c16)``.
5. Final archiver over the whole packed payload: ``lzma`` (xz, the 7-Zip stand-in), ``zstd`` (one frame
   with its content size), ``lmc`` (our lossless codec, on the payload as a uint8 array) or ``none``.
6. Reconstruction: ``W_t = W_ref + dequant(dW)`` (float32 add, only where the index is non-zero, so a
   pruned position keeps the exact bits of ``W_ref``; a sum beyond float32's range is inf, silently);
   moments are the dequantised ``m`` and ``v``.

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
5      1     archiver id: 0 none, 1 lzma (xz container), 2 zstd (exactly one frame), 3 lmc
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
  than 2**bits-1 after dropping float16 duplicates) and ``exponent`` (the centroid scale, an integer in
  [-163, 113], 0 when unscaled); sections ``[centroids, indices]``: ``n_centroids`` float16 values whose
  scaled float32 table ``float32(c16) * 2**exponent`` is finite and strictly increasing, then
  ``ceil(numel*bits/8)`` bytes of indices packed MSB first (for bits=4: two per byte, the first in the
  high nibble), pad bits zero, every index <= ``n_centroids``.

The decoder treats a blob as hostile: every length, offset, shape, type and index is checked before it is
used (every TOC value's JSON type before it is compared, hashed or used as a key), and any problem raises
one-line :class:`ExCPFormatError`; decoding raises no floating-point warning. Memory:

* ``decode_checkpoint(..., max_payload_bytes=MAX_PAYLOAD_BYTES)`` (32 GiB by default) bounds what a blob
  may expand to: a header declaring a larger ``raw_len`` is refused before anything is allocated.
* The payload is un-archived into one buffer of exactly ``raw_len`` bytes (never more, no second copy):
  ``lzma`` is decoded in 1 MiB steps into a preallocated ``bytearray`` under a decoder memory limit of
  ``LZMA_MEMLIMIT`` = 256 MiB (``memlimit``; preset 9 needs about 65 MiB, a forged dictionary size that
  needs more is a format error), and must end exactly where the archive does; ``zstd`` must be exactly one
  frame (nothing before or after it, skippable frames included) whose content size is ``raw_len``, decoded
  in one pass into a buffer of that size; with ``lmc`` the declared size must match lmc's own chunk table
  and it decodes into a preallocated ``bytearray``; ``none`` is parsed in place, without a copy.
* The table of contents is decoded to a ``str`` straight from the payload buffer (no bytes copy).
* Array allocations are bounded by the caller's reference weights or by a section's length.

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

from ...errors import ConfigError, LmcbenchError

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
MAX_PAYLOAD_BYTES = 1 << 35  # 32 GiB: default for the largest payload a blob may declare (decode_checkpoint)
LZMA_MEMLIMIT = 256 << 20  # memory limit of the xz decoder (preset 9 needs about 65 MiB)
# the centroid-scale exponents the encoder can emit: frexp(x)[1] - 15 for the smallest non-zero float32
# (2**-149, frexp exponent -148) and the largest (just below 2**128, frexp exponent 128)
EXPONENT_MIN, EXPONENT_MAX = -148 - 15, 128 - 15  # -163, 113
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20  # lzma decompression step (output bytes per call; the bytes in flight are a few times this)
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
        if not isinstance(self.archiver, str) or self.archiver not in _ARCHIVERS:
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
    with np.errstate(over="ignore", under="ignore"):  # the caller checks the table (inf / merged entries)
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
        if exponent >= EXPONENT_MAX:  # 2**15 * 2**113 is inf in float32: the largest float16 below 2**15
            c16 = np.unique(np.clip(c16, np.float16(-32752), np.float16(32752)))
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
def _check_limit(max_payload_bytes) -> int:
    if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, (int, np.integer)) \
            or max_payload_bytes < 0:
        raise ExCPError(f"max_payload_bytes must be a non-negative integer, got {_short(max_payload_bytes)}")
    return int(max_payload_bytes)


def _unpack_container(blob, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> tuple[bytes | bytearray | memoryview, str]:
    """Check the header and both checksums, un-archive; returns (payload, archiver name).

    The payload is bytes-like: one buffer of exactly the declared length (a ``bytearray`` or ``bytes`` for
    an archived blob, a read-only ``memoryview`` into ``blob`` for archiver ``none``). A declared length
    above ``max_payload_bytes`` is refused before anything is allocated."""
    limit = _check_limit(max_payload_bytes)
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
    if raw_len > limit:
        raise ExCPFormatError(f"declared payload of {raw_len} bytes exceeds the {limit}-byte limit")
    archived = mv[HEADER_SIZE:].toreadonly()  # a view: no copy of the blob
    if zlib.crc32(archived) != arch_crc:
        raise ExCPFormatError("checksum mismatch in the archived data (corrupt blob)")
    name = _ARCHIVER_NAMES[arch]
    try:
        payload = _unarchive(name, archived, raw_len)
    except (ExCPFormatError, MemoryError):  # MemoryError: the declared size itself cannot be allocated
        raise
    except Exception as e:  # noqa: BLE001 - third-party decompressors raise anything on hostile input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExCPFormatError(f"{name} archive is corrupt: {msg}") from None
    if len(payload) != raw_len:
        raise ExCPFormatError(f"{name} archive holds {len(payload)} payload bytes, the header declares {raw_len}")
    if zlib.crc32(payload) != raw_crc:
        raise ExCPFormatError("checksum mismatch in the payload (corrupt blob)")
    return payload, name


def _unarchive(name: str, archived: memoryview, raw_len: int):
    """The payload of ``archived``: one buffer of at most ``raw_len`` bytes (plus one bounded chunk in flight)."""
    if name == "none":
        return archived
    if name == "lzma":
        return _unlzma(archived, raw_len)
    if name == "zstd":
        import zstandard
        if bytes(archived[:4]) != _ZSTD_MAGIC:
            raise ExCPFormatError("zstd archive is corrupt: it does not start with a zstd data frame")
        fp = zstandard.get_frame_parameters(archived)
        if fp.content_size != raw_len:
            raise ExCPFormatError(f"zstd frame declares {fp.content_size} bytes, the header {raw_len}")
        # one frame with a known content size is decoded straight into one buffer of that size; anything
        # after the frame (a second frame, a skippable frame, garbage) is an error
        return zstandard.ZstdDecompressor().decompress(archived, max_output_size=raw_len, read_across_frames=False,
                                                       allow_extra_data=False)
    if name == "lmc":
        import lmc
        info = lmc.info(archived)
        shape = tuple(info["shape"])
        if np.dtype(info["dtype"]) != np.uint8 or shape != (raw_len,) or info.get("has_reference") \
                or info["chunk_size"] != _LMC_CHUNK:
            raise ExCPFormatError(f"lmc archive header ({info['dtype']}, shape {shape}) does not match "
                                  f"a {raw_len}-byte payload")
        buf = bytearray(raw_len)
        lmc.decompress(archived, out=np.frombuffer(buf, np.uint8))
        return buf
    raise ExCPFormatError(f"unknown archiver {name!r}")  # pragma: no cover


def _unlzma(archived: memoryview, raw_len: int) -> bytearray:
    """xz stream -> bytearray(raw_len), fed and drained in bounded chunks, under :data:`LZMA_MEMLIMIT`."""
    buf = bytearray(raw_len)
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=LZMA_MEMLIMIT)
    pos = fed = 0
    try:
        while not d.eof:
            if d.needs_input:
                if fed >= len(archived):
                    break  # truncated stream
                chunk = archived[fed:fed + _CHUNK]
                fed += len(chunk)
            else:
                chunk = b""
            out = d.decompress(chunk, max_length=min(_CHUNK, raw_len + 1 - pos))
            if pos + len(out) > raw_len:
                raise ExCPFormatError(f"lzma archive holds more than the {raw_len} payload bytes the header declares")
            buf[pos:pos + len(out)] = out
            pos += len(out)
            if not out and not chunk and not d.eof and not d.needs_input:
                break  # no progress (not expected from liblzma): reported below
    except (lzma.LZMAError, MemoryError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExCPFormatError(f"lzma archive is corrupt or needs more than the {LZMA_MEMLIMIT >> 20} MiB "
                              f"decoder memory limit ({msg})") from None
    if not d.eof or d.unused_data or fed != len(archived) or pos != raw_len:
        raise ExCPFormatError("lzma archive does not end where the payload does")
    return buf


def _fail(where: str, msg: str):
    raise ExCPFormatError(f"{where}: {msg}")


def _toc_int(d: dict, key: str, lo: int, hi: int, where: str) -> int:
    x = d.get(key)
    if type(x) is not int or not lo <= x <= hi:
        _fail(where, f"{key} must be an integer in [{lo}, {hi}], got {_short(x)}")
    return x


def _short(x) -> str:
    try:
        s = repr(x)
    except RecursionError:  # a deeply nested JSON value
        return f"a deeply nested {type(x).__name__}"
    return s if len(s) <= 60 else s[:57] + "..."


_TOC_KEYS = {"format", "version", "config", "params"}
_BASE_KEYS = {"kind", "dtype", "shape", "mode", "sections"}
_ENTRY_KEYS = {
    "raw": set(),
    "zero": set(),
    "exact": {"count", "positions"},
    "quant": {"bits", "n_centroids", "exponent"},
}
_N_SECTIONS = {"raw": 1, "zero": 0, "exact": 2, "quant": 2}
_POSITION_WIDTH = {"mask": None, "u32": 4, "u64": 8}


@dataclass(frozen=True)
class _TocEntry:
    """One array of the table of contents, every field type- and range-checked against the data region."""

    where: str
    kind: str
    mode: str
    dtype_name: str
    shape: tuple
    numel: int
    sections: tuple  # ((offset, length), ...) relative to the data region
    count: int | None = None  # exact
    positions: str | None = None  # exact
    bits: int | None = None  # quant
    n_centroids: int | None = None  # quant
    exponent: int | None = None  # quant

    @property
    def dtype(self) -> np.dtype:
        return _DTYPES[self.dtype_name]


def _parse_toc(payload) -> tuple[dict, int, memoryview]:
    """``(toc, toc_len, data)`` of a payload: the parsed table of contents (its top level checked) and a view of
    the data region. The JSON text is decoded straight from the payload buffer (no intermediate copy)."""
    mv = memoryview(payload).cast("B")
    if len(mv) < 4:
        raise ExCPFormatError(f"payload of {len(mv)} bytes is too short for its table of contents")
    (toc_len,) = struct.unpack_from("<I", mv, 0)
    if toc_len > len(mv) - 4:
        raise ExCPFormatError(f"table of contents length {toc_len} exceeds the {len(mv) - 4} payload bytes")
    try:
        toc = json.loads(str(mv[4:4 + toc_len], "utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ExCPFormatError(f"table of contents is not valid JSON ({type(e).__name__})") from None
    if not isinstance(toc, dict) or set(toc) != _TOC_KEYS:
        raise ExCPFormatError("table of contents lacks or has unexpected top-level keys")
    if not isinstance(toc["format"], str) or toc["format"] != "excp" or type(toc["version"]) is not int \
            or toc["version"] != VERSION:
        raise ExCPFormatError(f"table of contents has format {_short(toc['format'])} version {_short(toc['version'])}")
    if not isinstance(toc["config"], dict) or not isinstance(toc["params"], list):
        raise ExCPFormatError("table of contents: config must be an object and params a list")
    return toc, toc_len, mv[4 + toc_len:]


def _check_toc(toc: dict, data_len: int) -> list[tuple[str, list[_TocEntry]]]:
    """Validate every parameter and entry of a table of contents (from :func:`_parse_toc`) against a data region
    of ``data_len`` bytes: types before any use, ranges, the section layout and the section lengths each mode
    implies. Returns ``[(name, [entry, ...]), ...]``; raises :class:`ExCPFormatError`."""
    cursor = 0
    out, seen = [], set()
    for i, p in enumerate(toc["params"]):
        if not isinstance(p, dict) or set(p) != {"name", "arrays"} or not isinstance(p["name"], str) \
                or not isinstance(p["arrays"], list):
            raise ExCPFormatError(f"table of contents: parameter #{i} is malformed")
        name, arrays = p["name"], p["arrays"]
        if name in seen:
            _fail(name, "parameter listed twice")
        seen.add(name)
        if not arrays or not isinstance(arrays[0], dict) or arrays[0].get("kind") != "weight":
            _fail(name, "the weight entry must come first")
        if len(arrays) > len(KINDS):
            _fail(name, "too many arrays")
        entries, kinds, wshape = [], set(), None
        for j, e in enumerate(arrays):
            if not isinstance(e, dict):
                _fail(f"{name}[{j}]", "entry is not an object")
            kind = e.get("kind")
            if not isinstance(kind, str) or kind not in KINDS or kind in kinds:
                _fail(f"{name}[{j}]", f"unknown or repeated array kind {_short(kind)}")
            kinds.add(kind)
            where = f"{name}.{kind}"
            mode = e.get("mode")
            if not isinstance(mode, str) or mode not in _ENTRY_KEYS:
                _fail(where, f"unknown mode {_short(mode)}")
            if set(e) != _BASE_KEYS | _ENTRY_KEYS[mode]:
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
            sections = []
            for s in secs:
                if not isinstance(s, list) or len(s) != 2 or any(type(x) is not int for x in s):
                    _fail(where, f"bad section {_short(s)}")
                off, ln = s
                if off != cursor or ln < 0 or off + ln > data_len:
                    _fail(where, f"section [{off}, {ln}] is out of place (expected offset {cursor}, "
                                 f"{data_len} data bytes)")
                sections.append((off, ln))
                cursor = off + ln
            fields = {}
            if mode == "raw":
                need = numel * _DTYPES[dt].itemsize
                if sections[0][1] != need:
                    _fail(where, f"raw section holds {sections[0][1]} bytes, shape {shape} of {dt} needs {need}")
            elif mode == "exact":
                count = _toc_int(e, "count", 1, numel, where)
                pk = e["positions"]
                if not isinstance(pk, str) or pk not in _POSITION_WIDTH:
                    _fail(where, f"unknown positions encoding {_short(pk)}")
                width = _POSITION_WIDTH[pk]
                need = (numel + 7) // 8 if width is None else count * width
                if sections[0][1] != need:
                    what = f"{numel} positions" if width is None else f"{count} {pk} positions"
                    _fail(where, f"position {'mask' if width is None else 'list'} holds {sections[0][1]} bytes, "
                                 f"{what} need {need}")
                if sections[1][1] != 4 * count:
                    _fail(where, f"value section holds {sections[1][1]} bytes, {count} float32 values need "
                                 f"{4 * count}")
                fields = {"count": count, "positions": pk}
            elif mode == "quant":
                bits = _toc_int(e, "bits", 2, 8, where)
                k = _toc_int(e, "n_centroids", 1, (1 << bits) - 1, where)
                exponent = _toc_int(e, "exponent", EXPONENT_MIN, EXPONENT_MAX, where)
                if sections[0][1] != 2 * k:
                    _fail(where, f"centroid section holds {sections[0][1]} bytes, {k} float16 centroids need {2 * k}")
                need = (numel * bits + 7) // 8
                if sections[1][1] != need:
                    _fail(where, f"index section holds {sections[1][1]} bytes, {numel} indices of {bits} bits "
                                 f"need {need}")
                fields = {"bits": bits, "n_centroids": k, "exponent": exponent}
            entries.append(_TocEntry(where, kind, mode, dt, tuple(shape), numel, tuple(sections), **fields))
            if kind == "weight":
                wshape = shape
        out.append((name, entries))
    if cursor != data_len:
        raise ExCPFormatError(f"{data_len - cursor} unaccounted bytes after the last section")
    return out


def _decode_payload(payload, refs) -> dict:
    """Parse and validate a payload; ``refs``: name -> float32 reference (or None) / None for no refs."""
    toc, _, data = _parse_toc(payload)
    params = _check_toc(toc, len(data))
    out = {}
    for name, entries in params:
        arrays = {k: None for k in KINDS}
        for e in entries:
            base = None
            if e.mode != "raw" and e.kind == "weight":
                r = None if refs is None else refs.get(name)
                if r is None:
                    _fail(name, "stored as a residual but no reference weight was given")
                base = _as_float32_ref(r, name, e.shape, ExCPFormatError)
            arrays[e.kind] = _decode_entry(e, [data[off:off + ln] for off, ln in e.sections], base)
        out[name] = arrays
    return out


def _decode_entry(e: _TocEntry, views: list, base) -> np.ndarray:
    """One array from its checked TOC entry and section views (``base``: the float32 reference of a weight)."""
    where, shape, numel, dt = e.where, e.shape, e.numel, e.dtype
    if e.mode == "raw":
        a = np.frombuffer(views[0], dtype=_le(dt)).astype(dt).reshape(shape)
        if dt == np.bool_ and numel and np.frombuffer(views[0], np.uint8).max() > 1:
            _fail(where, "bool array holds bytes other than 0 and 1")
        return a
    # base is the float32 reference for weights, None (zeros) for moments; its shape was checked
    out = base.ravel().copy() if base is not None else None
    if e.mode == "zero":
        return (out if out is not None else np.zeros(numel, np.float32)).reshape(shape)
    if e.mode == "exact":
        pbuf, vbuf = views
        if e.positions == "mask":
            bits = np.unpackbits(np.frombuffer(pbuf, np.uint8))
            if bits[numel:].any():
                _fail(where, "non-zero pad bits after the position mask")
            pos = np.flatnonzero(bits[:numel])
            if pos.size != e.count:
                _fail(where, f"position mask marks {pos.size} positions, count says {e.count}")
        else:
            pos = np.frombuffer(pbuf, "<u4" if e.positions == "u32" else "<u8")
            if pos.size and (np.any(pos[1:] <= pos[:-1]) or int(pos[-1]) >= numel):
                _fail(where, "positions are not strictly increasing within the array")
            pos = pos.astype(np.intp)
        if out is None:
            out = np.zeros(numel, np.float32)
        out[pos] = np.frombuffer(vbuf, "<f4")
        return out.reshape(shape)
    # quant
    cbuf, ibuf = views
    c16 = np.frombuffer(cbuf, "<f2").astype(np.float16)
    table = _centroid_table(c16, e.exponent)  # [0, c_1 * 2**e, ...], over/underflow left to the check below
    if not np.all(np.isfinite(table)) or np.any(table[2:] <= table[1:-1]):
        _fail(where, f"centroids are not finite and strictly increasing (after scaling by 2**{e.exponent})")
    try:
        idx = unpack_bits(ibuf, e.bits, numel)
    except ExCPFormatError as err:
        _fail(where, str(err))
    if idx.size and int(idx.max()) > e.n_centroids:
        _fail(where, f"quantisation index {int(idx.max())} points past the {e.n_centroids}-entry centroid table")
    vals = table[idx]
    if out is None:
        return vals.reshape(shape)
    # W_ref + dequant(dW) only where the index is non-zero (a pruned position keeps W_ref's exact bits);
    # the float32 sum of a finite reference and a finite centroid may round to inf: that is the value
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(out, vals, out=out, where=idx != 0)
    return out.reshape(shape)


def decode_checkpoint(blob, ref_weights=None, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> dict:
    """Decode a blob from :func:`encode_checkpoint`; returns name -> {"weight", "exp_avg", "exp_avg_sq"}.

    ``ref_weights`` must hold the same reference weights the encoder was given (name -> array) for every
    parameter stored as a residual; wrong shapes or a missing reference raise :class:`ExCPFormatError`,
    as does anything wrong with the blob. ``max_payload_bytes`` bounds what the blob may expand to: a blob
    that declares a larger payload is refused before anything is allocated (default
    :data:`MAX_PAYLOAD_BYTES`, 32 GiB; a value that is not a non-negative integer raises :class:`ExCPError`).
    """
    limit = _check_limit(max_payload_bytes)
    if ref_weights is not None and not isinstance(ref_weights, Mapping):
        raise ExCPFormatError(f"ref_weights must be a mapping name -> array, got {type(ref_weights).__name__}")
    payload, _ = _unpack_container(blob, limit)
    return _decode_payload(payload, ref_weights)
