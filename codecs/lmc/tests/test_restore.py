"""The predicted-exponent mode's decoder pass (kernels.restore): the saturating form of the LOCO-I median that its
vector loop uses, on every byte triple; the vector loop against the scalar one and against a plain Python loop;
and exp_restore as the inverse of exp_residuals for every row length the decoder can meet."""
import ml_dtypes
import numpy as np
import pytest

import lmc
from fuzz_blobs import Blob
from lmc.kernels import restore
from lmc.kernels.base import CHUNK_PRED
from lmc.kernels.simd import SIMD
from lmc.kernels.streams import exp_residuals


def plain_restore(res, w):
    """FORMAT.md's rule, one element at a time."""
    p = [int(v) for v in res]
    for i in range(4, len(p)):
        if i < w + 4:
            pred = p[i - 4]
        else:
            a, b, c = p[i - 4], p[i - w], p[i - w - 4]
            pred = max(min(a, b), min(max(a, b), a + b - c))
        p[i] = (p[i] + pred) & 255
    return np.array(p, np.uint8)


def test_saturating_median_on_every_byte_triple():
    v = np.arange(256, dtype=np.int16)
    a, b, c = v[:, None, None], v[None, :, None], v[None, None, :]
    med = np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), a + b - c))
    up = np.minimum(np.maximum(a, b), np.minimum(a + np.maximum(b - c, 0), 255))     # b >= c
    down = np.maximum(np.minimum(a, b), np.maximum(a - np.maximum(c - b, 0), 0))    # b < c
    assert np.array_equal(np.where(c > b, down, up), med)
    # (the earlier form, three operations deep on a)
    up = np.maximum(a, np.minimum(np.minimum(a + np.maximum(b - c, 0), 255), b))
    down = np.minimum(a, np.maximum(np.maximum(a - np.maximum(c - b, 0), 0), b))
    assert np.array_equal(np.where(c > b, down, up), med)


def _residuals(rng, n, kind):
    if kind == "uniform":
        return rng.integers(0, 256, n).astype(np.uint8)
    if kind == "small":
        return rng.integers(0, 3, n).astype(np.uint8)
    if kind == "edges":   # residuals that take the chains to 0 and 255, where the saturation acts
        return rng.choice(np.array([0, 1, 2, 127, 128, 254, 255], np.uint8), n)
    return (rng.integers(0, 2, n) * 255).astype(np.uint8)


@pytest.mark.parametrize("kind", ["uniform", "small", "edges", "binary"])
def test_vector_steps_match_scalar_steps(kind):
    rng = np.random.default_rng(["uniform", "small", "edges", "binary"].index(kind))
    for _ in range(60):
        n = int(rng.integers(8, 3000))
        w = int(rng.integers(4, max(5, n)))
        i0 = min(w + 4, n)
        res = _residuals(rng, n, kind)
        a, b = res.copy(), res.copy()
        ia = restore.vector_steps(a, i0, n, w)
        ib = restore.scalar_steps(b, i0, n, w)
        assert ia == ib == i0 + ((n - i0) >> 2 << 2)
        assert np.array_equal(a, b)


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 7, 8, 64, 129, 1000, 5000])
def test_exp_restore_is_formats_rule_and_inverts_residuals(w):
    rng = np.random.default_rng(w)
    for n in (1, 3, 4, 5, 8, w + 3, w + 4, w + 5, w + 8, 2 * w + 13, 4099):
        for kind in ("uniform", "small", "edges"):
            res = _residuals(rng, n, kind)
            p = res.copy()
            restore.exp_restore(p, n, w)
            assert np.array_equal(p, plain_restore(res, w)), (n, kind)
            back = np.zeros(n, np.uint8)
            exp_residuals(p, n, w, back)
            assert np.array_equal(back, res)


def test_the_vector_loop_is_the_one_that_runs_where_simd_holds():
    assert (restore.vector_steps is not restore.scalar_steps) == SIMD


