"""Pure-Python oracles the kernels are checked against."""
import heapq

import ml_dtypes
import numpy as np
import pytest

import lmc
from lmc import _kernels as K


def py_huffman_cost(freq):
    """Optimal (unlimited) Huffman cost in bits via heapq."""
    h = [f for f in freq if f > 0]
    if len(h) <= 1:
        return 0
    heapq.heapify(h)
    cost = 0
    while len(h) > 1:
        a = heapq.heappop(h)
        b = heapq.heappop(h)
        cost += a + b
        heapq.heappush(h, a + b)
    return cost


def entropy_bits(counts):
    c = np.asarray(counts, np.float64)
    c = c[c > 0]
    n = c.sum()
    return float(-(c * np.log2(c / n)).sum())


@pytest.mark.parametrize("seed", range(30))
def test_huffman_lengths_vs_oracle(seed):
    rng = np.random.default_rng(seed)
    m = rng.integers(2, 257)
    freq = np.zeros(256, np.int64)
    syms = rng.choice(256, m, replace=False)
    if seed % 3 == 0:
        freq[syms] = (rng.pareto(1.0, m) * 50).astype(np.int64) + 1  # heavy tail
    else:
        freq[syms] = rng.integers(1, 1000, m)
    lens = np.zeros(256, np.uint8)
    assert K.huffman_lengths(freq, lens) == m
    assert lens.max() <= 11
    assert ((lens > 0) == (freq > 0)).all()
    kraft = sum(2.0 ** -int(x) for x in lens if x)
    assert kraft == 1.0
    cost = int((freq * lens).sum())
    opt = py_huffman_cost(freq)
    assert cost >= opt
    ent = entropy_bits(freq)
    assert cost >= ent - 1e-6
    if cost != opt:  # only when the 11-bit limit was active
        assert cost <= opt * 1.03 + 64


def py_limited_cost(weights, maxlen=11):
    """Optimal cost (bits) of a complete prefix code with lengths <= maxlen,
    by dynamic programming over the levels (independent of package-merge):
    at depth d with `a` free nodes, assign t of the heaviest remaining
    symbols to depth d and split the other a - t nodes."""
    from functools import lru_cache
    w = sorted((int(v) for v in weights), reverse=True)
    m = len(w)
    suffix = [0] * (m + 1)
    for i in range(m - 1, -1, -1):
        suffix[i] = suffix[i + 1] + w[i]

    @lru_cache(None)
    def f(d, a, i):
        if i == m:
            return 0 if a == 0 else None
        if d > maxlen or a == 0:
            return None
        best = None
        for t in range(min(a, m - i) + 1):
            r = a - t
            if 2 * r > m - i - t or (i + t == m and r):
                continue
            v = f(d + 1, 2 * r, i + t)
            if v is not None and (best is None or v < best):
                best = v
        return None if best is None else suffix[i] + best

    return f(1, 2, 0)


@pytest.mark.parametrize("seed", range(40))
def test_huffman_lengths_optimal_when_limited(seed):
    """With the 11-bit limit active the lengths are still optimal
    (package-merge), as checked against a DP oracle."""
    rng = np.random.default_rng(100 + seed)
    m = int(rng.integers(2, 40))
    freq = np.zeros(256, np.int64)
    syms = rng.choice(256, m, replace=False)
    freq[syms] = (rng.pareto(0.6, m) * rng.integers(1, 100)).astype(np.int64) + 1
    if seed % 4 == 0:  # exponent-like: a few huge counts and a tail of 1s
        freq[syms] = np.maximum(1, (1e6 * 0.5 ** np.arange(m))).astype(np.int64)
    lens = np.zeros(256, np.uint8)
    assert K.huffman_lengths(freq, lens) == m
    assert lens.max() <= 11 and ((lens > 0) == (freq > 0)).all()
    assert sum(2.0 ** -int(x) for x in lens if x) == 1.0
    assert int((freq * lens).sum()) == py_limited_cost(freq[syms])


def _py_planes_bf16(x):
    v = x.view(np.uint16).astype(np.uint32)
    return [((v >> 7) & 0xFF).astype(np.uint8), (((v >> 8) & 0x80) | (v & 0x7F)).astype(np.uint8)]


def test_size_near_entropy_bound_bf16():
    n = 1 << 20
    chunk = 131072
    x = (np.random.default_rng(0).standard_normal(n) * 0.02).astype(ml_dtypes.bfloat16)
    blob = lmc.compress(x, chunk_size=chunk)
    bound = 0.0
    for s in range(0, n, chunk):
        for p in _py_planes_bf16(x[s:s + chunk]):
            bound += entropy_bits(np.bincount(p, minlength=256)) / 8
    assert len(blob) >= bound
    assert len(blob) <= bound * 1.01, (len(blob), bound)
    # the exponent (Huffman) streams alone are within 2% of their entropy
    exp_bound = sum(entropy_bits(np.bincount(_py_planes_bf16(x[s:s + chunk])[0], minlength=256))
                    for s in range(0, n, chunk)) / 8
    mant = n  # raw sign/mantissa bytes
    assert len(blob) - mant <= exp_bound * 1.02 + 200 * (n // chunk)


def test_split_matches_python_planes():
    x = (np.random.default_rng(1).standard_normal(10000) * 0.02).astype(ml_dtypes.bfloat16)
    planes = np.empty((2, 10000), np.uint8)
    u8 = x.view(np.uint8)
    K.split_chunk(u8, u8, False, 0, 10000, 2, K.LAYOUT_BF16, planes)
    e, m = _py_planes_bf16(x)
    assert np.array_equal(planes[0], e) and np.array_equal(planes[1], m)
