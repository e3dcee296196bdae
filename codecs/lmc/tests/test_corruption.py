import os
import subprocess
import sys

import numpy as np
import pytest

import lmc
from helpers import make

HERE = os.path.dirname(os.path.abspath(__file__))


def test_corrupted_blobs_in_child():
    """2100 truncated / bit-flipped / extended / garbage blobs decoded in a
    child process: each must raise FormatError or decode exactly."""
    p = subprocess.run([sys.executable, os.path.join(HERE, "corrupt_child.py"), "2100"],
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
    from lmc import _kernels as K
    dec = np.empty(2048, np.uint16)
    lens = np.zeros(256, np.uint8)
    lens[:3] = [1, 2, 3]          # Kraft sum < 1
    assert not K.build_decode_table(lens, dec)
    lens[:3] = [1, 1, 1]          # Kraft sum > 1
    assert not K.build_decode_table(lens, dec)
    lens[:3] = [1, 2, 12]         # too long
    assert not K.build_decode_table(lens, dec)
    lens[:3] = [1, 2, 2]
    assert K.build_decode_table(lens, dec)