def test_predicted_chunks_round_trip_through_the_api():
    """Second moments are where the mode is taken: rows of 64 to 700, bf16 and fp32, the chunks' ends inside rows."""
    rng = np.random.default_rng(7)
    for rows, w in ((300, 64), (90, 700), (1200, 33)):
        # each column and each row its own scale over many binades, as an Adam second moment's: the exponent is
        # spread wide alone and predicted well from the row above and the left neighbour
        scale = np.exp2(rng.uniform(-30, 0, w))[None, :] * np.exp2(rng.uniform(-4, 0, rows))[:, None]
        x = (scale * (1 + 0.2 * rng.random((rows, w)))).astype(np.float32)
        for arr in (x, x.astype(ml_dtypes.bfloat16)):
            blob = lmc.compress(arr, chunk_size=10_000)
            assert lmc.info(blob)["chunk_modes"].get("predicted", 0) > 0
            assert np.array_equal(lmc.decompress(blob).view(np.uint8), arr.view(np.uint8))


@pytest.mark.parametrize("w", [1, 3, 4, 5, 64, 1000])
def test_exp_restore2_is_exp_restore_of_each_plane(w):
    """The two chains side by side (kernels.pair's restore) give each plane's own bytes, whichever is longer."""
    rng = np.random.default_rng(100 + w)
    for n, m in ((0, 5), (w + 4, w + 4), (w + 5, 3 * w + 17), (4099, 4096), (4096, 131), (257, 9000)):
        for kind in ("uniform", "small", "edges"):
            a, b = _residuals(rng, n, kind), _residuals(rng, m, kind)
            p, q = a.copy(), b.copy()
            restore.exp_restore2(p, n, q, m, w)
            assert np.array_equal(p, plain_restore(a, w)) and np.array_equal(q, plain_restore(b, w)), (n, m, kind)


def _pred_blob(dt, chunk=4096):
    rng = np.random.default_rng(11)
    scale = np.exp2(rng.uniform(-30, 0, 576))[None, :] * np.exp2(rng.uniform(-4, 0, 96))[:, None]
    x = (scale * (1 + 0.2 * rng.random((96, 576)))).astype(np.float32).astype(dt)
    blob = lmc.compress(x, chunk_size=chunk)
    modes = [p[0] for p in Blob(blob).payloads]
    assert len(modes) == 14 and modes.count(CHUNK_PRED) == len(modes)   # (an even count, then an odd one)
    return x, blob


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
def test_predicted_chunks_in_pairs_decode_as_each_alone(dt):
    """decode_range takes two predicted-exponent chunks in a row as a pair (kernels.pair): every split of the
    chunks among threads (pairs, a chunk left alone at a range's end) and an odd count give the array."""
    x, blob = _pred_blob(dt)
    for th in (1, 2, 3, 5):
        assert lmc.decompress(blob, threads=th).tobytes() == x.tobytes()
    x13 = x[:90]   # (13 chunks, the last one short)
    b13 = lmc.compress(x13, chunk_size=4096)
    assert [p[0] for p in Blob(b13).payloads] == [CHUNK_PRED] * 13
    assert lmc.decompress(b13, threads=1).tobytes() == x13.tobytes()


@pytest.mark.parametrize("c", [0, 5, 13])
def test_a_damaged_chunk_of_a_pair_is_named(c):
    """A unit damaged in either chunk of a pair (a raw mantissa byte: the structure stays sound, so the
    checksum finds it) is blamed on its own chunk, as when each chunk is decoded alone; a pair whose row
    lengths differ (forged) is decoded chunk by chunk and fails where the forged length gives wrong units."""
    x, blob = _pred_blob(ml_dtypes.bfloat16)
    h = lmc.api._parse_header(np.frombuffer(blob, np.uint8))
    off, size = int(h["offsets"][c]), int(h["sizes"][c])
    bad = bytearray(blob)
    bad[off + size - 1] ^= 0x10
    with pytest.raises(lmc.FormatError, match=f"chunk {c}: .*checksum"):
        lmc.decompress(bytes(bad), threads=1)
    if c % 2:
        bad = bytearray(blob)
        bad[off + 1:off + 5] = (575).to_bytes(4, "little")
        with pytest.raises(lmc.FormatError, match=f"chunk {c}: "):
            lmc.decompress(bytes(bad), threads=1)
