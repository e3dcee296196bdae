"""The 32-state rANS encoder of byte streams with its entries in registers (kernels/wenc.py, AVX-512): the same
words and final states as the AVX2 encoder (simd.enc32) and the scalar loop, on streams whose symbols lie in a
window of 64 values (also across 255 -> 0), with outliers outside it (each vector that holds one takes the gather),
and on streams that the window rule sends back to simd.enc32, from random states and on extreme tables; the float
product rule for x div f (the arithmetic the loop does, in numpy); the window rule's bound; blobs equal to those of
the AVX2 build (``LMC_SIMD=avx2``) and of the scalar build (``LMC_SIMD=0``), which decode in each."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lmc
from lmc.kernels import rans as krans
from lmc.kernels import simd, wenc

HERE = os.path.dirname(os.path.abspath(__file__))
PROB = 4096


def _table(syms):
    """rans._tenc's packed table et for the counts of syms (byte symbols)."""
    cnt = np.bincount(syms, minlength=256).astype(np.int64)
    f = np.zeros(256, np.int64)
    cm = np.zeros(256, np.int64)
    krans.rans_normalize(cnt, 0, 256, f)
    krans.cum_freqs(f, 0, cm)
    et = np.zeros(512, np.uint64)
    for j in range(256):
        if f[j] > 0:
            krans._enc_entry(f[j], cm[j], 0, et, j)
    return et, f, cm


def _scalar_rounds(syms, lo, et, buf, p, xl):
    """The scalar encoder's rounds below lo (rans._tenc's S = 32 loop), in Python."""
    for i in range(lo - 1, -1, -1):
        j = int(syms[i])
        k = i & 31
        x, p = krans._renc2(xl[k], et[2 * j], et[2 * j + 1], buf, p)
        xl[k] = x
    return p


def _syms(rng, n, lo_sym, width, outliers):
    """n byte symbols peaked in width values from lo_sym (mod 256), `outliers` of them far outside."""
    p = rng.dirichlet(np.full(width, rng.uniform(0.3, 3.0)))
    s = ((rng.choice(width, n, p=p) + lo_sym) % 256).astype(np.uint8)
    if outliers:
        at = rng.choice(n, outliers, replace=False)
        s[at] = ((lo_sym + 100 + rng.integers(0, 50, outliers)) % 256).astype(np.uint8)
    return s


def _encode_all(syms, lo, et):
    """(wenc.enc_rounds's, simd.enc32's) (p, the words, the states) on fresh buffers."""
    res = []
    for fn in (wenc.enc_rounds, simd.enc32):
        buf = np.zeros(2 * lo + 64, np.uint8)
        xl = np.full(32, 1 << 16, np.uint64)
        p = fn(syms, lo, et, buf, buf.size, xl)
        res.append((p, buf[p:].copy(), xl.copy()))
    return res


