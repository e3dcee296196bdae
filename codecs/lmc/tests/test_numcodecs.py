import ml_dtypes
import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")

from lmc.numcodecs_codec import LMC  # noqa: E402
from helpers import make  # noqa: E402


def test_config_roundtrip():
    c = LMC(dtype="bfloat16", chunk_size=4096, threads=1)
    cfg = c.get_config()
    assert cfg["id"] == "lmc"
    c2 = LMC.from_config(cfg)
    assert c2.get_config() == cfg
    c3 = numcodecs.get_codec(cfg)
    assert isinstance(c3, LMC) and c3.get_config() == cfg


def test_encode_decode():
    x = make(ml_dtypes.bfloat16, 10000)
    c = LMC()
    enc = c.encode(x)
    dec = c.decode(enc)
    assert dec.tobytes() == x.tobytes()
    out = np.empty_like(x)
    c.decode(enc, out=out)
    assert out.tobytes() == x.tobytes()
    # raw buffer with configured dtype
    c = LMC(dtype="bfloat16")
    enc = c.encode(x.tobytes())
    assert c.decode(enc).tobytes() == x.tobytes()
    y = make(np.float32, 1000).reshape(10, 100)
    assert LMC().decode(LMC().encode(y)).tobytes() == y.tobytes()
