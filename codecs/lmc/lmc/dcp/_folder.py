"""An LMC DCP checkpoint folder (see ``DCP.md``), what :mod:`lmc.dcp`'s writer and reader share: the dtype tables,
the JSON metadata written and read back (every field checked, nothing unpickled), and :class:`CheckpointFolder`,
a validated folder (a path or an fsspec URL) whose items decode one at a time, through their reference
checkpoint when delta-coded. A private module: its names are lmc.dcp's, not a public API."""
from __future__ import annotations

import json
import math
import os
import re
import threading
import zlib
from dataclasses import dataclass

import numpy as np
import torch
import xxhash
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ..api import FormatError, decompress
from ..storage import backend, canonical, is_url, join
from ..formats.dtypes import DTYPES

METADATA_FILE = "lmc-metadata.json"
FORMAT = "lmc-dcp"
FORMAT_VERSION = 3        # written; 2 (CRC-32 checksums only) and 1 (no "group", references only to older
FORMAT_VERSIONS = (1, 2, 3)  # checkpoints) are read too
SUFFIX = ".lmc"
MAGIC = b"LMCDCP\x00\x01"
_HEADER_LEN = len(MAGIC) + 36  # + the save id (a UUID, 36 ASCII characters)
_FILE_RE = re.compile(r"^__\d{1,9}_\d{1,9}\.lmc$")


def is_data_file(name: str) -> bool:
    """Whether ``name`` is an LMC DCP data file's name (``__<rank>_<k>.lmc``)."""
    return _FILE_RE.match(name) is not None


def next_generation(items) -> int:
    """The first data-file number ``k`` above every ``__<rank>_<k>.lmc`` a checkpoint's items name: where its
    re-coded items go, beside files a save wrote one per worker."""
    return 1 + max(int(it.file[:-len(SUFFIX)].rsplit("_", 1)[1]) for _, it in items.values())
_MAX_METADATA = 1 << 30
_CODECS = ("lmc", "raw", "zlib")

# torch dtypes LMC codes with their own layout (the numpy dtype of the same bits): the one dtype table's rows
# (lmc.formats.dtypes; bool is coded as numpy's bool here, as format 1 wrote it)
LMC_DTYPES = {getattr(torch, _d.name): _d.numpy for _d in DTYPES
               if isinstance(getattr(torch, _d.name, None), torch.dtype)}
