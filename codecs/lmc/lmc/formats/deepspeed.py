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
import warnings
from dataclasses import dataclass

from .errors import SourceError
from .fileio import one_line
from .tensors import MOMENTS, TensorRef
from .torchfile import flatten_tensors, is_refusal, load_error, torch_dtype_to_numpy, torch_to_numpy, zip_format

MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
LAYER_RE = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")
OPTIM_RE = re.compile(r"^(?:(?:bf16|fp16)_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
ZERO3_MODEL_RE = re.compile(r"^(?:(?:bf16|fp16)_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
MASTER = "master_weight"
NEEDS = "mp_rank_<mm>_model_states.pt"


# ------------------------------------------------------------------------------------------------- pickles
class Inert:
    """A DeepSpeed object read as plain values: the arguments it was built with and the state it was given.
    Nothing of DeepSpeed's class runs, and nothing here does more than store what the unpickler hands it."""

    args: tuple = ()
    state = None

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        self.state = state

    def field(self, key):
        return self.state.get(key) if isinstance(self.state, dict) else None


KNOWN_GLOBALS = ("deepspeed.runtime.fp16.loss_scaler.LossScaler",
                 "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                 "deepspeed.runtime.zero.config.ZeroStageEnum",
                 "deepspeed.utils.tensor_fragment.fragment_address")
_INERT = [(type(g.rsplit(".", 1)[1], (Inert,), {"__module__": __name__}), g) for g in KNOWN_GLOBALS]
_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)")


def _int(v):
    """An int, an int enum (the ZeRO stage) or its inert record as an int; None otherwise."""
    if isinstance(v, Inert):
        v = v.args[0] if v.args else None
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def _field(v, key):
    return v.field(key) if isinstance(v, Inert) else getattr(v, key, None)


class DeepSpeedReader:
    """Loads DeepSpeed files safely (see the module docstring) and keeps the last file loaded (memory-mapped, so
    holding it costs address space, not memory)."""

    def __init__(self, trust_pickle: bool = False):
        self.trust_pickle = bool(trust_pickle)
        self.warned = False
        self._last: tuple = (None, None)

    def load(self, path: str):
        if self._last[0] != path:
            self._last = (None, None)
            self._last = (path, self._load(path))
        return self._last[1]

    def _load(self, path: str):
        import torch

        is_zip = zip_format(path)
        try:
            with torch.serialization.safe_globals(_INERT):
                return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
        except Exception as e:  # noqa: BLE001 - a refusal is handled below, the rest is one line
            if not is_refusal(e):
                raise load_error(path, e) from None
            foreign = self._foreign(path, e, is_zip)
        if not self.trust_pickle:
            raise SourceError(f"{path}: refused: unpickling it needs {', '.join(foreign)} (weights_only=True reads "
                              f"only tensors and plain values); source.trust_pickle=true loads it with "
                              f"weights_only=False, which runs code from the file")
        if not self.warned:
            self.warned = True
            warnings.warn(f"source.trust_pickle=true: unpickling {path} with weights_only=False (it needs "
                          f"{', '.join(foreign)}), and any other file of this source that needs it: this runs "
                          f"code from the files", stacklevel=2)
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=is_zip)
        except Exception as e:  # noqa: BLE001 - a missing module, a broken pickle: one line
            raise SourceError(f"{path}: cannot unpickle it with weights_only=False ({one_line(e)[:300]})") from None

    @staticmethod
    def _foreign(path: str, e: BaseException, is_zip: bool) -> list[str]:
        """The globals the file needs that are neither torch's safe ones nor DeepSpeed's inert ones, found by
        reading the pickle's opcodes (nothing is executed); from the error message for a legacy file."""
        import torch

        found = []
        if is_zip:
            try:
                with torch.serialization.safe_globals(_INERT):
                    found = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            except Exception:  # noqa: BLE001 - then the refusal's own message names one
                found = []
        return found or list(dict.fromkeys(_GLOBAL_RE.findall(str(e)))) or ["a global it does not allow"]


