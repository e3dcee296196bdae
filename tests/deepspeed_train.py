"""Writes real DeepSpeed checkpoints on the CPU (gloo, no launcher): ``python deepspeed_train.py OUT MODE``.

``big-zero2`` / ``big-zero3``: the same with a 1024-wide hidden layer and a 1024 x 1024 one (1.05 M parameters),
steps 2-5 saved. ``OUT resume-<mode> TAG
JSON``: DeepSpeed's ``load_checkpoint(OUT, tag=TAG)`` and two more steps; JSON gets the losses and a SHA-256 of
the full fp32 master weights, to compare a resume from an original folder with one from a restored copy.

MODE ``zero2`` / ``zero3``: two data-parallel ranks (two processes) train a small model with two param groups
under ZeRO stage 2 / 3 with bf16 weights and a torch AdamW, and save ``global_step2`` and ``global_step3``. MODE ``pipeline``:
one process trains a GPT-NeoX-style pipeline module (ZeRO stage 1, bf16), whose weights DeepSpeed saves as
``layer_<XX>-model_states.pt`` files, with an ``args`` Namespace in the client state as NeoX and Megatron save
it, and saves ``global_step2``.

Beside them it writes ``OUT/truth.pt``: per step and parameter name, the module's weight and what DeepSpeed's
own API says the parameter's fp32 master weight and Adam moments are (``safe_get_full_fp32_param``,
``safe_get_full_optimizer_state``), so a reader's recovered names are checked against DeepSpeed, not against
itself. DeepSpeed's shared-memory collective op is marked unavailable (it only speeds up collectives, and
compiling it takes minutes on two cores), so no extension is compiled.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch


def _init(rank: int, world: int, port: int):
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def _truth(eng, named):
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    # DeepSpeed links each parameter to its optimizer state after the first group's first step, before the other
    # groups have state, and never again: link again now that every group has it (DeepSpeed's own linking)
    zero3 = not hasattr(eng.optimizer, "_lazy_init_hp_params_optimizer_state")
    if not zero3:
        eng.optimizer._hp_optimizer_states_linked = False
        eng.optimizer._lazy_init_hp_params_optimizer_state()
    out = {}
    for name, p in named:  # collective calls: every rank makes them
        # (ZeRO-3 saves the module's parameters empty: the weights a reader finds are the master weights)
        out[name] = {} if zero3 else {"weight": p.detach().clone()}
        out[name] |= {"master_weight": safe_get_full_fp32_param(p).clone(),
                     "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").clone(),
                     "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").clone()}
    return out


def _engine(deepspeed, stage, hidden=16):
    torch.manual_seed(0)
    inner = [torch.nn.Linear(hidden, hidden), torch.nn.GELU()] if hidden > 16 else []
    m = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.LayerNorm(hidden), *inner, torch.nn.Linear(hidden, 3))
    groups = [{"params": [p for p in m.parameters() if p.dim() > 1], "weight_decay": 0.1},
              {"params": [p for p in m.parameters() if p.dim() <= 1], "weight_decay": 0.0}]
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    eng, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.AdamW(groups, lr=1e-2), config=cfg)
    return eng


def _train_step(eng, step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)  # the data of a step, whatever ran before it
    loss = eng(torch.randn(2, 8, generator=g).bfloat16()).float().pow(2).mean()
    eng.backward(loss)
    eng.step()
    return float(loss.detach())


def zero2(rank: int, world: int, out: str, port: int, stage: int = 2, hidden: int = 16, steps: int = 3):
    deepspeed = _init(rank, world, port)
    eng = _engine(deepspeed, stage, hidden)
    truth = {}
    for step in range(1, steps + 1):
        _train_step(eng, step, rank)
        if step >= 2:
            eng.save_checkpoint(out, tag=f"global_step{step}")
            if hidden == 16:
                truth[step] = _truth(eng, eng.module.named_parameters())
    if rank == 0 and truth:
        torch.save(truth, os.path.join(out, "truth.pt"))
    _finish()


def _finish():
    """Every rank waits for the others, then leaves the group: a rank that exits while its peer's gloo thread
    still talks to it aborts that peer ("terminate called without an active exception", SIGABRT)."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # and leaves without the interpreter's shutdown, where a C++ thread still joinable at exit can abort it the
    # same way (everything the rank writes is written by now)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def resume(rank: int, world: int, root: str, tag: str, stage: int, hidden: int, out_json: str, port: int):
    """DeepSpeed's own load_checkpoint of `root/tag`, two more steps; rank 0 writes the losses and a SHA-256 of
    the full fp32 master weights (DeepSpeed's API) to out_json."""
    import hashlib
    import json

    from deepspeed.utils import safe_get_full_fp32_param

    deepspeed = _init(rank, world, port)
    eng = _engine(deepspeed, stage, hidden)
    eng.load_checkpoint(root, tag=tag)
    done = int(tag.removeprefix("global_step"))
    losses = [_train_step(eng, done + i, rank) for i in (1, 2)]
    h = hashlib.sha256()
    for name, p in eng.module.named_parameters():  # collective calls: every rank makes them
        h.update(name.encode() + safe_get_full_fp32_param(p).contiguous().view(torch.uint8).numpy().tobytes())
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump({"losses": [float.hex(x) for x in losses], "master_sha256": h.hexdigest()}, f)
    _finish()


class _Block(torch.nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.lin = torch.nn.Linear(a, b)
        self.norm = torch.nn.LayerNorm(b)

    def forward(self, x):
        return self.norm(self.lin(x))


def _loss(y, t):
    return (y.float() - t.float()).pow(2).mean()


def _double(x):
    return x * 2


def pipeline(out: str, port: int):
    deepspeed = _init(0, 1, port)
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    pm = PipelineModule(layers=[_Block(8, 16), _double, _Block(16, 16), torch.nn.Linear(16, 3)], num_stages=1,
                        loss_fn=_loss)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
    params = dict(pm.named_parameters())
    groups = [{"params": [p for n, p in params.items() if n.endswith("lin.weight") or n == "3.weight"]},
              {"params": [p for n, p in params.items() if not (n.endswith("lin.weight") or n == "3.weight")],
               "weight_decay": 0.0}]
    eng, *_ = deepspeed.initialize(model=pm, optimizer=torch.optim.AdamW(groups, lr=1e-2), config=cfg)
    g = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield torch.randn(2, 8, generator=g).bfloat16(), torch.randn(2, 3, generator=g)

    it = batches()
    for _ in range(2):
        eng.train_batch(it)
    eng.save_checkpoint(out, tag="global_step2", client_state={"args": argparse.Namespace(hidden_size=16)})
    torch.save({2: _truth(eng, pm.named_parameters())}, os.path.join(out, "truth.pt"))
    _finish()


def main():
    out, mode = sys.argv[1], sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if mode in ("zero2", "zero3"):
        torch.multiprocessing.spawn(zero2, args=(2, out, port, int(mode[-1])), nprocs=2)
    elif mode in ("big-zero2", "big-zero3"):  # wider, four checkpoints: tensors dominate the files
        torch.multiprocessing.spawn(zero2, args=(2, out, port, int(mode[-1]), 1024, 5), nprocs=2)
    elif mode.startswith("resume-"):  # OUT resume-<big-|>zero<2|3> TAG JSON
        kind = mode.removeprefix("resume-")
        hidden = 1024 if kind.startswith("big-") else 16
        torch.multiprocessing.spawn(resume, args=(2, out, sys.argv[3], int(kind[-1]), hidden, sys.argv[4], port),
                                    nprocs=2)
    elif mode == "pipeline":
        pipeline(out, port)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
