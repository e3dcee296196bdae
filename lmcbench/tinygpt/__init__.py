"""The embedded tinygpt: a small GPT trained here on a pinned corpus (lmcbench's own source and documentation,
shipped in the package), its trainer and its cached checkpoint series. It knows checkpoint formats
(:mod:`lmc.formats`), nothing of sources.

- :mod:`.config` — :class:`TrainConfig`, the training options and their defaults.
- :mod:`.corpus` — the training text, the same bytes everywhere (its SHA-256 recorded and checked).
- :mod:`.model` — the model.
- :mod:`.trainer` — :class:`Trainer` (train, resume, swap state), :func:`train`, :func:`lr_at`,
  :func:`evaluate`, :func:`eval_checkpoint`.
- :mod:`.series` — the cached series (cache folder and key, :func:`ensure_series`, :class:`Series`).
"""

from .config import TRAIN_DEFAULTS, TrainConfig  # noqa: F401
from .corpus import corpus  # noqa: F401
from .model import build_model  # noqa: F401
from .series import (FORMAT_VERSION, Series, default_cache_dir, ensure_series, series_folder,  # noqa: F401
                     series_key)
from .trainer import Trainer, eval_checkpoint, evaluate, lr_at, train  # noqa: F401

__all__ = ["TRAIN_DEFAULTS", "TrainConfig", "corpus", "build_model", "FORMAT_VERSION", "Series",
           "default_cache_dir", "ensure_series", "series_folder", "series_key", "Trainer", "eval_checkpoint",
           "evaluate", "lr_at", "train"]
