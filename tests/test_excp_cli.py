"""``lmcbench-excp`` (lmcbench.lossy.cli): compress a real Trainer folder as one ExCP chain and restore it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lmc.formats.trainer_folder import load_triples
from lmcbench.errors import ConfigError
from lmcbench.lossy import cli
from lmcbench.lossy.chain import full_bytes
from lmcbench.lossy.cli import main
from lmcbench.sources.hf_trainer import HFTrainerSource

from lmcbench_testlib import PARAM_NAMES, make_trainer_folder, tiny_model

STEPS = (10, 20, 30)
EXACT = ["--no-prune-weights", "--no-prune-moments", "--no-quantize", "--archiver", "zstd", "--level", "3"]


def tree_hashes(root) -> dict:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def copied_names(ckpt_dir) -> list[str]:
    """Files of a model.safetensors checkpoint folder that compress copies (all but the weights and optimizer)."""
    return sorted(n for n in os.listdir(ckpt_dir) if n not in ("model.safetensors", "optimizer.pt"))


def ok(args, capsys=None):
    rc = main([str(a) for a in args])
    if capsys is not None:
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        return cap
    assert rc == 0
    return None


def fail(args, capsys) -> str:
    """Run a failing command; returns its one error line."""
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmcbench-excp: error: "), err
    assert "Traceback" not in err
    return lines[0]


def fresh_adamw():
    model = tiny_model()
    return model, torch.optim.AdamW(model.named_parameters(), lr=1e-2)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("excp_cli")
    src = root / "src"
    data = make_trainer_folder(src, steps=STEPS)
    return {"root": root, "src": src, "data": data, "hashes": tree_hashes(src)}


@pytest.fixture(scope="module")
def exact(series):
    out, rest = series["root"] / "exact_out", series["root"] / "exact_restored"
    ok(["compress", series["src"], out, *EXACT])
    ok(["restore", out, rest])
    return out, rest


@pytest.fixture(scope="module")
def lossy(series):
    out, rest = series["root"] / "lossy_out", series["root"] / "lossy_restored"
    ok(["compress", series["src"], out])
    ok(["restore", out, rest])
    return out, rest


# ------------------------------------------------------------------------------------------- round trips
def test_bit_exact_settings_give_back_every_bit(series, exact):
    out, rest = exact
    chain = json.loads((out / "excp_chain.json").read_text())
    assert chain["steps"] == list(STEPS) and chain["lossy"] is True and chain["bit_exact"] and chain["complete"]
    for step in STEPS:
        d, src = rest / f"checkpoint-{step}", series["src"] / f"checkpoint-{step}"
        orig = series["data"][step]
        w = load_file(str(d / "model.safetensors"))
        assert set(w) == set(orig["weights"])
        for n, t in orig["weights"].items():
            assert w[n].dtype == t.dtype and torch.equal(w[n].view(torch.int32), t.view(torch.int32))
        # the weights file itself comes back byte for byte (same tensors, dtypes and metadata)
        assert (d / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
        osd = torch.load(d / "optimizer.pt", weights_only=True)
        assert osd["param_groups"] == orig["param_groups"]
        assert set(osd["state"]) == set(orig["opt"])
        for slot, st in orig["opt"].items():
            assert list(osd["state"][slot]) == list(st)
            for k, t in st.items():
                assert osd["state"][slot][k].dtype == t.dtype and torch.equal(osd["state"][slot][k], t), (slot, k)
        # every other file byte-identical, nothing else added
        assert sorted(os.listdir(d)) == sorted(copied_names(src) + ["model.safetensors", "optimizer.pt"])
        for n in copied_names(src):
            assert (d / n).read_bytes() == (src / n).read_bytes(), n
        # a fresh AdamW built like the trainer's loads it and gives back the same param groups
        model, opt = fresh_adamw()
        opt.load_state_dict(osd)
        assert opt.state_dict()["param_groups"] == orig["param_groups"]
        p0 = dict(model.named_parameters())["fc1.weight"]
        assert torch.equal(opt.state[p0]["exp_avg"], orig["opt"][0]["exp_avg"])


def test_lossy_defaults_restore_a_readable_smaller_chain(series, lossy, capsys):
    out, rest = lossy
    chain = json.loads((out / "excp_chain.json").read_text())
    assert chain["lossy"] is True and not chain["bit_exact"] and chain["steps"] == list(STEPS)
    assert chain["config"]["quantize"] and chain["config"]["bits"] == 4
    total_o = total_c = 0
    for step, entry in zip(STEPS, chain["checkpoints"]):
        assert entry["step"] == step and entry["first"] == (step == STEPS[0])
        assert entry["compressed_bytes"] == os.path.getsize(out / f"checkpoint-{step}.excp")
        assert entry["original_bytes"] == full_bytes(load_triples(str(series["src"] / f"checkpoint-{step}")))
        side = json.loads((out / f"checkpoint-{step}.json").read_text())
        assert side["excp_bytes"] == entry["compressed_bytes"]
        assert entry["files_bytes"] == sum(os.path.getsize(out / f"checkpoint-{step}.files" / f["path"])
                                           for f in side["files"])
        total_o += entry["original_bytes"]
        total_c += entry["compressed_bytes"]
    assert (chain["original_bytes"], chain["compressed_bytes"]) == (total_o, total_c)
    assert chain["compressed_bytes"] < chain["original_bytes"]
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no temporary files left

    for step in STEPS:
        a = HFTrainerSource(path=str(series["src"] / f"checkpoint-{step}")).entries()
        b = HFTrainerSource(path=str(rest / f"checkpoint-{step}")).entries()
        assert [(e.name, e.kind, e.dtype, tuple(e.shape)) for e in a] == \
               [(e.name, e.kind, e.dtype, tuple(e.shape)) for e in b]
        assert {e.name for e in b if e.kind == "exp_avg"} == set(PARAM_NAMES)
        osd = torch.load(rest / f"checkpoint-{step}" / "optimizer.pt", weights_only=True)
        _, opt = fresh_adamw()
        opt.load_state_dict(osd)
    # really lossy after the first checkpoint, and lossless on the first
    rec = load_triples(str(rest / f"checkpoint-{STEPS[-1]}"))
    org = load_triples(str(series["src"] / f"checkpoint-{STEPS[-1]}"))
    assert any(not np.array_equal(rec[n]["exp_avg"], org[n]["exp_avg"]) for n in org)
    first_r, first_o = (load_triples(str(p / f"checkpoint-{STEPS[0]}")) for p in (rest, series["src"]))
    assert all(np.array_equal(first_r[n][k], first_o[n][k]) for n in first_o for k in first_o[n])

    cap = ok(["info", out / "checkpoint-20.excp", "--params"], capsys)
    assert "6 parameter(s), 18 array(s)" in cap.out and "residual" in cap.out and "fc1.weight exp_avg" in cap.out


@pytest.mark.parametrize("weights,bf16", [("sharded", True), ("bin", False)])
def test_sharded_and_bin_sources_restore_to_one_safetensors(tmp_path, weights, bf16):
    data = make_trainer_folder(tmp_path / "src", steps=(10, 20), weights=weights, bf16=bf16)
    ok(["compress", tmp_path / "src", tmp_path / "out", *EXACT])
    side = json.loads((tmp_path / "out" / "checkpoint-20.json").read_text())
    assert side["weights"]["format"] == ("torch" if weights == "bin" else "safetensors")
    assert len(side["weights"]["files"]) == (2 if weights == "sharded" else 1)
    ok(["restore", tmp_path / "out", tmp_path / "rest", "--steps", "20"])
    assert os.listdir(tmp_path / "rest") == ["checkpoint-20"]
    w = load_file(str(tmp_path / "rest" / "checkpoint-20" / "model.safetensors"))
    for n, t in data[20]["weights"].items():
        assert w[n].dtype == t.dtype and torch.equal(w[n], t)
    assert not [n for n in os.listdir(tmp_path / "rest" / "checkpoint-20")
                if n.endswith(".bin") and n.startswith("pytorch_model") or n.endswith(".index.json")]


def test_weight_files_that_were_not_read_are_copied(tmp_path, capsys):
    """Only the weight files the weights were read from are replaced: a stale pytorch_model.bin (or a leftover
    index) next to model.safetensors comes back as it was."""
    make_trainer_folder(tmp_path / "src", steps=(10, 20))
    for step in (10, 20):
        d = tmp_path / "src" / f"checkpoint-{step}"
        torch.save({"stale": torch.zeros(3)}, d / "pytorch_model.bin")
        (d / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
        (d / "model-00001-of-00002.safetensors").write_bytes(b"not read")
    ok(["compress", tmp_path / "src", tmp_path / "out", *EXACT])
    side = json.loads((tmp_path / "out" / "checkpoint-20.json").read_text())
    assert side["weights"]["files"] == ["model.safetensors"]
    assert sorted(side["not_copied"]) == ["model.safetensors", "optimizer.pt"]
    ok(["restore", tmp_path / "out", tmp_path / "rest"])
    for step in (10, 20):
        src, d = tmp_path / "src" / f"checkpoint-{step}", tmp_path / "rest" / f"checkpoint-{step}"
        assert sorted(os.listdir(d)) == sorted(os.listdir(src))
        for n in ("pytorch_model.bin", "pytorch_model.bin.index.json", "model-00001-of-00002.safetensors"):
            assert (d / n).read_bytes() == (src / n).read_bytes(), n
        assert (d / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def test_scalar_parameter_compresses_restores_and_loads(tmp_path, capsys):
    """A 0-dim parameter (like CLIP's logit_scale) with Adam state: compress, restore, AdamW.load_state_dict."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(40, 30))
    model.logit_scale = torch.nn.Parameter(torch.tensor(2.5))

    def adamw(m):
        return torch.optim.AdamW(m.named_parameters(), lr=1e-2)

    opt = adamw(model)
    orig = {}
    for step in (1, 2, 3):
        loss = (model.w.sum(0) * model.logit_scale).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        d = tmp_path / "src" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                  str(d / "model.safetensors"), metadata={"format": "pt"})
        torch.save(opt.state_dict(), d / "optimizer.pt")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        orig[step] = torch.load(d / "optimizer.pt", weights_only=True)
    ok(["compress", tmp_path / "src", tmp_path / "out"], capsys)
    ok(["restore", tmp_path / "out", tmp_path / "rest"], capsys)
    for step in (1, 2, 3):
        d = tmp_path / "rest" / f"checkpoint-{step}"
        w = load_file(str(d / "model.safetensors"))
        assert w["logit_scale"].shape == () and w["logit_scale"].dtype == torch.float32
        osd = torch.load(d / "optimizer.pt", weights_only=True)
        assert osd["param_groups"] == orig[step]["param_groups"]
        for slot, st in orig[step]["state"].items():
            for k, t in st.items():
                assert osd["state"][slot][k].dtype == t.dtype and osd["state"][slot][k].shape == t.shape, (slot, k)
        m2 = torch.nn.Module()
        m2.w = torch.nn.Parameter(torch.zeros(40, 30))
        m2.logit_scale = torch.nn.Parameter(torch.tensor(0.0))
        m2.load_state_dict(w)
        o2 = adamw(m2)
        o2.load_state_dict(osd)
        assert o2.state[m2.logit_scale]["exp_avg"].shape == ()
    # the first checkpoint of the chain is lossless, the scalar included
    assert torch.equal(load_file(str(tmp_path / "rest" / "checkpoint-1" / "model.safetensors"))["logit_scale"],
                       load_file(str(tmp_path / "src" / "checkpoint-1" / "model.safetensors"))["logit_scale"])


