"""lmc.dcp on 2 ranks (torch.distributed, gloo on localhost, a free port chosen at run time): a model whose
parameters are DTensors sharded over the ranks, its AdamW state (get_state_dict), a bf16 tensor, a replicated
tensor and rank-distinct keys, saved with dcp.save and dcp.async_save (against the previous checkpoint) and
loaded back bit-exact on both ranks; then loaded again in this one process into whole tensors (resharded),
and a corrupt shard file fails with a clear error.

Run as a script (``python test_dcp_dist.py ROOT``) it is one rank of that job (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from the environment)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2


def model_and_optimizer(mesh):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32))
    for mod in m:
        for n, p in list(mod.named_parameters()):
            setattr(mod, n, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)])))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def rank_main(root):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    from lmc.dcp import LMCStorageReader, LMCStorageWriter

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (WORLD,))
    m, opt = model_and_optimizer(mesh)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))

    def step():
        opt.zero_grad()
        m(distribute_tensor(x, mesh, [Replicate()])).full_tensor().square().mean().backward()
        opt.step()

    def state():
        msd, osd = get_state_dict(m, opt)
        return {"model": msd, "optim": osd, "bf16": m[0].weight.detach().to(torch.bfloat16),  # a sharded DTensor
                "replicated": torch.arange(50, dtype=torch.float32), f"rank{rank}": torch.full((7,), float(rank)),
                "meta": {"step": int(osd["state"]["0.weight"]["step"])}}

    def local(obj):  # what this rank holds: DTensors as their local shards, cloned
        if isinstance(obj, DTensor):
            return obj.to_local().detach().clone()
        if isinstance(obj, torch.Tensor):
            return obj.detach().clone()
        if isinstance(obj, dict):
            return {k: local(v) for k, v in obj.items()}
        return obj

    def blank(obj):
        if isinstance(obj, DTensor):
            return DTensor.from_local(torch.zeros_like(obj.to_local()), obj.device_mesh, obj.placements,
                                      shape=obj.shape, stride=obj.stride())
        if isinstance(obj, torch.Tensor):
            return torch.zeros_like(obj)
        if isinstance(obj, dict):
            return {k: blank(v) for k, v in obj.items()}
        return obj if not isinstance(obj, int) else -1

    def check(expect, got, path=""):
        if isinstance(expect, torch.Tensor):
            assert expect.dtype == got.dtype and expect.shape == got.shape, path
            assert expect.reshape(-1).view(torch.uint8).equal(got.reshape(-1).view(torch.uint8)), f"{path} differs"
        elif isinstance(expect, dict):
            assert expect.keys() == got.keys(), path
            for k in expect:
                check(expect[k], got[k], f"{path}.{k}")
        else:
            assert expect == got, (path, expect, got)

    expected, full = {}, {}
    for n in (1, 2, 3):
        step()
        sd = state()
        expected[n] = local(sd)
        full[n] = {f"model.{k}": v.full_tensor() for k, v in sd["model"].items()}
        full[n]["bf16"] = sd["bf16"].full_tensor()
        full[n].update({f"optim.state.{p}.{k}": v.full_tensor() for p, st in sd["optim"]["state"].items()
                        for k, v in st.items() if isinstance(v, DTensor)})
        path = os.path.join(root, f"step-{n}")
        ref = os.path.join(root, f"step-{n - 1}") if n > 1 else None
        if n == 3:
            fut = dcp.async_save(sd, storage_writer=LMCStorageWriter(path, reference=ref, threads=1))
            fut.result()
        else:
            dcp.save(sd, storage_writer=LMCStorageWriter(path, reference=ref, threads=1))
        if n == 1:  # the same state as a keyframe, for the size comparison
            dcp.save(sd, storage_writer=LMCStorageWriter(os.path.join(root, "key-1"), threads=1))
    dist.barrier()
    for n in (1, 2, 3):
        sd = state()
        target = blank(sd)
        dcp.load(target, storage_reader=LMCStorageReader(os.path.join(root, f"step-{n}")))
        check(expected[n], local(target), f"step-{n}")
    if rank == 0:
        torch.save({n: {k: v.detach().clone() for k, v in f.items()} for n, f in full.items()},
                   os.path.join(root, "full.pt"))
        with open(os.path.join(root, "ok-0"), "w") as f:
            f.write("ok")
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(root, timeout=240):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    procs = []
    try:
        for r in range(WORLD):
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), str(root)],
                                          env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append(out.decode(errors="replace"))
        return [p.returncode for p in procs], outs
    finally:
        for p in procs:  # each rank is its own process group: end it and anything it started
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    pytest.importorskip("torch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    root = tmp_path_factory.mktemp("dist")
    codes, outs = run_ranks(root)
    assert codes == [0] * WORLD, "\n".join(o[-3000:] for o in outs)
    assert (root / "ok-0").exists()
    return root


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


@pytest.mark.slow
def test_two_ranks_save_load_async_and_reference(two_rank_run):
    root = two_rank_run
    # the latest is coded alone; each earlier one was re-coded (by both ranks, into new files) against the next
    for n, gen in ((1, 1), (2, 1), (3, 0)):
        names = sorted(os.listdir(root / f"step-{n}"))
        assert names == [".metadata", f"__0_{gen}.lmc", f"__1_{gen}.lmc", "lmc-metadata.json"], names
    with open(root / "step-1" / "lmc-metadata.json") as f:
        md = json.load(f)
    assert md["reference"]["path"] == "../step-2"
    chunks = md["state_dict_metadata"]["model.0.weight"]["chunks"]
    assert sorted(c[0] for c in chunks) == [[0, 0], [48, 0]]  # each rank wrote its half
    files = {i["file"] for i in md["items"] if i["fqn"] == "model.0.weight"}
    assert files == {"__0_1.lmc", "__1_1.lmc"}
    assert {i["fqn"] for i in md["items"]} >= {"rank0", "rank1", "replicated", "bf16", "meta.step",
                                               "optim.state.0.weight.exp_avg"}
    assert sum(1 for i in md["items"] if i["fqn"] == "replicated") == 1  # written once
    assert any(i["ref"] for i in md["items"])
    # step 1 coded against step 2 is smaller than step 1 coded alone
    assert folder_bytes(root / "step-1") < folder_bytes(root / "key-1")


@pytest.mark.slow
def test_two_rank_checkpoint_loads_whole_in_one_process(two_rank_run, tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from lmc.dcp import LMCStorageReader

    root = two_rank_run
    full = torch.load(root / "full.pt", weights_only=True)
    for n in (1, 3):
        target = {k: torch.zeros_like(v) for k, v in full[n].items()}
        dcp.load(target, storage_reader=LMCStorageReader(root / f"step-{n}"), no_dist=True)
        for k, v in full[n].items():
            assert v.view(torch.uint8).equal(target[k].view(torch.uint8)), (n, k)
    # one flipped byte in rank 1's file of step 3 (a reference of steps 2 and 1) is caught when step 1 loads
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("full.pt"))
    p = copy / "step-3" / "__1_0.lmc"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    target = {k: torch.zeros_like(v) for k, v in full[1].items()}
    with pytest.raises(CheckpointException) as ei:
        dcp.load(target, storage_reader=LMCStorageReader(copy / "step-1"), no_dist=True)
    assert "step-3/__1_0.lmc: item" in str(ei.value)


if __name__ == "__main__":
    rank_main(sys.argv[1])
    # leave without the interpreter's shutdown, where a C++ thread still joinable at exit can abort the rank
    # ("terminate called without an active exception") after its work is done
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
