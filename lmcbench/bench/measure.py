"""Timing and entropy primitives."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numba
import numpy as np


@dataclass
class Timing:
    median: float
    min: float
    max: float
    cpu: float  # median process CPU seconds (all threads)
    repeats: int

    def __add__(self, other: "Timing") -> "Timing":
        return Timing(self.median + other.median, self.min + other.min, self.max + other.max, self.cpu + other.cpu,
                      min(self.repeats, other.repeats) if self.repeats else other.repeats)


ZERO = Timing(0.0, 0.0, 0.0, 0.0, 0)


def timed(fn, warmup: int = 1, repeats: int = 3, budget_s: float = 0.5):
    """Call ``fn`` ``warmup`` times untimed, then up to ``repeats`` times timed, stopping early once the timed
    calls have used ``budget_s`` seconds (at least one timed call). Returns the last result and the median,
    min and max wall seconds and the median CPU seconds."""
    out = None
    for _ in range(max(0, warmup)):
        out = fn()
    walls, cpus = [], []
    for _ in range(max(1, repeats)):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        t1, c1 = time.perf_counter(), time.process_time()
        walls.append(t1 - t0)
        cpus.append(c1 - c0)
        if sum(walls) >= budget_s:
            break
    return out, Timing(statistics.median(walls), min(walls), max(walls), statistics.median(cpus), len(walls))


def byte_histogram(a: np.ndarray) -> np.ndarray:
    """Counts of the 256 byte values in the bytes of ``a``."""
    return np.bincount(np.ascontiguousarray(a).reshape(-1).view(np.uint8), minlength=256).astype(np.int64)


def entropy_bits(hist: np.ndarray) -> float:
    """Order-0 entropy in bits per symbol of a histogram (0 for an empty one)."""
    n = int(hist.sum())
    if n == 0:
        return 0.0
    p = hist[hist > 0] / n
    return float(-(p * np.log2(p)).sum())


def block_entropies(a: np.ndarray, block: int = 65536) -> np.ndarray:
    """Order-0 entropy (bits per byte) of every ``block``-byte block of ``a`` (the last one may be shorter)."""
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return np.array([entropy_bits(np.bincount(b[i:i + block], minlength=256)) for i in range(0, len(b), block)])


def block_bound_bytes(a: np.ndarray, block: int = 65536) -> float:
    """The order-0 bound in bytes when every ``block``-byte block of ``a`` gets its own code (as per-chunk
    Huffman tables do): the sum over blocks of entropy x length / 8."""
    n = np.ascontiguousarray(a).nbytes
    if n == 0:
        return 0.0
    lengths = np.full(-(-n // block), block, np.int64)
    lengths[-1] = n - block * (len(lengths) - 1)
    return float((block_entropies(a, block) * lengths).sum() / 8)


def plane_context_counts(x: np.ndarray, ref: np.ndarray) -> list[np.ndarray]:
    """Per byte plane of the elements (index ``j`` = byte ``j``, little-endian), the counts of that byte under a
    context from the reference: the reference's same byte, and whether every more significant byte of the
    element equals the reference's (planes are taken from the most significant down, so this is the chain rule
    with the higher planes summarised by one bit). Returned as ``(512 contexts, 256 values)`` arrays."""
    k = x.dtype.itemsize
    xb = np.ascontiguousarray(x).reshape(-1).view(np.uint8).reshape(-1, k)
    rb = np.ascontiguousarray(ref).reshape(-1).view(np.uint8).reshape(-1, k)
    if xb.shape != rb.shape:
        raise ValueError(f"plane_context_counts: {xb.shape} and {rb.shape} are not aligned")
    counts = np.zeros((k, 512, 256), np.int64)
    _plane_counts(xb, rb, counts)
    return list(counts)


@numba.njit(nogil=True, cache=True)
def _plane_counts(xb, rb, counts):  # pragma: no cover - compiled (the NumPy form is in the tests)
    n, k = xb.shape
    for i in range(n):
        same = 1
        for j in range(k - 1, -1, -1):
            a = xb[i, j]
            c = rb[i, j]
            counts[j, (same << 8) | c, a] += 1
            if a != c:
                same = 0


def adaptive_bits(counts: np.ndarray, alpha: float = 0.5) -> float:
    """Code length in bits of a byte sequence with these per-context counts (rows: contexts, columns: the 256
    byte values) under an adaptive arithmetic coder with one Krichevsky-Trofimov estimator per context.

    It depends only on the counts, not on the order, and it includes the cost of learning each context's
    distribution, so it is a size a real coder reaches (within a few bytes), not an optimistic empirical
    entropy: with 256 contexts x 256 values the plain conditional entropy of a 64 Ki-byte block would
    understate a random byte by ~1 bit. With one context it is the adaptive order-0 code length."""
    counts = np.atleast_2d(np.asarray(counts, np.int64))
    n = counts.sum(axis=1)
    k = counts.shape[1]
    nats = (_lgamma(n[n > 0], k * alpha) - math.lgamma(k * alpha)).sum()
    nats -= (_lgamma(counts[counts > 0], alpha) - math.lgamma(alpha)).sum()
    return float(nats / math.log(2))


_LGAMMA_TABLE: dict[float, np.ndarray] = {}
_vlgamma = np.frompyfunc(math.lgamma, 1, 1)


def _lgamma(c: np.ndarray, shift: float) -> np.ndarray:
    """``lgamma(c + shift)`` for non-negative integer counts: a table below 2**16, the function above."""
    table = _LGAMMA_TABLE.get(shift)
    if table is None:
        table = _LGAMMA_TABLE[shift] = _vlgamma(np.arange(1 << 16) + shift).astype(np.float64)
    c = np.asarray(c, np.int64)
    out = np.empty(c.shape, np.float64)
    small = c < table.size
    out[small] = table[c[small]]
    if not small.all():
        out[~small] = _vlgamma(c[~small] + shift).astype(np.float64)
    return out
