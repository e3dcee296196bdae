"""Peer float codecs: ZipNN (IBM) and OpenZL (Meta), behind the same :class:`~lmcbench.codecs.Codec` contract.

Both are dtype-aware: ``encode`` reads the element dtype of the array it gets and
``check_applicable`` rejects the dtypes the library cannot take. Their blobs are self-describing, so ``decode``
needs nothing but the blob and returns the raw little-endian bytes of the original array.

The third-party libraries are imported lazily (in methods), so this module imports without them.

* ``zipnn`` — ZipNN 0.5.x, byte input (``input_format="byte"``) with ``bytearray_dtype`` set from the array's
  dtype; its 32-byte header carries the dtype and the length. ZipNN 0.5.x reorders the bits of the buffer it
  is given *in place* (bf16/fp32), even of an immutable ``bytes`` object, so it always gets a private copy.
* ``openzl`` — OpenZL's float "deconstruct" graph: the typed numeric input goes through the
  ``BFloat16Deconstruct`` / ``Float16Deconstruct`` / ``Float32Deconstruct`` node, which splits each float into
  an exponent stream and a sign+fraction stream, and both streams are Huffman-coded. (fp32's sign+fraction
  stream is a 3-byte struct, which OpenZL's Huffman graph does not take, so it is first transposed into its
  three byte lanes, each Huffman-coded.) ``graph="generic"`` uses OpenZL's generic ``Compress`` graph on the
  typed numeric input instead. The frame records the element width and count, so no header of our own is needed.
"""

from __future__ import annotations

import importlib.metadata
import os

import numpy as np

from ..errors import ConfigError, NotApplicable
from . import Codec, register_codec


def _dist_version(dist: str) -> str:
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return dist


def _dtype_name(dt: np.dtype) -> str:
    return dt.name if dt.kind != "V" else str(dt)


def _not_native(dt: np.dtype) -> bool:
    return dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False)


# --------------------------------------------------------------------------------------------------------------
# ZipNN
# --------------------------------------------------------------------------------------------------------------

def _zipnn_dtypes() -> dict[np.dtype, str]:
    """numpy dtype -> ZipNN ``bytearray_dtype`` name, for the float formats ZipNN 0.5 compresses in byte mode."""
    import ml_dtypes

    return {
        np.dtype(ml_dtypes.bfloat16): "bfloat16",
        np.dtype("<f2"): "float16",
        np.dtype("<f4"): "float32",
        np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn",
        np.dtype(ml_dtypes.float8_e5m2): "float8_e5m2",
    }


@register_codec
class ZipNN(Codec):
    """ZipNN: byte grouping of the float's exponent/mantissa bytes, then Huffman / zstd per group.

    ``threads``: ZipNN's worker threads (0 lets ZipNN choose: min(cpu count, 16)).
    """

    codec_id = "zipnn"

    def __init__(self, threads: int = 1):
        if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= 256:
            raise ConfigError(f"zipnn: threads must be an integer in [0, 256], got {threads!r}")
        super().__init__(threads=threads)
        self._enc: dict[str, object] = {}  # one ZipNN object per bytearray_dtype, made on first use
        self._dec = None

    @classmethod
    def check_installed(cls):
        import zipnn  # noqa: F401

    @property
    def label(self):
        return "zipnn"

    @property
    def version(self):
        return _dist_version("zipnn")

    @property
    def threads(self):
        t = self._params["threads"]
        return t if t > 0 else min(os.cpu_count() or 1, 16)

    def check_applicable(self, arr):
        dt = np.asarray(arr).dtype if not isinstance(arr, np.dtype) else arr
        if dt not in _zipnn_dtypes():
            raise NotApplicable(
                f"zipnn: dtype {_dtype_name(dt)}{' (big-endian)' if _not_native(dt) else ''} is not supported; "
                "ZipNN 0.5 compresses little-endian bfloat16, float16, float32, float8_e4m3fn and float8_e5m2 only")

    def _make(self, name):
        from zipnn import ZipNN as _ZipNN

        return _ZipNN(method="AUTO", input_format="byte", bytearray_dtype=name, threads=self._params["threads"])

    def _encode(self, arr):
        self.check_applicable(arr)
        name = _zipnn_dtypes()[arr.dtype]
        z = self._enc.get(name)
        if z is None:
            z = self._enc[name] = self._make(name)
        # a private, writable copy: ZipNN rewrites the buffer it compresses
        return z.compress(bytearray(arr.reshape(-1).view(np.uint8)))

    def _decode(self, buf):
        if self._dec is None:
            self._dec = self._make("bfloat16")  # the dtype and length are read from the blob's header
        # decompress leaves its input alone (checked); bytes() is free for a bytes blob
        return self._dec.decompress(bytes(buf))


