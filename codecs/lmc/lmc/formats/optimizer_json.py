"""An optimizer ``state_dict`` taken apart into its moment arrays and a JSON *skeleton*, and put back together.

The skeleton keeps everything but the per-parameter tensors: the ``param_groups`` (keys that were tuples or
0-dim tensors recorded in ``param_group_types``), per Adam slot its index, parameter name, key order and
scalar entries such as ``step`` with their torch dtype, and any other top-level entry. With the moments (from
wherever they were stored) :func:`rebuild_optimizer` gives back a ``state_dict`` that ``torch.optim.AdamW``
loads. Nothing in a skeleton is ever unpickled: it is JSON.
"""

from __future__ import annotations

from .errors import SourceError
from .fileio import one_line
from .tensors import MOMENTS
from .torchfile import numpy_to_torch, torch_dtype, torch_to_numpy


def to_json(x, where: str):
    """A plain-JSON value and a type descriptor (None when the JSON value is the value itself).

    Descriptors: ``{"torch_dtype": "torch.float32"}`` for a 0-dim tensor, ``{"tuple": true, "items": [...]}``
    / ``{"items": [...]}`` for sequences, ``{"keys": {...}}`` for dicts (inner descriptors only where needed).
    """
    import torch

    if x is None or isinstance(x, (bool, int, float, str)):
        return x, None
    if isinstance(x, torch.Tensor):
        if x.dim() != 0 or x.is_complex():
            raise SourceError(f"{where}: a tensor of shape {tuple(x.shape)} ({x.dtype}) cannot be kept in the "
                              "JSON skeleton (only 0-dim real tensors are)")
        return x.item(), {"torch_dtype": str(x.dtype)}
    if isinstance(x, (list, tuple)):
        vals, descs = zip(*[to_json(v, where) for v in x]) if x else ((), ())
        d = {}
        if isinstance(x, tuple):
            d["tuple"] = True
        if any(v is not None for v in descs):
            d["items"] = list(descs)
        return list(vals), (d or None)
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        out, keys = {}, {}
        for k, v in x.items():
            out[k], dk = to_json(v, f"{where}.{k}")
            if dk is not None:
                keys[k] = dk
        return out, ({"keys": keys} if keys else None)
    raise SourceError(f"{where}: a {type(x).__name__} value cannot be kept in the JSON skeleton")


def from_json(v, desc):
    """Inverse of :func:`to_json`."""
    import torch

    if desc is None:
        return v
    if not isinstance(desc, dict):
        raise SourceError(f"bad type descriptor {desc!r}")
    if "torch_dtype" in desc:
        return torch.tensor(v, dtype=torch_dtype(desc["torch_dtype"]))
    if "keys" in desc:
        return {k: from_json(x, desc["keys"].get(k)) for k, x in v.items()}
    items = desc.get("items") or [None] * len(v)
    seq = [from_json(x, d) for x, d in zip(v, items)]
    return tuple(seq) if desc.get("tuple") else seq


def split_optimizer(opt: dict, names: dict, tensors: dict, opt_path: str, file: str = "optimizer.pt") -> dict:
    """Take an AdamW ``state_dict`` apart: each slot's moments go into ``tensors[name]`` (read-only numpy views;
    ``names``: slot -> parameter name, every slot must have one that ``tensors`` holds); returns the skeleton."""
    import torch

    groups, group_types = [], []
    for i, g in enumerate(opt["param_groups"]):
        if not isinstance(g, dict):
            raise SourceError(f"{opt_path}: param group {i} is not a dict")
        v, desc = to_json(g, f"{opt_path}: param_groups[{i}]")
        groups.append(v)
        group_types.append((desc or {}).get("keys", {}))
    slots, seen = [], {}
    for idx, st in opt["state"].items():
        where = f"{opt_path}: state slot {idx!r}"
        if type(idx) is not int or not isinstance(st, dict):
            raise SourceError(f"{where}: expected an integer slot with a dict of state")
        name = names.get(idx)
        if name is None:
            raise SourceError(f"{where}: cannot tell which parameter it belongs to (no param_names in the "
                              "param groups and no unambiguous parameter order or shape)")
        if name not in tensors:
            raise SourceError(f"{where}: named {name!r}, which the weights file does not hold")
        if name in seen:
            raise SourceError(f"{where}: named {name!r} like slot {seen[name]}")
        seen[name] = idx
        scalars, moments = {}, {}
        for key, t in st.items():
            if not isinstance(key, str):
                raise SourceError(f"{where}: non-string state key {key!r}")
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                if key not in MOMENTS:
                    raise SourceError(f"{where}: holds a tensor {key!r}; only Adam's exp_avg and exp_avg_sq "
                                      "can be compressed (AdamW without amsgrad)")
                a = torch_to_numpy(t)
                tensors[name][key] = a
                moments[key] = {"torch_dtype": str(t.dtype), "shape": list(t.shape)}
            else:
                v, desc = to_json(t, f"{where}.{key}")
                scalars[key] = {"value": v, **({"type": desc} if desc else {})}
        slots.append({"index": idx, "name": name, "keys": list(st), "scalars": scalars, "moments": moments})
    extra = {k: v for k, v in opt.items() if k not in ("state", "param_groups")}
    extra_json, extra_desc = to_json(extra, f"{opt_path}: top level")
    return {"file": file, "param_groups": groups, "param_group_types": group_types,
            "state": slots, "extra": extra_json, "extra_types": extra_desc}


def rebuild_optimizer(sk: dict, arrays: dict, rec: str, error=SourceError) -> dict:
    """The ``state_dict`` of a skeleton with the moments from ``arrays`` (name -> {exp_avg, exp_avg_sq});
    anything malformed is one ``error`` naming ``rec``, the file the skeleton was read from."""
    try:
        state = {}
        for slot in sk["state"]:
            name = slot["name"]
            if name not in arrays:
                raise error(f"{rec}: Adam slot {slot['index']} belongs to {name!r}, not in the container")
            st = {}
            for key in slot["keys"]:
                if key in slot["moments"]:
                    a = arrays[name].get(key)
                    info = slot["moments"][key]
                    if a is None or list(a.shape) != info["shape"]:
                        raise error(f"{rec}: the container has no {key} of shape {info['shape']} for {name}")
                    t = numpy_to_torch(a)
                    if t.dtype != torch_dtype(info["torch_dtype"]):
                        t = t.to(torch_dtype(info["torch_dtype"]))
                    st[key] = t
                else:
                    sc = slot["scalars"][key]
                    st[key] = from_json(sc["value"], sc.get("type"))
            state[int(slot["index"])] = st
        groups = [from_json(g, {"keys": t} if t else None)
                  for g, t in zip(sk["param_groups"], sk["param_group_types"], strict=True)]
        out = {"state": state, "param_groups": groups}
        extra = from_json(sk.get("extra") or {}, sk.get("extra_types"))
        out.update(extra)
        return out
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise error(f"{rec}: malformed optimizer skeleton ({type(e).__name__}: {one_line(e)})") from None

