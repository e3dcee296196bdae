"""Write side: encode one checkpoint folder into a segment."""
import hashlib
import mmap
import os
import re
import zlib

import numpy as np

from .. import compress
from .._core import shaped
from . import _torchio
from ..formats import torchzip
from ..formats.dtypes import code_name
from ._formats import NP_DTYPES, ST_DTYPES, TORCH_NP, layout, parse_safetensors, safe_relpath
from ._store import ArchiveError
from ._view import CHUNK, same_identity, sha128

# torch zip files: torch.save (.pt/.pth/.bin: the Trainer's optimizer.pt and pytorch_model.bin, DeepSpeed's
# model and optimizer states) and DCP shards (.distcp: one zip per write item, end to end)
TORCH_EXTS = (".pt", ".pth", ".bin", ".distcp")
TORCH_MIN = 64 << 10  # smaller torch files are kept as bytes (byte-identical)
STORAGE_MIN = 256     # smaller storages (Adam's step counters) stay in the verbatim regions


_SCANS = {}  # (path, size, mtime_ns, inode) -> scan: a file read as a step and then as the reference


def _scan(f, size):
    try:
        st = os.fstat(f.fileno())
        key = (getattr(f, "name", None), size, st.st_mtime_ns, st.st_ino)
    except (OSError, AttributeError, ValueError):
        return torchzip.scan(f, size)
    if key not in _SCANS:
        if len(_SCANS) > 4096:
            _SCANS.clear()
        _SCANS[key] = torchzip.scan(f, size)
    return _SCANS[key]


def torchzip_regions(f, size):
    """The regions ("raw", a, b) / ("tensor", Storage) of a torch zip file in file order, and a note (why
    nothing was found), or (None, note)."""
    sc = _scan(f, size)
    if sc is None:
        return None, "not a torch zip file"
    big = [s for s in sc.storages if s.end - s.begin >= STORAGE_MIN]
    if not big:
        return None, "torch zip file without tensor storages lmc codes"
    regions, pos = [], 0
    for s in big:
        if s.begin > pos:
            regions.append(("raw", pos, s.begin))
        regions.append(("tensor", s))
        pos = s.end
    if size > pos:
        regions.append(("raw", pos, size))
    return regions, sc.note


_STEP_PART = re.compile(r"^(global_step|checkpoint-|step-|step|iter_)\d+$")


def canonical_path(rel):
    """rel with the step number of step-named folders blanked (global_step400/x.pt -> global_step*/x.pt), so a
    file can be matched with the same file of the previous step."""
    return "/".join(_STEP_PART.sub(r"\1*", c) for c in rel.split("/"))


def reference_paths(paths, prev_paths):
    """{path: the previous step's path its tensors refer to} for each path: itself where the previous step has
    it, else the one previous path with the same canonical path (DeepSpeed's global_step<N>/ inside a Trainer's
    checkpoint-<N>/), else None."""
    prev = set(prev_paths)
    by_canon = {}
    for p in prev_paths:
        by_canon.setdefault(canonical_path(p), []).append(p)
    out = {}
    for p in paths:
        if p in prev:
            out[p] = p
        else:
            c = by_canon.get(canonical_path(p), [])
            out[p] = c[0] if len(c) == 1 else None
    return out


def list_files(folder):
    """Relative paths ('/'-separated) of the regular files under folder, sorted.  Symbolic links are
    followed, to files and to folders (a step's tokenizer/ linked to a shared one is archived as
    its files); a dangling link or a link loop is an ArchiveError naming it."""
    if not os.path.isdir(folder):
        raise ArchiveError(f"{folder}: not a directory")
    out = []
    st = os.stat(folder)
    seen = {(st.st_dev, st.st_ino)}  # the real folders on the path being walked (a loop returns to one)
    onpath = {os.path.normpath(folder): seen.copy()}

    def walk_error(e):
        raise ArchiveError(f"{e.filename}: cannot list ({e.strerror or e})")

    for d, dirs, files in os.walk(folder, followlinks=True, onerror=walk_error):
        dirs.sort()
        above = onpath.pop(os.path.normpath(d), set())
        for name in list(dirs):
            full = os.path.join(d, name)
            try:
                sd = os.stat(full)
            except OSError:
                raise ArchiveError(f"{full}: a symbolic link that leads to no folder (dangling, or a loop)") from None
            key = (sd.st_dev, sd.st_ino)
            if key in above:
                raise ArchiveError(f"{full}: a symbolic link loop (it leads back to a folder it is in)")
            onpath[os.path.normpath(full)] = above | {key}
        for name in files:
            full = os.path.join(d, name)
            if not os.path.isfile(full):
                if os.path.islink(full):
                    raise ArchiveError(f"{full}: a symbolic link that leads to no file (dangling, or a loop)")
                continue
            rel = os.path.relpath(full, folder).replace(os.sep, "/")
            if not safe_relpath(rel):
                raise ArchiveError(f"{full}: unsupported file name")
            out.append(rel)
    return sorted(out)


