"""Write side: encode one checkpoint folder into a segment."""
import functools
import os
import re
import stat
import threading
import zlib

import numpy as np

from .. import compress
from ..api import shaped
from . import _torchio
from ..formats import torchzip
from ..formats.dtypes import code_name
from ._index import NP_DTYPES, ST_DTYPES, TORCH_NP, layout, parse_safetensors, safe_relpath
from ._integrity import matches, xxh
from ..worker import Phases
from ._pipeline import Ordered, piece_threads, read_exact, workers_for
from ._manifest import ArchiveError
from ._view import CHUNK

# torch zip files: torch.save (.pt/.pth/.bin: the Trainer's optimizer.pt and pytorch_model.bin, DeepSpeed's
# model and optimizer states) and DCP shards (.distcp: one zip per write item, end to end)
TORCH_EXTS = (".pt", ".pth", ".bin", ".distcp")
TORCH_MIN = 64 << 10  # smaller torch files are kept as bytes (byte-identical)
STORAGE_MIN = 256     # smaller storages (Adam's step counters) stay in the verbatim regions


_SCANS = {}  # (path, size, mtime_ns, inode) -> scan: a file read as a step and then as the reference
_SCANS_LOCK = threading.Lock()


def _scan(f, size):
    try:
        st = os.fstat(f.fileno())
        key = (getattr(f, "name", None), size, st.st_mtime_ns, st.st_ino)
    except (OSError, AttributeError, ValueError):
        return torchzip.scan(f, size)
    with _SCANS_LOCK:
        got = _SCANS.get(key)
    if got is None:
        got = torchzip.scan(f, size)
        with _SCANS_LOCK:
            if len(_SCANS) > 4096:
                _SCANS.clear()
            _SCANS[key] = got
    return got


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


class RawSource:
    """Tensors of the previous step's raw checkpoint folder, used instead of decoding the archive when their
    checksum equals the archived one. Safe to call from several threads: each file's tensor map is made once,
    and each tensor is read with pread into its own buffer."""

    def __init__(self, folder, slot="ref"):
        self.folder = folder
        self.slot = slot  # the thread's scratch slot a tensor is read into (valid until its next get)
        self._maps = {}
        self._lock = threading.Lock()

    def get(self, rel, kind, key, entry):
        """The tensor's bytes (uint8) when they hash to ``entry``'s checksum, else None."""
        if self.folder is None:
            return None
        with self._lock:
            if rel not in self._maps:
                try:
                    self._maps[rel] = self._load(os.path.join(self.folder, *rel.split("/")), kind)
                except Exception:
                    self._maps[rel] = {}
            m = self._maps[rel]
        got = m.get(key)
        if got is None:
            return None
        path, begin, end, data = got
        if data is None:
            try:
                with open(path, "rb") as f:
                    data = read_exact(f.fileno(), begin, end, path, self.slot)
            except (OSError, ArchiveError):
                return None
        return data if matches(entry, data) else None

    @staticmethod
    def _load(path, kind):
        """{key: (path, begin, end, None)} of a file's tensors, or {key: (path, 0, 0, bytes in memory)}."""
        if kind in ("torchzip", "safetensors"):
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                if kind == "torchzip":
                    regions, _ = torchzip_regions(f, size)
                    return {r[1].key: (path, r[1].begin, r[1].end, None) for r in regions or [] if r[0] == "tensor"}
                parsed = parse_safetensors(f, size)
            if parsed is None:
                return {}
            return {t[0]: (path, t[3], t[4], None) for t in parsed[1] if t[1] in ST_DTYPES}
        obj = _torchio.load(path)
        if obj is None:
            return {}
        _, tensors = _torchio.flatten(obj)
        return {k: (path, 0, 0, _torchio.tensor_u8(t)) for k, t in tensors}


