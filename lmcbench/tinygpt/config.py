"""The tinygpt training options, typed: :class:`TrainConfig` is where their defaults are written.

``conf/source/tinygpt.yaml``'s ``train:`` block states the same defaults for Hydra, and
``tests/test_config_defaults.py`` fails when the two disagree; presets (``tinygpt_large.yaml``) override them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    """Model size, schedule and data of one tinygpt series (every field is part of the series' cache key, with
    the corpus' SHA-256)."""

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    block_size: int = 128
    batch_size: int = 16
    max_steps: int = 800
    save_steps: int = 100
    lr: float = 1e-3
    warmup_steps: int = 80
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    seed: int = 0
    corpus_bytes: int = 4_000_000  # of the pinned corpus (2,289,623 bytes: a larger value takes all of it)

    def to_dict(self) -> dict:
        """The options as the trainer takes them (``betas`` a tuple), in field order."""
        return dataclasses.asdict(self)

    @classmethod
    def from_options(cls, train=None) -> "TrainConfig":
        """The defaults updated by ``train`` (a mapping, e.g. ``source.train``), every value checked: unknown
        names, wrong types and impossible sizes are one-line :class:`ConfigError` s."""
        defaults = cls().to_dict()
        opts = dict(defaults)
        for k, v in dict(train or {}).items():
            if k not in defaults:
                raise ConfigError(f"source.train: unknown option {k!r}; known: {', '.join(defaults)}")
            want = type(defaults[k])
            if k == "betas":
                ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(b, (int, float)) for b in v)
                v = tuple(float(b) for b in v) if ok else v
            elif want is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                v = float(v) if ok else v
            else:
                ok = isinstance(v, want) and not isinstance(v, bool)
            if not ok:
                raise ConfigError(f"source.train.{k}: expected {want.__name__}, got {v!r}")
            opts[k] = v
        if min(opts[k] for k in ("n_layer", "n_embd", "n_head", "block_size", "batch_size", "max_steps",
                                 "corpus_bytes")) <= 0:
            raise ConfigError("source.train: sizes and step counts must be positive")
        if opts["n_embd"] % opts["n_head"]:
            raise ConfigError("source.train: n_embd must be a multiple of n_head")
        if opts["save_steps"] <= 0 or opts["max_steps"] < opts["save_steps"]:
            raise ConfigError("source.train: need 0 < save_steps <= max_steps")
        return cls(**opts)


TRAIN_DEFAULTS = TrainConfig().to_dict()  # the defaults as a dict (what Trainer, evaluate and the tests merge)
