"""The ExCP experiment: reconstruction loads in the trainer and resumes it (bit for bit when ExCP is configured
lossless), and ``lmcbench experiment=excp`` runs end to end, lossy results kept out of the lossless records."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from lmcbench import tinygpt
from lmc.formats.trainer_folder import load_triples
from lmcbench.errors import ConfigError
from lmcbench.lossy.chain import Chain, full_bytes
from lmcbench.lossy.excp import ExCPConfig, decode_checkpoint
from lmcbench.lossy.run import _opts
from lmcbench.tinygpt import TRAIN_DEFAULTS, Trainer

from lmcbench_testlib import run_cli, tiny_overrides

OPTS = dict(TRAIN_DEFAULTS, n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4, max_steps=12,
            save_steps=4, warmup_steps=2, corpus_bytes=100_000)
EXACT = ExCPConfig(prune_weights=False, prune_moments=False, quantize=False, archiver="zstd", archiver_level=3)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    out = tmp_path_factory.mktemp("series")
    tinygpt.train(str(out), OPTS)
    return out


def ck(root, step):
    return os.path.join(str(root), f"checkpoint-{step}")


def resume_from_recon(recon, src_dir, out_dir):
    """Write a reconstruction as a checkpoint folder (the trainer's own layout) and resume from it."""
    live = Trainer.from_checkpoint(src_dir, OPTS)
    live.load_state({n: r["weight"] for n, r in recon.items()}, {n: r["exp_avg"] for n, r in recon.items()},
                    {n: r["exp_avg_sq"] for n, r in recon.items()})
    return Trainer.from_checkpoint(live.save_checkpoint(str(out_dir)), OPTS)


def test_triples_are_matched_by_name(series):
    t = load_triples(ck(series, 8))
    sd = load_file(os.path.join(ck(series, 8), "model.safetensors"))
    opt = torch.load(os.path.join(ck(series, 8), "optimizer.pt"), weights_only=True)
    names = [n for g in opt["param_groups"] for n in g["param_names"]]
    ids = [i for g in opt["param_groups"] for i in g["params"]]
    assert set(t) == set(sd)
    for n, i in zip(names, ids):
        assert np.array_equal(t[n]["weight"], sd[n].numpy())
        assert np.array_equal(t[n]["exp_avg"], opt["state"][i]["exp_avg"].numpy())
        assert np.array_equal(t[n]["exp_avg_sq"], opt["state"][i]["exp_avg_sq"].numpy())
    assert full_bytes(t) == 12 * sum(v.numel() for v in sd.values())


def test_lossless_reconstruction_resumes_bit_for_bit(series, tmp_path):
    """An unpruned, unquantized ExCP chain reconstructs exactly; resuming from the reconstructed checkpoint
    folder reproduces the uncompressed run's later checkpoint."""
    chain = Chain(EXACT)
    for step in (4, 8):
        blob, recon, stats, *_ = chain.add(load_triples(ck(series, step)))
    orig = load_triples(ck(series, 8))
    for n in orig:
        for k in ("weight", "exp_avg", "exp_avg_sq"):
            assert np.array_equal(recon[n][k].view(np.uint32), orig[n][k].view(np.uint32))
    tr = resume_from_recon(recon, ck(series, 8), tmp_path / "recon")
    tr.train_until(12, out_dir=str(tmp_path / "resumed"))
    a = load_file(os.path.join(ck(tmp_path / "resumed", 12), "model.safetensors"))
    b = load_file(os.path.join(ck(series, 12), "model.safetensors"))
    assert all(torch.equal(a[n], b[n]) for n in b)


def test_lossy_reconstruction_loads_and_trains(series, tmp_path):
    cfg = ExCPConfig(alpha=1e-3, archiver="zstd", archiver_level=3)
    chain = Chain(cfg)
    for step in (4, 8):
        blob, recon, stats, *_ = chain.add(load_triples(ck(series, step)))
    orig = load_triples(ck(series, 8))
    assert full_bytes(orig) / len(blob) > 2  # it did compress
    changed = sum(not np.array_equal(recon[n]["exp_avg"], orig[n]["exp_avg"]) for n in orig)
    assert changed > 0 and any(s["pruned_fraction"] > 0 for s in stats)
    # the decoder alone gives the same reconstruction, from the previous reconstruction
    prev = Chain(cfg)
    prev.add(load_triples(ck(series, 4)))
    dec = decode_checkpoint(blob, prev.ref)
    assert all(np.array_equal(dec[n]["weight"], recon[n]["weight"]) for n in recon)
    tr = resume_from_recon(recon, ck(series, 8), tmp_path / "recon")
    sd = load_file(os.path.join(ck(tmp_path / "recon", 8), "model.safetensors"))
    assert all(np.array_equal(sd[n].numpy(), recon[n]["weight"]) for n in recon)
    tr.train_until(12, out_dir=str(tmp_path / "resumed"))
    loss = tinygpt.eval_checkpoint(ck(tmp_path / "resumed", 12), OPTS, n_batches=2)
    assert np.isfinite(loss) and loss < 6.0  # trained on from the reconstruction, not diverged (ln 256 = 5.55)


@pytest.mark.parametrize("bad, msg", [({"resume_every": 0}, "resume_every"), ({"eval_batches": "x"}, "eval_batches"),
                                      ({"bogus": 1}, "bogus"), ({"sweep": {"gamma": [1]}}, "gamma"),
                                      ({"bits": 1}, "bits")])
def test_experiment_options_are_checked(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        _opts({"excp": bad})


@pytest.mark.slow
def test_excp_end_to_end(e2e, tmp_path):
    args = tiny_overrides() + ["experiment=excp", "excp.resume_every=1", "excp.eval_batches=2",
                               "excp.sweep.steps=1", "excp.sweep.alpha=[1e-3]", "excp.sweep.beta=[]",
                               "excp.sweep.bits=[2]", f"results_dir={tmp_path / 'results'}",
                               f"hydra.run.dir={tmp_path / 'run'}"]
    p = run_cli(args, tmp_path, e2e["cache"], timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    run, res = tmp_path / "run", tmp_path / "results" / "excp"
    assert not (run / "records.csv").exists()  # lossy results never go into the lossless records
    s = json.loads((res / "summary.json").read_text())
    assert s["lossy"] is True and s["ratio_full"] > 1
    for k in ("final_eval_loss_baseline", "final_eval_loss_compressed"):
        assert 0 < s[k] < 6
    ck_ = pd.read_csv(res / "excp_checkpoints.csv")
    comp = ck_[ck_["run"] == "compressed"].sort_values("step")
    assert list(comp["step"]) == [10, 20, 30]
    assert list(comp["resumed_here"]) == [False, True, False]  # every checkpoint but the first and the last
    assert list(comp["lossy"]) == [False, True, True]
    assert comp["method"].iloc[0].startswith("excp (first")
    base = ck_[ck_["run"] == "baseline"]
    assert set(base["method"]) >= {"residual+archiver", "excp"}
    assert not base[base["method"] == "residual+archiver"]["lossy"].any()
    # until the first resume the compressed run is the baseline run
    b = base[base["method"].str.startswith("excp")].set_index("step")["eval_loss"]
    assert comp.set_index("step")["eval_loss"][20] == pytest.approx(b[20])
    assert s["ratio_full"] == pytest.approx(comp[comp["lossy"]]["ratio"].mean())
    sw = pd.read_csv(res / "excp_sweep.csv")
    assert list(sw["knob"]) == ["main", "alpha", "bits"]
    report = (res / "report.md").read_text()
    assert "LOSSY" in report and "The paper's table" in report and (res / "loss_and_size.png").exists()


def test_excp_needs_a_trainable_source(tmp_path):
    p = run_cli(["experiment=excp", "source=hf_trainer", f"source.path={tmp_path}", f"hydra.run.dir={tmp_path / 'r'}"],
                tmp_path, tmp_path / "cache", timeout=120)
    assert p.returncode == 2 and "needs a tinygpt source" in p.stderr and "Traceback" not in p.stderr
