"""``store.*``: the options of ``task: store`` (``lmcbench experiment=checkpoint_store``), where their defaults are
written. ``conf/experiment/checkpoint_store.yaml`` states the same values (``tests/test_config_defaults.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from lmc.archive import DEFAULT_KEYFRAME_EVERY

from ..errors import ConfigError

# every way of saving a checkpoint the task knows, in report order
METHODS = ["torch_save", "zstd_torch_save", "zipnn", "dcp", "dcp_zstd", "lmc_archive", "lmc_archive_bg",
           "lmc_archive_behind", "lmc_dcp", "lmc_dcp_async", "lmc_dcp_behind"]
# store.variants: the dtype the model weights are saved in (the Adam moments stay as they are: fp32)
VARIANTS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass
class StoreConfig:
    """``methods``: which savers (:data:`METHODS`); ``variants``: the weights' dtype per pass (``fp32``, ``bf16``,
    ``fp16``; moments stay fp32); ``keyframe_every``: the LMC methods code each checkpoint against the previous
    one and start a new chain every K checkpoints; ``threads``: LMC's and ZipNN's threads (null: all cores);
    ``zstd_level``: of ``zstd_torch_save``; ``keep_checkpoints``:
    keep every method's files in the run directory (otherwise each is deleted once no later restore needs it);
    ``tile``: K > 1 makes a larger series of the same real tensors (checkpoint j is the series' checkpoints j to
    j + K - 1 concatenated tensor by tensor along the first dimension: K times the bytes, consecutive checkpoints
    still consecutive steps at every position, no repeated data; the report labels it so)."""

    methods: list = field(default_factory=lambda: list(METHODS))
    variants: list = field(default_factory=lambda: ["fp32", "bf16"])
    keyframe_every: int = DEFAULT_KEYFRAME_EVERY  # (lmc's one default; the preset's yaml states it too)
    threads: int | None = None
    zstd_level: int = 3
    keep_checkpoints: bool = False
    tile: int = 1

    @classmethod
    def from_options(cls, opts: dict | None) -> "StoreConfig":
        opts = dict(opts or {})
        known = [f.name for f in dataclasses.fields(cls)]
        bad = sorted(set(opts) - set(known))
        if bad:
            raise ConfigError(f"store: unknown option(s) {', '.join(bad)}; known: {', '.join(known)}")
        c = cls(**opts)
        c.methods = _names("store.methods", c.methods, METHODS)
        c.variants = _names("store.variants", c.variants, list(VARIANTS))
        _int("store.keyframe_every", c.keyframe_every, 1, "a positive integer (checkpoints)")
        if c.threads is not None:
            _int("store.threads", c.threads, 1, "a positive integer or null (all cores)")
        _int("store.zstd_level", c.zstd_level, 1, "an integer in [1, 22]", hi=22)
        _int("store.tile", c.tile, 1, "a positive integer (series checkpoints per tiled checkpoint)")
        if not isinstance(c.keep_checkpoints, bool):
            raise ConfigError(f"store.keep_checkpoints: expected true or false, got {c.keep_checkpoints!r}")
        return c


def _names(key: str, value, known: list) -> list:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{key}: expected a non-empty list of {', '.join(known)}; got {value!r}")
    bad = [v for v in value if v not in known]
    if bad:
        raise ConfigError(f"{key}: unknown {', '.join(map(repr, bad))}; known: {', '.join(known)}")
    return list(dict.fromkeys(value))


def _int(key: str, v, lo: int, what: str, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise ConfigError(f"{key}: expected {what}, got {v!r}")
