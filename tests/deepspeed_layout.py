"""DeepSpeed ZeRO stage 1/2 checkpoint folders built by the tests with ``torch.save``, in the layout DeepSpeed's
``engine.save_checkpoint`` writes (see :mod:`lmc.formats.deepspeed`), so that the source is tested
where DeepSpeed is not installed. ``tests/deepspeed_train.py`` writes real ones with DeepSpeed itself.

The numbers are a real training run: a small model trained with AdamW in fp32 (the master weights), the module
saved in bf16 (the master weights cast, as DeepSpeed copies them back), each param group's master weights and
moments flattened in group order, padded to a multiple of 2 x ranks, cut into equal rank partitions, the
master partitions saved without the end padding and the moments with it (as ZeRO 1/2 save them). DeepSpeed's own
classes in those files (the loss scaler, the ZeRO stage enum, the fragment addresses of
``param_slice_mappings``) are pickled under DeepSpeed's module paths, as real files name them.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import sys
import types
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

from lmcbench_testlib import to_np

STEPS = (10, 20, 30)
WORLD = 2
# the model's parameters by group: weights with decay, then biases and the norm (the usual split)
GROUPS = (("0.weight", "2.weight"), ("0.bias", "1.weight", "1.bias", "2.bias"))
OPTIM_FILE = "bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))


# ------------------------------------------------------------------------- DeepSpeed's classes, as pickled
class LossScaler:
    def __init__(self, scale=1.0):
        self.cur_scale = scale
        self.dynamic = False


class DynamicLossScaler(LossScaler):
    pass


ZeroStageEnum = enum.IntEnum("ZeroStageEnum", {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3})


@dataclasses.dataclass
class fragment_address:  # noqa: N801 - DeepSpeed's name
    numel: int
    start: int


_CLASSES = {LossScaler: "deepspeed.runtime.fp16.loss_scaler", DynamicLossScaler: "deepspeed.runtime.fp16.loss_scaler",
            ZeroStageEnum: "deepspeed.runtime.zero.config", fragment_address: "deepspeed.utils.tensor_fragment"}


@contextmanager
def deepspeed_names():
    """While saving, the classes above live at DeepSpeed's module paths (stand-in modules in ``sys.modules``),
    so a file names them as DeepSpeed's files do."""
    mods = {}
    for cls, path in _CLASSES.items():
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            mods.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        setattr(mods[path], cls.__name__, cls)
    saved = {c: (c.__module__, c.__qualname__) for c in _CLASSES}
    try:
        with mock.patch.dict(sys.modules, mods):
            for cls, path in _CLASSES.items():
                cls.__module__ = path
            yield
    finally:
        for c, (m, q) in saved.items():
            c.__module__, c.__qualname__ = m, q


# ------------------------------------------------------------------------------------------------ builder
def _partitions(flat: torch.Tensor, world: int) -> tuple[list, list]:
    """The flat group padded to a multiple of 2 x world, cut into ``world`` equal partitions; and each rank's
    padding (the part of its partition past the group's end)."""
    n = flat.numel()
    total = math.ceil(n / (2 * world)) * 2 * world
    padded = torch.cat([flat, flat.new_zeros(total - n)])
    size = total // world
    parts = list(padded.split(size))
    pads = [max(0, min(size, (r + 1) * size - n)) for r in range(world)]
    return parts, pads


