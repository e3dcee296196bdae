"""A :class:`Pipeline` of transforms, built from a config by name (:data:`TRANSFORMS`, :func:`get_transform`)."""

from __future__ import annotations

import numpy as np

from ..dtypes import bits
from ..errors import ConfigError
from .base import Stream, Transform
from .split import ByteGroup, ExpSplit
from .temporal import Delta, Reference


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
