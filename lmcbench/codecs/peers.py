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
* ``z4ai`` — z4ai 0.2: sign/exponent/mantissa field split (bf16, fp16, fp32) or byte planes (fp64), each plane
  the smallest of zstd (long-distance matching) and rANS. Through the ``reference`` pipeline it is
  ``z4ai.compress_delta`` (XOR with the reference, then the same codec on the XOR).
* ``blosc2`` — python-blosc2's ``compress2``: the shuffle (byte-grouping) or bit-shuffle filter with the array's
  itemsize as ``typesize``, then zstd, lz4, ... — what HDF5/PyTables/Zarr users get. A byte codec: any dtype.
* ``pcodec`` — pcodec's standalone format (``simple_compress``): numeric codec for float16/32/64 (no bfloat16).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os

import numpy as np

from ..errors import ConfigError, NotApplicable
from .base import Codec, check_int
from .registry import register_codec


def _dist_version(dist: str) -> str:
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return dist


class _Peer(Codec):
    """A peer codec from a distribution of its own: installed when ``module`` imports; its version is the
    distribution's, ``dist``."""

    module = ""
    dist = ""

    @classmethod
    def check_installed(cls):
        importlib.import_module(cls.module)

    @property
    def version(self):
        return _dist_version(self.dist)


def _dtype_name(dt: np.dtype) -> str:
    return dt.name if dt.kind != "V" else str(dt)


def _not_native(dt: np.dtype) -> bool:
    return dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False)


# --------------------------------------------------------------------------------------------------------------
# ZipNN
# --------------------------------------------------------------------------------------------------------------

def _refuse(codec: str, arr, supported, why: str) -> np.dtype:
    """The array's dtype, or NotApplicable naming it (and its byte order) with ``why``."""
    dt = np.asarray(arr).dtype if not isinstance(arr, np.dtype) else arr
    if dt not in supported:
        raise NotApplicable(f"{codec}: dtype {_dtype_name(dt)}{' (big-endian)' if _not_native(dt) else ''} "
                            f"is not supported{why}")
    return dt


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
class ZipNN(_Peer):
    """ZipNN: byte grouping of the float's exponent/mantissa bytes, then Huffman / zstd per group.

    ``threads``: ZipNN's worker threads (0 lets ZipNN choose: min(cpu count, 16)).
    """

    codec_id = "zipnn"
    module, dist = "zipnn", "zipnn"

    def __init__(self, threads: int = 1):
        super().__init__(threads=_check_threads("zipnn", threads))
        self._enc: dict[str, object] = {}  # one ZipNN object per bytearray_dtype, made on first use
        self._dec = None

    @property
    def label(self):
        return "zipnn"

    @property
    def threads(self):
        t = self._params["threads"]
        return t if t > 0 else min(os.cpu_count() or 1, 16)

    def check_applicable(self, arr):
        _refuse("zipnn", arr, _zipnn_dtypes(), "; ZipNN 0.5 compresses little-endian bfloat16, float16, float32, "
                "float8_e4m3fn and float8_e5m2 only")

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
class OpenZL(_Peer):
    """OpenZL with a float graph: exponent / sign+fraction split (``*Deconstruct`` node), Huffman per stream.

    ``graph``: ``"deconstruct_huffman"`` (default; bfloat16, float16, float32) or ``"generic"`` (OpenZL's
    generic ``Compress`` graph on the typed numeric input; any little-endian 1/2/4/8-byte int or float dtype).
    """

    codec_id = "openzl"
    module, dist = "openzl.ext", "openzl"

    def __init__(self, graph: str = "deconstruct_huffman"):
        if graph not in _OPENZL_GRAPHS:
            raise ConfigError(f"openzl: graph must be one of {', '.join(_OPENZL_GRAPHS)}, got {graph!r}")
        super().__init__(graph=graph)
        self._cctx: dict[str, tuple] = {}  # float kind (or element width) -> (Compressor, CCtx), made on first use
        self._dctx = None

    @property
    def label(self):
        return "openzl" if self._params["graph"] == "deconstruct_huffman" else f"openzl-{self._params['graph']}"

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


# --------------------------------------------------------------------------------------------------------------
# z4ai
# --------------------------------------------------------------------------------------------------------------

