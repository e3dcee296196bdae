"""The codec registry: codecs by ``codec_id`` (:func:`register_codec`, :func:`get_codec`), the optional ones
imported on first use."""

from __future__ import annotations

import importlib

from ..errors import ConfigError, NotApplicable
from .base import Codec

_REGISTRY: dict[str, type[Codec]] = {}
# codec ids whose classes live in optional modules, imported on first use
_LAZY = {
    "memcpy": "lmcbench.codecs.basic", "bz2": "lmcbench.codecs.basic", "lzma": "lmcbench.codecs.basic",
    "zstd": "lmcbench.codecs.basic", "lz4": "lmcbench.codecs.basic", "brotli": "lmcbench.codecs.basic",
    "zipnn": "lmcbench.codecs.peers", "openzl": "lmcbench.codecs.peers", "lmc": "lmcbench.codecs.lmc",
    "z4ai": "lmcbench.codecs.peers", "blosc2": "lmcbench.codecs.peers", "pcodec": "lmcbench.codecs.peers",
}


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
