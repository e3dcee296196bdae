"""Helpers shared by the ExCP tests (test_excp.py, test_excp_hostile.py); the chain2 fixture is in conftest."""

from __future__ import annotations

import json
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest

from lmcbench.lossy import (
    ExCPConfig,
    ExCPFormatError,
    decode_checkpoint,
    encode_checkpoint,
    excp,
)

ARCHIVERS = ["none", "lzma", "zstd", "lmc"]


# ------------------------------------------------------------------------------------------ helpers
def _bits(a):
    """Byte image of an array, to compare bit-exactly (nan payloads and -0.0 included)."""
    a = np.ascontiguousarray(a)
    return a.dtype.str, a.shape, a.tobytes()


def assert_same_tree(a, b):
    """Same names, same arrays (a missing key counts as None), bit for bit, same dtypes."""
    assert list(a) == list(b)
    for name in a:
        for k in set(a[name]) | set(b[name]):
            x, y = a[name].get(k), b[name].get(k)
            if x is None or y is None:
                assert x is None and y is None, (name, k)
            else:
                assert x.dtype == y.dtype, (name, k)
                assert _bits(x) == _bits(y), (name, k)


def make_checkpoint(rng, scale=1.0, base=None):
    """A small 'model': matrix + bias with Adam state, an int buffer, a weight without state, a bf16 one."""
    if base is None:
        a = (rng.standard_normal((64, 50)) * 0.02).astype(np.float32)
        b = (rng.standard_normal(50) * 0.02).astype(np.float32)
        d = (rng.standard_normal(30) * 0.02).astype(np.float32)
    else:
        a = (base["a"]["weight"] + rng.standard_normal((64, 50)).astype(np.float32) * np.float32(1e-4 * scale))
        b = (base["b"]["weight"] + rng.standard_normal(50).astype(np.float32) * np.float32(1e-4 * scale))
        d = (base["d"]["weight"] + rng.standard_normal(30).astype(np.float32) * np.float32(1e-4 * scale))

    def moments(shape):
        m = (rng.standard_normal(shape) * 1e-4).astype(np.float32)
        v = (rng.random(shape) * 1e-8 + 1e-12).astype(np.float32)
        return m, v

    ma, va = moments(a.shape)
    mb, vb = moments(b.shape)
    me, ve = moments((8, 8))
    return {
        "a": {"weight": a.astype(np.float32), "exp_avg": ma, "exp_avg_sq": va},
        "b": {"weight": b.astype(np.float32), "exp_avg": mb, "exp_avg_sq": vb},
        "c": {"weight": np.arange(12, dtype=np.int64).reshape(3, 4)},
        "d": {"weight": d.astype(np.float32), "exp_avg": None, "exp_avg_sq": None},
        "e": {"weight": rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16), "exp_avg": me, "exp_avg_sq": ve},
    }


def weights_of(tree):
    return {n: d["weight"] for n, d in tree.items()}


def freeze(tree):
    """Make every caller array read-only and return a deep copy to compare against afterwards."""
    copy = {}
    for n, d in tree.items():
        copy[n] = {}
        for k, a in d.items():
            copy[n][k] = None if a is None else a.copy()
            if a is not None:
                a.flags.writeable = False
    return copy


def payload_of(blob):
    payload, _ = excp.container._unpack_container(blob)
    payload = bytes(payload)  # a view into the blob when it has no archiver
    (toc_len,) = struct.unpack("<I", payload[:4])
    return json.loads(payload[4:4 + toc_len]), payload[4 + toc_len:]


def repack(toc, data, archiver="none"):
    return excp.container._pack_container(excp.payload._build_payload(toc, [bytes(data)]), archiver,
                                {"lzma": 1, "zstd": 3}.get(archiver))


def raw_container(archived: bytes, arch_id: int, raw_len: int, raw_crc: int = 0) -> bytes:
    return struct.pack("<4sBBHQQII", b"ExCP", 1, arch_id, 0, raw_len, len(archived), raw_crc,
                       zlib.crc32(archived)) + archived


def expect_format_error(blob, refs=None):
    with pytest.raises(ExCPFormatError) as ei:
        decode_checkpoint(blob, refs)
    assert "\n" not in str(ei.value) and str(ei.value)
    return str(ei.value)


def encode_chain2():
    """A first checkpoint (lossless) and a second one coded against the first's reconstruction."""
    rng = np.random.default_rng(1)
    t1 = make_checkpoint(rng)
    blob1, rec1, _ = encode_checkpoint(t1, None, ExCPConfig(archiver="none"))
    t2 = make_checkpoint(rng, base=t1)
    ref = weights_of(rec1)
    blob2, rec2, stats2 = encode_checkpoint(t2, ref, ExCPConfig(archiver="none"))
    return {"t1": t1, "rec1": rec1, "t2": t2, "ref": ref, "blob2": blob2, "rec2": rec2, "stats2": stats2}
