"""ExCP pruning: the weight-residual mask (median threshold scaled by the second moment) and the
moment mask (steps 2 and 3 of the algorithm in :mod:`lmcbench.lossy.excp`)."""

from __future__ import annotations

import math

import numpy as np

from .config import ExCPError


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
