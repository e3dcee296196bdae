"""Tests for the ExCP lossy checkpoint codec (lmcbench.lossy.excp): API, config, pruning, k-means, bit
packing, quantisation, encode/decode, and the chain of run.py. Hostile input: test_excp_hostile.py."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
from excp_testlib import (
    ARCHIVERS,
    _bits,
    assert_same_tree,
    expect_format_error,
    freeze,
    make_checkpoint,
    weights_of,
)

from lmcbench.errors import ConfigError, LmcbenchError
from lmcbench.lossy import (
    ExCPConfig,
    ExCPFormatError,
    decode_checkpoint,
    dequantize,
    encode_checkpoint,
    excp,
    kmeans_1d,
    pack_bits,
    prune_moment_mask,
    prune_weight_mask,
    quantize,
    unpack_bits,
)


# ------------------------------------------------------------------------------------------ package
def test_public_api_is_the_package_all():
    """lmcbench.lossy re-exports exactly lmcbench.lossy.excp.__all__ (sorted); ``excp.quantize`` is the function
    from the ``kmeans`` module (no submodule is shadowed by it)."""
    import sys

    import lmcbench.lossy as lossy

    assert lossy.__all__ == sorted(excp.__all__)
    for name in excp.__all__:
        assert getattr(lossy, name) is getattr(excp, name), name
    assert callable(excp.quantize) and excp.quantize is quantize
    assert sys.modules["lmcbench.lossy.excp.kmeans"].quantize is quantize
    assert "lmcbench.lossy.excp.quantize" not in sys.modules


# ------------------------------------------------------------------------------------------- config
def test_config_defaults_and_from_dict():
    c = ExCPConfig()
    assert (c.alpha, c.beta, c.bits, c.max_scale) == (5e-5, 2.0, 4, 2.5)
    assert (c.kmeans_iters, c.samples_per_centroid, c.seed) == (25, 256, 0)
    assert c.archiver == "lzma" and c.level == 9 and c.prune_weights and c.prune_moments and c.quantize
    assert ExCPConfig.from_dict({"archiver": "zstd"}).level == 19
    assert ExCPConfig.from_dict({"archiver": "zstd", "archiver_level": 3, "bits": 8}).level == 3
    assert ExCPConfig.from_dict(None) == ExCPConfig()
    assert ExCPConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("bad", [
    {"gamma": 1}, {"bits": 9}, {"bits": 1}, {"bits": 4.0}, {"bits": True}, {"alpha": -1e-5},
    {"alpha": float("nan")}, {"beta": "2"}, {"max_scale": -1}, {"archiver": "gzip"},
    {"archiver": "lzma", "archiver_level": 10}, {"archiver": "zstd", "archiver_level": 0},
    {"archiver": "lmc", "archiver_level": 3}, {"archiver": "none", "archiver_level": 1},
    {"quantize": "yes"}, {"prune_weights": 1}, {"kmeans_iters": -1}, {"samples_per_centroid": 0},
    {"seed": -3}, {"archiver": ["lzma"]}, {"archiver": {"lzma": 1}},
])
def test_config_rejects(bad):
    with pytest.raises(ConfigError) as ei:
        ExCPConfig.from_dict(bad)
    assert "\n" not in str(ei.value) and str(ei.value).startswith("excp:")


def test_config_rejects_non_mapping():
    with pytest.raises(ConfigError):
        ExCPConfig.from_dict([("bits", 4)])


# ------------------------------------------------------------------------------------------ pruning
def test_prune_weight_mask_hand_cases():
    dW = np.array([1, 2, 3, 4, 5, -6], np.float32)  # median |dW| = 3.5
    # alpha=1, mean(v)=0.64 -> s = 1/0.8 = 1.25 -> threshold 4.375
    m = prune_weight_mask(dW, np.full(6, 0.64, np.float32), alpha=1.0, max_scale=2.5)
    assert m.tolist() == [False, False, False, False, True, True]
    # mean(v)=4 -> s = 0.5 -> threshold 1.75
    m = prune_weight_mask(dW, np.full(6, 4.0, np.float32), alpha=1.0, max_scale=2.5)
    assert m.tolist() == [False, True, True, True, True, True]
    # the default alpha with mean(v) = 1e-9: s = 5e-5 / 3.1623e-5 = 1.581 -> threshold 5.53
    m = prune_weight_mask(dW, np.full(6, 1e-9, np.float32))
    assert m.tolist() == [False] * 5 + [True]
    # a tiny mean(v) is capped at max_scale = 2.5 -> threshold 8.75: nothing survives ...
    assert not prune_weight_mask(dW, np.full(6, 1e-20, np.float32)).any()
    # ... except a value beyond it (median of [1,2,3,4,5,9] is still 3.5)
    dW2 = np.array([1, 2, 3, 4, 5, -9], np.float32)
    assert prune_weight_mask(dW2, np.full(6, 1e-20, np.float32)).tolist() == [False] * 5 + [True]
    # mean(v) == 0 -> s = max_scale
    assert prune_weight_mask(dW2, np.zeros(6, np.float32)).tolist() == [False] * 5 + [True]
    assert excp.prune.weight_prune_scale(np.zeros(3), 5e-5, 2.5) == 2.5
    assert excp.prune.weight_prune_scale(np.full(3, 0.64), 1.0, 2.5) == pytest.approx(1.25)
    # odd count: median is the middle value; strict '>' drops the values equal to the threshold
    assert prune_weight_mask(np.array([1, 2, 3], np.float32), np.ones(3), 1.0, 2.5).tolist() == [False, False, True]


def test_prune_moment_mask_hand_case():
    m = np.array([1, -1, 10, -10, 0.5, 12], np.float32)  # mean |m| = 34.5 / 6 = 5.75
    wmask = np.array([True, True, True, False, True, False])
    assert prune_moment_mask(m, np.ones(6, bool), beta=1.0).tolist() == [False, False, True, True, False, True]
    assert prune_moment_mask(m, wmask, beta=1.0).tolist() == [False, False, True, False, False, False]
    # default beta = 2 -> threshold 11.5
    assert prune_moment_mask(m, np.ones(6, bool)).tolist() == [False] * 5 + [True]
    assert prune_moment_mask(m, wmask, beta=0.0).tolist() == wmask.tolist()


# ------------------------------------------------------------------------------------------ k-means
def test_kmeans_finds_15_separated_clusters():
    rng = np.random.default_rng(5)
    centers = np.linspace(-7, 7, 15)
    sizes = rng.integers(500, 6000, size=15)
    x = np.concatenate([c + rng.standard_normal(n) * 0.01 for c, n in zip(centers, sizes)]).astype(np.float32)
    rng.shuffle(x)
    c = kmeans_1d(x, 15, iters=25, samples_per_centroid=256, seed=0)
    assert c.dtype == np.float16 and c.size == 15
    assert np.all(np.diff(c.astype(np.float32)) > 0)
    assert np.max(np.abs(c.astype(np.float64) - centers)) < 0.02
    c2 = kmeans_1d(x, 15, iters=25, samples_per_centroid=256, seed=0)
    assert c2.tobytes() == c.tobytes()  # deterministic


def test_kmeans_few_values_and_degenerate_data():
    assert kmeans_1d(np.array([3, 1, 2, 3, 1], np.float32), 15).tolist() == [1, 2, 3]
    assert kmeans_1d(np.zeros(0, np.float32), 15).size == 0
    # a heavy atom plus 40 scattered values: empty clusters are re-seeded, no duplicates
    rng = np.random.default_rng(0)
    x = np.concatenate([np.ones(10000), rng.uniform(-5, 5, 40)]).astype(np.float32)
    c = kmeans_1d(x, 15, seed=3).astype(np.float32)
    assert c.size == 15 and np.all(np.diff(c) > 0) and np.any(c == 1.0)
    # centroids that coincide after float16 rounding collapse to one
    c = kmeans_1d(np.array([1.0, 1.0001, 1.0002, 5.0] * 10, np.float32), 15)
    assert np.all(np.diff(c.astype(np.float32)) > 0) and c.size <= 4
    with pytest.raises(ValueError):
        kmeans_1d(np.array([1.0, np.inf], np.float32), 3)


# ------------------------------------------------------------------------------------- bit packing
def test_pack_bits_literals():
    assert pack_bits([1, 2, 3], 4) == bytes([0x12, 0x30])
    assert pack_bits([1, 2, 3, 0, 1], 2) == bytes([0b01101100, 0b01000000])
    assert pack_bits([7, 0, 5], 3) == bytes([0b11100010, 0b10000000])
    assert pack_bits([255, 0, 7], 8) == bytes([255, 0, 7])
    assert unpack_bits(bytes([0x12, 0x30]), 4, 3).tolist() == [1, 2, 3]


@pytest.mark.parametrize("b", range(2, 9))
def test_pack_unpack_roundtrip(b):
    rng = np.random.default_rng(b)
    for n in (0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 101, 1000):
        idx = rng.integers(0, 1 << b, size=n).astype(np.uint8)
        buf = pack_bits(idx, b)
        assert len(buf) == math.ceil(n * b / 8)
        out = unpack_bits(buf, b, n)
        assert out.dtype == np.uint8 and out.tolist() == idx.tolist()
    # the generic path agrees with the nibble layout for b=4 ...
    idx = rng.integers(0, 1 << b, size=33).astype(np.uint8)
    generic = np.packbits(np.unpackbits(idx[:, None], axis=1)[:, 8 - b:].ravel()).tobytes()
    assert pack_bits(idx, b) == generic
    # ... and lengths / pad bits are validated
    buf = pack_bits(idx, b)
    with pytest.raises(ExCPFormatError):
        unpack_bits(buf + b"\0", b, 33)
    with pytest.raises(ExCPFormatError):
        unpack_bits(buf[:-1], b, 33)
    if (33 * b) % 8:
        with pytest.raises(ExCPFormatError):
            unpack_bits(buf[:-1] + bytes([buf[-1] | 1]), b, 33)
    with pytest.raises(ValueError):
        pack_bits([1 << b], b)


# ------------------------------------------------------------------------------------- quantisation
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantize_values_are_centroids(bits):
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal(6000) * 1e-3).astype(np.float32)
    x[rng.random(6000) < 0.6] = 0
    q = quantize(x, bits, seed=1)
    assert q.indices.shape == (6000,) and q.centroids.dtype == np.float16
    assert 1 <= q.centroids.size <= (1 << bits) - 1
    deq = dequantize(q.indices, q.centroids, q.exponent, x.shape)
    table = np.ldexp(q.centroids.astype(np.float32), q.exponent)
    assert np.all(np.diff(table) > 0)
    assert np.all(deq[x == 0] == 0) and np.all(q.indices[x == 0] == 0)
    assert np.all(q.indices[x != 0] >= 1)
    assert np.all(np.isin(deq[x != 0], table))
    # every non-zero went to its nearest stored centroid
    nz = x[x != 0].astype(np.float64)
    best = np.min(np.abs(nz[:, None] - table[None, :].astype(np.float64)), axis=1)
    assert np.allclose(np.abs(deq[x != 0] - nz), best, rtol=0, atol=1e-12)
    rel = np.linalg.norm(deq - x) / np.linalg.norm(x)
    assert rel < {2: 0.45, 4: 0.12, 8: 0.01}[bits]  # Lloyd-Max for a Gaussian: 0.436 (3), 0.105 (15 levels)


def test_quantize_tiny_values_need_the_centroid_scale():
    rng = np.random.default_rng(0)
    v = (rng.random(5000) * 1e-9 + 1e-11).astype(np.float32)  # Adam exp_avg_sq-like, below float16 range
    q = quantize(v, 4)
    deq = dequantize(q.indices, q.centroids, q.exponent)
    assert np.linalg.norm(deq - v) / np.linalg.norm(v) < 0.1
    q0 = quantize(v, 4, scale_centroids=False)  # plain float16 flushes them to zero
    assert not dequantize(q0.indices, q0.centroids, q0.exponent).any()


def test_dequantize_rejects_index_past_table():
    with pytest.raises(ExCPFormatError):
        dequantize(np.array([0, 1, 3], np.uint8), np.array([1, 2], np.float16))


# --------------------------------------------------------------------------------- encode / decode
def test_first_of_chain_is_lossless():
    rng = np.random.default_rng(0)
    t = make_checkpoint(rng)
    t["a"]["weight"][0, :3] = [np.nan, -0.0, 1e-45]
    blob, rec, stats = encode_checkpoint(t, None, ExCPConfig(archiver="zstd"))
    assert_same_tree(rec, t)
    assert_same_tree(decode_checkpoint(blob), t)
    assert {s["mode"] for s in stats} == {"raw"}
    assert all(s["rel_l2"] == 0 and s["kept_fraction"] == 1.0 for s in stats)
    assert rec["e"]["weight"].dtype == ml_dtypes.bfloat16 and rec["c"]["weight"].dtype == np.int64


@pytest.mark.parametrize("archiver", ARCHIVERS)
def test_roundtrip_decode_equals_recon(chain2, archiver):
    cfg = ExCPConfig(archiver=archiver, archiver_level={"lzma": 6, "zstd": 19}.get(archiver))
    blob, rec, stats = encode_checkpoint(chain2["t2"], chain2["ref"], cfg)
    assert blob[:4] == b"ExCP" and blob[5] == excp.config._ARCHIVERS[archiver]
    assert_same_tree(decode_checkpoint(blob, chain2["ref"]), rec)
    assert_same_tree(rec, chain2["rec2"])  # the archiver changes nothing but the bytes
    modes = {(s["name"], s["kind"]): s["mode"] for s in stats}
    assert modes[("a", "weight")] == "quant" and modes[("c", "weight")] == "raw"
    assert modes[("e", "weight")] == "raw" and modes[("e", "exp_avg")] == "raw"  # bf16 weight: all raw


def test_recon_structure_and_stats(chain2):
    t2, rec, ref, stats = chain2["t2"], chain2["rec2"], chain2["ref"], chain2["stats2"]
    by = {(s["name"], s["kind"]): s for s in stats}
    assert len(stats) == 3 + 3 + 1 + 1 + 3
    for s in stats:
        assert set(s) >= {"name", "kind", "numel", "kept_fraction", "pruned_fraction", "rel_l2", "max_abs",
                          "payload_bytes", "mode", "dtype"}
        assert s["kept_fraction"] + s["pruned_fraction"] == pytest.approx(1.0)
    W, R = t2["a"]["weight"], rec["a"]["weight"]
    want = np.linalg.norm(R.astype(np.float64) - W) / np.linalg.norm(W.astype(np.float64))
    assert by[("a", "weight")]["rel_l2"] == pytest.approx(want)
    assert by[("a", "weight")]["max_abs"] == pytest.approx(np.max(np.abs(R.astype(np.float64) - W)))
    assert 0 < by[("a", "weight")]["kept_fraction"] < 1
    assert by[("a", "weight")]["numel"] == 3200 and by[("a", "weight")]["payload_bytes"] == 1600 + 30
    # pruned positions keep the reference's exact bits; moments share one mask
    dq = R != ref["a"]
    assert np.array_equal(R[~dq], ref["a"][~dq])
    m, v = rec["a"]["exp_avg"], rec["a"]["exp_avg_sq"]
    assert np.array_equal(m != 0, v != 0)
    assert not np.any((m != 0) & ~dq)  # moments survive only where the weight residual did
    assert by[("a", "exp_avg")]["kept_fraction"] == by[("a", "exp_avg_sq")]["kept_fraction"]
    # a weight without optimizer state: residual quantised, unpruned -> every changed value kept
    assert by[("d", "weight")]["kept_fraction"] == pytest.approx(np.mean(t2["d"]["weight"] != ref["d"]))
    assert by[("d", "weight")]["mode"] == "quant" and by[("d", "weight")]["rel_l2"] < 1e-3


def test_exact_mode_is_bit_exact_on_adversarial_values():
    specials = np.array([
        # (ref, W) pairs where float32 ref + (W - ref) != W, signed zeros, subnormals, inf, nan, overflow
        [1e8, 1.0], [1.0, 1e-45], [0.0, -0.0], [-0.0, 0.0], [1e-45, -1e-45], [3e38, -3e38],
        [1.0, np.inf], [-np.inf, 1.0], [2.0, np.nan], [np.nan, 2.0], [16777216.0, 1.0], [0.1, 0.1],
    ], np.float32)
    ref, W = specials[:, 0].copy(), specials[:, 1].copy()
    W[8] = np.frombuffer(struct.pack("<I", 0x7FC01234), np.float32)[0]  # nan with a payload
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.any((ref + (W - ref)).view(np.uint32) != W.view(np.uint32))  # the trap is real
    rng = np.random.default_rng(0)
    ref = np.concatenate([ref, rng.standard_normal(500).astype(np.float32)])
    W = np.concatenate([W, ref[12:] + rng.standard_normal(500).astype(np.float32) * 1e-3])
    m = rng.standard_normal(W.size).astype(np.float32)
    m[:4] = [-0.0, 1e-45, np.nan, -np.inf]
    v = np.abs(rng.standard_normal(W.size)).astype(np.float32)
    v[:3] = [-0.0, 1e-44, 0.0]
    t = {"p": {"weight": W, "exp_avg": m, "exp_avg_sq": v}}
    freeze(t)
    cfg = ExCPConfig(prune_weights=False, prune_moments=False, quantize=False, archiver="zstd")
    blob, rec, stats = encode_checkpoint(t, {"p": ref}, cfg)
    assert {s["mode"] for s in stats} == {"exact"}
    assert_same_tree(rec, t)
    assert_same_tree(decode_checkpoint(blob, {"p": ref}), t)
    assert all(s["rel_l2"] == 0 and s["max_abs"] == 0 for s in stats)


def test_exact_mode_with_pruning_keeps_exact_values():
    rng = np.random.default_rng(2)
    ref = rng.standard_normal(4000).astype(np.float32)
    W = ref + rng.standard_normal(4000).astype(np.float32) * np.float32(1e-3)
    m = rng.standard_normal(4000).astype(np.float32)
    v = np.full(4000, 1e-9, np.float32)
    t = {"p": {"weight": W, "exp_avg": m, "exp_avg_sq": v}}
    blob, rec, _ = encode_checkpoint(t, {"p": ref}, ExCPConfig(quantize=False, archiver="none"))
    keep = prune_weight_mask(W - ref, v)
    assert 0 < keep.sum() < 4000
    R = rec["p"]["weight"]
    assert np.array_equal(R[keep], W[keep]) and np.array_equal(R[~keep], ref[~keep])
    mkeep = prune_moment_mask(m, keep)
    assert np.array_equal(rec["p"]["exp_avg"], np.where(mkeep, m, 0))
    assert np.array_equal(rec["p"]["exp_avg_sq"], np.where(mkeep, v, 0))
    assert_same_tree(decode_checkpoint(blob, {"p": ref}), rec)


def test_small_and_nonfinite_tensors_are_kept_as_is():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(100).astype(np.float32)
    W = ref.copy()
    W[[3, 50, 99]] += np.float32(0.5)  # 3 non-zero residuals <= 15: stored exactly
    W2 = ref + np.float32(1e-3)
    W2[7] = np.inf  # a non-finite residual: k-means cannot place it -> exact
    t = {"s": {"weight": W}, "n": {"weight": W2}}
    blob, rec, stats = encode_checkpoint(t, {"s": ref, "n": ref}, ExCPConfig(archiver="none"))
    assert [s["mode"] for s in stats] == ["exact", "exact"]
    assert _bits(rec["s"]["weight"]) == _bits(W) and _bits(rec["n"]["weight"]) == _bits(W2)
    assert_same_tree(decode_checkpoint(blob, {"s": ref, "n": ref}), rec)
    # 0-d and empty tensors
    t = {"s": {"weight": np.array(3.0, np.float32)}, "z": {"weight": np.zeros((0, 4), np.float32)}}
    refs = {"s": np.array(2.5, np.float32), "z": np.zeros((0, 4), np.float32)}
    blob, rec, stats = encode_checkpoint(t, refs, ExCPConfig(archiver="lmc"))
    assert [s["mode"] for s in stats] == ["exact", "raw"]
    assert_same_tree(rec, t)
    assert_same_tree(decode_checkpoint(blob, refs), t)
    # an unchanged weight costs no section at all
    blob, rec, stats = encode_checkpoint({"z": {"weight": ref}}, {"z": ref}, ExCPConfig(archiver="none"))
    assert stats[0]["mode"] == "zero" and stats[0]["payload_bytes"] == 0
    assert _bits(rec["z"]["weight"]) == _bits(ref)


def test_caller_arrays_are_not_modified(chain2):
    rng = np.random.default_rng(9)
    t = make_checkpoint(rng, base=chain2["t1"])
    ref = {k: v.copy() for k, v in chain2["ref"].items()}
    before_t, before_r = freeze(t), {k: v.copy() for k, v in ref.items()}
    for v in ref.values():
        v.flags.writeable = False
    for cfg in (ExCPConfig(archiver="none"), ExCPConfig(archiver="none", quantize=False, prune_weights=False)):
        blob, rec, _ = encode_checkpoint(t, ref, cfg)
        dec = decode_checkpoint(blob, ref)
        for tree in (rec, dec):  # outputs are fresh, writable arrays that do not alias the inputs
            for name, d in tree.items():
                for k, a in d.items():
                    if a is not None:
                        assert a.flags.writeable and not np.shares_memory(a, t[name][k])
                        assert not np.shares_memory(a, ref[name])
    assert_same_tree(t, before_t)
    assert all(_bits(ref[k]) == _bits(before_r[k]) for k in ref)


def test_bad_inputs_to_encode():
    w = np.zeros(4, np.float32)
    with pytest.raises(LmcbenchError):
        encode_checkpoint({"a": {"weight": w, "momentum": w}}, None)
    with pytest.raises(LmcbenchError):
        encode_checkpoint({"a": {"weight": w, "exp_avg": np.zeros(5, np.float32)}}, None)
    with pytest.raises(LmcbenchError):
        encode_checkpoint({"a": {"exp_avg": w}}, None)
    with pytest.raises(LmcbenchError):
        encode_checkpoint({"a": {"weight": w}}, {"a": np.zeros(5, np.float32)})
    with pytest.raises(LmcbenchError):
        encode_checkpoint({"a": {"weight": np.array([object()])}}, None)


def test_decode_reference_mismatch(chain2):
    blob, ref = chain2["blob2"], chain2["ref"]
    bad = dict(ref, a=np.zeros((50, 64), np.float32))
    assert "shape" in expect_format_error(blob, bad)
    assert "reference" in expect_format_error(blob, {k: v for k, v in ref.items() if k != "a"})
    assert "reference" in expect_format_error(blob, None)


def test_chain_of_three_steps():
    rng = np.random.default_rng(11)
    cfg = ExCPConfig(archiver="zstd", archiver_level=3)
    truth = [make_checkpoint(rng)]
    truth.append(make_checkpoint(rng, base=truth[0]))
    truth.append(make_checkpoint(rng, base=truth[1]))
    blobs, recons, ref = [], [], None
    for t in truth:
        blob, rec, _ = encode_checkpoint(t, ref, cfg)
        blobs.append(blob)
        recons.append(rec)
        ref = weights_of(rec)  # the next residual is against the *reconstructed* weights
    # a decoder that only sees the blobs rebuilds the same chain
    ref = None
    for blob, rec in zip(blobs, recons):
        dec = decode_checkpoint(blob, ref)
        assert_same_tree(dec, rec)
        ref = weights_of(dec)
    W3, R2, R3 = truth[2]["a"]["weight"], recons[1]["a"]["weight"], recons[2]["a"]["weight"]
    # step 3 is coded against R2: untouched positions are R2's exact bits, changed ones move towards W3
    changed = R3 != R2
    assert 0 < changed.mean() < 1
    assert np.array_equal(R3[~changed], R2[~changed])
    assert np.mean(np.abs(R3[changed] - W3[changed])) < np.mean(np.abs(R2[changed] - W3[changed]))
    # the error stays on the order of one step's update (it does not accumulate without bound)
    assert np.max(np.abs(R3 - W3)) < 2e-3


# ------------------------------------------------------------------------------------------- run.py
def test_chain_handles_scalar_parameters():
    from lmcbench.lossy.run import Chain, _same

    chain = Chain(ExCPConfig(archiver="none"))
    for v in (2.5, 2.75, 3.0):
        t = {"logit_scale": {"weight": np.array(v, np.float32), "exp_avg": np.array(v / 10, np.float32),
                             "exp_avg_sq": np.array(v / 100, np.float32)},
             "w": {"weight": np.full((3, 2), v, np.float32)}}
        blob, recon, *_ = chain.add(t)
        assert recon["logit_scale"]["weight"].shape == () and recon["logit_scale"]["weight"] == np.float32(v)
    a = {"p": {"weight": np.array(1.0, np.float32), "exp_avg": None}}
    assert _same(a, {"p": {"weight": np.array(1.0, np.float32), "exp_avg": None}})
    assert not _same(a, {"p": {"weight": np.array([1.0], np.float32), "exp_avg": None}})  # shape differs
    assert not _same(a, {"p": {"weight": np.array(1.0, np.float32).view(np.int32), "exp_avg": None}})
    assert not _same(a, {"p": {"weight": np.array(1.0, np.float32), "exp_avg": np.zeros(())}})
    assert not _same(a, {"q": a["p"]})
    assert not _same({"p": {"weight": np.float32([0.0])}}, {"p": {"weight": np.float32([-0.0])}})


@pytest.mark.parametrize("lossless", [False, True])
def test_experiment_rows_are_lossy_only_when_the_config_is(tmp_path, monkeypatch, lossless):
    """run_excp labels a row lossy from the configuration (pruning or quantisation on), not from the method."""
    import csv

    from lmcbench.lossy import run
    from lmcbench.sources import tinygpt

    rng = np.random.default_rng(0)
    steps = [10, 20, 30]
    series, prev = {}, None
    for s in steps:
        prev = make_checkpoint(rng, base=prev) if prev is not None else make_checkpoint(rng)
        series[f"ckpt-{s}"] = {n: d for n, d in prev.items() if n in ("a", "b", "d")}  # fp32 parameters

    class Series(tinygpt.TinyGPTSource):
        def __init__(self):  # noqa: D107 - no training, no cache: the checkpoints above
            self.train_opts, self.path, self.steps = {}, "series", None

        def checkpoints(self):
            return [(s, f"ckpt-{s}") for s in steps]

    monkeypatch.setattr(run, "open_series", lambda c: Series())
    monkeypatch.setattr(run.judge, "ensure_series", lambda *a: None)
    monkeypatch.setattr(run, "load_triples", lambda d: series[d])
    monkeypatch.setattr(run, "_eval_arrays", lambda opts, weights, n: 1.0)
    monkeypatch.setattr(run, "_archivers", lambda *a: None)
    ex = {"resume_every": 100, "archiver": "none"}
    if lossless:
        ex.update(prune_weights=False, prune_moments=False, quantize=False)
    summary = run.run_excp({"source": {}, "excp": ex}, str(tmp_path), log=lambda *a: None)
    with open(tmp_path / "excp_checkpoints.csv") as f:
        rows = list(csv.DictReader(f))
    assert summary["lossy"] is (not lossless) and summary["ratio_full"] > 0
    for r in rows:
        later_excp = r["method"] == "excp"
        assert r["lossy"] == str(later_excp and not lossless), r
    assert sum(r["method"] == "excp" for r in rows) == 4  # steps 20 and 30 of both runs
    with open(tmp_path / "excp_tensors.csv") as f:
        trows = [r for r in csv.DictReader(f) if r["method"] == "excp"]
    assert {r["lossy"] for r in trows if r["step"] != "10"} == {str(not lossless)}
    assert {r["lossy"] for r in trows if r["step"] == "10"} == {"False"}  # the first of the chain: raw
