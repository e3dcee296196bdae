"""Real FSDP2 training on the CPU (two gloo processes), saving torchtitan-style DCP step folders, and resuming.

    python fsdp_train.py train OUT [--steps 6] [--save-every 2]
    python fsdp_train.py resume CKPT_DIR OUT_JSON [--more 3]

``train``: a small transformer-like model (embedding, two MLP blocks with LayerNorm, a head) is sharded with
``fully_shard`` over two ranks and trained with AdamW on seeded data; every ``save-every`` steps the model and
optimizer state (``get_state_dict``: DTensor shards) are saved with ``dcp.save`` into ``OUT/step-<N>/``
(``.metadata`` + ``__<rank>_0.distcp``), as torchtitan does. ``resume``: a fresh model and optimizer load the
folder with ``dcp.load`` + ``set_state_dict`` and train ``more`` steps on the data the run would have seen next;
``OUT_JSON`` gets the losses (exact floats) and a SHA-256 of the final full weights, so two resumes can be
compared bit for bit. Deterministic: fixed seeds, no dropout, one thread per rank. ``FSDP_TRAIN_DIM`` sets the width (default 256:
1.9 M parameters; 768: 12.6 M).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import sys

import torch

DIM, VOCAB, SEQ, BATCH = int(os.environ.get("FSDP_TRAIN_DIM", 256)), 2048, 16, 8


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, DIM),
        torch.nn.Sequential(torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                            torch.nn.Linear(4 * DIM, DIM)),
        torch.nn.Sequential(torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(),
                            torch.nn.Linear(4 * DIM, DIM)),
        torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB))


def _batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, torch.roll(x, -1, 1)


def _setup(rank, world, port):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    m = _model()
    for block in (m[1], m[2]):
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)
    return dist, m, opt


def _step(m, opt, step, rank):
    x, y = _batch(step, rank)
    loss = torch.nn.functional.cross_entropy(m(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def _state(m, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(m, opt)
    return {"model": msd, "optim": osd}


def _train(rank, world, port, out, steps, every):
    import torch.distributed.checkpoint as dcp

    dist, m, opt = _setup(rank, world, port)
    for step in range(1, steps + 1):
        _step(m, opt, step, rank)
        if step % every == 0:
            dcp.save(_state(m, opt), checkpoint_id=os.path.join(out, f"step-{step}"))
    _leave(dist)


def _leave(dist):
    """Every rank waits for the others, leaves the group, then the process at once (os._exit): the
    interpreter's shutdown can abort a rank ("terminate called without an active exception", SIGABRT) when a
    C++ thread is still joinable at exit, as CI saw after a resume had written its results. Everything the
    rank writes is written by now."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _full_sha(m):
    h = hashlib.sha256()
    for k, v in sorted(m.state_dict().items()):
        t = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(k.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _resume(rank, world, port, ckpt, out_json, more):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    dist, m, opt = _setup(rank, world, port)
    m(_batch(0, rank)[0]).sum().backward()  # the optimizer's state exists before it is loaded into
    opt.step()
    opt.zero_grad()
    state = _state(m, opt)
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(m, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    done = int(re.search(r"(\d+)$", os.path.basename(os.path.normpath(ckpt))).group(1))
    losses = [_step(m, opt, done + i, rank) for i in range(1, more + 1)]
    sha = _full_sha(m)
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump({"losses": [float.hex(x) for x in losses], "weights_sha256": sha}, f)
    _leave(dist)


def main(argv=None):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("out")
    t.add_argument("--steps", type=int, default=6)
    t.add_argument("--save-every", type=int, default=2)
    r = sub.add_parser("resume")
    r.add_argument("ckpt")
    r.add_argument("out_json")
    r.add_argument("--more", type=int, default=3)
    a = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if a.cmd == "train":
        torch.multiprocessing.spawn(_train, args=(2, port, a.out, a.steps, a.save_every), nprocs=2)
    else:
        torch.multiprocessing.spawn(_resume, args=(2, port, a.ckpt, a.out_json, a.more), nprocs=2)


if __name__ == "__main__":
    sys.exit(main())
