"""Hugging Face Trainer output folders, read: ``checkpoint-<step>/`` with weights and ``optimizer.pt``.

Weights: ``model.safetensors``, sharded ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, or ``pytorch_model.bin`` (sharded with its index too). Optimizer:
``optimizer.pt`` holding AdamW state keyed by integer slot in param-group order, mapped to parameter names by
:func:`slot_names`. RNG, scheduler, trainer-state and training-args files are never opened here
(``training_args.bin`` is a pickle).
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict

import numpy as np

from .errors import ConfigError, SourceError
from .safetensors import safetensors_metadata, safetensors_refs
from .tensors import MOMENTS, TensorRef, load_checked
from .torchfile import load_optimizer, optimizer_refs, state_dict_refs, torch_state_dict, torch_to_numpy

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# the step folders training tools write: the Trainer and Accelerate (checkpoint-<N>), DeepSpeed's engine
# (global_step<N>), torchtitan (step-<N>), others (step<N>)
STEP_FOLDER_RE = re.compile(r"^(checkpoint-|global_step|step-|step)(\d+)$")


def step_of(folder) -> int | None:
    """The step in a step folder's name (``checkpoint-400``, ``global_step400``, ``step-400``), or None."""
    m = STEP_FOLDER_RE.match(os.path.basename(os.path.normpath(os.fspath(folder))))
    return int(m.group(2)) if m else None


def step_folders(run_dir) -> list[tuple[int, str]]:
    """``[(step, name)]`` of the step folders directly under run_dir, ascending; two folders for one step
    (``checkpoint-4`` and ``step-4``) are a one-line error: which one is the step is not clear."""
    found = {}
    for n in sorted(os.listdir(run_dir)):
        m = STEP_FOLDER_RE.match(n)
        if m and os.path.isdir(os.path.join(run_dir, n)):
            s = int(m.group(2))
            if s in found:
                raise SourceError(f"{run_dir}: two folders for step {s}: {found[s]}, {n}")
            found[s] = n
    return sorted(found.items())
