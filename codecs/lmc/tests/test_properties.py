import numpy as np
from hypothesis import given, settings, strategies as st, HealthCheck

import lmc
from helpers import DTYPES, same_bits


@st.composite
def arrays(draw):
    dt = np.dtype(draw(st.sampled_from(DTYPES)))
    n = draw(st.integers(0, 3000))
    kind = draw(st.sampled_from(["random", "small", "weights", "const"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "random":
        x = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    elif kind == "small":
        x = rng.integers(0, draw(st.integers(1, 5)), n * dt.itemsize, dtype=np.uint8).view(dt)
    elif kind == "const":
        x = np.full(n * dt.itemsize, draw(st.integers(0, 255)), np.uint8).view(dt)
    else:
        x = (rng.standard_normal(n) * 0.02).astype(np.float32).astype(dt) if dt.kind == "f" \
            or dt.name == "bfloat16" else rng.integers(-3, 3, n).astype(dt)
    return x


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), chunk=st.integers(1, 5000), threads=st.sampled_from([None, 1, 2]),
       use_ref=st.booleans(), flips=st.integers(0, 50))
def test_roundtrip_property(x, chunk, threads, use_ref, flips):
    ref = None
    if use_ref:
        ref = x.copy()
        b = ref.view(np.uint8).reshape(-1)
        if b.size:
            idx = np.random.default_rng(flips).integers(0, b.size, flips)
            b[idx] ^= 0x21
    xc = x.copy()
    blob = lmc.compress(x, chunk_size=chunk, threads=threads, reference=ref)
    assert same_bits(x, xc)
    assert blob == lmc.compress(x, chunk_size=chunk, threads=1, reference=ref)
    y = lmc.decompress(blob, threads=threads, reference=ref)
    assert same_bits(y, x)
    nch = -(-x.size // chunk)
    assert len(blob) <= x.nbytes + 8 + 8 + 8 + 8 * x.ndim + 13 * nch + 4