def _mmap(path, size):
    # (a plain ndarray over the map: slicing a np.memmap costs a Python-level __array_finalize__ per slice)
    return np.asarray(np.memmap(path, np.uint8, mode="r")) if size else np.zeros(0, np.uint8)


def _release(mm, begin, end):
    """Drop the pages of the file map ``mm`` (from :func:`_mmap`) that lie wholly inside bytes [begin, end) from
    this process's resident set once they have been read; they stay in the page cache, and a later read of them
    faults them in again. A file coded region by region then holds about one region's pages, not the file's."""
    m = getattr(mm.base, "_mmap", None)
    if m is None or not hasattr(m, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    a, b = -(-begin // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if b > a:
        m.madvise(mmap.MADV_DONTNEED, a, b - a)


class RawSource:
    """Tensors of the previous step's raw checkpoint folder, used instead of
    decoding the archive when their checksum equals the archived one."""

    def __init__(self, folder):
        self.folder = folder
        self.path = None
        self.map = {}
        self.mm = None  # the file map the current file's tensors are views of (None: read into memory)

    def get(self, rel, kind, key, sha):
        if self.folder is None:
            return None
        if rel != self.path:
            self.path, self.map, self.mm = rel, {}, None
            try:
                self.map, self.mm = self._load(os.path.join(self.folder, *rel.split("/")), kind)
            except Exception:
                self.map = {}
        entry = self.map.get(key)
        if entry is None:
            return None
        begin, end, data = entry
        u8 = data if self.mm is None else self.mm[begin:end]
        if sha128(u8) != sha:
            self.release(key)
            return None
        return u8

    def release(self, key):
        """Drop tensor ``key``'s pages of the current file from the resident set once it has been used (a file
        read tensor by tensor holds about one tensor's pages, not the file's)."""
        u8 = self.map.get(key)
        if u8 is not None and self.mm is not None:
            _release(self.mm, u8[0], u8[1])

    @staticmethod
    def _load(path, kind):
        """({key: (begin, end, None)}, the file map), or ({key: (0, 0, bytes in memory)}, None)."""
        if kind == "torchzip":
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                regions, _ = torchzip_regions(f, size)
            return ({r[1].key: (r[1].begin, r[1].end, None) for r in regions or [] if r[0] == "tensor"},
                    _mmap(path, size))
        if kind == "safetensors":
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                parsed = parse_safetensors(f, size)
            if parsed is None:
                return {}, None
            return {t[0]: (t[3], t[4], None) for t in parsed[1] if t[1] in ST_DTYPES}, _mmap(path, size)
        obj = _torchio.load(path)
        if obj is None:
            return {}, None
        _, tensors = _torchio.flatten(obj)
        return {k: (0, 0, _torchio.tensor_u8(t)) for k, t in tensors}, None


class StepEncoder:
    """Encodes files into a SegmentWriter, coding each tensor against the same
    tensor of step `prev` (None: a keyframe, everything coded alone)."""

    def __init__(self, view, writer, prev, threads=None, reference_folder=None, on_tensor=None, prefer="speed"):
        self.view = view
        self.w = writer
        self.prev = prev
        self.threads = threads
        self.prefer = prefer  # lmc.compress's prefer
        self.raw = RawSource(reference_folder)
        self.ref_paths = {}
        self.on_tensor = on_tensor  # (rel, kind, key, entry, bytes) after each lmc-coded tensor

    def folder(self, folder):
        rels = list_files(folder)
        if self.prev is not None:
            self.ref_paths = reference_paths(rels, [fe["path"] for fe in self.view.index(self.prev)["files"]])
        files, nbytes = [], 0
        for rel in rels:
            fe = self.file(folder, rel)
            ref = self.ref_paths.get(rel)
            if ref is not None and ref != rel and any(t["ref"] for t in _tensors(fe)):
                fe["ref_path"] = ref
            nbytes += fe["size"]
            files.append(fe)
        return files, nbytes

    def file(self, folder, rel):
        path = os.path.join(folder, *rel.split("/"))
        size = os.path.getsize(path)
        why = "not a tensor file format lmc reads"
        if rel.endswith(".safetensors"):
            with open(path, "rb") as f:
                parsed = parse_safetensors(f, size)
            if parsed is not None:
                return self._regions(path, rel, size, "safetensors",
                                     layout(size, parsed[0], parsed[1]))
            why = "safetensors header not valid"
        elif rel.endswith(TORCH_EXTS):
            if size < TORCH_MIN:
                why = f"small file (< {TORCH_MIN >> 10} KiB)"
            else:
                with open(path, "rb") as f:
                    regions, why = torchzip_regions(f, size)
                if regions is not None:
                    return self._regions(path, rel, size, "torchzip", regions)
                if why == "not a torch zip file":  # torch's legacy (pre-1.6) format
                    fe = self._torch(path, rel, size)
                    if fe is not None:
                        return fe
                    why = "not a torch zip file, and torch.load(weights_only=True) refuses it"
        return self._bytes(path, rel, size, why)

    # -- plain bytes
    def put_bytes(self, data):
        """Chunks (zlib where smaller) of a bytes-like object."""
        mv = memoryview(data).cast("B")
        out = []
        for a in range(0, mv.nbytes, CHUNK):
            piece = mv[a:a + CHUNK]
            z = zlib.compress(piece, 6)
            if len(z) < piece.nbytes:
                out.append({"enc": "zlib", "n": piece.nbytes, "sec": self.w.add_section(z)})
            else:
                out.append({"enc": "raw", "n": piece.nbytes, "sec": self.w.add_section(piece)})
        return out

    def _bytes(self, path, rel, size, why):
        h = hashlib.sha256()
        chunks = []
        n = 0
        with open(path, "rb") as f:
            while True:
                piece = f.read(CHUNK)
                if not piece:
                    break
                h.update(piece)
                n += len(piece)
                chunks += self.put_bytes(piece)
        if n != size:
            raise ArchiveError(f"{path}: changed while being read")
        return {"path": rel, "kind": "bytes", "size": size, "sha256": h.hexdigest(),
                "chunks": chunks, "why": why}

    # -- tensors
    def put_tensor(self, rel, kind, key, dtype, shape, npname, u8):
        if self.on_tensor is not None and npname is not None:
            u8 = np.array(u8)  # one copy in memory: what is hashed, coded and handed on stays the same bytes
        t = {"key": key, "dtype": dtype, "shape": list(shape), "n": int(u8.nbytes),
             "np": npname, "enc": "lmc", "ref": False, "sec": None, "sha": sha128(u8)}
        if npname is None:
            z = zlib.compress(u8, 6)
            t["enc"] = "zlib" if len(z) < u8.nbytes else "raw"
            t["sec"] = self.w.add_section(z if t["enc"] == "zlib" else u8)
            return t
        dt = NP_DTYPES[npname]
        ref = None
        prel = self.ref_paths.get(rel)
        if self.prev is not None and prel is not None:
            pt = self.view.tensor(self.prev, prel, key)
            if pt is not None and self.view.file(self.prev, prel)["kind"] == kind \
                    and same_identity(pt, t):
                ref = self.raw.get(prel, kind, key, pt["sha"])
                if ref is not None:
                    ref = ref.view(dt)
                else:
                    ref = self.view.decode(self.prev, prel, pt)
        blob = compress(shaped(u8.view(dt), shape), reference=shaped(ref, shape), threads=self.threads,
                        prefer=self.prefer)
        del ref
        if prel is not None and self.raw.path == prel:
            self.raw.release(key)  # (its pages of the previous step's raw file, read once)
        t["ref"] = _has_ref(blob)  # (a codec may drop an unused reference)
        t["sec"] = self.w.add_section(blob)
        del blob
        if self.on_tensor is not None:
            self.on_tensor(rel, kind, key, t, u8)
        return t

    def _regions(self, path, rel, size, kind, regions):
        """A file made of verbatim regions and tensors (safetensors, torch zip files), restored byte-identical."""
        mm = _mmap(path, size)
        if mm.size != size:
            raise ArchiveError(f"{path}: changed while being read")
        h = hashlib.sha256()
        parts = []
        for reg in regions:
            if reg[0] == "raw":
                piece = mm[reg[1]:reg[2]]
                h.update(piece)
                parts.append({"t": "raw", "chunks": self.put_bytes(piece)})
                _release(mm, reg[1], reg[2])
                continue
            if kind == "safetensors":
                name, dt, shape, b, e = reg[1]
                npname = ST_DTYPES[dt][1]
            else:  # a torch storage: a flat array of its dtype
                st = reg[1]
                name, dt, shape, b, e = st.key, st.dtype.name, [st.numel], st.begin, st.end
                npname = code_name(st.dtype.code)
            u8 = mm[b:e]
            h.update(u8)
            t = self.put_tensor(rel, kind, name, dt, shape, npname, u8)
            parts.append({"t": "tensor", **t})
            _release(mm, b, e)
        del mm
        return {"path": rel, "kind": kind, "size": size, "sha256": h.hexdigest(), "parts": parts}

    def _torch(self, path, rel, size):
        obj = _torchio.load(path)
        if obj is None:
            return None
        try:
            skel, tensors = _torchio.flatten(obj)
        except _torchio.Unsupported:
            return None
        if not tensors:
            return None
        import json
        sk = self.put_bytes(json.dumps(skel, separators=(",", ":")).encode())
        entries = []
        for key, t in tensors:
            name = str(t.dtype).split(".")[-1]
            entries.append(self.put_tensor(rel, "torch", key, name, list(t.shape),
                                           TORCH_NP.get(name), _torchio.tensor_u8(t)))
        return {"path": rel, "kind": "torch", "size": size, "sha256": None,
                "skeleton": sk, "tensors": entries}


def _tensors(fe):
    if fe["kind"] == "torch":
        return fe["tensors"]
    return [p for p in fe.get("parts", []) if p["t"] == "tensor"]


def _has_ref(blob):
    from .. import info
    return bool(info(blob)["has_reference"])