# every torch dtype a tensor item may have (those LMC does not code are stored raw or zlib-compressed)
TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in LMC_DTYPES}
for _n in ("complex128", "complex32", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if isinstance(getattr(torch, _n, None), torch.dtype):
        TORCH_DTYPES[_n] = getattr(torch, _n)
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve_format": torch.preserve_format}


def dtype_name(dt: torch.dtype) -> str:
    name = str(dt).removeprefix("torch.")
    if TORCH_DTYPES.get(name) != dt:
        raise TypeError(f"lmc.dcp: tensors of dtype {dt} cannot be stored")
    return name


def is_lmc_checkpoint(path) -> bool:
    """Whether ``path`` (a folder or an fsspec URL) is a complete LMC DCP checkpoint (it has the metadata
    file)."""
    try:
        return backend(os.fspath(path), FormatError).isfile(METADATA_FILE)
    except FormatError:  # a URL fsspec cannot open
        return False


@dataclass(frozen=True)
class Item:
    """Where and how one item (a tensor chunk or a bytes object) is stored: ``WriteResult.storage_data`` and
    the values of ``Metadata.storage_data``."""

    file: str
    offset: int
    length: int
    codec: str  # lmc | raw | zlib
    size: int  # bytes of the decoded item
    check: int | str  # checksum of the decoded bytes: XXH3-128 as 32 hex digits, or CRC-32 (an int; format <= 2)
    dtype: str | None = None  # None: a bytes item
    shape: tuple | None = None
    ref: tuple | None = None  # (reference save id, checksum of the reference item) when delta-coded
    prev: "Item | None" = None  # the same item of the previous checkpoint, re-coded against this one


@dataclass(frozen=True)
class Plan:
    """``SavePlan.storage_data`` from the coordinator: the rank's file prefix and the save id."""

    prefix: str
    save_id: str


def checksum(buf, like: int | str = "") -> int | str:
    """The checksum of a buffer: XXH3-128 as 32 lowercase hex digits (what format 3 writes), or its CRC-32 when
    ``like`` is an int (a checksum that format 1 or 2 wrote, to be checked)."""
    if type(like) is int:
        return zlib.crc32(buf) & 0xFFFFFFFF
    return xxhash.xxh3_128_hexdigest(buf)


_XXH3_RE = re.compile(r"^[0-9a-f]{32}$")


def _valid_check(v) -> bool:
    return (type(v) is int and 0 <= v < 1 << 32) or (isinstance(v, str) and _XXH3_RE.match(v) is not None)


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a tensor (its projection only, row-major) as a flat uint8 array."""
    t = t.detach().cpu()
    if t.is_complex():
        t = t.resolve_conj()
    t = t.resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


# ------------------------------------------------------------------------------------------------ metadata
def item_key(index: MetadataIndex) -> tuple:
    return (index.fqn, None if index.offset is None else tuple(index.offset))


def _ints(v, what, path) -> tuple:
    if not isinstance(v, list) or not all(type(x) is int and 0 <= x < 1 << 62 for x in v):
        raise FormatError(f"{path}: malformed metadata: {what} must be a list of non-negative integers")
    return tuple(v)


def metadata_json(md: Metadata, items: dict, save_id: str, reference: dict | None, checkpoint_id,
                   group: int | None = None) -> dict:
    sdm = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            sdm[fqn] = {"type": "bytes"}
        elif isinstance(m, TensorStorageMetadata):
            p = m.properties
            if p.layout != torch.strided:
                raise TypeError(f"lmc.dcp: {fqn}: layout {p.layout} cannot be stored")
            mf = next(k for k, v in _MEMORY_FORMATS.items() if v == p.memory_format)
            sdm[fqn] = {"type": "tensor", "dtype": dtype_name(p.dtype), "size": list(m.size),
                        "requires_grad": bool(p.requires_grad), "memory_format": mf,
                        "pin_memory": bool(p.pin_memory),
                        "chunks": [[list(c.offsets), list(c.sizes)] for c in m.chunks]}
        else:
            raise TypeError(f"lmc.dcp: {fqn}: unknown storage metadata {type(m).__name__}")
    pd = md.planner_data
    if pd is not None:
        ok = isinstance(pd, dict) and all(
            isinstance(k, str) and isinstance(v, (tuple, list))
            and all(isinstance(x, str) or (type(x) is int) for x in v) for k, v in pd.items())
        if not ok:
            raise TypeError("lmc.dcp: planner_data other than {fqn: (str | int, ...)} cannot be stored")
        pd = {k: list(v) for k, v in pd.items()}
    sm = md.storage_meta
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "dcp_version": md.version, "save_id": save_id,
        "checkpoint_id": None if checkpoint_id is None else os.fspath(checkpoint_id),
        "modules": list(sm.modules) if sm is not None and sm.modules else [],
        "reference": reference, **({} if group is None else {"group": group}),
        "state_dict_metadata": sdm, "planner_data": pd,
        "items": [item_json(idx, it) for idx, it in items.items()],
    }


def item_json(idx: MetadataIndex, it: Item) -> dict:
    return {"fqn": idx.fqn, "offset": None if idx.offset is None else list(idx.offset), "index": idx.index,
            "file": it.file, "pos": it.offset, "length": it.length, "codec": it.codec, "size": it.size,
            **({"crc32": it.check} if type(it.check) is int else {"xxh3": it.check}),
            "dtype": it.dtype, "shape": None if it.shape is None else list(it.shape),
            "ref": None if it.ref is None else list(it.ref)}


def parse_metadata(doc, path: str):
    """``(Metadata, {key: (MetadataIndex, Item)})`` from the JSON document, every field checked."""
    def bad(msg):
        raise FormatError(f"{path}: malformed metadata: {msg}")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        bad("not an lmc-dcp metadata file")
    if doc.get("format_version") not in FORMAT_VERSIONS:
        bad(f"unsupported format_version {doc.get('format_version')!r}")
    for k in ("save_id", "state_dict_metadata", "items"):
        if k not in doc:
            bad(f"no {k!r}")
    if not isinstance(doc["save_id"], str) or len(doc["save_id"]) != 36:
        bad("save_id")
    sdm = {}
    if not isinstance(doc["state_dict_metadata"], dict):
        bad("state_dict_metadata")
    for fqn, m in doc["state_dict_metadata"].items():
        if not isinstance(m, dict) or m.get("type") not in ("bytes", "tensor"):
            bad(f"entry {fqn!r}")
        if m["type"] == "bytes":
            sdm[fqn] = BytesStorageMetadata()
            continue
        if m.get("dtype") not in TORCH_DTYPES or m.get("memory_format") not in _MEMORY_FORMATS:
            bad(f"dtype or memory format of {fqn!r}")
        chunks = m.get("chunks")
        if not isinstance(chunks, list) or not all(isinstance(c, list) and len(c) == 2 for c in chunks):
            bad(f"chunks of {fqn!r}")
        size = _ints(m.get("size"), f"size of {fqn!r}", path)
        cl = [ChunkStorageMetadata(torch.Size(_ints(o, "chunk offsets", path)), torch.Size(_ints(s, "chunk sizes",
                                                                                                    path)))
              for o, s in chunks]
        if any(len(c.offsets) != len(size) or len(c.sizes) != len(size) or
               any(o + s > n for o, s, n in zip(c.offsets, c.sizes, size)) for c in cl):
            bad(f"a chunk of {fqn!r} lies outside the tensor")
        props = TensorProperties(dtype=TORCH_DTYPES[m["dtype"]], requires_grad=bool(m.get("requires_grad")),
                                 memory_format=_MEMORY_FORMATS[m["memory_format"]],
                                 pin_memory=bool(m.get("pin_memory")))
        vol = sum(math.prod(c.sizes) for c in cl)
        if vol != math.prod(size) or len({(tuple(c.offsets), tuple(c.sizes)) for c in cl}) != len(cl):
            bad(f"the chunks of {fqn!r} do not cover the tensor exactly ({vol} of {math.prod(size)} elements)")
        sdm[fqn] = TensorStorageMetadata(props, torch.Size(size), cl)
    pd = doc.get("planner_data")
    if pd is not None:
        if not isinstance(pd, dict) or not all(
                isinstance(v, list) and all(isinstance(x, str) or type(x) is int for x in v) for v in pd.values()):
            bad("planner_data")
        pd = {k: tuple(v) for k, v in pd.items()}
    ref = doc.get("reference")
    if ref is not None and not (isinstance(ref, dict) and isinstance(ref.get("save_id"), str)
                                and isinstance(ref.get("path"), str)):
        bad("reference")
    items = {}
    if not isinstance(doc["items"], list):
        bad("items")
    for r in doc["items"]:
        if not isinstance(r, dict):
            bad("an item")
        fqn = r.get("fqn")
        off = r.get("offset")
        if not isinstance(fqn, str) or fqn not in sdm:
            bad(f"item {fqn!r} is not in state_dict_metadata")
        off = None if off is None else _ints(off, f"offset of {fqn!r}", path)
        if not isinstance(r.get("file"), str) or not _FILE_RE.match(r["file"]):
            bad(f"file name {r.get('file')!r} of {fqn!r}")
        if r.get("codec") not in _CODECS:
            bad(f"codec of {fqn!r}")
        for k in ("pos", "length", "size"):
            if type(r.get(k)) is not int or not 0 <= r[k] < 1 << 62:
                bad(f"{k} of {fqn!r}")
        if r["pos"] < _HEADER_LEN:
            bad(f"pos of {fqn!r}")
        # format 3 writes XXH3-128 ("xxh3"); items carried over from a format 1 or 2 save keep their "crc32"
        checks = [r[k] for k in (("crc32", "xxh3") if doc["format_version"] >= 3 else ("crc32",)) if k in r]
        if len(checks) != 1 or not _valid_check(checks[0]) or ("xxh3" in r) == (type(checks[0]) is int):
            bad(f"checksum of {fqn!r}")
        m = sdm[fqn]
        item_ref = r.get("ref")
        if item_ref is not None:
            if not (isinstance(item_ref, list) and len(item_ref) == 2 and isinstance(item_ref[0], str)
                    and _valid_check(item_ref[1]) and (doc["format_version"] >= 3 or type(item_ref[1]) is int)) \
                    or ref is None or item_ref[0] != ref["save_id"]:
                bad(f"reference of {fqn!r} (not the checkpoint's reference)")
            item_ref = tuple(item_ref)
        if isinstance(m, BytesStorageMetadata):
            if off is not None or r.get("dtype") is not None or r["codec"] == "lmc" or item_ref is not None:
                bad(f"bytes item {fqn!r}")
            dtype, shape = None, None
        else:
            dtype, shape = r.get("dtype"), _ints(r.get("shape"), f"shape of {fqn!r}", path)
            if dtype != str(m.properties.dtype).removeprefix("torch.") or off is None or not any(
                    tuple(c.offsets) == off and tuple(c.sizes) == shape for c in m.chunks):
                bad(f"item {fqn!r} at {off} is not a chunk of the tensor's metadata")
            tdt = TORCH_DTYPES[dtype]
            if r["size"] != math.prod(shape) * tdt.itemsize or (r["codec"] == "lmc" and tdt not in LMC_DTYPES):
                bad(f"size or codec of {fqn!r}")
        if item_ref is not None and r["codec"] != "lmc":
            bad(f"item {fqn!r} has a reference but is not lmc-coded")
        if r["codec"] == "raw" and r["length"] != r["size"]:
            bad(f"length of raw item {fqn!r}")
        index = r.get("index")
        idx = MetadataIndex(fqn, off, index if type(index) is int else None)
        if item_key(idx) in items:
            bad(f"item {fqn!r} at {off} appears twice")
        items[item_key(idx)] = (idx, Item(r["file"], r["pos"], r["length"], r["codec"], r["size"], checks[0],
                                       dtype, shape, item_ref))
    for fqn, m in sdm.items():  # every chunk the metadata declares is stored
        if isinstance(m, TensorStorageMetadata):
            for c in m.chunks:
                if (fqn, tuple(c.offsets)) not in items:
                    bad(f"chunk {tuple(c.offsets)} of {fqn!r} has no stored item")
        elif (fqn, None) not in items:
            bad(f"bytes item {fqn!r} is not stored")
    if "time" in doc and type(doc["time"]) is not int:
        bad("time")
    group = doc.get("group")
    if group is not None and (type(group) is not int or group < 1):
        bad("group")
    sm = StorageMeta(checkpoint_id=doc.get("checkpoint_id") if isinstance(doc.get("checkpoint_id"), str) else None,
                     save_id=doc["save_id"],
                     modules=[m for m in doc.get("modules") or [] if isinstance(m, str)])
    version = doc.get("dcp_version") if isinstance(doc.get("dcp_version"), str) else None
    md = Metadata(state_dict_metadata=sdm, planner_data=pd, storage_data={i: it for i, it in items.values()},
                  storage_meta=sm, version=version)
    return md, items


class CheckpointFolder:
    """A complete LMC DCP checkpoint folder (a path or an fsspec URL), validated: its items decode one at a time
    (through its reference checkpoint, opened on demand, for delta-coded items)."""

    def __init__(self, path, threads=None):
        path = os.fspath(path)
        self.path = str(path).rstrip("/") if is_url(path) else os.path.abspath(path)
        self.fs = backend(self.path, FormatError)
        self.threads = threads
        meta = self.where(METADATA_FILE)
        if not self.fs.is_dir():
            raise FileNotFoundError(f"{self.path}: no such checkpoint folder")
        try:
            data = self.fs.read(METADATA_FILE, _MAX_METADATA)
        except FormatError:
            raise FormatError(f"{meta}: metadata file too large, or unreadable") from None
        if data is None:
            raise FormatError(f"{self.path}: not a complete LMC DCP checkpoint (no {METADATA_FILE}; an "
                              "interrupted save, or a checkpoint written by another storage writer)")
        try:
            self.doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FormatError(f"{meta}: metadata is not JSON ({e})") from None
        self.metadata, self.items = parse_metadata(self.doc, meta)
        self.save_id = self.doc["save_id"]
        self._reference = None
        self._lock = threading.Lock()
        sizes = {}
        for _, it in self.items.values():
            if it.file not in sizes:
                sizes[it.file] = self._check_file(it.file)
            if it.offset + it.length > sizes[it.file]:
                raise FormatError(f"{self.where(it.file)}: truncated: an item ends at byte "
                                  f"{it.offset + it.length}, the file has {sizes[it.file]}")

    def where(self, name) -> str:
        """The path or URL of file ``name`` of this folder (for messages)."""
        return f"{self.path}/{name}" if self.fs.url else os.path.join(self.path, name)

    def _check_file(self, name) -> int:
        p = self.where(name)
        if not self.fs.isfile(name):
            raise FormatError(f"{p}: missing (named by {METADATA_FILE})")
        with self.fs.open_read(name) as f:
            head = f.read(_HEADER_LEN)
        size = self.fs.size(name)
        if head[:len(MAGIC)] != MAGIC:
            raise FormatError(f"{p}: not an LMC DCP data file")
        if head[len(MAGIC):].decode("ascii", "replace") != self.save_id:
            raise FormatError(f"{p}: written by another save than {METADATA_FILE} describes (a stale file)")
        return size

    def reference(self) -> "CheckpointFolder":
        with self._lock:  # opened once, whichever worker thread asks first
            return self._open_reference()

    def _open_reference(self) -> "CheckpointFolder":
        if self._reference is None:
            ref = self.doc["reference"]
            if ref is None:
                raise FormatError(f"{self.path}: an item is delta-coded but the checkpoint names no reference")
            tried = []
            for i, p in enumerate((join(self.path, ref["path"]), ref.get("abspath"))):
                if isinstance(p, str) and backend(p, FormatError).is_dir():
                    if i == 1:
                        import warnings
                        warnings.warn(f"lmc.dcp: {self.path}: its reference is not at {ref['path']!r} "
                                      f"relative to it; using the recorded absolute path {p}", stacklevel=3)
                    if canonical(p) == canonical(self.path):
                        raise FormatError(f"{self.path}: names itself as its reference")
                    ck = CheckpointFolder(p, self.threads)
                    if ck.save_id != ref["save_id"]:
                        raise FormatError(f"{self.path}: wrong reference checkpoint: {p} is save "
                                          f"{ck.save_id}, this checkpoint was coded against {ref['save_id']}")
                    self._reference = ck
                    break
                tried.append(p)
            else:
                raise FileNotFoundError(f"{self.path}: its reference checkpoint (save {ref['save_id']}) is "
                                        f"missing: tried {', '.join(map(str, tried))}")
        return self._reference

    def _read(self, it: Item, f=None) -> bytearray:
        buf = bytearray(it.length)
        if f is None:
            with self.fs.open_read(it.file) as f:
                f.seek(it.offset)
                n = f.readinto(buf)
        else:
            f.seek(it.offset)
            n = f.readinto(buf)
        if n != it.length:
            raise FormatError(f"{self.where(it.file)}: truncated (changed since it was opened)")
        return buf

    def decode(self, key, f=None, _seen=(), threads=None, out=None) -> bytearray | np.ndarray:
        """The decoded bytes of item ``key`` (a flat uint8 array for tensors), checked against its checksum.
        ``f``: the item's data file, open (else it is opened); ``threads``: lmc threads (None: the folder's);
        ``out``: a flat uint8 array of the item's size to decode into (a load's target tensor: no copy), which
        is returned. Safe to call from several threads at once (each with its own ``f``)."""
        threads = self.threads if threads is None else threads
        idx, it = self.items[key]
        if out is not None and (out.dtype != np.uint8 or out.shape != (it.size,)):
            raise ValueError(f"lmc.dcp: out must be a flat uint8 array of the item's {it.size} bytes")
        where = f"{self.where(it.file)}: item {idx.fqn!r}"
        blob = self._read(it, f)
        if it.codec == "raw":
            got = blob
        elif it.codec == "zlib":
            d = zlib.decompressobj()
            try:
                got = d.decompress(blob, it.size + 1)
            except zlib.error as e:
                raise FormatError(f"{where}: corrupt zlib stream ({e})") from None
            if len(got) != it.size or not d.eof:
                raise FormatError(f"{where}: zlib stream does not decode to {it.size} bytes")
        else:
            npdt = np.dtype(LMC_DTYPES[TORCH_DTYPES[it.dtype]])
            ref = None
            if it.ref is not None:
                if self.save_id in _seen:
                    raise FormatError(f"{self.path}: the chain of reference checkpoints loops")
                rc = self.reference()
                r = rc.items.get(key)
                if r is None or r[1].check != it.ref[1] or r[1].dtype != it.dtype or r[1].shape != it.shape:
                    raise FormatError(f"{where}: wrong reference: {rc.path} has no matching item "
                                      "(same name, chunk, dtype, shape and checksum)")
                ref = np.asarray(rc.decode(key, None, _seen + (self.save_id,), threads)).view(npdt)
            arr = np.empty(it.size // npdt.itemsize, npdt) if out is None else out.view(npdt)
            try:
                decompress(blob, reference=ref, out=arr, threads=threads)
            except FormatError as e:
                raise FormatError(f"{where}: {e}") from None
            except ValueError as e:  # the blob's header does not match the item (e.g. another dtype or size)
                raise FormatError(f"{where}: blob does not match its metadata ({e})") from None
            got = arr.view(np.uint8)
        if checksum(got, it.check) != it.check:
            raise FormatError(f"{where}: checksum mismatch (corrupt data)")
        if out is None:
            return got
        if it.codec != "lmc":  # (lmc blobs were decoded into out)
            out[:] = np.frombuffer(got, np.uint8)
        return out

    def tensor(self, key, f=None, threads=None) -> torch.Tensor:
        """Item ``key`` as a tensor of its chunk's shape."""
        _, it = self.items[key]
        u8 = np.frombuffer(self.decode(key, f, threads=threads), np.uint8)
        if not u8.flags.writeable:
            u8 = u8.copy()
        return torch.from_numpy(u8).view(TORCH_DTYPES[it.dtype]).reshape(it.shape)