# ------------------------------------------------------------------------------------------------- layout
@dataclass
class _Slice:
    """One stored slice of a group's flat buffer: a rank's partition (ZeRO 1/2), or one of its sub-partitions
    (legacy ZeRO-1, one per communication interval). Sizes only; the tensors stay in the file."""

    path: str
    index: int  # which of the rank's slices of the group (0 but for legacy ZeRO-1)
    numel: int  # of the stored fp32 master slice
    dtype: object
    states: dict  # optimizer state key -> (numel, numpy dtype)
    padding: int | None  # of its elements, how many are end padding (group_paddings), when the file says
    slice_map: dict | None  # param_slice_mappings: name -> fragment address within the slice


@dataclass
class _Rank:
    path: str
    groups: list  # per group: the rank's slices, in order
    align_paddings: list | None  # per group: the padding after each parameter
    partition_count: int | None
    legacy: bool


def _optimizer_state(obj, path: str) -> dict:
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if not isinstance(osd, dict):
        raise SourceError(f"{path}: no optimizer_state_dict (not a DeepSpeed ZeRO optimizer file)")
    if _int(osd.get("zero_stage")) == 3 or "fp32_flat_groups" in osd:
        raise SourceError(f"{path}: a ZeRO stage 3 optimizer file beside stage 0-2 model states (mixed stages)")
    return osd


def _tensors(st) -> dict:
    import torch

    return {k: t for k, t in st.items() if isinstance(t, torch.Tensor) and t.dim() > 0} if isinstance(st, dict) else {}


def _is_tensors(v) -> bool:
    return isinstance(v, (list, tuple)) and all(hasattr(t, "dtype") and hasattr(t, "numel") for t in v)


def _group_slices(osd: dict, path: str) -> tuple[list, list, bool]:
    """Per group, the fp32 master slices (a list of tensors) and, per slice, the wrapped optimizer's state
    ``{key: tensor}``; and whether the file is legacy ZeRO-1. ``base_optimizer_state`` is a torch optimizer state
    dict (one flat parameter per group), a list of per-group states (elastic checkpoints) or, legacy, a list per
    group of per-sub-partition states."""
    if "single_partition_of_fp32_groups" in osd:
        parts, legacy = osd["single_partition_of_fp32_groups"], False
        masters = [[t] for t in parts] if _is_tensors(parts) else None
    else:
        parts, legacy = osd.get("local_sub_partitions_of_fp32_groups"), True
        masters = [list(g) for g in parts] if isinstance(parts, (list, tuple)) and all(map(_is_tensors, parts)) \
            else None
    if masters is None:
        raise SourceError(f"{path}: no single_partition_of_fp32_groups (not a ZeRO stage 1/2 optimizer file)")
    base = osd.get("base_optimizer_state")
    if isinstance(base, dict) and isinstance(base.get("state"), dict) and isinstance(base.get("param_groups"), list):
        per = []
        for g, pg in enumerate(base["param_groups"]):
            ps = pg.get("params") if isinstance(pg, dict) else None
            per.append(base["state"].get(ps[0] if isinstance(ps, list) and len(ps) == 1 else g, {}))
    elif isinstance(base, (list, tuple)):
        per = list(base)
    else:
        raise SourceError(f"{path}: no base_optimizer_state in the optimizer_state_dict")
    if len(per) != len(masters):
        raise SourceError(f"{path}: base_optimizer_state has {len(per)} groups, the fp32 master weights "
                          f"{len(masters)}")
    if legacy:
        if not all(isinstance(p, (list, tuple)) and len(p) == len(m) for p, m in zip(per, masters)):
            raise SourceError(f"{path}: base_optimizer_state does not hold one state per fp32 sub-partition")
        return masters, [[_tensors(st) for st in p] for p in per], True
    return masters, [[_tensors(st)] for st in per], False


def _flat(obj, path: str, g: int, i: int, key: str):
    """Slice ``i`` of group ``g``'s flat tensor ``key`` (MASTER or an optimizer state key) of a loaded file."""
    masters, states, _ = _group_slices(_optimizer_state(obj, path), path)
    return masters[g][i] if key == MASTER else states[g][i][key]


