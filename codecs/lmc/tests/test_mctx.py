"""The mantissa-context chunk mode (format 5, bfloat16, compress(prefer="size")): round trips through lmc and
the Python oracle, when the encoder takes it and when it must not, its estimate, and the refusals FORMAT.md
requires of a decoder (the structure-aware fuzzer forges it too: fuzz_modes._mctx_mutation)."""
import struct

import ml_dtypes
import numpy as np
import pytest

import lmc
import pyref
from fuzz_blobs import Blob, _skewed
from lmc.kernels import mctx as kmctx

BF = ml_dtypes.bfloat16


def _weights(n, seed=0, scale=0.02):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32).astype(BF)


def _modes(blob):
    return [p[0] for p in Blob(blob).payloads]


def test_weights_take_it_and_round_trip():
    # weight-like values, three chunks, the last of odd length
    # (format 6: at 16384 elements a chunk's rANS streams have 4 states; format 7's 32 cost 112 bytes more a
    # stream, which at this chunk size is more than the mode saves: see test_format7_takes_it)
    x = _weights(2 * 16384 + 12001).reshape(-1)
    blob = lmc.compress(x, prefer="size", chunk_size=16384, format_version=6)
    v4 = lmc.compress(x, prefer="size", chunk_size=16384, format_version=4)
    assert _modes(blob) == [5, 5, 5]
    assert lmc.info(blob)["version"] == 6 and lmc.info(blob)["chunk_modes"] == {"mantissa-context": 3}
    assert lmc.info(v4)["version"] == 4 and 5 not in _modes(v4)
    assert len(blob) < len(v4) * 0.9985             # ~0.2-0.3% smaller on a bell-shaped distribution
    for threads in (1, 2):
        assert lmc.decompress(blob, threads=threads).tobytes() == x.tobytes()
    out, cmodes, _ = pyref.decode(blob)             # the oracle, written from FORMAT.md, agrees
    assert out == x.tobytes() and cmodes == {5}


def test_speed_and_other_dtypes_never_take_it():
    x = _weights(40000)
    speed = lmc.compress(x, chunk_size=16384, format_version=8)
    v4 = lmc.compress(x, chunk_size=16384, format_version=4)
    assert lmc.info(speed)["version"] == 8 and lmc.info(v4)["version"] == 4
    assert Blob(speed).payloads == Blob(v4).payloads    # the same payloads as 0.3.3 wrote; checksums differ
    assert 5 not in _modes(speed) and 5 not in _modes(lmc.compress(x, chunk_size=16384))   # (nor format 9)
    for dt in (np.float32, np.float16):
        y = x.astype(np.float32).astype(dt)
        assert 5 not in _modes(lmc.compress(y, prefer="size", chunk_size=16384))
    with pytest.raises(ValueError, match="format_version"):
        lmc.compress(x, format_version=11)


def test_alone_option_in_a_blob_with_a_reference():
    x = _skewed(3000, 1).astype(BF)
    far = _skewed(3000, 2).astype(BF)
    blob = lmc.compress(x, reference=far, prefer="size", chunk_size=1500)
    assert 5 in _modes(blob)
    assert lmc.decompress(blob, reference=far).tobytes() == x.tobytes()
    assert pyref.decode(blob, far.tobytes())[0] == x.tobytes()


def test_special_values_and_every_context():
    # +-0, denormals, inf and NaN (exponents 0 and 255) among skewed values: they land in the first and the
    # last context and round-trip bit for bit
    x = _skewed(4001, 3)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e38], np.float32)
    x[::97][:len(sp) * 5] = np.tile(sp, 5)[:len(x[::97][:len(sp) * 5])]
    x = x.astype(BF)
    blob = lmc.compress(x, prefer="size", chunk_size=4001)
    assert _modes(blob) == [5]
    assert lmc.decompress(blob).tobytes() == x.tobytes()
    assert pyref.decode(blob)[0] == x.tobytes()


