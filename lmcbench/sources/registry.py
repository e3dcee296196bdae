"""The source types by name: :func:`get_source` instantiates one from its config, importing its module then."""

from __future__ import annotations

from ..errors import ConfigError
from .base import Source

_SOURCES: dict[str, str] = {
    "hf_trainer": "lmcbench.sources.hf_trainer:HFTrainerSource",
    "files": "lmcbench.sources.files:FilesSource",
    "dcp": "lmcbench.sources.dcp:DCPSource",
    "deepspeed": "lmcbench.sources.deepspeed:DeepSpeedSource",
    "tinygpt": "lmcbench.sources.tinygpt:TinyGPTSource",
    "hf_hub": "lmcbench.sources.hf_hub:HFHubSource",
}


def get_source(config) -> Source:
    """Instantiate a source from its config (``type`` selects the class, the rest are its options)."""
    import importlib

    cfg = dict(config)
    st = cfg.pop("type", None)
    if st not in _SOURCES:
        raise ConfigError(f"unknown source type {st!r}; known: {', '.join(sorted(_SOURCES))}")
    mod, _, cls = _SOURCES[st].partition(":")
    return getattr(importlib.import_module(mod), cls)(**cfg)
