"""Re-coding an LMC DCP checkpoint folder in place, and retention: :class:`_Recoder`, with which
:class:`lmc.dcp.LMCStorageWriter` re-codes its reference checkpoint against the new save, and :func:`prune`,
which re-codes a kept checkpoint against the next kept one along its chain before deleting the others; plus the
small folder helpers the writer and reader share with them. A private module: its names are lmc.dcp's (``prune``
is re-exported there), not a public API."""
from __future__ import annotations

import json
import os

import numpy as np

from ._core import FormatError, check_prefer, compress, info, shaped
from ._dcp_folder import (
    FORMAT_VERSION, LMC_DTYPES, MAGIC, METADATA_FILE, SUFFIX, TORCH_DTYPES, CheckpointFolder, Item, is_lmc_checkpoint,
    item_json,
)
from ._storage import backend, canonical, is_url, join, relpath


def _location(path) -> str:
    """A checkpoint folder as given: a local path, or an fsspec URL kept as it is (never taken as a path)."""
    return str(path) if is_url(path) else os.fspath(path)


def _metadata_field(path, key):
    """Field ``key`` of the LMC metadata in folder ``path``, None if there is none or it cannot be read."""
    try:
        data = backend(path, FormatError).read(METADATA_FILE, 1 << 30)
        return None if data is None else json.loads(data.decode("utf-8")).get(key)
    except (OSError, FormatError, ValueError, UnicodeDecodeError, AttributeError):
        return None


def _remove_unnamed(ck, named):
    """Remove the data files of checkpoint ``ck`` that its (new) metadata no longer names."""
    for name in ck.fs.listdir():
        if name.endswith(SUFFIX) and name.startswith("__") and name not in named:
            ck.fs.remove(name)


class _Recoder:
    """Writes the previous checkpoint's items, re-coded against this save's, into a new data file of the
    previous checkpoint's folder (with its save id, so its metadata, replaced at the end, names it)."""

    def __init__(self, ref: CheckpointFolder, name: str, threads, sync, prefer="speed"):
        self.ref, self.name, self.threads, self.prefer = ref, name, threads, prefer
        self.f = ref.fs.open_write(name, sync=sync)
        head = MAGIC + ref.save_id.encode("ascii")
        self.f.write(head)
        self.pos = len(head)  # where the next blob goes

    def _put(self, blob, **rec):
        pos = self.pos
        self.f.write(blob)
        self.pos += len(blob)
        return Item(self.name, pos, len(blob), **rec)

    def put(self, blob, rec) -> Item:
        """Write a blob that :meth:`recoded` or :meth:`carried` made (in the thread that owns the file)."""
        return self._put(blob, **rec)

    def recoded(self, key, rec: dict, cur, save_id, threads=None):
        """(blob, record) of the reference's item `key` coded against this save's same item (`rec`: its record;
        `cur`: its bytes as the coding dtype, None for bytes items), or carried over (bytes items, other dtypes
        or shapes); None when the reference has no such item. Safe on a worker thread (nothing is written)."""
        r = self.ref.items.get(key)
        if r is None:
            return None
        _, old = r
        if cur is None or old.codec != "lmc" or old.dtype != rec.get("dtype") or old.shape != rec.get("shape"):
            return self.carried(key, threads)
        arr = np.asarray(self.ref.decode(key, threads=threads)).view(cur.dtype)
        blob = compress(arr, reference=cur, threads=self.threads if threads is None else threads,
                        prefer=self.prefer)
        del arr
        use = bool(info(blob)["has_reference"])
        return blob, dict(codec="lmc", size=old.size, check=old.check, dtype=old.dtype, shape=old.shape,
                          ref=(save_id, rec["check"]) if use else None)

    def carried(self, key, threads=None):
        """(blob, record) of the reference's item `key` as it is (decoded and coded alone where it had a
        reference itself). Safe on a worker thread."""
        _, old = self.ref.items[key]
        rec = dict(size=old.size, check=old.check, dtype=old.dtype, shape=old.shape)
        if old.ref is None:
            return bytes(self.ref._read(old)), dict(rec, codec=old.codec)
        arr = np.asarray(self.ref.decode(key, threads=threads)).view(np.dtype(LMC_DTYPES[TORCH_DTYPES[old.dtype]]))
        blob = compress(shaped(arr, old.shape), threads=self.threads if threads is None else threads,
                        prefer=self.prefer)
        return blob, dict(rec, codec="lmc")

    def recode(self, key, item: Item, cur, save_id) -> Item | None:
        """:meth:`recoded`, written."""
        made = self.recoded(key, dict(dtype=item.dtype, shape=item.shape, check=item.check), cur, save_id)
        return None if made is None else self.put(*made)

    def carry(self, key) -> Item:
        """:meth:`carried`, written."""
        return self.put(*self.carried(key))

    def commit(self):
        self.f.commit()

    def abort(self):
        self.f.abort()


