"""Shared helpers for the lmcbench test-suite (fixtures are in conftest.py).

Everything the tests read is built here or by the tests themselves (tmp_path): no network, no downloads.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

# keep hypothesis' cache out of the repository
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "lmcbench-tests-hypothesis"))

import ml_dtypes
import numpy as np
import pytest
from omegaconf import OmegaConf

from lmcbench.cli import CONF_DIR

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.int8)]
LENGTHS = [0, 1, 7, 1001]
REPO = Path(__file__).resolve().parents[1]  # the checkout these tests are in


# ------------------------------------------------------------------------------------------------------------
# configuration files
# ------------------------------------------------------------------------------------------------------------

def group_options(group: str) -> list[str]:
    """Option names of a config group (the yaml files in conf/<group>/)."""
    return sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(CONF_DIR, group, "*.yaml")))


def option_content(group: str, name: str):
    """The content of conf/<group>/<name>.yaml as plain python."""
    return OmegaConf.to_container(OmegaConf.load(os.path.join(CONF_DIR, group, f"{name}.yaml")), resolve=True)


def codec_configs() -> dict[str, dict]:
    """Every codec option: name -> config (the content under its own name key)."""
    return {n: option_content("codec", n)[n] for n in group_options("codec")}


def pipeline_configs() -> dict[str, list]:
    return {n: option_content("pipeline", n)[n] for n in group_options("pipeline")}


def make_codec_or_skip(cfg: dict):
    """The codec of ``cfg``, skipping the test when its library is not installed."""
    from lmcbench.codecs import get_codec

    try:
        codec = get_codec(cfg)
        type(codec).check_installed()
    except ImportError as e:
        pytest.skip(f"codec {cfg['id']}: library not installed ({e})")
    return codec


# ------------------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------------------

def special_patterns(dtype) -> list[int]:
    """Bit patterns that must survive: NaNs (quiet/signalling, several payloads, both signs), +-Inf, subnormals,
    +-0 and the extremes."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return [0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7FFFFFFF, 0x7F800001, 0x7FA00000, 0xFF800001, 0x7FBFFFFF,
                0x7F800000, 0xFF800000, 0x00000001, 0x007FFFFF, 0x80000001, 0x807FFFFF, 0x80000000, 0x00000000,
                0x7F7FFFFF, 0xFF7FFFFF]
    if dtype == np.float16:
        return [0x7E00, 0xFE00, 0x7E01, 0x7FFF, 0x7C01, 0x7D00, 0xFC01, 0x7DFF, 0x7C00, 0xFC00, 0x0001, 0x03FF,
                0x8001, 0x83FF, 0x8000, 0x0000, 0x7BFF, 0xFBFF]
    if dtype == BF16:
        return [0x7FC0, 0xFFC0, 0x7FC1, 0x7FFF, 0x7F81, 0x7FA0, 0xFF81, 0x7FBF, 0x7F80, 0xFF80, 0x0001, 0x007F,
                0x8001, 0x807F, 0x8000, 0x0000, 0x7F7F, 0xFF7F]
    return [0x80, 0x7F, 0xFF, 0x00, 0x01]


def random_bits(n: int, dtype, seed: int = 0) -> np.ndarray:
    """``n`` random bit patterns viewed as ``dtype`` with the special patterns spread over the array."""
    dtype = np.dtype(dtype)
    u = np.dtype(f"<u{dtype.itemsize}")
    rng = np.random.default_rng([seed, n, dtype.itemsize, dtype.num])
    b = rng.integers(0, 1 << (8 * dtype.itemsize), n, dtype=u, endpoint=False)
    sp = np.array(special_patterns(dtype), dtype=u)
    if n:
        k = min(n, len(sp))
        pos = rng.choice(n, size=k, replace=False)
        b[pos] = sp[:k]
    return b.view(dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------------------------------------
# a tiny torch model and Trainer-like folders
# ------------------------------------------------------------------------------------------------------------

def tiny_model(seed=0):
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)  # weight (16, 8), bias (16,)
            self.norm = nn.LayerNorm(16)  # weight (16,), bias (16,)
            self.fc2 = nn.Linear(16, 4)  # weight (4, 16), bias (4,)

        def forward(self, x):
            return self.fc2(torch.relu(self.norm(self.fc1(x))))

    torch.manual_seed(seed)
    return Tiny()


PARAM_NAMES = ["fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"]
PARAM_SHAPES = {"fc1.weight": (16, 8), "fc1.bias": (16,), "norm.weight": (16,), "norm.bias": (16,),
                "fc2.weight": (4, 16), "fc2.bias": (4,)}


