"""PyTorch files: load with weights_only=True, split into a JSON skeleton
with typed leaves plus a list of tensors, and rebuild (never unpickles
anything: the skeleton is our own JSON).  torch is imported lazily."""
import base64
import collections
import json

import numpy as np

from ._manifest import ArchiveError

INLINE_BYTES = 64   # tensors up to this size live in the skeleton
MAX_DEPTH = 200


class Unsupported(Exception):
    """The object holds something the skeleton cannot represent."""


def load(path):
    """torch.load(weights_only=True) or None (the file is then kept as bytes)."""
    import torch
    for kw in ({"mmap": True}, {}):
        try:
            return torch.load(path, weights_only=True, map_location="cpu", **kw)
        except Exception:
            continue
    return None


def tensor_u8(t):
    """Flat uint8 numpy view (or copy, if not contiguous) of a CPU tensor."""
    return t.detach().contiguous().reshape(-1).view(_torch().uint8).numpy()


def _torch():
    import torch
    return torch


def _keypart(k):
    if type(k) in (str, int):
        return k
    return f"!{type(k).__name__}:{k!r}"


def flatten(obj):
    """Returns (skeleton, [(key, tensor), ...]).  Tensors sharing a storage
    view (tied weights) are stored once and referenced twice."""
    torch = _torch()
    tensors, seen, keys = [], {}, set()

    def tensor(t, path):
        if (t.layout != torch.strided or t.is_quantized or t.device.type != "cpu"
                or t.is_conj() or t.is_neg() or t.requires_grad):
            raise Unsupported("tensor kind")
        name = str(t.dtype).split(".")[-1]
        nbytes = t.numel() * t.element_size()
        if nbytes <= INLINE_BYTES:
            return ["tsmall", name, list(t.shape), tensor_u8(t).tobytes().hex()]
        st = t.untyped_storage()
        ident = (st.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if ident in seen:
            return ["tensor", seen[ident]]
        key = json.dumps(path)
        while key in keys:
            key += "#"
        keys.add(key)
        seen[ident] = len(tensors)
        tensors.append((key, t))
        return ["tensor", seen[ident]]

    def enc(x, path, depth):
        if depth > MAX_DEPTH:
            raise Unsupported("too deep")
        t = type(x)
        if x is None:
            return ["none"]
        if t is bool:
            return ["bool", x]
        if t is int:
            return ["int", str(x)]
        if t is float:
            return ["float", x.hex()]
        if t is str:
            return ["str", x]
        if t is bytes:
            return ["bytes", base64.b64encode(x).decode()]
        if t is torch.Size:
            return ["size", [int(v) for v in x]]
        if t in (list, tuple):
            return ["list" if t is list else "tuple",
                    [enc(v, path + [i], depth + 1) for i, v in enumerate(x)]]
        if t in (dict, collections.OrderedDict):
            return ["dict" if t is dict else "odict",
                    [[enc(k, None, depth + 1), enc(v, path + [_keypart(k)], depth + 1)]
                     for k, v in x.items()]]
        if t is torch.dtype:
            return ["dtype", str(x).split(".")[-1]]
        if t is torch.device:
            return ["device", str(x)]
        if path is not None and t is torch.Tensor:
            return tensor(x, path)
        if path is not None and t is torch.nn.Parameter:
            return ["param", tensor(x.detach(), path), bool(x.requires_grad)]
        raise Unsupported(f"type {t.__name__}")

    return enc(obj, [], 0), tensors


def _dtype(name):
    torch = _torch()
    dt = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise ArchiveError(f"unknown torch dtype {name!r}")
    return dt


def check(node, ntensors, depth=0):
    """Structural check of an untrusted skeleton (no torch needed)."""
    def bad(what):
        raise ArchiveError(f"malformed skeleton ({what})")
    if depth > MAX_DEPTH:
        bad("too deep")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        bad("node")
    tag, args = node[0], node[1:]
    if tag == "none":
        ok = not args
    elif tag == "bool":
        ok = len(args) == 1 and type(args[0]) is bool
    elif tag in ("int", "float", "str", "bytes", "dtype", "device"):
        ok = len(args) == 1 and isinstance(args[0], str)
    elif tag == "size":
        ok = len(args) == 1 and isinstance(args[0], list) and all(type(v) is int for v in args[0])
    elif tag in ("list", "tuple"):
        ok = len(args) == 1 and isinstance(args[0], list)
        if ok:
            for v in args[0]:
                check(v, ntensors, depth + 1)
    elif tag in ("dict", "odict"):
        ok = len(args) == 1 and isinstance(args[0], list)
        if ok:
            for kv in args[0]:
                if not isinstance(kv, list) or len(kv) != 2:
                    bad("dict item")
                check(kv[0], 0, depth + 1)
                check(kv[1], ntensors, depth + 1)
    elif tag == "tensor":
        ok = len(args) == 1 and type(args[0]) is int and 0 <= args[0] < ntensors
    elif tag == "tsmall":
        ok = (len(args) == 3 and isinstance(args[0], str) and isinstance(args[1], list)
              and all(type(d) is int and d >= 0 for d in args[1]) and isinstance(args[2], str)
              and len(args[2]) <= 2 * INLINE_BYTES)
    elif tag == "param":
        ok = len(args) == 2 and type(args[1]) is bool and isinstance(args[0], list)
        if ok:
            check(args[0], ntensors, depth + 1)
    else:
        ok = False
    if not ok:
        bad(tag)


def unflatten(node, tensors):
    """Rebuild the object (after check())."""
    torch = _torch()
    tag, args = node[0], node[1:]
    try:
        if tag == "none":
            return None
        if tag == "bool":
            return args[0]
        if tag == "int":
            return int(args[0])
        if tag == "float":
            return float.fromhex(args[0])
        if tag == "str":
            return args[0]
        if tag == "bytes":
            return base64.b64decode(args[0], validate=True)
        if tag == "size":
            return torch.Size(args[0])
        if tag == "list":
            return [unflatten(v, tensors) for v in args[0]]
        if tag == "tuple":
            return tuple(unflatten(v, tensors) for v in args[0])
        if tag in ("dict", "odict"):
            d = {} if tag == "dict" else collections.OrderedDict()
            for k, v in args[0]:
                d[unflatten(k, tensors)] = unflatten(v, tensors)
            return d
        if tag == "dtype":
            return _dtype(args[0])
        if tag == "device":
            return torch.device(args[0])
        if tag == "tensor":
            return tensors[args[0]]
        if tag == "tsmall":
            dt = _dtype(args[0])
            raw = bytearray(bytes.fromhex(args[2]))
            t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            return t.view(dt).reshape(args[1]).clone()
        if tag == "param":
            return torch.nn.Parameter(unflatten(args[0], tensors), requires_grad=args[1])
    except ArchiveError:
        raise
    except Exception as e:  # bad hex/base64/int, unhashable key, wrong size...
        raise ArchiveError(f"malformed skeleton ({tag}: {type(e).__name__}: {e})") from None
    raise ArchiveError(f"malformed skeleton ({tag})")  # pragma: no cover - check() ran


def from_u8(u8, dtype_name, shape):
    """A torch tensor over a uint8 numpy buffer (no copy)."""
    torch = _torch()
    t = torch.from_numpy(np.asarray(u8).reshape(-1))
    return t.view(_dtype(dtype_name)).reshape(shape)
