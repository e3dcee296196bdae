"""The XOR analysis (``xor.csv``): which elements, bytes and bits of a tensor changed since an earlier step."""

from __future__ import annotations

import numpy as np

from ..dtypes import FLOAT_LAYOUT, bits, dtype_name
from .records import XOR_COLUMNS, CsvAppender


class XorAnalysis:
    """Writes ``xor.csv`` as the tensors come: each step of a tensor against the steps ``lags`` checkpoints
    before it, keeping as many earlier steps of each tensor in hand as the largest lag. Tensor-major, the
    runner calls :meth:`new_tensor` between tensors and only the current one's are kept; step-major, every
    tensor's are (told apart by ``key``)."""

    def __init__(self, path: str, lags, slice_bytes: int):
        self.out = CsvAppender(path, XOR_COLUMNS)
        self.lags = sorted(set(lags))
        self.slice_bytes = slice_bytes
        self.prev: dict = {}  # tensor key -> (step, array) of its earlier steps, oldest first

    def new_tensor(self):
        self.prev = {}

    def add(self, rec, key=None):
        prev = self.prev.get(key, [])
        for lag in self.lags:
            if len(prev) >= lag:
                pstep, parr = prev[-lag]
                if parr.shape == rec.array.shape and parr.dtype == rec.array.dtype:
                    self.out.write([{**xor_row(rec, pstep, parr, self.slice_bytes), "lag": lag}])
        self.prev[key] = (prev + [(rec.step, rec.array)])[-self.lags[-1]:]

    def close(self):
        self.out.close()


def xor_row(rec, ref_step: int, ref: np.ndarray, slice_bytes: int) -> dict:
    """What changed between a tensor and its previous step: elements, bytes and bits, by field of the float
    (sign, exponent, mantissa) and per bit position (``bit_flips``: counts from the most significant bit down,
    separated by ``/``)."""
    x, r = bits(rec.array), bits(ref)
    width = x.dtype.itemsize * 8
    flips = np.zeros(width, np.int64)
    changed_elems = changed_bytes = 0
    step = max(1, slice_bytes // x.dtype.itemsize)
    for b in range(0, x.size, step):
        d = np.bitwise_xor(x[b:b + step], r[b:b + step])
        changed_elems += int(np.count_nonzero(d))
        changed_bytes += int(np.count_nonzero(d.view(np.uint8)))
        for k in range(width):
            flips[width - 1 - k] += int(np.count_nonzero(d & np.array(1 << k, d.dtype)))
    ebits, mbits = FLOAT_LAYOUT.get(np.dtype(rec.dtype), (0, width))
    sign = int(flips[0]) if ebits else 0
    return {"step": rec.step, "ref_step": ref_step, "tensor": rec.name, "kind": rec.kind,
            "dtype": dtype_name(rec.dtype), "numel": int(x.size), "changed_elems": changed_elems,
            "changed_bytes": changed_bytes, "changed_bits": int(flips.sum()), "sign_flips": sign,
            "exponent_flips": int(flips[1:1 + ebits].sum()) if ebits else 0,
            "mantissa_flips": int(flips[width - mbits:].sum()) if ebits else int(flips.sum()),
            "bit_flips": "/".join(str(int(v)) for v in flips)}