class StepEncoder:
    """Encodes a checkpoint folder into a SegmentWriter (archive version 3), every tensor alone (the new step
    is a keyframe), pieces spread over a pool of threads (_pipeline.Ordered): each tensor is read, hashed and
    coded in a worker, and, with a ``recoder``, the previous step's same tensor is coded against it there too;
    the calling thread writes the results in file order. ``phases``: a _pipeline.Phases the workers add their
    seconds to."""

    def __init__(self, writer, threads=None, prefer="speed", recoder=None, phases=None):
        self.w = writer
        self.threads = threads
        self.workers = workers_for(threads)
        self.prefer = prefer  # lmc.compress's prefer
        self.rec = recoder
        self.ph = phases or Phases()
        self.pool = None

    def folder(self, folder, rels=None):
        """(file entries, bytes in) of a step folder; ``rels``: its files as list_files gave them (listed once)."""
        rels = list_files(folder) if rels is None else rels
        files, nbytes = [], 0
        with Ordered(self.workers) as self.pool:
            for rel in rels:
                fe = self.file(folder, rel)
                nbytes += fe["size"]
                files.append(fe)
        self.pool = None
        return files, nbytes

    def file(self, folder, rel):
        path = os.path.join(folder, *rel.split("/"))
        try:
            st = os.stat(path)
        except OSError as e:
            raise ArchiveError(f"{path}: cannot read ({e.strerror or e})") from None
        size = st.st_size
        meta = {"mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime_ns}
        why = "not a tensor file format lmc reads"
        if rel.endswith(".safetensors"):
            with open(path, "rb") as f:
                parsed = parse_safetensors(f, size)
            if parsed is not None:
                return self._regions(path, rel, st, meta, "safetensors", layout(size, parsed[0], parsed[1]))
            why = "safetensors header not valid"
        elif rel.endswith(TORCH_EXTS):
            if size < TORCH_MIN:
                why = f"small file (< {TORCH_MIN >> 10} KiB)"
            else:
                with open(path, "rb") as f:
                    regions, why = torchzip_regions(f, size)
                if regions is not None:
                    return self._regions(path, rel, st, meta, "torchzip", regions)
                if why == "not a torch zip file":  # torch's legacy (pre-1.6) format
                    fe = self._torch(path, rel, size, meta)
                    if fe is not None:
                        return fe
                    why = "not a torch zip file, and torch.load(weights_only=True) refuses it"
        return {"path": rel, "kind": "bytes", "size": size, **meta,
                "chunks": self._raw(path, st, 0, size), "why": why}

    # -- plain bytes
    def _raw(self, path, st, a, b):
        """Chunk entries of bytes [a, b) of a file, each chunk read, hashed and zlib-coded in a worker."""
        out = []
        for c in range(a, b, CHUNK):
            e = min(b, c + CHUNK)
            ch = {"enc": None, "n": e - c, "sec": None, "xxh": None}
            out.append(ch)
            self.pool.submit(functools.partial(self._chunk_job, path, st, c, e), functools.partial(self._put_chunk, ch),
                             cost=e - c)
        return out

    def put_bytes(self, data):
        """Chunk entries of a bytes-like object in memory, coded in place (the legacy torch skeleton)."""
        mv = memoryview(data).cast("B")
        out = []
        for a in range(0, mv.nbytes, CHUNK):
            ch = {"enc": None, "n": min(CHUNK, mv.nbytes - a), "sec": None, "xxh": None}
            self._put_chunk(ch, self._code_chunk(np.frombuffer(mv[a:a + CHUNK], np.uint8)))
            out.append(ch)
        return out

    def _chunk_job(self, path, st, a, b):
        return self._code_chunk(self._read(path, st, a, b))

    def _code_chunk(self, u8):
        with self.ph.time("hash"):
            h = xxh(u8)
        with self.ph.time("zlib"):
            z = zlib.compress(u8, 6)
        return (h, "zlib", z) if len(z) < u8.nbytes else (h, "raw", u8.tobytes())  # (u8 may be scratch)

    def _put_chunk(self, ch, res):
        ch["xxh"], ch["enc"], data = res
        with self.ph.time("write"):
            ch["sec"] = self.w.add_section(data)

    def _read(self, path, st, a, b):
        with self.ph.time("read"):
            with open(path, "rb") as f:
                now = os.fstat(f.fileno())
                if (now.st_ino, now.st_size, now.st_mtime_ns) != (st.st_ino, st.st_size, st.st_mtime_ns):
                    raise ArchiveError(f"{path}: changed while being read")
                return read_exact(f.fileno(), a, b, path, "read")

    # -- tensors
    def put_tensor(self, rel, kind, key, dtype, shape, npname, load, part=False, nbytes=0):
        """A tensor entry (a file part: with "t"), filled in when its job is done; ``load()`` gives its bytes
        (uint8) in the worker."""
        t = {"t": "tensor"} if part else {}
        t.update({"key": key, "dtype": dtype, "shape": list(shape), "n": None, "np": npname, "enc": "lmc",
             "ref": False, "sec": None, "xxh": None})
        self.pool.submit(functools.partial(self._tensor_job, rel, kind, t, load),
                         functools.partial(self._put_tensor, t), cost=nbytes)
        return t

    def _tensor_job(self, rel, kind, t, load):
        u8 = load()
        with self.ph.time("hash"):
            h = xxh(u8)
        if t["np"] is None:
            with self.ph.time("zlib"):
                z = zlib.compress(u8, 6)
            return u8.nbytes, h, ("zlib", z) if len(z) < u8.nbytes else ("raw", u8.tobytes()), None
        dt = NP_DTYPES[t["np"]]
        threads = piece_threads(self.workers, self.threads, u8.nbytes)
        with self.ph.time("code"):
            blob = compress(shaped(u8.view(dt), t["shape"]), threads=threads, prefer=self.prefer)
        rec = None
        if self.rec is not None:
            rec = self.rec.code(rel, kind, dict(t, n=u8.nbytes), u8, threads, self.ph)
        return u8.nbytes, h, ("lmc", blob), rec

    def _put_tensor(self, t, res):
        n, h, (enc, data), rec = res
        t["n"], t["xxh"], t["enc"] = n, h, enc
        with self.ph.time("write"):
            t["sec"] = self.w.add_section(data)
            if rec is not None:
                self.rec.put(rec)

    def _regions(self, path, rel, st, meta, kind, regions):
        """A file made of verbatim regions and tensors (safetensors, torch zip files), restored byte-identical."""
        parts = []
        for reg in regions:
            if reg[0] == "raw":
                parts.append({"t": "raw", "chunks": self._raw(path, st, reg[1], reg[2])})
                continue
            if kind == "safetensors":
                name, dt, shape, b, e = reg[1]
                npname = ST_DTYPES[dt][1]
            else:  # a torch storage: a flat array of its dtype
                s = reg[1]
                name, dt, shape, b, e = s.key, s.dtype.name, [s.numel], s.begin, s.end
                npname = code_name(s.dtype.code)
            parts.append(self.put_tensor(rel, kind, name, dt, shape, npname,
                                         functools.partial(self._read, path, st, b, e), part=True, nbytes=e - b))
        return {"path": rel, "kind": kind, "size": st.st_size, **meta, "parts": parts}

    def _torch(self, path, rel, size, meta):
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
            u8 = _torchio.tensor_u8(t)
            entries.append(self.put_tensor(rel, "torch", key, name, list(t.shape), TORCH_NP.get(name),
                                           functools.partial(np.asarray, u8), nbytes=u8.nbytes))
        return {"path": rel, "kind": "torch", "size": size, **meta, "skeleton": sk, "tensors": entries}


def _tensors(fe):
    if fe["kind"] == "torch":
        return fe["tensors"]
    return [p for p in fe.get("parts", []) if p["t"] == "tensor"]


def _has_ref(blob):
    from .. import info
    return bool(info(blob)["has_reference"])
