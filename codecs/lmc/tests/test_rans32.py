"""Format 7: rANS streams of 8192 symbols or more with 32 interleaved states (FORMAT.md, "rANS"), decoded in
AVX2 vectors where the CPU has them (kernels/simd.py) and one symbol at a time elsewhere, to the same symbols.

The vector decoder is checked against the pure-Python oracle (tests/pyref.py, written from FORMAT.md), against
the scalar build in a subprocess (``LMC_SIMD=0``), and on hostile streams: truncated, forged states, flipped
words, streams far shorter than their symbol count claims."""
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lmc
import pyref
from lmc.kernels import base as kbase
from lmc.kernels import rans as krans
from lmc.kernels import simd
from make_vectors import OUT, load

HERE = os.path.dirname(os.path.abspath(__file__))


def _tables(syms_list, nctx):
    """Per-context normalised tables of the symbols in syms_list[c] (f, cm int64[nctx * 256]; dtab
    uint32[nctx * 4096])."""
    f = np.zeros(nctx * 256, np.int64)
    cm = np.zeros(nctx * 256, np.int64)
    dtab = np.zeros(nctx * 4096, np.uint32)
    for c in range(nctx):
        cnt = np.bincount(syms_list[c], minlength=256).astype(np.int64) if len(syms_list[c]) else np.zeros(256,
                                                                                                            np.int64)
        if cnt.sum() == 0:
            cnt[0] = 1
        krans.rans_normalize(cnt, 0, 256, f[c * 256:(c + 1) * 256])
        krans.cum_freqs(f, c * 256, cm)
        krans.build_rans_dtab(f, cm, c * 256, dtab, c * 4096)
    return f, cm, dtab


def _stream(rng, n, nctx=1, k=None):
    """Symbols (skewed, k distinct per context), contexts and the 32-state stream coding them."""
    ctx = rng.integers(0, nctx, n).astype(np.uint16)
    syms = np.empty(n, np.uint8)
    for c in range(nctx):
        kk = k or int(rng.integers(1, 40))
        p = rng.dirichlet(np.full(kk, rng.uniform(0.05, 2.0)))
        sel = ctx == c
        syms[sel] = (rng.choice(kk, int(sel.sum()), p=p) + c * 3).astype(np.uint8)
    f, cm, dtab = _tables([syms[ctx == c] for c in range(nctx)], nctx)
    buf = np.zeros(2 * n + 4 * 32 + 16, np.uint8)
    q = krans.rans_encode(syms, ctx, nctx > 1, n, f, cm, buf, 32)
    return syms, ctx, f, cm, dtab, buf[q:].copy()


def _decode(stream, dtab, n, ctx=None):
    out = np.zeros(n + 16, np.uint8)
    cb = krans._NO_CB if ctx is None else (ctx.astype(np.uint16) << 12).astype(np.uint16)
    st = krans.lanes_decode(stream, 0, stream.size, dtab, cb, out, n)
    return st, out[:n]


def test_states_by_length_and_version():
    assert krans.rans_states_for(8191, 7) == 4
    assert krans.rans_states_for(8192, 7) == 32
    assert krans.rans_states_for(1 << 20, 6) == 4
    assert pyref.states(8192, 7) == 32 and pyref.states(8191, 7) == 4 and pyref.states(1 << 20, 6) == 4


@pytest.mark.parametrize("n", [8192, 8193, 8223, 8224, 8255, 40000])
@pytest.mark.parametrize("nctx", [1, 3])
def test_roundtrip_matches_oracle(n, nctx):
    rng = np.random.default_rng(n * 7 + nctx)
    syms, ctx, f, cm, dtab, stream = _stream(rng, n, nctx)
    st, out = _decode(stream, dtab, n, ctx if nctx > 1 else None)
    assert st == kbase.OK and np.array_equal(out, syms)
    # the oracle reads the same bytes as 32 states from FORMAT.md
    tabs = []
    for c in range(nctx):
        fc = [int(v) for v in f[c * 256:(c + 1) * 256]]
        cum = [int(v) for v in cm[c * 256:(c + 1) * 256]]
        slots = [0] * 4096
        for s in range(256):
            for j in range(fc[s]):
                slots[cum[s] + j] = s
        tabs.append((fc, cum, slots))
    got = pyref.rans(stream.tobytes(), 0, stream.size, [tabs[c] for c in ctx], n, 32)
    assert got == syms.tolist()


def test_highly_skewed_and_single_symbol_streams():
    rng = np.random.default_rng(5)
    for k in (1, 2):
        syms, ctx, f, cm, dtab, stream = _stream(rng, 20000, 1, k)
        st, out = _decode(stream, dtab, 20000)
        assert st == kbase.OK and np.array_equal(out, syms)
    # one symbol: no word at all, the stream is the 32 states, each 2^16
    syms = np.full(9000, 7, np.uint8)
    f, cm, dtab = _tables([syms], 1)
    buf = np.zeros(2 * 9000 + 200, np.uint8)
    q = krans.rans_encode(syms, syms, False, 9000, f, cm, buf, 32)
    assert buf.size - q == 128
    st, out = _decode(buf[q:].copy(), dtab, 9000)
    assert st == kbase.OK and (out == 7).all()


