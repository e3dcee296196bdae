"""numcodecs codec wrapper (registered as codec id ``"lmc"``).

numcodecs is an optional dependency: importing this module requires it.
"""
import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy

from . import _core


class LMC(Codec):
    """lmc as a numcodecs codec.

    Parameters
    ----------
    dtype : str, optional
        Element dtype used when ``encode`` receives a raw buffer (numpy arrays
        carry their own dtype).
    chunk_size : int, optional
        Elements per independent chunk.
    threads : int, optional
        Threads used (default: all).
    """

    codec_id = "lmc"

    def __init__(self, dtype=None, chunk_size=None, threads=None):
        self.dtype = None if dtype is None else str(np.dtype(_core._as_dtype(dtype)))
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.threads = None if threads is None else int(threads)

    def encode(self, buf):
        if isinstance(buf, np.ndarray):
            arr = buf
            if self.dtype is not None and arr.dtype != _core._as_dtype(self.dtype):
                arr = np.ascontiguousarray(arr).reshape(-1).view(_core._as_dtype(self.dtype))
        else:
            if self.dtype is None:
                arr = ensure_contiguous_ndarray(buf).reshape(-1).view(np.uint8)
            else:
                arr = np.frombuffer(memoryview(buf).cast("B"), _core._as_dtype(self.dtype))
        return _core.compress(arr, threads=self.threads, chunk_size=self.chunk_size)

    def decode(self, buf, out=None):
        if isinstance(buf, np.ndarray):
            buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
        dec = _core.decompress(buf, threads=self.threads)
        if out is None:
            return dec
        return ndarray_copy(dec, out)

    def get_config(self):
        cfg = {"id": self.codec_id}
        if self.dtype is not None:
            cfg["dtype"] = self.dtype
        if self.chunk_size is not None:
            cfg["chunk_size"] = self.chunk_size
        if self.threads is not None:
            cfg["threads"] = self.threads
        return cfg

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config.pop("id", None)
        return cls(**config)

    def __repr__(self):
        return (f"LMC(dtype={self.dtype!r}, chunk_size={self.chunk_size!r}, "
                f"threads={self.threads!r})")
