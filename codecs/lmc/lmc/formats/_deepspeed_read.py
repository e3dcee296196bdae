"""Low-level readers of DeepSpeed checkpoint files, for :mod:`lmc.formats.deepspeed` (which re-exports them).

- Pickles: :class:`DeepSpeedReader` loads a file with ``torch.load(weights_only=True)``, DeepSpeed's own
  plain-value classes built as :class:`Inert` records, and refuses (or, with ``trust_pickle``, loads after a
  warning) a file that needs any other global.
- ZeRO 1/2 partitions: the per-rank fp32 master slices and optimizer state of an optimizer file (current and
  legacy ZeRO-1 sub-partitions) as sizes (:class:`_Rank`, :class:`_Slice`), a group's slices in buffer order,
  and :func:`layout`, which places the parameters of ``param_shapes`` in a group's flat buffer when the sizes
  add up exactly.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

from .errors import SourceError
from .fileio import one_line
from .torchfile import is_refusal, load_error, torch_dtype_to_numpy, zip_format

MASTER = "master_weight"


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
