"""Dtype helpers: names, bit layouts of the float formats, and unsigned views of bit patterns."""

from __future__ import annotations

import numpy as np
from lmc.formats.dtypes import BFLOAT16, BY_NAME, DTYPES, dtype_name  # noqa: F401 - the one table, re-exported

from .errors import ConfigError

# name -> numpy dtype, for configs and safetensors ("BF16") alike: the formats layer's table, plus short names
_ALIASES = {"f64": "float64", "fp64": "float64", "fp32": "float32", "f32": "float32", "fp16": "float16",
            "f16": "float16", "bf16": "bfloat16"}
_BY_NAME = {**{d.name: d.numpy for d in DTYPES}, **{d.safetensors: d.numpy for d in DTYPES},
            **{a: BY_NAME[n].numpy for a, n in _ALIASES.items()}}

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
