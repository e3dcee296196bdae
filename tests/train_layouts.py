"""Real training runs on the CPU (two gloo ranks, two processes, no launcher) in the layouts large runs write.

    python tests/train_layouts.py LAYOUT OUT_DIR [--steps 6] [--save-every 2] [--out-json F]
    python tests/train_layouts.py LAYOUT SCRATCH_DIR --resume CKPT_DIR --out-json F [--steps 6] [--more 2]

LAYOUT:

``ds_zero2`` / ``ds_zero3``: a Hugging Face ``Trainer`` with DeepSpeed ZeRO-2 / ZeRO-3 (``TrainingArguments(
deepspeed=config)``, bf16 weights, a torch AdamW whose fp32 master weights and both moments DeepSpeed partitions
over the ranks) trains a small GPT-2 (5.1 M parameters); every ``save-every`` steps the Trainer writes
``OUT/checkpoint-<N>/`` with ``global_step<N>/`` (ZeRO-2: ``mp_rank_00_model_states.pt``; ZeRO-3:
``zero_pp_rank_<r>_mp_rank_00_model_states.pt``; both: ``bf16_zero_pp_rank_<r>_mp_rank_00_optim_states.pt``),
``latest``, ``zero_to_fp32.py``, ``model.safetensors`` (ZeRO-3: gathered at save), ``trainer_state.json``,
``scheduler.pt``, ``training_args.bin`` and ``rng_state_<r>.pth``.

``fsdp``: a ``Trainer`` with FSDP (Accelerate's FSDP plugin, FSDP2 ``fully_shard`` per GPT-2 block,
``SHARDED_STATE_DICT``, fp32): ``OUT/checkpoint-<N>/pytorch_model_fsdp_0/`` and ``optimizer_0/`` DCP folders
(``.metadata`` + ``__<rank>_0.distcp``), ``scheduler.pt``, ``trainer_state.json``, ``rng_state_<r>.pth``.

``titan``: torchtitan-style: a small Llama (3.7 M parameters) sharded with FSDP2 ``fully_shard`` per decoder
layer, AdamW and a linear-decay LambdaLR; ``dcp.save({"model", "optim" (flattened, as torchtitan's),
"lr_scheduler", "train_state"})`` into ``OUT/step-<N>/`` (``.metadata`` + ``__<rank>_0.distcp``).

Resume (``--resume CKPT_DIR``): the framework's own way: ``Trainer.train(resume_from_checkpoint=CKPT_DIR)``
(DeepSpeed's ``load_checkpoint`` / Accelerate's FSDP loader inside), ``dcp.load`` + ``set_state_dict`` for
titan; then ``more`` steps on the data the run would have seen next, with the LR schedule of a ``--steps`` run
(the step is read from the folder's name). ``--out-json`` gets the per-step losses of the steps trained (a list
per rank, exact: ``float.hex``) and a SHA-256 of the final full weights (gathered over the ranks; for DeepSpeed
also of the fp32 master weights, DeepSpeed's ``safe_get_full_fp32_param``), so two resumes can be compared bit
for bit, and a resume from step N with N + more = steps with the run itself. A resume saves nothing (the Trainer
gets SCRATCH_DIR as its output folder).

Deterministic: fixed seeds, no dropout, a sequential sampler over seeded data (titan: data seeded by step and
rank), one thread per rank. The Trainer runs need three small patches to run on the CPU with gloo, applied in the
worker processes only: DeepSpeed: Accelerate sees the gloo group DeepSpeed initialized (else the Trainer thinks
each rank is alone) and TrainingArguments accepts bf16 without a GPU; FSDP: Accelerate treats the gloo run as a
multi-device one whose device is the CPU (it enables FSDP for multi-GPU runs only). DeepSpeed runs with
``DS_ACCELERATOR=cpu`` and its shared-memory collective op marked unavailable, so no extension is compiled.
``LAYOUTS_DIM`` / ``LAYOUTS_TITAN_DIM`` set the widths (default 384 / 256).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import sys
import warnings

WORLD = 2
DIM = int(os.environ.get("LAYOUTS_DIM", "384"))
VOCAB, SEQ, BATCH, LAYERS = 4096, 32, 4, 2
TITAN_DIM = int(os.environ.get("LAYOUTS_TITAN_DIM", "256"))


def _env(rank: int, port: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD), LOCAL_SIZE=str(WORLD),
                      DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)


def _model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=DIM, n_layer=LAYERS, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def _data(n: int):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": r, "labels": r} for r in x]


def _ds_config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": stage, **({"stage3_gather_16bit_weights_on_model_save": True}
                                                    if stage == 3 else {})},
            "zero_allow_untested_optimizer": True}


def _accelerate_sees_gloo():
    """Accelerate picks no backend for DeepSpeed without a GPU (so the Trainer would think it is alone: world size
    1, every rank rank 0): let it see the gloo process group DeepSpeed already initialized, as a CPU run's."""
    import torch.distributed as dist
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    orig = PartialState._prepare_backend

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        b, kind = orig(self, cpu, sagemaker_dp, backend)
        if b is None and dist.is_initialized():
            return dist.get_backend(), DistributedType.MULTI_CPU
        return b, kind

    PartialState._prepare_backend = prepare_backend


