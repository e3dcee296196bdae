"""The tinygpt trainer: AdamW with a linear warm-up and cosine decay, seeded, checkpointing as a Hugging Face
Trainer does (``checkpoint-<step>/`` with ``model.safetensors``, ``optimizer.pt`` with parameter names in the
param groups, ``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``, ``config.json``; written by
:mod:`lmc.formats.trainer_write`).

:class:`Trainer` is the run, resumable: from a checkpoint folder (``Trainer.from_checkpoint``; the data
generator is put back by replaying its draws, so it works for series written before it existed), or with
weights and Adam moments swapped in by name (``load_state``), as the ExCP experiment does with reconstructed
checkpoints. :func:`train` is the whole run from scratch; :func:`evaluate` / :func:`eval_checkpoint` give a
deterministic held-out loss.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

from lmc.formats.safetensors import load_torch_weights
from lmc.formats.torchfile import load_torch_file
from lmc.formats.trainer_write import write_training_checkpoint
from ..errors import ConfigError, SourceError
from .config import TRAIN_DEFAULTS
from .corpus import corpus
from .model import build_model


def lr_at(step: int, opts) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then cosine decay to ``min_lr_ratio``."""
    w, total = opts["warmup_steps"], opts["max_steps"]
    if step < w:
        return (step + 1) / w
    p = (step - w) / max(1, total - w)
    return opts["min_lr_ratio"] + (1 - opts["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def train(out_dir: str, opts: dict, device: str = "cpu") -> dict:
    """Train the whole series from scratch, writing every checkpoint into ``out_dir``.

    ``device`` (a torch device name) only says where the arithmetic runs: checkpoints are written from CPU
    copies in the same layout. A series trained on an accelerator is a real series but not bit-identical to
    the CPU's, so it belongs in its own folder, never in the cache under the CPU series' key."""
    trainer = Trainer(opts, device=device)
    opts = trainer.opts
    t0 = time.time()
    n_params = trainer.n_params
    print(f"lmcbench: training the tinygpt series ({n_params / 1e6:.2f}M parameters, {opts['max_steps']} steps, "
          f"a checkpoint every {opts['save_steps']}); cached for later runs", file=sys.stderr, flush=True)
    os.makedirs(out_dir, exist_ok=True)
    log = trainer.train_until(opts["max_steps"], out_dir, progress=True)
    print(f"lmcbench: trained in {time.time() - t0:.0f} s, final loss {log[-1]['loss']:.3f} "
          f"(eval {log[-1]['eval_loss']:.3f})", file=sys.stderr, flush=True)
    return {"n_params": n_params, "train_seconds": round(time.time() - t0, 1), "log_history": log}


class Trainer:
    """The training run of :func:`train`, resumable: model, AdamW, LR schedule, data generator and step.

    ``Trainer(opts)`` starts fresh exactly as :func:`train` does (same seeding, so the same bits);
    ``Trainer.from_checkpoint(dir, opts)`` restores a ``checkpoint-<step>/`` folder, putting the data generator
    back by replaying its draws, so training on from there writes the same checkpoints as an uninterrupted run.
    ``gen`` (a ``torch.Generator``) draws both the training batches and, at each save step, one validation batch
    (logged as ``eval_loss``); :meth:`evaluate` uses fixed windows instead and never touches it.
    """

    def __init__(self, opts: dict, device: str = "cpu"):
        import numpy as np
        import torch

        opts = {**TRAIN_DEFAULTS, **opts}
        self.opts = opts
        torch.manual_seed(opts["seed"])
        data = np.frombuffer(corpus(opts["corpus_bytes"]), np.uint8)
        split = int(len(data) * 0.95)
        self.train_data = torch.from_numpy(data[:split].astype(np.int64))
        self.val_data = torch.from_numpy(data[split:].astype(np.int64))
        T = opts["block_size"]
        if len(self.val_data) < T + 2 or len(self.train_data) < T + 2:
            raise ConfigError(f"source.train: corpus_bytes={opts['corpus_bytes']} is too small for "
                              f"block_size={T} (the validation split is the last 5%)")
        self.model = build_model(opts)  # initialised on the CPU (same bits everywhere), then moved
        self.device = torch.device(device)
        self.model.to(self.device)
        named = list(self.model.named_parameters())
        decay = [(n, p) for n, p in named if p.dim() >= 2]
        nodecay = [(n, p) for n, p in named if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": opts["weight_decay"]},
                                      {"params": nodecay, "weight_decay": 0.0}],
                                     lr=opts["lr"], betas=tuple(opts["betas"]))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_at(s, opts))
        self.gen = torch.Generator().manual_seed(opts["seed"])
        self.step = 0
        self.log: list[dict] = []
        self.last_loss: float | None = None

    # ----------------------------------------------------------------------------------------- properties
    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def is_save_step(self, step: int) -> bool:
        return step % self.opts["save_steps"] == 0 or step == self.opts["max_steps"]

    def _draw(self, src):
        import torch

        T = self.opts["block_size"]
        return torch.randint(len(src) - T - 1, (self.opts["batch_size"],), generator=self.gen)

    def _batch(self, src):
        import torch

        T = self.opts["block_size"]
        ix = self._draw(src)
        x = torch.stack([src[i:i + T] for i in ix])
        y = torch.stack([src[i + 1:i + T + 1] for i in ix])
        return x.to(self.device), y.to(self.device)

    # ----------------------------------------------------------------------------------------- restoring
    @classmethod
    def from_checkpoint(cls, ckpt_dir: str, opts: dict, device: str = "cpu") -> "Trainer":
        """Restore weights, AdamW state, scheduler, step, log and data-generator state from ``ckpt_dir``;
        ``device`` says where the resumed run's arithmetic goes (as for :func:`train`).

        Only tensors and plain values are loaded (``weights_only=True``); ``rng_state.pth`` is not read (the
        training run draws nothing from the global RNGs after initialising the model).
        """

        ckpt_dir = os.path.abspath(os.path.expanduser(str(ckpt_dir)))
        if not os.path.isdir(ckpt_dir):
            raise SourceError(f"{ckpt_dir}: no such checkpoint folder")
        state_path = os.path.join(ckpt_dir, "trainer_state.json")
        try:
            with open(state_path) as f:
                tstate = json.load(f)
            step = int(tstate["global_step"])
            log = list(tstate.get("log_history", []))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SourceError(f"{state_path}: cannot read the trainer state ({type(e).__name__}: {e})") from None
        self = cls(opts, device=device)
        opts = self.opts
        for k in ("max_steps", "save_steps"):
            if k in tstate and tstate[k] != opts[k]:
                raise ConfigError(f"{state_path}: written with {k}={tstate[k]}, but the options say {opts[k]}")
        if not 0 <= step <= opts["max_steps"]:
            raise SourceError(f"{state_path}: global_step {step} is outside 0..max_steps={opts['max_steps']}")

        self._load_weights_file(os.path.join(ckpt_dir, "model.safetensors"))

        opt_path = os.path.join(ckpt_dir, "optimizer.pt")
        sd = load_torch_file(opt_path, "the optimizer state")
        try:
            self.opt.load_state_dict(sd)
        except Exception as e:  # noqa: BLE001 - any malformed state dict is a bad file
            raise SourceError(f"{opt_path}: not an AdamW state for this model ({type(e).__name__}: {e})") from None
        for name, p in self.model.named_parameters():
            st = self.opt.state.get(p, {})
            if step > 0 and not st:
                raise SourceError(f"{opt_path}: no Adam state for {name} (the checkpoint is at step {step})")
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st and tuple(st[k].shape) != tuple(p.shape):
                    raise SourceError(f"{opt_path}: {k} of {name} has shape {tuple(st[k].shape)}, "
                                      f"the model wants {tuple(p.shape)}")
            if "step" in st and int(float(st["step"])) != step:
                raise SourceError(f"{opt_path}: Adam step {int(float(st['step']))} for {name} does not match "
                                  f"global_step {step} in trainer_state.json")

        sched_path = os.path.join(ckpt_dir, "scheduler.pt")
        ssd = load_torch_file(sched_path, "the scheduler state")
        try:
            if not isinstance(ssd, dict) or int(ssd.get("last_epoch", -1)) != step:
                raise ValueError(f"last_epoch {ssd.get('last_epoch') if isinstance(ssd, dict) else ssd!r} "
                                 f"!= global_step {step}")
            self.sched.load_state_dict(ssd)
        except Exception as e:  # noqa: BLE001
            raise SourceError(f"{sched_path}: not a scheduler state for this run ({type(e).__name__}: {e})") from None

        # the data generator: replay every draw the training loop made up to and including ``step``
        for s in range(1, step + 1):
            self._draw(self.train_data)
            if self.is_save_step(s):
                self._draw(self.val_data)
        self.step = step
        self.log = log
        return self

    def _load_weights_file(self, path):
        self.load_state(load_torch_weights(path), None, None, what=path)

    # ----------------------------------------------------------------------------------------- training
    def train_until(self, step: int, out_dir: str | None = None, save: bool = True, progress: bool = False
                    ) -> list[dict]:
        """Train on to ``step`` (at most ``max_steps``), checkpointing into ``out_dir`` at every save step.

        At a save step the validation batch is drawn and the log extended whether or not ``save`` is set, so
        the data order does not depend on what is written. Returns the log (``self.log``).
        """
        import torch

        step = int(step)
        if step < self.step or step > self.opts["max_steps"]:
            raise ConfigError(f"train_until({step}): the trainer is at step {self.step}; "
                              f"the target must lie in {self.step}..{self.opts['max_steps']}")
        if save and not out_dir:
            raise ConfigError("train_until(save=True) needs out_dir")
        if save:
            os.makedirs(out_dir, exist_ok=True)
        model, opt, sched = self.model, self.opt, self.sched
        steps = range(self.step + 1, step + 1)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(steps, desc=f"training tinygpt ({self.n_params / 1e6:.2f}M params)", unit="step",
                       dynamic_ncols=True, disable=None, initial=self.step, total=self.opts["max_steps"])
            steps = bar
        for s in steps:
            model.train()
            x, y = self._batch(self.train_data)
            loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            self.step = s
            if bar is not None and s % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
            if self.is_save_step(s):
                self.last_loss = loss.item()
                model.eval()
                with torch.no_grad():
                    vx, vy = self._batch(self.val_data)
                    val = model(vx, vy).item()
                self.log.append({"step": s, "loss": round(self.last_loss, 4), "eval_loss": round(val, 4),
                                 "learning_rate": sched.get_last_lr()[0]})
                if save:
                    self.save_checkpoint(out_dir)
        if bar is not None:
            bar.close()
        return self.log

    def save_checkpoint(self, out_dir: str) -> str:
        """Write ``out_dir/checkpoint-<step>/`` (same files as the training run); returns its path."""
        o = self.opts
        state = {"global_step": self.step, "max_steps": o["max_steps"], "save_steps": o["save_steps"],
                 "log_history": self.log}
        config = {"model_type": "lmcbench-tinygpt", "architectures": ["TinyGPT"], "vocab_size": 256,
                  "n_positions": o["block_size"], "n_embd": o["n_embd"], "n_layer": o["n_layer"], "n_head": o["n_head"],
                  "torch_dtype": "float32"}
        model, opt = self.model, self.opt
        if self.device.type != "cpu":  # the files hold CPU tensors wherever training ran
            model, opt = _OnCPU(model), _OnCPU(opt)
        write_training_checkpoint(out_dir, self.step, model, opt, self.sched, state, config)
        return os.path.join(out_dir, f"checkpoint-{self.step}")

    # ----------------------------------------------------------------------------------------- state swap
    def state_arrays(self) -> tuple[dict, dict, dict]:
        """Copies of (weights, exp_avg, exp_avg_sq) as ``name -> np.ndarray`` (moments empty at step 0)."""
        weights, m, v = {}, {}, {}
        for name, p in self.model.named_parameters():
            weights[name] = p.detach().cpu().numpy().copy()
            st = self.opt.state.get(p, {})
            if "exp_avg" in st:
                m[name] = st["exp_avg"].detach().cpu().numpy().copy()
                v[name] = st["exp_avg_sq"].detach().cpu().numpy().copy()
        return weights, m, v

    def load_state(self, weights: dict | None, exp_avg: dict | None = None, exp_avg_sq: dict | None = None,
                   *, what: str = "load_state") -> None:
        """Replace parameters and Adam moments in place, matched by parameter name (``None`` keeps a part).

        Every parameter must be given (no more, no fewer names) with its exact shape; values are cast to the
        parameter dtype. Step counts, scheduler, data generator and log are left as they are. Everything is
        checked before anything is changed.
        """
        import numpy as np
        import torch

        params = dict(self.model.named_parameters())
        plan = []
        for label, given in (("weights", weights), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
            if given is None:
                continue
            if not isinstance(given, dict):
                raise SourceError(f"{what}: {label} must be a dict name -> array, got {type(given).__name__}")
            missing = [n for n in params if n not in given]
            unknown = [n for n in given if n not in params]
            if missing or unknown:
                parts = []
                if missing:
                    parts.append(f"missing {len(missing)} parameter(s): {', '.join(missing[:5])}"
                                 + (" ..." if len(missing) > 5 else ""))
                if unknown:
                    parts.append(f"unknown name(s) {', '.join(map(str, unknown[:5]))}"
                                 + (" ..." if len(unknown) > 5 else ""))
                raise SourceError(f"{what}: {label} does not match the model's parameters: {'; '.join(parts)}")
            for name, p in params.items():
                arr = given[name]
                try:
                    if isinstance(arr, torch.Tensor):
                        t = arr.detach().cpu()
                    else:  # a C-contiguous, writable numeric array (copied only when it is not one already)
                        a = np.require(np.asarray(arr), requirements=["C", "W"])
                        if a.dtype.kind not in "fiu":
                            raise TypeError(f"dtype {a.dtype} is not numeric")
                        t = torch.from_numpy(a)
                except (TypeError, ValueError) as e:
                    raise SourceError(f"{what}: {label} {name} is not a usable array ({e})") from None
                if tuple(t.shape) != tuple(p.shape):
                    raise SourceError(f"{what}: {label} {name} has shape {tuple(t.shape)}, "
                                      f"the model wants {tuple(p.shape)}")
                if label == "weights":
                    dst = p.data
                else:
                    st = self.opt.state.get(p, {})
                    if label not in st:
                        raise SourceError(f"{what}: the optimizer has no {label} for {name} yet "
                                          f"(step {self.step}); train at least one step first")
                    dst = st[label]
                plan.append((dst, t))
        with torch.no_grad():
            for dst, t in plan:
                dst.copy_(t.to(dst.dtype))


class _OnCPU:
    """A model or optimizer whose ``state_dict()`` has every tensor copied to the CPU (for writing files)."""

    def __init__(self, obj):
        self.obj = obj

    def state_dict(self):
        import torch

        def cpu(x):
            if isinstance(x, torch.Tensor):
                return x.detach().cpu()
            if isinstance(x, dict):
                return type(x)((k, cpu(v)) for k, v in x.items())
            if isinstance(x, (list, tuple)):
                return type(x)(cpu(v) for v in x)
            return x

        return cpu(self.obj.state_dict())


def evaluate(model, opts: dict, n_batches: int = 32, val_data=None) -> float:
    """Deterministic held-out loss: mean cross-entropy over fixed, evenly spaced validation windows.

    ``n_batches`` batches of ``batch_size`` windows of ``block_size`` tokens each, the window starts spread
    evenly over the validation split (the last 5% of the corpus). Uses no random generator; the model's
    train/eval mode is restored afterwards.
    """
    import numpy as np
    import torch

    opts = {**TRAIN_DEFAULTS, **opts}
    if val_data is None:
        data = np.frombuffer(corpus(opts["corpus_bytes"]), np.uint8)
        val_data = torch.from_numpy(data[int(len(data) * 0.95):].astype(np.int64))
    T, bs, n_batches = opts["block_size"], opts["batch_size"], int(n_batches)
    if n_batches <= 0:
        raise ConfigError(f"evaluate: n_batches must be positive, got {n_batches}")
    if len(val_data) < T + 2:
        raise ConfigError(f"evaluate: the validation split ({len(val_data)} tokens) is shorter than a window")
    starts = torch.from_numpy(np.linspace(0, len(val_data) - T - 1, n_batches * bs).round().astype(np.int64))
    offsets = torch.arange(T)
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        with torch.no_grad():
            for b in range(n_batches):
                idx = starts[b * bs:(b + 1) * bs, None] + offsets[None, :]
                total += float(model(val_data[idx].to(dev), val_data[idx + 1].to(dev)))
    finally:
        model.train(was_training)
    return total / n_batches


def eval_checkpoint(ckpt_dir: str, opts: dict, n_batches: int = 32) -> float:
    """:func:`evaluate` the weights in ``ckpt_dir/model.safetensors`` (global RNG state left untouched)."""
    import torch

    opts = {**TRAIN_DEFAULTS, **opts}
    path = os.path.join(os.path.expanduser(str(ckpt_dir)), "model.safetensors")
    tensors = load_torch_weights(path)
    with torch.random.fork_rng(devices=[]):
        model = build_model(opts)
    params = dict(model.named_parameters())
    if set(tensors) != set(params):
        raise SourceError(f"{path}: tensor names do not match a tinygpt with these options "
                          f"(missing {sorted(set(params) - set(tensors))[:5]}, "
                          f"unexpected {sorted(set(tensors) - set(params))[:5]})")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(tensors[name].shape) != tuple(p.shape):
                raise SourceError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, "
                                  f"these options give {tuple(p.shape)}")
            p.copy_(tensors[name])
    return evaluate(model, opts, n_batches)
