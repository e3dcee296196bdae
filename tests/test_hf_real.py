"""A real Hugging Face Trainer run (transformers + accelerate, a tiny GPT-2 built from a config, nothing
downloaded) read by ``source=hf_trainer``: optimizer slots mapped to the right parameter names, and verified
rows for weights and both Adam moments with every codec and every pipeline."""

from __future__ import annotations

import csv

import pytest

from lmcbench_testlib import REPO, codec_configs, pipeline_configs, run_cli

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.slow  # a real Trainer run, then the CLI over every codec and pipeline


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    out = tmp_path_factory.mktemp("hf") / "out"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    text = (REPO / "README.md").read_bytes() * 4

    class Bytes(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            x = torch.tensor(list(text[i * 32:(i + 1) * 32]), dtype=torch.long)
            return {"input_ids": x, "labels": x}

    args = TrainingArguments(output_dir=str(out), max_steps=30, save_steps=10, per_device_train_batch_size=4,
                             learning_rate=1e-3, warmup_steps=3, lr_scheduler_type="cosine", weight_decay=0.1,
                             report_to=[], use_cpu=True, logging_steps=100, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Bytes())
    trainer.train()
    names = {id(p): n for n, p in model.named_parameters()}
    truth = [names[id(p)] for g in trainer.optimizer.param_groups for p in g["params"]]
    return out, truth


def test_real_trainer_folder_layout(trainer_run):
    out, _ = trainer_run
    for step in (10, 20, 30):
        d = out / f"checkpoint-{step}"
        assert (d / "model.safetensors").exists() and (d / "optimizer.pt").exists()
        assert (d / "training_args.bin").exists()  # present, and never opened


def test_real_trainer_slots_mapped_to_parameter_names(trainer_run):
    import torch

    from lmcbench.sources import get_source

    out, truth = trainer_run
    opt = torch.load(out / "checkpoint-30" / "optimizer.pt", weights_only=True)
    assert all("param_names" not in g for g in opt["param_groups"])  # the Trainer does not store names
    src = get_source({"type": "hf_trainer", "path": str(out), "steps": [30], "kinds": ["exp_avg"]})
    got = {e.name: e for e in src.entries()}
    assert set(got) == set(truth)
    # each moment must have the shape of the parameter it is named after
    weights = {e.name: e.shape for e in get_source({"type": "hf_trainer", "path": str(out), "steps": [30],
                                                      "kinds": ["weight"]}).entries()}
    for name, e in got.items():
        assert e.shape == weights[name]
    # and be that parameter's moment: slot k of the optimizer is truth[k]
    for k, name in enumerate(truth):
        a = src.load(got[name]).array
        assert (a == opt["state"][k]["exp_avg"].numpy()).all()


def test_real_trainer_all_codecs_and_pipelines_verified(trainer_run, tmp_path):
    out, _ = trainer_run
    codecs = ",".join(sorted(codec_configs()))
    pipes = ",".join(sorted(pipeline_configs()))
    args = ["source=hf_trainer", f"source.path={out}", "source.steps=[10,30]", f"codec=[{codecs}]",
            f"pipeline=[{pipes}]", "bench=quick", "report=none", "codec.lzma.preset=0",
            "codec.brotli_11.quality=5", f"hydra.run.dir={tmp_path / 'run'}"]
    p = run_cli(args, tmp_path, tmp_path / "cache", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(tmp_path / "run" / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["verified"] == "True" for r in rows)
    kinds = {r["kind"] for r in rows}
    assert {"weight", "exp_avg", "exp_avg_sq"} <= kinds
    seen = {(r["kind"], r["transform"], r["codec"]) for r in rows}
    for kind in ("weight", "exp_avg", "exp_avg_sq"):
        for pipe, steps in pipeline_configs().items():
            takes_ref = any(t["id"] == "reference" for t in steps)  # byte codecs skip the reference pipeline
            assert ((kind, pipe, "zstd") in seen) != takes_ref and (kind, pipe, "lmc") in seen
        assert (kind, "raw", "zipnn") in seen and (kind, "raw", "openzl") in seen
    delta30 = [r for r in rows if r["transform"] == "delta" and r["step"] == "30"]
    assert delta30 and all(r["ref_step"] == "10" for r in delta30)
