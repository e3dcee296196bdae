"""lmc.api: the codec's public front end (``lmc.compress``, ``decompress``, ``info``, ``shaped``) - argument
handling, the header, the drivers that run the kernels (``lmc.kernels``) over ranges of chunks on threads."""
import struct
import itertools
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numba
import numpy as np

from .kernels import intrinsics
from .kernels.base import ERROR_MESSAGES, ck_mode, LAYOUT_BF16, LAYOUT_F16, LAYOUT_F32, LAYOUT_PLANES
from .kernels.check import check_range, checksum_range
from .kernels.drivers import decode_range, encode_range, gather_range
from . import zmask
from .outbuf import new_bytes as _new_bytes

MAGIC = b"LMC1"
VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)   # 4-9: checksums over words (5: the strong mix, the mantissa-context
                                         # mode; 6: the delta mode; 7: 32-state rANS streams; 8: a checksum of
                                         # a sixth the multiplies; 9: the joint-symbol mode; 10: the zero mask,
                                         # zmask.py); up to 3 the oldest version its chunk modes allow (FORMAT.md)
DEFAULT_CHUNK = 131072  # elements per chunk -> 128 KiB per byte stream
MAX_CHUNK = 1 << 27
MAX_NDIM = 32
FLAG_REF = 1
ENTRY = struct.Struct("<IQ")  # per chunk: compressed size, checksum
_MAX_BYTES = (1 << 63) - 1     # numpy's limit on an array's bytes (and on the product of its nonzero dims)


# the fuzzer's checked pure-Python build (lmc.kernels.intrinsics): the decoder's buffers as checked arrays
_CHECKED_PY = intrinsics.CHECKED and numba.config.DISABLE_JIT


class FormatError(ValueError):
    """Raised for malformed, corrupt or undecodable lmc blobs."""


class OutputLimitError(FormatError):
    """Raised by ``decompress(..., max_output_bytes=...)`` (and the numcodecs
    codec's ``max_output_bytes``) for a blob whose header declares more
    output bytes than allowed; raised before anything is allocated."""


# dtype code -> (numpy dtype, unit size, layout)
_DTYPES = {
    1: (np.dtype(np.float32), 4, LAYOUT_F32),
    2: (np.dtype(np.float16), 2, LAYOUT_F16),
    3: (np.dtype(ml_dtypes.bfloat16), 2, LAYOUT_BF16),
    4: (np.dtype(np.float64), 8, LAYOUT_PLANES),
    5: (np.dtype(np.int8), 1, LAYOUT_PLANES),
    6: (np.dtype(np.uint8), 1, LAYOUT_PLANES),
    7: (np.dtype(np.int16), 2, LAYOUT_PLANES),
    8: (np.dtype(np.uint16), 2, LAYOUT_PLANES),
    9: (np.dtype(np.int32), 4, LAYOUT_PLANES),
    10: (np.dtype(np.uint32), 4, LAYOUT_PLANES),
    11: (np.dtype(np.int64), 8, LAYOUT_PLANES),
    12: (np.dtype(np.uint64), 8, LAYOUT_PLANES),
    13: (np.dtype(np.bool_), 1, LAYOUT_PLANES),
    14: (np.dtype(np.complex64), 8, LAYOUT_PLANES),
    15: (np.dtype(ml_dtypes.float8_e4m3fn), 1, LAYOUT_PLANES),
    16: (np.dtype(ml_dtypes.float8_e5m2), 1, LAYOUT_PLANES),
}
_CODE_OF = {dt: code for code, (dt, _, _) in _DTYPES.items()}
_NSTREAMS = {LAYOUT_BF16: 2, LAYOUT_F16: 3, LAYOUT_F32: 4}


def _nstreams(unit, layout):
    return _NSTREAMS.get(layout, unit)


def _dtype_code(dt):
    dt = np.dtype(dt)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("=")
    code = _CODE_OF.get(dt)
    if code is None:
        raise TypeError(f"lmc: unsupported dtype {dt!r}")
    return code


