"""Write side: encode one checkpoint folder into a segment."""
import hashlib
import os
import zlib

import numpy as np

from .. import compress
from . import _torchio
from ._formats import NP_DTYPES, ST_DTYPES, TORCH_NP, layout, parse_safetensors, safe_relpath
from ._store import ArchiveError
from ._view import CHUNK, same_identity, sha128

TORCH_EXTS = (".pt", ".pth", ".bin")
TORCH_MIN = 64 << 10  # smaller torch files are kept as bytes (byte-identical)


def list_files(folder):
    """Relative paths ('/'-separated) of the regular files under folder, sorted."""
    if not os.path.isdir(folder):
        raise ArchiveError(f"{folder}: not a directory")
    out = []
    for d, dirs, files in os.walk(folder):
        dirs.sort()
        for name in files:
            full = os.path.join(d, name)
            if not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, folder).replace(os.sep, "/")
            if not safe_relpath(rel):
                raise ArchiveError(f"{full}: unsupported file name")
            out.append(rel)
    return sorted(out)


def _mmap(path, size):
    return np.memmap(path, np.uint8, mode="r") if size else np.zeros(0, np.uint8)


class RawSource:
    """Tensors of the previous step's raw checkpoint folder, used instead of
    decoding the archive when their checksum equals the archived one."""

    def __init__(self, folder):
        self.folder = folder
        self.path = None
        self.map = {}

    def get(self, rel, kind, key, sha):
        if self.folder is None:
            return None
        if rel != self.path:
            self.path, self.map = rel, {}
            try:
                self.map = self._load(os.path.join(self.folder, *rel.split("/")), kind)
            except Exception:
                self.map = {}
        u8 = self.map.get(key)
        if u8 is None or sha128(u8) != sha:
            return None
        return u8

    @staticmethod
    def _load(path, kind):
        if kind == "safetensors":
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                parsed = parse_safetensors(f, size)
            if parsed is None:
                return {}
            mm = _mmap(path, size)
            return {t[0]: mm[t[3]:t[4]] for t in parsed[1] if t[1] in ST_DTYPES}
        obj = _torchio.load(path)
        if obj is None:
            return {}
        _, tensors = _torchio.flatten(obj)
        return {k: _torchio.tensor_u8(t) for k, t in tensors}


class StepEncoder:
    """Encodes files into a SegmentWriter, coding each tensor against the same
    tensor of step `prev` (None: a keyframe, everything coded alone)."""

    def __init__(self, view, writer, prev, threads=None, reference_folder=None):
        self.view = view
        self.w = writer
        self.prev = prev
        self.threads = threads
        self.raw = RawSource(reference_folder)

    def folder(self, folder):
        files, nbytes = [], 0
        for rel in list_files(folder):
            fe = self.file(folder, rel)
            nbytes += fe["size"]
            files.append(fe)
        return files, nbytes

    def file(self, folder, rel):
        path = os.path.join(folder, *rel.split("/"))
        size = os.path.getsize(path)
        if rel.endswith(".safetensors"):
            with open(path, "rb") as f:
                parsed = parse_safetensors(f, size)
            if parsed is not None:
                return self._safetensors(path, rel, size, parsed)
        if rel.endswith(TORCH_EXTS) and size >= TORCH_MIN:
            fe = self._torch(path, rel, size)
            if fe is not None:
                return fe
        return self._bytes(path, rel, size)

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

    def _bytes(self, path, rel, size):
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
                "chunks": chunks}

    # -- tensors
    def put_tensor(self, rel, kind, key, dtype, shape, npname, u8):
        t = {"key": key, "dtype": dtype, "shape": list(shape), "n": int(u8.nbytes),
             "np": npname, "enc": "lmc", "ref": False, "sec": None, "sha": sha128(u8)}
        if npname is None:
            z = zlib.compress(u8, 6)
            t["enc"] = "zlib" if len(z) < u8.nbytes else "raw"
            t["sec"] = self.w.add_section(z if t["enc"] == "zlib" else u8)
            return t
        dt = NP_DTYPES[npname]
        ref = None
        if self.prev is not None:
            pt = self.view.tensor(self.prev, rel, key)
            if pt is not None and self.view.file(self.prev, rel)["kind"] == kind \
                    and same_identity(pt, t):
                ref = self.raw.get(rel, kind, key, pt["sha"])
                if ref is not None:
                    ref = ref.view(dt)
                else:
                    ref = self.view.decode(self.prev, rel, pt)
        blob = compress(u8.view(dt), reference=ref, threads=self.threads)
        del ref
        t["ref"] = _has_ref(blob)  # (a codec may drop an unused reference)
        t["sec"] = self.w.add_section(blob)
        return t

    def _safetensors(self, path, rel, size, parsed):
        header_len, tensors = parsed
        mm = _mmap(path, size)
        if mm.size != size:
            raise ArchiveError(f"{path}: changed while being read")
        h = hashlib.sha256()
        parts = []
        for reg in layout(size, header_len, tensors):
            if reg[0] == "raw":
                piece = mm[reg[1]:reg[2]]
                h.update(piece)
                parts.append({"t": "raw", "chunks": self.put_bytes(piece)})
            else:
                name, dt, shape, b, e = reg[1]
                u8 = mm[b:e]
                h.update(u8)
                t = self.put_tensor(rel, "safetensors", name, dt, shape, ST_DTYPES[dt][1], u8)
                parts.append({"t": "tensor", **t})
        del mm
        return {"path": rel, "kind": "safetensors", "size": size, "sha256": h.hexdigest(),
                "parts": parts}

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


def _has_ref(blob):
    from .. import info
    return bool(info(blob)["has_reference"])
