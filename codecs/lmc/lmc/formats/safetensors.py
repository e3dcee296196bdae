"""safetensors files: the header read and validated by hand, tensors as read-only memory-mapped numpy views.

Each reader raises :class:`SourceError` with one line naming the file. (Inside this package ``safetensors``
still means the library: imports are absolute.)
"""

from __future__ import annotations

import struct

import numpy as np

from .dtypes import DTYPES
from .errors import SourceError
from .fileio import check_file, one_line, strict_json
from .tensors import TensorRef

SAFETENSORS_DTYPES = {d.safetensors: d.numpy for d in DTYPES if d.safetensors != "C64"}  # (the one table)
_MAX_HEADER = 100 * 1024 * 1024


def parse_header(f, size: int, where: str = "safetensors file"):
    """A safetensors file's header, parsed strictly (the archive keeps a file that fails as bytes; lmcbench's
    reader says why in one line): ``(header_len, [(name, dtype code, shape, begin, end), ...])`` sorted by
    ``begin``, absolute offsets. Checked: the length, JSON without duplicate keys or NaN, each entry's fields and
    types, offsets inside the file, byte size = shape x item size for the dtypes of the table (others, unknown
    codes, are the caller's to refuse or keep), no two tensors overlapping. Raises :class:`SourceError`."""
    def bad(msg):
        raise SourceError(f"{where}: {msg}")

    if size < 8:
        bad("truncated safetensors file (no header length)")
    f.seek(0)
    head = f.read(8)
    if len(head) != 8:
        bad("truncated safetensors file (no header length)")
    (n,) = struct.unpack("<Q", head)
    if n == 0 or n > _MAX_HEADER or n > size - 8:
        bad(f"not a safetensors file (header length {n} for a {size}-byte file)")
    raw = f.read(n)
    if len(raw) != n:
        bad("truncated safetensors file (short header)")
    try:
        obj = strict_json(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        bad(f"not a safetensors file (header is not JSON: {one_line(e)[:80]})")
    if not isinstance(obj, dict):
        bad("not a safetensors file (header is not a JSON object)")
    base = 8 + n
    out = []
    for name, v in obj.items():
        if name == "__metadata__":
            continue
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            bad(f"malformed safetensors entry for {name!r}")
        dt, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if (not isinstance(dt, str) or not isinstance(shape, list) or len(shape) > 64
                or any(type(d) is not int or d < 0 for d in shape) or not isinstance(offs, list)
                or len(offs) != 2 or any(type(o) is not int for o in offs) or not 0 <= offs[0] <= offs[1]):
            bad(f"malformed safetensors entry for {name!r}")
        b, e = offs
        if base + e > size:
            bad(f"truncated: tensor {name!r} ends at byte {base + e}, file has {size}")
        numel = 1
        for d in shape:
            numel *= d
        if dt in SAFETENSORS_DTYPES and numel * SAFETENSORS_DTYPES[dt].itemsize != e - b:
            bad(f"tensor {name!r} has {e - b} bytes for shape {tuple(shape)} of {dt}")
        out.append((name, dt, [int(d) for d in shape], base + b, base + e))
    out.sort(key=lambda t: (t[3], t[4]))
    pos, prev = base, None
    for t in out:
        if t[3] < pos:
            bad(f"tensors {prev!r} and {t[0]!r} overlap")
        pos, prev = max(pos, t[4]), t[0]
    return base, out


def safetensors_index(path: str) -> dict[str, tuple[np.dtype, tuple, int, int]]:
    """``name -> (dtype, shape, begin, end)`` (absolute file offsets), validated against the file size."""
    size = check_file(path)
    with open(path, "rb") as f:
        _, entries = parse_header(f, size, path)
    out = {}
    for name, dt, shape, b, e in entries:
        if dt not in SAFETENSORS_DTYPES:
            raise SourceError(f"{path}: malformed safetensors entry for {name!r} (dtype {dt!r})")
        out[name] = (SAFETENSORS_DTYPES[dt], tuple(shape), b, e)
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