def _z4ai_dtypes() -> dict[np.dtype, str]:
    """numpy dtype -> z4ai dtype code, for the float formats z4ai 0.2 splits into fields or byte planes."""
    import ml_dtypes

    return {np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype("<f2"): "fp16", np.dtype("<f4"): "fp32",
            np.dtype("<f8"): "fp64"}


def _check_threads(codec, threads, lo=0):
    return check_int(codec, "threads", threads, lo, 256)


@register_codec
class Z4AI(_Peer):
    """z4ai (PyPI ``z4ai``): field split / byte planes, then zstd-LDM or rANS per plane; a codec-level XOR delta.

    ``threads``: z4ai's ``threads`` argument (0 = all cores, 1 = single-threaded, n = n workers). z4ai 0.2 honours
    it only partly: ``compress(threads=1)`` compresses the planes one after another, but each plane's zstd pass,
    its block and rANS pools and the best-of side passes are still sized by ``os.cpu_count()``, so on a machine
    with many cores a "1-thread" z4ai row may use more than one (its ``compress_cpu_s`` shows it).
    ``compress_delta(threads=t)`` hands ``t`` to zstd as its worker count and keeps one plane worker.
    """

    codec_id = "z4ai"
    module, dist = "z4ai", "z4ai"

    def __init__(self, threads: int = 1):
        super().__init__(threads=_check_threads("z4ai", threads))

    @property
    def label(self):
        t = self._params["threads"]
        return "z4ai" if t == 1 else f"z4ai-{t or 'all'}t"

    @property
    def threads(self):
        t = self._params["threads"]
        return t if t > 0 else (os.cpu_count() or 1)

    def check_applicable(self, arr):
        _refuse("z4ai", arr, _z4ai_dtypes(), "; z4ai 0.2 compresses little-endian bfloat16, float16, float32 and "
                "float64 only")

    def _encode(self, arr):
        import z4ai

        self.check_applicable(arr)
        # tobytes(): z4ai takes bytes (it would copy any other buffer to bytes itself), and this private copy
        # is all it ever sees of the caller's array
        return z4ai.compress(arr.tobytes(), dtype=_z4ai_dtypes()[arr.dtype], threads=self._params["threads"])

    def _decode(self, buf):
        import z4ai

        return z4ai.decompress(buf if isinstance(buf, bytes) else bytes(buf))

    # the ``reference`` pipeline: z4ai.compress_delta XORs the whole buffer with the reference
    supports_reference = True

    def _check_reference(self, arr, reference):
        if reference.dtype != arr.dtype or reference.nbytes != arr.nbytes:
            raise ValueError(f"z4ai: the reference ({_dtype_name(reference.dtype)}, {reference.nbytes} bytes) does "
                             f"not match the array ({_dtype_name(arr.dtype)}, {arr.nbytes} bytes)")

    def _encode_ref(self, arr, reference):
        import z4ai

        self.check_applicable(arr)
        self._check_reference(arr, reference)
        # compress_delta copies both arrays to bytes (ndarray.tobytes) before XOR-ing them
        return z4ai.compress_delta(arr, reference, dtype=_z4ai_dtypes()[arr.dtype], threads=self._params["threads"])

    def _decode_ref(self, buf, reference):
        import z4ai

        out = z4ai.decompress_delta(buf if isinstance(buf, bytes) else bytes(buf), reference)
        return np.frombuffer(out, np.uint8)


# --------------------------------------------------------------------------------------------------------------
# Blosc2
# --------------------------------------------------------------------------------------------------------------

_BLOSC2_CNAMES = ("blosclz", "lz4", "lz4hc", "zlib", "zstd")
_BLOSC2_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")
_BLOSC2_MAX_TYPESIZE = 255  # the shuffle filters' limit


def _blosc2_filter(blosc2, shuffle: str):
    return {"noshuffle": blosc2.Filter.NOFILTER, "shuffle": blosc2.Filter.SHUFFLE,
            "bitshuffle": blosc2.Filter.BITSHUFFLE}[shuffle]


