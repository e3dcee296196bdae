"""The base class of every codec wrapper, :class:`Codec`: the numcodecs contract, codec-level delta, labels."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, NotApplicable


class Codec:
    """Base class. Subclasses set ``codec_id`` and implement ``_encode``/``_decode`` on bytes."""

    codec_id: str = ""

    def __init__(self, **params: Any):
        self._params = dict(params)

    # -- the numcodecs contract -------------------------------------------------------------------------
    def get_config(self) -> dict:
        return {"id": self.codec_id, **self._params}

    @classmethod
    def from_config(cls, config: dict) -> "Codec":
        cfg = dict(config)
        cfg.pop("id", None)
        return cls(**cfg)

    def encode(self, buf) -> bytes:
        arr = _as_array(buf)
        return self._encode(arr)

    def decode(self, buf, out=None) -> np.ndarray:
        data = self._decode(bytes(buf) if not isinstance(buf, (bytes, bytearray, memoryview)) else buf)
        dec = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
        if out is not None:
            o = np.asarray(out).reshape(-1).view(np.uint8)
            if o.nbytes != dec.nbytes:
                raise ValueError(f"{self.codec_id}: out has {o.nbytes} bytes, decoded {dec.nbytes}")
            o[:] = dec
            return out
        return dec

    # -- codec-level delta ----------------------------------------------------------------------------------
    supports_reference = False  # True for codecs that delta against a reference themselves (LMC)
    takes_rows = False  # True for codecs that use a tensor's rows (LMC's predicted exponent): the runner then
    # passes a slice of whole rows of a tensor as a 2-D (rows, row length) array

    def encode_ref(self, buf, reference) -> bytes:
        """Encode ``buf`` against ``reference`` (same dtype and shape); only if ``supports_reference``."""
        if not self.supports_reference:
            raise NotApplicable(f"{self.codec_id} does not take a reference")
        return self._encode_ref(_as_array(buf), np.ascontiguousarray(reference))

    def decode_ref(self, buf, reference) -> np.ndarray:
        if not self.supports_reference:
            raise NotApplicable(f"{self.codec_id} does not take a reference")
        dec = self._decode_ref(buf, np.ascontiguousarray(reference))
        return np.ascontiguousarray(dec).reshape(-1).view(np.uint8)

    def _encode_ref(self, arr, reference) -> bytes:
        raise NotImplementedError

    def _decode_ref(self, buf, reference):
        raise NotImplementedError

    # -- for reports ---------------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """Codec name and its main setting, e.g. ``zstd-3``."""
        return self.codec_id

    @property
    def threads(self) -> int:
        return 1

    @property
    def version(self) -> str:
        return ""

    def check_applicable(self, arr: np.ndarray) -> None:
        """Raise :class:`NotApplicable` when this codec cannot take ``arr`` (by dtype)."""

    def _encode(self, arr: np.ndarray) -> bytes:
        raise NotImplementedError

    def _decode(self, buf) -> bytes | np.ndarray:
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._params.items())
        return f"{type(self).__name__}({args})"


def _as_array(buf) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf)
    return np.frombuffer(memoryview(buf).cast("B"), np.uint8)


def check_int(codec: str, name: str, value, lo: int, hi: int) -> int:
    """``value`` when it is an integer in ``[lo, hi]``, else a one-line error naming the codec's option."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{codec}: {name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value
