"""Readers for checkpoint files: safetensors (memory-mapped), PyTorch (``weights_only``, memory-mapped), npz.

Each reader validates what it reads and raises :class:`SourceError` with one line naming the file.
Nothing here unpickles arbitrary objects: PyTorch files are read with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile

import ml_dtypes
import numpy as np

from ..dtypes import BFLOAT16
from ..errors import SourceError

SAFETENSORS_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": BFLOAT16,
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_MAX_HEADER = 100 * 1024 * 1024


def _check_file(path: str) -> int:
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise SourceError(f"{path}: not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise SourceError(f"{path}: empty file")
    return size


def safetensors_index(path: str) -> dict[str, tuple[np.dtype, tuple, int, int]]:
    """``name -> (dtype, shape, begin, end)`` (absolute file offsets), validated against the file size."""
    size = _check_file(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SourceError(f"{path}: truncated safetensors file (no header length)")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > _MAX_HEADER or 8 + n > size:
            raise SourceError(f"{path}: not a safetensors file (header length {n} for a {size}-byte file)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SourceError(f"{path}: not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise SourceError(f"{path}: not a safetensors file (header is not a JSON object)")
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = SAFETENSORS_DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            b, e = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SourceError(f"{path}: malformed safetensors entry for {name!r}") from None
        if any(d < 0 for d in shape) or not 0 <= b <= e:
            raise SourceError(f"{path}: malformed safetensors entry for {name!r}")
        if e - b != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
            raise SourceError(f"{path}: tensor {name!r} has {e - b} bytes for shape {shape} of {info['dtype']}")
        if base + e > size:
            raise SourceError(f"{path}: truncated: tensor {name!r} ends at byte {base + e}, file has {size}")
        out[name] = (dt, shape, base + b, base + e)
    return out


def safetensors_load(path: str, dtype: np.dtype, shape: tuple, begin: int, end: int) -> np.ndarray:
    """One tensor as a read-only memory-mapped array: no copy; pages are read as they are touched, and the
    mapping goes away with the array."""
    if end == begin:
        return np.zeros(shape, dtype)
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=begin, shape=(end - begin,))
    return np.asarray(mm).view(dtype).reshape(shape)


def torch_load(path: str):
    """``torch.load`` with ``weights_only=True`` (memory-mapped when the file is in the zip format)."""
    import pickle

    import torch

    _check_file(path)
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise SourceError(f"{path}: {e}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "Weights only load failed" in first:
            raise SourceError(f"{path}: refused: loading it needs arbitrary unpickling (only tensors and plain "
                              f"containers are read, weights_only=True)") from None
        raise SourceError(f"{path}: not a PyTorch file ({first or type(e).__name__})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError, struct.error) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "failed finding central directory" in msg or "PytorchStreamReader" in msg:
            msg = "truncated or corrupt zip archive"
        elif isinstance(e, EOFError):
            msg = "truncated file"
        raise SourceError(f"{path}: not a readable PyTorch file ({msg})") from None


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

    special = {torch.bfloat16: BFLOAT16, torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
               torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2)}
    if dt in special:
        return special[dt]
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


def npz_index(path: str) -> dict[str, tuple[np.dtype, tuple]]:
    _check_file(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {}
            for k in z.files:
                # read only the .npy header of each member
                with z.zip.open(k + ".npy" if k + ".npy" in z.zip.namelist() else k) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read(f)
                out[k] = (np.dtype(dtype), tuple(shape))
            return out
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise SourceError(f"{path}: not a readable .npz file ({e})") from None


def npz_load(path: str, name: str) -> np.ndarray:
    with np.load(path, allow_pickle=False) as z:
        return np.array(z[name], copy=True)
