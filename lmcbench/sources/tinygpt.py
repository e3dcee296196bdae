"""The embedded default series: a small GPT trained here, written as a Hugging Face Trainer folder.

A GPT-2-style decoder (byte-level vocabulary, learned positions, pre-norm blocks, GELU MLP) is trained with
PyTorch's AdamW on the Python standard library's own source files, a real text corpus present on every
machine, seeded, with a linear warm-up and cosine decay. Every ``save_steps`` steps it writes
``checkpoint-<step>/`` with ``model.safetensors`` (fp32), ``optimizer.pt`` (both Adam moments, parameter
names in the param groups), ``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json`` and ``config.json``.
The folder is cached under ``cache_dir`` keyed by a hash of the training options and reused when complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time

from ..errors import ConfigError, SourceError
from .hf_trainer import HFTrainerSource

TRAIN_DEFAULTS = dict(n_layer=2, n_embd=128, n_head=4, block_size=128, batch_size=16, max_steps=800,
                      save_steps=100, lr=1e-3, warmup_steps=80, min_lr_ratio=0.0, weight_decay=0.1,
                      betas=(0.9, 0.95), seed=0, corpus_bytes=4_000_000)
FORMAT_VERSION = 1


def default_cache_dir() -> str:
    return os.environ.get("LMCBENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmcbench")


class TinyGPTSource(HFTrainerSource):
    source_type = "tinygpt"

    def __init__(self, cache_dir=None, train=None, path=None, **kw):
        opts = dict(TRAIN_DEFAULTS)
        for k, v in dict(train or {}).items():
            if k not in TRAIN_DEFAULTS:
                raise ConfigError(f"source.train: unknown option {k!r}; known: {', '.join(TRAIN_DEFAULTS)}")
            want = type(TRAIN_DEFAULTS[k])
            if k == "betas":
                ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(b, (int, float)) for b in v)
                v = tuple(float(b) for b in v) if ok else v
            elif want is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                v = float(v) if ok else v
            else:
                ok = isinstance(v, want) and not isinstance(v, bool)
            if not ok:
                raise ConfigError(f"source.train.{k}: expected {want.__name__}, got {v!r}")
            opts[k] = v
        if min(opts[k] for k in ("n_layer", "n_embd", "n_head", "block_size", "batch_size", "max_steps",
                                 "corpus_bytes")) <= 0:
            raise ConfigError("source.train: sizes and step counts must be positive")
        if opts["n_embd"] % opts["n_head"]:
            raise ConfigError("source.train: n_embd must be a multiple of n_head")
        if opts["save_steps"] <= 0 or opts["max_steps"] < opts["save_steps"]:
            raise ConfigError("source.train: need 0 < save_steps <= max_steps")
        self.train_opts = opts
        key = hashlib.sha256(json.dumps({**opts, "v": FORMAT_VERSION}, sort_keys=True).encode()).hexdigest()[:12]
        root = os.path.expanduser(str(cache_dir)) if cache_dir else default_cache_dir()
        folder = path or os.path.join(root, f"tinygpt-{key}")
        super().__init__(path=folder, **kw)

    def describe(self):
        return f"tinygpt series at {self.path}"

    def _index(self):
        ensure_series(self.path, self.train_opts)
        return super()._index()


def ensure_series(folder: str, opts: dict) -> str:
    """Train and write the series into ``folder`` unless a complete one is there."""
    marker = os.path.join(folder, "lmcbench_series.json")
    if os.path.exists(marker):
        return folder
    parent = os.path.dirname(folder) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = train(tmp, opts)
        with open(os.path.join(tmp, "lmcbench_series.json"), "w") as f:
            json.dump({"options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items()}, **info},
                      f, indent=1)
        if os.path.exists(folder):  # an incomplete earlier attempt
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def corpus(nbytes: int) -> bytes:
    """The first ``nbytes`` of the standard library's ``.py`` files, in sorted path order."""
    root = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        if "site-packages" in dirpath or "test" in os.path.relpath(dirpath, root).split(os.sep)[0:1]:
            continue
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                try:
                    with open(os.path.join(dirpath, fn), "rb") as f:
                        b = f.read()
                except OSError:
                    continue
                parts.append(b)
                total += len(b)
                if total >= nbytes:
                    return b"".join(parts)[:nbytes]
    data = b"".join(parts)
    if len(data) < 100_000:
        raise SourceError(f"{root}: too little Python source for a training corpus ({len(data)} bytes)")
    return data


