"""General-purpose byte codecs: memcpy (the ceiling), bz2, lzma, zstd, lz4 (frame), brotli."""

from __future__ import annotations

import bz2
import lzma
import sys

import numpy as np

from .base import Codec, check_int
from .registry import register_codec


class _Stdlib(Codec):
    """A codec of Python's standard library: always installed; its version is Python's."""

    @classmethod
    def check_installed(cls):
        pass

    @property
    def version(self):
        return f"python {sys.version.split()[0]}"


@register_codec
class Memcpy(Codec):
    """No compression: one copy each way. The bandwidth ceiling every other row is set against."""

    codec_id = "memcpy"

    def __init__(self):
        super().__init__()

    @classmethod
    def check_installed(cls):
        pass

    def _encode(self, arr):
        out = np.empty(arr.nbytes, np.uint8)
        out[:] = arr.reshape(-1).view(np.uint8)
        return out  # a buffer: len() of bytes, no bytes() copy in the timed path

    def _decode(self, buf):
        out = np.empty(len(buf), np.uint8)
        out[:] = np.frombuffer(buf, np.uint8)
        return out

    def encode(self, buf):
        return self._encode(np.ascontiguousarray(buf) if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8))

    @property
    def version(self):
        return f"numpy {np.__version__}"


@register_codec
class BZ2(_Stdlib):
    codec_id = "bz2"

    def __init__(self, level: int = 9):
        super().__init__(level=check_int("bz2", "level", level, 1, 9))

    @property
    def label(self):
        return f"bz2-{self._params['level']}"

    def _encode(self, arr):
        return bz2.compress(arr, self._params["level"])

    def _decode(self, buf):
        return bz2.decompress(buf)


@register_codec
class LZMA(_Stdlib):
    """xz/LZMA2, the 7-Zip stand-in."""

    codec_id = "lzma"

    def __init__(self, preset: int = 6, extreme: bool = False):
        super().__init__(preset=check_int("lzma", "preset", preset, 0, 9), extreme=bool(extreme))

    @property
    def label(self):
        return f"lzma-{self._params['preset']}{'e' if self._params['extreme'] else ''}"

    def _encode(self, arr):
        preset = self._params["preset"] | (lzma.PRESET_EXTREME if self._params["extreme"] else 0)
        return lzma.compress(arr, format=lzma.FORMAT_XZ, preset=preset)

    def _decode(self, buf):
        return lzma.decompress(buf, format=lzma.FORMAT_XZ)


@register_codec
class Zstd(Codec):
    """Zstandard; ``threads`` > 0 uses zstd's own worker threads (0 = single-threaded)."""

    codec_id = "zstd"

    def __init__(self, level: int = 3, threads: int = 0):
        super().__init__(level=check_int("zstd", "level", level, -131072, 22),
                         threads=check_int("zstd", "threads", threads, -1, 256))
        import zstandard

        self._c = zstandard.ZstdCompressor(level=level, threads=threads)
        self._d = zstandard.ZstdDecompressor()

    @classmethod
    def check_installed(cls):
        import zstandard  # noqa: F401

    @property
    def label(self):
        return f"zstd-{self._params['level']}"

    @property
    def threads(self):
        t = self._params["threads"]
        if t == -1:
            import os
            return os.cpu_count() or 1
        return max(1, t)

    @property
    def version(self):
        import zstandard
        return f"zstandard {zstandard.__version__}"

    def _encode(self, arr):
        return self._c.compress(arr)

    def _decode(self, buf):
        return self._d.decompress(buf)


@register_codec
class LZ4(Codec):
    """LZ4 frame format. ``level`` 0 is the fast mode (with ``acceleration``); 3–16 are the HC levels."""

    codec_id = "lz4"

    def __init__(self, level: int = 0):
        super().__init__(level=check_int("lz4", "level", level, -64, 16))

    @classmethod
    def check_installed(cls):
        import lz4.frame  # noqa: F401

    @property
    def label(self):
        lv = self._params["level"]
        return "lz4" if lv <= 0 else (f"lz4hc-{lv}" if lv >= 3 else f"lz4-{lv}")

    @property
    def version(self):
        import lz4
        return f"lz4 {lz4.__version__}"

    def _encode(self, arr):
        import lz4.frame
        return lz4.frame.compress(arr, compression_level=self._params["level"], store_size=True)

    def _decode(self, buf):
        import lz4.frame
        return lz4.frame.decompress(buf)


@register_codec
class Brotli(Codec):
    codec_id = "brotli"

    def __init__(self, quality: int = 5, lgwin: int = 22):
        super().__init__(quality=check_int("brotli", "quality", quality, 0, 11),
                         lgwin=check_int("brotli", "lgwin", lgwin, 10, 24))

    @classmethod
    def check_installed(cls):
        import brotli  # noqa: F401

    @property
    def label(self):
        return f"brotli-{self._params['quality']}"

    @property
    def version(self):
        import brotli
        return f"brotli {getattr(brotli, '__version__', '')}"

    def _encode(self, arr):
        import brotli
        return brotli.compress(arr.tobytes() if not arr.flags.c_contiguous else arr, quality=self._params["quality"],
                               lgwin=self._params["lgwin"])

    def _decode(self, buf):
        import brotli
        return brotli.decompress(buf)
