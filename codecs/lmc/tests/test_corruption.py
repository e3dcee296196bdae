import os
import subprocess
import sys

import numpy as np
import pytest

import lmc
from helpers import make

HERE = os.path.dirname(os.path.abspath(__file__))


def test_corrupted_blobs_in_child():
    """3600 truncated / bit-flipped / extended / garbage blobs decoded in a
    child process: each must raise FormatError or decode exactly."""
    p = subprocess.run([sys.executable, os.path.join(HERE, "corrupt_child.py"), "3600"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert p.stdout.startswith("OK")


def test_every_single_bit_flip_detected():
    x = make(np.float16, 300, seed=8)
    blob = lmc.compress(x, chunk_size=128)
    for pos in range(len(blob)):
        for bit in range(8):
            b = bytearray(blob)
            b[pos] ^= 1 << bit
            with pytest.raises(lmc.FormatError):
                lmc.decompress(bytes(b))


def test_invalid_huffman_tables_rejected():
    from lmc.kernels import huffman as khuffman
    dec = np.empty(2048, np.uint16)
    lens = np.zeros(256, np.uint8)
    lens[:3] = [1, 2, 3]          # Kraft sum < 1
    assert not khuffman.build_decode_table(lens, dec)
    lens[:3] = [1, 1, 1]          # Kraft sum > 1
    assert not khuffman.build_decode_table(lens, dec)
    lens[:3] = [1, 2, 12]         # too long
    assert not khuffman.build_decode_table(lens, dec)
    lens[:3] = [1, 2, 2]
    assert khuffman.build_decode_table(lens, dec)


def _tab(vals, lo, hi):
    b = bytearray([lo, hi])
    for v in vals:
        b += bytes([v]) if v < 128 else bytes([0x80 | (v >> 8), v & 0xFF])
    return np.frombuffer(bytes(b), np.uint8)


def test_invalid_rans_tables_rejected():
    from lmc.kernels import rans as krans
    f = np.zeros(256, np.int64)
    cm = np.zeros(256, np.int64)

    def rd(a, maxsym=255):
        return krans.read_freq_table(a, 0, a.size, maxsym, f, 0, cm)
    assert rd(_tab([4000, 96], 3, 4)) == 5              # valid: 2 + 2 + 1 bytes
    assert rd(_tab([4000, 95], 3, 4)) == -1             # incomplete (sum 4095)
    assert rd(_tab([4000, 97], 3, 4)) == -1             # over-full (4097)
    assert rd(_tab([0, 4096], 3, 4)) == -1              # f[lo] == 0
    assert rd(_tab([4096, 0], 3, 4)) == -1              # f[hi] == 0
    assert rd(_tab([4096], 40, 40), maxsym=32) == -1    # symbol past the alphabet
    assert rd(_tab([4096], 5, 4)) == -1                 # hi < lo
    assert rd(np.array([3, 3, 0x80, 5], np.uint8)) == -1  # non-minimal two-byte value
    assert rd(np.array([3, 3, 0x90, 1], np.uint8)) == -1  # > 4096
    assert rd(_tab([4000, 96], 3, 4)[:4]) == -1         # truncated


def test_rans_final_state_checked():
    from lmc.kernels import base as kbase, rans as krans
    f = np.zeros(256, np.int64)
    f[:2] = [3000, 1096]
    cm = np.zeros(256, np.int64)
    krans.cum_freqs(f, 0, cm)
    seq = np.random.default_rng(0).integers(0, 2, 1000).astype(np.uint8)
    buf = np.zeros(2016, np.uint8)
    p = krans.rans_encode(seq, seq, False, 1000, f, cm, buf, 4)
    s = buf[p:].copy()
    dt = np.zeros(4096, np.uint32)
    krans.build_rans_dtab(f, cm, 0, dt, 0)
    out = np.zeros(1000, np.uint8)
    assert krans.rans_decode(s, 0, s.size, dt, out, False, out, 1000, 4) == kbase.OK
    assert np.array_equal(out, seq)
    for bad in (s[:-2], np.concatenate([s, [0, 0]]).astype(np.uint8)):
        assert krans.rans_decode(bad, 0, bad.size, dt, out, False, out, 1000, 4) != kbase.OK
    s2 = s.copy()
    s2[0] ^= 1  # initial state changed: final state no longer 2^16 (or overrun)
    assert krans.rans_decode(s2, 0, s2.size, dt, out, False, out, 1000, 4) != kbase.OK
    s3 = s.copy()
    s3[:4] = 0  # state below 2^16
    assert krans.rans_decode(s3, 0, s3.size, dt, out, False, out, 1000, 4) == kbase.ERR_RANS


def _refix_crc(b):
    """Recompute the header CRC of a (modified) blob."""
    import struct
    import zlib
    ndim = b[7]
    pos = 8 + 8 * ndim
    chunk, nch = struct.unpack_from("<II", b, pos)
    pos += 8 + (8 if b[6] & 1 else 0) + 12 * nch
    b[pos:pos + 4] = struct.pack("<I", zlib.crc32(bytes(b[:pos])))
    return b


def test_v2_modes_rejected_in_v1_blob():
    import ml_dtypes
    from make_vectors import train_pair
    x, r = train_pair(ml_dtypes.bfloat16, 5000, 1)
    blob = bytearray(lmc.compress(x, reference=r, format_version=3))
    assert blob[4] == 2
    blob[4] = 1
    with pytest.raises(lmc.FormatError, match="newer than the blob's format version"):
        lmc.decompress(bytes(_refix_crc(blob)), reference=r)
    blob[4] = 10   # (a version newer than any lmc knows)
    with pytest.raises(lmc.FormatError, match="version"):
        lmc.decompress(bytes(_refix_crc(blob)), reference=r)
    y = np.zeros(10000, np.int8)
    y[::41] = 1
    b2 = bytearray(lmc.compress(y, format_version=3))
    assert b2[4] == 2  # a rANS stream
    b2[4] = 1
    with pytest.raises(lmc.FormatError, match="newer than the blob's format version"):
        lmc.decompress(bytes(_refix_crc(b2)))


def test_every_single_bit_flip_detected_v2():
    import ml_dtypes
    from make_vectors import train_pair
    """Every flip raises, except in a temporal chunk's context base E (a free
    encoder parameter: other values of E may give the same contexts), where
    the result must then be exact."""
    x, r = train_pair(ml_dtypes.bfloat16, 400, 3)
    blob = lmc.compress(x, reference=r, chunk_size=200, format_version=3)
    assert lmc.info(blob)["version"] == 2
    h = len(blob) - sum(lmc.api._parse_header(np.frombuffer(blob, np.uint8))["sizes"])
    e_pos = {h + 1}  # first chunk (temporal): mode byte, then E
    assert blob[h] == 3
    exact = set()
    for pos in range(len(blob)):
        for bit in range(8):
            b = bytearray(blob)
            b[pos] ^= 1 << bit
            try:
                y = lmc.decompress(bytes(b), reference=r)
            except lmc.FormatError:
                continue
            assert y.tobytes() == x.tobytes()
            exact.add(pos)
    assert exact <= e_pos