@register_codec
class Blosc2(_Peer):
    """python-blosc2's ``compress2``: a shuffle filter over ``typesize`` = the array's itemsize, then a codec.

    ``cname``: blosclz, lz4, lz4hc, zlib or zstd; ``clevel``: 0-9; ``shuffle``: ``noshuffle``, ``shuffle``
    (byte-grouping: byte *j* of every element together, per block) or ``bitshuffle`` (bit *j* of every element);
    ``threads``: blosc2's ``nthreads`` for both directions (null: all cores).

    One call compresses at most ``blosc2.MAX_BUFFERSIZE`` bytes (2 GiB less 32); lmcbench slices tensors at
    ``bench.chunk_mib`` (16 MiB), far below it, and a larger buffer is refused with a ``ValueError``.
    """

    codec_id = "blosc2"
    module, dist = "blosc2", "blosc2"

    def __init__(self, cname: str = "zstd", clevel: int = 5, shuffle: str = "shuffle", threads: int | None = 1):
        if cname not in _BLOSC2_CNAMES:
            raise ConfigError(f"blosc2: cname must be one of {', '.join(_BLOSC2_CNAMES)}, got {cname!r}")
        check_int("blosc2", "clevel", clevel, 0, 9)
        if shuffle not in _BLOSC2_SHUFFLES:
            raise ConfigError(f"blosc2: shuffle must be one of {', '.join(_BLOSC2_SHUFFLES)}, got {shuffle!r}")
        if threads is not None:
            _check_threads("blosc2", threads, lo=1)
        super().__init__(cname=cname, clevel=clevel, shuffle=shuffle, threads=threads)

    @property
    def label(self):
        p = self._params
        t = p["threads"]
        return f"blosc2-{p['shuffle']}-{p['cname']}-{p['clevel']}" + ("" if t == 1 else f"-{t or 'all'}t")

    @property
    def threads(self):
        return self._params["threads"] or (os.cpu_count() or 1)

    def _encode(self, arr):
        import blosc2

        if arr.nbytes > blosc2.MAX_BUFFERSIZE:
            raise ValueError(f"blosc2: compress2 takes at most {blosc2.MAX_BUFFERSIZE} bytes in one call, got "
                             f"{arr.nbytes}; compress it in slices (lmcbench: bench.chunk_mib) or use blosc2.SChunk")
        typesize = arr.dtype.itemsize
        if typesize > _BLOSC2_MAX_TYPESIZE:
            raise NotApplicable(f"blosc2: itemsize {typesize} is over the shuffle filters' {_BLOSC2_MAX_TYPESIZE}")
        p = self._params
        # compress2 reads its source through the buffer protocol and never writes it (read-only arrays are fine)
        return blosc2.compress2(arr.reshape(-1).view(np.uint8), codec=blosc2.Codec[p["cname"].upper()],
                                clevel=p["clevel"], filters=[_blosc2_filter(blosc2, p["shuffle"])],
                                filters_meta=[0], typesize=typesize, nthreads=self.threads)

    def _decode(self, buf):
        import blosc2

        return blosc2.decompress2(buf, nthreads=self.threads)


# --------------------------------------------------------------------------------------------------------------
# pcodec
# --------------------------------------------------------------------------------------------------------------

_PCODEC_DTYPES = (np.dtype("<f2"), np.dtype("<f4"), np.dtype("<f8"))


@register_codec
class Pcodec(_Peer):
    """pcodec (PyPI ``pcodec``) standalone format: ``simple_compress(arr, ChunkConfig(compression_level=level))``.

    Numeric, single-threaded; float16, float32 and float64 here (pcodec has no bfloat16). ``level``: 0-12.
    """

    codec_id = "pcodec"
    module, dist = "pcodec", "pcodec"

    def __init__(self, level: int = 8):
        super().__init__(level=check_int("pcodec", "level", level, 0, 12))
        self._config = None

    @property
    def label(self):
        return f"pcodec-{self._params['level']}"

    def check_applicable(self, arr):
        _refuse("pcodec", arr, _PCODEC_DTYPES, " here; pcodec compresses little-endian float16, float32 and "
                "float64 (it has no bfloat16)")

    def _encode(self, arr):
        import pcodec
        from pcodec import standalone

        self.check_applicable(arr)
        if self._config is None:
            self._config = pcodec.ChunkConfig(compression_level=self._params["level"])
        # a 1-D view; pcodec reads it and does not write it (read-only arrays are fine)
        return standalone.simple_compress(arr.reshape(-1), self._config)

    def _decode(self, buf):
        from pcodec import standalone

        out = standalone.simple_decompress(buf if isinstance(buf, bytes) else bytes(buf))
        # no values: pcodec gives None (an empty standalone file records no dtype)
        return b"" if out is None else out


__all__ = ["ZipNN", "OpenZL", "Z4AI", "Blosc2", "Pcodec"]