def build_model(opts):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln_1 = nn.LayerNorm(d)
            self.attn = nn.Module()
            self.attn.c_attn = nn.Linear(d, 3 * d)
            self.attn.c_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = nn.Module()
            self.mlp.c_fc = nn.Linear(d, 4 * d)
            self.mlp.c_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.attn.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.attn.c_proj(y)
            return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))

    class TinyGPT(nn.Module):
        def __init__(self, o):
            super().__init__()
            d = o["n_embd"]
            self.transformer = nn.Module()
            self.transformer.wte = nn.Embedding(256, d)
            self.transformer.wpe = nn.Embedding(o["block_size"], d)
            self.transformer.h = nn.ModuleList(Block(d, o["n_head"]) for _ in range(o["n_layer"]))
            self.transformer.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, 256, bias=False)
            for name, p in self.named_parameters():
                if name.endswith("weight") and p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * o["n_layer"]) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            t = idx.shape[1]
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
            for blk in self.transformer.h:
                x = blk(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return F.cross_entropy(logits.view(-1, 256), targets.reshape(-1))

    return TinyGPT(opts)


def lr_at(step: int, opts) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then cosine decay to ``min_lr_ratio``."""
    w, total = opts["warmup_steps"], opts["max_steps"]
    if step < w:
        return (step + 1) / w
    p = (step - w) / max(1, total - w)
    return opts["min_lr_ratio"] + (1 - opts["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def train(out_dir: str, opts: dict) -> dict:
    import numpy as np
    import torch
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    torch.manual_seed(opts["seed"])
    data = np.frombuffer(corpus(opts["corpus_bytes"]), np.uint8)
    split = int(len(data) * 0.95)
    train_data = torch.from_numpy(data[:split].astype(np.int64))
    val_data = torch.from_numpy(data[split:].astype(np.int64))
    model = build_model(opts)
    named = list(model.named_parameters())
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    nodecay = [(n, p) for n, p in named if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opts["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}], lr=opts["lr"], betas=tuple(opts["betas"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, opts))
    gen = torch.Generator().manual_seed(opts["seed"])
    bs, T = opts["batch_size"], opts["block_size"]

    def batch(src):
        ix = torch.randint(len(src) - T - 1, (bs,), generator=gen)
        x = torch.stack([src[i:i + T] for i in ix])
        y = torch.stack([src[i + 1:i + T + 1] for i in ix])
        return x, y

    os.makedirs(out_dir, exist_ok=True)
    log, t0 = [], time.time()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"lmcbench: training the tinygpt series ({n_params / 1e6:.2f}M parameters, {opts['max_steps']} steps, "
          f"a checkpoint every {opts['save_steps']}); cached for later runs", file=sys.stderr, flush=True)
    bar = tqdm(range(1, opts["max_steps"] + 1), desc=f"training tinygpt ({n_params / 1e6:.2f}M params)",
               unit="step", dynamic_ncols=True, disable=None)
    for step in bar:
        model.train()
        x, y = batch(train_data)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        if step % opts["save_steps"] == 0 or step == opts["max_steps"]:
            model.eval()
            with torch.no_grad():
                vx, vy = batch(val_data)
                val = model(vx, vy).item()
            log.append({"step": step, "loss": round(loss.item(), 4), "eval_loss": round(val, 4),
                        "learning_rate": sched.get_last_lr()[0]})
            _save_checkpoint(out_dir, step, model, opt, sched, opts, log, save_file)
    bar.close()
    print(f"lmcbench: trained in {time.time() - t0:.0f} s, final loss {log[-1]['loss']:.3f} "
          f"(eval {log[-1]['eval_loss']:.3f})", file=sys.stderr, flush=True)
    return {"n_params": n_params, "train_seconds": round(time.time() - t0, 1), "log_history": log}


def _save_checkpoint(out_dir, step, model, opt, sched, opts, log, save_file):
    import random

    import numpy as np
    import torch

    d = os.path.join(out_dir, f"checkpoint-{step}")
    os.makedirs(d, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()},
              os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
    torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               os.path.join(d, "rng_state.pth"))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "max_steps": opts["max_steps"], "save_steps": opts["save_steps"],
                   "log_history": log}, f, indent=1)
    cfg = {"model_type": "lmcbench-tinygpt", "architectures": ["TinyGPT"], "vocab_size": 256, "n_positions": opts["block_size"],
           "n_embd": opts["n_embd"], "n_layer": opts["n_layer"], "n_head": opts["n_head"], "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
