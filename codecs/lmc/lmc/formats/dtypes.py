"""The one dtype table of every checkpoint format lmc reads or writes.

Each row is one element type under the names the formats give it: torch's dtype name (``bfloat16``), the
safetensors code (``BF16``), the legacy storage class that torch pickles name in a ``.pt`` file
(``BFloat16Storage``), the numpy dtype an array of it has (``ml_dtypes.bfloat16`` for bf16, ``np.bool_`` for
bool) and the numpy dtype lmc codes it as (the same, except ``bool``, coded as its bytes, ``uint8``). Types a
format has but lmc does not code (complex128, the rarer float8 kinds, quantized types) have no row: their bytes
are kept as bytes.

torch is never imported here (``torch_dtype`` imports it on use), so the table serves the codec's users who
installed no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str            # torch's name (torch.<name>), also the name in lmc's own metadata
    safetensors: str     # the safetensors header code
    storage: str         # torch's legacy typed-storage class in a pickle (torch.<storage>)
    numpy: np.dtype      # the dtype of an array of these elements
    code: np.dtype       # the dtype lmc codes them as

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


def _row(name, st, storage, npdt, code=None):
    npdt = np.dtype(npdt)
    return DType(name, st, storage, npdt, np.dtype(code) if code is not None else npdt)


DTYPES = (
    _row("float64", "F64", "DoubleStorage", np.float64),
    _row("float32", "F32", "FloatStorage", np.float32),
    _row("float16", "F16", "HalfStorage", np.float16),
    _row("bfloat16", "BF16", "BFloat16Storage", ml_dtypes.bfloat16),
    _row("int64", "I64", "LongStorage", np.int64),
    _row("int32", "I32", "IntStorage", np.int32),
    _row("int16", "I16", "ShortStorage", np.int16),
    _row("int8", "I8", "CharStorage", np.int8),
    _row("uint64", "U64", "UInt64Storage", np.uint64),
    _row("uint32", "U32", "UInt32Storage", np.uint32),
    _row("uint16", "U16", "UInt16Storage", np.uint16),
    _row("uint8", "U8", "ByteStorage", np.uint8),
    _row("bool", "BOOL", "BoolStorage", np.bool_, np.uint8),
    _row("complex64", "C64", "ComplexFloatStorage", np.complex64),
    _row("float8_e4m3fn", "F8_E4M3", "Float8_e4m3fnStorage", ml_dtypes.float8_e4m3fn),
    _row("float8_e5m2", "F8_E5M2", "Float8_e5m2Storage", ml_dtypes.float8_e5m2),
)

BY_NAME = {d.name: d for d in DTYPES}
BY_SAFETENSORS = {d.safetensors: d for d in DTYPES}
BY_STORAGE = {d.storage: d for d in DTYPES}
BY_NUMPY = {d.numpy: d for d in DTYPES}
BFLOAT16 = BY_NAME["bfloat16"].numpy


def dtype_name(dt) -> str:
    """The short name of a numpy dtype used in records and metadata: ``bfloat16``, ``float32``, ``int8``..."""
    return np.dtype(dt).name


def code_name(dt) -> str:
    """The name of a numpy coding dtype (numpy's and ml_dtypes' own names: ``bfloat16``, ``float32``)."""
    return np.dtype(dt).name


# numpy dtypes lmc codes, by name (the "np" field of lmc's archive and DCP metadata)
CODE_DTYPES = {code_name(d.code): d.code for d in DTYPES}


def torch_dtype(name: str):
    """``torch.<name>`` for a row's name (torch imported here, on use)."""
    import torch

    d = BY_NAME.get(name)
    dt = getattr(torch, name, None) if d is not None else None
    if not isinstance(dt, torch.dtype):
        raise KeyError(name)
    return dt


def of_torch(dt) -> DType | None:
    """The row of a torch dtype (None: not in the table)."""
    return BY_NAME.get(str(dt).removeprefix("torch."))
