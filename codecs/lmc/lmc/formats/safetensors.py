"""safetensors files: the header read and validated by hand, tensors as read-only memory-mapped numpy views.

Each reader raises :class:`SourceError` with one line naming the file. (Inside this package ``safetensors``
still means the library: imports are absolute.)
"""

from __future__ import annotations

import json
import struct

import numpy as np

from .dtypes import DTYPES
from .errors import SourceError
from .fileio import check_file, one_line
from .tensors import TensorRef

SAFETENSORS_DTYPES = {d.safetensors: d.numpy for d in DTYPES if d.safetensors != "C64"}  # (the one table)
_MAX_HEADER = 100 * 1024 * 1024


def safetensors_index(path: str) -> dict[str, tuple[np.dtype, tuple, int, int]]:
    """``name -> (dtype, shape, begin, end)`` (absolute file offsets), validated against the file size."""
    size = check_file(path)
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


def safetensors_refs(files: list[str], kind_of=None) -> list[TensorRef]:
    """Every tensor of some safetensors files, memory-mapped when loaded; ``kind_of(name)`` (default: weight)."""
    return [TensorRef(name, kind_of(name) if kind_of else "weight", dt, shape,
                      lambda p=path, dt=dt, s=shape, b=b, e=e: safetensors_load(p, dt, s, b, e), path)
            for path in files for name, (dt, shape, b, e) in safetensors_index(path).items()]


def safetensors_metadata(path: str) -> dict | None:
    """The ``__metadata__`` of a file the index has already validated."""
    try:
        from safetensors import safe_open

        with safe_open(path, framework="np") as f:
            return f.metadata()
    except Exception as ex:  # noqa: BLE001 - already validated by the reader; anything here is a bad file
        raise SourceError(f"{path}: cannot read the safetensors metadata ({one_line(ex)})") from None


def load_torch_weights(path: str) -> dict:
    """``name -> torch.Tensor`` of a whole safetensors file (``safetensors.torch.load_file``), any failure one
    line naming the file."""
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as e:  # noqa: BLE001
        raise SourceError(f"{path}: cannot read the weights ({type(e).__name__}: {e})") from None


def save_torch_weights(tensors: dict, path: str, metadata: dict | None = None) -> None:
    """Write ``name -> torch.Tensor`` as a safetensors file (``safetensors.torch.save_file``)."""
    from safetensors.torch import save_file

    save_file(tensors, path, metadata=metadata)
