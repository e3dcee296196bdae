"""Format 10's zero mask: a tensor whose elements are often all-bits-zero, coded as a bitmap of the others and
those others alone (FORMAT.md, "Zero-mask blob").

Why: an embedding's rows for tokens the data never holds get no gradient, so both Adam moments keep them at
exactly 0 (a byte-vocabulary model: 150 of 256 rows). lmc's streams are order-0 per byte plane, where a share
of zero bytes among uniform mantissa bytes costs about a bit a byte more than the non-zero bytes need; an
order-1 coder sees the runs. The mask takes them out: each zero costs a bit of the bitmap before that is
coded (whole rows of zeros: bytes 0x00 and 0xff, about 1/8 bit an element).

The two parts are whole lmc blobs of version 9 or older (no reference, no mask of their own), so every check
the decoder makes of a blob it makes of each. A blob without a mask is version 9's bytes (api.compress writes
version 10 only where the mask is used). Asked for a reference, api.compress takes the mask wherever it is
smaller than the blob against the reference (``compress(..., ref=True)``)."""
from __future__ import annotations

import struct
import zlib

import numpy as np

FLAG_ZERO = 2
MIN_BYTES = 4096      # a plain blob smaller than this is kept (the mask's second header and bitmap cost ~100 bytes)
MARGIN = 64           # prefer="speed" / "fast": taken only where it saves 1/MARGIN (it decodes in two more passes)
SAMPLE = 4096         # elements looked at before the zeros are counted (in 16 blocks)
FIELDS = struct.Struct("<QQ")   # the non-zero count k, the bitmap blob's length
BLOCK = 1 << 20       # elements a step of the decoder's scatter (a multiple of 8)
_POP = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def _units(arr):
    """The array's elements as unsigned integers of their width (all-bits-zero <=> 0), flat."""
    return arr.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[arr.dtype.itemsize])