def build(root: Path, steps=STEPS, world: int = WORLD, shapes: str = "ok", pipeline: bool = False,
          slice_maps: bool = True, client_state: dict | None = None, legacy: bool = False) -> dict:
    """``root/global_step<N>/`` folders (and a ``latest`` file); returns ``step -> {(name, kind): array}``.

    ``shapes``: "ok", "missing" (no param_shapes) or "wrong" (one shape off, so the sizes do not add up).
    ``pipeline``: weights in GPT-NeoX layer files instead of ``module``. ``client_state``: extra items of the
    model-states file (e.g. an ``args`` Namespace). ``legacy``: the ZeRO-1 layout of DeepSpeed before 0.4 (and
    GPT-NeoX's DeeperSpeed, the Pythia checkpoints): each group's buffer cut into ranks x 2 sub-partitions, rank r
    holding sub-partitions r and ranks + r (``local_sub_partitions_of_fp32_groups``), fp16 weights, and
    ``shapes="flat"`` for one param_shapes dict over both groups as those versions save it."""
    m = model()
    params = dict(m.named_parameters())
    groups = [[params[n] for n in g] for g in GROUPS]
    opt = torch.optim.AdamW([{"params": groups[0], "weight_decay": 0.1},
                             {"params": groups[1], "weight_decay": 0.0}], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    root.mkdir(parents=True, exist_ok=True)
    truth, done = {}, 0
    for step in steps:
        for _ in range(step - done):
            opt.zero_grad()
            m(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
            opt.step()
        done = step
        d = root / f"global_step{step}"
        d.mkdir()
        wdt = torch.float16 if legacy else torch.bfloat16
        module = OrderedDict((k, v.detach().to(wdt).clone()) for k, v in m.state_dict().items())
        t = {(k, "weight"): to_np(v).copy() for k, v in module.items()}
        for name, p in params.items():
            t[(name, "master_weight")] = to_np(p.detach()).copy()
            for key in ("exp_avg", "exp_avg_sq"):
                t[(name, key)] = to_np(opt.state[p][key]).copy()
        truth[step] = t
        param_shapes = [OrderedDict((n, params[n].shape) for n in grp) for grp in GROUPS]
        if shapes == "flat":
            param_shapes = OrderedDict((n, params[n].shape) for grp in GROUPS for n in grp)
        if shapes == "wrong":
            param_shapes[1]["2.bias"] = torch.Size([4])
        states = {"module": None if pipeline else module, "buffer_names": [], "optimizer": None,
                  "param_shapes": None if shapes == "missing" else param_shapes, "frozen_param_shapes": None,
                  "shared_params": {}, "lr_scheduler": None, "global_steps": step, "global_samples": 4 * step,
                  "dp_world_size": world, "mp_world_size": 1, "ds_version": "0.19.8", **(client_state or {})}
        with deepspeed_names():
            torch.save(states, d / "mp_rank_00_model_states.pt")
            if pipeline:
                for idx in (0, 1, 2):
                    torch.save(OrderedDict((k.split(".", 1)[1], v) for k, v in module.items()
                                           if k.startswith(f"{idx}.")), d / f"layer_{idx:02d}-model_00-model_states.pt")
            (_save_legacy if legacy else _save_optimizer)(d, opt, groups, world, slice_maps, step)
        (root / "latest").write_text(f"global_step{step}")
    return truth


def _save_optimizer(d: Path, opt, groups, world: int, slice_maps: bool, step: int) -> None:
    per_group = []
    for gi, grp in enumerate(groups):
        flat = {"master": torch.cat([p.detach().reshape(-1) for p in grp])}
        for key in ("exp_avg", "exp_avg_sq"):
            flat[key] = torch.cat([opt.state[p][key].reshape(-1) for p in grp])
        per_group.append({k: _partitions(v, world) for k, v in flat.items()})
    for r in range(world):
        masters, pads, base_state, maps = [], [], {}, []
        for gi, grp in enumerate(groups):
            parts, gpads = per_group[gi]["master"]
            pads.append(gpads[r])
            masters.append(parts[r][:parts[r].numel() - gpads[r]].clone())  # the end padding left out
            base_state[gi] = {"step": step, **{k: per_group[gi][k][0][r].clone() for k in ("exp_avg", "exp_avg_sq")}}
            size, start, fm = parts[r].numel(), 0, OrderedDict()
            for name, p in zip(GROUPS[gi], grp):
                lo, hi = max(start, r * size), min(start + p.numel(), r * size + size)
                if lo < hi:
                    fm[name] = fragment_address(numel=hi - lo, start=lo - r * size)
                start += p.numel()
            maps.append(fm)
        osd = {"loss_scaler": LossScaler(), "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0,
               "base_optimizer_state": {"state": base_state, "param_groups": [
                   {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": wd, "params": [gi]}
                   for gi, wd in enumerate((0.1, 0.0))]},
               "single_partition_of_fp32_groups": masters, "zero_stage": ZeroStageEnum.gradients,
               "group_paddings": pads, "param_alignment_paddings": [[0] * len(grp) for grp in groups],
               "partition_count": [world] * len(groups), "ds_version": "0.19.8"}
        if slice_maps:
            osd["param_slice_mappings"] = maps
        torch.save({"optimizer_state_dict": osd, "ds_config": {"zero_optimization": {"stage": 2}},
                    "ds_version": "0.19.8"}, d / OPTIM_FILE.format(r=r))


def load_built(path):
    """A file :func:`build` wrote, unpickled whole with the classes above (the test's own file)."""
    with deepspeed_names():
        return torch.load(path, weights_only=False)


def save_built(obj, path) -> None:
    with deepspeed_names():
        torch.save(obj, path)


def _save_legacy(d: Path, opt, groups, world: int, slice_maps: bool, step: int, intervals: int = 2) -> None:
    subs = []
    for grp in groups:
        flat = {"master": torch.cat([p.detach().reshape(-1) for p in grp])}
        for key in ("exp_avg", "exp_avg_sq"):
            flat[key] = torch.cat([opt.state[p][key].reshape(-1) for p in grp])
        size = math.ceil(math.ceil(flat["master"].numel() / world) / intervals)
        subs.append({k: list(torch.cat([v, v.new_zeros(size * world * intervals - v.numel())]).split(size))
                     for k, v in flat.items()})
    for r in range(world):
        mine = [[sub["master"][i * world + r].clone() for i in range(intervals)] for sub in subs]
        base = [[{"exp_avg": sub["exp_avg"][i * world + r].clone(), "exp_avg_sq": sub["exp_avg_sq"][i * world + r]
                  .clone()} for i in range(intervals)] for sub in subs]
        osd = {"loss_scaler": DynamicLossScaler(2.0 ** 12), "dynamic_loss_scale": True, "overflow": False,
               "base_optimizer_state": base, "zero_stage": 1, "partition_count": world,
               "num_comm_intervals_per_group": [intervals] * len(groups), "local_sub_partitions_of_fp32_groups": mine}
        torch.save({"optimizer_state_dict": osd}, d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")


def straddling(world: int = WORLD) -> list[str]:
    """The parameters whose master weights lie in more than one rank's partition."""
    out = []
    m = model()
    p = dict(m.named_parameters())
    for grp in GROUPS:
        n = sum(p[x].numel() for x in grp)
        size = math.ceil(n / (2 * world)) * 2 * world // world
        start = 0
        for x in grp:
            if start // size != (start + p[x].numel() - 1) // size:
                out.append(x)
            start += p[x].numel()
    return out

