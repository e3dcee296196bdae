"""python -m lmcbench.tinygpt: a tinygpt series trained into a folder of the user's choice (any torch device)."""
import json
import os
import subprocess
import sys

import pytest

from lmcbench.tinygpt.__main__ import main

TINY = ["--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set", "max_steps=4", "--set",
        "save_steps=2", "--set", "corpus_bytes=100000"]


def test_trains_a_series_into_a_folder(tmp_path, capsys):
    out = tmp_path / "series"
    assert main([str(out), *TINY]) == 0
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "lmcbench_series.json"]
    info = json.loads((out / "lmcbench_series.json").read_text())
    assert info["device"] == "cpu" and info["options"]["max_steps"] == 4 and info["log_history"][-1]["step"] == 4
    from lmcbench.tinygpt.corpus import SHA256

    assert info["corpus"]["sha256"] == SHA256
    # the same run through the trainer the cache uses writes the same bits (the device path only moves tensors)
    from lmcbench.tinygpt import train

    train(str(tmp_path / "again"), info["options"])
    for name in ("model.safetensors", "optimizer.pt"):
        assert (out / "checkpoint-4" / name).read_bytes() == (tmp_path / "again" / "checkpoint-4" / name).read_bytes()
    # a folder that already holds a series is refused in one line
    assert main([str(out), *TINY]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [(["--set", "bogus=1"], "unknown option 'bogus'"),
                                          (["--set", "max_steps"], "expected KEY=VALUE"),
                                          (["--preset", "nope"], "no conf/source/nope.yaml")])
def test_bad_options_are_one_line_errors(tmp_path, capsys, args, needle):
    assert main([str(tmp_path / "s"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_preset_and_cpu_copies_of_state(tmp_path):
    """--preset reads conf/source/<preset>.yaml's train block; the CPU copies a save on an accelerator writes
    hold the same values as the model's state (checked on the CPU, where both are the same tensors)."""
    import torch

    from lmcbench.tinygpt.__main__ import _options
    from lmcbench.tinygpt.trainer import Trainer, _OnCPU

    opts = _options("tinygpt_large", ["max_steps=300"])
    assert opts["n_embd"] == 576 and opts["max_steps"] == 300 and opts["corpus_bytes"] == 8_000_000
    t = Trainer({"n_layer": 1, "n_embd": 32, "n_head": 2, "max_steps": 2, "save_steps": 2, "corpus_bytes": 100000})
    t.train_until(2, save=False)
    for obj in (t.model, t.opt):
        a, b = obj.state_dict(), _OnCPU(obj).state_dict()
        assert type(a) is type(b) and a.keys() == b.keys() and a
        if obj is t.model:
            assert all(torch.equal(a[k], b[k]) for k in a)
        else:
            assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i]
                       if torch.is_tensor(a["state"][i][k]))
            assert a["param_groups"] == b["param_groups"]


def test_module_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lmcbench.tinygpt", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--device" in r.stdout
