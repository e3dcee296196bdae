"""compress(prefer="size"): the slower codings (rANS, temporal, predicted exponent) are taken wherever they are
smaller, with no speed margin; the format and the decoder are the same as prefer="speed"."""
import ml_dtypes
import numpy as np
import pytest

import lmc
import pyref
from helpers import DTYPES, make, same_bits
from make_vectors import second_moment, train_pair
from lmc.numcodecs_codec import LMC


def _weights(seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((512, 512)) * 0.02).astype(ml_dtypes.bfloat16)


def test_size_takes_rans_where_it_saves_less_than_the_speed_margin():
    # bf16 weights: rANS codes the exponent stream ~1-2% smaller than Huffman, under the 1/32 speed margin
    x = _weights()
    # (format_version=3: the oldest version its modes need is written, so the version names them)
    speed, size = lmc.compress(x, format_version=3), lmc.compress(x, prefer="size", format_version=3)
    assert lmc.info(speed)["version"] == 1      # Huffman only
    assert lmc.info(size)["version"] == 2       # a rANS stream
    assert len(size) < len(speed) - 1000
    assert same_bits(lmc.decompress(size), x)
    out, _, smodes = pyref.decode(size)     # the oracle, written from FORMAT.md, agrees
    assert out == x.tobytes() and 3 in smodes


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_size_on_second_moments(dtype):
    v = second_moment(dtype, 256, 384, seed=3)
    speed, size = lmc.compress(v), lmc.compress(v, prefer="size")
    assert len(size) <= len(speed)
    assert same_bits(lmc.decompress(size), v)
    assert pyref.decode(size)[0] == v.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_size_round_trips_and_is_not_larger(dtype):
    x = make(dtype, 300_001, seed=5)
    for chunk in (None, 4096):
        speed = lmc.compress(x, chunk_size=chunk)
        size = lmc.compress(x, chunk_size=chunk, prefer="size")
        assert same_bits(lmc.decompress(size), x)
        # estimates decide; a rANS stream's estimate may be short by its slack (16 bytes a stream and chunk)
        nch = lmc.info(size)["nchunks"]
        assert len(size) <= len(speed) + 16 * 8 * nch


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_size_with_a_reference(dtype):
    cur, prev = train_pair(dtype, 200_000, seed=7)
    speed = lmc.compress(cur, reference=prev)
    size = lmc.compress(cur, reference=prev, prefer="size")
    assert len(size) <= len(speed)
    assert same_bits(lmc.decompress(size, reference=prev), cur)


@pytest.mark.parametrize("bad", ["smallest", "", None, 1, "SIZE"])
def test_prefer_refused(bad):
    with pytest.raises(ValueError, match="prefer must be one of 'speed', 'size', 'fast'"):
        lmc.compress(_weights(), prefer=bad)
    with pytest.raises(ValueError, match="prefer must be"):
        LMC(prefer=bad)


def test_numcodecs_prefer():
    x = _weights(2)
    c = LMC(prefer="size")
    assert c.get_config()["prefer"] == "size"
    assert "prefer" not in LMC().get_config()
    c2 = LMC.from_config(c.get_config())
    assert c2.prefer == "size" and "prefer='size'" in repr(c2)
    blob = c2.encode(x)
    assert len(blob) < len(LMC().encode(x))
    assert same_bits(c2.decode(blob), x)
