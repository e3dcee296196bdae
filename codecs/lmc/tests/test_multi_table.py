"""The Huffman decoder's multi-symbol table: the vector build (kernels.hmulti.multi8, where the CPU has AVX2)
against the scalar loop (huffman.build_multi_table), entry for entry, on codes of every shape the encoder makes
(two symbols to 256, lengths up to MAXLEN, skewed and flat), and the decoder's symbols through each; on an
AVX-512 CPU, the 8-lane forms of this decoder's vector loops in an ``LMC_SIMD=avx2`` child."""
import os
import subprocess
import sys

import numpy as np
import pytest

from lmc.kernels import simd
from lmc.kernels.base import MAXLEN, TABSIZE
from lmc.kernels.hmulti import multi8
from lmc.kernels.huffman import build_decode_table, build_multi_table, huffman_lengths


def _codes(seed):
    """Length sets of complete codes: from counts of a random alphabet and skew, as the encoder builds them."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        m = int(rng.choice([2, 3, 5, 17, 40, 120, 256]))
        lo = int(rng.integers(0, 257 - m))
        skew = float(rng.choice([0.0, 0.5, 1.2, 2.5, 6.0]))
        freq = np.zeros(256, np.int64)
        freq[lo:lo + m] = np.maximum(1, (1e6 / np.arange(1, m + 1) ** skew * rng.uniform(0.5, 1.5, m))).astype(int)
        lens = np.zeros(256, np.uint8)
        huffman_lengths(freq, lens)
        yield lens


def _single(lens):
    dec = np.zeros(TABSIZE, np.uint16)
    assert build_decode_table(lens, dec)
    return dec


@pytest.mark.skipif(not simd.SIMD, reason="the vector build needs AVX2 (the scalar loop is the decoder's there)")
@pytest.mark.parametrize("seed", range(4))
def test_vector_build_equals_the_scalar_loop(seed):
    for lens in _codes(seed):
        dec = _single(lens)
        want = np.zeros(TABSIZE, np.uint64)
        build_multi_table(dec, want)
        got = np.full(TABSIZE, 0xDEADBEEF, np.uint64)
        before = dec.copy()
        assert multi8(dec, got)
        assert np.array_equal(got, want), lens[lens > 0]
        assert np.array_equal(dec, before)   # (the single-symbol table is only read)


def test_entries_decode_their_index():
    """Each entry (either build) holds the symbols the single-symbol table reads from its 11 bits, in order,
    while their codes fit, up to four."""
    for lens in _codes(7):
        dec = _single(lens)
        tab = np.zeros(TABSIZE, np.uint64)
        if not multi8(dec, tab):
            build_multi_table(dec, tab)
        for idx in range(0, TABSIZE, 37):
            e = int(tab[idx])
            tot, cnt = e & 63, (e >> 40) & 7
            syms, bits, rest = [], 0, idx
            while len(syms) < 4:
                s, ln = int(dec[rest]) & 255, int(dec[rest]) >> 8
                if bits + ln > MAXLEN:
                    break
                syms.append(s)
                bits += ln
                rest >>= ln
            assert (tot, cnt) == (bits, len(syms))
            assert [(e >> (8 + 8 * j)) & 255 for j in range(cnt)] == syms


@pytest.mark.skipif(not simd.SIMD512, reason="the AVX2 loops are the ones this CPU runs: the tests cover them")
def test_avx2_loops_on_an_avx512_cpu():
    """Where the CPU has AVX-512 the table build, the joint-symbol merge and the paired restore run their 16- and
    32-lane forms; LMC_SIMD=avx2 keeps the 8-lane ones (what an AVX2 CPU runs): their tests run again in a child
    with it."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, LMC_SIMD="avx2")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.abspath(__file__), os.path.join(here, "test_restore.py"),
                        os.path.join(here, "test_joint.py"), "-k",
                        "not avx2_loops and (vector or entries or pair or restore or partial_last_block or any_length)"],
                       cwd=here, env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert " passed" in p.stdout and " failed" not in p.stdout