def _accelerate_fsdp_on_cpu():
    """Accelerate only turns FSDP on for a multi-accelerator run (and the Trainer on the CPU is MULTI_CPU, never
    FSDP): let it see the gloo run as a multi-device one whose device is the CPU. FSDP2 itself shards on the CPU."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    orig = PartialState._prepare_backend

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        b, kind = orig(self, cpu, sagemaker_dp, backend)
        if b == "gloo" and kind == DistributedType.NO:
            return b, DistributedType.MULTI_GPU
        return b, kind

    PartialState._prepare_backend = prepare_backend


def _trainer(layout: str, out: str, steps: int, every: int, losses: list, stop_at: int | None = None):
    """A Trainer of `steps` steps (the LR schedule's length) saving every `every` steps (0: never), stopping after
    step `stop_at` (a resume: the same schedule as the run it resumes); `losses` gets each step's loss."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    kw = {}
    if layout.startswith("ds_"):
        import deepspeed
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo")  # before the Trainer's PartialState: gloo, not ccl
        _accelerate_sees_gloo()
        kw = {"deepspeed": _ds_config(int(layout[-1])), "bf16": True}
        # bf16 weights: TrainingArguments refuses bf16 without a GPU unless use_cpu (which turns DeepSpeed off);
        # DeepSpeed itself runs bf16 on the CPU
        import transformers.training_args
        transformers.training_args.is_torch_bf16_gpu_available = lambda: True
    else:  # fsdp: Accelerate's FSDP plugin (FSDP2), sharded state dicts
        _accelerate_fsdp_on_cpu()
        kw = {"ddp_backend": "gloo", "fsdp": True,
              "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["GPT2Block"],
                              "state_dict_type": "SHARDED_STATE_DICT", "reshard_after_forward": True,
                              "cpu_ram_efficient_loading": False}}

    class T(Trainer):
        def training_step(self, *a, **k):
            loss = super().training_step(*a, **k)
            losses.append(float(loss))  # this rank's, exact
            return loss

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if stop_at is not None and state.global_step >= stop_at:
                control.should_training_stop = True

    args = TrainingArguments(output_dir=out, max_steps=steps, save_steps=every or None,
                             save_strategy="steps" if every else "no",
                             per_device_train_batch_size=BATCH, learning_rate=3e-3, weight_decay=0.01,
                             warmup_steps=0, lr_scheduler_type="linear", max_grad_norm=1.0, logging_steps=1,
                             report_to=[], seed=0, data_seed=0, dataloader_num_workers=0,
                             train_sampling_strategy="sequential", disable_tqdm=True, save_only_model=False,
                             **kw)
    data = _data(12 * BATCH * WORLD)  # twelve steps' worth, then the next epoch
    return T(model=_model(), args=args, train_dataset=data, callbacks=[Stop()])


def _weights_sha(trainer, layout: str) -> dict:
    """SHA-256 of the full weights (every rank calls it: collective gathers)."""
    import torch

    h = hashlib.sha256()
    out = {}
    model = trainer.model_wrapped
    if layout.startswith("ds_"):
        import deepspeed
        from deepspeed.utils import safe_get_full_fp32_param

        m = model.module
        hm = hashlib.sha256()
        for name, p in m.named_parameters():
            with deepspeed.zero.GatheredParameters([p], enabled=layout == "ds_zero3"):
                h.update(name.encode() + p.detach().contiguous().view(torch.uint8).numpy().tobytes())
            hm.update(name.encode() + safe_get_full_fp32_param(p).contiguous().view(torch.uint8).numpy().tobytes())
        out["master_sha256"] = hm.hexdigest()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True))
        for k, v in sorted(sd.items()):
            h.update(k.encode() + v.detach().contiguous().view(torch.uint8).numpy().tobytes())
    out["weights_sha256"] = h.hexdigest()
    return out


