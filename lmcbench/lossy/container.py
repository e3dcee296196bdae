"""The LMCL container: the framing every lossy method but ExCP writes (frozen spec: ``LOSSY_FORMAT.md``).

A blob is a 32-byte header, a JSON table of contents and a data region of sections back to back. The header
carries the magic, the version, the method's id, the lengths and three CRC-32s (header, TOC, data); the TOC
names every stored array (parameter, kind, dtype, shape, mode, the mode's arguments, its sections). How a mode
turns its sections into an array is :mod:`lmcbench.lossy.arrays`; this module only frames and checks. No
pickle anywhere; every error on a bad blob is one :class:`LossyFormatError` line.
"""

from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np

from ..errors import LmcbenchError

MAGIC = b"LMCL"
VERSION = 2            # the newest version this module writes and reads
VERSIONS = (1, 2)      # the versions it reads
V2_MODES = ("ctxq",)   # modes version 2 adds; a blob using none of them is written as version 1, byte for byte
_HEADER = struct.Struct("<4sBBHIQIII")
HEADER_SIZE = _HEADER.size  # 32
MAX_TOC_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = 1 << 35  # decoded bytes a blob may declare (sum of its sections' raw lengths), by default
METHOD_IDS = {"adam8bit": 1, "sz3": 2, "zfp": 3, "bitsnap": 4, "efq": 5}
METHOD_NAMES = {v: k for k, v in METHOD_IDS.items()}
CODINGS = ("raw", "zstd", "lmc")
SECTION_DTYPES = ("uint8", "int8", "int16", "int32", "float32")
KINDS = ("weight", "exp_avg", "exp_avg_sq")
ARRAY_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class LossyError(LmcbenchError):
    """Invalid input given to a lossy method's encoder or decoder."""


class LossyFormatError(LossyError):
    """A blob that is not a valid LMCL container, or a previous reconstruction that does not fit it."""


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


# ------------------------------------------------------------------------------------------ sections
def code_section(arr: np.ndarray, coding: str = "auto", level: int = 19) -> tuple[list, bytes]:
    """``arr`` (1-D, a dtype of :data:`SECTION_DTYPES`) as a section: ``([coding, stored_len, raw_len,
    dtype], stored bytes)``. ``auto`` keeps the smallest of raw, zstd and lmc."""
    arr = np.ascontiguousarray(arr).reshape(-1)
    dt = arr.dtype.name
    if dt not in SECTION_DTYPES:
        raise LossyError(f"section dtype {dt} is not one of {SECTION_DTYPES}")
    raw = arr.tobytes()
    cands = {}
    if coding in ("raw", "auto"):
        cands["raw"] = raw
    if coding in ("zstd", "auto") and len(raw):
        import zstandard

        cands["zstd"] = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)
    if coding in ("lmc", "auto") and len(raw):
        import lmc

        cands["lmc"] = lmc.compress(arr, threads=1)
    if not cands:
        cands["raw"] = raw
    name = min(cands, key=lambda k: (len(cands[k]), CODINGS.index(k)))
    return [name, len(cands[name]), len(raw), dt], cands[name]


def decode_section(desc, stored: memoryview) -> np.ndarray:
    """The 1-D array a section holds (its descriptor already checked by :func:`_check_section`)."""
    coding, _, raw_len, dt = desc
    dtype = np.dtype(dt)
    if coding == "raw":
        out = np.frombuffer(stored, dtype)
    elif coding == "zstd":
        import zstandard

        if bytes(stored[:4]) != _ZSTD_MAGIC:
            raise LossyFormatError("zstd section does not start with a zstd frame")
        fp = zstandard.get_frame_parameters(stored)
        if fp.content_size != raw_len:
            raise LossyFormatError(f"zstd section declares {fp.content_size} bytes, the TOC {raw_len}")
        raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_len, read_across_frames=False,
                                                      allow_extra_data=False)
        out = np.frombuffer(raw, dtype)
    else:
        import lmc

        info = lmc.info(stored)
        if np.dtype(info["dtype"]) != dtype or tuple(info["shape"]) != (raw_len // dtype.itemsize,) \
                or info.get("has_reference"):
            raise LossyFormatError(f"lmc section holds {info['dtype']} {tuple(info['shape'])}, the TOC says "
                                   f"{dt} ({raw_len // dtype.itemsize},)")
        out = lmc.decompress(stored, threads=1, max_output_bytes=raw_len)
    if out.nbytes != raw_len:
        raise LossyFormatError(f"{coding} section holds {out.nbytes} bytes, the TOC says {raw_len}")
    return out


def _check_section(s, where: str) -> None:
    if not (isinstance(s, list) and len(s) == 4 and s[0] in CODINGS and s[3] in SECTION_DTYPES
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s[1:3])):
        raise LossyFormatError(f"{where}: bad section descriptor {str(s)[:60]}")
    if s[2] % np.dtype(s[3]).itemsize:
        raise LossyFormatError(f"{where}: {s[2]} bytes is not a whole number of {s[3]}")
    if s[0] == "raw" and s[1] != s[2]:
        raise LossyFormatError(f"{where}: a raw section of {s[1]} stored bytes declares {s[2]}")


# ------------------------------------------------------------------------------------------ framing
def pack(method: str, setting: str, entries: list[dict], sections: list[bytes]) -> bytes:
    """The blob of a method's arrays: ``entries`` are the TOC's array entries (each with its ``sections``
    descriptors, in order), ``sections`` the stored bytes of every section, in the same order."""
    toc = {"method": method, "setting": setting, "arrays": entries}
    tb = json.dumps(toc, separators=(",", ":"), allow_nan=False).encode()
    data = b"".join(sections)
    version = 2 if any(e.get("mode") in V2_MODES for e in entries) else 1
    head = _HEADER.pack(MAGIC, version, METHOD_IDS[method], 0, len(tb), len(data), zlib.crc32(tb), zlib.crc32(data), 0)
    head = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
    return head + tb + data


