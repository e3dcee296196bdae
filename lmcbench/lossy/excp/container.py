"""ExCP container framing: the 32-byte header, both CRC-32s and the archivers (none, lzma, zstd, lmc) around
the payload, with the decoder's memory bounds (FORMAT.md, "Header", "Archivers", "Checksums")."""

from __future__ import annotations

import lzma
import zlib

import numpy as np

from .config import (
    _ARCHIVER_NAMES,
    _ARCHIVERS,
    _CHUNK,
    _HEADER,
    _LMC_CHUNK,
    _ZSTD_MAGIC,
    HEADER_SIZE,
    LZMA_MEMLIMIT,
    MAGIC,
    MAX_PAYLOAD_BYTES,
    VERSION,
    ExCPError,
    ExCPFormatError,
    _short,
)


# ------------------------------------------------------------------------------------- encoding
def _pack_container(payload: bytes, archiver: str, level: int | None) -> bytes:
    """The blob: the 32-byte header, then ``payload`` archived by ``archiver`` at ``level``."""
    if archiver == "none":
        archived = payload
    elif archiver == "lzma":
        archived = lzma.compress(payload, format=lzma.FORMAT_XZ, preset=level)
    elif archiver == "zstd":
        import zstandard
        archived = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(payload)
    elif archiver == "lmc":
        import lmc
        # format_version=3: the oldest lmc version its chunks need (a uint8 payload gains nothing from format 4),
        # so ExCP files stay readable by lmc 0.2+ and the frozen vectors reproduce
        archived = lmc.compress(np.frombuffer(payload, np.uint8), chunk_size=_LMC_CHUNK, format_version=3)
    else:
        raise ExCPError(f"unknown archiver {archiver!r}")
    header = _HEADER.pack(MAGIC, VERSION, _ARCHIVERS[archiver], 0, len(payload), len(archived),
                          zlib.crc32(payload), zlib.crc32(archived))
    return header + archived

# ------------------------------------------------------------------------------------- decoding
def _check_limit(max_payload_bytes) -> int:
    if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, (int, np.integer)) \
            or max_payload_bytes < 0:
        raise ExCPError(f"max_payload_bytes must be a non-negative integer, got {_short(max_payload_bytes)}")
    return int(max_payload_bytes)


