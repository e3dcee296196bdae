import os

import ml_dtypes

import lmc
from helpers import make


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_memory_growth():
    x = make(ml_dtypes.bfloat16, 500000)
    ref = make(ml_dtypes.bfloat16, 500000, seed=1)
    for _ in range(5):
        lmc.decompress(lmc.compress(x, reference=ref), reference=ref)
    before = _rss()
    for _ in range(100):
        b = lmc.compress(x, reference=ref)
        y = lmc.decompress(b, reference=ref)
    after = _rss()
    assert y.tobytes() == x.tobytes()
    assert after - before < 32 * 2**20, (before, after)
