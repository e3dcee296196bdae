"""The fixed-length Huffman code: the encoder's choice (hfixed.fixed_code: the symbols of a stream in a range of
2^k < 256 values, Huffman saving at most 1/32 of k bits a symbol, get the code of every length k) and the
decoder's direct read of such a code (hfixed.fixed_decode4), held against the general Huffman decoder on the
same records, intact and damaged."""
import struct

import ml_dtypes
import numpy as np
import pytest

import lmc
import fuzz_decoder as FZ
from make_vectors import second_moment
from lmc.kernels.base import MAXLEN, OK, RANS_MARGIN, TABSIZE
from lmc.kernels.histo import histo4
from lmc.kernels.huffenc import put_huff
from lmc.kernels.huffman import (build_decode_table, build_multi_table, decode_huff_stream, huff_decode4,
                                 huffman_lengths, read_huff_table)
from lmc.kernels.hfixed import _plane_sample, _sample_entropy, fixed_code, near_fixed
from lmc.kernels.streams import _huff_sub_bytes, analysis_scratch, analyze_hist, analyze_planes


def _lens(freq):
    lens = np.zeros(256, np.uint8)
    huffman_lengths(freq.astype(np.int64), lens)
    return lens


def test_a_near_uniform_range_takes_the_fixed_code():
    rng = np.random.default_rng(0)
    for lo, m, k, start in ((0, 128, 7, 0), (5, 124, 7, 5), (196, 60, 6, 192), (64, 16, 4, 64), (9, 2, 1, 9)):
        freq = np.zeros(256, np.int64)
        freq[lo:lo + m] = rng.integers(900, 1100, m)
        lens = _lens(freq)
        assert fixed_code(freq, lens)
        want = np.zeros(256, np.uint8)
        want[start:start + (1 << k)] = k   # (a range reaching past 255 is moved down to end at 255)
        assert np.array_equal(lens, want), (lo, m)


def test_skewed_or_full_streams_keep_their_huffman_code():
    freq = np.zeros(256, np.int64)
    freq[:12] = (2.0 ** -np.arange(12) * 1e6).astype(np.int64) + 1   # exponent-like: Huffman saves far more
    lens = _lens(freq)
    before = lens.copy()
    assert not fixed_code(freq, lens) and np.array_equal(lens, before)
    full = np.full(256, 1000, np.int64)   # 256 symbols: the raw stream is the fixed code
    lens = _lens(full)
    before = lens.copy()
    assert not fixed_code(full, lens) and np.array_equal(lens, before)
    far = np.zeros(256, np.int64)   # two symbols 197 apart: a range of 256
    far[[3, 200]] = 10
    lens = _lens(far)
    assert not fixed_code(far, lens)


def test_the_rule_is_a_margin_of_one_in_32():
    """On random distributions the choice is exactly: k bits a symbol <= the Huffman bits plus 1/RANS_MARGIN."""
    rng = np.random.default_rng(1)
    taken = kept = 0
    for t in range(400):
        k = int(rng.integers(1, 8))
        m = int(rng.integers(2, (1 << k) + 1))
        lo = int(rng.integers(0, 256 - m + 1))
        freq = np.zeros(256, np.int64)
        freq[lo:lo + m] = (rng.dirichlet(np.full(m, 10.0 ** rng.uniform(-1, 2))) * 50000).astype(np.int64) + 1
        lens = _lens(freq)
        bits = int((freq * lens).sum())
        used = np.flatnonzero(freq)
        kk = max(1, int(used[-1] - used[0]).bit_length())
        want = kk < 8 and kk * int(freq.sum()) <= bits + bits // RANS_MARGIN
        assert fixed_code(freq, lens) == want, t
        if want:
            assert set(lens[lens > 0].tolist()) == {kk} and (lens > 0).sum() == 1 << kk
            taken += 1
        else:
            kept += 1
    assert taken > 20 and kept > 20