def _unpack_container(blob, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> tuple[bytes | bytearray | memoryview, str]:
    """Check the header and both checksums, un-archive; returns (payload, archiver name).

    The payload is bytes-like: one buffer of exactly the declared length (a ``bytearray`` or ``bytes`` for
    an archived blob, a read-only ``memoryview`` into ``blob`` for archiver ``none``). A declared length
    above ``max_payload_bytes`` is refused before anything is allocated."""
    limit = _check_limit(max_payload_bytes)
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ExCPFormatError(f"expected a bytes-like blob, got {type(blob).__name__}")
    try:
        mv = memoryview(blob).cast("B")
    except (TypeError, ValueError) as e:
        raise ExCPFormatError(f"blob is not a contiguous byte buffer ({e})") from None
    if len(mv) < HEADER_SIZE:
        raise ExCPFormatError(f"truncated blob: {len(mv)} bytes, the header alone needs {HEADER_SIZE}")
    magic, version, arch, reserved, raw_len, arch_len, raw_crc, arch_crc = _HEADER.unpack(mv[:HEADER_SIZE])
    if magic != MAGIC:
        raise ExCPFormatError(f"not an ExCP blob (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ExCPFormatError(f"unsupported ExCP format version {version} (this reader knows {VERSION})")
    if arch not in _ARCHIVER_NAMES:
        raise ExCPFormatError(f"unknown archiver id {arch}")
    if reserved:
        raise ExCPFormatError("reserved header field is not zero")
    if arch_len != len(mv) - HEADER_SIZE:
        what = "truncated" if arch_len > len(mv) - HEADER_SIZE else "trailing bytes in"
        raise ExCPFormatError(f"{what} blob: header declares {arch_len} archived bytes, "
                              f"{len(mv) - HEADER_SIZE} follow it")
    if raw_len > limit:
        raise ExCPFormatError(f"declared payload of {raw_len} bytes exceeds the {limit}-byte limit")
    archived = mv[HEADER_SIZE:].toreadonly()  # a view: no copy of the blob
    if zlib.crc32(archived) != arch_crc:
        raise ExCPFormatError("checksum mismatch in the archived data (corrupt blob)")
    name = _ARCHIVER_NAMES[arch]
    try:
        payload = _unarchive(name, archived, raw_len)
    except (ExCPFormatError, MemoryError):  # MemoryError: the declared size itself cannot be allocated
        raise
    except Exception as e:  # noqa: BLE001 - third-party decompressors raise anything on hostile input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExCPFormatError(f"{name} archive is corrupt: {msg}") from None
    if len(payload) != raw_len:
        raise ExCPFormatError(f"{name} archive holds {len(payload)} payload bytes, the header declares {raw_len}")
    if zlib.crc32(payload) != raw_crc:
        raise ExCPFormatError("checksum mismatch in the payload (corrupt blob)")
    return payload, name


def _unarchive(name: str, archived: memoryview, raw_len: int):
    """The payload of ``archived``: one buffer of at most ``raw_len`` bytes (plus one bounded chunk in flight)."""
    if name == "none":
        return archived
    if name == "lzma":
        return _unlzma(archived, raw_len)
    if name == "zstd":
        import zstandard
        if bytes(archived[:4]) != _ZSTD_MAGIC:
            raise ExCPFormatError("zstd archive is corrupt: it does not start with a zstd data frame")
        fp = zstandard.get_frame_parameters(archived)
        if fp.content_size != raw_len:
            raise ExCPFormatError(f"zstd frame declares {fp.content_size} bytes, the header {raw_len}")
        # one frame with a known content size is decoded straight into one buffer of that size; anything
        # after the frame (a second frame, a skippable frame, garbage) is an error
        return zstandard.ZstdDecompressor().decompress(archived, max_output_size=raw_len, read_across_frames=False,
                                                       allow_extra_data=False)
    if name == "lmc":
        import lmc
        info = lmc.info(archived)
        shape = tuple(info["shape"])
        if np.dtype(info["dtype"]) != np.uint8 or shape != (raw_len,) or info.get("has_reference") \
                or info["chunk_size"] != _LMC_CHUNK:
            raise ExCPFormatError(f"lmc archive header ({info['dtype']}, shape {shape}) does not match "
                                  f"a {raw_len}-byte payload")
        buf = bytearray(raw_len)
        lmc.decompress(archived, out=np.frombuffer(buf, np.uint8))
        return buf
    raise ExCPFormatError(f"unknown archiver {name!r}")  # pragma: no cover


def _unlzma(archived: memoryview, raw_len: int) -> bytearray:
    """xz stream -> bytearray(raw_len), fed and drained in bounded chunks, under :data:`LZMA_MEMLIMIT`."""
    buf = bytearray(raw_len)
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=LZMA_MEMLIMIT)
    pos = fed = 0
    try:
        while not d.eof:
            if d.needs_input:
                if fed >= len(archived):
                    break  # truncated stream
                chunk = archived[fed:fed + _CHUNK]
                fed += len(chunk)
            else:
                chunk = b""
            out = d.decompress(chunk, max_length=min(_CHUNK, raw_len + 1 - pos))
            if pos + len(out) > raw_len:
                raise ExCPFormatError(f"lzma archive holds more than the {raw_len} payload bytes the header declares")
            buf[pos:pos + len(out)] = out
            pos += len(out)
            if not out and not chunk and not d.eof and not d.needs_input:
                break  # no progress (not expected from liblzma): reported below
    except (lzma.LZMAError, MemoryError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExCPFormatError(f"lzma archive is corrupt or needs more than the {LZMA_MEMLIMIT >> 20} MiB "
                              f"decoder memory limit ({msg})") from None
    if not d.eof or d.unused_data or fed != len(archived) or pos != raw_len:
        raise ExCPFormatError("lzma archive does not end where the payload does")
    return buf