def worth_trying(arr):
    """Whether a sample of ``arr`` has zeros enough (1/32 of its elements) for the mask to be tried."""
    u = _units(arr)
    if u.size * arr.dtype.itemsize < MIN_BYTES:
        return False
    if u.size > 2 * SAMPLE:   # 16 blocks of 256 elements spread over the tensor (a stride would alias with rows)
        step = u.size // 16
        u = u[:16 * step].reshape(16, step)[:, :SAMPLE // 16]
    return (u.size - np.count_nonzero(u)) * 32 >= u.size


def compress(arr, plain, head, code, encode, sf, ref=False):
    """The zero-mask blob of ``arr`` where it is smaller than ``plain`` (by 1/MARGIN unless ``sf``, size
    first), else ``plain``. head: the header's first 4 bytes (magic); code: the dtype code; encode(array): an
    lmc blob of version 9 or older, no reference. ``ref``: ``plain`` was coded against a reference: the mask
    (which codes alone) is taken wherever smaller, whatever its size, so that a blob against a reference is
    never larger than the same tensor coded alone (by more than the reference's 8-byte hash)."""
    u = _units(arr)
    keep = u != 0
    k = int(np.count_nonzero(keep))
    if (u.size - k) * 16 < u.size or (len(plain) < MIN_BYTES and not ref):
        return plain
    bits = encode(np.packbits(keep))
    kept = arr.reshape(-1)[keep]
    if arr.ndim >= 2 and k:
        rows = keep.reshape(-1, arr.shape[-1])
        if np.array_equal(rows.any(1), rows.all(1)):   # the zeros fill whole rows: the rest keep the row length
            kept = kept.reshape(-1, arr.shape[-1])
    body = encode(kept)
    blob = header(head, code, arr.shape, k, len(bits))
    size = len(blob) + len(bits) + len(body)
    if size >= len(plain) or (not sf and not ref and size + len(plain) // MARGIN > len(plain)):
        return plain
    return bytes(blob) + bits + body


def header(magic, code, shape, k, nbits, version=10, flags=FLAG_ZERO):
    """A zero-mask blob's header (FORMAT.md): magic, version, dtype code, flags, shape, k, the bitmap blob's
    length and the CRC-32 of them (the fuzzer forges version and flags through it too)."""
    h = bytearray(magic)
    h += struct.pack("<BBBB", version, code, flags, len(shape))
    h += struct.pack(f"<{len(shape)}Q", *shape)
    h += FIELDS.pack(k, nbits)
    h += struct.pack("<I", zlib.crc32(h))
    return bytes(h)


def parse(buf, pos, h, total, error):
    """Header ``h`` (its fields up to the shape) with those of a zero-mask blob after it (buf: uint8 array; pos:
    the offset after the shape): ``total`` (elements, from ``total()``, which refuses a shape numpy cannot
    hold), ``k`` and the two blobs' spans ``bits`` and ``values``; ``error(message)`` is raised for a forged
    field."""
    nb = len(buf)
    if nb < pos + FIELDS.size + 4:
        raise error("lmc: blob truncated inside the header")
    k, nbits = FIELDS.unpack_from(buf, pos)
    pos += FIELDS.size
    (crc,) = struct.unpack_from("<I", buf, pos)
    if zlib.crc32(buf[:pos]) != crc:
        raise error("lmc: header checksum mismatch (corrupt header)")
    pos += 4
    n = total()
    if k > n:
        raise error(f"lmc: zero mask: {k} non-zero elements in a tensor of {n}")
    if nbits > nb - pos:
        raise error("lmc: zero mask: the bitmap runs past the blob")
    return dict(h, total=n, k=k, bits=(pos, pos + nbits), values=(pos + nbits, nb))


def parts(buf, h, parse_header, error):
    """The two inner blobs' spans, each checked as FORMAT.md says (a blob of version 9 or older, no reference,
    of dtype uint8 with ceil(N / 8) elements, then of the tensor's dtype with k); ``parse_header``: lmc's."""
    total, dt = h["total"], h["dtype"]
    out = []
    for (s, e), want, what in ((h["bits"], (np.dtype(np.uint8), -(-total // 8)), "bitmap"),
                               (h["values"], (dt, h["k"]), "values")):
        try:
            ih = parse_header(buf[s:e])
        except error as x:
            raise error(f"lmc: zero mask: {what}: {x}") from None
        if ih["version"] >= 10 or ih["refhash"] is not None or (ih["dtype"], ih["total"]) != want:
            raise error(f"lmc: zero mask: the {what} blob is not a {want[0]} blob of {want[1]} elements "
                        "(version 9 or older, no reference)")
        out.append((s, e))
    return out


def decode(buf, h, decompress, parse_header, threads, out, error):
    """The array of zero-mask blob ``buf`` (h: its parsed header; decompress / parse_header: lmc's, for the two
    inner blobs). The bitmap is decoded and its bits checked first; the kept elements are then decoded into the
    head of the output itself and moved to their places from the last block back (a kept element never sits
    before its index among the kept), so that nothing as large as the output is allocated beside it."""
    total, shape, dt, k = h["total"], h["shape"], h["dtype"], h["k"]
    (s, e), (vs, ve) = parts(buf, h, parse_header, error)
    try:
        bits = decompress(buf[s:e], threads=threads).reshape(-1)
    except error as x:
        raise error(f"lmc: zero mask: {x}") from None
    if total % 8 and bits[-1] & (0xFF >> (total % 8)):
        raise error("lmc: zero mask: bits set past the last element")
    if int(_POP[bits].sum(dtype=np.int64)) != k:
        raise error("lmc: zero mask: the bitmap's count differs from the header's")
    result = out if out is not None else np.empty(shape, dt)
    try:
        decompress(buf[vs:ve], threads=threads, out=result.reshape(-1)[:k])
    except error as x:
        raise error(f"lmc: zero mask: {x}") from None
    flat = _units(result)
    j1 = k
    for e0 in range((total - 1) // BLOCK * BLOCK, -1, -BLOCK):
        e1 = min(total, e0 + BLOCK)
        keep = np.unpackbits(bits[e0 // 8:-(-e1 // 8)], count=e1 - e0).view(np.bool_)
        j0 = j1 - int(np.count_nonzero(keep))
        kept = flat[j0:j1].copy()       # (j0 <= e0: the elements not yet moved lie before this block)
        flat[e0:e1] = 0
        flat[e0:e1][keep] = kept
        j1 = j0
    return result if result.shape == shape else result.reshape(shape)
