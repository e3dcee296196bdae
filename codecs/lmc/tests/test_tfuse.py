"""The temporal decoder's fused vector pass (kernels/tfuse.py): a 32-state temporal chunk decoded through it gives
the units and the status of the three passes (``temporal._tdec_three``: contexts, symbols, raw bits), on chunks whose
fused rounds stop at every kind of edge, and on forged chunks (flipped, truncated, a context mask or base changed).
Where the CPU has no AVX2 (or ``LMC_SIMD=0``) ``temporal_decode`` is ``_tdec_three`` itself and the test still decodes
every chunk both ways."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lmc
from lmc import api
from lmc.kernels import rans as krans
from lmc.kernels import simd
from lmc.kernels import temporal as kt
from lmc.kernels.base import CHUNK_TEMPORAL, ERR_CTX, NCTX, OK
from lmc.kernels.drivers import stream_scratch
from lmc.kernels.rans import LANES_MIN, rans_states_for
from lmc.kernels.tfuse import fused_budget, fused_rounds

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}


def _series(rng, n, dt, special=False, wild=0.0):
    """A reference r and the next step x: weights-like values moved a little, a share `wild` of them anywhere
    (their raw bits up to W - 1), with infinities, NaNs, zeros and subnormals in r where `special`."""
    r = (rng.standard_normal(n) * 0.02).astype(np.float32)
    x = r + (rng.standard_normal(n) * 2e-4).astype(np.float32)
    if wild:
        k = rng.random(n) < wild
        x[k] = rng.standard_normal(int(k.sum())).astype(np.float32) * 1e3
    if special:
        idx = rng.choice(n, 64, replace=False)
        r[idx[:16]] = np.inf
        r[idx[16:24]] = -np.inf
        r[idx[24:40]] = np.nan
        r[idx[40:52]] = 0.0
        r[idx[52:]] = 1e-42
    return x.astype(DTYPES[dt]), r.astype(DTYPES[dt])


def _temporal_chunks(x, r, chunk):
    """(blob bytes, offset, size, first element, n) of each temporal chunk of x coded against r."""
    blob = lmc.compress(x, reference=r, chunk_size=chunk, threads=1, prefer="size")
    h = api._parse_header(blob)
    bb = np.frombuffer(blob, np.uint8)
    out = []
    for c in range(len(h["offsets"])):
        off, size = int(h["offsets"][c]), int(h["sizes"][c])
        if bb[off] == CHUNK_TEMPORAL:
            out.append((bb, off, size, c * chunk, min(chunk, x.size - c * chunk)))
    return out


def _both(body, n, layout, ref8, start, W):
    """Decode one temporal chunk body (its mode byte first) through temporal_decode and through _tdec_three, fresh
    scratch each; returns ((status, units), (status, units))."""
    res = []
    for fused in (True, False):
        _, _, _, _, _, _, f, cm, dtab = stream_scratch(2, n, n)
        cb = np.empty(n + 16, np.uint16)
        syms = np.empty(n + 16, np.uint8)
        out = np.zeros(ref8.size, np.uint8)
        if fused:
            st = kt.temporal_decode(body, 1, body.size, n, layout, ref8, start, out, f, cm, dtab, cb, syms, 9)
        else:
            _, mb, em = kt._fparams(layout)
            u = np.uint32 if W == 32 else np.uint16
            k = W // 8
            r = ref8[k * start:k * (start + n)].view(u)
            o = out[k * start:k * (start + n)].view(u)
            if body.size < 4:
                st = kt.temporal_decode(body, 1, body.size, n, layout, ref8, start, out, f, cm, dtab, cb, syms, 9)
            else:
                E, cmask = int(body[1]), int(body[2]) | int(body[3]) << 8
                st = kt._tdec_three(body, 4, body.size, n, W, mb, em, E, cmask, r, o, f, cm, dtab, cb, syms,
                              rans_states_for(n, 9))
        res.append((int(st), out[(W // 8) * start:(W // 8) * (start + n)].copy()))
    return res


def _one_chunk(seed, n, dt, wild):
    """A series of one chunk of n elements, coded in the temporal mode: (rng, x, W, the chunk body, its first
    element, its elements, the reference's bytes)."""
    rng = np.random.default_rng(seed)
    x, r = _series(rng, n, dt, special=True, wild=wild)
    (bb, off, size, start, m), = _temporal_chunks(x, r, n)
    return rng, x, 32 if dt == "fp32" else 16, bb[off:off + size].copy(), start, m, np.frombuffer(r.tobytes(), np.uint8)


def _layout(dt):
    return api._DTYPES[api._dtype_code(np.dtype(DTYPES[dt]))][2]


@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n,special,wild", [(8192, False, 0.0), (8200, True, 0.0), (40000, True, 0.01),
                                            (65536, False, 0.3), (131072, True, 0.0)])
