"""``lmcbench experiment=lossy``: its options, the frontier it writes (frontier.csv's columns, the report and its
figure, never records.csv), and the resumed-training judge on a real (tiny) training run."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from excp_testlib import make_checkpoint
from hydra import compose, initialize_config_dir

from lmcbench import cli, tinygpt
from lmcbench.errors import ConfigError
from lmcbench.lossy import frontier, judge
from lmcbench.lossy.judge import ResumedRun, frontier_row, judge_resumed
from lmcbench.lossy.method import make_method
from lmcbench.tinygpt import TRAIN_DEFAULTS

OPTS = dict(TRAIN_DEFAULTS, n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4, max_steps=12,
            save_steps=4, warmup_steps=2, corpus_bytes=100_000)
COLUMNS = ["method", "setting", "ratio", "final_loss", "baseline_loss", "loss_change_pct", "judged"]


def composed(overrides):
    with initialize_config_dir(config_dir=cli.CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_preset_names_every_anchor_and_ours():
    from omegaconf import OmegaConf

    cfg = composed(["experiment=lossy"])
    assert cfg.task == "experiment" and cfg.experiment_name == "lossy" and cfg.source.type == "tinygpt"
    c = OmegaConf.to_container(cfg, resolve=True)
    o = frontier.options(c)
    names = {n for n, _ in o["points"]} | set(o["skipped"])
    assert {"excp", "sz3", "zfp", "adam8bit", "bitsnap", "efq"} <= names
    for n in names:  # every method a curve: several settings
        assert len(c["lossy"]["methods"][n]) >= 2, n
    only = frontier.options({**c, "lossy": {**c["lossy"], "only": ["efq"]}})
    assert {n for n, _ in only["points"]} == {"efq"}


@pytest.mark.parametrize("bad, msg", [({"resume_every": 0}, "resume_every"), ({"eval_batches": "x"}, "eval_batches"),
                                      ({"bogus": 1}, "bogus"), ({"judged": ["later"]}, "judged"),
                                      ({"methods": {"nope": [{}]}}, "unknown method"),
                                      ({"methods": {"efq": [{"q": 0}]}}, "q must"),
                                      ({"methods": {"efq": {"q": 1}}}, "list of settings"),
                                      ({"methods": {"efq": [{}]}, "only": ["sz3"]}, "lossy.only"),
                                      ({"methods": {}}, "no method"),
                                      ({"methods": {"efq": [{}]}, "device": "gpu-please"}, "lossy.device"),
                                      ({"methods": {"efq": [{}]}, "device": 3}, "lossy.device")])
def test_options_are_checked(bad, msg):
    with pytest.raises(ConfigError, match=msg):
        frontier.options({"lossy": bad})


def test_a_missing_package_skips_its_method(monkeypatch):
    monkeypatch.setattr(frontier, "missing_package", lambda m: "pysz" if m == "sz3" else None)
    o = frontier.options({"lossy": {"methods": {"sz3": [{"rel": 0.1}], "efq": [{}]}}})
    assert [n for n, _ in o["points"]] == ["efq"] and "pysz" in o["skipped"]["sz3"]


def test_the_frontier_and_its_report(tmp_path, monkeypatch):
    """The frontier on a fake series (no training: no resume within it, losses from a stub): one row per
    method, setting and judgement with the issue's columns, the per-checkpoint rows, the report and figure."""
    rng = np.random.default_rng(0)
    steps = [10, 20, 30]
    series, prev = {}, None
    for s in steps:
        prev = make_checkpoint(rng, base=prev) if prev is not None else make_checkpoint(rng)
        series[f"ckpt-{s}"] = {n: d for n, d in prev.items() if n in ("a", "b", "d")}

    class Series:
        train_opts, path, steps = {"n_layer": 1, "n_embd": 16}, "series", None

        def checkpoints(self):
            return [(s, f"ckpt-{s}") for s in steps]

    monkeypatch.setattr(frontier, "open_series", lambda c: Series())
    monkeypatch.setattr(judge, "ensure_series", lambda *a: None)
    for mod in (frontier, judge):
        monkeypatch.setattr(mod, "load_triples", lambda d: series[d])
        monkeypatch.setattr(mod, "eval_arrays", lambda opts, w, n: 1.0 + float(np.abs(w["a"]).mean()))
    c = {"source": {}, "lossy": {"resume_every": 100, "eval_batches": 1,
                                 "methods": {"efq": [{"q": 0.5}, {"q": 4.0}], "adam8bit": [{}],
                                             "excp": [{"archiver": "none"}]}}}
    summary = frontier.run_frontier(c, str(tmp_path), log=lambda *a: None)
    fr = pd.read_csv(tmp_path / "frontier.csv")
    assert list(fr.columns[:7]) == COLUMNS
    assert len(fr) == 8 and set(fr["judged"]) == {"resumed", "reconstruction"}
    assert (fr["ratio"] > 1).all() and np.allclose(fr["loss_change_pct"],
                                                   100 * (fr["final_loss"] / fr["baseline_loss"] - 1))
    e = fr[fr["method"] == "adam8bit"]
    assert (e["loss_change_pct"].abs() < 1e-9).all()  # 8bit keeps the weights
    ck = pd.read_csv(tmp_path / "lossy_checkpoints.csv")
    assert len(ck) == 8 * 3 and ck[ck["step"] == 10]["first"].all()
    assert summary["points"] == 8 and not (tmp_path / "records.csv").exists()

    import importlib

    lossy = importlib.import_module("lmcbench.experiments.lossy")
    report = lossy.render(str(tmp_path), str(tmp_path / "out"))
    text = open(report).read()
    assert "LOSSY" in text and "frontier.png" in text and "within a loss budget" in text
    assert (tmp_path / "out" / "frontier.png").exists()
    merged = lossy.merge([str(tmp_path), str(tmp_path / "out")], str(tmp_path / "merged"))
    assert "merged 2 runs" in open(merged).read()
    assert len(pd.read_csv(tmp_path / "merged" / "frontier.csv")) == 16


