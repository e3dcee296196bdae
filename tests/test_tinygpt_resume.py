"""The tinygpt trainer is resumable bit for bit: from a checkpoint folder, from swapped-in state, and ``train`` still
writes exactly what the pre-refactor training loop wrote (compared against a verbatim copy of that loop, run in the
same process, because the bits depend on the machine and the thread count)."""

import json
import math
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lmcbench import tinygpt
from lmcbench.errors import ConfigError, SourceError
from lmcbench.tinygpt import TRAIN_DEFAULTS, Trainer, eval_checkpoint, evaluate

# 4, 8, 12 are save steps and 14 is max_steps (not a multiple of save_steps)
OPTS = dict(TRAIN_DEFAULTS, n_layer=1, n_embd=16, n_head=2, block_size=16, batch_size=4, max_steps=14,
            save_steps=4, warmup_steps=2, corpus_bytes=100_000)
STEPS = [4, 8, 12, 14]


@pytest.fixture(scope="module")
def oneshot(tmp_path_factory):
    out = tmp_path_factory.mktemp("oneshot")
    info = tinygpt.train(str(out), OPTS)
    assert [e["step"] for e in info["log_history"]] == STEPS
    return out


def ckpt(root, step):
    return os.path.join(str(root), f"checkpoint-{step}")


def opt_by_name(d):
    """optimizer.pt as {name: {exp_avg, exp_avg_sq, step}} plus its param groups without the slot ids."""
    sd = torch.load(os.path.join(d, "optimizer.pt"), weights_only=True)
    out = {}
    for g in sd["param_groups"]:
        for name, slot in zip(g["param_names"], g["params"]):
            out[name] = sd["state"][slot]
    return out, [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]


def assert_same_checkpoint(d1, d2):
    w1, w2 = load_file(os.path.join(d1, "model.safetensors")), load_file(os.path.join(d2, "model.safetensors"))
    assert w1.keys() == w2.keys()
    for k in w1:
        assert torch.equal(w1[k], w2[k]), f"weights {k} differ"
    (s1, g1), (s2, g2) = opt_by_name(d1), opt_by_name(d2)
    assert g1 == g2 and s1.keys() == s2.keys()
    for name in s1:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1[name][k], s2[name][k]), f"{k} of {name} differs"
    assert (torch.load(os.path.join(d1, "scheduler.pt"), weights_only=True)
            == torch.load(os.path.join(d2, "scheduler.pt"), weights_only=True))
    for f in ("trainer_state.json", "config.json"):
        with open(os.path.join(d1, f)) as a, open(os.path.join(d2, f)) as b:
            assert json.load(a) == json.load(b), f
    with open(os.path.join(d1, "model.safetensors"), "rb") as a, open(os.path.join(d2, "model.safetensors"), "rb") as b:
        assert a.read() == b.read()


def differs(d1, d2):
    w1, w2 = load_file(os.path.join(d1, "model.safetensors")), load_file(os.path.join(d2, "model.safetensors"))
    return any(not torch.equal(w1[k], w2[k]) for k in w1)