def test_hostile_streams_are_refused_without_crashing():
    rng = np.random.default_rng(11)
    syms, ctx, f, cm, dtab, stream = _stream(rng, 30000, 1)
    n = 30000
    # truncated anywhere: refused (the decoder reads only inside the stream it is given)
    for cut in list(range(0, 140, 7)) + list(range(140, stream.size, max(1, stream.size // 40))):
        st, _ = _decode(stream[:cut].copy(), dtab, n)
        assert st != kbase.OK, cut
    # a state below 2^16
    bad = stream.copy()
    bad[4 * 5 + 2:4 * 5 + 4] = 0
    assert _decode(bad, dtab, n)[0] == kbase.ERR_RANS
    # a flipped bit in a word: the final states no longer come back to 2^16 (all 40 here are refused)
    refused = 0
    for i in range(40):
        bad = stream.copy()
        j = int(rng.integers(128, stream.size))
        bad[j] ^= np.uint8(1 << int(rng.integers(0, 8)))
        refused += _decode(bad, dtab, n)[0] != kbase.OK
    assert refused == 40
    # far more symbols than the stream can hold, and random bytes as a stream
    assert _decode(stream, dtab, n * 50)[0] == kbase.ERR_RANS
    for i in range(20):
        junk = rng.integers(0, 256, int(rng.integers(128, 4000))).astype(np.uint8)
        junk[:128] |= 0x80   # states >= 2^16 (top byte set), so the decoder runs on
        assert _decode(junk, dtab, int(rng.integers(8192, 60000)))[0] == kbase.ERR_RANS


def _blobs():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal(70000) * 0.02).astype(np.float32)
    w2 = w + (rng.standard_normal(70000) * 1e-4).astype(np.float32)
    sq = np.abs(rng.standard_normal((300, 256)) * 1e-4).astype(np.float32) ** 2
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        yield w2.astype(dt), w.astype(dt)
        yield w2.astype(dt), None
    yield sq, None
    yield sq.astype(ml_dtypes.bfloat16), None


@pytest.mark.parametrize("prefer", ["speed", "size", "fast"])
def test_format7_blobs_roundtrip_and_match_the_oracle(prefer):
    for x, r in _blobs():
        blob = lmc.compress(x, reference=r, format_version=7, prefer=prefer, chunk_size=32768)
        assert lmc.info(blob)["version"] == 7
        y = lmc.decompress(blob, reference=r)
        assert y.tobytes() == x.tobytes()
        out, _cm, _sm = pyref.decode(blob, None if r is None else r.tobytes())
        assert out == x.tobytes()


def test_format7_blob_truncated_or_flipped_is_refused():
    x, r = next(_blobs())
    blob = lmc.compress(x, reference=r, format_version=7, chunk_size=32768)
    for cut in (len(blob) - 1, len(blob) // 2, 60):
        with pytest.raises(lmc.FormatError):
            lmc.decompress(blob[:cut], reference=r)
    rng = np.random.default_rng(0)
    for _ in range(30):
        b = bytearray(blob)
        b[int(rng.integers(0, len(b)))] ^= 1 << int(rng.integers(0, 8))
        try:
            y = lmc.decompress(bytes(b), reference=r)
        except lmc.FormatError:
            continue
        assert y.tobytes() == x.tobytes()   # (a flip the checksums let through must not change the data)


def test_scalar_build_decodes_the_same(tmp_path):
    """LMC_SIMD=0 (the build a CPU without AVX2 gets): SIMD is off, and the frozen format 7 vectors decode to
    the same bytes as here."""
    man = json.load(open(os.path.join(OUT, "manifest.json")))
    v7 = sorted(n for n, e in man.items() if e["format_version"] == 7)
    assert v7
    code = f"""
import json, os, sys
sys.path.insert(0, {HERE!r})
import lmc
from lmc.kernels import simd
from make_vectors import OUT, load
assert simd.SIMD is False
man = json.load(open(os.path.join(OUT, "manifest.json")))
for name in {v7!r}:
    e = man[name]
    ref = load(name, e, ".ref.npy") if e["reference"] else None
    y = lmc.decompress(open(os.path.join(OUT, name + ".lmc"), "rb").read(), reference=ref)
    assert y.tobytes() == load(name, e).tobytes(), name
print("scalar ok", len({v7!r}))
"""
    env = dict(os.environ, LMC_SIMD="0")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "scalar ok" in res.stdout


def test_simd_flag_follows_the_cpu_and_the_environment():
    import llvmlite.binding as ll
    import numba
    has = bool(ll.get_host_cpu_features().get("avx2"))
    expect = has and not numba.config.DISABLE_JIT and not simd.CHECKED and os.environ.get("LMC_SIMD") != "0"
    assert simd.SIMD == expect
    # the permutation table: lane j of mask m takes the word after those of m's lanes below j
    for m in (0, 1, 0b10110101, 255):
        k = 0
        for j in range(8):
            if m >> j & 1:
                assert simd.PERM[m * 8 + j] == k
                k += 1
