"""numcodecs codec wrapper (registered as codec id ``"lmc"``).

numcodecs is an optional dependency: importing this module requires it.

It follows the numcodecs contract (checked with numcodecs' own test helpers in ``tests/test_numcodecs.py``):
``encode`` takes any object exporting the buffer protocol and compresses its bytes as they lie in memory (a
Fortran-ordered array in Fortran order), ``decode`` gives those bytes back, into ``out`` if one is given, and
object arrays are refused with ``TypeError`` both ways. Element types lmc knows (floats including bfloat16 and
float8, integers, bool) are coded with their own layout; datetime64/timedelta64 as int64; anything else (byte
strings, big-endian numbers, structured types) as its raw bytes, so the round trip is always byte-exact.
"""
import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ensure_ndarray, ndarray_copy

from . import api


def _typed(arr):
    """A view of ``arr``'s bytes with a dtype lmc codes, its own when lmc knows it."""
    dt = arr.dtype
    if dt.byteorder != ">":
        try:
            api._dtype_code(dt)
            return arr
        except TypeError:
            pass
    if dt.fields is None and dt.subdtype is None and dt.itemsize in (2, 4, 8) and arr.nbytes:
        # e.g. big-endian numbers: byte planes of the same bytes (lmc would byte-swap the array itself)
        return arr.view(np.dtype(f"<u{dt.itemsize}"))
    return arr.view(np.uint8)


class LMC(Codec):
    """lmc as a numcodecs codec.

    Parameters
    ----------
    dtype : str, optional
        Element dtype the bytes are read as: used when ``encode`` receives a raw buffer, and it overrides the
        dtype of an array (its bytes are reinterpreted). Without it numpy arrays are coded by their own dtype
        and other buffers as bytes.
    chunk_size : int, optional
        Elements per independent chunk.
    threads : int, optional
        Threads used (default: all).
    max_output_bytes : int, optional
        ``decode`` refuses (``lmc.OutputLimitError``, a ``FormatError``) a blob whose header declares more
        decoded bytes than this, before allocating anything (see ``lmc.decompress``). Without it, and
        when ``decode`` gets an ``out`` buffer, the limit is at most that buffer's size.
    prefer : str, optional
        ``"speed"`` (default) or ``"size"``: as ``lmc.compress``'s ``prefer`` (``"size"`` takes the slower
        codings wherever they are smaller).
    format_version : int, optional
        As ``lmc.compress``'s (default: lmc's, 7): ``6`` writes chunks that lmc 0.3.5 and 0.3.6 also read, ``4``
        chunks that lmc 0.3.2 and later read, for a store that older installations must read too.
    """

    codec_id = "lmc"

    def __init__(self, dtype=None, chunk_size=None, threads=None, max_output_bytes=None, prefer="speed",
                 format_version=None):
        self.dtype = None if dtype is None else str(np.dtype(api._as_dtype(dtype)))
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.threads = None if threads is None else int(threads)
        if max_output_bytes is not None and (isinstance(max_output_bytes, bool) or int(max_output_bytes) < 0):
            raise ValueError(f"lmc: max_output_bytes must be an int >= 0 or None, got {max_output_bytes!r}")
        self.max_output_bytes = None if max_output_bytes is None else int(max_output_bytes)
        api.check_prefer(prefer, "lmc")
        self.prefer = prefer
        if format_version is not None and (isinstance(format_version, bool) or format_version not in api.VERSIONS):
            raise ValueError(f"lmc: format_version must be one of {api.VERSIONS} or None, got {format_version!r}")
        self.format_version = format_version

    def encode(self, buf):
        is_array = isinstance(buf, np.ndarray)
        if is_array and buf.dtype.hasobject:
            raise TypeError("lmc: object arrays cannot be encoded")
        # a flat view in memory order (raises TypeError for object arrays, ValueError for non-contiguous ones)
        flat = ensure_contiguous_ndarray(buf)
        if self.dtype is not None:
            dt = api._as_dtype(self.dtype)
            if flat.nbytes % dt.itemsize:
                raise ValueError(f"lmc: {flat.nbytes} bytes are not a whole number of {self.dtype} elements")
            arr = flat.view(np.uint8).view(dt)
        elif is_array:
            arr = _typed(flat)
            # a C-ordered array keeps its shape in the blob; any other layout is coded as its flat memory
            if buf.flags.c_contiguous and buf.dtype.kind not in "Mm" and arr.dtype == buf.dtype:
                arr = arr.reshape(buf.shape)
        else:
            arr = flat.view(np.uint8)
        fv = {} if self.format_version is None else {"format_version": self.format_version}
        return api.compress(arr, threads=self.threads, chunk_size=self.chunk_size, prefer=self.prefer, **fv)

    def decode(self, buf, out=None):
        if out is not None:
            o = out if isinstance(out, np.ndarray) else ensure_ndarray(out)
            if o.dtype.hasobject:
                raise TypeError("lmc: cannot decode into an object array")
        if isinstance(buf, np.ndarray) and buf.dtype.hasobject:
            raise TypeError("lmc: cannot decode an object array")
        blob = ensure_contiguous_ndarray(buf).view(np.uint8)
        limit = self.max_output_bytes
        if out is not None:   # a blob that cannot fit out is refused before it is decoded
            nb = ensure_ndarray(out).nbytes
            limit = nb if limit is None else min(limit, nb)
        dec = api.decompress(blob, threads=self.threads, max_output_bytes=limit)
        if out is None:
            return dec
        if ensure_ndarray(out).nbytes != dec.nbytes:
            raise ValueError(f"lmc: out has {ensure_ndarray(out).nbytes} bytes, the data {dec.nbytes}")
        return ndarray_copy(dec, out)

    def get_config(self):
        cfg = {"id": self.codec_id}
        if self.dtype is not None:
            cfg["dtype"] = self.dtype
        if self.chunk_size is not None:
            cfg["chunk_size"] = self.chunk_size
        if self.threads is not None:
            cfg["threads"] = self.threads
        if self.max_output_bytes is not None:
            cfg["max_output_bytes"] = self.max_output_bytes
        if self.prefer != "speed":  # absent unless set: older configs stay equal
            cfg["prefer"] = self.prefer
        if self.format_version is not None:
            cfg["format_version"] = self.format_version
        return cfg

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config.pop("id", None)
        return cls(**config)

    def __repr__(self):
        lim = "" if self.max_output_bytes is None else f", max_output_bytes={self.max_output_bytes!r}"
        pref = "" if self.prefer == "speed" else f", prefer={self.prefer!r}"
        fv = "" if self.format_version is None else f", format_version={self.format_version!r}"
        return (f"LMC(dtype={self.dtype!r}, chunk_size={self.chunk_size!r}, "
                f"threads={self.threads!r}{lim}{pref}{fv})")
