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


def test_sure_prediction_leaves_the_exponent_plane_uncounted_and_changes_no_byte():
    """A bf16 chunk whose predicted-exponent gain is sure (joint.PRED_SURE times its margin, from the sample) is
    not counted for mode 0's exponent plane: it stands raw as an upper bound, the sample's gain is the one the
    encoder would take from the plane, and the blob is byte for byte format 8's, which counts every plane
    (the same chunk coding: only the header's version and check differ).  (A sample that misleads, as on
    periodic exponents, is caught by the exact residuals: test_joint's test_exponent_span.)"""
    from lmc.kernels.joint import joint_analyze
    from lmc.kernels.base import MODE_RAW, PRED_MARGIN, split_chunk
    rng = np.random.default_rng(3)
    rows, w = 256, 512
    field = np.exp(np.cumsum(rng.normal(0, 0.05, (rows, 1)), 0) + np.cumsum(rng.normal(0, 0.05, (1, w)), 1))
    x = (field * 1e-6 * rng.lognormal(0, 0.3, (rows, w))).astype(ml_dtypes.bfloat16)   # a smooth second moment
    n = x.size
    d8 = x.ravel().view(np.uint8)
    planes = np.zeros((2, n + 128), np.uint8)
    h, lens, modes, sizes, f, cm = kstreams.analysis_scratch(2)
    r = joint_analyze(d8, 0, n, planes, h, lens, modes, sizes, f, cm, RANS_MARGIN, 9, 3, w, PRED_MARGIN)
    g, h0, have_g, e0 = r[10], r[11], r[12], r[13]
    assert have_g and not e0 and modes[0] == MODE_RAW and h0 > g > 0
    exact = kstreams.analysis_scratch(2)
    p2 = np.zeros((2, n + 128), np.uint8)
    split_chunk(d8, d8, False, 0, n, 2, LAYOUT_BF16, p2, 3)
    assert r[1] > kstreams.analyze_planes(p2, n, 2, *exact, RANS_MARGIN, 9)   # (an upper bound)
    assert g == kstreams.pred_gain(p2[0], n, w, 32)
    b9, b8 = lmc.compress(x, threads=1), lmc.compress(x, threads=1, format_version=8)
    assert lmc.info(b9)["chunk_modes"] == {"predicted": 1}
    head = 4 + 4 + 8 * 2 + 8 + 12 + 4   # (magic, version etc., shape, chunk and count, the table, its crc)
    assert len(b9) == len(b8) and b9[head:] == b8[head:] and b9[5:head - 4] == b8[5:head - 4]
    assert np.array_equal(lmc.decompress(b9).view(np.uint16), x.view(np.uint16))
    # a row of noise: the gain is not sure, the plane counted as before
    y = rng.lognormal(0, 2.0, (rows, w)).astype(ml_dtypes.bfloat16)
    r = joint_analyze(y.ravel().view(np.uint8), 0, n, planes, h, lens, modes, sizes, f, cm, RANS_MARGIN, 9, 3, w,
                      PRED_MARGIN)
    assert r[13] and modes[0] != MODE_RAW
