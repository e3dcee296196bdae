"""Pure-Python oracles the kernels are checked against."""
import heapq

import ml_dtypes
import numpy as np
import pytest

import lmc
from lmc.kernels import base as kbase, huffman as khuffman, rans as krans, streams as kstreams, temporal as ktemporal


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
    assert khuffman.huffman_lengths(freq, lens) == m
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
    assert khuffman.huffman_lengths(freq, lens) == m
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
    kbase.split_chunk(u8, u8, False, 0, 10000, 2, kbase.LAYOUT_BF16, planes, True)
    e, m = _py_planes_bf16(x)
    assert np.array_equal(planes[0], e) and np.array_equal(planes[1], m)


# ---------------------------------------------------------------------------
# format v2: rANS and the temporal mode against the pure-Python decoder
# (tests/pyref.py, written from FORMAT.md independently of the kernels)
# ---------------------------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402

import pyref  # noqa: E402
from helpers import make  # noqa: E402
from make_vectors import OUT, load, train_pair  # noqa: E402


def test_vectors_decode_with_python_oracle():
    man = json.load(open(os.path.join(OUT, "manifest.json")))
    cmodes, smodes = set(), set()
    for name, e in man.items():
        x = load(name, e)
        ref = load(name, e, ".ref.npy").tobytes() if e["reference"] else None
        blob = open(os.path.join(OUT, name + ".lmc"), "rb").read()
        out, cm, sm = pyref.decode(blob, ref)
        assert out == x.tobytes(), name
        cmodes |= cm
        smodes |= sm
    assert cmodes == {0, 1, 2, 3, 4, 5, 6, 7} and smodes == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", range(20))
def test_rans_normalize_and_roundtrip(seed):
    rng = np.random.default_rng(seed)
    nsym = int(rng.integers(1, 257))
    cnt = np.zeros(256, np.int64)
    m = int(rng.integers(1, nsym + 1))
    syms = rng.choice(nsym, m, replace=False)
    cnt[syms] = (rng.pareto(0.7, m) * rng.integers(1, 1000)).astype(np.int64) + 1
    f = np.zeros(256, np.int64)
    assert krans.rans_normalize(cnt, 0, 256, f) == m
    assert f.sum() == 4096 and ((f > 0) == (cnt > 0)).all()
    # encode a sequence with these counts, decode with the Python oracle
    seq = np.repeat(np.arange(256), np.minimum(cnt, 300)).astype(np.uint8)
    rng.shuffle(seq)
    cm = np.zeros(256, np.int64)
    krans.cum_freqs(f, 0, cm)
    n = seq.size
    buf = np.zeros(2 * n + 16, np.uint8)
    p = krans.rans_encode(seq, seq, False, n, f, cm, buf, 4)
    stream = bytes(buf[p:])
    tab = bytearray(krans.freq_table_bytes(f, 0, 256))
    tarr = np.zeros(len(tab), np.uint8)
    assert krans.write_freq_table(f, 0, 256, tarr, 0) == len(tab)
    t, q = pyref.freq_table(tarr.tobytes(), 0, len(tab), 255)
    assert q == len(tab)
    assert pyref.rans(stream, 0, len(stream), [t] * n, n) == list(seq)
    # size close to the estimate
    bits = krans.rans_cost_bits(np.bincount(seq, minlength=256).astype(np.int64), f, 0, 256)
    assert len(stream) <= bits / 8 + 16 + 8


