"""Read side of an archive: open segments, look tensors up, decode a
tensor through its reference chain holding at most two decoded tensors."""
import functools
import threading
import zlib

import numpy as np

from .. import FormatError, decompress, info as blob_info
from ._index import NP_DTYPES, check_index, file_tensors
from ._integrity import sha128, xxh  # noqa: F401  (sha128 re-exported)
from ..worker import scratch
from ._manifest import ArchiveError
from ._segments import SegmentReader

CHUNK = 4 << 20  # bytes per zlib chunk of plain data


def inflate(data, n, what):
    """zlib-decompress at most n bytes (a bomb cannot allocate more)."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, n)
        extra = d.unconsumed_tail or (not d.eof)
    except zlib.error as e:
        raise ArchiveError(f"{what}: {e}") from None
    if extra or len(out) != n or d.unused_data:
        raise ArchiveError(f"{what}: decompressed size mismatch")
    return out


def same_identity(a, b):
    return (a["dtype"] == b["dtype"] and a["shape"] == b["shape"] and a["np"] == b["np"]
            and a["n"] == b["n"] and a["enc"] == b["enc"] == "lmc")


class View:
    """A snapshot of the archive (one manifest) opened for reading."""

    def __init__(self, root, manifest, threads=None):
        self.root = root
        self.manifest = manifest
        self.threads = threads
        self.entries = {e["step"]: e for e in manifest["steps"]}
        self._readers = {}
        self._files = {}
        self._tensors = {}
        self._lock = threading.RLock()  # threads of the archive's pool share one view

    def close(self):
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reader(self, step):
        r = self._readers.get(step)
        if r is not None:
            return r
        with self._lock:
            return self._open(step)

    def _open(self, step):
        r = self._readers.get(step)
        if r is None:
            if step not in self.entries:
                raise ArchiveError(f"step {step} is not in the archive")
            r = SegmentReader(self.root, self.entries[step])
            try:
                check_index(r.index, step)
                e = self.entries[step]
                # (a step whose prev was pruned keeps it in its index; what must agree is the dependency)
                if (e["depends_on"] is not None and r.index["prev"] != e["depends_on"]) \
                        or r.index["keyframe"] != e["keyframe"]:
                    raise ArchiveError(f"step {step}: index disagrees with the manifest")
                if e["depends_on"] is None and any(t["ref"] for fe in r.index["files"]
                                                   for t in file_tensors(fe)):
                    raise ArchiveError(f"step {step}: index disagrees with the manifest")
            except BaseException:
                r.close()
                raise
            self._files[step] = {fe["path"]: fe for fe in r.index["files"]}
            self._readers[step] = r  # (published last: a thread that finds it finds its files too)
        return r

    def index(self, step):
        return self.reader(step).index

    def file(self, step, path):
        self.reader(step)
        return self._files[step].get(path)

    def tensor(self, step, path, key):
        """The tensor entry of (path, key) at a step, or None."""
        fe = self.file(step, path)
        if fe is None:
            return None
        k = (step, path)
        d = self._tensors.get(k)
        if d is None:
            with self._lock:
                d = self._tensors[k] = {t["key"]: t for t in file_tensors(fe)}
        return d.get(key)

    def chunks(self, step, chunks, what):
        """Yield the plain bytes of a list of chunk entries."""
        for c in chunks:
            yield self.chunk(step, c, what)

    def chunk(self, step, c, what):
        """The plain bytes of one chunk entry, checked against its xxh3-128 where it has one (version 3)."""
        data = self.reader(step).read(c["sec"], what)
        data = inflate(data, c["n"], f"step {step}: {what}") if c["enc"] == "zlib" else data
        if "xxh" in c and xxh(data) != c["xxh"]:
            raise ArchiveError(f"step {step}: {what}: bytes do not match the recorded checksum (damaged data)")
        return data

    def decode_one(self, step, path, t, ref=None, out=None, threads=None):
        """Decode one tensor entry (flat array of its coding dtype, or uint8); ``threads``: lmc's, for this
        tensor (None: the view's)."""
        what = f"{path}: tensor {t['key']}"
        # (an lmc blob is read into this thread's buffer: it is decoded before the next read)
        data = self.reader(step).read(t["sec"], what, into=functools.partial(scratch, "blob")
                                      if t["enc"] == "lmc" else None)
        if t["enc"] == "zlib":
            arr = np.frombuffer(inflate(data, t["n"], f"step {step}: {what}"), np.uint8)
        elif t["enc"] == "raw":
            arr = np.frombuffer(data, np.uint8)
        else:
            dt = NP_DTYPES[t["np"]]
            try:
                info = blob_info(data)
                # (lmc 0.2 archives hold flat blobs, 0.3 ones the tensor's shape: its rows)
                if info["dtype"] != dt or info["shape"] not in ((t["n"] // dt.itemsize,), tuple(t["shape"])):
                    raise ArchiveError(f"step {step}: {what}: blob dtype/shape differ from index")
                if info["has_reference"] != t["ref"]:
                    raise ArchiveError(f"step {step}: {what}: reference flag differs from index")
                ref = ref.reshape(info["shape"]) if ref is not None and t["ref"] else None
                res = decompress(data, reference=ref, threads=self.threads if threads is None else threads,
                                 out=out)
                return out if out is not None else res.reshape(-1)
            except FormatError as e:
                raise ArchiveError(f"step {step}: {what}: {e}") from None
        if out is not None:
            out.reshape(-1).view(np.uint8)[:] = arr
            return out
        return arr

    def ref_path(self, step, path):
        """The path, in the step its tensors depend on, of the file `path` of `step`."""
        fe = self.file(step, path)
        return fe.get("ref_path", path) if fe is not None else path

    def ref_chain(self, step, path, t):
        """[(step, path, entry), ...] from the oldest (a non-referencing entry) to t."""
        chain = [(step, path, t)]
        s = step
        while t["ref"]:
            p = self.entries[s]["depends_on"]
            ppath = self.ref_path(s, path)
            pt = self.tensor(p, ppath, t["key"]) if p is not None else None
            if pt is None or not same_identity(pt, t) or self.file(p, ppath)["kind"] != \
                    self.file(s, path)["kind"]:
                raise ArchiveError(f"step {s}: {path}: tensor {t['key']}: "
                                   f"its reference is missing from step {p}")
            s, path, t = p, ppath, pt
            chain.append((s, path, t))
        chain.reverse()
        return chain

    def decode(self, step, path, t, out=None, threads=None):
        """Decode a tensor of a step, walking its reference chain one tensor at
        a time (at most the reference and the current tensor are held)."""
        arr = None
        chain = self.ref_chain(step, path, t)
        for i, (s, p, te) in enumerate(chain):
            last = i == len(chain) - 1
            arr = self.decode_one(s, p, te, ref=arr, out=out if last else None, threads=threads)
        return arr
