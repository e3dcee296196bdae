"""Dtype helpers: names, bit layouts of the float formats, and unsigned views of bit patterns."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import ConfigError

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# name -> numpy dtype, for configs and safetensors ("BF16") alike
_BY_NAME = {
    "float64": np.dtype(np.float64), "f64": np.dtype(np.float64), "F64": np.dtype(np.float64),
    "float32": np.dtype(np.float32), "fp32": np.dtype(np.float32), "f32": np.dtype(np.float32),
    "F32": np.dtype(np.float32),
    "float16": np.dtype(np.float16), "fp16": np.dtype(np.float16), "f16": np.dtype(np.float16),
    "F16": np.dtype(np.float16),
    "bfloat16": BFLOAT16, "bf16": BFLOAT16, "BF16": BFLOAT16,
    "int64": np.dtype(np.int64), "I64": np.dtype(np.int64),
    "int32": np.dtype(np.int32), "I32": np.dtype(np.int32),
    "int16": np.dtype(np.int16), "I16": np.dtype(np.int16),
    "int8": np.dtype(np.int8), "I8": np.dtype(np.int8),
    "uint64": np.dtype(np.uint64), "U64": np.dtype(np.uint64),
    "uint32": np.dtype(np.uint32), "U32": np.dtype(np.uint32),
    "uint16": np.dtype(np.uint16), "U16": np.dtype(np.uint16),
    "uint8": np.dtype(np.uint8), "U8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_), "BOOL": np.dtype(np.bool_),
}

# (exponent bits, mantissa bits) of the IEEE-like float formats
FLOAT_LAYOUT = {
    np.dtype(np.float32): (8, 23),
    np.dtype(np.float16): (5, 10),
    BFLOAT16: (8, 7),
    np.dtype(np.float64): (11, 52),
}

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def resolve(name) -> np.dtype:
    """A dtype from a config name (``bf16``, ``float32``, ``BF16``) or a numpy dtype."""
    if isinstance(name, np.dtype):
        return name
    if isinstance(name, str):
        if name in _BY_NAME:
            return _BY_NAME[name]
        raise ConfigError(f"unknown dtype {name!r}; known: bf16, fp16, fp32, fp64, int8, int16, int32, uint8")
    return np.dtype(name)


def dtype_name(dt: np.dtype) -> str:
    """The short name used in records: ``bfloat16``, ``float32``, ``int8``…"""
    dt = np.dtype(dt)
    return "bfloat16" if dt == BFLOAT16 else dt.name


def uint_dtype(dt: np.dtype) -> np.dtype:
    """The unsigned integer dtype with the same width, to work on bit patterns."""
    try:
        return np.dtype(_UINT[np.dtype(dt).itemsize])
    except KeyError:
        raise ConfigError(f"no unsigned view for dtype {dtype_name(dt)} ({np.dtype(dt).itemsize} bytes)") from None


def bits(x: np.ndarray) -> np.ndarray:
    """A flat unsigned view of the bit patterns of ``x`` (no copy when ``x`` is contiguous)."""
    x = np.ascontiguousarray(x)
    return x.reshape(-1).view(uint_dtype(x.dtype))