# --------------------------------------------------------------------------------------------------------------
# OpenZL
# --------------------------------------------------------------------------------------------------------------

_OPENZL_GRAPHS = ("deconstruct_huffman", "generic")


def _openzl_float_kind(dt: np.dtype) -> str | None:
    import ml_dtypes

    return {np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype("<f2"): "fp16", np.dtype("<f4"): "fp32"}.get(dt)


@register_codec
class OpenZL(Codec):
    """OpenZL with a float graph: exponent / sign+fraction split (``*Deconstruct`` node), Huffman per stream.

    ``graph``: ``"deconstruct_huffman"`` (default; bfloat16, float16, float32) or ``"generic"`` (OpenZL's
    generic ``Compress`` graph on the typed numeric input; any little-endian 1/2/4/8-byte int or float dtype).
    """

    codec_id = "openzl"

    def __init__(self, graph: str = "deconstruct_huffman"):
        if graph not in _OPENZL_GRAPHS:
            raise ConfigError(f"openzl: graph must be one of {', '.join(_OPENZL_GRAPHS)}, got {graph!r}")
        super().__init__(graph=graph)
        self._cctx: dict[str, tuple] = {}  # float kind (or element width) -> (Compressor, CCtx), made on first use
        self._dctx = None

    @classmethod
    def check_installed(cls):
        import openzl.ext  # noqa: F401

    @property
    def label(self):
        return "openzl" if self._params["graph"] == "deconstruct_huffman" else f"openzl-{self._params['graph']}"

    @property
    def version(self):
        return _dist_version("openzl")

    def check_applicable(self, arr):
        dt = np.asarray(arr).dtype if not isinstance(arr, np.dtype) else arr
        if self._params["graph"] == "deconstruct_huffman":
            if _openzl_float_kind(dt) is None:
                raise NotApplicable(
                    f"openzl: dtype {_dtype_name(dt)}{' (big-endian)' if _not_native(dt) else ''} is not "
                    "supported by the deconstruct graph; OpenZL has float deconstruct nodes for little-endian "
                    "bfloat16, float16 and float32 only")
        else:
            if _not_native(dt) or dt.itemsize not in (1, 2, 4, 8) or dt.kind not in "biufV" or dt.fields \
                    or dt.subdtype is not None:
                raise NotApplicable(f"openzl: dtype {_dtype_name(dt)} is not a little-endian 1/2/4/8-byte number")

    def _build(self, key):
        from openzl import ext
        from openzl.ext import graphs, nodes

        c = ext.Compressor()
        if key == "bf16":
            g = nodes.BFloat16Deconstruct()(c, sign_frac=graphs.Huffman()(c), exponent=graphs.Huffman()(c))
        elif key == "fp16":
            g = nodes.Float16Deconstruct()(c, sign_frac=graphs.Huffman()(c), exponent=graphs.Huffman()(c))
        elif key == "fp32":
            # the 24-bit sign+fraction struct -> its 3 byte lanes, each Huffman-coded
            g = nodes.Float32Deconstruct()(c, sign_frac=nodes.TransposeSplit()(c, graphs.Huffman()(c)),
                                           exponent=graphs.Huffman()(c))
        else:
            g = graphs.Compress()(c)
        c.select_starting_graph(g)
        cctx = ext.CCtx()
        cctx.ref_compressor(c)
        # sticky: the compressor and parameters stay set across compress() calls on this context
        cctx.set_parameter(ext.CParam.StickyParameters, 1)
        cctx.set_parameter(ext.CParam.FormatVersion, ext.MAX_FORMAT_VERSION)
        return c, cctx

    def _encode(self, arr):
        from openzl import ext

        self.check_applicable(arr)
        key = _openzl_float_kind(arr.dtype) if self._params["graph"] == "deconstruct_huffman" \
            else f"w{arr.dtype.itemsize}"
        entry = self._cctx.get(key)
        if entry is None:
            entry = self._cctx[key] = self._build(key)
        flat = arr.reshape(-1).view(f"<u{arr.dtype.itemsize}")  # a read-only view: OpenZL does not write it
        return entry[1].compress([ext.Input(ext.Type.Numeric, flat)])

    def _decode(self, buf):
        from openzl import ext

        if self._dctx is None:
            self._dctx = ext.DCtx()
        outs = self._dctx.decompress(buf if isinstance(buf, bytes) else bytes(buf))
        if len(outs) != 1 or outs[0].type != ext.Type.Numeric:
            raise ValueError(f"openzl: expected one numeric output in the frame, got "
                             f"{[o.type for o in outs]}")
        return outs[0].content.as_nparray()  # keeps the decoder's buffer alive; decode() views it as uint8


__all__ = ["ZipNN", "OpenZL"]