@pytest.fixture(scope="module")
def tiny_series(tmp_path_factory):
    out = tmp_path_factory.mktemp("series")
    tinygpt.train(str(out), OPTS)
    return [(s, os.path.join(str(out), f"checkpoint-{s}")) for s in (4, 8, 12)]


def test_resumed_judge_on_a_real_run(tiny_series, tmp_path):
    """Training resumes from the reconstruction at every checkpoint but the first and last: the live model
    then leaves the uncompressed run, the final loss is the reconstruction's."""
    base = {s: judge.eval_arrays(OPTS, judge.weights_of(judge.load_triples(d)), 2) for s, d in tiny_series}
    m = make_method({"method": "efq", "q": 2.0})
    rows = judge_resumed(m, tiny_series, OPTS, 1, 2, str(tmp_path), base, log=lambda *a: None)
    assert [r["resumed_here"] for r in rows] == [False, True, False]
    assert rows[0]["first"] and rows[0]["eval_loss"] == base[4]
    assert rows[-1]["eval_loss"] != base[12]  # trained on from a reconstruction
    fr = frontier_row(rows)
    assert fr["judged"] == "resumed" and 0 < fr["final_loss"] < 6 and fr["checkpoints"] == 2
    assert not os.listdir(tmp_path)  # the run's checkpoint folders are gone


def test_resumed_run_needs_the_reconstruction(tiny_series, tmp_path):
    run = ResumedRun(tiny_series, OPTS, 1, str(tmp_path))
    with pytest.raises(RuntimeError, match="no reconstruction"):
        for stop in run:
            pass


def test_the_device_reaches_the_resumed_trainer(tiny_series, tmp_path, monkeypatch):
    """``lossy.device`` moves the training between checkpoints (here to ``cpu:0``, a name a CPU machine has)."""
    seen, real = [], judge.resume_from

    def spy(src, recon, out, opts, device="cpu"):
        t = real(src, recon, out, opts, device)
        seen.append((device, str(next(t.model.parameters()).device)))
        return t

    monkeypatch.setattr(judge, "resume_from", spy)
    base = {s: judge.eval_arrays(OPTS, judge.weights_of(judge.load_triples(d)), 2) for s, d in tiny_series}
    rows = judge_resumed(make_method({"method": "efq", "q": 2.0}), tiny_series, OPTS, 1, 2, str(tmp_path), base,
                         log=lambda *a: None, device="cpu:0")
    assert seen == [("cpu:0", "cpu")] and rows[1]["resumed_here"]
