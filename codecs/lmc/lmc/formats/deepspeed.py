"""DeepSpeed checkpoint folders (``engine.save_checkpoint``, ZeRO stages 0-3), read one tensor at a time.

A checkpoint folder (``global_step<N>/``) holds, per model-parallel rank ``<mm>``:

- ``mp_rank_<mm>_model_states.pt``: ``module`` (the model's state dict in its training dtype: bf16, fp16 or
  fp32), ``param_shapes`` (per optimizer param group, the optimized parameters' names and shapes in the order
  they lie in the group's flat buffer), ``buffer_names``, ``ds_version`` and the client state;
- with a pipeline module (GPT-NeoX) ``module`` is None and each layer's weights are in
  ``layer_<XX>[-model_<mm>]-model_states.pt``, named ``<XX>.<key>`` as the pipeline module registers them;
- per data-parallel rank ``r``, ``[bf16_|fp16_]zero_pp_rank_<r>_mp_rank_<mm>_optim_states.pt`` holding
  ``optimizer_state_dict``: ``zero_stage``, ``partition_count``, ``single_partition_of_fp32_groups`` (rank
  r's slice of each group's flat fp32 master weights), ``base_optimizer_state`` (the wrapped optimizer's state
  of those flat slices: Adam's ``exp_avg`` and ``exp_avg_sq``), ``group_paddings``,
  ``param_alignment_paddings`` and, in recent versions, ``param_slice_mappings``. DeepSpeed before 0.4 (and
  GPT-NeoX's DeeperSpeed, which wrote the Pythia checkpoints) saved ZeRO-1 as ``local_sub_partitions_of_fp32_groups``:
  each group's buffer cut into ranks x intervals equal sub-partitions, rank r holding sub-partition
  ``interval * ranks + r`` of each interval, with one optimizer state per sub-partition and the buffer padded at
  its end to whole intervals.

Names: a group's flat buffer is its ranks' slices in rank order; the parameters lie in it in ``param_shapes``
order, each followed by its alignment padding (``param_alignment_paddings``), and the buffer ends in padding up
to a multiple of the ranks' alignment, which ZeRO 1/2 leaves out of the saved master slices but not of the
moments, and the bf16 optimizer keeps (``group_paddings`` says how much each rank holds). When the sizes add up
exactly, agree with ``param_slice_mappings`` where the file has them and with the module's shapes, master
weights and moments are cut back into parameters named as in the model; otherwise each rank's slice is one
tensor named ``group<g>.offset<k>`` (``k``: where it starts in the group's buffer) - never a guessed name. That
is also the case when ``param_shapes`` is one dict for several groups (old versions: it does not say which
parameter is in which group).

Kinds: ``module`` (or layer) tensors are ``weight`` (buffers named in ``buffer_names`` and non-floating tensors
``other``), fp32 master slices ``master_weight``, the moments ``exp_avg`` / ``exp_avg_sq``, any other
per-element optimizer state ``other`` named ``<param>.<key>``. ZeRO stage 3 (per-rank
``zero_pp_rank_<r>_mp_rank_<mm>_model_states.pt``, ``fp32_flat_groups``): see :func:`zero3_refs`.

Pickles: every file is read with ``torch.load(weights_only=True)``, memory-mapped (zip format). DeepSpeed pickles
a few classes of its own that hold plain values - the loss scaler, the ZeRO stage enum, the fragment addresses of
``param_slice_mappings`` - and these are built as :class:`Inert` records by torch's weights-only unpickler (no
code of DeepSpeed's or the file's runs; DeepSpeed need not be installed). Any other global (a NeoX/Megatron
``args`` Namespace, numpy RNG state) gets the file refused with one line naming the globals, unless
``trust_pickle``: then it is loaded with ``weights_only=False``, which runs code from the file, after a warning.
"""

from __future__ import annotations

import math
import os
import re

from ._deepspeed_read import (KNOWN_GLOBALS, MASTER, _GLOBAL_RE, _INERT, DeepSpeedReader, Inert,  # noqa: F401
                              _buffer, _field, _flat, _group_slices, _int, _is_tensors, _optimizer_state,
                              _overlaps, _Rank, _rank, _shape, _Slice, _tensors, layout)
