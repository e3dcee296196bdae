"""Format version 8: version 7's chunks with a cheaper chunk checksum (FORMAT.md, "Checksums").

s2's term is the product of the two 32-bit halves of ``w_i ^ (i * C3)`` (one AVX2 ``vpmuludq`` for four words,
where version 5's two 64-bit multiplies a word take six), and s2 is mixed once before it is folded. Checked
here: the payloads are version 7's byte for byte; a blob relabelled between 7 and 8 is refused; and the
corruptions a decoder meets (flipped signs in one sub-stream, compensating low-bit changes, swapped or
garbled words) change the checksum as often as version 5's does, which is every time in these trials.
The oracle's agreement, constant chunks and the reference hash are in test_format4.py."""
import ml_dtypes
import numpy as np
import pytest

import lmc
from lmc import api
from lmc.kernels.base import checksum_units
from test_corruption import _refix_crc


def _pair(dt, n, seed):
    from make_vectors import train_pair
    return train_pair(dt, n, seed)


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("with_ref", [False, True])
def test_same_chunks_as_format_7(dt, with_ref):
    x, r = _pair(dt, 20000, 7)
    r = r if with_ref else None
    b7 = lmc.compress(x, reference=r, chunk_size=4096, format_version=7)
    b8 = lmc.compress(x, reference=r, chunk_size=4096, format_version=8)
    h7 = api._parse_header(np.frombuffer(b7, np.uint8))
    h8 = api._parse_header(np.frombuffer(b8, np.uint8))
    assert h7["version"] == 7 and h8["version"] == 8
    assert b7[h7["offsets"][0]:] == b8[h8["offsets"][0]:]
    assert (h7["sizes"] == h8["sizes"]).all() and (h7["chks"] != h8["chks"]).all()
    assert lmc.decompress(b8, reference=r).tobytes() == x.tobytes()


def test_relabelled_between_7_and_8_refused():
    x, _ = _pair(ml_dtypes.bfloat16, 5000, 8)
    for fv, other in ((7, 8), (8, 7)):
        b = bytearray(lmc.compress(x, chunk_size=1024, format_version=fv))
        b[4] = other
        with pytest.raises(lmc.FormatError, match="checksum"):
            lmc.decompress(bytes(_refix_crc(b)))


def _damages(rng, y):
    """Damage of the kinds a wrong decode makes, to uint16 words y (a bf16 chunk), in place; its name."""
    kind = rng.integers(5)
    if kind == 0:    # an even number of sign flips in one Huffman sub-stream (element 3 of their words)
        for a in rng.choice(y.size // 4, 2 * int(rng.integers(1, 4)), replace=False):
            y[4 * a + 3] ^= 0x8000
    elif kind == 1:  # +1 in one element, -1 in another (the sums of the values unchanged)
        a, b = rng.choice(np.flatnonzero((y > 0) & (y < 0xFFFF)), 2, replace=False)
        y[a] += 1
        y[b] -= 1
    elif kind == 2:  # two 64-bit words swapped
        w = y.view(np.uint64)
        a, b = rng.choice(w.size, 2, replace=False)
        if w[a] == w[b]:
            w[a] ^= 1
        w[a], w[b] = w[b], w[a]
    elif kind == 3:  # a run of elements replaced by others
        a = int(rng.integers(y.size - 64))
        y[a:a + 64] = rng.permutation(y[a:a + 64]) ^ rng.integers(0, 2, 64).astype(np.uint16)
    else:            # the same bit flipped in every element of a stride
        y[int(rng.integers(8))::8] ^= np.uint16(1 << int(rng.integers(16)))
    return kind


def test_damage_changes_the_checksum():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(2000):
        x = np.round(rng.standard_normal(4096) * 40).astype(np.int16).view(np.uint16)  # few distinct words
        y = x.copy()
        seen.add(_damages(rng, y))
        if (x == y).all():
            continue
        xb, yb = x.view(np.uint8), y.view(np.uint8)
        assert int(checksum_units(xb, 0, x.size, 2, 3)) != int(checksum_units(yb, 0, y.size, 2, 3))
        assert int(checksum_units(xb, 0, x.size, 2, 2)) != int(checksum_units(yb, 0, y.size, 2, 2))
    assert seen == set(range(5))


def test_ref_pass_is_the_checksum_and_the_context_base():
    """The encoder's one pass over a reference chunk (check.ref_pass) gives the chunk's checksum (checksum_units)
    and the temporal mode's context base (temporal_base) as their own passes do: every float layout, starts and
    lengths that leave units past the last whole 8-byte word, exponents all ones (inf / NaN, left out of the base)
    and subnormals, lengths of several of ref_pass's blocks (check.RP_BLOCK) with a tail past the last; the base is
    also compared with numpy's; other checksum kinds and the planes layout leave the base to the chunk coder (-1)."""
    from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F16, LAYOUT_F32, LAYOUT_PLANES, checksum_units
    from lmc.kernels.check import ref_pass
    from lmc.kernels.temporal import temporal_base
    rng = np.random.default_rng(21)
    from lmc.kernels.check import RP_BLOCK
    N = RP_BLOCK + 1011   # (units: bf16 2.1 blocks, fp32 4.2)
    for layout, unit, dt, mb, em in ((LAYOUT_BF16, 2, np.uint16, 7, 0xFF), (LAYOUT_F16, 2, np.uint16, 10, 0x1F),
                                     (LAYOUT_F32, 4, np.uint32, 23, 0xFF)):
        W = 8 * unit
        for case in range(4):
            u = rng.integers(0, 1 << W, N, dtype=np.uint64).astype(dt)
            if case == 1:   # inf / NaN everywhere but a few units: their exponent is all ones
                u[:] = np.array(0x7F80 if layout == LAYOUT_BF16 else (0x7C00 if layout == LAYOUT_F16 else 0x7F800000),
                                dt) | (u & dt(1))
                u[::97] = dt(5)
            elif case == 2:   # small exponents only (subnormals and zeros)
                u &= dt(0x807F if layout == LAYOUT_BF16 else (0x83FF if layout == LAYOUT_F16 else 0x807FFFFF))
            elif case == 3:   # the largest finite exponent in the last unit only
                u &= dt(0x3FFF if W == 16 else 0x3FFFFFFF)
                u[-1] = dt(0x7F00 if layout == LAYOUT_BF16 else (0x7800 if layout == LAYOUT_F16 else 0x7F000000))
            b = u.view(np.uint8)
            for start, n in ((0, 1000), (0, 1), (3, 5), (1, 998), (7, 993), (2, 3), (0, N), (5, N - 5),
                             (3, RP_BLOCK // unit + 7), (0, N - 1)):
                e = (u[start:start + n] >> dt(mb)) & dt(em)
                e = e[e != em]
                want = int(e.max()) if e.size else 0
                assert temporal_base(b, start, n, layout) == want, (layout, case, start, n)
                for wk in (0, 1, 2, 3):
                    chk, E = ref_pass(b, start, n, unit, layout, wk)
                    assert chk == checksum_units(b, start, n, unit, wk), (layout, case, start, n, wk)
                    assert E == (want if wk == 3 else -1), (layout, case, start, n, wk)
    b = rng.integers(0, 256, 100, dtype=np.uint8)
    assert ref_pass(b, 0, 100, 1, LAYOUT_PLANES, 3) == (checksum_units(b, 0, 100, 1, 3), -1)