def test_fused_decode_gives_the_units_of_the_three_passes(dt, n, special, wild):
    rng = np.random.default_rng(n + len(dt) + int(wild * 100))
    x, r = _series(rng, n + 777, dt, special, wild)
    W = 32 if dt == "fp32" else 16
    chunks = _temporal_chunks(x, r, n)
    assert any(m >= LANES_MIN for *_, m in chunks), "no 32-state temporal chunk"
    ref8 = np.frombuffer(r.tobytes(), np.uint8)
    for bb, off, size, start, m in chunks:
        body = bb[off:off + size].copy()
        (s1, u1), (s2, u2) = _both(body, m, _layout(dt), ref8, start, W)
        assert s1 == OK and s2 == OK
        assert np.array_equal(u1, u2)
        assert np.array_equal(u1, np.frombuffer(x.tobytes(), np.uint8)[(W // 8) * start:(W // 8) * (start + m)])


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_forged_chunks_get_the_status_of_the_three_passes(dt):
    """Each forgery of a chunk body: the fused decoder returns the three passes' status (ERR_CTX wherever the
    contexts differ from the mask, before any other), and where both decode, the same units."""
    rng, x, W, body, start, m, ref8 = _one_chunk(7 if dt == "bf16" else 8, 40000, dt, 0.002)
    size = body.size
    forged = []
    for _ in range(150):   # a byte flipped anywhere
        b = body.copy()
        b[int(rng.integers(1, b.size))] ^= np.uint8(1 << int(rng.integers(0, 8)))
        forged.append(b)
    for cut in list(rng.integers(1, size, 40)) + [size - 1, size - 2, 4, 3, 2]:   # truncated
        forged.append(body[:int(cut)].copy())
    for bit in range(NCTX):   # a context added to or dropped from the mask
        b = body.copy()
        b[2 + bit // 8] ^= np.uint8(1 << (bit % 8))
        forged.append(b)
    for e in (0, 1, int(body[1]) - 1, int(body[1]) + 1, 255):   # another context base
        b = body.copy()
        b[1] = np.uint8(e % 256)
        forged.append(b)
    for pad in (2, 64, 130, 400):   # junk inside the rANS stream, its length raised to match: the fused rounds
        forged.append(_padded(body, W, pad, rng))   # may then run to the last full round (a stop of their own)
    seen = set()
    for b in forged:
        (s1, u1), (s2, u2) = _both(b, m, _layout(dt), ref8, start, W)
        assert s1 == s2
        if s1 == OK:
            assert np.array_equal(u1, u2)
        seen.add(s1)
    assert ERR_CTX in seen and len(seen) >= 4, seen


def _stream_at(body, W):
    """(position of the rANS stream's length R, R) in a temporal chunk body."""
    f, cm = np.empty(NCTX * 256, np.int64), np.empty(NCTX * 256, np.int64)
    dtab = np.empty(NCTX * 4096, np.uint32)
    cmask = int(body[2]) | int(body[3]) << 8
    p = krans.read_ctx_tables(body, 4, body.size, cmask, NCTX, 2 * W, f, cm, dtab)
    assert p > 0
    return p, int(body[p:p + 4].view(np.uint32)[0])


def _padded(body, W, pad, rng):
    p, R = _stream_at(body, W)
    junk = rng.integers(0, 256, pad).astype(np.uint8)
    b = np.concatenate([body[:p + 4 + R], junk, body[p + 4 + R:]])
    b[p:p + 4] = np.frombuffer(np.uint32(R + pad).tobytes(), np.uint8)
    return b


def _fused_stop(body, n, layout, ref8, start, W):
    """Run _tdec_fused's loop of fused rounds alone on a chunk body: (elements the rounds decoded, the units)."""
    _, mb, em = kt._fparams(layout)
    u = np.uint32 if W == 32 else np.uint16
    k8 = W // 8
    r = ref8[k8 * start:k8 * (start + n)].view(u)
    out = np.zeros(n, u)
    _, _, _, _, _, _, f, cm, dtab = stream_scratch(2, n, n)
    cmask = int(body[2]) | int(body[3]) << 8
    p = krans.read_ctx_tables(body, 4, body.size, cmask, NCTX, 2 * W, f, cm, dtab)
    R = int(body[p:p + 4].view(np.uint32)[0])
    xs = np.empty(32, np.uint32)
    assert krans.lanes_states(body, p + 4, p + 4 + R, xs)
    rs, L = p + 4 + R, body.size - (p + 4 + R)
    io = np.array([p + 4 + 128, 0], np.int64)
    g = 0
    while g < n // 32:
        k = fused_budget(n // 32 - g, rs - int(io[0]), L, int(io[1]), W)
        if k <= 0:
            break
        fused_rounds(body, io, rs, dtab, r, out, xs, 32 * g, k, mb, em, int(body[1]), W)
        g += k
    return 32 * g, out


@pytest.mark.skipif(not simd.SIMD, reason="the fused pass runs only where the CPU has AVX2 (and LMC_SIMD != 0)")
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
def test_fused_rounds_decode_all_but_the_last_elements(dt):
    """The fused rounds alone decode all of a chunk but its last few hundred elements (where the words or raw
    bytes left could be passed), to the right units; with junk padded into the rANS stream and after the raw bits
    they run to the last full round, and the units they write before the junk is reached are still the right
    ones."""
    n = 131072
    rng, x, W, body, start, m, ref8 = _one_chunk(11, n, dt, 0.001)
    u = np.uint32 if W == 32 else np.uint16
    want = np.frombuffer(x.tobytes(), u)
    done, out = _fused_stop(body, n, _layout(dt), ref8, 0, W)
    assert n - 1024 <= done < n
    assert np.array_equal(out[:done], want[:done])
    junk = np.concatenate([_padded(body, W, 4096, rng), rng.integers(0, 256, 8192).astype(np.uint8)])
    done2, out2 = _fused_stop(junk, n, _layout(dt), ref8, 0, W)
    assert done2 == 32 * (n // 32)
    assert np.array_equal(out2[:done], want[:done])


def _max_raw_body(n, W, seed=0):
    """A valid temporal chunk body (mode byte first) whose every element has W - 1 raw bits, the most a symbol
    takes: its reference all 1.0 (context 0, E its exponent), context 0's table the symbols 2W - 1 and 2W (k = W,
    either sign) at f = 2048 each, coded here by a plain 32-state rANS encoder (FORMAT.md, "rANS": a state takes a
    word about every 16 symbols), and the raw bits random.  The fused rounds read raw bytes at the fastest rate
    a chunk can make them."""
    rng = np.random.default_rng(seed)
    E = 127
    syms = 2 * W - 1 + rng.integers(0, 2, n)
    xs, words = [1 << 16] * 32, []
    for i in range(n - 1, -1, -1):                                   # encoded backwards, words pushed
        x, cum = xs[i % 32], 2048 * (syms[i] - (2 * W - 1))
        if x >= (16 << 16) * 2048:
            words.append(x & 0xFFFF)
            x >>= 16
        xs[i % 32] = ((x // 2048) << 12) + x % 2048 + cum
    table = np.array([2 * W - 1, 2 * W, 0x88, 0, 0x88, 0], np.uint8)   # f = 2048 each (two-byte form)
    stream = np.concatenate([np.array(xs, np.uint32).view(np.uint8), np.array(words[::-1], np.uint16).view(np.uint8)])
    nbits = n * (W - 1)
    raw = rng.integers(0, 256, (nbits + 7) // 8).astype(np.uint8)
    if nbits % 8:
        raw[-1] &= (1 << (nbits % 8)) - 1                            # zero padding bits
    head = np.array([CHUNK_TEMPORAL, E, 1, 0], np.uint8)              # context mask: context 0
    R = np.frombuffer(np.uint32(stream.size).tobytes(), np.uint8)
    return np.concatenate([head, table, R, stream, raw])


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_max_raw_chunk_decodes_as_the_three_passes(dt):
    """The chunk of _max_raw_body (every element W - 1 raw bits) decodes, fused and by the three passes, to the
    same units with status OK."""
    W = 32 if dt == "fp32" else 16
    n = 40000
    body = _max_raw_body(n, W)
    ref8 = np.frombuffer(np.ones(n, DTYPES[dt]).tobytes(), np.uint8)
    (s1, u1), (s2, u2) = _both(body, n, _layout(dt), ref8, 0, W)
    assert s1 == s2 == OK
    assert np.array_equal(u1, u2)


GUARD_CHILD = r"""
import ctypes, mmap, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import test_tfuse as T
from lmc.kernels import temporal as kt
from lmc.kernels.drivers import stream_scratch
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None)
dt = sys.argv[2]
if sys.argv[3] == "max":     # the chunk of _max_raw_body: raw bytes read at the fastest rate, up to the page
    W, start, m = (32 if dt == "fp32" else 16), 0, 40000
    body = T._max_raw_body(m, W)
    ref8 = np.frombuffer(np.ones(m, T.DTYPES[dt]).tobytes(), np.uint8)
    # (as coded its words run out before its raw bits do; with junk words padded in and the raw bits cut short
    # the raw bits bound the rounds)
    pad = T._padded(body, W, 4096, np.random.default_rng(1))
    cases = [body, pad] + [pad[:pad.size - t] for t in (1, 7, 30, 61, 100, 1000, 4001)]
else:
    rng, x, W, body, start, m, ref8 = T._one_chunk(int(sys.argv[3]), 40000, dt, 0.002)
    size = body.size
    cases = [body[:int(c)] for c in rng.integers(4, size, 60)] + [T._padded(body, W, int(p), rng) for p in (2, 50, 300)]
    for _ in range(60):
        b = body.copy()
        b[int(rng.integers(1, b.size)):][:8] = rng.integers(0, 256, 8).astype(np.uint8)[:b.size]
        cases.append(b)
np_ = (max(c.size for c in cases) + PAGE - 1) // PAGE + 1
mm = mmap.mmap(-1, (np_ + 1) * PAGE)
base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
assert libc.mprotect(ctypes.c_void_p(base + np_ * PAGE), PAGE, 0) == 0   # the page after the bodies: no access
arena = np.frombuffer(mm, np.uint8, count=np_ * PAGE)
_, _, _, _, _, _, f, cm, dtab = stream_scratch(2, m, m)
cb, syms = np.empty(m + 16, np.uint16), np.empty(m + 16, np.uint8)
out = np.zeros(ref8.size, np.uint8)
layout = T._layout(dt)
for c in cases:
    blob = arena[arena.size - c.size:]          # the body ends where the no-access page begins
    blob[:] = c
    kt.temporal_decode(blob, 1, blob.size, m, layout, ref8, start, out, f, cm, dtab, cb, syms, 9)
print("ok", len(cases))
"""


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_forged_chunks_ending_at_a_no_access_page_are_decoded_without_a_fault(dt):
    """Forged bodies (truncated, overwritten, junk in the rANS stream) placed so that their last byte is the last
    one before a page with no access: a read past the body is a segmentation fault, seen here as the child's
    death (the fused pass and the scalar passes read with no bounds checks inside bounds their caller sets)."""
    for case in ("5", "max"):   # (max: the chunk whose raw bits are read fastest, up to the page)
        p = subprocess.run([sys.executable, "-c", GUARD_CHILD, HERE, dt, case], capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0 and p.stdout.split()[:1] == ["ok"], (case, p.returncode, p.stderr[-2000:])


@pytest.mark.skipif(not simd.SIMD512, reason="the 8-lane loop is the one this CPU runs: the tests above cover it")
def test_eight_lane_loop_on_an_avx512_cpu():
    """Where the CPU has AVX-512 the fused pass runs 16 lanes; LMC_SIMD=avx2 keeps the 8-lane loop (what an AVX2
    CPU runs): this file's decoding tests run again in a child with it (and the test that the flags follow it)."""
    env = dict(os.environ, LMC_SIMD="avx2")
    flags = os.path.join(HERE, "test_rans32.py") + "::test_simd_flag_follows_the_cpu_and_the_environment"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
                        flags, "-k", "not eight_lane"], cwd=HERE, env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert " passed" in p.stdout
