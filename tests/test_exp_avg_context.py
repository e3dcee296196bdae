"""experiments/exp_avg_context.py (issue 21, item 5): the byte planes, the sign-flip transform, the entropies and
the sign agreement, on hand-made arrays and on a tiny AdamW run; the preset ``experiment=exp_avg_context``."""

from __future__ import annotations

import csv

import ml_dtypes
import numpy as np
import pytest
from lmcbench_testlib import load_experiment, make_trainer_folder

torch = pytest.importorskip("torch")


eac = load_experiment("exp_avg_context")


def test_planes_match_lmc_grouping():
    a = np.array([1.0, -1.5, 2.0**-130, np.inf], np.float32)   # 0x3F800000, 0xBFC00000, a subnormal, 0x7F800000
    p = eac.planes(a)
    assert p[0].tolist() == [0x7F, 0x7F, 0x00, 0xFF]
    assert p[1].tolist() == [0x00, 0xC0, (0x00080000 >> 16) & 0x7F, 0x00]
    assert p[2].tolist() == [0, 0, 0, 0] and p[3].tolist() == [0, 0, 0, 0]
    # values exact in bf16: the bf16 planes are the fp32 exponent and sign+m7 planes
    x = np.random.default_rng(0).standard_normal(1000).astype(ml_dtypes.bfloat16)
    pb, pf = eac.planes(x), eac.planes(x.astype(np.float32))
    assert np.array_equal(pb[0], pf[0]) and np.array_equal(pb[1], pf[1]) and not pf[2].any()
    # the planes hold every bit: the number of bits of the fp32 planes recombined equals the input
    y = np.random.default_rng(1).standard_normal(777).astype(np.float32)
    q = [t.astype(np.uint32) for t in eac.planes(y)]
    v = ((q[1] & 0x80) << 24) | (q[0] << 23) | ((q[1] & 0x7F) << 16) | (q[2] << 8) | q[3]
    assert np.array_equal(v, y.view(np.uint32))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_sign_flip_round_trips_bit_exactly(dtype):
    rng = np.random.default_rng(2)
    ut = np.uint32 if dtype == np.float32 else np.uint16
    bits = rng.integers(0, np.iinfo(ut).max, 5000, dtype=ut, endpoint=True)
    m = bits.view(dtype).reshape(50, 100)          # every pattern: NaNs with payloads, -0.0, inf, subnormals
    d = rng.standard_normal((50, 100)).astype(np.float32)
    d[0, :10] = 0.0
    d[1, :10] = np.nan
    f = eac.sign_flip(m, d)
    assert f.dtype == m.dtype and f.shape == m.shape
    back = eac.sign_flip(f, d)
    assert back.view(ut).tobytes() == m.view(ut).tobytes()
    changed = (f.view(ut) != m.view(ut))
    assert np.array_equal(changed, d > 0)          # only the sign bit, only where d > 0
    hi = ut(1 << (8 * np.dtype(ut).itemsize - 1))
    assert np.all((f.view(ut) ^ m.view(ut))[changed] == hi)


def test_sign_agreement_exact_on_a_hand_made_case():
    m = {"p": np.array([1.0, -2.0, 3.0, -4.0, 5.0, -6.0, 0.5, -0.0], np.float32)}
    w0 = {"p": np.zeros(8, np.float32)}
    # d:                     -    +    +    -   0    +    -     +
    w1 = {"p": np.array([-1.0, 1.0, 1.0, -1.0, 0.0, 3.0, -2.0, 1.0], np.float32)}
    for dt in ("fp32", "bf16"):
        r = eac.measure_pair(w0, w1, m, None, None, dt, lmc_bytes=True)
        # sign(m) = -sign(d) at 0 (1, -), 1 (-2, +), 5 (-6, +), 6 (0.5, -), 7 (-0.0 has its sign bit, +);
        # not at 2 (3, +) and 3 (-4, -); 4 has d == 0
        assert (r["n"], r["d_nonzero"], r["agree"], r["m_zero"]) == (8, 7, 5, 1)
        assert r["lmc_ref"] is None and r["flip_ref"] is None and r["lmc_alone"] > 0


def test_joint_context_classes():
    d = np.array([0.0, 1.0, -1.0, 2.0, 0.25, 2.0**-20, 2.0**20, -3.0], np.float32)
    c = eac.joint_context(d)
    # frexp exponents 1, 1, 2, -1, -19, 21, 2 -> median 1; mag = clip(e - 1, -4, 3) + 4
    mag = np.array([4, 4, 5, 2, 0, 7, 5])
    assert c[0] == eac.ZERO_CTX
    assert c[1:].tolist() == (2 * mag + (d[1:] > 0)).tolist()
    assert eac.SIGN_OF[c].tolist() == [2, 1, 0, 1, 1, 1, 1, 0]