def test_format7_takes_it():
    # format 8: every chunk of 32768 elements takes the mode with prefer="size" (its streams of 8192 symbols or
    # more have 32 rANS states), and the oracle decodes it; format 9's joint-symbol mode is smaller still here
    x = _weights(3 * 32768, seed=2)
    blob = lmc.compress(x, prefer="size", chunk_size=32768, format_version=8)
    assert lmc.info(blob)["version"] == 8 and _modes(blob) == [5, 5, 5]
    assert len(blob) < len(lmc.compress(x, chunk_size=32768, format_version=8)) * 0.9985
    v9 = lmc.compress(x, prefer="size", chunk_size=32768)
    assert _modes(v9) == [7, 7, 7] and len(v9) < len(blob)
    assert lmc.decompress(blob).tobytes() == x.tobytes()
    out, cmodes, _ = pyref.decode(blob)
    assert out == x.tobytes() and cmodes == {5}


@pytest.mark.parametrize("fv, n", [(6, 16384), (7, 32768)])
def test_plan_estimate_matches_the_written_chunk(fv, n):
    x = _weights(n, seed=4)
    blob = lmc.compress(x, prefer="size", chunk_size=n, format_version=fv)
    b = Blob(blob)
    u = x.view(np.uint16).astype(np.int64)
    e = ((u >> 7) & 0xFF).astype(np.uint8)
    sm = (((u >> 8) & 0x80) | (u & 0x7F)).astype(np.uint8)
    mf = np.zeros(8 * 256, np.int64)
    mcm = np.zeros(8 * 256, np.int64)
    (plen,) = struct.unpack_from("<I", b.payloads[0], 5)
    est, E, K, mask = kmctx.mctx_plan(e, sm, e.size, 5 + plen, np.empty(4096, np.int64), mf, mcm, fv)
    p = b.payloads[0]
    assert (p[1], p[2], p[3]) == (E, K, mask)
    # the rANS estimate (ideal bits of the quantised tables; 1: the mode byte), within a byte or so per state
    assert abs(len(p) - 1 - est) <= 16 + 8 + (32 if fv >= 7 else 0)


def _one_chunk():
    x = _skewed(2001, 5).astype(BF)
    blob = lmc.compress(x, prefer="size", chunk_size=2001)
    assert _modes(blob) == [5]
    b = Blob(blob)
    return x, b, bytearray(b.payloads[0])


@pytest.mark.parametrize("forge, message", [
    (lambda b, p: b.pack(version=4), "newer than the blob's format version"),
    (lambda b, p: b.pack(code=2), "invalid chunk flags byte"),                      # float16: no mode 5
    (lambda b, p: b.pack([bytes(p[:2]) + b"\x00" + bytes(p[3:])]), "context count outside 1..8"),
    (lambda b, p: b.pack([bytes(p[:2]) + b"\x09" + bytes(p[3:])]), "context count outside 1..8"),
    (lambda b, p: b.pack([bytes(p[:3]) + b"\x00" + bytes(p[4:])]), "context mask empty or past it"),
    (lambda b, p: b.pack([bytes(p[:3]) + bytes([p[3] | 1 << p[2]]) + bytes(p[4:])])
     if p[2] < 8 else b.pack([bytes(p[:3]) + b"\x00" + bytes(p[4:])]), "context mask empty or past it"),
    (lambda b, p: b.pack([bytes(p[:3])]), "truncated"),
    (lambda b, p: b.pack([bytes(p[:-1])]), "payload length inconsistent"),
    (lambda b, p: b.pack([bytes(p) + b"\x00"]), "payload length inconsistent"),
    (lambda b, p: b.pack([bytes(p[:-1]) + bytes([p[-1] | 0x80])]), "unused final nibble"),   # n odd
    (lambda b, p: b.pack([bytes(p[:1]) + bytes([(p[1] + 40) & 0xFF]) + bytes(p[2:])]),
     "context mask does not match"),
])
def test_forgeries_are_refused(forge, message):
    x, b, p = _one_chunk()
    assert x.size % 2 == 1
    with pytest.raises(lmc.FormatError, match=message):
        lmc.decompress(forge(b, p))
    with pytest.raises(ValueError):
        pyref.decode(forge(b, p))
