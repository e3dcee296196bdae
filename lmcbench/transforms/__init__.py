"""Invertible transforms that turn a tensor into byte streams for a codec.

A pipeline state is a list of :class:`Stream` objects. It starts as one stream holding the tensor's bit
patterns (an unsigned integer array of the tensor's width). *Temporal* transforms (delta) work on that whole
tensor against a reference, the previous step's decoded tensor; *splitting* transforms (byte-grouping,
exponent split) cut streams into narrower ones. Every transform is lossless and its ``decode`` reverses
``encode`` bit-exactly, for every dtype (NaN, Inf and subnormal patterns included).

Streams are 2-D ``uint8`` arrays of shape ``(n, width)`` or 1-D arrays of any unsigned type: a codec sees
their bytes, and dtype-aware codecs (LMC, ZipNN, OpenZL) see ``Stream.typed``, the tensor's own dtype,
when a stream still holds whole elements of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..dtypes import FLOAT_LAYOUT, bits, dtype_name, uint_dtype
from ..errors import ConfigError


@dataclass
class Stream:
    name: str
    data: np.ndarray  # contiguous; (n,) unsigned or (n, w) uint8
    typed: np.dtype | None = None  # the element dtype a dtype-aware codec should see, if meaningful
    ref: np.ndarray | None = None  # bit patterns of the reference, for a codec that deltas on its own

    def ref_typed(self) -> np.ndarray | None:
        """The reference as the stream's typed dtype (for codecs that take ``reference=``), or None."""
        if self.ref is None:
            return None
        return self.ref.reshape(-1).view(self.typed if self.typed is not None else np.uint8)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def as_bytes(self) -> np.ndarray:
        return self.data.reshape(-1).view(np.uint8)

    def as_typed(self) -> np.ndarray:
        """The stream as an array of its typed dtype (for dtype-aware codecs)."""
        if self.typed is None:
            return self.as_bytes()
        return self.data.reshape(-1).view(self.typed)


class Transform:
    """Base class. ``transform_id`` names it in configs and records."""

    transform_id: str = ""
    temporal = False  # needs the previous step of the same tensor

    def get_config(self) -> dict:
        return {"id": self.transform_id}

    @property
    def label(self) -> str:
        return self.transform_id

    def encode(self, streams: list[Stream], ref: np.ndarray | None, dtype: np.dtype) -> list[Stream]:
        raise NotImplementedError

    def decode(self, streams: list[Stream], ref: np.ndarray | None, dtype: np.dtype) -> list[Stream]:
        raise NotImplementedError


def _single(streams: list[Stream], what: str) -> Stream:
    if len(streams) != 1 or streams[0].data.ndim != 1:
        raise ConfigError(f"{what} must come before any splitting transform in a pipeline")
    return streams[0]


def _check_lag(what: str, lag) -> int:
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
        raise ConfigError(f"{what}: lag must be a positive integer (checkpoints back), got {lag!r}")
    return lag


class Delta(Transform):
    """Temporal delta of the bit patterns against the same tensor ``lag`` checkpoints back (the decoded one).

    ``mode='xor'`` XORs the patterns; ``mode='sub'`` subtracts them as unsigned integers modulo 2^bits.
    ``lag`` counts checkpoints of the selected series: 1 is the previous one, 2 the one before it, ...
    While there is no reference (the first ``lag`` steps of a series) it passes the tensor through unchanged.
    """

    transform_id = "delta"
    temporal = True

    def __init__(self, mode: str = "xor", lag: int = 1):
        if mode not in ("xor", "sub"):
            raise ConfigError(f"delta: unknown mode {mode!r}; use 'xor' or 'sub'")
        self.mode = mode
        self.lag = _check_lag("delta", lag)

    def get_config(self) -> dict:
        cfg = {"id": self.transform_id, "mode": self.mode}
        if self.lag != 1:
            cfg["lag"] = self.lag
        return cfg

    @property
    def label(self) -> str:
        base = "delta" if self.mode == "xor" else "delta_sub"
        return base if self.lag == 1 else f"{base}_lag{self.lag}"

    def _ref_bits(self, ref, s: Stream):
        r = bits(ref)
        if r.dtype != s.data.dtype or r.shape != s.data.shape:
            raise ValueError(f"delta: reference of {r.dtype}{r.shape} does not match tensor {s.data.dtype}{s.data.shape}")
        return r

    def encode(self, streams, ref, dtype):
        return self._against(streams, ref, np.subtract)

    def decode(self, streams, ref, dtype):
        return self._against(streams, ref, np.add)

    def _against(self, streams, ref, arith):
        """XOR with the reference (its own inverse), or ``arith`` (subtract to encode, add to decode)."""
        s = _single(streams, "delta")
        if ref is None:
            return streams
        r = self._ref_bits(ref, s)
        out = np.bitwise_xor(s.data, r) if self.mode == "xor" else arith(s.data, r)
        return [Stream(s.name, out, s.typed)]


