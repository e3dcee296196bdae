"""Encoder shortcuts that must not change what is chosen (beyond a bound): planes sure to be stored raw are not
counted (near_raw), and the predicted-exponent estimate samples a 1-D tensor's left-neighbour residuals."""
import ml_dtypes
import numpy as np
import pytest

import lmc
from lmc.kernels import base as kbase, streams as kstreams
from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F32, NEAR_RAW_MIN, NO_MARGIN, RANS_MARGIN


def test_near_raw_only_for_planes_of_about_8_bits():
    rng = np.random.default_rng(0)
    uniform = rng.integers(0, 256, 131072, dtype=np.uint8)
    assert kstreams.near_raw(uniform, uniform.size)
    assert not kstreams.near_raw(uniform, NEAR_RAW_MIN - 1)        # too small to sample: counted
    skewed = uniform.copy()
    skewed[rng.random(skewed.size) < 0.05] = 0                        # ~7.7 bits: counted
    assert not kstreams.near_raw(skewed, skewed.size)
    half = uniform.copy()
    half[: half.size // 2] = 7                                        # half constant
    assert not kstreams.near_raw(half, half.size)
    seven = (uniform & 0x7F)                                          # 7 bits
    assert not kstreams.near_raw(seven, seven.size)


def _planes(x, layout, ns):
    n = x.size
    planes = np.empty((ns, n + 16), np.uint8)
    kbase.split_units(x.view(np.uint8).reshape(-1), n, x.dtype.itemsize, layout, planes)
    return planes


def _analyze(planes, n, ns, rm, exact):
    h, lens, modes, sizes, f, cm = kstreams.analysis_scratch(ns)
    if exact:
        for s in range(ns):
            kstreams.histo4(planes[s], n, h[s])
        cost = kstreams.analyze_hist(h, n, ns, lens, modes, sizes, f, cm, rm, 0, 6)
    else:
        cost = kstreams.analyze_planes(planes, n, ns, h, lens, modes, sizes, f, cm, rm, 6)
    return cost, modes.copy(), h


@pytest.mark.parametrize("dt,layout,ns", [(np.float32, LAYOUT_F32, 4), (ml_dtypes.bfloat16, LAYOUT_BF16, 2)])
def test_skipped_planes_cost_what_counting_them_would(dt, layout, ns):
    """On weight-like data the planes not counted are those an exact analysis stores raw: the same modes
    and sizes; with size first (prefer="size") every plane is counted."""
    x = (np.random.default_rng(1).standard_normal(131072) * 0.02).astype(np.float32).astype(dt)
    planes = _planes(x, layout, ns)
    fast, m_fast, h_fast = _analyze(planes, x.size, ns, RANS_MARGIN, False)
    exact, m_exact, _ = _analyze(planes, x.size, ns, RANS_MARGIN, True)
    assert fast == exact and (m_fast == m_exact).all()
    skipped = [s for s in range(ns) if h_fast[s].sum() == 0]
    assert skipped and all(m_exact[s] == kbase.MODE_RAW for s in skipped)
    _, _, h_size = _analyze(planes, x.size, ns, NO_MARGIN, False)
    assert all(h_size[s].sum() == x.size for s in range(ns))


def test_skipping_changes_no_blob_of_structured_planes():
    """A plane with a few symbols over a random one (ints of 7 random bits): still counted and coded."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 128, 200000).astype(np.int32)
    blob = lmc.compress(x)
    assert len(blob) < x.nbytes * 0.35
    assert lmc.decompress(blob).tobytes() == x.tobytes()


def test_predicted_exponent_estimated_on_a_1d_tensor():
    """A 1-D tensor is one row: the estimate samples the left-neighbour residuals, and a smooth 1-D walk of
    several chunks takes the mode where it pays."""
    walk = np.exp(np.cumsum(np.random.default_rng(3).standard_normal(300000)) * 0.05) * 1e-4
    x = walk.astype(np.float32).astype(ml_dtypes.bfloat16)
    planes = _planes(x[:131072], LAYOUT_BF16, 2)
    assert kstreams.pred_gain(planes[0], 131072, 300000, 32) > 0.5
    blob = lmc.compress(x)
    assert lmc.info(blob)["chunk_modes"].get("predicted", 0) >= 2
    assert lmc.decompress(blob).tobytes() == x.tobytes()
    g = (np.random.default_rng(4).standard_normal(131072) * 0.02).astype(ml_dtypes.bfloat16)
    pg = _planes(g, LAYOUT_BF16, 2)
    assert kstreams.pred_gain(pg[0], g.size, g.size, 32) < 0      # i.i.d. weights: no gain, not tried


def _chunks(blob):
    from lmc.api import _parse_header
    h = _parse_header(np.frombuffer(blob, np.uint8))
    return [bytes(blob[o:o + s]) for o, s in zip(h["offsets"].tolist(), h["sizes"].tolist())]


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
def test_a_useless_reference_gives_the_alone_chunks(dt):
    """With a reference that helps no chunk (unrelated values), every chunk is the one coded without a
    reference, byte for byte: the alone coding is counted and written as without one (its near-raw planes left
    out), for moment-like data (a wide exponent range, random low mantissa bytes) and weight-like data."""
    rng = np.random.default_rng(7)
    n = 3 * 131072 + 999
    moments = (rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 2) * 1e-4).astype(np.float32)
    weights = (rng.standard_normal(n) * 0.02).astype(np.float32)
    for x in (moments.astype(dt), weights.astype(dt)):
        ref = (rng.standard_normal(n) * 1e3).astype(np.float32).astype(dt)
        alone, with_ref = lmc.compress(x, threads=1), lmc.compress(x, reference=ref, threads=1)
        assert _chunks(with_ref) == _chunks(alone)
        assert lmc.decompress(with_ref, reference=ref).tobytes() == x.tobytes()