def _titan_model():
    """A small Llama (torchtitan's model family), untied embeddings, FSDP2-sharded per decoder layer and at the
    root over the two ranks."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=TITAN_DIM, intermediate_size=TITAN_DIM * 11 // 4,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=SEQ, tie_word_embeddings=False, attention_dropout=0.0)
    m = LlamaForCausalLM(cfg)
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def _titan(rank: int, out: str, steps: int, every: int, resume: str | None, more: int, losses: list,
           out_json: str | None) -> dict:
    """torchtitan-style: dcp.save({"model", "optim", "lr_scheduler", "train_state"}) into OUT/step-<N>/ every
    `every` steps; a resume dcp.load()s a step folder into a fresh model and optimizer (set_state_dict) and trains
    `more` steps on the data the run would have seen next, with the same LR schedule."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    m = _titan_model()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    total = max(steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total))
    options = StateDictOptions(flatten_optimizer_state_dict=True)  # as torchtitan's OptimizersContainer

    def state(step):
        msd, osd = get_state_dict(m, opt, options=options)
        return {"model": msd, "optim": osd, "lr_scheduler": sched.state_dict(),
                "train_state": {"step": step}}

    first, last = 1, steps
    if resume:
        done = int(re.search(r"(\d+)$", os.path.basename(os.path.normpath(resume))).group(1))
        sd = state(0)
        dcp.load(sd, checkpoint_id=resume)
        set_state_dict(m, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"], options=options)
        sched.load_state_dict(sd["lr_scheduler"])
        assert sd["train_state"]["step"] == done, (sd["train_state"], done)
        first, last = done + 1, done + more
    for step in range(first, last + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)  # the data of a step, whatever ran before it
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        if not resume and every and step % every == 0:
            dcp.save(state(step), checkpoint_id=os.path.join(out, f"step-{step}"))
    if not resume and not out_json:
        return {}
    h = hashlib.sha256()
    for k, v in sorted(m.state_dict().items()):  # collective: every rank gathers the full tensors
        t = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(k.encode() + t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return {"weights_sha256": h.hexdigest()}


def _worker(rank: int, port: int, layout: str, out: str, steps: int, every: int, resume: str | None,
            out_json: str | None, more: int):
    _env(rank, port)
    losses: list = []
    if layout == "titan":
        res = _titan(rank, out, steps, every, resume, more, losses, out_json)
    elif resume:
        done = int(re.search(r"(\d+)$", os.path.basename(os.path.normpath(resume))).group(1))
        trainer = _trainer(layout, out, max(steps, done + more), 0, losses, stop_at=done + more)
        trainer.train(resume_from_checkpoint=resume)
        res = _weights_sha(trainer, layout)
    else:
        trainer = _trainer(layout, out, steps, every, losses)
        trainer.train()
        res = _weights_sha(trainer, layout) if out_json else {}
    import torch.distributed as dist

    every_rank = [None] * WORLD
    dist.all_gather_object(every_rank, [float.hex(x) for x in losses])
    if out_json and rank == 0:
        head = {"resumed_from": os.path.basename(os.path.normpath(resume))} if resume else {}
        with open(out_json, "w") as f:
            json.dump({"layout": layout, **head, "losses": every_rank, **res}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    # everything this rank writes is written: leave without the interpreter's shutdown, where a library's C++
    # thread still joinable at exit aborts the process ("terminate called without an active exception",
    # SIGABRT; seen once in CI after a ZeRO-3 resume had finished and written its results)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("layout", choices=["ds_zero2", "ds_zero3", "fsdp", "titan"])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--resume", metavar="CKPT_DIR")
    p.add_argument("--out-json")
    p.add_argument("--more", type=int, default=2, help="steps trained after a resume (default 2)")
    a = p.parse_args(argv)
    if a.resume and not a.out_json:
        p.error("--resume needs --out-json")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, a.layout, a.out, a.steps, a.save_every, a.resume, a.out_json, a.more),
             nprocs=WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
