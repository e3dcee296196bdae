"""kernels.histo: the counts per sub-stream by 32-byte vectors compared with a skewed plane's 16 commonest values
(AVX2) are the plain loop's, for every length, every position of the values that match none of them, and planes
that are not skewed (the plain loop then); and the encoder's blobs do not change (test_vectors reproduces every
frozen blob)."""
import numpy as np
import pytest

from lmc.kernels import histo
from lmc.kernels.histo import MIN_N, TOP, histo4, histo4_plain, top_values


def _both(p, n):
    a = np.zeros((4, 256), np.int64)
    b = np.zeros((4, 256), np.int64)
    a[1, 7] = 5  # counts are added to what h holds
    b[1, 7] = 5
    histo4_plain(p, n, a)
    histo4(p, n, b)
    return a, b


def _skewed(n, seed, values=10, rare=0.0):
    rng = np.random.default_rng(seed)
    p = (120 + rng.integers(0, values, n)).astype(np.uint8)
    k = int(n * rare)
    if k:
        p[rng.choice(n, k, replace=False)] = rng.integers(0, 256, k)   # values outside the commonest 16
    return p


@pytest.mark.parametrize("n", [MIN_N - 1, MIN_N, MIN_N + 1, 8191, 8192 + 31, 32 * 255, 32 * 255 + 33, 131072,
                               131077])
def test_skewed_planes(n):
    for seed, values, rare in ((1, 10, 0.0), (2, 16, 0.0), (3, 12, 0.004), (4, 3, 0.008)):
        p = _skewed(n + 40, seed, values, rare)
        a, b = _both(p, n)
        assert (a == b).all(), (n, seed)
        assert a.sum() == n + 5


def test_values_matching_none_anywhere():
    """Every position of a vector and of a block of 255 vectors, and the tail, holding a value outside the 16."""
    n = 32 * 300 + 17
    p = _skewed(n, 5, values=8)
    for i in list(range(0, 64)) + [32 * 255 - 1, 32 * 255, 32 * 300 - 1, 32 * 300, n - 1]:
        p[i] = 3 + (i % 7)
    assert top_values(p, n)[1]
    a, b = _both(p, n)
    assert (a == b).all()


def test_planes_that_are_not_skewed():
    rng = np.random.default_rng(6)
    flat = rng.integers(0, 256, 70000).astype(np.uint8)
    spread = (100 + rng.integers(0, 40, 70000)).astype(np.uint8)      # 40 values: beyond 16
    tail = _skewed(70000, 7, values=10, rare=0.05)                     # 5% outside the 16
    for p in (flat, spread, tail):
        assert not top_values(p, p.size)[1]
        a, b = _both(p, p.size)
        assert (a == b).all()
    one = np.full(50000, 9, np.uint8)
    assert top_values(one, one.size)[1]
    a, b = _both(one, one.size)
    assert (a == b).all() and a[:, 9].sum() == 50000


def test_top_values_are_distinct_and_commonest():
    p = _skewed(40000, 8, values=5)
    syms, skewed = top_values(p, p.size)
    assert skewed and len(set(syms.tolist())) == TOP == syms.size
    assert set(range(120, 125)) <= set(syms.tolist())


def test_the_vector_path_runs_where_the_cpu_has_it():
    """Not vacuous: with AVX2 (simd.SIMD) a skewed plane is counted by the vectors, which give the plain loop's
    counts; elsewhere histo4 is the plain loop."""
    p = _skewed(20000, 9, values=6, rare=0.002)
    if not histo.SIMD:
        pytest.skip("no AVX2 (or LMC_SIMD=0, or a checked build): histo4 is the plain loop")
    h = np.zeros((4, 256), np.int64)
    syms, skewed = top_values(p, p.size)
    assert skewed
    histo._histo4_top(p, p.size, h, syms)
    a = np.zeros((4, 256), np.int64)
    histo4_plain(p, p.size, a)
    assert (h == a).all()
