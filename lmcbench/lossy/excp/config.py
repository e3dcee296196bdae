"""ExCP configuration, errors and the container's constants (see :mod:`lmcbench.lossy.excp` and FORMAT.md).

Configuration (:class:`ExCPConfig`)
-----------------------------------
``alpha`` (5e-5), ``max_scale`` (2.5): the weight-pruning scale. ``beta`` (2.0): the moment-pruning
factor. ``bits`` (4, in 2..8): bits per quantisation index. ``kmeans_iters`` (25),
``samples_per_centroid`` (256), ``seed`` (0): k-means. ``archiver`` ("lzma" | "zstd" | "lmc" | "none")
and ``archiver_level`` (None = 9 for lzma presets 0..9, 19 for zstd levels 1..22; must be None for lmc
and none). ``prune_weights``, ``prune_moments``, ``quantize`` (all True): switch the stages off for
ablations. ``scale_centroids`` (True): the power-of-two centroid scale (step 4 of the algorithm).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError, LmcbenchError


class ExCPError(LmcbenchError):
    """Invalid input given to the ExCP encoder or decoder (not a configuration problem)."""


class ExCPFormatError(ExCPError):
    """A blob that is not a valid ExCP container, or reference weights that do not fit it."""


MAGIC = b"ExCP"
VERSION = 1
_HEADER = struct.Struct("<4sBBHQQII")
HEADER_SIZE = _HEADER.size  # 32
MAX_PAYLOAD_BYTES = 1 << 35  # 32 GiB: default for the largest payload a blob may declare (decode_checkpoint)
LZMA_MEMLIMIT = 256 << 20  # memory limit of the xz decoder (preset 9 needs about 65 MiB)
# the centroid-scale exponents the encoder can emit: frexp(x)[1] - 15 for the smallest non-zero float32
# (2**-149, frexp exponent -148) and the largest (just below 2**128, frexp exponent 128)
EXPONENT_MIN, EXPONENT_MAX = -148 - 15, 128 - 15  # -163, 113
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20  # lzma decompression step (output bytes per call; the bytes in flight are a few times this)
_LMC_CHUNK = 131072  # chunk size (elements) used for the lmc archiver; the decoder requires it
_ARCHIVERS = {"none": 0, "lzma": 1, "zstd": 2, "lmc": 3}
_ARCHIVER_NAMES = {v: k for k, v in _ARCHIVERS.items()}
_LEVELS = {"lzma": (9, 0, 9), "zstd": (19, 1, 22)}  # default, lo, hi
KINDS = ("weight", "exp_avg", "exp_avg_sq")
_F32 = np.dtype(np.float32)


# ----------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ExCPConfig:
    """Every knob of the codec; see the module docstring and :mod:`lmcbench.lossy.excp`. Construct via
    :meth:`from_dict` for checked input."""

    alpha: float = 5e-5
    beta: float = 2.0
    bits: int = 4
    max_scale: float = 2.5
    kmeans_iters: int = 25
    samples_per_centroid: int = 256
    seed: int = 0
    archiver: str = "lzma"
    archiver_level: int | None = None
    prune_weights: bool = True
    prune_moments: bool = True
    quantize: bool = True
    scale_centroids: bool = True

    def __post_init__(self):
        def num(name, lo, strict=False):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
                    or x < lo or (strict and x == lo):
                rel = ">" if strict else ">="
                raise ConfigError(f"excp: {name} must be a finite number {rel} {lo}, got {x!r}")

        def integer(name, lo, hi):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not lo <= x <= hi:
                raise ConfigError(f"excp: {name} must be an integer in [{lo}, {hi}], got {x!r}")

        num("alpha", 0.0)
        num("beta", 0.0)
        num("max_scale", 0.0)
        integer("bits", 2, 8)
        integer("kmeans_iters", 0, 10_000)
        integer("samples_per_centroid", 1, 1 << 24)
        integer("seed", 0, (1 << 63) - 1)
        for name in ("prune_weights", "prune_moments", "quantize", "scale_centroids"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"excp: {name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.archiver, str) or self.archiver not in _ARCHIVERS:
            raise ConfigError(f"excp: unknown archiver {self.archiver!r} (known: {', '.join(_ARCHIVERS)})")
        if self.archiver in _LEVELS:
            if self.archiver_level is not None:
                integer("archiver_level", *_LEVELS[self.archiver][1:])
        elif self.archiver_level is not None:
            raise ConfigError(f"excp: archiver {self.archiver!r} takes no level, got {self.archiver_level!r}")

    @property
    def level(self) -> int | None:
        """The archiver level in effect (the default when ``archiver_level`` is None)."""
        if self.archiver not in _LEVELS:
            return None
        return _LEVELS[self.archiver][0] if self.archiver_level is None else int(self.archiver_level)

    @classmethod
    def from_dict(cls, d) -> "ExCPConfig":
        """Build from a mapping (e.g. a Hydra node); unknown keys or bad values raise :class:`ConfigError`."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ConfigError(f"excp: expected a mapping of options, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise ConfigError(f"excp: unknown option(s) {', '.join(unknown)} (known: {', '.join(known)})")
        return cls(**{str(k): v for k, v in d.items()})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _short(x) -> str:
    """``repr(x)`` cut to 60 characters, for one-line error messages about untrusted values."""
    try:
        s = repr(x)
    except RecursionError:  # a deeply nested JSON value
        return f"a deeply nested {type(x).__name__}"
    return s if len(s) <= 60 else s[:57] + "..."