def _as_dtype(dtype):
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _to_array(obj, dtype=None, what="data"):
    """Return a C-contiguous, native-endian ndarray (never a writable alias
    that we would write to; we only read from it)."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        import torch  # lazy
        if not isinstance(obj, torch.Tensor):
            raise TypeError(f"lmc: unsupported {what} type {type(obj)!r}")
        t = obj.detach()
        if t.device.type != "cpu":
            raise TypeError(f"lmc: {what} tensor must be on the CPU")
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            arr = t.numpy()
    elif isinstance(obj, np.ndarray):
        arr = obj
    elif isinstance(obj, (bytes, bytearray, memoryview)) or hasattr(obj, "__buffer__"):
        if dtype is None:
            raise TypeError(f"lmc: dtype= is required for bytes-like {what}")
        dt = _as_dtype(dtype)
        mv = memoryview(obj).cast("B")
        if mv.nbytes % dt.itemsize:
            raise ValueError(f"lmc: {what} length {mv.nbytes} is not a multiple of "
                             f"the item size {dt.itemsize}")
        return np.frombuffer(mv, dtype=dt)
    else:
        raise TypeError(f"lmc: unsupported {what} type {type(obj)!r}")
    if dtype is not None and _as_dtype(dtype) != arr.dtype:
        raise ValueError(f"lmc: dtype={dtype!r} does not match the array dtype {arr.dtype}")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    return arr


def _ro_bytes(arr):
    """Flat read-only uint8 view (one Numba signature for all inputs)."""
    v = arr.reshape(-1).view(np.uint8)
    if v.flags.writeable:
        v = v.view()
        v.flags.writeable = False
    return v


_EMPTY = np.zeros(0, np.uint8)
_EMPTY.flags.writeable = False


_POOL = None
_POOL_LOCK = threading.Lock()


def _nthreads(threads):
    """threads=None -> all cores (numba's NUMBA_NUM_THREADS default)."""
    mx = max(1, int(numba.config.NUMBA_NUM_THREADS))
    if threads is None:
        return mx
    threads = int(threads)
    if threads < 1:
        raise ValueError("lmc: threads must be >= 1")
    return min(threads, mx)


def _pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(1, int(numba.config.NUMBA_NUM_THREADS)),
                                       thread_name_prefix="lmc")
        return _POOL