def _rank(obj, path: str) -> _Rank:
    osd = _optimizer_state(obj, path)
    masters, states, legacy = _group_slices(osd, path)
    pc = osd.get("partition_count")
    pc = max((_int(x) or 0) for x in pc) if isinstance(pc, (list, tuple)) and pc else _int(pc)

    def per_group(key):
        v = osd.get(key)
        return list(v) + [None] * (len(masters) - len(v)) if isinstance(v, (list, tuple)) else [None] * len(masters)

    pads, maps = per_group("group_paddings"), per_group("param_slice_mappings")
    groups = [[_Slice(path, i, int(t.numel()), torch_dtype_to_numpy(t.dtype),
                      {k: (int(v.numel()), torch_dtype_to_numpy(v.dtype)) for k, v in st.items()},
                      None if legacy else _int(pads[g]), None if legacy or not isinstance(maps[g], dict) else maps[g])
               for i, (t, st) in enumerate(zip(masters[g], states[g]))] for g in range(len(masters))]
    ap = osd.get("param_alignment_paddings")
    ap = [[_int(x) for x in a] if isinstance(a, (list, tuple)) else None for a in ap] \
        if isinstance(ap, (list, tuple)) else None
    return _Rank(path, groups, ap, pc, legacy)


def _buffer(g: int, ranks: list[_Rank]) -> list[_Slice]:
    """Group ``g``'s slices in buffer order: rank order, or (legacy ZeRO-1) interval-major."""
    counts = {len(r.groups[g]) for r in ranks}
    if len(counts) != 1:
        raise SourceError(f"{ranks[0].path}: the ranks hold different numbers of slices of group {g}")
    return [r.groups[g][i] for i in range(counts.pop()) for r in ranks]


def _shape(v) -> tuple | None:
    try:
        shape = tuple(int(x) for x in v)
    except (TypeError, ValueError):
        return None
    return shape if all(x >= 0 for x in shape) else None


def layout(g: int, shapes, ranks: list[_Rank], weight_shapes: dict) -> tuple[list, list] | None:
    """``([(name, shape, start)], valid)`` for group ``g``: where each parameter starts in the group's flat
    buffer and how many leading elements of each slice (in buffer order) are parameters, the rest being end
    padding; None when the sizes do not add up exactly (or disagree with the slice mappings or the module's
    shapes)."""
    if not isinstance(shapes, dict) or not shapes:
        return None
    params = [(str(n), _shape(s)) for n, s in shapes.items()]
    if any(s is None or weight_shapes.get(n, s) != s for n, s in params):
        return None
    aps = [r.align_paddings[g] if r.align_paddings and g < len(r.align_paddings) else None for r in ranks]
    pads = aps[0] if aps[0] is not None else [0] * len(params)
    if any(a != aps[0] for a in aps) or len(pads) != len(params) or any(p is None or p < 0 for p in pads):
        return None
    out, total = [], 0
    for (name, shape), pad in zip(params, pads):
        out.append((name, shape, total))
        total += math.prod(shape) + pad
    slices = _buffer(g, ranks)
    stored = [s.numel for s in slices]
    interval = sum(stored[:len(ranks)])  # legacy ZeRO-1 pads the buffer to whole intervals, less than one
    if sum(stored) == total:
        valid = stored
    elif all(s.padding is not None for s in slices):
        valid = [s.numel - s.padding for s in slices]
    elif ranks[0].legacy and 0 < sum(stored) - total < interval:
        valid = [max(0, min(n, total - sum(stored[:i]))) for i, n in enumerate(stored)]
    else:
        return None
    if any(v < 0 for v in valid) or sum(valid) != total or \
            any(v < n and any(valid[i + 1:]) for i, (v, n) in enumerate(zip(valid, stored))):
        return None  # the padding is at the end of the buffer, and only there
    s0 = 0
    for sl, n in zip(slices, valid):
        if sl.slice_map is not None:
            want = {name: (lo - s0, hi - lo) for name, lo, hi in _overlaps(out, s0, n)}
            got = {str(k): (_int(_field(v, "start")), _int(_field(v, "numel"))) for k, v in sl.slice_map.items()}
            if got != want:
                return None
        s0 += n
    return out, valid


def _overlaps(params, s0: int, n: int):
    """``(name, lo, hi)`` of each parameter's part (buffer coordinates) inside ``[s0, s0 + n)``."""
    for name, shape, start in params:
        lo, hi = max(start, s0), min(start + math.prod(shape), s0 + n)
        if lo < hi:
            yield name, lo, hi


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