OPTIMIZER_FILE = "optimizer.pt"
_NO_DECAY = re.compile(r"(bias|norm|ln_\d*|ln_f|layernorm)", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------- steps
def parse_steps(steps, what: str = "source.steps") -> list[int] | None:
    """A step selection as a list of integers (one integer or string accepted); None keeps every step."""
    if steps is None:
        return None
    steps = [steps] if isinstance(steps, (int, str)) else steps
    try:
        return [int(s) for s in steps if not isinstance(s, bool)]
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a list of integers, got {steps!r}") from None


def list_checkpoints(path: str) -> list[tuple[int, str]]:
    """``[(step, folder)]`` in step order: the ``checkpoint-<step>/`` folders of a Trainer output folder, or
    the folder itself when it is one."""
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such folder")
    if not os.path.isdir(path):
        raise SourceError(f"{path}: not a folder (source=hf_trainer wants a Trainer output_dir; "
                          "use source=files for single files)")
    m = CHECKPOINT_RE.match(os.path.basename(path))
    if m:  # pointed at one checkpoint folder
        return [(int(m.group(1)), path)]
    found = []
    for d in os.listdir(path):
        m = CHECKPOINT_RE.match(d)
        if m and os.path.isdir(os.path.join(path, d)):
            found.append((int(m.group(1)), os.path.join(path, d)))
    if not found:
        raise SourceError(f"{path}: no checkpoint-<step>/ folders (is this a Trainer output_dir?)")
    return sorted(found)


# --------------------------------------------------------------------------------------------- weights
def shard_files(index_path: str) -> list[str]:
    """The shard files a ``*.index.json`` names, in order, each inside the checkpoint folder."""
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


def weight_refs(d: str) -> tuple[list[TensorRef], list | None]:
    """The weight tensors of one checkpoint folder and, when the file keeps it, the parameters' registration
    order ``[(name, shape)]`` (a ``pytorch_model.bin``'s; None for safetensors)."""
    st, st_index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
    pt, pt_index = os.path.join(d, "pytorch_model.bin"), os.path.join(d, "pytorch_model.bin.index.json")
    if os.path.exists(st):
        return safetensors_refs([st]), None
    if os.path.exists(st_index):
        return safetensors_refs(shard_files(st_index)), None
    if os.path.exists(pt) or os.path.exists(pt_index):
        refs = [r for p in ([pt] if os.path.exists(pt) else shard_files(pt_index)) for r in state_dict_refs(p)]
        return refs, [(r.name, tuple(r.shape)) for r in refs]
    raise SourceError(f"{d}: no model weights (model.safetensors, its sharded index, or pytorch_model.bin)")


def folder_optimizer_refs(d: str, weights: list[TensorRef], order) -> list[TensorRef]:
    """The moments (and other per-parameter tensors) in ``d/optimizer.pt``, named by :func:`slot_names`."""
    path = os.path.join(d, OPTIMIZER_FILE)
    opt = load_optimizer(path)
    if order is None:
        order = model_order(d)
    return optimizer_refs(path, opt, slot_names(opt, weights, order))


# ---------------------------------------------------------------------------------------- slot naming
def slot_names(opt: dict, weights: list, order) -> dict:
    """Map optimizer slots to parameter names where the order can be recovered.

    1. ``param_names`` in the param groups (PyTorch >= 2.6 optimizers built from ``named_parameters()``).
    2. The parameters' registration order — from a ``pytorch_model.bin``, or from the model class named in
       ``config.json`` built on PyTorch's meta device when ``transformers`` is installed (no weights are read
       or downloaded) — split as the HF Trainer splits parameters into a decay and a no-decay group; accepted
       only if every slot's shape matches.
    3. Otherwise a slot is named after the one parameter with its shape, if exactly one has it; the rest
       keep ``slot<k>`` (a wrong name is worse than none).

    ``weights``: anything with ``name`` and ``shape`` (the weight tensors).
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


# ------------------------------------------------------------------------------- whole checkpoints
def _checkpoint_dir(d) -> str:
    d = os.path.abspath(os.path.expanduser(str(d)))
    list_checkpoints(d)  # the same one-line errors as a listing for a missing folder or a file
    return d


def load_triples(ckpt_dir: str) -> dict:
    """name -> {weight, exp_avg, exp_avg_sq} (writable numpy copies) of one checkpoint folder, the moments
    matched to parameters by name; parameters without a weight and other optimizer tensors are left out."""
    d = _checkpoint_dir(ckpt_dir)
    weights, order = weight_refs(d)
    refs = weights + (folder_optimizer_refs(d, weights, order) if os.path.exists(os.path.join(d, OPTIMIZER_FILE))
                      else [])
    if not refs:
        raise SourceError(f"{d}: no tensors found")
    out: dict[str, dict] = {}
    for r in refs:
        if r.kind in ("weight", *MOMENTS):
            out.setdefault(r.name, {"weight": None, "exp_avg": None, "exp_avg_sq": None})[r.kind] = \
                np.array(load_checked(r.load, r.name, r.dtype, r.shape, r.file, d))
    return {k: v for k, v in out.items() if v["weight"] is not None}


def read_checkpoint(d: str) -> tuple[dict, dict, dict | None]:
    """``(tensors, weights_layout, optimizer_skeleton)`` of one checkpoint folder, for a writer that gives it
    back (:func:`lmc.formats.trainer_write.write_checkpoint_folder`).

    tensors: name -> {"weight", "exp_avg", "exp_avg_sq"} (numpy, read-only views where possible), the moments
    matched to parameters with :func:`slot_names`; layout: the weight files, their format, the shard index
    used, the safetensors metadata and every tensor's dtype, shape and file; skeleton: see
    :mod:`lmc.formats.optimizer_json` (None without an ``optimizer.pt``).
    """
    from .dtypes import dtype_name
    from .optimizer_json import split_optimizer

    d = _checkpoint_dir(d)
    wents, _ = weight_refs(d)
    if not wents:
        raise SourceError(f"{d}: no tensors found")
    files = list(dict.fromkeys(e.file for e in wents))
    fmt = "safetensors" if all(f.endswith(".safetensors") for f in files) else "torch"
    weights: dict[str, np.ndarray] = {}
    bins = {}
    for e in wents:
        if e.name in weights:
            raise SourceError(f"{e.file}: tensor {e.name!r} appears twice in the weights")
        if fmt == "safetensors":
            weights[e.name] = load_checked(e.load, e.name, e.dtype, e.shape, e.file, d)
        else:
            if e.file not in bins:
                bins[e.file] = torch_state_dict(e.file)
            weights[e.name] = torch_to_numpy(bins[e.file][e.name])
    metadata = safetensors_metadata(files[0]) if fmt == "safetensors" and len(files) == 1 else None
    index = None
    single = {"safetensors": "model.safetensors", "torch": "pytorch_model.bin"}[fmt]
    if [os.path.basename(f) for f in files] != [single] and os.path.exists(os.path.join(d, single + ".index.json")):
        index = single + ".index.json"
    file_of = {e.name: os.path.basename(e.file) for e in wents}
    layout = {
        "format": fmt,
        "files": [os.path.basename(f) for f in files],
        "index": index,
        "metadata": metadata,
        "tensors": {n: {"dtype": dtype_name(a.dtype), "shape": list(a.shape), "file": file_of[n]}
                    for n, a in weights.items()},
    }
    tensors = {n: {"weight": a, "exp_avg": None, "exp_avg_sq": None} for n, a in weights.items()}

    opt_path = os.path.join(d, OPTIMIZER_FILE)
    if not os.path.exists(opt_path):
        return tensors, layout, None
    opt = load_optimizer(opt_path)
    order = [(e.name, tuple(e.shape)) for e in wents] if fmt == "torch" else model_order(d)
    return tensors, layout, split_optimizer(opt, slot_names(opt, wents, order), tensors, opt_path)


def replaced_files(layout: dict) -> set[str]:
    """Names (in the checkpoint folder) of the files :func:`read_checkpoint`'s tensors and skeleton stand for:
    the weight files the weights were read from, the shard index that was used, and optimizer.pt."""
    names = set(layout["files"]) | {OPTIMIZER_FILE}
    if layout.get("index"):
        names.add(layout["index"])
    return names