from .errors import SourceError
from .fileio import one_line
from .tensors import MOMENTS, TensorRef
from .torchfile import flatten_tensors, torch_dtype_to_numpy, torch_to_numpy

MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
LAYER_RE = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")
OPTIM_RE = re.compile(r"^(?:(?:bf16|fp16)_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
ZERO3_MODEL_RE = re.compile(r"^(?:(?:bf16|fp16)_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
NEEDS = "mp_rank_<mm>_model_states.pt"


# ------------------------------------------------------------------------------------------------- index
def deepspeed_format(d: str) -> bool:
    """Whether ``d`` looks like a DeepSpeed checkpoint folder (it has model-states files)."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return any(MODEL_RE.match(n) or ZERO3_MODEL_RE.match(n) for n in names)


def deepspeed_refs(d: str, reader: DeepSpeedReader) -> list[TensorRef]:
    """Every tensor of one DeepSpeed checkpoint folder: weights, fp32 master weights and optimizer state."""
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        raise SourceError(f"{d}: {one_line(e)}") from None
    if any(ZERO3_MODEL_RE.match(n) for n in names):
        return zero3_refs(d, names, reader)
    models, layers, optims = {}, {}, {}
    for n in names:
        if m := MODEL_RE.match(n):
            models[int(m.group(1))] = os.path.join(d, n)
        elif m := LAYER_RE.match(n):
            layers.setdefault(int(m.group(2) or 0), []).append((int(m.group(1)), os.path.join(d, n)))
        elif m := OPTIM_RE.match(n):
            rank, mp = int(m.group(1)), int(m.group(2))
            if rank in optims.setdefault(mp, {}):
                raise SourceError(f"{d}: two optimizer files for rank {rank}: {os.path.basename(optims[mp][rank])} "
                                  f"and {n}")
            optims[mp][rank] = os.path.join(d, n)
    mps = sorted(set(models) | set(layers) | set(optims))
    if not mps:
        raise SourceError(f"{d}: not a DeepSpeed checkpoint (no {NEEDS})")
    out = []
    for mp in mps:
        if mp not in models:
            raise SourceError(f"{d}: mp_rank_{mp:02d}_model_states.pt missing (other files of model-parallel rank "
                              f"{mp} are there)")
        prefix = f"mp{mp}." if len(mps) > 1 else ""
        weights, shapes = _model_refs(models[mp], sorted(layers.get(mp, [])), prefix, reader)
        out += weights
        out += _optimizer_refs(d, optims.get(mp, {}), shapes, {r.name[len(prefix):]: r.shape for r in weights},
                               prefix, reader)
    return out


def _model_refs(path: str, layer_files: list, prefix: str, reader: DeepSpeedReader) -> tuple[list, list | None]:
    """The weights of one model-parallel rank (``module`` or the pipeline's layer files) and its
    ``param_shapes`` (a list per group; None when the file has none)."""
    obj = reader.load(path)
    if not isinstance(obj, dict):
        raise SourceError(f"{path}: expected a dict of model states, found {type(obj).__name__}")
    buffers = {str(b) for b in obj.get("buffer_names") or []}
    module = obj.get("module")
    sources = []  # (file, key function, state dict)
    if isinstance(module, dict) and module:
        sources.append((path, lambda o: o.get("module"), module, ""))
    else:
        for idx, f in layer_files:
            sources.append((f, lambda o: o, reader.load(f), f"{idx}."))
    refs = []
    for f, get, sd, lp in sources:
        if not isinstance(sd, dict):
            raise SourceError(f"{f}: expected a state dict, found {type(sd).__name__}")
        for key, t in flatten_tensors(sd).items():
            name = lp + key
            kind = "weight" if t.is_floating_point() and t.dim() > 0 and name not in buffers else "other"
            refs.append(TensorRef(prefix + name, kind, torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                  lambda f=f, get=get, k=key: torch_to_numpy(_state_dict(reader, f, get)[k]), f))
    shapes = obj.get("param_shapes")
    if isinstance(shapes, dict):
        shapes = [shapes]  # DeepSpeed before param groups: one dict
    return refs, shapes if isinstance(shapes, list) else None


def _state_dict(reader, f, get) -> dict:
    sd = get(reader.load(f))
    if not isinstance(sd, dict):
        raise SourceError(f"{f}: no state dict in it any more")
    return flatten_tensors(sd)


def _optimizer_refs(d: str, files: dict, shapes, weight_shapes: dict, prefix: str, reader) -> list[TensorRef]:
    if not files:
        return []
    ranks = [_rank(reader.load(files[r]), files[r]) for r in sorted(files)]
    counts = {r.partition_count for r in ranks if r.partition_count}
    count = max(counts) if counts else max(files) + 1
    missing = [r for r in range(count) if r not in files]
    if len(counts) > 1 or missing or len(files) != count:
        example = os.path.basename(files[min(files)])
        raise SourceError(f"{d}: ZeRO rank file(s) missing or extra: partition_count {sorted(counts) or '?'}, rank "
                          f"files for {sorted(files)} (e.g. {example}), missing {missing}")
    ngroups = {len(r.groups) for r in ranks}
    if len(ngroups) != 1:
        raise SourceError(f"{d}: the ranks' optimizer files have different numbers of param groups {sorted(ngroups)}")
    (ngroups,) = ngroups
    if shapes is not None and len(shapes) != ngroups:
        shapes = None  # param_shapes that do not match the groups name nothing
    out = []
    for g in range(ngroups):
        slices = _buffer(g, ranks)
        keys = [k for k in slices[0].states if all(k in s.states for s in slices)]
        lay = layout(g, shapes[g], ranks, weight_shapes) if shapes is not None else None
        if lay is not None:
            for sl, n in zip(slices, lay[1]):
                short = [k for k in keys if sl.states[k][0] < n]
                if short:
                    raise SourceError(f"{sl.path}: optimizer state {short[0]!r} of group {g} is shorter than its "
                                      f"fp32 master slice")
            out += _named_refs(g, lay, slices, keys, prefix, reader)
        else:
            out += _offset_refs(g, slices, keys, prefix, reader)
    return out


def _kind(key: str) -> str:
    return key if key in (MASTER, *MOMENTS) else "other"


def _dtype(sl: _Slice, key: str):
    return sl.dtype if key == MASTER else sl.states[key][1]


def _named_refs(g, lay, slices, keys, prefix, reader) -> list[TensorRef]:
    params, valid = lay
    out = []
    for name, shape, start in params:
        if not math.prod(shape):
            continue  # an empty parameter: nothing in the buffer
        pieces, s0 = [], 0
        for sl, n in zip(slices, valid):
            pieces += [(sl.path, sl.index, lo - s0, hi - s0) for _, lo, hi in _overlaps([(name, shape, start)], s0, n)]
            s0 += n
        for key in (MASTER, *keys):
            nm = prefix + name if _kind(key) != "other" else f"{prefix}{name}.{key}"
            out.append(TensorRef(nm, _kind(key), _dtype(slices[0], key), shape,
                                 lambda p=tuple(pieces), k=key, s=shape: _gather(reader, p, g, k, s), pieces[0][0]))
    return out


def _offset_refs(g, slices, keys, prefix, reader) -> list[TensorRef]:
    out, start = [], 0
    for sl in slices:
        for key in (MASTER, *keys):
            n = sl.numel if key == MASTER else sl.states[key][0]
            if n:
                nm = f"{prefix}group{g}.offset{start}" + ("" if _kind(key) != "other" else f".{key}")
                out.append(TensorRef(nm, _kind(key), _dtype(sl, key), (n,),
                                     lambda p=((sl.path, sl.index, 0, n),), k=key, s=(n,):
                                     _gather(reader, p, g, k, s), sl.path))
        start += sl.numel
    return out


def _gather(reader: DeepSpeedReader, pieces, g: int, key: str, shape: tuple):
    """One tensor from ``pieces`` ``(file, slice index, lo, hi)`` of group ``g``'s flat ``key``, in order."""
    import torch

    ts = []
    for path, i, lo, hi in pieces:
        t = _flat(reader.load(path), path, g, i, key)
        if t.numel() < hi:
            raise SourceError(f"{path}: group {g}'s {key} has {t.numel()} elements, the index needs {hi}")
        ts.append(t.reshape(-1)[lo:hi])
    t = ts[0] if len(ts) == 1 else torch.cat(ts)
    return torch_to_numpy(t.reshape(shape))


# ------------------------------------------------------------------------------------------------- ZeRO-3
def _zero3_files(d: str, names: list, regex) -> dict:
    """``{mp: {rank: path}}`` of the files ``regex`` matches (groups: rank, model-parallel rank)."""
    out: dict = {}
    for n in names:
        if m := regex.match(n):
            rank, mp = int(m.group(1)), int(m.group(2))
            if rank in out.setdefault(mp, {}):
                raise SourceError(f"{d}: two files for rank {rank}: {os.path.basename(out[mp][rank])} and {n}")
            out[mp][rank] = os.path.join(d, n)
    return out


def zero3_refs(d: str, names: list, reader: DeepSpeedReader) -> list[TensorRef]:
    """A ZeRO stage 3 checkpoint folder: per rank ``zero_pp_rank_<r>_mp_rank_<mm>_model_states.pt`` (the module's
    parameters saved empty, buffers whole, ``param_shapes`` per group) and ``[bf16_]zero_pp_rank_<r>_..._optim_states.pt``
    (``fp32_flat_groups``: per group, the rank's slice of every parameter end to end; the optimizer state of
    those slices). Each parameter of ``n`` elements is cut into ``ceil(n / ranks)``-element slices, rank ``r``
    holding slice ``r`` (the last one padded); its master weight and moments are the ranks' slices joined and cut
    back to ``n``, named as in the model, when every rank's buffer holds what ``param_shapes`` says; otherwise each
    rank's buffer is one tensor ``group<g>.rank<r>``, never a guessed name. Weights: the module's non-empty
    tensors (buffers); its parameters are in the master weights."""
    models = _zero3_files(d, names, ZERO3_MODEL_RE)
    optims = _zero3_files(d, names, OPTIM_RE)
    out = []
    for mp in sorted(set(models) | set(optims)):
        prefix = f"mp{mp}." if len(models) > 1 else ""
        ranks = sorted(set(models.get(mp, {})) | set(optims.get(mp, {})))
        count = len(ranks)
        for what, files in (("model states", models.get(mp, {})), ("optimizer states", optims.get(mp, {}))):
            missing = [r for r in range(count) if r not in files]
            if missing or ranks != list(range(count)):
                raise SourceError(f"{d}: ZeRO-3 {what} file(s) of rank(s) {missing or ranks} missing "
                                  f"(ranks found: {ranks})")
        first = models[mp][0]
        obj = reader.load(first)
        if not isinstance(obj, dict):
            raise SourceError(f"{first}: expected a dict of model states, found {type(obj).__name__}")
        buffers = {str(b) for b in obj.get("buffer_names") or []}
        module = obj.get("module") if isinstance(obj.get("module"), dict) else {}
        for key, t in flatten_tensors(module).items():
            if t.numel() == 0:
                continue  # a partitioned parameter, saved empty
            kind = "weight" if t.is_floating_point() and t.dim() > 0 and key not in buffers else "other"
            out.append(TensorRef(prefix + key, kind, torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                 lambda f=first, k=key: torch_to_numpy(_state_dict(reader, f, lambda o: o.get(
                                     "module"))[k]), first))
        shapes = obj.get("param_shapes")
        shapes = [shapes] if isinstance(shapes, dict) else shapes
        out += _zero3_optimizer_refs(d, [optims[mp][r] for r in range(count)], shapes, prefix, reader)
    return out


def _zero3_groups(obj, path: str):
    """(fp32 flat buffer per group, {state key: flat tensor} per group, partition_count) of a ZeRO-3 optimizer file."""
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if not isinstance(osd, dict) or not _is_tensors(osd.get("fp32_flat_groups")):
        raise SourceError(f"{path}: no fp32_flat_groups (not a DeepSpeed ZeRO stage 3 optimizer file)")
    flats = list(osd["fp32_flat_groups"])
    inner = osd.get("optimizer_state_dict")
    st = inner.get("state") if isinstance(inner, dict) else None
    if not isinstance(st, dict):
        raise SourceError(f"{path}: no optimizer state in it")
    states = [_tensors(st.get(g, {})) for g in range(len(flats))]
    return flats, states, _int(osd.get("partition_count"))


def _zero3_optimizer_refs(d, files, shapes, prefix, reader) -> list[TensorRef]:
    world = len(files)
    per = []
    for f in files:
        flats, states, pc = _zero3_groups(reader.load(f), f)
        if pc is not None and pc != world:
            raise SourceError(f"{f}: partition_count {pc}, but {world} rank files are in {d}")
        per.append(([int(t.numel()) for t in flats], [{k: (int(v.numel()), torch_dtype_to_numpy(v.dtype))
                                                       for k, v in s.items()} for s in states],
                    [torch_dtype_to_numpy(t.dtype) for t in flats]))
    ngroups = {len(p[0]) for p in per}
    if len(ngroups) != 1:
        raise SourceError(f"{d}: the ranks' optimizer files have different numbers of param groups {sorted(ngroups)}")
    (ngroups,) = ngroups
    if not isinstance(shapes, list) or len(shapes) != ngroups:
        shapes = None
    out = []
    for g in range(ngroups):
        keys = [k for k in per[0][1][g] if all(k in p[1][g] for p in per)]
        params = []
        if shapes is not None and isinstance(shapes[g], dict):
            off = 0
            for name, shp in shapes[g].items():
                shp = _shape(shp)
                if shp is None:
                    params = []
                    break
                n = math.prod(shp)
                part = -(-n // world)
                params.append((str(name), shp, off, part))
                off += part
            # every rank's buffer and states must hold the slices param_shapes says, no more than padding beyond
            if params and not all(p[0][g] >= off and all(p[1][g][k][0] >= off for k in keys) for p in per):
                params = []
        if params:
            for name, shp, off, part in params:
                if not math.prod(shp):
                    continue
                for key in (MASTER, *keys):
                    nm = prefix + name if _kind(key) != "other" else f"{prefix}{name}.{key}"
                    dt = per[0][2][g] if key == MASTER else per[0][1][g][key][1]
                    out.append(TensorRef(nm, _kind(key), dt, shp,
                                         lambda k=key, o=off, q=part, s=shp, g=g: _zero3_gather(reader, files, g, k, o, q, s),
                                         files[0]))
        else:
            for r, f in enumerate(files):
                for key in (MASTER, *keys):
                    n = per[r][0][g] if key == MASTER else per[r][1][g][key][0]
                    dt = per[r][2][g] if key == MASTER else per[r][1][g][key][1]
                    nm = f"{prefix}group{g}.rank{r}" + ("" if _kind(key) != "other" else f".{key}")
                    out.append(TensorRef(nm, _kind(key), dt, (n,),
                                         lambda f=f, k=key, n=n, g=g: _zero3_gather(reader, [f], g, k, 0, n, (n,)), f))
    return out


def _zero3_gather(reader, files, g, key, off, part, shape):
    """A tensor of ``shape`` from the ranks' slices ``[off, off + part)`` of group ``g``'s flat ``key``, joined in
    rank order and cut to its size."""
    import torch

    ts = []
    for f in files:
        flats, states, _ = _zero3_groups(reader.load(f), f)
        t = flats[g] if key == MASTER else states[g].get(key)
        if t is None or t.numel() < off + part:
            raise SourceError(f"{f}: group {g}'s {key} is shorter than the index needs ({off + part} elements)")
        ts.append(t.reshape(-1)[off:off + part])
    t = ts[0] if len(ts) == 1 else torch.cat(ts)
    return torch_to_numpy(t[:math.prod(shape)].reshape(shape))