def test_entropies_and_costs_are_consistent():
    rng = np.random.default_rng(3)
    n = 3 * eac.CHUNK // 2
    assert eac.entropy_bits(np.full((1, 256), 64))[0] == pytest.approx(8 * 256 * 64)
    d = rng.standard_normal(n).astype(np.float32) * np.exp2(rng.integers(-6, 6, n)).astype(np.float32)
    d[rng.random(n) < 0.1] = 0
    m = (-np.sign(d) * np.abs(rng.standard_normal(n))).astype(np.float32)   # sign(m) = -sign(d) where d != 0
    ctx = eac.joint_context(d)
    for i, p in enumerate(eac.planes(m)):
        counts = eac.chunk_counts(p, ctx)
        assert counts.shape == (2, eac.N_JOINT, 256) and counts.sum() == n
        pc = eac.plane_costs(counts)
        for v in eac.VARIANTS:                                          # conditioning never raises the entropy
            assert pc[v]["H"] <= pc["none"]["H"] + 1e-6
            assert pc[v]["cost"] <= pc["none"]["cost"] + counts.shape[0]  # the context only where it pays
        assert pc["best"]["cost"] <= min(pc[v]["cost"] for v in eac.VARIANTS) + 2 * counts.shape[0]
        if i == 1:
            # the sign is a function of sign(d) where d != 0: the context removes at least its entropy there
            sb, nz = eac.sign_bit(m), d != 0
            h_sign = 0.0                                                # per chunk, as the model is
            for s in range(0, n, eac.CHUNK):
                z = nz[s:s + eac.CHUNK]
                q = sb[s:s + eac.CHUNK][z].mean()
                h_sign -= z.sum() * (q * np.log2(q) + (1 - q) * np.log2(1 - q))
            assert pc["none"]["H"] - pc["sign"]["H"] >= h_sign - 1e-6 * n
            assert pc["sign"]["cost"] < pc["none"]["cost"] - 0.8 * nz.sum()
    # a constant context is no context
    p = eac.planes(m)[0]
    pc = eac.plane_costs(eac.chunk_counts(p, np.full(n, 3, np.int64)))
    assert pc["sign+mag"]["H"] == pytest.approx(pc["none"]["H"])


def test_one_adamw_step_without_decay_gives_exact_sign_agreement():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    for _ in range(6):
        before = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    after = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    m = {n: opt.state[p]["exp_avg"].numpy().copy() for n, p in model.named_parameters()}
    r = eac.measure_pair(before, after, m, None, None, "fp32", lmc_bytes=False)
    assert r["d_nonzero"] > 0.9 * r["n"]
    assert r["agree"] == r["d_nonzero"]              # d = -lr * m_hat / (sqrt(v_hat) + eps): opposite signs


def test_main_on_a_trainer_folder(tmp_path):
    make_trainer_folder(tmp_path / "out", steps=(1, 2, 3))
    rows, saves = eac.main([str(tmp_path / "out"), "--out", str(tmp_path / "res")])
    with open(tmp_path / "res" / "exp_avg_context.csv") as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(rows) == 2 * (4 + 2)       # 2 pairs x (4 fp32 planes + 2 bf16 planes)
    assert {r["pair"] for r in got} == {"1->2", "2->3"}
    first = [r for r in got if r["pair"] == "1->2"]
    assert all(r["lmc_ref"] != "" and r["flip_ref"] == "" for r in first)   # no delta before the first pair
    assert all(r["flip_ref"] != "" for r in got if r["pair"] == "2->3")
    text = (tmp_path / "res" / "README.md").read_text()
    assert "## Verdict" in text and "### fp32" in text and "### bf16" in text and "Commit: `" in text
    assert set(saves) == {(dt, rg) for dt in ("fp32", "bf16") for rg in {r["range"] for r in got}}


def test_the_preset_runs_through_lmcbench(tmp_path):
    """``lmcbench experiment=exp_avg_context`` on a Trainer folder (task: experiment) writes the study's files
    into <results_dir>/exp_avg_context/, its command the lmcbench line; one_step needs a tinygpt source."""
    from hydra import compose, initialize_config_dir

    from lmcbench import cli
    from lmcbench.errors import ConfigError

    make_trainer_folder(tmp_path / "out", steps=(1, 2))
    over = ["experiment=exp_avg_context", "source=hf_trainer", f"source.path={tmp_path / 'out'}",
            "exp_avg_context.dtypes=[fp32]", f"results_dir={tmp_path / 'res'}"]
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=over + ["exp_avg_context.one_step=[]"])
        bad = compose(config_name="config", overrides=over)
    assert cfg.task == "experiment" and cfg.experiment_name == "exp_avg_context"
    out = cli.run_task(cfg, str(tmp_path / "run"))
    assert out["report"] == str(tmp_path / "res" / "exp_avg_context" / "README.md")
    with open(tmp_path / "res" / "exp_avg_context" / "exp_avg_context.csv") as f:
        assert {(r["pair"], r["dtype"]) for r in csv.DictReader(f)} == {("1->2", "fp32")}
    assert "Command: `lmcbench" in (tmp_path / "res" / "exp_avg_context" / "README.md").read_text()
    with pytest.raises(ConfigError, match="one_step"):
        cli.run_task(bad, str(tmp_path / "run2"))