def _run_chunks(fn, args, nch, nthreads):
    """Run fn(*args, c0, c1) over chunk ranges covering [0, nch)."""
    if nch == 0:
        return
    if nthreads <= 1 or nch == 1:
        fn(*args, 0, nch)
        return
    nb = nch if nch <= 64 * nthreads else 16 * nthreads  # small blocks balance best; cap the count
    bounds = [nch * i // nb for i in range(nb + 1)]
    counter = itertools.count()  # next() on it is atomic under the GIL: workers take blocks as they free up

    def work():
        while True:
            i = next(counter)
            if i >= nb:
                return
            fn(*args, bounds[i], bounds[i + 1])  # a nogil kernel: the other threads run meanwhile

    # the calling thread works too, so a call costs one hand-off to the pool, not one per block
    futs = [_pool().submit(work) for _ in range(min(nthreads, nb) - 1)]
    try:
        work()
    finally:
        for f in futs:
            f.result()


# The encoder's scratch (every chunk's worst-case payload, gathered into the
# blob afterwards) is reused across calls: a fresh buffer costs a page fault
# per 4 KiB on first touch, which on the measured VM was ~40% of the
# compress time of a small tensor.  Each thread that calls compress keeps at
# most one buffer of at most _SCRATCH_KEEP bytes (a writer's pool of threads
# coding tensors at once each reuses its own; one buffer for the process left
# all but one of them faulting in a fresh one per call).
_SCRATCH_KEEP = 64 << 20
_SCRATCH = threading.local()


def _take_scratch(nbytes):
    b = getattr(_SCRATCH, "buf", None)
    if b is not None and b.size >= nbytes:
        _SCRATCH.buf = None
        return b[:nbytes]
    return np.empty(nbytes, np.uint8)


def _give_scratch(b):
    base = b if b.base is None else b.base
    if base.size <= _SCRATCH_KEEP:
        cur = getattr(_SCRATCH, "buf", None)
        if cur is None or cur.size < base.size:
            _SCRATCH.buf = base


def _ref_hash(ref_u8, total, chunk, unit, nthreads, wk, chks=None):
    """The reference's hash: over its chunk checksums (wk: kernels.base.ck_mode of the blob's version; chks: those
    checksums where the encoder took them, else they are taken here)."""
    if chks is None:
        nch = -(-total // chunk) if total else 0
        chks = np.zeros(nch, np.uint64)
        _run_chunks(checksum_range, (ref_u8, total, chunk, unit, int(wk), chks), nch, nthreads)
    b = chks.tobytes() + struct.pack("<QQ", total, unit)
    return zlib.crc32(b) | (zlib.adler32(b) << 32)


def _check_reference(reference, dtype, shape, what):
    r = _to_array(reference, what="reference")
    if r.dtype != dtype:
        raise ValueError(f"lmc: {what} dtype {r.dtype} does not match {dtype}")
    if r.shape != tuple(shape):
        raise ValueError(f"lmc: {what} shape {r.shape} does not match {tuple(shape)}")
    return r


def shaped(arr, shape):
    """``arr`` (flat) as the tensor ``shape`` it holds when that has 2 or more dimensions and as many elements
    (else ``arr``): the predicted-exponent mode takes its row length from the blob's shape, so a caller that
    keeps tensors flat (the archive, the DCP writer) hands lmc the rows."""
    shape = tuple(int(s) for s in shape)
    if arr is None or len(shape) < 2 or arr.ndim != 1 or int(np.prod(shape, dtype=np.int64)) != arr.size:
        return arr
    return arr.reshape(shape)


PREFER = ("speed", "size", "fast")
_PREF = {"speed": 0, "size": 1, "fast": 2}   # kernels.base.PREF_SPEED, PREF_SIZE, PREF_FAST


def check_prefer(prefer, who):
    """The writers' check of a ``prefer`` they will hand to compress (``who``: the error's prefix)."""
    if prefer not in PREFER:
        raise ValueError(f"{who}: prefer must be one of {', '.join(map(repr, PREFER))}, got {prefer!r}")


def compress(data, *, threads=None, reference=None, chunk_size=None, dtype=None, format_version=10,
             prefer="speed", **options):
    """Compress an array (numpy, CPU torch tensor, or bytes-like with dtype=)
    to an lmc blob (bytes).  ``reference``: same dtype/shape array (e.g. the
    previous checkpoint) to code against; per chunk the smallest of alone,
    XOR with the reference and (fp32/fp16/bf16) the temporal mode is chosen.
    ``chunk_size``: elements per chunk (default 131072).  ``format_version``:
    the newest format whose modes the encoder may use, 1 to 10 (FORMAT.md
    gives each one's modes): 1 what lmc 0.1 wrote; 2 rANS streams and the
    temporal mode; 3 the predicted-exponent mode; 4 and 5 checksums over
    64-bit words; 5 the bf16 mantissa-context mode (``prefer="size"``); 6
    the delta mode; 7 32-state rANS streams; 8 a cheaper checksum; 9 the
    bf16 joint-symbol mode; 10 (the default) where a tensor's all-bits-zero
    elements are many, a bitmap of the others and those alone (written as
    version 10 only there, else as version 9's bytes).  From 4 to 9 a blob
    is written as the version asked for; up to 3, as the oldest version its
    chunks need, so one that uses no newer mode stays readable by older
    decoders.
    ``prefer``: ``"speed"`` (default) takes a coding that decodes slower
    (rANS over Huffman, the temporal and predicted-exponent modes) only
    where it saves a margin (1/32 to 1/64 of the chunk); ``"size"`` takes
    it wherever it is smaller, and on bf16 the mantissa-context mode and the
    joint-symbol mode with 2 or 3 mantissa bits too: the smallest blobs,
    decoded slower; ``"fast"`` never takes the temporal mode
    (its symbol-by-symbol rANS decodes at a fifth of the alone speed): with
    a reference a float chunk is coded in the delta mode (format 6), alone
    or by XOR, whichever is smallest (the XOR where it saves 1/16 over the
    delta mode; on chunks of 4096 elements or more decided from a sample of
    each), about half the alone speed in both directions, and a few percent
    larger than with ``"speed"``."""
    if options:
        raise TypeError(f"lmc.compress: unknown options {sorted(options)}")
    if isinstance(format_version, bool) or format_version not in VERSIONS:
        raise ValueError(f"lmc: format_version must be 1 to 10, got {format_version!r}")
    check_prefer(prefer, "lmc")
    arr = _to_array(data, dtype)
    blob = _compress(arr, threads, reference, chunk_size, None, min(format_version, 9), _PREF[prefer])
    if format_version >= 10 and zmask.worth_trying(arr):
        blob = zmask.compress(arr, blob, MAGIC, _dtype_code(arr.dtype), lambda a: _compress(
            a, threads, None, chunk_size, None, 9, _PREF[prefer]), prefer == "size", reference is not None)
    return blob


def _compress(data, threads, reference, chunk_size, dtype, fv, pref=0):
    """compress(); fv: the newest format version whose modes may be used (1:
    the lmc 0.1 encoder, alone / XOR with Huffman; used for comparisons);
    pref: _PREF[prefer]."""
    arr = _to_array(data, dtype)
    code = _dtype_code(arr.dtype)
    dt, unit, layout = _DTYPES[code]
    ns = _nstreams(unit, layout)
    shape = arr.shape
    if len(shape) > MAX_NDIM:
        raise ValueError("lmc: too many dimensions")
    total = int(arr.size)
    chunk = DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"lmc: chunk_size must be in [1, {MAX_CHUNK}]")
    nch = -(-total // chunk) if total else 0
    data_u8 = _ro_bytes(arr)
    flags = 0
    ref_u8 = _EMPTY
    has_ref = False
    refhash = b""
    if reference is not None:
        r = _check_reference(reference, arr.dtype, shape, "reference")
        ref_u8 = _ro_bytes(r)
        has_ref = True
        flags |= FLAG_REF
    nth = _nthreads(threads)
    sizes = np.zeros(nch, np.int64)
    chks = np.zeros(nch, np.uint64)
    rchks = np.zeros(nch if has_ref else 0, np.uint64)   # (the reference's chunk checksums: encode_range)
    used = np.ones(nch, np.int64)
    w = max(1, int(shape[-1])) if len(shape) >= 2 else max(1, total)
    cap = 1 + ns * (5 + min(chunk, max(total, 1))) + 16
    scratch = _take_scratch(nch * cap) if nch else None
    try:
        _run_chunks(encode_range, (data_u8, ref_u8, has_ref, int(fv), int(pref), w, total, chunk, unit,
                                     layout, ns, scratch, cap, sizes, chks, used, rchks), nch, nth)
        if nch and sizes.min() < 0:  # pragma: no cover - would be a bug
            raise RuntimeError("lmc: internal encoder error (Huffman size mismatch)")
        if has_ref:
            refhash = struct.pack("<Q", _ref_hash(ref_u8, total, chunk, unit, nth, ck_mode(fv), rchks))
        if fv >= 4:
            version = fv
        else:
            version = int(used.max()) if nch else 1
        head = bytearray()
        head += MAGIC
        head += struct.pack("<BBBB", version, code, flags, len(shape))
        head += struct.pack(f"<{len(shape)}Q", *shape)
        head += struct.pack("<II", chunk, nch)
        head += refhash
        table = np.empty(nch, dtype=[("size", "<u4"), ("chk", "<u8")])
        table["size"] = sizes
        table["chk"] = chks
        head += table.tobytes()
        head += struct.pack("<I", zlib.crc32(head))
        hl = len(head)
        offsets = np.empty(nch, np.int64)
        if nch:
            offsets[0] = hl
            np.cumsum(sizes[:-1], out=offsets[1:])
            offsets[1:] += hl
        total_len = hl + int(sizes.sum())
        blob, out = _new_bytes(total_len)
        out[:hl] = np.frombuffer(head, np.uint8)
        _run_chunks(gather_range, (scratch, cap, sizes, offsets, out), nch, nth)
        if blob is None:
            return out.tobytes()
        return blob
    finally:
        if scratch is not None:
            _give_scratch(scratch)


def _parse_header(buf):
    """Parse and validate the header.  Returns a dict."""
    nb = len(buf)
    if nb < 8:
        raise FormatError("lmc: blob too short for a header")
    if bytes(buf[:4]) != MAGIC:
        raise FormatError("lmc: bad magic (not an lmc blob)")
    version, code, flags, ndim = struct.unpack_from("<BBBB", buf, 4)
    if version not in VERSIONS:
        raise FormatError(f"lmc: unsupported format version {version}")
    if code not in _DTYPES:
        raise FormatError(f"lmc: unknown dtype code {code}")
    if flags & ~(FLAG_REF | zmask.FLAG_ZERO) or (version >= 10) != bool(flags & zmask.FLAG_ZERO) or flags == 3:
        raise FormatError(f"lmc: header flags 0x{flags:02x} invalid in a version {version} blob")
    if ndim > MAX_NDIM:
        raise FormatError(f"lmc: invalid ndim {ndim}")
    pos = 8
    need = pos + 8 * ndim + 8
    if nb < need:
        raise FormatError("lmc: blob truncated inside the header")
    shape = struct.unpack_from(f"<{ndim}Q", buf, pos)
    pos += 8 * ndim
    dt, unit, layout = _DTYPES[code]
    if flags & zmask.FLAG_ZERO:
        return zmask.parse(buf, pos, dict(version=version, code=code, dtype=dt, unit=unit, layout=layout,
                                          shape=tuple(shape), refhash=None), lambda: _total(shape, unit), FormatError)
    chunk, nch = struct.unpack_from("<II", buf, pos)
    pos += 8
    refhash = None
    if flags & FLAG_REF:
        if nb < pos + 8:
            raise FormatError("lmc: blob truncated inside the header")
        (refhash,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
    tab_end = pos + ENTRY.size * nch
    if nb < tab_end + 4:
        raise FormatError("lmc: blob truncated inside the chunk table")
    (crc,) = struct.unpack_from("<I", buf, tab_end)
    if zlib.crc32(buf[:tab_end]) != crc:
        raise FormatError("lmc: header checksum mismatch (corrupt header)")
    total = _total(shape, unit)
    if not 1 <= chunk <= MAX_CHUNK:
        raise FormatError(f"lmc: invalid chunk size {chunk}")
    if nch != (-(-total // chunk) if total else 0):
        raise FormatError("lmc: chunk count inconsistent with shape")
    table = np.frombuffer(buf, dtype=[("size", "<u4"), ("chk", "<u8")], count=nch, offset=pos)
    sizes = table["size"].astype(np.int64)
    chks = table["chk"].astype(np.uint64)
    hl = tab_end + 4
    if hl + int(sizes.sum()) != nb:
        raise FormatError(f"lmc: blob length {nb} does not match the chunk table "
                          f"({hl + int(sizes.sum())} expected)")
    offsets = np.empty(nch, np.int64)
    if nch:
        offsets[0] = hl
        np.cumsum(sizes[:-1], out=offsets[1:])
        offsets[1:] += hl
    return dict(version=version, code=code, dtype=dt, unit=unit, layout=layout, shape=tuple(shape),
                total=total, chunk=chunk, nch=nch, refhash=refhash, sizes=sizes,
                chks=chks, offsets=offsets)


def _total(shape, unit):
    total = 1
    nonzero = 1
    for s in shape:
        total *= s
        nonzero *= max(s, 1)
    if nonzero * unit > _MAX_BYTES:
        # numpy refuses such a shape even with a zero dimension ("array is too big")
        raise FormatError(f"lmc: shape {tuple(shape)} is too large")
    return total


def _blob_view(blob):
    if isinstance(blob, np.ndarray):
        b = np.ascontiguousarray(blob.reshape(-1)).view(np.uint8)
    else:
        try:
            b = np.frombuffer(memoryview(blob).cast("B"), np.uint8)
        except TypeError as e:
            raise TypeError(f"lmc: blob must be bytes-like, got {type(blob)!r}") from e
    if b.flags.writeable:
        b = b.view()
        b.flags.writeable = False
    return b


_CHUNK_MODE_NAMES = ("alone", "xor", "stored", "temporal", "predicted", "mantissa-context", "delta", "joint-symbol")


def info(blob):
    """Header information of a blob (dtype, shape, chunk size, ...), and
    ``chunk_modes``: how many chunks each chunk mode codes (read from each
    chunk's first byte; nothing is decoded)."""
    b = _blob_view(blob)
    h = _parse_header(b)
    if "k" in h:   # the zero mask: both blobs checked as the decoder checks them, the values blob's chunks
        (s, e), (vs, ve) = zmask.parts(b, h, _parse_header, FormatError)
        return dict(info(b[vs:ve]), version=h["version"], shape=h["shape"], zero_mask=dict(
            nonzero=h["k"], bitmap_bytes=e - s))
    modes = {}
    for off, size in zip(h["offsets"].tolist(), h["sizes"].tolist()):
        m = int(b[off]) if size > 0 else -1
        name = _CHUNK_MODE_NAMES[m] if 0 <= m < len(_CHUNK_MODE_NAMES) else "invalid"
        modes[name] = modes.get(name, 0) + 1
    return dict(version=h["version"], dtype=h["dtype"], shape=h["shape"], chunk_size=h["chunk"],
                nchunks=h["nch"], has_reference=h["refhash"] is not None, chunk_modes=modes, zero_mask=None)


def _raise_chunk_error(status):
    bad = np.flatnonzero(status)
    if bad.size:
        c = int(bad[0])
        msg = ERROR_MESSAGES.get(int(status[c]), "unknown error")
        raise FormatError(f"lmc: chunk {c}: {msg}")


def decompress(blob, *, threads=None, reference=None, out=None, max_output_bytes=None):
    """Decompress an lmc blob to a numpy array of the original dtype/shape.

    ``max_output_bytes``: refuse (``lmc.OutputLimitError``, a ``FormatError``)
    a blob whose header declares more output bytes than this, before
    anything is allocated; ``None`` means no limit.

    Every chunk's structure (modes, lengths, tables) is checked before the
    output is allocated, and decoding stops at the first failing chunk. With
    ``reference``, a failing chunk is blamed on it (``FormatError``, "wrong
    reference") where its hash differs from the one the blob records; a
    reference that differs only where no chunk uses it gives the exact array
    (every chunk's checksum covers its decoded units)."""
    raw = buf = _blob_view(blob)
    h = _parse_header(buf)
    if _CHECKED_PY:
        buf = intrinsics.checked(buf)
    dt, unit, layout = h["dtype"], h["unit"], h["layout"]
    shape, total = h["shape"], h["total"]
    if max_output_bytes is not None:
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, (int, np.integer)):
            raise TypeError(f"lmc: max_output_bytes must be an int or None, got {max_output_bytes!r}")
        if max_output_bytes < 0:
            raise ValueError(f"lmc: max_output_bytes must be >= 0, got {max_output_bytes}")
        if total * unit > max_output_bytes:
            raise OutputLimitError(f"lmc: the blob decodes to {total * unit} bytes, more than "
                                   f"max_output_bytes={int(max_output_bytes)}")
    ns = _nstreams(unit, layout)
    ref_u8 = _EMPTY
    has_ref = False
    if h["refhash"] is not None:
        if reference is None:
            raise FormatError("lmc: blob was delta-coded against a reference; "
                              "pass the same reference= to decompress")
        try:
            r = _check_reference(reference, dt, shape, "reference")
        except ValueError as e:
            raise FormatError(f"lmc: wrong reference: {e}") from None
        ref_u8 = _ro_bytes(r)
        if _CHECKED_PY:
            ref_u8 = intrinsics.checked(ref_u8)
        has_ref = True
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise ValueError("lmc: out must be a numpy array")
        if out.dtype != dt:
            raise ValueError(f"lmc: out dtype {out.dtype} != {dt}")
        if out.size != total:
            raise ValueError(f"lmc: out has {out.size} elements, {total} needed")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("lmc: out must be C-contiguous and writeable")
    nth = _nthreads(threads)
    if "k" in h:
        return zmask.decode(raw, h, decompress, _parse_header, nth, out, FormatError)

    def refuse(status):
        # the reference's hash is taken only where a chunk fails, to name the cause: every chunk's checksum
        # covers its decoded units, so a reference that differs where no chunk uses it gives the exact array,
        # and one that differs where a chunk uses it fails that chunk (its pass over the reference cost a
        # bf16 decode 5% of its time, fp32 9%)
        if has_ref and np.any(status) and (_ref_hash(ref_u8, total, h["chunk"], unit, nth, ck_mode(h["version"]))
                                           != h["refhash"]):
            raise FormatError("lmc: wrong reference (reference hash mismatch)")
        _raise_chunk_error(status)
    nch = h["nch"]
    if nch:
        # the whole blob's structure first: a forged blob is refused before the
        # output (sized from its header) is allocated or any chunk decoded
        status = np.zeros(nch, np.int64)
        _run_chunks(check_range, (buf, h["offsets"], h["sizes"], h["chks"], total, h["chunk"],
                                    unit, layout, ns, ref_u8, has_ref, status, h["version"]), nch, nth)
        refuse(status)
    if out is not None:
        result = out if out.shape == shape else out.reshape(shape)
    else:
        result = np.empty(shape, dt)
    out_u8 = result.reshape(-1).view(np.uint8)
    if _CHECKED_PY:
        out_u8 = intrinsics.checked(out_u8)
    if nch:
        stop = np.zeros(1, np.int64)
        _run_chunks(decode_range, (buf, h["offsets"], h["sizes"], h["chks"], total,
                                     h["chunk"], unit, layout, ns, ref_u8, has_ref,
                                     out_u8, status, h["version"], stop), nch, nth)
        refuse(status)
    return result
