"""What a format reader hands out: a reference to one tensor of a file, with what it is and how to load it,
and the checked load (the loaded array must be what the index said)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .dtypes import dtype_name
from .errors import SourceError

KINDS = ("weight", "master_weight", "exp_avg", "exp_avg_sq", "other")  # master_weight: fp32 master copies
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class TensorRef:
    """One tensor of a checkpoint file, indexed but not read: ``load()`` reads it."""

    name: str
    kind: str  # one of KINDS
    dtype: np.dtype
    shape: tuple
    load: Callable[[], np.ndarray] = field(repr=False, compare=False)
    file: str = ""


def load_checked(loader: Callable[[], np.ndarray], name: str, dtype, shape: tuple, file: str,
                 where: str | None = None) -> np.ndarray:
    """Call ``loader``; any failure, or an array that is not the indexed dtype and shape, is one line naming
    the file (``where`` when the tensor has no file)."""
    try:
        arr = loader()
    except SourceError:
        raise
    except Exception as ex:  # noqa: BLE001 - any reader failure becomes one line naming the file
        raise SourceError(f"{file or where}: cannot read tensor {name!r}: {ex}") from ex
    if arr.dtype != dtype or tuple(arr.shape) != tuple(shape):
        raise SourceError(f"{file}: tensor {name!r} is {dtype_name(arr.dtype)}{arr.shape}, "
                          f"index said {dtype_name(dtype)}{shape}")
    return arr