class Reference(Transform):
    """Hands the codec the same tensor ``lag`` checkpoints back as a *reference*, and leaves the tensor as it
    is: a codec that deltas on its own (LMC's ``reference=``, which XORs chunk by chunk only where that is
    smaller) decides what to do with it. Only codecs that take a reference can run such a pipeline, and it
    must be the pipeline's only transform (the codec does its own grouping)."""

    transform_id = "reference"
    temporal = True

    def __init__(self, lag: int = 1):
        self.lag = _check_lag("reference", lag)

    def get_config(self) -> dict:
        cfg = {"id": self.transform_id}
        if self.lag != 1:
            cfg["lag"] = self.lag
        return cfg

    @property
    def label(self) -> str:
        return "reference" if self.lag == 1 else f"reference_lag{self.lag}"

    def encode(self, streams, ref, dtype):
        s = _single(streams, "reference")
        if ref is None:
            return streams
        r = bits(ref)
        if r.dtype != s.data.dtype or r.shape != s.data.shape:
            raise ValueError(f"reference: {r.dtype}{r.shape} does not match tensor {s.data.dtype}{s.data.shape}")
        return [Stream(s.name, s.data, s.typed, ref=r)]

    def decode(self, streams, ref, dtype):
        return [Stream(s.name, s.data, s.typed) for s in streams]


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


TRANSFORMS = {cls.transform_id: cls for cls in (Delta, Reference, ByteGroup, ExpSplit)}


def get_transform(config) -> Transform:
    cfg = dict(config)
    tid = cfg.pop("id", None)
    if tid not in TRANSFORMS:
        raise ConfigError(f"unknown transform {tid!r}; known: {', '.join(sorted(TRANSFORMS))}")
    try:
        return TRANSFORMS[tid](**cfg)
    except TypeError as e:
        raise ConfigError(f"transform {tid}: {e}") from None


class Pipeline:
    """An ordered list of transforms, applied to a tensor with an optional reference."""

    def __init__(self, name: str, transforms: list[Transform]):
        self.name = name
        self.transforms = transforms
        seen_split = False
        for t in transforms:
            if t.temporal and seen_split:
                raise ConfigError(f"pipeline {name}: {t.label} must come before any splitting transform")
            if isinstance(t, ExpSplit) and seen_split:
                raise ConfigError(f"pipeline {name}: expsplit must come before bytegroup")
            seen_split |= not t.temporal
        self.temporal = any(t.temporal for t in transforms)
        lags = {t.lag for t in transforms if t.temporal}
        if len(lags) > 1:
            raise ConfigError(f"pipeline {name}: its temporal transforms use different lags {sorted(lags)}")
        self.lag = lags.pop() if lags else 0  # checkpoints back the reference is taken from
        self.codec_reference = any(isinstance(t, Reference) for t in transforms)
        if self.codec_reference and len(transforms) != 1:
            raise ConfigError(f"pipeline {name}: 'reference' must be the only transform (the codec groups itself)")

    @classmethod
    def from_config(cls, name: str, steps) -> "Pipeline":
        return cls(name, [get_transform(s) for s in (steps or [])])

    def get_config(self) -> list:
        return [t.get_config() for t in self.transforms]

    @property
    def temporal_transform(self) -> Transform | None:
        """The transform that takes the reference (delta or reference), or None for a standalone pipeline."""
        return next((t for t in self.transforms if t.temporal), None)

    def encode(self, x: np.ndarray, ref: np.ndarray | None = None) -> list[Stream]:
        """The streams of ``x``: every transform applied in order (``ref``: the tensor ``lag`` steps back, or
        None where there is none yet)."""
        dtype = x.dtype
        streams = [Stream("raw", bits(x), dtype)]  # a view: transforms and codecs never write to it
        for t in self.transforms:
            streams = t.encode(streams, ref, dtype)
        return streams

    def decode(self, streams: list[Stream], ref, dtype: np.dtype, shape) -> np.ndarray:
        """The tensor back from its streams: every transform undone, in reverse order, with the same ``ref``."""
        for t in reversed(self.transforms):
            streams = t.decode(streams, ref, dtype)
        (s,) = streams
        return s.data.view(np.dtype(dtype)).reshape(shape)


__all__ = ["Stream", "Transform", "Delta", "Reference", "ByteGroup", "ExpSplit", "Pipeline", "TRANSFORMS", "get_transform",
           "dtype_name"]
