"""The pipeline state, :class:`Stream`, and the base class of every transform, :class:`Transform`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
