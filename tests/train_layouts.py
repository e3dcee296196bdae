"""Real training runs on the CPU (two gloo ranks, two processes, no launcher) in the layouts large runs write.

    python tests/train_layouts.py LAYOUT OUT_DIR [--steps 6] [--save-every 2]
    python tests/train_layouts.py LAYOUT OUT_DIR --resume CKPT_DIR --out-json F [--more 2]

LAYOUT:

``ds_zero2`` / ``ds_zero3``: a Hugging Face ``Trainer`` with DeepSpeed ZeRO-2 / ZeRO-3 (``TrainingArguments(deepspeed=
config)``, bf16 weights, a torch AdamW whose fp32 master weights and both moments DeepSpeed partitions over the
ranks) trains a small GPT-2; every ``save-every`` steps the Trainer writes ``OUT/checkpoint-<N>/`` with
``global_step<N>/`` (``mp_rank_00_model_states.pt``, ``bf16_zero_pp_rank_<r>_mp_rank_00_optim_states.pt``),
``latest``, ``zero_to_fp32.py``, ``model.safetensors``, ``trainer_state.json`` and per-rank RNG states.

``fsdp``: a ``Trainer`` with FSDP (Accelerate's FSDP plugin, FSDP2 ``fully_shard`` per GPT-2 block,
``SHARDED_STATE_DICT``): ``OUT/checkpoint-<N>/pytorch_model_fsdp_0/`` and ``optimizer_0/`` DCP folders of
``__<rank>_0.distcp`` shards, besides the Trainer's own files.

``titan``: torchtitan-style: an FSDP2 ``fully_shard`` model and AdamW, ``dcp.save({"model": ..., "optim": ...})``
into ``OUT/step-<N>/`` (``.metadata`` + ``__<rank>_0.distcp``); ``fsdp_train.py`` does the work.

Resume (``--resume CKPT_DIR``): the framework's own way: ``Trainer.train(resume_from_checkpoint=CKPT_DIR)``
(DeepSpeed's ``load_checkpoint`` / Accelerate's FSDP loader inside), ``dcp.load`` for titan; then ``more`` steps
on the data the run would have seen next. ``--out-json`` gets the per-step losses of the resumed steps (each
rank's, exact: ``float.hex``) and a SHA-256 of the final full weights (gathered over the ranks; for DeepSpeed
also of the fp32 master weights), so two resumes can be compared bit for bit. OUT_DIR is the new run's output
folder (the Trainer writes its later checkpoints there).

Deterministic: fixed seeds, no dropout, a sequential sampler over seeded data, one thread per rank.
DeepSpeed runs with ``DS_ACCELERATOR=cpu`` and its shared-memory collective op marked unavailable, so no
extension is compiled. ``LAYOUTS_DIM`` sets the GPT-2 width (default 256: 3.2 M parameters).
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

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
DIM = int(os.environ.get("LAYOUTS_DIM", 384))
VOCAB, SEQ, BATCH, LAYERS = 4096, 32, 4, 2


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


def _worker(rank: int, port: int, layout: str, out: str, steps: int, every: int, resume: str | None,
            out_json: str | None, more: int):
    _env(rank, port)
    losses: list = []
    if resume:
        done = int(re.search(r"(\d+)$", os.path.basename(os.path.normpath(resume))).group(1))
        trainer = _trainer(layout, out, max(steps, done + more), 0, losses, stop_at=done + more)
        trainer.train(resume_from_checkpoint=resume)
        res = _weights_sha(trainer, layout)
    else:
        trainer = _trainer(layout, out, steps, every, losses)
        trainer.train()
        res = {}
    import torch.distributed as dist

    every_rank = [None] * WORLD
    dist.all_gather_object(every_rank, [float.hex(x) for x in losses])
    if out_json and rank == 0:
        head = {"resumed_from": os.path.basename(os.path.normpath(resume))} if resume else {}
        with open(out_json, "w") as f:
            json.dump({"layout": layout, **head, "losses": every_rank, **res}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


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
    if a.layout == "titan" and not a.resume and a.out_json:
        p.error("titan: --out-json only with --resume")
    if a.layout == "titan":
        os.environ.setdefault("FSDP_TRAIN_DIM", str(DIM))  # 384: 3.9 M parameters (tensors >99% of a step)
        sys.path.insert(0, HERE)
        import fsdp_train

        if a.resume:
            return fsdp_train.main(["resume", a.resume, a.out_json, "--more", str(a.more)])
        return fsdp_train.main(["train", a.out, "--steps", str(a.steps), "--save-every", str(a.save_every)])
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, a.layout, a.out, a.steps, a.save_every, a.resume, a.out_json, a.more),
             nprocs=WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