@pytest.mark.parametrize("dt", [np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["train", "random", "same", "allbits"])
def test_temporal_against_python_decoder(dt, case):
    if case == "allbits":
        if np.dtype(dt).itemsize != 2:
            x = np.random.default_rng(3).integers(0, 2**32, 3000, dtype=np.uint32).view(dt)
        else:
            x = np.arange(65536, dtype=np.uint16)[::7].copy().view(dt)
        r = x.copy()
        np.random.default_rng(4).shuffle(r)
    elif case == "random":
        x, _ = train_pair(dt, 3000, 1)
        r = make(dt, 3000, seed=5, kind="random")
    else:
        x, r = train_pair(dt, 3000, 2)
        if case == "same":
            r = x.copy()
    blob = lmc.compress(x, reference=r, chunk_size=700)
    out, cm, _ = pyref.decode(blob, r.tobytes())
    assert out == x.tobytes()
    assert lmc.decompress(blob, reference=r).tobytes() == x.tobytes()


def test_temporal_estimate_matches_actual():
    """The encoder's temporal estimate (tables + rANS + raw bits) is within
    a few bytes of the written chunk."""
    x, r = train_pair(ml_dtypes.bfloat16, 50000, 3)
    n = x.size
    xb, rb = x.view(np.uint8), r.view(np.uint8)
    E = ktemporal.temporal_base(rb, 0, n, kbase.LAYOUT_BF16)
    jb = np.empty(n, np.uint16)
    low = np.empty(n + 16, np.uint32)
    th = np.empty(4 * 16 * 65, np.int32)
    ha = np.empty(2 * 1024, np.int32)
    hx = np.empty(2 * 1024, np.int32)
    hist = np.empty(16 * 256, np.int64)
    f = np.zeros(16 * 256, np.int64)
    cm = np.zeros(16 * 256, np.int64)
    raw = ktemporal.temporal_count(xb, rb, 0, n, kbase.LAYOUT_BF16, E, jb, low, th)
    kstreams.stream_count(xb, rb, False, 0, n, kbase.LAYOUT_BF16, ha)
    kstreams.stream_count(xb, rb, True, 0, n, kbase.LAYOUT_BF16, hx)
    ktemporal.temporal_hist(th, 16, hist)
    est, cmask = ktemporal.temporal_estimate(hist, f, cm, 16, n, 6)
    out = np.zeros(4 * n, np.uint8)
    end = ktemporal.temporal_write(E, cmask, jb, low, n, 16, f, cm, raw, out, 0, out.size,
                           np.zeros(2 * n + 16, np.uint8), np.zeros(16 * 65, np.uint8),
                           np.zeros(2 * 16 * 65, np.uint64), 6)
    est_total = 4 + est + 4 + (raw + 7) // 8
    assert abs(end - est_total) <= 16, (end, est_total)
    # the stream counts of the units and of the units XOR the reference
    e_a, m_a = _py_planes_bf16(x)
    e_x, m_x = _py_planes_bf16((x.view(np.uint16) ^ r.view(np.uint16)).view(ml_dtypes.bfloat16))
    for hs, planes in ((ha, (e_a, m_a)), (hx, (e_x, m_x))):
        for s, p in enumerate(planes):
            for k in range(4):
                want_h = np.bincount(p[k::4], minlength=256)
                assert np.array_equal(hs[s * 1024 + k * 256:s * 1024 + k * 256 + 256], want_h)
    # python oracle: the symbols are the (class, sign) of the monotone difference
    W, sb, mask = 16, 1 << 15, 0xFFFF
    xv, rv = x.view(np.uint16).astype(np.int64), r.view(np.uint16).astype(np.int64)

    def mono(v):
        return np.where(v & sb, v ^ mask, v ^ sb)
    d = (mono(xv) - mono(rv)) & mask
    neg = (d & sb) != 0
    a = np.where(neg, (-d) & mask, d)
    k = np.array([int(v).bit_length() for v in a])
    want = np.where(a == 0, 0, 2 * k - 1 + neg)
    ectx = (rv >> 7) & 0xFF
    ctx = np.where(ectx == 0xFF, 15, np.clip(E - ectx, 0, 14))
    assert np.array_equal(jb, (ctx * 33 + want).astype(np.uint16))
    want_low = np.where(a == 0, 0, a - (1 << np.maximum(k - 1, 0)))
    if ktemporal.SIMD:   # the symbol pass packed the raw bits (k - 1 of each element, LSB-first) into low's bytes
        acc, bit = 0, 0
        for v, kb in zip(want_low.tolist(), np.maximum(k - 1, 0).tolist()):
            acc |= v << bit
            bit += kb
        assert bit == raw
        assert low.view(np.uint8)[:(bit + 7) // 8].tobytes() == acc.to_bytes((bit + 7) // 8, "little")
    else:
        assert np.array_equal(low[:n], want_low.astype(np.uint32))
    for c in range(16):
        for s in range(33):
            assert hist[c * 256 + s] == np.sum((ctx == c) & (want == s))
