"""The splitting transforms, which cut streams into narrower ones: :class:`ByteGroup` (byte planes) and
:class:`ExpSplit` (exponent apart from sign and mantissa)."""

from __future__ import annotations

import re

import numpy as np

from ..dtypes import FLOAT_LAYOUT, uint_dtype
from .base import Stream, Transform, _single


class ByteGroup(Transform):
    """Byte-grouping: byte ``j`` of every element into plane ``b<j>`` (little-endian: ``b0`` is the least
    significant byte). One plane per byte of the element: 2 for 16-bit types, 4 for 32-bit types."""

    transform_id = "bytegroup"

    def encode(self, streams, ref, dtype):
        out = []
        for s in streams:
            planes = s.data if s.data.ndim == 2 else \
                s.data.view(np.uint8).reshape(s.data.shape[0], s.data.itemsize)
            w = planes.shape[1]
            if w == 1:
                out.append(Stream(s.name, planes.reshape(-1), None))
                continue
            out.extend(Stream(_plane_name(s.name, j), np.ascontiguousarray(planes[:, j]), None) for j in range(w))
        return out

    def decode(self, streams, ref, dtype):
        """Planes ``<name>.b0 … b<w-1>`` back into the stream ``<name>`` they were cut from, in the layout every
        stream has (``(n,)`` unsigned for 1, 2, 4 and 8 bytes, else ``(n, w)`` uint8); other streams (one-byte
        ones, which byte-grouping leaves as they are) pass through."""
        out, i = [], 0
        while i < len(streams):
            parent = _plane_of(streams[i].name)
            if parent is None or parent[1] != 0:
                if parent is not None:
                    raise ValueError(f"bytegroup: plane {streams[i].name} without its plane 0")
                out.append(streams[i])
                i += 1
                continue
            w = 1
            while i + w < len(streams) and _plane_of(streams[i + w].name) == (parent[0], w):
                w += 1
            planes = np.empty((streams[i].data.shape[0], w), np.uint8)
            for j in range(w):
                planes[:, j] = streams[i + j].data
            data = planes.view(f"<u{w}").reshape(-1) if w in (2, 4, 8) else planes
            out.append(Stream(parent[0], data, np.dtype(dtype) if parent[0] == "raw" else None))
            i += w
        return out


def _plane_name(name: str, j: int) -> str:
    """Byte-grouping's name for plane ``j`` of stream ``name``: ``b<j>`` for the tensor itself, else
    ``<name>.b<j>`` (``exp.b0``)."""
    return f"b{j}" if name == "raw" else f"{name}.b{j}"


def _plane_of(name: str):
    """``(stream, j)`` for a plane name made by :func:`_plane_name`, else None."""
    m = re.fullmatch(r"(?:(.+)\.)?b(\d+)", name)
    return None if m is None else (m.group(1) or "raw", int(m.group(2)))


class ExpSplit(Transform):
    """Exponent split for floats: the exponent bits of every element in one stream (``exp``, one byte each),
    sign and mantissa in another (``sm``): bf16 -> 1 + 1 bytes, fp32 -> 1 + 3 bytes, fp16 -> 1 + 2 bytes
    (the 5-bit exponent and 11-bit sign+mantissa cannot share bytes compactly), fp64 -> 2 + 7 bytes.

    Non-float dtypes have no exponent: there the transform is byte-grouping, so a pipeline stays valid over
    a mixed checkpoint."""

    transform_id = "expsplit"

    def encode(self, streams, ref, dtype):
        s = _single(streams, "expsplit")
        layout = FLOAT_LAYOUT.get(np.dtype(dtype))
        if layout is None:
            return ByteGroup().encode(streams, ref, dtype)
        ebits, mbits = layout
        u = s.data
        width = u.dtype.itemsize * 8
        exp = (u >> np.array(mbits, u.dtype)) & np.array((1 << ebits) - 1, u.dtype)
        sm = ((u >> np.array(width - 1, u.dtype)) << np.array(mbits, u.dtype)) | (u & np.array((1 << mbits) - 1, u.dtype))
        ew = (ebits + 7) // 8
        sw = (mbits + 1 + 7) // 8
        return [Stream("exp", _narrow(exp, ew)), Stream("sm", _narrow(sm, sw))]

    def decode(self, streams, ref, dtype):
        layout = FLOAT_LAYOUT.get(np.dtype(dtype))
        if layout is None:
            return ByteGroup().decode(streams, ref, dtype)
        ebits, mbits = layout
        ut = uint_dtype(dtype)
        exp = _widen(streams[0].data, ut)
        sm = _widen(streams[1].data, ut)
        width = ut.itemsize * 8
        sign = (sm >> np.array(mbits, ut)) << np.array(width - 1, ut)
        u = sign | (exp << np.array(mbits, ut)) | (sm & np.array((1 << mbits) - 1, ut))
        return [Stream("raw", u, np.dtype(dtype))]


def _narrow(u: np.ndarray, nbytes: int) -> np.ndarray:
    """The low ``nbytes`` bytes of each element: (n,) uint8/uint16 when that fits, else (n, nbytes) uint8."""
    if nbytes in (1, 2, 4, 8) and nbytes <= u.dtype.itemsize:
        return u.astype(np.dtype(f"<u{nbytes}"))
    b = np.ascontiguousarray(u).view(np.uint8).reshape(u.shape[0], u.dtype.itemsize)  # little-endian
    return np.ascontiguousarray(b[:, :nbytes])


def _widen(v: np.ndarray, ut: np.dtype) -> np.ndarray:
    if v.ndim == 1:
        return v.astype(ut)
    n, w = v.shape
    full = np.zeros((n, ut.itemsize), np.uint8)
    full[:, :w] = v
    return full.view(ut).reshape(n)
