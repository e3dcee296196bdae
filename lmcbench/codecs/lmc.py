"""LMC, our byte-grouping + entropy codec (the ``lmc`` distribution under ``codecs/lmc``).

Dtype-aware: it sees the stream's element dtype (bf16, fp16, fp32 get an exponent/sign+mantissa split,
other types byte planes), so on the ``raw`` pipeline it does its own grouping."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .base import Codec
from .registry import register_codec


@register_codec
class LMC(Codec):
    codec_id = "lmc"

    def __init__(self, threads: int | None = 1, chunk_size: int | None = None, format_version: int | None = None,
                 prefer: str = "speed"):
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"lmc: threads must be a positive integer or null (all cores), got {threads!r}")
        if format_version is not None and (isinstance(format_version, bool)
                                           or format_version not in range(1, 11)):
            raise ConfigError(f"lmc: format_version must be 1 (lmc 0.1's modes), 2 (lmc 0.2's), 3, 4 (word "
                              f"checksums), 5 (adds the bf16 mantissa-context mode, which only prefer=size "
                              f"takes), 6 (adds the delta mode), 7 (32-state rANS streams, the gated "
                              f"codings against a reference), 8 (7's with a cheaper chunk checksum), 9 (the "
                              f"bf16 joint-symbol mode) or 10 (the default: 9's and the zero mask), "
                              f"got {format_version!r}")
        if prefer not in ("speed", "size", "fast"):
            raise ConfigError(f"lmc: prefer must be 'speed' (the default), 'size' or 'fast', got {prefer!r}")
        params = {"threads": threads}
        if chunk_size is not None:
            params["chunk_size"] = chunk_size
        if format_version is not None:  # absent from the config unless set, so older configs replay unchanged
            params["format_version"] = format_version
        if prefer != "speed":  # likewise
            params["prefer"] = prefer
        super().__init__(**params)

    @classmethod
    def check_installed(cls):
        import lmc  # noqa: F401

    @property
    def label(self):
        t = self._params["threads"]
        fv = self._params.get("format_version")
        base = {1: "lmc-v1", 2: "lmc-v2", 3: "lmc-v3"}.get(fv, "lmc")
        if self._params.get("prefer") in ("size", "fast"):
            base += "-" + self._params["prefer"]
        return base if t == 1 else f"{base}-{t or 'all'}t"

    @property
    def threads(self):
        if self._params["threads"] is None:
            import numba

            return numba.config.NUMBA_NUM_THREADS
        return self._params["threads"]

    @property
    def version(self):
        import lmc

        return f"lmc {lmc.__version__}"

    def _encode(self, arr):
        import lmc

        kw = {k: v for k, v in self._params.items() if k != "threads" and v is not None}
        return lmc.compress(arr, threads=self._params["threads"], **kw)

    def _decode(self, buf):
        import lmc

        out = lmc.decompress(buf, threads=self._params["threads"])
        return np.ascontiguousarray(out).reshape(-1).view(np.uint8)

    # the ``reference`` pipeline: per chunk LMC codes alone, XORed with the reference, or (floats) in its
    # temporal (format 2) or delta (format 6) mode, whichever its estimates say is smallest; prefer=fast never
    # the temporal mode
    supports_reference = True
    takes_rows = True  # format 3 predicts an exponent from the element above it: the row length is the shape's

    def _encode_ref(self, arr, reference):
        import lmc

        kw = {k: v for k, v in self._params.items() if k != "threads" and v is not None}
        return lmc.compress(arr, threads=self._params["threads"], reference=reference, **kw)

    def _decode_ref(self, buf, reference):
        import lmc

        return lmc.decompress(buf, threads=self._params["threads"], reference=reference)