def unpack(blob, method: str, max_payload_bytes: int = MAX_PAYLOAD_BYTES):
    """Check a blob's framing and TOC; returns ``(toc, [(entry, [section views])...])``. Everything wrong
    raises :class:`LossyFormatError` with a one-line message."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise LossyFormatError(f"expected a bytes-like blob, got {type(blob).__name__}")
    mv = memoryview(blob).cast("B")
    if len(mv) < HEADER_SIZE:
        raise LossyFormatError(f"truncated blob: {len(mv)} bytes, the header alone needs {HEADER_SIZE}")
    magic, version, mid, reserved, toc_len, data_len, toc_crc, data_crc, head_crc = _HEADER.unpack(mv[:HEADER_SIZE])
    if magic != MAGIC:
        raise LossyFormatError(f"not an LMCL lossy blob (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if zlib.crc32(mv[:HEADER_SIZE - 4]) != head_crc:
        raise LossyFormatError("header checksum mismatch (corrupt or forged header)")
    if version not in VERSIONS:
        raise LossyFormatError(f"unsupported LMCL version {version} (this reader knows {', '.join(map(str, VERSIONS))})")
    if mid not in METHOD_NAMES:
        raise LossyFormatError(f"unknown method id {mid}")
    if METHOD_NAMES[mid] != method:
        raise LossyFormatError(f"a {METHOD_NAMES[mid]} blob, not {method}")
    if reserved:
        raise LossyFormatError("reserved header field is not zero")
    if toc_len > MAX_TOC_BYTES:
        raise LossyFormatError(f"table of contents of {toc_len} bytes exceeds the {MAX_TOC_BYTES}-byte limit")
    if HEADER_SIZE + toc_len + data_len != len(mv):
        what = "truncated" if HEADER_SIZE + toc_len + data_len > len(mv) else "trailing bytes in"
        raise LossyFormatError(f"{what} blob: the header declares {HEADER_SIZE + toc_len + data_len} bytes, "
                               f"it has {len(mv)}")
    tb = mv[HEADER_SIZE:HEADER_SIZE + toc_len]
    data = mv[HEADER_SIZE + toc_len:].toreadonly()
    if zlib.crc32(tb) != toc_crc:
        raise LossyFormatError("table of contents checksum mismatch (corrupt blob)")
    if zlib.crc32(data) != data_crc:
        raise LossyFormatError("data checksum mismatch (corrupt blob)")
    try:
        toc = json.loads(bytes(tb).decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise LossyFormatError(f"table of contents is not valid JSON ({_one_line(e)})") from None
    if not isinstance(toc, dict) or set(toc) != {"method", "setting", "arrays"} or toc["method"] != method \
            or not isinstance(toc["setting"], str) or not isinstance(toc["arrays"], list):
        raise LossyFormatError("table of contents is not an object with method, setting and arrays")
    out, pos, total, seen = [], 0, 0, set()
    for k, e in enumerate(toc["arrays"]):
        where = f"array {k}"
        _check_entry(e, where)
        if version < 2 and e["mode"] in V2_MODES:
            raise LossyFormatError(f"{where}: mode {e['mode']} in a version {version} blob (it needs version 2)")
        key = (e["name"], e["kind"])
        if key in seen:
            raise LossyFormatError(f"{where}: {e['name']} {e['kind']} stored twice")
        seen.add(key)
        views = []
        for s in e["sections"]:
            _check_section(s, where)
            if pos + s[1] > data_len:
                raise LossyFormatError(f"{where}: sections run past the data region")
            views.append(data[pos:pos + s[1]])
            pos += s[1]
            total += s[2]
        if total > max_payload_bytes:
            raise LossyFormatError(f"declared sections of more than {max_payload_bytes} bytes (the limit)")
        out.append((e, views))
    if pos != data_len:
        raise LossyFormatError(f"{data_len - pos} data bytes after the last section")
    names = {n for n, _ in seen}
    if any((n, "weight") not in seen for n in names):
        raise LossyFormatError("a parameter without its weight")
    return toc, out


def _no_constant(c):
    raise ValueError(f"{c} is not allowed")


def _check_entry(e, where: str) -> None:
    keys = {"name", "kind", "dtype", "shape", "mode", "args", "sections"}
    if not isinstance(e, dict) or set(e) != keys:
        raise LossyFormatError(f"{where}: an entry has exactly the keys {sorted(keys)}")
    if not isinstance(e["name"], str) or e["kind"] not in KINDS or e["dtype"] not in ARRAY_DTYPES \
            or not isinstance(e["mode"], str) or not isinstance(e["args"], dict) or not isinstance(e["sections"], list):
        raise LossyFormatError(f"{where}: bad name, kind, dtype, mode, args or sections")
    sh = e["shape"]
    if not isinstance(sh, list) or len(sh) > 32 or not all(isinstance(d, int) and not isinstance(d, bool)
                                                            and 0 <= d < 1 << 40 for d in sh):
        raise LossyFormatError(f"{where}: bad shape {str(sh)[:60]}")
    if math.prod(sh) >= 1 << 40:
        raise LossyFormatError(f"{where}: shape {sh} is too large")
    for k, v in e["args"].items():
        if not isinstance(v, (int, float, bool, str)) or (isinstance(v, float) and not math.isfinite(v)):
            raise LossyFormatError(f"{where}: argument {str(k)[:30]} has a bad value")