def checkpoint_arrays(d):
    """What an ExCP run reads back from a checkpoint folder: name -> np.ndarray for weights and both moments."""
    w = {k: v.numpy() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    st, _ = opt_by_name(d)
    return w, {n: s["exp_avg"].numpy() for n, s in st.items()}, {n: s["exp_avg_sq"].numpy() for n, s in st.items()}


def reference_train(out_dir, opts):
    """The training loop of ``tinygpt.train`` before it became resumable, verbatim minus logging and progress."""
    from safetensors.torch import save_file

    torch.manual_seed(opts["seed"])
    data = np.frombuffer(tinygpt.corpus(opts["corpus_bytes"]), np.uint8)
    split = int(len(data) * 0.95)
    train_data = torch.from_numpy(data[:split].astype(np.int64))
    val_data = torch.from_numpy(data[split:].astype(np.int64))
    model = tinygpt.build_model(opts)
    named = list(model.named_parameters())
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    nodecay = [(n, p) for n, p in named if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opts["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}], lr=opts["lr"], betas=tuple(opts["betas"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: tinygpt.lr_at(s, opts))
    gen = torch.Generator().manual_seed(opts["seed"])
    bs, T = opts["batch_size"], opts["block_size"]

    def batch(src):
        ix = torch.randint(len(src) - T - 1, (bs,), generator=gen)
        x = torch.stack([src[i:i + T] for i in ix])
        y = torch.stack([src[i + 1:i + T + 1] for i in ix])
        return x, y

    log = []
    for step in range(1, opts["max_steps"] + 1):
        model.train()
        x, y = batch(train_data)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % opts["save_steps"] == 0 or step == opts["max_steps"]:
            model.eval()
            with torch.no_grad():
                vx, vy = batch(val_data)
                val = model(vx, vy).item()
            log.append({"step": step, "loss": round(loss.item(), 4), "eval_loss": round(val, 4),
                        "learning_rate": sched.get_last_lr()[0]})
            d = os.path.join(out_dir, f"checkpoint-{step}")
            os.makedirs(d, exist_ok=True)
            save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()},
                      os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
            torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
            with open(os.path.join(d, "trainer_state.json"), "w") as f:
                json.dump({"global_step": step, "max_steps": opts["max_steps"], "save_steps": opts["save_steps"],
                           "log_history": log}, f, indent=1)
            cfg = {"model_type": "lmcbench-tinygpt", "architectures": ["TinyGPT"], "vocab_size": 256,
                   "n_positions": opts["block_size"], "n_embd": opts["n_embd"], "n_layer": opts["n_layer"],
                   "n_head": opts["n_head"], "torch_dtype": "float32"}
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
    return gen


def test_train_writes_what_the_pre_refactor_loop_wrote(oneshot, tmp_path):
    gen = reference_train(str(tmp_path), OPTS)
    for s in STEPS:
        assert_same_checkpoint(ckpt(oneshot, s), ckpt(tmp_path, s))
        # optimizer.pt and scheduler.pt are byte-identical files too
        for f in ("optimizer.pt", "scheduler.pt"):
            with open(os.path.join(ckpt(oneshot, s), f), "rb") as a, open(os.path.join(ckpt(tmp_path, s), f), "rb") as b:
                assert a.read() == b.read(), f
    t = Trainer(OPTS)
    t.train_until(OPTS["max_steps"], save=False)
    assert torch.equal(t.gen.get_state(), gen.get_state())


@pytest.mark.parametrize("at", [4, 12])
def test_resume_from_checkpoint_folder_is_bit_identical(oneshot, tmp_path, at):
    t = Trainer.from_checkpoint(ckpt(oneshot, at), OPTS)
    assert t.step == at and [e["step"] for e in t.log] == [s for s in STEPS if s <= at]
    log = t.train_until(OPTS["max_steps"], str(tmp_path))
    assert log is t.log and [e["step"] for e in log] == STEPS
    for s in STEPS:
        if s > at:
            assert_same_checkpoint(ckpt(oneshot, s), ckpt(tmp_path, s))
        else:
            assert not os.path.exists(ckpt(tmp_path, s))
    with open(os.path.join(ckpt(oneshot, 14), "trainer_state.json")) as f:
        assert log == json.load(f)["log_history"]


def test_segmentwise_training_equals_oneshot(oneshot, tmp_path):
    t = Trainer(OPTS)
    t.train_until(5, str(tmp_path))
    t.train_until(9, save=False)   # step 8 is still logged and its validation batch still drawn
    t.train_until(9, str(tmp_path))  # no-op
    t.train_until(14, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-12", "checkpoint-14", "checkpoint-4"]
    for s in (4, 12, 14):
        assert_same_checkpoint(ckpt(oneshot, s), ckpt(tmp_path, s))
    with pytest.raises(ConfigError, match="target"):
        t.train_until(15, str(tmp_path))
    with pytest.raises(ConfigError, match="target"):
        t.train_until(3, str(tmp_path))


def test_load_state_swaps_weights_and_moments_by_name(oneshot, tmp_path):
    w, m, v = checkpoint_arrays(ckpt(oneshot, 8))
    # a trainer restored at step 8, scrambled, then given the checkpoint's own tensors, trains on as before
    t = Trainer.from_checkpoint(ckpt(oneshot, 8), OPTS)
    gen_state = t.gen.get_state()
    t.load_state({k: np.zeros_like(a) for k, a in w.items()}, {k: a + 1 for k, a in m.items()},
                 {k: a * 2 for k, a in v.items()})
    t.load_state(w, m, v)
    assert t.step == 8 and torch.equal(t.gen.get_state(), gen_state)
    t.train_until(14, str(tmp_path / "same"))
    for s in (12, 14):
        assert_same_checkpoint(ckpt(oneshot, s), ckpt(tmp_path / "same", s))

    # the other ExCP route: swap the state in, write it with save_checkpoint, resume from that folder
    t = Trainer(OPTS)
    t.train_until(8, save=False)
    t.load_state(w, m, v)
    d = t.save_checkpoint(str(tmp_path / "written"))
    assert d == ckpt(tmp_path / "written", 8)
    assert_same_checkpoint(ckpt(oneshot, 8), d)
    Trainer.from_checkpoint(d, OPTS).train_until(14, str(tmp_path / "written"))
    assert_same_checkpoint(ckpt(oneshot, 14), ckpt(tmp_path / "written", 14))

    # a perturbed weight, or a perturbed moment, changes what follows
    name = "transformer.h.0.attn.c_attn.weight"
    for label, (w2, m2) in {"weight": ({**w, name: w[name] + np.float32(1e-3)}, m),
                            "moment": (w, {**m, name: m[name] * np.float32(1.5)})}.items():
        t = Trainer.from_checkpoint(ckpt(oneshot, 8), OPTS)
        t.load_state(w2, m2, v)
        t.train_until(12, str(tmp_path / label))
        assert differs(ckpt(oneshot, 12), ckpt(tmp_path / label, 12)), label


def test_load_state_rejects_mismatches_without_changing_anything(oneshot):
    w, m, v = checkpoint_arrays(ckpt(oneshot, 8))
    t = Trainer.from_checkpoint(ckpt(oneshot, 8), OPTS)
    before = t.state_arrays()
    name = "transformer.h.0.mlp.c_fc.weight"
    with pytest.raises(SourceError, match=r"c_fc\.weight has shape \(64, 8\)"):
        t.load_state(w, m, {**v, name: v[name][:, :8]})
    with pytest.raises(SourceError, match="unknown name.*transformer.h.7.attn"):
        t.load_state({**w, "transformer.h.7.attn.c_attn.weight": w[name]}, m, v)
    with pytest.raises(SourceError, match=f"missing 1 parameter.*{name}"):
        t.load_state({k: a for k, a in w.items() if k != name}, m, v)
    after = t.state_arrays()
    for b, a in zip(before, after):
        assert b.keys() == a.keys() and all(np.array_equal(b[k], a[k]) for k in b)
    with pytest.raises(SourceError, match="no exp_avg"):
        Trainer(OPTS).load_state(w, m, v)  # step 0: AdamW has no moments yet


def test_evaluate_is_deterministic_and_leaves_training_alone(oneshot, tmp_path):
    t = Trainer(OPTS)
    t.train_until(4, str(tmp_path))
    gen_state, rng_state = t.gen.get_state(), torch.get_rng_state()
    t.model.train()
    e1 = evaluate(t.model, OPTS, n_batches=3)
    e2 = t_eval = evaluate(t.model, OPTS, n_batches=3, val_data=t.val_data)
    assert e1 == e2 and 0 < e1 < 2 * math.log(256)
    assert evaluate(t.model, OPTS, n_batches=5) != e1
    assert eval_checkpoint(ckpt(oneshot, 4), OPTS, n_batches=3) == t_eval
    assert eval_checkpoint(ckpt(oneshot, 14), OPTS, n_batches=3) < e1  # training helps
    assert torch.equal(t.gen.get_state(), gen_state) and torch.equal(torch.get_rng_state(), rng_state)
    assert t.model.training  # the train/eval mode is put back
    t.train_until(14, str(tmp_path))
    for s in STEPS:
        assert_same_checkpoint(ckpt(oneshot, s), ckpt(tmp_path, s))
    with pytest.raises(SourceError, match="model.safetensors"):
        eval_checkpoint(str(tmp_path), OPTS)
    with pytest.raises(SourceError, match="shape"):
        eval_checkpoint(ckpt(oneshot, 4), dict(OPTS, n_embd=32))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "pickle", "wrong_shapes"])
def test_from_checkpoint_with_a_bad_optimizer_file_is_a_source_error(oneshot, tmp_path, damage):
    d = str(tmp_path / "checkpoint-8")
    shutil.copytree(ckpt(oneshot, 8), d)
    path = os.path.join(d, "optimizer.pt")
    if damage == "missing":
        os.remove(path)
    elif damage == "garbage":
        with open(path, "wb") as f:
            f.write(b"not a torch file at all")
    elif damage == "truncated":
        with open(path, "rb") as f:
            raw = f.read()
        with open(path, "wb") as f:
            f.write(raw[:len(raw) // 2])
    elif damage == "pickle":
        torch.save({"state": _Evil(), "param_groups": []}, path)
    else:
        sd = torch.load(path, weights_only=True)
        sd["state"][0]["exp_avg"] = torch.zeros(3, 3)
        torch.save(sd, path)
    with pytest.raises(SourceError, match="optimizer.pt"):
        Trainer.from_checkpoint(d, OPTS)


def test_from_checkpoint_other_bad_folders(oneshot, tmp_path):
    d = str(tmp_path / "checkpoint-8")
    shutil.copytree(ckpt(oneshot, 8), d)
    with pytest.raises(ConfigError, match="max_steps"):
        Trainer.from_checkpoint(d, dict(OPTS, max_steps=20))
    with pytest.raises(SourceError, match="shape"):
        Trainer.from_checkpoint(d, dict(OPTS, n_embd=32))
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"\x00" * 10)
    with pytest.raises(SourceError, match="model.safetensors"):
        Trainer.from_checkpoint(d, OPTS)
    save_file({"x": torch.zeros(1)}, os.path.join(d, "model.safetensors"))
    with pytest.raises(SourceError, match="missing"):
        Trainer.from_checkpoint(d, OPTS)
    os.remove(os.path.join(d, "scheduler.pt"))
    shutil.copy(os.path.join(ckpt(oneshot, 8), "model.safetensors"), d)
    with pytest.raises(SourceError, match="scheduler.pt"):
        Trainer.from_checkpoint(d, OPTS)
    os.remove(os.path.join(d, "trainer_state.json"))
    with pytest.raises(SourceError, match="trainer_state.json"):
        Trainer.from_checkpoint(d, OPTS)
    with pytest.raises(SourceError, match="no such"):
        Trainer.from_checkpoint(str(tmp_path / "nope"), OPTS)
