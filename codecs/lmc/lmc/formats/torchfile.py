"""PyTorch files, read safely, and torch <-> numpy conversions.

``torch.load`` always runs with ``weights_only=True`` (memory-mapped when the file is in the zip format): a file
that needs arbitrary unpickling is refused. Each reader raises :class:`SourceError` with one line naming the file.
"""

from __future__ import annotations

import os
import struct
import zipfile
from typing import Callable

import ml_dtypes
import numpy as np

from .dtypes import BFLOAT16, of_torch
from .errors import SourceError
from .fileio import check_file
from .tensors import MOMENTS, TensorRef


def torch_load(path: str):
    """``torch.load`` with ``weights_only=True`` (memory-mapped when the file is in the zip format)."""
    import torch

    is_zip = zip_format(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as e:  # noqa: BLE001 - turned into one line naming the file
        if is_refusal(e):
            raise SourceError(f"{path}: refused: loading it needs arbitrary unpickling (only tensors and plain "
                              f"containers are read, weights_only=True)") from None
        raise load_error(path, e) from None


def zip_format(path: str) -> bool:
    """Whether ``path`` (checked to be a non-empty file) is in torch's zip format (then it can be mmapped)."""
    check_file(path)
    try:
        return zipfile.is_zipfile(path)
    except OSError as e:
        raise SourceError(f"{path}: {e}") from None


def is_refusal(e: BaseException) -> bool:
    """Whether a ``torch.load`` failure is ``weights_only`` refusing a global the file needs."""
    import pickle

    s = str(e)
    first = s.strip().splitlines()[0] if s.strip() else ""
    return isinstance(e, pickle.UnpicklingError) and (
        "weights_only" in s or "Unsupported global" in s or "Weights only load failed" in first)


def load_error(path: str, e: BaseException) -> Exception:
    """The one-line :class:`SourceError` for a failed ``torch.load`` of ``path`` (other than a refusal);
    an unexpected exception type is given back as it is."""
    import pickle

    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, pickle.UnpicklingError):
        return SourceError(f"{path}: not a PyTorch file ({msg})")
    if not isinstance(e, (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError, struct.error)):
        return e
    if "failed finding central directory" in msg or "PytorchStreamReader" in msg:
        msg = "truncated or corrupt zip archive"
    elif isinstance(e, EOFError):
        msg = "truncated file"
    return SourceError(f"{path}: not a readable PyTorch file ({msg})")


def torch_to_numpy(t) -> np.ndarray:
    """A CPU torch tensor as a read-only numpy view of its memory (bf16 as ``ml_dtypes.bfloat16``).

    For a memory-mapped load the view keeps only this tensor's pages resident, not the whole file."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        a = t.view(torch.int16).numpy().view(BFLOAT16)
    elif t.dtype == torch.float8_e4m3fn:
        a = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    elif t.dtype == torch.float8_e5m2:
        a = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e5m2)
    else:
        a = t.numpy()
    a.flags.writeable = False
    return a


def torch_dtype_to_numpy(dt) -> np.dtype:
    import torch

    row = of_torch(dt)
    if row is not None:
        return row.numpy
    return np.dtype(torch.empty((), dtype=dt).numpy().dtype)


def flatten_tensors(obj: dict) -> dict:
    """A flat ``name -> tensor`` dict from a (possibly nested) state dict; nested keys are joined with dots."""
    import torch

    flat = {}

    def walk(prefix, d):
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                flat[f"{prefix}{k}"] = v
            elif isinstance(v, dict):
                walk(f"{prefix}{k}.", v)

    walk("", obj)
    return flat


def torch_state_dict(path: str) -> dict:
    """A flat ``name -> tensor`` dict from a PyTorch state-dict file."""
    obj = torch_load(path)
    if not isinstance(obj, dict):
        raise SourceError(f"{path}: expected a state dict, found {type(obj).__name__}")
    return flatten_tensors(obj)




def numpy_to_torch(a: np.ndarray):
    """A numpy array as a CPU torch tensor sharing its memory where it can (bf16 and fp8 through their bits)."""
    import torch

    a = np.ascontiguousarray(a).reshape(a.shape)  # ascontiguousarray makes a 0-dim array 1-dim
    if not a.flags.writeable:
        a = a.copy()
    special = {"bfloat16": (np.int16, torch.bfloat16), "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
               "float8_e5m2": (np.uint8, torch.float8_e5m2)}
    if a.dtype.name in special:
        view, tdt = special[a.dtype.name]
        return torch.from_numpy(a.view(view)).view(tdt)
    return torch.from_numpy(a)


def torch_dtype(name: str):
    """``torch.float32`` from ``"torch.float32"`` or ``"float32"``."""
    import torch

    dt = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise SourceError(f"unknown torch dtype {name!r}")
    return dt


def load_torch_file(path: str, what: str):
    """``torch.load(path, weights_only=True)`` (not memory-mapped: a training state to resume from) with any
    failure turned into a one-line SourceError."""
    import torch

    if not os.path.isfile(path):
        raise SourceError(f"{path}: missing ({what} is needed to resume training)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - corrupt, truncated or unsafe pickles all end here
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise SourceError(f"{path}: cannot read {what} ({type(e).__name__}: {msg[:200]})") from None


# ------------------------------------------------------------------------------------ indexes of files
def state_dict_refs(path: str, kind_of: Callable[[str], str] | None = None, obj=None) -> list[TensorRef]:
    """Every tensor of a (possibly nested) state-dict file, in file order; ``kind_of(name)`` gives the kind
    (default: weight). ``obj``: the file already loaded."""
    obj = torch_load(path) if obj is None else obj
    if not isinstance(obj, dict):
        raise SourceError(f"{path}: expected a state dict, found {type(obj).__name__}")
    return [TensorRef(name, kind_of(name) if kind_of else "weight", torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                      lambda n=name: torch_to_numpy(torch_state_dict(path)[n]), path)
            for name, t in flatten_tensors(obj).items()]


def is_optimizer_state(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("state"), dict) and isinstance(obj.get("param_groups"), list)


def load_optimizer(path: str) -> dict:
    """An optimizer ``state_dict`` file (``state`` and ``param_groups``), read with ``weights_only=True``."""
    obj = torch_load(path)
    if not is_optimizer_state(obj):
        raise SourceError(f"{path}: not an optimizer state dict (no 'state' and 'param_groups')")
    return obj


def optimizer_refs(path: str, opt: dict, names: dict) -> list[TensorRef]:
    """The per-parameter tensors of an optimizer state (the 0-dim ``step`` counters left out): Adam's moments
    as kinds ``exp_avg`` / ``exp_avg_sq`` named after their parameter (``names``: slot -> name, else
    ``slot<k>``), any other tensor as kind ``other`` named ``<parameter>.<key>``."""
    import torch

    out = []
    for slot, st in opt["state"].items():
        if not isinstance(st, dict):
            continue
        for key, t in st.items():
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                continue  # the per-parameter 'step' counter
            kind = key if key in MOMENTS else "other"
            name = names.get(slot, f"slot{slot}")
            if kind == "other":
                name = f"{name}.{key}"
            out.append(TensorRef(name, kind, torch_dtype_to_numpy(t.dtype), tuple(t.shape),
                                 lambda s=slot, k=key: torch_to_numpy(load_optimizer(path)["state"][s][k]), path))
    return out
