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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=arrays(), chunk=st.integers(1, 5000), threads=st.sampled_from([None, 1, 2]),
       use_ref=st.sampled_from([None, "flips", "drift", "random", "same"]),
       flips=st.integers(0, 50))
def test_roundtrip_property(x, chunk, threads, use_ref, flips):
    ref = None
    rng = np.random.default_rng(flips)
    if use_ref in ("flips", "same"):
        ref = x.copy()
        b = ref.view(np.uint8).reshape(-1)
        if b.size and use_ref == "flips":
            idx = rng.integers(0, b.size, flips)
            b[idx] ^= 0x21
    elif use_ref == "random":
        ref = rng.integers(0, 256, x.nbytes, dtype=np.uint8).view(x.dtype).reshape(x.shape)
    elif use_ref == "drift":
        # integer moves of the bit patterns (the temporal mode's model),
        # wrapping, on a random subset of elements
        ub = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize]
        ref = x.copy()
        u = ref.view(ub).reshape(-1)
        sel = rng.random(u.size) < 0.5
        mv = rng.integers(-(1 << min(flips, 40)), (1 << min(flips, 40)) + 1, u.size)
        u[sel] = (u[sel].astype(np.int64) + mv[sel]).astype(ub)
    plain = lmc.compress(x, chunk_size=chunk, threads=1)
    xc = x.copy()
    blob = lmc.compress(x, chunk_size=chunk, threads=threads, reference=ref)
    assert same_bits(x, xc)
    assert blob == lmc.compress(x, chunk_size=chunk, threads=1, reference=ref)
    y = lmc.decompress(blob, threads=threads, reference=ref)
    assert same_bits(y, x)
    nch = -(-x.size // chunk)
    assert len(blob) <= x.nbytes + 8 + 8 + 8 + 8 * x.ndim + 13 * nch + 4
    if ref is not None:  # never larger than alone beyond the reference hash
        assert len(blob) <= len(plain) + 8
