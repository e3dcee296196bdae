"""Format 7's encoder against a reference (prefer="speed") counts exactly only the codings whose sampled
estimates may win (kernels/chunk.py, GATE_MARGIN); format 6 counts every one. The blobs must stay as small as
format 6's where each coding wins (temporal: weights; alone: first moments; delta: second moments), and a
sample that misleads the gate must cost time, not bytes."""
import ml_dtypes
import numpy as np
import pytest

import lmc
import pyref

N = 4 * 32768
CHUNK = 32768  # (chunks long enough to be sampled: the gate needs 8192 elements)


def _steps(rng):
    """(name, x, reference, the coding expected to win) for tensors between two training steps."""
    w = (rng.standard_normal(N) * 0.02).astype(np.float32)
    g = rng.standard_normal(N).astype(np.float32) * 1e-3
    m = (rng.standard_normal(N) * 1e-4).astype(np.float32)
    yield "small additive steps", w + (rng.standard_normal(N) * 1e-5).astype(np.float32), w, "temporal"
    yield "small relative steps", w * (1 + rng.standard_normal(N).astype(np.float32) * 1e-3), w, "delta"
    yield "a new gradient dominates", 0.9 * m + 0.1 * g, m, "alone"
    # (a few moments unchanged: the XOR coding wins, by 1-3%: within the estimates' margins, so it is counted)
    keep = rng.random(N) < 0.09
    yield "a few moments unchanged", np.where(keep, m, 0.9 * m + 0.1 * g), m, "xor"


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
def test_gated_blobs_as_small_as_the_full_search(dt):
    rng = np.random.default_rng(7)
    for name, x, r, want in _steps(rng):
        x, r = x.astype(dt), r.astype(dt)
        full = lmc.compress(x, reference=r, format_version=6, chunk_size=CHUNK)
        gated = lmc.compress(x, reference=r, format_version=7, chunk_size=CHUNK)
        modes = lmc.info(gated)["chunk_modes"]
        # (format 7's 32 rANS states cost 112 bytes more per stream: a chunk's only stream here)
        assert len(gated) <= len(full) * 1.01 + 112 * (N // CHUNK), (name, len(gated), len(full), modes)
        assert lmc.decompress(gated, reference=r).tobytes() == x.tobytes()
        out, _cm, _sm = pyref.decode(gated, r.tobytes())
        assert out == x.tobytes()
        if dt is np.float32:  # (each kind's winner, so that every path of the gate is taken)
            assert max(modes, key=modes.get) == want, (name, modes)


def test_a_misleading_sample_costs_time_not_bytes():
    """Values from a small alphabet (the alone coding halves them) whose reference equals them only where the
    samples look (the first 4 of every 128 elements, also the first block of every 4096): there the temporal
    and XOR estimates are near zero, so the gate would count only those codings, which are far larger than
    the alone coding on the whole chunk. Their exact counts miss the margin, so every coding is counted and
    the chunk is coded alone, as format 6 codes it."""
    rng = np.random.default_rng(11)
    x = rng.choice(np.array([0.5, -0.25, 1.0, 2.0, -3.0, 0.125], np.float32), N)
    r = rng.standard_normal(N).astype(np.float32)
    i = np.arange(N)
    seen = (i % 128 < 4) | (i % 4096 < 64)
    r[seen] = x[seen]
    full = lmc.compress(x, reference=r, format_version=6, chunk_size=CHUNK)
    gated = lmc.compress(x, reference=r, format_version=7, chunk_size=CHUNK)
    # (format 7's 32 rANS states: 112 bytes more per stream, four byte streams per chunk)
    assert len(gated) <= len(full) * 1.01 + 4 * 112 * (N // CHUNK), (len(gated), len(full),
                                                                     lmc.info(gated)["chunk_modes"])
    assert len(gated) < x.nbytes / 4  # (the temporal coding the sample suggests: about x.nbytes)
    assert lmc.decompress(gated, reference=r).tobytes() == x.tobytes()


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
def test_the_temporal_estimate_carries_its_tables(dt):
    """The gate's temporal estimate is the sample's entropy plus what it leaves out (temporal.sample_tables: the
    16 contexts' frequency tables as far as the sample sees their symbols, the rANS states, the chunk's head):
    nearer a chunk's exact temporal cost than the sample alone, which fell short of it by the tables (on a bf16
    model's weights, 28 of 203 chunks by more than the gate's margin, which then counted every coding; 11 with
    the tables)."""
    from lmc.kernels import temporal as kt
    from lmc.kernels.base import LAYOUT_BF16, LAYOUT_F32, NCTX
    from lmc.kernels.rans import freq_table_bytes
    rng = np.random.default_rng(3)
    name, x, r, _ = next(_steps(rng))
    x, r = x.astype(dt), r.astype(dt)
    layout, W = (LAYOUT_BF16, 16) if dt is ml_dtypes.bfloat16 else (LAYOUT_F32, 32)
    d8, r8 = x.view(np.uint8), r.view(np.uint8)
    E = kt.temporal_base(r8, 0, CHUNK, layout)
    ts, xs = np.zeros(NCTX * 256, np.int64), np.zeros(NCTX * 256, np.int64)
    est, _ = kt.temporal_sample(d8, r8, 0, CHUNK, layout, E, ts, xs)
    extra = kt.sample_tables(ts, W, CHUNK, 9)
    jb, low = np.empty(CHUNK + 16, np.uint16), np.empty(CHUNK + 16, np.uint32)
    th, hist = np.empty(4 * NCTX * (2 * W + 1), np.int32), np.zeros(NCTX * 256, np.int64)
    f, cm = np.zeros(NCTX * 256, np.int64), np.zeros(NCTX * 256, np.int64)
    raw = kt.temporal_count(d8, r8, 0, CHUNK, layout, E, jb, low, th)
    kt.temporal_hist(th, W, hist)
    trans, cmask = kt.temporal_estimate(hist, f, cm, W, CHUNK, 9)
    exact = 3 + trans + 4 + ((raw + 7) >> 3)
    tables = sum(freq_table_bytes(f, c << 8, 2 * W + 1) for c in range(NCTX) if cmask >> c & 1)
    fixed = 7 + 4 * 32   # (the head and 32 states)
    # the sampled tables: some of the exact ones' bytes (the sample's symbol ranges lie within the chunk's)
    assert fixed + tables // 4 < extra <= fixed + tables, (extra, tables)
    assert est < est + extra <= exact + exact // 64, (exact, est, extra)
