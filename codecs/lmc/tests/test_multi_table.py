"""The Huffman decoder's multi-symbol table: the vector build (kernels.hmulti.multi8, where the CPU has AVX2)
against the scalar loop (huffman.build_multi_table), entry for entry, on codes of every shape the encoder makes
(two symbols to 256, lengths up to MAXLEN, skewed and flat), and the decoder's symbols through each."""
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
