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
    the same bytes as here and encode to the same blobs (the vector encoder kernels: tenc.tsyms8, simd.enc32)."""
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
    blob = open(os.path.join(OUT, name + ".lmc"), "rb").read()
    y = lmc.decompress(blob, reference=ref)
    assert y.tobytes() == load(name, e).tobytes(), name
    assert lmc.compress(y, reference=ref, chunk_size=e["chunk_size"], format_version=7,
                        prefer=e.get("prefer", "speed")) == blob, name
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
    f = ll.get_host_cpu_features()
    has512 = all(bool(f.get(k)) for k in ("avx512f", "avx512bw", "avx512vl", "avx512vbmi2"))
    assert simd.SIMD512 == (expect and has512 and os.environ.get("LMC_SIMD") != "avx2")
    # the permutation table: lane j of mask m takes the word after those of m's lanes below j
    for m in (0, 1, 0b10110101, 255):
        k = 0
        for j in range(8):
            if m >> j & 1:
                assert simd.PERM[m * 8 + j] == k
                k += 1


def _raw_bits_reference(blob, bit, o, syms, W):
    """The temporal raw-bit pass in plain Python (FORMAT.md): symbol s has k = min((s + 1) >> 1, W) and k - 1
    raw bits after its implied leading one (none for s = 0), negative where s is even and not 0; the unit is
    unmono(mono(r) + d)."""
    sb, mask = 1 << (W - 1), (1 << W) - 1
    bits = int.from_bytes(blob.tobytes(), "little")
    out = []
    for i, s in enumerate(int(v) for v in syms):
        k = min((s + 1) >> 1, W)
        kb = k - (k != 0)
        a = ((1 << k) >> 1) | ((bits >> bit) & ((1 << kb) - 1))
        bit += kb
        d = -a if s != 0 and s % 2 == 0 else a
        m = (int(o[i]) + d) & mask
        out.append(m ^ sb ^ (0 if m & sb else sb - 1))
    return out, bit


def test_raw_bit_writer_groups_give_the_same_bytes():
    """The temporal encoder's raw-bit writer joining the bits of four 16-bit units (two 32-bit units) at a time
    writes the bytes of the one-at-a-time loop, and the plain reading of them gives the bits back: lengths that
    are and are not multiples of the group, elements of no raw bits and of the most (W - 1), a start inside the
    buffer, and nothing written past the 8 bytes of room after the end."""
    from lmc.kernels import temporal as kt
    rng = np.random.default_rng(9)
    for W, group in ((16, 4), (32, 2)):
        KS = 2 * W + 1
        kbt = np.array([min((s + 1) >> 1, W) - (s > 0) for s in range(KS)] * 16, np.uint8)
        for n in (1, 2, 3, 5, 7, 64, 1001, 4096):
            for mix in range(3):
                sym = (rng.integers(0, KS, n) if mix == 0 else
                       np.full(n, KS - 1) if mix == 1 else rng.choice([0, 1, KS - 1], n))
                jb = (rng.integers(0, 16, n) * KS + sym).astype(np.uint16)
                k = kbt[jb].astype(np.int64)
                low = (rng.integers(0, 1 << 32, n, dtype=np.uint64) & ((np.uint64(1) << k.astype(np.uint64))
                                                                       - np.uint64(1))).astype(np.uint32)
                end = 5 + (int(k.sum()) + 7) // 8
                a, b = np.zeros(end + 8, np.uint8), np.full(end + 9, 0xA5, np.uint8)
                b[5:end + 8] = 0
                ea = kt._traw(jb, low, n, kbt, a, 5, 1)
                eb = kt._traw(jb, low, n, kbt, b, 5, group)
                assert ea == eb == end and a[5:ea].tobytes() == b[5:eb].tobytes(), (W, n, mix)
                assert b[:5].tobytes() == b"\xa5" * 5 and b[end + 8] == 0xA5, (W, n, mix)
                bits = int.from_bytes(b[5:eb].tobytes(), "little")
                for i in range(n):
                    assert bits & ((1 << int(k[i])) - 1) == int(low[i])
                    bits >>= int(k[i])


def test_encoder_float32_quotient_rule_is_exact():
    """The vector encoder's x div f (simd._make_enc32): the integer part of one float32 division, corrected by
    one step either way from the remainder in 32-bit wrapping arithmetic, equals x // f for every frequency f and
    the states an encoder meets (f * 16 <= x < f * 2^20): at every multiple of f near both ends and near 2^31,
    one below and one above, and at random states."""
    rng = np.random.default_rng(4)
    f = np.arange(1, 4097, dtype=np.int64)[:, None]
    ks = np.concatenate([np.arange(16, 80), (1 << 20) - np.arange(1, 65), (1 << 31) // np.arange(1, 4097)[:64]])
    x = (f * ks[None, :]) + np.array([-1, 0, 1])[:, None, None]
    x = np.concatenate([x.reshape(3, 4096, -1).transpose(1, 0, 2).reshape(4096, -1),
                        rng.integers(f * 16, f * (1 << 20), (4096, 256))], axis=1)
    x = np.where((x >= f * 16) & (x < f * (1 << 20)), x, f * 16)
    q0 = (x.astype(np.float32) / f.astype(np.float32)).astype(np.int64)    # (numpy: IEEE float32, rounded)
    rem = ((x - q0 * f + (1 << 31)) % (1 << 32)) - (1 << 31)               # (as 32-bit wrapping arithmetic)
    q = q0 - (rem < 0) + (rem >= f)
    assert (q == x // f).all()


@pytest.mark.skipif(not simd.SIMD, reason="the vector kernels need AVX2 (SIMD is False here)")
def test_vector_raw_bit_pass_matches_the_reference():
    """trecon8 (bits taken from a window loaded at each vector's first bit) gives the plain reading of the raw
    bits: every start bit, symbols of no raw bits and of the most (W - 1, the window's far end), mixes."""
    rng = np.random.default_rng(5)
    for W, T in ((16, np.uint16), (32, np.uint32)):
        for trial in range(12):
            nvec = int(rng.integers(1, 9))
            n = 8 * nvec
            if trial % 3 == 0:
                syms = np.full(n, 2 * W, np.uint8)                   # every element W - 1 raw bits
            elif trial % 3 == 1:
                syms = rng.integers(0, 2 * W + 1, n).astype(np.uint8)
            else:
                syms = rng.choice(np.array([0, 1, 2, 2 * W - 1, 2 * W], np.uint8), n)
            bit = int(rng.integers(0, 8))
            blob = rng.integers(0, 256, n * (W - 1) // 8 + 40, dtype=np.uint8)
            o = rng.integers(0, 1 << W, n, dtype=np.uint64).astype(T)
            want, end = _raw_bits_reference(blob, bit, o, syms, W)
            got = o.copy()
            used = simd.trecon8(blob, 0, bit, got, syms, 0, nvec, W)
            assert used == end - bit and got.tolist() == want, (W, trial)


@pytest.mark.skipif(not simd.SIMD, reason="the vector kernels need AVX2 (SIMD is False here)")
def test_vector_temporal_kernels_match_the_scalar_loops():
    """The temporal mode's vector kernels give the scalar loops' outputs on every edge of the monotone map (sign
    flips, the most negative difference, infinities and NaNs of the exponent contexts), every length mod 8 and
    every context base (the symbol pass's raw bits of 16-bit units, packed as it goes, the bytes the scalar
    writer packs from the scalar loop's); the 32-state encoder's vector rounds give the scalar loop's stream and
    states."""
    from lmc.kernels import temporal as kt
    from lmc.kernels import rans as kr
    rng = np.random.default_rng(11)
    kbt = {W: np.array([min((s + 1) >> 1, W) - (s > 0) for s in range(2 * W + 1)] * 16, np.uint8) for W in (16, 32)}
    for W, T, mb, em in ((16, np.uint16, 7, 0xFF), (16, np.uint16, 10, 0x1F), (32, np.uint32, 23, 0xFF)):
        edge = np.array([0, 1 << (W - 1), (1 << W) - 1, (1 << (W - 1)) - 1, 1, (1 << (W - 1)) + 1,
                         em << mb, (em << mb) | 1], np.uint64)
        for n in (3, 8, 13, 31, 64, 1000, 4099):
            r = rng.integers(0, 1 << W, n, dtype=np.uint64)
            x = np.where(rng.random(n) < 0.5, r + rng.integers(-70, 70, n).astype(np.uint64),
                         rng.integers(0, 1 << W, n, dtype=np.uint64))
            x[:64] = np.resize(edge, 64)[:n] if n < 64 else np.resize(edge, 64)
            r[:64] = np.repeat(edge, 8)[:n] if n < 64 else np.repeat(edge, 8)
            if n == 4099:   # |d| at every power of two and beside it (bit lengths 0 .. W), against r = +0
                sb, full = 1 << (W - 1), (1 << W) - 1
                ds = sorted({s * v for k in range(W) for v in ((1 << k) - 1, 1 << k, (1 << k) + 1)
                             for s in (1, -1) if v <= sb} | {-sb})
                m_ = np.array([(sb + d) & full for d in ds], np.uint64)   # mono(x) = mono(+0) + d
                x[64:64 + len(ds)] = np.where(m_ & sb, m_ ^ sb, m_ ^ full)
                r[64:64 + len(ds)] = 0
            if n == 1000:   # runs of 1 - 8 elements of no raw bits (x = r) and of the most (|d| = 2^(W-1), against
                # r = +0): where the symbol pass joins lanes, values of no bits and of all the bits a vector holds
                sb, full = 1 << (W - 1), (1 << W) - 1
                big = np.array([sb ^ full], np.uint64)[0]   # (mono(x) = mono(+0) + sb = 0)
                i, t = 64, 0
                while i < n:
                    ln = int(rng.integers(1, 9))
                    r[i:i + ln] = 0 if t % 2 else r[i:i + ln]
                    x[i:i + ln] = big if t % 2 else r[i:i + ln]
                    i, t = i + ln, t + 1
            x, r = (x & ((1 << W) - 1)).astype(T), (r & ((1 << W) - 1)).astype(T)
            for E in (0, 3, 31, 127, 254):
                j1, j2 = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
                l1 = np.zeros(n, np.uint32)
                l2 = np.full(n + 16, 0xA5A5A5A5, np.uint32)   # (the packed bits land on junk)
                a1 = kt._tsyms(x, r, n, W, mb, em, E, j1, l1)
                # the scalar loop's raw bits as the scalar writer packs them
                packed = np.zeros((a1 + 7) // 8 + 8, np.uint8)
                assert kt._traw(j1, l1, n, kbt[W], packed, 0, 1) == (a1 + 7) // 8
                a2 = kt._tsyms_all(x, r, n, W, mb, em, E, j2, l2)   # (the first n & ~(VLANES - 1) by tenc.tsyms8)
                assert a1 == a2 and (j1 == j2).all(), (W, mb, n, E)
                if W == 16:
                    assert l2.view(np.uint8)[:(a1 + 7) // 8].tobytes() == packed[:(a1 + 7) // 8].tobytes(), (mb, n, E)
                else:   # (32-bit units keep each element's bits: kernels.tenc)
                    assert (l2[:n] == l1).all(), (mb, n, E)
                c1, c2 = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
                o1, o2 = np.zeros(n, T), np.zeros(n, T)
                u1 = kt._tmask(r, n, E, mb, em, c1, o1, W)
                u2, m = simd.tmask8(r, n, mb, em, E, c2, o2, W)
                u2 |= kt._tmask(r[m:], n - m, E, mb, em, c2[m:], o2[m:], W)
                assert u1 == u2 and (c1 == c2).all() and (o1 == o2).all(), (W, mb, n, E)
    # the encoder: skewed and flat tables, one-symbol contexts (f = 4096) and f = 1 symbols
    for trial in range(6):
        nsym = 65
        n = 32 * int(rng.integers(1, 40)) + int(rng.integers(0, 32))
        f = np.zeros(16 * 256, np.int64)
        cm = np.zeros(16 * 256, np.int64)
        jb = np.zeros(n + 16, np.uint16)
        hist = np.zeros(16 * 256, np.int64)
        for c in range(16):
            if trial == 0 and c == 3:
                hist[c * 256 + 7] = 100                       # one symbol: f = 4096
            else:
                hist[c * 256:c * 256 + nsym] = rng.integers(0, 50, nsym) ** (trial % 3 + 1)
                hist[c * 256 + 1] = 1                         # f = 1
                hist[c * 256] += 1
        ctx = rng.integers(0, 16, n)
        for i in range(n):
            row = hist[ctx[i] * 256:ctx[i] * 256 + nsym].astype(np.float64)
            jb[i] = ctx[i] * nsym + rng.choice(nsym, p=row / row.sum())
        et = np.zeros(2 * 16 * nsym, np.uint64)
        kbt = np.zeros(16 * nsym, np.uint8)
        cmask = 0
        for c in range(16):
            if kr.rans_normalize(hist, c << 8, nsym, f) > 0:
                cmask |= 1 << c
                kr.cum_freqs(f, c << 8, cm)
        out = np.zeros(1 << 16, np.uint8)
        kr.put_ctx_tables(f, cm, cmask, 16, nsym, out, 0, out.size, et, kbt, True)
        b1 = np.zeros(2 * n + 4 * 32 + 32, np.uint8)
        p1 = kr._tenc(jb, n, et, b1, 32)
        # the scalar rounds: the same loop with the vector path off (lo = 0)
        b2 = np.zeros_like(b1)
        p2 = b2.size
        xl = np.full(32, 1 << 16, np.uint64)
        for i in range(n - 1, -1, -1):
            j = int(jb[i])
            xl[i & 31], p2 = kr._renc2(xl[i & 31], et[2 * j], et[2 * j + 1], b2, p2)
        p2 -= 128
        b2[p2:p2 + 128] = xl.astype(np.uint32).view(np.uint8)
        assert p1 == p2 and b1[p1:].tobytes() == b2[p2:].tobytes(), trial


@pytest.mark.skipif(not simd.SIMD512, reason="the permd loop is the one this CPU runs: the tests above cover it")
def test_avx2_decoder_loop_on_an_avx512_cpu():
    """Where the CPU has AVX-512, rounds32 puts the words in their lanes by vpexpandw; LMC_SIMD=avx2 keeps the
    permd loop (what an AVX2 CPU runs): this file's tests run again in a child with it."""
    env = dict(os.environ, LMC_SIMD="avx2")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
                        "-k", "not avx2_decoder_loop and not scalar_build"], cwd=HERE, env=env, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert " passed" in p.stdout
