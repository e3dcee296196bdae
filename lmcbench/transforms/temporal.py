"""The temporal transforms, which take the same tensor ``lag`` checkpoints back: :class:`Delta` (XOR or
subtraction of the bit patterns) and :class:`Reference` (handed to a codec that deltas on its own)."""

from __future__ import annotations

import numpy as np

from ..dtypes import bits
from ..errors import ConfigError
from .base import Stream, Transform, _single


def _check_lag(what: str, lag) -> int:
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
        raise ConfigError(f"{what}: lag must be a positive integer (checkpoints back), got {lag!r}")
    return lag


class Delta(Transform):
    """Temporal delta of the bit patterns against the same tensor ``lag`` checkpoints back (the decoded one).

    ``mode='xor'`` XORs the patterns; ``mode='sub'`` subtracts them as unsigned integers modulo 2^bits.
    ``lag`` counts checkpoints of the selected series: 1 is the previous one, 2 the one before it, ...
    While there is no reference (the first ``lag`` steps of a series) it passes the tensor through unchanged.
    """

    transform_id = "delta"
    temporal = True

    def __init__(self, mode: str = "xor", lag: int = 1):
        if mode not in ("xor", "sub"):
            raise ConfigError(f"delta: unknown mode {mode!r}; use 'xor' or 'sub'")
        self.mode = mode
        self.lag = _check_lag("delta", lag)

    def get_config(self) -> dict:
        cfg = {"id": self.transform_id, "mode": self.mode}
        if self.lag != 1:
            cfg["lag"] = self.lag
        return cfg

    @property
    def label(self) -> str:
        base = "delta" if self.mode == "xor" else "delta_sub"
        return base if self.lag == 1 else f"{base}_lag{self.lag}"

    def _ref_bits(self, ref, s: Stream):
        r = bits(ref)
        if r.dtype != s.data.dtype or r.shape != s.data.shape:
            raise ValueError(f"delta: reference of {r.dtype}{r.shape} does not match tensor {s.data.dtype}{s.data.shape}")
        return r

    def encode(self, streams, ref, dtype):
        return self._against(streams, ref, np.subtract)

    def decode(self, streams, ref, dtype):
        return self._against(streams, ref, np.add)

    def _against(self, streams, ref, arith):
        """XOR with the reference (its own inverse), or ``arith`` (subtract to encode, add to decode)."""
        s = _single(streams, "delta")
        if ref is None:
            return streams
        r = self._ref_bits(ref, s)
        out = np.bitwise_xor(s.data, r) if self.mode == "xor" else arith(s.data, r)
        return [Stream(s.name, out, s.typed)]


class Reference(Transform):
    """Hands the codec the same tensor ``lag`` checkpoints back as a *reference*, and leaves the tensor as it
    is: a codec that deltas on its own (LMC's ``reference=``, which XORs chunk by chunk only where that is
    smaller) decides what to do with it. Only codecs that take a reference can run such a pipeline, and it
    must be the pipeline's only transform (the codec does its own grouping)."""

    transform_id = "reference"
    temporal = True

    def __init__(self, lag: int = 1):
        self.lag = _check_lag("reference", lag)

    def get_config(self) -> dict:
        cfg = {"id": self.transform_id}
        if self.lag != 1:
            cfg["lag"] = self.lag
        return cfg

    @property
    def label(self) -> str:
        return "reference" if self.lag == 1 else f"reference_lag{self.lag}"

    def encode(self, streams, ref, dtype):
        s = _single(streams, "reference")
        if ref is None:
            return streams
        r = bits(ref)
        if r.dtype != s.data.dtype or r.shape != s.data.shape:
            raise ValueError(f"reference: {r.dtype}{r.shape} does not match tensor {s.data.dtype}{s.data.shape}")
        return [Stream(s.name, s.data, s.typed, ref=r)]

    def decode(self, streams, ref, dtype):
        return [Stream(s.name, s.data, s.typed) for s in streams]
