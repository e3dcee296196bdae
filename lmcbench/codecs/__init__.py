"""Codec wrappers behind one interface that follows numcodecs' contract.

Every codec has a ``codec_id``, ``encode(buf) -> bytes``, ``decode(buf, out=None)``, ``get_config()``
returning exactly its constructor's arguments plus ``id``, ``from_config(cfg)``, and is found in a registry.
A codec config in ``conf/codec/`` equals its ``get_config()``, so any row of the results can be replayed.

``encode`` receives a contiguous numpy array (the caller's buffer: never modified) and returns bytes;
``decode`` returns the decoded bytes as a ``uint8`` array (or fills ``out``). Dtype-aware codecs read the
array's dtype; byte codecs read its bytes.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..errors import ConfigError, NotApplicable

_REGISTRY: dict[str, type["Codec"]] = {}
# codec ids whose classes live in optional modules, imported on first use
_LAZY = {
    "memcpy": "lmcbench.codecs.basic", "bz2": "lmcbench.codecs.basic", "lzma": "lmcbench.codecs.basic",
    "zstd": "lmcbench.codecs.basic", "lz4": "lmcbench.codecs.basic", "brotli": "lmcbench.codecs.basic",
    "zipnn": "lmcbench.codecs.peers", "openzl": "lmcbench.codecs.peers", "lmc": "lmcbench.codecs.lmc",
    "z4ai": "lmcbench.codecs.peers", "blosc2": "lmcbench.codecs.peers", "pcodec": "lmcbench.codecs.peers",
}


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


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Register ``cls`` under its ``codec_id`` (usable as a class decorator)."""
    if not cls.codec_id:
        raise ValueError(f"{cls.__name__} has no codec_id")
    _REGISTRY[cls.codec_id] = cls
    return cls


def get_codec_class(codec_id: str) -> type[Codec]:
    if codec_id not in _REGISTRY and codec_id in _LAZY:
        importlib.import_module(_LAZY[codec_id])
    if codec_id not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(_LAZY))
        raise ConfigError(f"unknown codec {codec_id!r}; known: {', '.join(known)}")
    return _REGISTRY[codec_id]


def get_codec(config: dict) -> Codec:
    """Instantiate a codec from its config (``{"id": "zstd", "level": 3}``), as numcodecs does."""
    cfg = dict(config)
    codec_id = cfg.get("id")
    cls = get_codec_class(codec_id)
    try:
        return cls.from_config(cfg)
    except TypeError as e:
        raise ConfigError(f"codec {codec_id}: {e}") from None


def available_codecs() -> list[str]:
    """Codec ids whose libraries import on this machine."""
    ok = []
    for cid in sorted(set(_REGISTRY) | set(_LAZY)):
        try:
            get_codec_class(cid).check_installed()
            ok.append(cid)
        except (ConfigError, NotApplicable, ImportError):
            pass
    return ok


__all__ = ["Codec", "register_codec", "get_codec", "get_codec_class", "available_codecs", "NotApplicable"]