def train_steps(model, opt, n, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(5, 8, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


class Exploding:
    """Unpickling an instance would create ``marker``: proves a file was (or was not) unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def make_trainer_folder(root: Path, steps=(10, 20), named=True, weights="safetensors", marker=None,
                        bf16=False, model=None) -> dict:
    """A Hugging Face Trainer output folder under ``root``; returns {step: {"weights": {...}, "opt": state_dict}}.

    ``weights``: "safetensors", "sharded" or "bin". ``named``: AdamW built from named_parameters(). ``model``:
    what is trained (default :func:`tiny_model`; any module taking inputs of 8 features).
    """
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    model = tiny_model() if model is None else model
    opt = torch.optim.AdamW(model.named_parameters() if named else model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    out, done = {}, 0
    for step in steps:
        train_steps(model, opt, step - done, seed=step)
        sched.step()
        done = step
        d = root / f"checkpoint-{step}"
        d.mkdir()
        sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        if bf16:
            sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
        if weights == "safetensors":
            save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        elif weights == "sharded":
            names = list(sd)
            parts = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
            wm = {}
            for fn, ns in parts.items():
                save_file({n: sd[n] for n in ns}, str(d / fn), metadata={"format": "pt"})
                wm.update({n: fn for n in ns})
            (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}))
        elif weights == "bin":
            torch.save(sd, d / "pytorch_model.bin")
        else:
            raise ValueError(weights)
        osd = opt.state_dict()
        torch.save(osd, d / "optimizer.pt")
        torch.save(sched.state_dict(), d / "scheduler.pt")
        torch.save({"cpu": torch.get_rng_state(), "python": 1}, d / "rng_state.pth")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        with open(d / "training_args.bin", "wb") as f:
            pickle.dump(Exploding(marker or (root / "UNPICKLED")), f)
        out[step] = {"weights": sd, "opt": {k: {kk: vv.clone() for kk, vv in v.items()} for k, v in osd["state"].items()},
                     "param_groups": osd["param_groups"]}
    return out


def make_hf_cache(cache: Path, repo_id: str, revisions: dict) -> dict[str, str]:
    """A Hugging Face Hub cache folder laid out as ``huggingface_hub`` keeps one: ``models--ORG--NAME/`` with
    ``blobs/<sha256>`` (each file's content once), ``snapshots/<commit>/<file>`` relative links to the blobs and
    ``refs/<revision>`` holding the commit hash. ``revisions``: name -> a folder whose files are the revision's.
    Returns name -> commit hash."""
    import hashlib
    import shutil

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commits = {}
    for rev, folder in revisions.items():
        files = {p.relative_to(folder).as_posix(): p for p in sorted(Path(folder).rglob("*")) if p.is_file()}
        digests = {rel: hashlib.sha256(p.read_bytes()).hexdigest() for rel, p in files.items()}
        commit = hashlib.sha1(json.dumps([repo_id, rev, digests], sort_keys=True).encode()).hexdigest()
        for rel, digest in digests.items():
            blob = repo / "blobs" / digest
            if not blob.exists():
                blob.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(files[rel], blob)
            link = repo / "snapshots" / commit / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), link)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / rev).write_text(commit)  # no newline, as huggingface_hub writes it
        commits[rev] = commit
    return commits


def to_np(t) -> np.ndarray:
    from lmc.formats.torchfile import torch_to_numpy

    return torch_to_numpy(t)


# ------------------------------------------------------------------------------------------------------------
# the CLI
# ------------------------------------------------------------------------------------------------------------

def cli_env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LMCBENCH_DEBUG", "HYDRA_FULL_ERROR")}
    env["LMCBENCH_CACHE"] = str(cache)
    env["PYTHONWARNINGS"] = "ignore"
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def run_cli(args, cwd: Path, cache: Path, timeout=240, module="lmcbench"):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=str(cwd), env=cli_env(cache),
                          capture_output=True, text=True, timeout=timeout)


TINY_TRAIN = {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32, "batch_size": 4, "max_steps": 30,
              "save_steps": 10, "corpus_bytes": 200000}


def tiny_overrides() -> list[str]:
    return ["source=tinygpt"] + [f"source.train.{k}={v}" for k, v in TINY_TRAIN.items()]




def assert_one_line_error(excinfo, *needles):
    """A raised LmcbenchError whose message is one line holding each of ``needles``; returns the message."""
    from lmcbench.errors import LmcbenchError

    msg = str(excinfo.value)
    assert isinstance(excinfo.value, LmcbenchError)
    assert "\n" not in msg.strip(), msg
    for n in needles:
        assert str(n) in msg, f"{n!r} not in {msg!r}"
    return msg


def load_experiment(name: str):
    """The renderer ``experiments/<name>.py``, the module ``lmcbench.experiments.<name>``."""
    import importlib

    return importlib.import_module(f"lmcbench.experiments.{name}")