# ------------------------------------------------------------------------------------------------ retention
def prune(parent, keep_last=None, *, keep_every=None, keep_within=None, step_regex=r"(\d+)$", threads=None,
          prefer="speed"):
    """Delete LMC DCP checkpoint folders under ``parent`` (``step-<N>/`` and the like: the step is the number
    ``step_regex`` finds in the name), keeping every folder that any policy keeps, and always the newest:
    ``keep_last`` K (the newest K), ``keep_every`` N (steps that are multiples of N, as Orbax's keep_period),
    ``keep_within`` seconds (checkpoints saved within that long before the newest one: the save time the
    metadata records, else its file's mtime). A kept checkpoint coded against one that goes is re-coded first,
    against the next kept checkpoint along its chain (else alone), into a new data file of its own folder with its
    metadata replaced atomically: no kept checkpoint is ever lost. Deleting only the oldest re-codes nothing (a
    plain ``rm -rf`` does the same). ``prefer``: ``lmc.compress``'s choice for those re-codings. Returns the
    deleted folders. One process; no save may run meanwhile."""
    import re

    if keep_last is None and keep_every is None and keep_within is None:
        raise ValueError("lmc.dcp.prune: give at least one of keep_last, keep_every, keep_within")
    check_prefer(prefer, "lmc.dcp.prune")
    rx = re.compile(step_regex)
    parent = _location(parent)
    found = []
    for name in backend(parent, FormatError).listdir():
        path = join(parent, name)
        m = rx.search(name)
        if m and is_lmc_checkpoint(path):
            found.append((int(m.group(1)), path))
    found.sort()
    if not found:
        return []
    keep = {found[-1][1]}
    if keep_last is not None:
        keep |= {p for _, p in found[-int(keep_last):]}
    if keep_every is not None:
        keep |= {p for s, p in found if s % int(keep_every) == 0}
    if keep_within is not None:
        times = {p: _saved_at(p) for _, p in found}
        newest = max(times.values())
        keep |= {p for p, t in times.items() if t >= newest - float(keep_within)}
    drop = [p for _, p in found if p not in keep]
    if not drop:
        return []
    gone = {canonical(p) for p in drop}
    for _, path in found:
        if path not in keep:
            continue
        ck = CheckpointFolder(path, threads)
        target, c = None, ck
        while c.doc.get("reference") is not None:  # the first kept checkpoint along its chain
            c = c.reference()
            if canonical(c.path) not in gone:
                target = c
                break
        if c is ck or (target is not None and canonical(ck.reference().path) == canonical(target.path)):
            continue  # coded alone, or against a kept checkpoint already
        _recode_against(ck, target, threads, prefer)
    for p in drop:
        backend(p, FormatError).rmtree()
    return drop


def _saved_at(path) -> float:
    """When a checkpoint was saved: its metadata's "time" (format 2), else the metadata file's mtime."""
    t = _metadata_field(path, "time")
    if type(t) is int:
        return float(t)
    return backend(path, FormatError).mtime(METADATA_FILE)


def _recode_against(ck: CheckpointFolder, target, threads, prefer="speed"):
    """Re-code every item of checkpoint ``ck`` against ``target``'s same item (None: alone), into one new data
    file of its folder, then replace its metadata atomically and remove the data files it no longer names."""
    gen = 1 + max(int(it.file[:-len(SUFFIX)].rsplit("_", 1)[1]) for _, it in ck.items.values())
    rec = _Recoder(ck, f"__0_{gen}{SUFFIX}", threads, True, prefer)
    new = {}
    try:
        for key, (_idx, old) in ck.items.items():
            t = target.items.get(key) if target is not None else None
            if old.codec == "lmc" and t is not None and t[1].dtype == old.dtype and t[1].shape == old.shape \
                    and t[1].codec == "lmc":
                npdt = np.dtype(LMC_DTYPES[TORCH_DTYPES[old.dtype]])
                ref = np.asarray(target.decode(key)).view(npdt)
                arr = np.asarray(ck.decode(key)).view(npdt)
                blob = compress(arr, reference=ref, threads=threads, prefer=prefer)
                use = bool(info(blob)["has_reference"])
                new[key] = rec._put(blob, codec="lmc", size=old.size, check=old.check, dtype=old.dtype,
                                    shape=old.shape, ref=(target.save_id, t[1].check) if use else None)
                del ref, arr
            else:
                new[key] = rec.carry(key)
        rec.commit()
    except BaseException:
        rec.abort()
        raise
    doc = dict(ck.doc)
    doc["format_version"] = FORMAT_VERSION  # its items may now name an XXH3-128 reference checksum
    used = any(it.ref is not None for it in new.values())
    doc["reference"] = ({"save_id": target.save_id, "path": relpath(target.path, ck.path),
                         "abspath": target.path} if used else None)
    doc["items"] = [item_json(idx, new[k]) for k, (idx, _) in ck.items.items()]
    ck.fs.put(METADATA_FILE, json.dumps(doc, separators=(",", ":")).encode("utf-8"))
    _remove_unnamed(ck, {it.file for it in new.values()})
