"""The lossy methods on the LMCL container: round trips through a chain (the decoder alone gives the encoder's
reconstruction), the first checkpoint lossless, each method's error bounds, and ExCP as a method unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from excp_testlib import assert_same_tree, make_checkpoint

from lmcbench.errors import ConfigError
from lmcbench.lossy.chain import Chain, ChainDecoder
from lmcbench.lossy.excp import ExCPConfig, encode_checkpoint
from lmcbench.lossy.method import ExCPMethod, make_method
from lmcbench.lossy.methods import METHODS, missing_package

SPECS = [{"method": "adam8bit"}, {"method": "adam8bit", "block": 7}, {"method": "sz3", "rel": 0.05},
         {"method": "zfp", "rel": 0.05}, {"method": "bitsnap", "keep": 0.2}, {"method": "efq"},
         {"method": "efq", "alloc": "rms", "m_bits": 4, "v_block": 1}, {"method": "efq", "q": 3.0, "m_bits": 2}]


def series(n=3, seed=0):
    rng = np.random.default_rng(seed)
    out, prev = [], None
    for _ in range(n):
        prev = make_checkpoint(rng, base=prev) if prev is not None else make_checkpoint(rng)
        out.append(prev)
    return out


def method(spec):
    miss = missing_package(spec["method"])
    if miss:
        pytest.skip(f"{miss} is not installed")
    return make_method(spec)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_round_trip_through_a_chain(spec):
    m = method(spec)
    cks = series()
    chain, blobs, recons = Chain(m), [], []
    for t in cks:
        blob, recon, stats, *_ = chain.add(t)  # add() checks decode(blob) == recon
        blobs.append(blob)
        recons.append(recon)
        assert {s["kind"] for s in stats} == {"weight", "exp_avg", "exp_avg_sq"}
        assert all(0 <= s["kept_fraction"] <= 1 for s in stats)
    assert_same_tree(recons[0], cks[0])  # the first of a chain is lossless
    dec = ChainDecoder(m)
    for blob, recon in zip(blobs, recons):
        assert_same_tree(dec.decode(bytes(blob)), recon)
    for name, t in cks[-1].items():  # non-float32 arrays are stored whole
        if t["weight"].dtype != np.float32:
            assert recons[-1][name]["weight"].tobytes() == t["weight"].tobytes()
        assert recons[-1][name].get("exp_avg") is None or recons[-1][name]["exp_avg"].shape == t["exp_avg"].shape
    assert len(blobs[-1]) < len(blobs[0])


def test_8bit_keeps_weights_and_bounds_the_moments():
    cks = series()
    chain = Chain(make_method({"method": "adam8bit", "block": 16}))
    for t in cks:
        _, recon, *_ = chain.add(t)
    for name in ("a", "b"):
        t, r = cks[-1][name], recon[name]
        assert np.array_equal(r["weight"].view(np.uint32), t["weight"].view(np.uint32))
        m = t["exp_avg"].reshape(-1)
        pad = np.zeros(-(-m.size // 16) * 16, np.float32)
        pad[:m.size] = m
        scale = np.repeat(np.abs(pad.reshape(-1, 16)).max(axis=1), 16)[:m.size]
        assert np.all(np.abs(r["exp_avg"].reshape(-1) - m) <= scale / 254 * 1.0001)
        v, rv = t["exp_avg_sq"], r["exp_avg_sq"]
        assert np.all(rv[v > 0] > 0)  # a positive second moment never decodes to zero
        assert np.max(np.abs(rv / v - 1)) < 2 ** (1 / 16) - 1 + 1e-3


@pytest.mark.parametrize("coder, bound", [("generic", 0.5), ("ctx", 1.0)])
def test_efq_error_is_bounded_and_fed_back(coder, bound):
    """Each weight's error is at most half its tensor's step (generic: the middle of a code's bin; ctx: the mean
    of the bin, inside it, so less than a step), and a drift smaller than a step is not lost: it accumulates in
    the residual against the reconstruction until it is coded."""
    w0 = np.zeros(1000, np.float32)
    rng = np.random.default_rng(1)
    base = rng.standard_normal(1000).astype(np.float32) * 1e-2
    m = make_method({"method": "efq", "q": 1.0, "alloc": "rms", "coder": coder})
    chain = Chain(m)
    recs = []
    for k in range(6):
        w = (w0 + base * k + np.float32(3e-4) * k).astype(np.float32)  # a steady drift of 3e-4 per step
        t = {"p": {"weight": w, "exp_avg": np.zeros_like(w), "exp_avg_sq": np.full_like(w, 1e-6)}}
        blob, recon, stats, *_ = chain.add(t)
        recs.append(recon)
        if k:
            step = m.decode.__self__ and _step_of(blob)
            assert np.max(np.abs(recon["p"]["weight"] - w)) <= step * bound * 1.001 + 1e-7
    assert np.mean(recs[-1]["p"]["weight"] - (base * 5)) == pytest.approx(5 * 3e-4, rel=0.2)


def _step_of(blob):
    from lmcbench.lossy.container import unpack

    _, items = unpack(blob, "efq")
    return [e for e, _ in items if e["kind"] == "weight"][0]["args"]["step"]


def test_efq_drops_or_quantises_the_first_moment():
    cks = series()
    for bits, zero in ((0, True), (4, False)):
        chain = Chain(make_method({"method": "efq", "m_bits": bits}))
        for t in cks:
            _, recon, *_ = chain.add(t)
        assert (not np.any(recon["a"]["exp_avg"])) is zero
        assert np.all(recon["a"]["exp_avg_sq"] > 0)


def test_bitsnap_keep_everything_is_exact():
    cks = series()
    chain = Chain(make_method({"method": "bitsnap", "keep": 1.0}))
    for t in cks:
        _, recon, *_ = chain.add(t)
    assert np.array_equal(recon["a"]["weight"].view(np.uint32), cks[-1]["a"]["weight"].view(np.uint32))


def test_large_residual_uses_wide_codes():
    from lmcbench.lossy.arrays import decode_array, encode_array
    from lmcbench.lossy.container import decode_section

    ref = np.zeros(10, np.float32)
    x = np.linspace(-1, 1, 10).astype(np.float32)
    entry, stored, recon = encode_array("uniform", x, ref, step=1e-3)
    assert entry["sections"][0][3] == "int16" and np.max(np.abs(recon - x)) <= 5e-4 + 1e-7
    secs = [decode_section(d, memoryview(b)) for d, b in zip(entry["sections"], stored)]
    assert np.array_equal(decode_array({**entry, "name": "p", "kind": "weight"}, secs, ref), recon)


def test_excp_as_a_method_is_excp():
    """The ExCP method writes exactly encode_checkpoint's blob against the previous reconstruction's weights."""
    cks = series()
    cfg = ExCPConfig(archiver="zstd", archiver_level=3)
    chain = Chain(ExCPMethod(cfg))
    old = Chain(cfg)  # the chain's old signature: a configuration
    for t in cks:
        ref = chain.ref
        blob, recon, *_ = chain.add(t)
        assert old.add(t)[0] == blob == encode_checkpoint(t, ref, cfg)[0]
    assert chain.cfg is cfg and chain.lossy and not ExCPMethod(ExCPConfig(prune_weights=False, prune_moments=False,
                                                                           quantize=False)).lossy


@pytest.mark.parametrize("spec, msg", [({"method": "nope"}, "unknown method"), ({"method": "efq", "qq": 1}, "qq"),
                                       ({"method": "efq", "q": -1}, "q must"), ({"method": "efq", "alloc": "x"}, "alloc"),
                                       ({"method": "bitsnap", "keep": 2.0}, "keep"), ({"method": "adam8bit", "block": 0},
                                                                                     "block"),
                                       ({"method": "excp", "bits": 1}, "bits"), ("efq", "mapping")])
def test_bad_method_options(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        make_method(spec)


def test_every_method_has_a_name_and_setting():
    for name, cls in METHODS.items():
        m = cls.from_dict({})
        assert m.name == name and m.setting and m.lossy and name in m.label


@pytest.mark.parametrize("recon", ["mid", "mean", "gain"])
def test_efq_ctx_reconstructions(recon):
    """coder=ctx: mid decodes bit for bit as the generic coder does; mean lowers the squared error; gain keeps
    each tensor's update along itself (<r, d> >= <d, d> where r and d are the reconstructed and true residual)."""
    cks = series(4, seed=7)
    gen = Chain(make_method({"method": "efq", "q": 2.0, "alloc": "rms", "coder": "generic"}))
    ctx = Chain(make_method({"method": "efq", "q": 2.0, "alloc": "rms", "recon": recon}))
    for k, t in enumerate(cks):
        pg, pc = gen.prev, ctx.prev
        _, rg, *_ = gen.add(t)
        _, rc, *_ = ctx.add(t)
        if not k:
            continue
        for n in t:
            if recon == "mid":
                assert np.array_equal(rg[n]["weight"], rc[n]["weight"])
                continue
            d = t[n]["weight"].astype(np.float64) - pc[n]["weight"]
            r = rc[n]["weight"].astype(np.float64) - pc[n]["weight"]
            if recon == "gain" and np.dot(d.ravel(), d.ravel()) > 0:
                assert np.dot(r.ravel(), d.ravel()) >= np.dot(d.ravel(), d.ravel()) * 0.999
            if recon == "mean" and k == 1:
                rm = rg[n]["weight"].astype(np.float64) - pg[n]["weight"]
                assert np.sum((r - d) ** 2) <= np.sum((rm - d) ** 2) * 1.0001


def test_efq_recon_needs_ctx():
    with pytest.raises(Exception, match="recon"):
        make_method({"method": "efq", "coder": "generic", "recon": "gain"})