def test_a_sampled_plane_sure_of_the_fixed_code_is_not_counted():
    """near_fixed: a plane whose bytes all lie in 2^k values (exact) and whose sample is within NEAR_RAW_BITS of k
    bits takes the code uncounted; one byte outside the range, a skewed plane or a range of 256 does not; and
    where it is taken, analyze_planes gives the exact analysis's modes, sizes and lengths."""
    rng = np.random.default_rng(3)
    n = 1 << 17
    for lo, k in ((0, 7), (3, 7), (200, 5), (250, 2), (100, 3)):
        p = (lo + rng.integers(0, 1 << k, n)).astype(np.uint8)
        t, m = _plane_sample(p, n)
        assert near_fixed(p, n, t, _sample_entropy(t, m)) == (k, min(lo, 256 - (1 << k)))
        planes = np.zeros((2, n + 16), np.uint8)
        planes[0, :n] = p
        planes[1, :n] = np.repeat(np.arange(8, dtype=np.uint8), n // 8)   # (a plane Huffman codes)
        h, lens, modes, sizes, f, cm = analysis_scratch(2)
        total = analyze_planes(planes, n, 2, h, lens, modes, sizes, f, cm, RANS_MARGIN, 9)
        h2, lens2, modes2, sizes2, f2, cm2 = analysis_scratch(2)
        for s in range(2):
            histo4(planes[s], n, h2[s])
        total2 = analyze_hist(h2, n, 2, lens2, modes2, sizes2, f2, cm2, RANS_MARGIN, 0, 9)
        assert total == total2 and np.array_equal(sizes, sizes2) and np.array_equal(modes, modes2)
        assert np.array_equal(lens, lens2)
        assert np.array_equal(h[0].sum(1), h2[0].sum(1))   # (each sub-stream's symbols, all on lo)
        out = p.copy()
        out[int(rng.integers(0, n))] = np.uint8((lo + (1 << k) + 5) % 256)   # one byte outside the range
        t, m = _plane_sample(out, n)
        assert near_fixed(out, n, t, _sample_entropy(t, m)) == (0, 0)
    skewed = np.minimum(rng.geometric(0.3, n), 127).astype(np.uint8)
    t, m = _plane_sample(skewed, n)
    assert near_fixed(skewed, n, t, _sample_entropy(t, m)) == (0, 0)
    full = rng.integers(0, 256, n).astype(np.uint8)
    t, m = _plane_sample(full, n)
    assert near_fixed(full, n, t, _sample_entropy(t, m)) == (0, 0)


def _streams(blob):
    """(stream-record fields of the blob's Huffman streams whose code is fixed, of all its Huffman streams)."""
    b = FZ.Blob(blob)
    owners = [f[3] for F in b.fields for f in F if f[2] == "huff_lo"]
    return sum(o.endswith("-fixed") for o in owners), len(owners)


@pytest.mark.parametrize("dt", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "fp32"])
def test_second_moments_take_it_and_decode(dt):
    x = second_moment(dt, 300, 256, 3)
    blob = lmc.compress(x)
    fixed, huff = _streams(blob)
    assert fixed > 0, (fixed, huff)
    assert lmc.decompress(blob).tobytes() == x.tobytes()
    # where size comes first it is never taken, and that blob is no larger
    size = lmc.compress(x, prefer="size")
    assert _streams(size)[0] == 0
    assert len(size) <= len(blob)
    assert lmc.decompress(size).tobytes() == x.tobytes()
    # its cost: within 1/32 of the Huffman stream it replaced (here far less)
    assert len(blob) <= len(size) + len(size) // RANS_MARGIN


def _record(p, lens):
    """A Huffman stream record's payload (table, jump table, sub-streams) of the symbols p with code lens."""
    n = p.size
    h = np.zeros((4, 256), np.int64)
    histo4(p, n, h)
    sub = np.empty(4, np.int64)
    size = 2 + 64 + 12 + _huff_sub_bytes(h, lens, sub) + 256
    out = np.zeros(size + 64, np.uint8)
    tbuf = np.zeros(2 * n + 64, np.uint8)
    end = put_huff(p, n, lens, sub, out, 0, out.size, tbuf, False)
    assert end > 0
    return out[:end].copy()