def test_interrupted_compress_leaves_only_complete_checkpoints(series, tmp_path, monkeypatch, capsys):
    real, calls = cli.read_checkpoint, []

    def interrupt_second(d):
        calls.append(d)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(d)

    monkeypatch.setattr(cli, "read_checkpoint", interrupt_second)
    assert main(["compress", str(series["src"]), str(tmp_path / "out")]) == 130
    capsys.readouterr()
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-10.excp", "checkpoint-10.files", "checkpoint-10.json",
                                                     "excp_chain.json"]
    chain = json.loads((tmp_path / "out" / "excp_chain.json").read_text())
    assert chain["steps"] == [10] and chain["complete"] is False
    monkeypatch.undo()
    ok(["restore", tmp_path / "out", tmp_path / "rest"], capsys)
    assert os.listdir(tmp_path / "rest") == ["checkpoint-10"]


# ---------------------------------------------------------------------------------------------- errors
def test_corrupt_container_is_one_line(lossy, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(lossy[0], out)
    p = out / "checkpoint-20.excp"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x40
    p.write_bytes(bytes(b))
    msg = fail(["restore", out, tmp_path / "rest"], capsys)
    assert "checkpoint-20.excp" in msg and "corrupt" in msg
    assert not (tmp_path / "rest" / "checkpoint-20").exists()
    assert "checkpoint-20.excp" in fail(["info", p], capsys)
    # the installed entry point: exit status 2, one line on stderr, no traceback
    env = {k: v for k, v in os.environ.items() if k != "LMCBENCH_DEBUG"}
    r = subprocess.run([sys.executable, "-m", "lmcbench.lossy", "restore", str(out), str(tmp_path / "rest2")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("lmcbench-excp: error: "), r.stderr
    assert "checkpoint-20.excp" in r.stderr


@pytest.mark.parametrize("field, value", [("optimizer", "garbage"), ("optimizer", {"slots": 7}), ("weights", "x"),
                                          ("weights", {"tensors": "x"})])
def test_malformed_restore_record_is_one_line(lossy, tmp_path, capsys, field, value):
    out = tmp_path / "out"
    shutil.copytree(lossy[0], out)
    rec = out / "checkpoint-10.json"
    doc = json.loads(rec.read_text())
    doc[field] = value
    rec.write_text(json.dumps(doc))
    msg = fail(["restore", out, tmp_path / "rest"], capsys)
    assert "checkpoint-10.json" in msg


def _forged_toc_container(toc_text: bytes) -> bytes:
    from lmcbench.lossy import excp

    return excp.container._pack_container(struct.pack("<I", len(toc_text)) + toc_text, "none", None)


def test_info_rejects_hostile_tables_of_contents_in_one_line(lossy, tmp_path, capsys):
    from lmcbench.lossy import excp

    payload, _ = excp.container._unpack_container((lossy[0] / "checkpoint-20.excp").read_bytes())
    payload = bytes(payload)
    (toc_len,) = struct.unpack_from("<I", payload)
    toc, data = json.loads(payload[4:4 + toc_len]), payload[4 + toc_len:]
    cases = {"deep": _forged_toc_container(b"[" * 100_000 + b"]" * 100_000)}
    for label, shape in (("huge", [2**70]), ("wraps", [2**40, 2**40]), ("negative", [-1, 4])):
        t = json.loads(json.dumps(toc))
        t["params"][0]["arrays"][0]["shape"] = shape
        cases[label] = excp.container._pack_container(excp.payload._build_payload(t, [data]), "none", None)
    t = json.loads(json.dumps(toc))
    t["params"][0]["arrays"][0]["mode"] = ["quant"]
    cases["mode"] = excp.container._pack_container(excp.payload._build_payload(t, [data]), "none", None)
    for label, blob in cases.items():
        p = tmp_path / f"{label}.excp"
        p.write_bytes(blob)
        msg = fail(["info", p], capsys)
        assert f"{label}.excp" in msg, msg
    # a valid container still prints its summary
    cap = ok(["info", lossy[0] / "checkpoint-20.excp"], capsys)
    assert "config: alpha=5e-05" in cap.out and "archiver=lzma" in cap.out


def test_missing_middle_step_is_named(lossy, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(lossy[0], out)
    os.remove(out / "checkpoint-20.excp")
    msg = fail(["restore", out, tmp_path / "rest"], capsys)
    assert "checkpoint-20.excp: missing" in msg and "[30]" in msg
    assert not (tmp_path / "rest").exists() or not os.listdir(tmp_path / "rest")
    ok(["restore", out, tmp_path / "rest", "--steps", "10"])  # the steps before it still restore


def test_existing_output_needs_force(series, lossy, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(lossy[0], out)
    (out / "notes.txt").write_text("mine")
    assert "--force" in fail(["compress", series["src"], out], capsys)
    ok(["compress", series["src"], out, "--force", "--steps", "10,30"])
    assert sorted(n for n in os.listdir(out) if n.endswith(".excp")) == ["checkpoint-10.excp", "checkpoint-30.excp"]
    assert (out / "notes.txt").read_text() == "mine"  # only the chain's own files are replaced
    assert json.loads((out / "excp_chain.json").read_text())["steps"] == [10, 30]
    ok(["restore", out, tmp_path / "rest"])
    assert "--force" in fail(["restore", out, tmp_path / "rest"], capsys)
    ok(["restore", out, tmp_path / "rest", "--force"])


def test_bad_options_and_inputs_are_one_line(series, tmp_path, capsys, monkeypatch):
    src, out = series["src"], tmp_path / "out"
    assert "bits" in fail(["compress", src, out, "--bits", "1"], capsys)
    assert "--bits" in fail(["compress", src, out, "--bits", "four"], capsys)
    assert "archiver" in fail(["compress", src, out, "--archiver", "rar"], capsys)
    assert "level" in fail(["compress", src, out, "--archiver", "none", "--level", "3"], capsys)
    assert "--steps" in fail(["compress", src, out, "--steps", "a,b"], capsys)
    assert "[40]" in fail(["compress", src, out, "--steps", "10,40"], capsys)
    assert "no such folder" in fail(["compress", tmp_path / "nope", out], capsys)
    assert "inside SRC" in fail(["compress", src, src / "out"], capsys)
    assert "excp_chain.json" in fail(["restore", tmp_path, tmp_path / "rest"], capsys)
    assert "no such file" in fail(["info", tmp_path / "nope.excp"], capsys)
    fail([], capsys)
    assert not out.exists()
    monkeypatch.setenv("LMCBENCH_DEBUG", "1")
    with pytest.raises(ConfigError):
        main(["compress", str(src), str(out), "--bits", "1"])


def test_source_folder_is_unchanged(series, exact, lossy):
    # runs last: every command above read this folder
    assert tree_hashes(series["src"]) == series["hashes"]
    assert not (series["src"] / "UNPICKLED").exists()  # training_args.bin was copied, never unpickled
