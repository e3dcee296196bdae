"""Format versions 4 and 5: the chunk checksums (and the reference hash) over 64-bit words instead of units
(version 5: with a stronger mix, see the last test).

The oracle (pyref, written from FORMAT.md) decodes version-4 blobs of every dtype and chunk tail; a
constant chunk's checksum (computed without writing it, in the structural pre-pass) agrees with the
written chunk's; the payloads are format 3's, byte for byte; a blob relabelled between versions 3 and 4
is refused (its checksums are the other kind)."""
import struct

import ml_dtypes
import numpy as np
import pytest

import lmc
import pyref
from lmc import api
from lmc.kernels.base import checksum_fill, checksum_units
from test_corruption import _refix_crc

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.uint8, np.int16, np.int32,
          np.int64, np.bool_, np.complex64]


def _sample(dt, n, seed):
    rng = np.random.default_rng(seed)
    if dt == np.bool_:
        return rng.random(n) < 0.2
    if np.issubdtype(np.dtype(dt), np.integer):
        return rng.integers(-3, 4, n).astype(dt)
    if dt == np.complex64:
        return (rng.standard_normal(n) * 0.02 + 1j * rng.standard_normal(n) * 0.02).astype(dt)
    return (rng.standard_normal(n) * 0.02).astype(np.float32).astype(dt)


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, 9, 15, 16, 17, 1000, 1003])
def test_word_checksum_matches_the_oracle(nbytes):
    b = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    for unit in (1, 2, 4, 8):
        if nbytes % unit:
            continue
        for wk, version in ((1, 4), (2, 5), (3, 8)):
            assert int(checksum_units(b, 0, nbytes // unit, unit, wk)) == pyref.word_checksum(b.tobytes(), version)
        assert int(checksum_units(b, 0, nbytes // unit, unit, 0)) == pyref.checksum(
            [int.from_bytes(b[i:i + unit].tobytes(), "little") for i in range(0, nbytes, unit)])


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_v4_blobs_decode_in_the_oracle(dt):
    """Chunks of odd lengths (the last word padded), alone and with a reference."""
    x = _sample(dt, 2003, 1)
    r = _sample(dt, 2003, 2)
    r.reshape(-1)[::3] = x.reshape(-1)[::3]
    for ref, fv in ((None, 4), (r, 4), (None, 5), (r, 5), (None, 8), (r, 8)):
        for chunk in (257, 1000):
            blob = lmc.compress(x, reference=ref, chunk_size=chunk, format_version=fv)
            assert lmc.info(blob)["version"] == fv
            assert lmc.decompress(blob, reference=ref).tobytes() == x.tobytes()
            out, _, _ = pyref.decode(blob, None if ref is None else ref.tobytes())
            assert out == x.tobytes()


@pytest.mark.parametrize("unit", [1, 2, 4, 8])
@pytest.mark.parametrize("use_ref", [False, True])
def test_constant_chunk_checksum_without_writing_it(unit, use_ref):
    """checksum_fill (the pre-pass's checksum of a chunk of one repeated unit, XORed with a reference)
    equals the checksum of the materialised chunk, for odd unit counts and offsets."""
    rng = np.random.default_rng(unit)
    for start, n in ((0, 1), (3, 5), (5, 13), (1, 64), (7, 1001)):
        v = int(rng.integers(0, 1 << (8 * unit), dtype=np.uint64)) if unit < 8 else int(rng.integers(1 << 62))
        ref = rng.integers(0, 256, (start + n) * unit, dtype=np.uint8)
        units = np.full(n, v, dtype=f"<u{unit}").view(np.uint8)
        if use_ref:
            units = units ^ ref[start * unit:(start + n) * unit]
        buf = np.zeros((start + n) * unit, np.uint8)
        buf[start * unit:] = units
        for wk in (0, 1, 2, 3):  # units (versions 1-3), words (4), the strong mix (5-7), the halves' product (8)
            want = int(checksum_units(buf, start, n, unit, wk))
            got = int(checksum_fill(ref if use_ref else np.zeros(0, np.uint8), use_ref, start, n, unit,
                                    np.uint64(v), wk))
            assert got == want, (wk, start, n)


def test_constant_chunks_verified_in_the_prepass():
    """Constant chunks (alone and XOR with the reference) decode in version 4; a wrong checksum on one is
    refused before any chunk is decoded."""
    x = np.full(3001, -7, np.int32)
    ref = x.copy()
    for r in (None, ref):
        blob = lmc.compress(x, reference=r, chunk_size=1000)
        assert lmc.decompress(blob, reference=r).tobytes() == x.tobytes()
        h = api._parse_header(np.frombuffer(blob, np.uint8))
        tab = h["offsets"][0] - 4 - 12 * h["nch"]
        b = bytearray(blob)
        k = tab + 12 * 2 + 4   # the last chunk's checksum
        b[k] ^= 1
        with pytest.raises(lmc.FormatError, match="checksum"):
            lmc.decompress(bytes(_refix_crc(b)), reference=r)


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16, np.int8])
def test_same_payloads_as_format_3(dt):
    """Versions 4 and 5 (the default setting) change the checksums only: the same chunks, the same sizes."""
    from make_vectors import train_pair
    if dt == np.int8:
        x, r = _sample(dt, 9000, 3), None
    else:
        x, r = train_pair(dt, 9000, 4)
    b3 = lmc.compress(x, reference=r, chunk_size=2048, format_version=3)
    for fv in (4, 5):
        b4 = lmc.compress(x, reference=r, chunk_size=2048, format_version=fv)
        assert len(b3) == len(b4)
        h3 = api._parse_header(np.frombuffer(b3, np.uint8))
        h4 = api._parse_header(np.frombuffer(b4, np.uint8))
        assert h3["version"] <= 3 and h4["version"] == fv
        assert b3[h3["offsets"][0]:] == b4[h4["offsets"][0]:]
        assert (h3["sizes"] == h4["sizes"]).all()
        if r is not None:
            assert h3["refhash"] != h4["refhash"]


def test_relabelled_version_refused():
    """A blob of version 3, 4 or 5 read as another of them fails its checksums."""
    x = _sample(ml_dtypes.bfloat16, 5000, 5)
    blobs = {fv: bytes(lmc.compress(x, chunk_size=1024, format_version=fv)) for fv in (3, 4, 5)}
    assert blobs[3][4] <= 3 and blobs[4][4] == 4 and blobs[5][4] == 5
    for fv, blob in blobs.items():
        for other in {3, 4, 5} - {fv}:
            b = bytearray(blob)
            b[4] = other
            with pytest.raises(lmc.FormatError, match="checksum"):
                lmc.decompress(bytes(_refix_crc(b)))


def test_reference_hash_follows_the_version():
    """The reference hash is over the reference's word checksums in version 4: the right reference
    decodes, a reference one bit off (where a chunk uses it) is refused, named by its hash."""
    x = _sample(np.float32, 4000, 6)
    r = x.copy()
    r[::7] += 1e-3
    for fv, wk in ((4, 1), (5, 2), (8, 3)):
        blob = lmc.compress(x, reference=r, chunk_size=1000, format_version=fv)
        (rh,) = struct.unpack_from("<Q", blob, 8 + 8 + 8)
        assert rh == api._ref_hash(api._ro_bytes(r), r.size, 1000, 4, 1, wk)
        for other in {0, 1, 2, 3} - {wk}:
            assert rh != api._ref_hash(api._ro_bytes(r), r.size, 1000, 4, 1, other)
        assert lmc.decompress(blob, reference=r).tobytes() == x.tobytes()
    bad = r.copy()
    bad.view(np.uint8)[123] ^= 4
    with pytest.raises(lmc.FormatError, match="reference hash"):
        lmc.decompress(blob, reference=bad)


def test_reference_checked_where_a_chunk_uses_it():
    """The reference's hash names a wrong reference when a chunk fails (lmc takes it only then): a reference
    that differs inside a chunk coded without it gives the exact array; one that differs inside a chunk coded
    against it is refused as the wrong reference (with ``out=`` too)."""
    rng = np.random.default_rng(11)
    r = (rng.standard_normal(8000) * 0.02).astype(np.float32)
    x = r.copy()
    x[:4000] += (rng.standard_normal(4000) * 1e-5).astype(np.float32)          # chunks 0-3: close to r
    x[4000:] = (rng.standard_normal(4000) * 0.02).astype(np.float32)           # chunks 4-7: unrelated
    for fv in (8, 9):
        blob = lmc.compress(x, reference=r, chunk_size=1000, format_version=fv)
        h = api._parse_header(np.frombuffer(blob, np.uint8))
        modes = [blob[o] for o in h["offsets"].tolist()]
        assert all(m in (2, 3, 6) for m in modes[:4]), modes        # xor, temporal or delta: use r
        assert all(m in (0, 4) for m in modes[4:]), modes           # alone or predicted: do not
        unused, used = r.copy(), r.copy()
        unused[6500] = -unused[6500]
        used[1500] = -used[1500]
        assert lmc.decompress(blob, reference=unused).tobytes() == x.tobytes()
        with pytest.raises(lmc.FormatError, match="wrong reference"):
            lmc.decompress(blob, reference=used)
        out = np.zeros_like(x)
        with pytest.raises(lmc.FormatError, match="wrong reference"):
            lmc.decompress(blob, reference=used, out=out)


def test_version5_checksum_sees_top_bit_flips_that_version4_misses():
    """Format 4's mix lets bit 63 of a word reach only bits 63 and 34 of s2 (and two flips of bit 63 cancel in
    s1), so an even number of bf16 sign flips at element 3 of their words (one Huffman sub-stream's symbols)
    can leave the checksum unchanged; the fuzzer found such a blob. Format 5's mix (x ^= x >> 32, x *= C2)
    spreads the bit: over the same pairs of flips it never misses one."""
    rng = np.random.default_rng(0)
    miss4 = miss5 = 0
    for _ in range(300):
        x = rng.integers(0, 1 << 16, 1024, dtype=np.uint16)
        y = x.copy()
        a, b = rng.choice(256, 2, replace=False)
        y[4 * a + 3] ^= 0x8000
        y[4 * b + 3] ^= 0x8000
        xb, yb = x.view(np.uint8), y.view(np.uint8)
        miss4 += int(checksum_units(xb, 0, 1024, 2, 1)) == int(checksum_units(yb, 0, 1024, 2, 1))
        miss5 += int(checksum_units(xb, 0, 1024, 2, 2)) == int(checksum_units(yb, 0, 1024, 2, 2))
    assert miss4 > 50 and miss5 == 0, (miss4, miss5)