@pytest.mark.parametrize("k", [1, 3, 7, 8])
def test_the_packer_matches_the_table_walk(k):
    """put_huff's payload of a code of every length k (hfixed.fixed_encode4: vectors, then symbol by symbol) is
    byte for byte the one the general encoder (huffenc._encode4, through put_huff's free path) writes, for sizes
    around every step of the vector loop and for ranges at both ends of the byte."""
    rng = np.random.default_rng(10 + k)
    for lo in {0, 256 - (1 << k), min(37, 256 - (1 << k))}:
        lens = np.zeros(256, np.uint8)
        lens[lo:lo + (1 << k)] = k
        for n in (1, 2, 7, 31, 32, 33, 64 * 8 + 5, 4 * 8 * (64 // k) + 1, 1000, 4099, 40000):
            p = (lo + rng.integers(0, 1 << k, n)).astype(np.uint8)
            h = np.zeros((4, 256), np.int64)
            histo4(p, n, h)
            sub = np.empty(4, np.int64)
            total = _huff_sub_bytes(h, lens, sub)
            out = np.full(total + 256, 0xA5, np.uint8)
            end = put_huff(p, n, lens, sub, out, 3, out.size, np.zeros(1, np.uint8), False)
            bound = np.full(4, sub.max() + 8, np.int64)
            ref = np.full(total + 256, 0xA5, np.uint8)
            end2 = put_huff(p, n, lens, bound, ref, 3, ref.size, np.zeros(4 * int(bound[0]) + 64, np.uint8), True)
            assert end == end2 > 0, (lo, n)
            assert np.array_equal(out, ref), (lo, n)   # (and nothing written past the end: the 0xA5 stay)


def _general(buf, plen, n, inter):
    """decode_huff_stream's general path (the table walk), never the fixed-length read: (status, symbols)."""
    lens = np.zeros(256, np.uint8)
    st, lo, hi, q = read_huff_table(buf, 0, plen, lens)
    if st != OK:
        return st, None
    dec = np.zeros(TABSIZE, np.uint16)
    if not build_decode_table(lens, dec):
        return -1, None
    ln = np.array(struct.unpack_from("<III", buf, q) + (0,), np.int64)
    q += 12
    rem = plen - q
    if ln[:3].sum() > rem or any(ln[k] > rem - ln[:k].sum() for k in range(3)):
        return -2, None
    st4 = np.array([q, q + ln[0], q + ln[0] + ln[1], q + ln[:3].sum()], np.int64)
    ln[3] = rem - ln[:3].sum()
    minlen = min(int(v) for v in lens if v > 0)
    single = 2 * minlen > MAXLEN
    dec1 = np.zeros(TABSIZE, np.uint16)
    dec3 = np.zeros(TABSIZE, np.uint64)
    if single:
        dec1[:] = (dec >> 8) | ((dec & 0xFF) << 8)
    else:
        build_multi_table(dec, dec3)
    out = np.zeros(n + 16, np.uint8)
    tmp = np.zeros(4 * ((n + 3) // 4 + 16), np.uint8)
    st = huff_decode4(buf, st4, ln, dec, dec3, dec1, single, out, n, tmp, inter)
    return st, (out[:n] if inter else tmp).copy()


def _fast(buf, plen, n, inter):
    lens = np.zeros(256, np.uint8)
    out = np.zeros(n + 16, np.uint8)
    tmp = np.zeros(4 * ((n + 3) // 4 + 16), np.uint8)
    st = decode_huff_stream(buf, 0, plen, out, n, lens, np.zeros(TABSIZE, np.uint16), np.zeros(TABSIZE, np.uint64),
                            np.zeros(TABSIZE, np.uint16), tmp, inter)
    return st, (out[:n] if inter else tmp).copy()


@pytest.mark.parametrize("k", [1, 3, 7, 8])
def test_the_direct_read_matches_the_table_walk(k):
    """Intact and damaged records of a code of every length k (k = 8: an old or forged record, not written by
    this encoder): the same status and, where it decodes, the same symbols, interleaved and in sub-stream rows;
    sizes around every group boundary of the direct read (56 // k symbols a load)."""
    rng = np.random.default_rng(k)
    lo = 256 - (1 << k) if k == 3 else 0
    lens = np.zeros(256, np.uint8)
    lens[lo:lo + (1 << k)] = k
    cases = 0
    for n in (1, 3, 4, 5, 31, 4 * (56 // k) + 3, 4 * 8 * (56 // k), 1000, 4099):
        p = (lo + rng.integers(0, 1 << k, n)).astype(np.uint8)
        rec = _record(p, lens)
        for inter in (True, False):
            st, y = _fast(rec, rec.size, n, inter)
            assert st == OK and st == _general(rec, rec.size, n, inter)[0]
            if inter:
                assert np.array_equal(y, p)
        for t in range(60):
            bad = rec.copy()
            plen = bad.size
            kind = t % 4
            if kind == 0:   # a byte changed: of the table, the jump table or a sub-stream
                j = int(rng.integers(0, bad.size))
                bad[j] ^= np.uint8(1 << int(rng.integers(0, 8)))
            elif kind == 1:   # a sub-stream length moved
                q = 2 + ((1 << k) + 1) // 2 + 4 * int(rng.integers(0, 3))
                v = struct.unpack_from("<I", bad, q)[0] + int(rng.integers(-2, 3))
                struct.pack_into("<I", bad, q, max(v, 0))
            elif kind == 2:   # cut short
                plen = int(rng.integers(2, bad.size))
            else:   # a padding bit set in a sub-stream's last byte
                bad[-1] |= np.uint8(0x80)
            for inter in (True, False):
                sf, yf = _fast(bad[:plen], plen, n, inter)
                sg, yg = _general(bad[:plen], plen, n, inter)
                if sg < 0:   # (the general path's own test of the jump table: decode_huff_stream's ERR_TRUNC)
                    assert sf != OK
                    continue
                assert sf == sg, (n, t, inter)
                if sf == OK:
                    assert np.array_equal(yf, yg) if inter else np.array_equal(_rows(yf, n), _rows(yg, n))
                cases += 1
    assert cases > 500


def _rows(tmp, n):
    """The symbols of the four sub-stream rows of huff_decode4's tmp (row j: (n + 3 - j) // 4 of them)."""
    r = (n + 3) // 4 + 16
    return np.concatenate([tmp[j * r:j * r + (n + 3 - j) // 4] for j in range(4)])


CHECKED = r"""
import numpy as np
import test_fixed_code as T
rng = np.random.default_rng(5)
for k in (1, 3, 7, 8):
    lens = np.zeros(256, np.uint8)
    lens[:1 << k] = k
    for n in (1, 5, 4 * (56 // k) + 3, 4 * 2 * (56 // k) + 1, 300):
        rec = T._record(rng.integers(0, 1 << k, n).astype(np.uint8), lens)
        for plen in (rec.size, rec.size - 1, rec.size // 2):
            for inter in (True, False):
                st, _ = T._fast(rec[:plen].copy(), plen, n, inter)
                assert (st == 0) == (plen == rec.size), (k, n, plen, st)
print("CHECKED OK")
"""


def test_the_direct_read_stays_inside_the_record():
    """Every load of the direct read lies inside the record: run with lmc's checked load helpers in plain
    Python (LMC_CHECKED=1, NUMBA_DISABLE_JIT=1), on records that end where the buffer ends, whole and cut."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", LMC_CHECKED="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    p = subprocess.run([sys.executable, "-c", CHECKED], env=env, capture_output=True, text=True, timeout=600,
                       cwd=here)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "CHECKED OK" in p.stdout


GUARD_CHILD = r"""
import ctypes, mmap, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import test_fixed_code as T
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None)
rng = np.random.default_rng(7)
cases = []
for k in (1, 3, 5, 7, 8):
    lens = np.zeros(256, np.uint8)
    lens[:1 << k] = k
    for n in (32, 33, 4 * 8 * 9, 4 * 8 * 9 + 5, 4096, 40000, 40003):
        rec = T._record(rng.integers(0, 1 << k, n).astype(np.uint8), lens)
        cases += [(rec, n, True), (rec[:rec.size - 1], n, False)]
np_ = (max(c[0].size for c in cases) + PAGE - 1) // PAGE + 1
mm = mmap.mmap(-1, (np_ + 1) * PAGE)
base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
assert libc.mprotect(ctypes.c_void_p(base + np_ * PAGE), PAGE, 0) == 0   # the page after the records: no access
arena = np.frombuffer(mm, np.uint8, count=np_ * PAGE)
for rec, n, whole in cases:
    buf = arena[arena.size - rec.size:]          # the record ends where the no-access page begins
    buf[:] = rec
    st, y = T._fast(buf, buf.size, n, True)
    assert (st == 0) == whole, (n, st)
print("ok", len(cases))
"""


def test_records_ending_at_a_no_access_page_are_read_without_a_fault():
    """The compiled decoder (the vector groups where the CPU has AVX2, then the scalar loop) on records whose last
    byte is the last one before a page with no access: a read past the record is a segmentation fault, seen here
    as the child's death."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    p = subprocess.run([sys.executable, "-c", GUARD_CHILD, here], env=env, capture_output=True, text=True,
                       timeout=600, cwd=here)
    assert p.returncode == 0 and p.stdout.split()[:1] == ["ok"], (p.returncode, p.stderr[-2000:])


def test_the_scalar_build_reads_the_same():
    """LMC_SIMD=0 (the build a CPU without AVX2 gets: the scalar loops only): the comparisons with the table walk
    (reading and packing) again, in a child."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, LMC_SIMD="0")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
                        "-k", "matches_the_table_walk"], cwd=here, env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "8 passed" in p.stdout