def test_float_product_quotient_rule_is_exact():
    """x div f as the integer part of float32(x) * float32(1 / f), corrected by one step either way from the
    remainder in 32-bit wrapping arithmetic, equals x // f for every f and the states an encoder meets after its
    renormalisation (f * 16 <= x < f * 2^20): near both ends, near 2^31 and at random states."""
    rng = np.random.default_rng(5)
    f = np.arange(1, PROB + 1, dtype=np.int64)[:, None]
    ks = np.concatenate([np.arange(16, 80), (1 << 20) - np.arange(1, 65), (1 << 31) // np.arange(1, 4097)[:64]])
    x = (f * ks[None, :]) + np.array([-1, 0, 1])[:, None, None]
    x = np.concatenate([x.reshape(3, PROB, -1).transpose(1, 0, 2).reshape(PROB, -1),
                        rng.integers(f * 16, f * (1 << 20), (PROB, 256))], axis=1)
    x = np.where((x >= f * 16) & (x < f * (1 << 20)), x, f * 16)
    rc = (np.float32(1.0) / f.astype(np.float32)).astype(np.float32)
    q0 = (x.astype(np.float32) * rc).astype(np.int64)                    # (numpy: IEEE float32, rounded)
    assert (np.abs(q0 - x // f) <= 1).all()
    rem = ((x - q0 * f + (1 << 31)) % (1 << 32)) - (1 << 31)
    q = q0 - (rem < 0) + (rem >= f)
    assert (q == x // f).all()


def test_window_rule():
    """The window holds every symbol of a peaked table, wraps from 255 to 0, and is refused when more than
    1/WINDOW_OUT of the probability lies outside every 64 consecutive values."""
    et, f, _ = _table(np.concatenate([np.arange(240, 256), np.arange(0, 30)]).astype(np.uint8).repeat(50))
    off, tab = wenc.window(simd.enc_table(et))
    assert off >= 0
    for s in np.nonzero(f)[0]:
        k = (s + off) & 255
        assert k < wenc.WINDOW and tab[k] & 8191 == f[s]
        assert tab[wenc.WINDOW + k] == np.array([np.float32(1.0) / np.float32(f[s])]).view(np.uint32)[0]
    # probability outside the best window: exactly at the bound, then one unit past it
    for out, ok in ((PROB // wenc.WINDOW_OUT, True), (PROB // wenc.WINDOW_OUT + 1, False)):
        et32 = np.zeros(256, np.uint32)
        et32[10] = PROB - out           # one symbol (cum is not looked at by the rule)
        et32[150] = out
        assert (wenc.window(et32)[0] >= 0) == ok


@pytest.mark.skipif(not simd.SIMD512, reason="the register-table encoder needs AVX-512 (SIMD512 is False here)")
@pytest.mark.parametrize("lo_sym,width,outliers", [(0, 12, 0), (250, 12, 0), (200, 64, 0), (17, 64, 3),
                                                   (252, 9, 1), (128, 3, 40), (0, 40, 0), (5, 2, 0)])
def test_same_words_and_states_as_the_avx2_encoder_and_the_scalar_loop(lo_sym, width, outliers):
    rng = np.random.default_rng(lo_sym * 131 + width * 7 + outliers)
    n = 32 * 700
    syms = _syms(rng, n, lo_sym, width, outliers)
    if outliers:
        syms[:4] = (lo_sym + 101) % 256       # outliers in the first vectors and the last one as well
        syms[-1] = (lo_sym + 120) % 256
    et, f, cm = _table(syms)
    assert wenc.window(simd.enc_table(et))[0] >= 0   # (the register loop runs)
    (p1, w1, x1), (p2, w2, x2) = _encode_all(syms, n, et)
    assert p1 == p2 and np.array_equal(w1, w2) and np.array_equal(x1, x2)
    if width <= 12:   # the Python scalar loop on the smaller cases
        buf = np.zeros(2 * n + 64, np.uint8)
        xl = [np.uint64(1 << 16)] * 32
        p3 = _scalar_rounds(syms, n, et, buf, buf.size, xl)
        assert p3 == p1 and np.array_equal(buf[p3:], w1) and np.array_equal(np.array(xl, np.uint64), x1)
    # and the whole stream decodes to the symbols
    buf = np.zeros(2 * n + 4 * 32 + 16, np.uint8)
    q = krans.rans_encode(syms, syms, False, n, f, cm, buf, 32)
    dtab = np.zeros(4096, np.uint32)
    krans.build_rans_dtab(f, cm, 0, dtab, 0)
    out = np.zeros(n + 16, np.uint8)
    krans.lanes_decode(buf[q:].copy(), 0, buf.size - q, dtab, krans._NO_CB, out, n)
    assert np.array_equal(out[:n], syms)


@pytest.mark.skipif(not simd.SIMD512, reason="the register-table encoder needs AVX-512 (SIMD512 is False here)")
def test_wide_streams_go_to_the_avx2_encoder():
    """A flat byte stream (no window holds enough) takes simd.enc32: the same result."""
    rng = np.random.default_rng(9)
    syms = rng.integers(0, 256, 32 * 300).astype(np.uint8)
    et, _, _ = _table(syms)
    assert wenc.window(simd.enc_table(et))[0] < 0
    (p1, w1, x1), (p2, w2, x2) = _encode_all(syms, syms.size, et)
    assert p1 == p2 and np.array_equal(w1, w2) and np.array_equal(x1, x2)


def _peaked(rng, rows, cols, scale):
    """A float32 array like a second moment: positive, each value a row's scale times a column's times a little
    noise, so that the predicted-exponent mode pays (its residuals around 0: the window wraps 255 -> 0)."""
    r = rng.normal(0, 2.0, (rows, 1))
    c = rng.normal(0, 2.0, (1, cols))
    return (scale * np.exp(r + c + rng.normal(0, 0.2, (rows, cols)))).astype(np.float32)


def test_blobs_equal_those_of_the_avx2_and_scalar_builds(tmp_path):
    """Whole blobs from this build, the AVX2 build and the scalar build are the same bytes, and decode in each:
    arrays whose exponent streams are coded with 32-state rANS (a nearly constant exponent; second-moment-like
    arrays, whose predicted-exponent residuals wrap across 0) and ordinary weights."""
    from fuzz_blobs import Blob
    rng = np.random.default_rng(11)
    near = rng.uniform(1.0, 2.0, 1 << 16).astype(np.float32)
    near[rng.random(near.size) < 0.03] *= 2.0          # the exponent: 97% one value
    arrs = [near, near.astype(ml_dtypes.bfloat16), _peaked(rng, 256, 256, 1e-8), _peaked(rng, 512, 128, 1.0),
            rng.normal(0, 0.02, 1 << 16).astype(np.float32)]
    for i, a in enumerate(arrs):
        np.save(tmp_path / f"a{i}.npy", a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a)
    here = [lmc.compress(a, threads=1) for a in arrs]
    owners = {f[3] for b in here for fs in Blob(b).fields for f in fs}
    assert "alone/rans32" in owners, owners          # (the register loop's streams: >= 8192 byte symbols)
    assert any(lmc.info(b)["chunk_modes"].get("predicted") for b in here)
    code = f"""
import sys, ml_dtypes, numpy as np, lmc
def load(i):
    a = np.load({str(tmp_path)!r} + f"/a{{i}}.npy")
    return a.view(ml_dtypes.bfloat16) if i == 1 else a
xs = [load(i) for i in range({len(arrs)})]
bs = [lmc.compress(x, threads=1) for x in xs]
for x, b in zip(xs, bs):
    assert lmc.decompress(b).tobytes() == x.tobytes()
sys.stdout.buffer.write(b"".join(bs))
"""
    for mode in ("avx2", "0"):
        res = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, LMC_SIMD=mode),
                             capture_output=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout == b"".join(here), mode


@pytest.mark.skipif(not simd.SIMD512, reason="the register-table encoder needs AVX-512 (SIMD512 is False here)")
def test_any_states_and_extreme_tables():
    """From random states (any value an encoder's state takes, 2^16 .. 2^32 - 1), and on a one-symbol table
    (f = 4096: no state ever renormalises) and a 4095 / 1 table: the same words and states as simd.enc32 and the
    scalar loop."""
    rng = np.random.default_rng(21)
    n = 32 * 300
    one = np.full(n, 7, np.uint8)
    two = np.full(n, 200, np.uint8)
    two[rng.integers(0, n, 3)] = 201
    peaked = _syms(rng, n, 250, 10, 2)
    for syms in (one, two, peaked):
        et, f, _ = _table(syms)
        assert wenc.window(simd.enc_table(et))[0] >= 0
        x0 = rng.integers(1 << 16, 1 << 32, 32).astype(np.uint64)
        res = []
        for fn in (wenc.enc_rounds, simd.enc32, _scalar_rounds):
            buf = np.zeros(2 * n + 64, np.uint8)
            xl = x0.copy() if fn is not _scalar_rounds else [np.uint64(v) for v in x0]
            p = fn(syms, n, et, buf, buf.size, xl)
            res.append((p, buf[p:].tobytes(), np.array(xl, np.uint64).tobytes()))
        assert res[0] == res[1] == res[2]


def _joint_table(rng, nctx, ks, extreme):
    """A temporal-like packed table et over nctx contexts of ks symbols each (entry c * ks + s), and symbols
    drawn from it: each context a peaked distribution; ``extreme``: context 0 one symbol of f = 4096 (its states
    never renormalise), context 1 a 4095 / 1 pair, the others with many f = 1 symbols."""
    n = 32 * 500
    ctx = rng.integers(0, nctx, n)
    syms = np.empty(n, np.uint16)
    et = np.zeros(2 * nctx * ks, np.uint64)
    for c in range(nctx):
        at = np.nonzero(ctx == c)[0]
        if extreme and c == 0:
            s = np.full(at.size, 5)
        elif extreme and c == 1:
            s = np.full(at.size, 3)
            s[:1] = 9
        else:
            p = rng.dirichlet(np.full(ks, 0.05 if extreme else 0.7))
            s = rng.choice(ks, at.size, p=p)
        syms[at] = c * ks + s
        if at.size:   # (the context's own table, as a byte stream's: entries c * ks + s of the joint one)
            et[2 * c * ks:2 * (c + 1) * ks] = _table(s.astype(np.uint8))[0][:2 * ks]
    return syms, et


@pytest.mark.skipif(not simd.SIMD512, reason="the 16-lane encoder needs AVX-512 (SIMD512 is False here)")
@pytest.mark.parametrize("ks,extreme", [(33, False), (65, False), (33, True), (65, True)])
def test_joint_symbols_same_words_and_states(ks, extreme):
    """16-bit joint symbols (the temporal mode's, 16 contexts of 33 or 65 symbols) take wenc.enc16, whose table
    entries come from scalar loads: the same words and final states as simd.enc32 and the scalar loop, from the
    initial states and from random ones, on ordinary and extreme tables (f = 4096, a 4095 / 1 pair, f = 1)."""
    rng = np.random.default_rng(ks * 3 + extreme)
    syms, et = _joint_table(rng, 16, ks, extreme)
    n = syms.size
    for x0 in (np.full(32, 1 << 16, np.uint64), rng.integers(1 << 16, 1 << 32, 32).astype(np.uint64)):
        res = []
        for fn in (wenc.enc_rounds, wenc.enc16, simd.enc32, _scalar_rounds):
            buf = np.zeros(2 * n + 64, np.uint8)
            xl = x0.copy() if fn is not _scalar_rounds else [np.uint64(v) for v in x0]
            p = fn(syms, n, et, buf, buf.size, xl)
            res.append((p, buf[p:].tobytes(), np.array(xl, np.uint64).tobytes()))
        assert res[0] == res[1] == res[2] == res[3]
        assert len(res[0][1]) > 0
