"""ExCP quantisation: seeded 1-D k-means, float16 centroid tables with a power-of-two scale, and the packing
of quantisation indices (step 4 of the algorithm in :mod:`lmcbench.lossy.excp`; layout in FORMAT.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import EXPONENT_MAX, ExCPFormatError


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
