"""Hugging Face Trainer output folders: ``checkpoint-<step>/`` with weights and ``optimizer.pt``.

Weights: ``model.safetensors``, sharded ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, or ``pytorch_model.bin`` (sharded with its index too). Optimizer:
``optimizer.pt`` holding AdamW state keyed by integer slot in param-group order. RNG, scheduler,
trainer-state and training-args files are skipped (``training_args.bin`` is a pickle and is never opened).
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict

from ..errors import SourceError
from . import Source, TensorEntry
from .readers import (safetensors_index, safetensors_load, torch_dtype_to_numpy, torch_load, torch_state_dict,
                      torch_to_numpy)

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_NO_DECAY = re.compile(r"(bias|norm|ln_\d*|ln_f|layernorm)", re.IGNORECASE)
_MOMENT_KINDS = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}


class HFTrainerSource(Source):
    source_type = "hf_trainer"

    def __init__(self, path=None, **kw):
        super().__init__(**kw)
        if not path:
            raise SourceError("source=hf_trainer needs source.path=DIR (a Trainer output folder)")
        self.path = os.path.abspath(os.path.expanduser(str(path)))

    def describe(self):
        return self.path

    def checkpoints(self) -> list[tuple[int, str]]:
        if not os.path.exists(self.path):
            raise SourceError(f"{self.path}: no such folder")
        if not os.path.isdir(self.path):
            raise SourceError(f"{self.path}: not a folder (source=hf_trainer wants a Trainer output_dir; "
                              "use source=files for single files)")
        m = CHECKPOINT_RE.match(os.path.basename(self.path))
        if m:  # pointed at one checkpoint folder
            return [(int(m.group(1)), self.path)]
        found = []
        for d in os.listdir(self.path):
            m = CHECKPOINT_RE.match(d)
            if m and os.path.isdir(os.path.join(self.path, d)):
                found.append((int(m.group(1)), os.path.join(self.path, d)))
        if not found:
            raise SourceError(f"{self.path}: no checkpoint-<step>/ folders (is this a Trainer output_dir?)")
        return sorted(found)

    def _index(self):
        entries = []
        for step, d in self.checkpoints():
            if self.steps is not None and step not in self.steps:
                # still listed (so a missing step can be reported) but not opened
                entries.append(TensorEntry(step, "", "weight", None, (), lambda: None, d))
                continue
            weights, order = self._weights(step, d)
            entries.extend(weights)
            opt = os.path.join(d, "optimizer.pt")
            if os.path.exists(opt) and (self.kinds is None or set(self.kinds) - {"weight"}):
                entries.extend(self._optimizer(step, opt, weights, order))
        return entries  # with the unopened steps' placeholders (name ''), so missing steps can be named

    # -- weights ---------------------------------------------------------------------------------------
    def _weights(self, step, d):
        """Weight entries and, when the file keeps it, the parameters' registration order."""
        st, st_index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
        pt, pt_index = os.path.join(d, "pytorch_model.bin"), os.path.join(d, "pytorch_model.bin.index.json")
        if os.path.exists(st):
            return self._safetensors(step, [st]), None
        if os.path.exists(st_index):
            return self._safetensors(step, self._shards(st_index)), None
        if os.path.exists(pt):
            return self._torch_weights(step, [pt])
        if os.path.exists(pt_index):
            return self._torch_weights(step, self._shards(pt_index))
        raise SourceError(f"{d}: no model weights (model.safetensors, its sharded index, or pytorch_model.bin)")

    @staticmethod
    def _shards(index_path):
        try:
            with open(index_path) as f:
                wm = json.load(f)["weight_map"]
            files = list(OrderedDict.fromkeys(wm.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SourceError(f"{index_path}: not a valid shard index ({e})") from None
        d = os.path.dirname(index_path)
        for f in files:
            if os.path.basename(f) != f:
                raise SourceError(f"{index_path}: shard name {f!r} points outside the checkpoint folder")
        return [os.path.join(d, f) for f in files]

    def _safetensors(self, step, files):
        out = []
        for path in files:
            for name, (dt, shape, b, e) in safetensors_index(path).items():
                out.append(TensorEntry(step, name, "weight", dt, shape,
                                       lambda p=path, dt=dt, s=shape, b=b, e=e: safetensors_load(p, dt, s, b, e), path))
        return out

    def _torch_weights(self, step, files):
        out, order = [], []
        for path in files:
            sd = torch_state_dict(path)
            for name, t in sd.items():
                order.append((name, tuple(t.shape)))
                out.append(TensorEntry(step, name, "weight", torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                       lambda p=path, n=name: torch_to_numpy(torch_state_dict(p)[n]),
                                       path))
        return out, order

    # -- optimizer -------------------------------------------------------------------------------------
    def _load_opt(self, path):
        obj = torch_load(path)
        if not (isinstance(obj, dict) and isinstance(obj.get("state"), dict)
                and isinstance(obj.get("param_groups"), list)):
            raise SourceError(f"{path}: not an optimizer state dict (no 'state' and 'param_groups')")
        return obj

    def _optimizer(self, step, path, weights, order):
        import torch

        opt = self._load_opt(path)
        if order is None:
            order = model_order(os.path.dirname(path))
        names = slot_names(opt, weights, order)
        out = []
        for slot, st in opt["state"].items():
            if not isinstance(st, dict):
                continue
            for key, t in st.items():
                if not isinstance(t, torch.Tensor) or t.dim() == 0:
                    continue  # the per-parameter 'step' counter
                kind = _MOMENT_KINDS.get(key, "other")
                name = names.get(slot, f"slot{slot}")
                if kind == "other":
                    name = f"{name}.{key}"
                out.append(TensorEntry(step, name, kind, torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                       lambda s=slot, k=key: torch_to_numpy(self._load_opt(path)["state"][s][k]),
                                       path))
        return out


def slot_names(opt: dict, weights: list[TensorEntry], order) -> dict:
    """Map optimizer slots to parameter names where the order can be recovered.

    1. ``param_names`` in the param groups (PyTorch >= 2.6 optimizers built from ``named_parameters()``).
    2. The parameters' registration order — from a ``pytorch_model.bin``, or from the model class named in
       ``config.json`` built on PyTorch's meta device when ``transformers`` is installed (no weights are read
       or downloaded) — split as the HF Trainer splits parameters into a decay and a no-decay group; accepted
       only if every slot's shape matches.
    3. Otherwise a slot is named after the one parameter with its shape, if exactly one has it; the rest
       keep ``slot<k>`` (a wrong name is worse than none).
    """
    import torch

    groups = opt["param_groups"]
    state = opt["state"]

    def shape(slot):
        st = state.get(slot, {})
        t = st.get("exp_avg") if isinstance(st, dict) else None
        return tuple(t.shape) if isinstance(t, torch.Tensor) else None

    out = {}
    if all(isinstance(g, dict) and isinstance(g.get("param_names"), list)
           and len(g["param_names"]) == len(g.get("params", [])) for g in groups):
        for g in groups:
            out.update(zip(g["params"], g["param_names"]))
        return out
    if order:
        order = [(o[0], o[1], o[2] if len(o) > 2 else bool(_NO_DECAY.search(o[0]))) for o in order]
        decay = [n for n, _, nd in order if not nd]
        nodecay = [n for n, _, nd in order if nd]
        shapes = {n: sh for n, sh, _ in order}
        for cand in ([decay, nodecay], [[n for n, _, _ in order]]):
            if len(cand) != len(groups):
                continue
            trial = {}
            ok = True
            for g, names in zip(groups, cand):
                params = g.get("params", [])
                if len(params) != len(names):
                    ok = False
                    break
                for slot, n in zip(params, names):
                    if shape(slot) not in (None, shapes[n]):
                        ok = False
                    trial[slot] = n
            if ok:
                return trial
    by_shape: dict[tuple, list[str]] = {}
    for e in weights:
        by_shape.setdefault(tuple(e.shape), []).append(e.name)
    for slot in state:
        cands = by_shape.get(shape(slot), [])
        if len(cands) == 1:
            out[slot] = cands[0]
    return out


_ORDER_CACHE: dict[str, list | None] = {}


def model_order(checkpoint_dir: str):
    """``[(name, shape, no_decay)]`` in ``named_parameters()`` order for the model in ``config.json``, built on
    the meta device with ``transformers`` (if installed); None when that is not possible."""
    cfg_path = os.path.join(checkpoint_dir, "config.json")
    try:
        with open(cfg_path) as f:
            text = f.read()
        arch = (json.loads(text).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError):
        return None
    if not arch:
        return None
    if text in _ORDER_CACHE:
        return _ORDER_CACHE[text]
    order = None
    try:
        import importlib.util

        if importlib.util.find_spec("transformers") is not None:
            import torch
            import transformers

            cls = getattr(transformers, arch, None)
            if cls is not None:
                level = transformers.logging.get_verbosity()
                transformers.logging.set_verbosity_error()
                try:
                    config = transformers.AutoConfig.from_pretrained(checkpoint_dir, local_files_only=True)
                    with torch.device("meta"):
                        model = cls(config)
                finally:
                    transformers.logging.set_verbosity(level)
                norm_params = set()
                for mname, mod in model.named_modules():
                    if "norm" in type(mod).__name__.lower():
                        norm_params.update(f"{mname}.{p}" if mname else p for p, _ in mod.named_parameters(recurse=False))
                order = [(n, tuple(p.shape), n in norm_params or "bias" in n) for n, p in model.named_parameters()]
    except Exception:  # noqa: BLE001 - any failure means the order cannot be recovered; slots stay unnamed
        order = None
    _ORDER_CACHE[text] = order
    return order
