"""Invertible transforms that turn a tensor into byte streams for a codec.

A pipeline state is a list of :class:`Stream` objects. It starts as one stream holding the tensor's bit
patterns (an unsigned integer array of the tensor's width). *Temporal* transforms (delta) work on that whole
tensor against a reference, the previous step's decoded tensor; *splitting* transforms (byte-grouping,
exponent split) cut streams into narrower ones. Every transform is lossless and its ``decode`` reverses
``encode`` bit-exactly, for every dtype (NaN, Inf and subnormal patterns included).

Streams are 2-D ``uint8`` arrays of shape ``(n, width)`` or 1-D arrays of any unsigned type: a codec sees
their bytes, and dtype-aware codecs (LMC, ZipNN, OpenZL) see ``Stream.typed``, the tensor's own dtype,
when a stream still holds whole elements of it.

Modules: :mod:`.base` (the stream and the base class), :mod:`.temporal` (delta, reference), :mod:`.split`
(byte-grouping, exponent split) and :mod:`.pipeline` (a pipeline, and the transforms by name).
"""

from ..dtypes import dtype_name  # noqa: F401 - re-exported, as before
from .base import Stream, Transform
from .pipeline import TRANSFORMS, Pipeline, get_transform
from .split import ByteGroup, ExpSplit
from .temporal import Delta, Reference

__all__ = ["Stream", "Transform", "Delta", "Reference", "ByteGroup", "ExpSplit", "Pipeline", "TRANSFORMS", "get_transform",
           "dtype_name"]
