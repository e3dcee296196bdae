"""Re-coding an LMC DCP checkpoint folder in place, and retention: :class:`_Recoder`, with which
:class:`lmc.dcp.LMCStorageWriter` re-codes its reference checkpoint against the new save, and :func:`prune`,
which re-codes a kept checkpoint against the next kept one along its chain before deleting the others; plus the
small folder helpers the writer and reader share with them. A private module: its names are lmc.dcp's (``prune``
is re-exported there), not a public API."""
from __future__ import annotations

import json
import os
import threading

import numpy as np

from ..api import FormatError, check_prefer, compress, info, shaped
from ._folder import (
    FORMAT_VERSION, LMC_DTYPES, MAGIC, METADATA_FILE, SUFFIX, TORCH_DTYPES, CheckpointFolder, Item, is_lmc_checkpoint,
    item_json, next_generation,
)
from ..worker import Phases, scratch
from ._pool import _Window, _item_threads
from ..storage import TMP_PREFIX, backend, canonical, is_url, join, relpath


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


def _remove_unnamed(ck, named, temporary=False):
    """Remove the data files of checkpoint ``ck`` that its (new) metadata no longer names (and, with
    ``temporary``, an interrupted writer's temporary files)."""
    for name in ck.fs.listdir():
        if (name.endswith(SUFFIX) and name.startswith("__") and name not in named) \
                or (temporary and name.startswith(TMP_PREFIX)):
            ck.fs.remove(name)


class _Recoder:
    """Writes the previous checkpoint's items, re-coded against this save's, into a new data file of the
    previous checkpoint's folder (with its save id, so its metadata, replaced at the end, names it)."""

    def __init__(self, ref: CheckpointFolder, name: str, threads, sync, prefer="speed", phases=None):
        self.ref, self.name, self.threads, self.prefer = ref, name, threads, prefer
        self.ph = phases or Phases()  # the save's per-phase timers
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
        with self.ph.time("decode reference"):  # into this worker's buffer: it is only coded, then dropped
            arr = self.ref.decode(key, threads=threads, out=scratch("dcp-recode", old.size)).view(cur.dtype)
        with self.ph.time("code against"):
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
    wait(quiet=True)  # what a background save of this process left to re-code
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
    file of its folder, then replace its metadata atomically and remove the data files it no longer names.
    Items are coded on worker threads (as a save's), written in order by this thread."""
    _remove_unnamed(ck, {it.file for _, it in ck.items.values()}, temporary=True)  # an interrupted try's
    gen = next_generation(ck.items)
    rec = _Recoder(ck, f"__0_{gen}{SUFFIX}", threads, True, prefer)

    def one(key, old):  # on a worker thread: (blob, record) of one item
        t = target.items.get(key) if target is not None else None
        n = _item_threads(threads, old.size)
        if not (old.codec == "lmc" and t is not None and t[1].dtype == old.dtype and t[1].shape == old.shape
                and t[1].codec == "lmc"):
            return rec.carried(key, n)
        npdt = np.dtype(LMC_DTYPES[TORCH_DTYPES[old.dtype]])
        ref = target.decode(key, threads=n, out=scratch("dcp-recode-ref", old.size)).view(npdt)
        arr = ck.decode(key, threads=n, out=scratch("dcp-recode", old.size)).view(npdt)
        blob = compress(arr, reference=ref, threads=n, prefer=prefer)
        use = bool(info(blob)["has_reference"])
        return blob, dict(codec="lmc", size=old.size, check=old.check, dtype=old.dtype, shape=old.shape,
                          ref=(target.save_id, t[1].check) if use else None)

    new = {}
    pool = _Window(threads)
    try:
        for key, (_idx, old) in ck.items.items():
            for k, made in pool.submit(key, one, key, old):
                new[k] = rec.put(*made)
        for k, made in pool.drain():
            new[k] = rec.put(*made)
        rec.commit()
    except BaseException:
        rec.abort()
        raise
    finally:
        pool.close()
    doc = dict(ck.doc)
    doc["format_version"] = FORMAT_VERSION  # its items may now name an XXH3-128 reference checksum
    used = any(it.ref is not None for it in new.values())
    doc["reference"] = ({"save_id": target.save_id, "path": relpath(target.path, ck.path),
                         "abspath": target.path} if used else None)
    if target is not None:
        doc.pop("group", None)  # (a group is counted at its chain's end)
        doc["recoded_for"] = target.save_id  # done: what a save made with background=True left behind
    doc["items"] = [item_json(idx, new[k]) for k, (idx, _) in ck.items.items()]
    ck.fs.put(METADATA_FILE, json.dumps(doc, separators=(",", ":")).encode("utf-8"))
    _remove_unnamed(ck, {it.file for it in new.values()})


# ------------------------------------------------------------------- re-coding behind a save (background=True)
# A save made with background=True is complete, coded alone, when dcp.save returns; its reference is re-coded
# against it on one thread of this process (the coordinator's), reading both from their files. Until that is
# done the reference is complete too, coded alone: a kill loses nothing, it only leaves the older checkpoint
# larger. The new checkpoint's metadata says what was left behind ("behind"); the next save against it finds a
# re-coding that never finished (the older metadata lacks "recoded_for") and does it first.
_behind: dict = {}  # canonical path of the folder being re-coded -> (thread, [exception])
_behind_lock = threading.Lock()


def _before_fork():
    """os.fork() waits until every re-coding behind a save has finished: a child forked while that thread holds
    a lock (the allocator's, a file's, a pool's queue) would inherit it held, with no thread to release it, and
    could hang (a DataLoader's workers fork). After the wait no thread of lmc.dcp runs, so the child inherits no
    lock of ours. A fork from the re-coding thread itself does not wait for itself. Errors stay for wait()."""
    with _behind_lock:
        threads = [t for t, _err in _behind.values()]
    me = threading.current_thread()
    for t in threads:
        if t is not me:
            t.join()


_fork_hook = []  # [True] once _before_fork is registered (by the first re-coding behind a save)


def start_behind(ref_path, new_path, threads, prefer):
    """Re-code checkpoint ``ref_path`` against ``new_path`` on a (non-daemon) thread: the interpreter's exit,
    :func:`wait`, and every later save, load and prune of this process wait for it."""
    wait(quiet=True)  # one at a time: the next one may rewrite the folder this one reads

    def run():
        try:
            _recode_against(CheckpointFolder(ref_path, threads), CheckpointFolder(new_path, threads), threads,
                            prefer)
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            err.append(e)

    err: list = []
    t = threading.Thread(target=run, name="lmc-dcp-behind", daemon=False)
    with _behind_lock:
        _behind[canonical(ref_path)] = (t, err)
        if not _fork_hook and hasattr(os, "register_at_fork"):
            # registered at the first such save, not at import: "before" hooks run newest first, so ours runs
            # before those of the libraries a training script imported earlier (logging's, concurrent.futures'
            # take locks that this thread may need to finish)
            os.register_at_fork(before=_before_fork)
            _fork_hook.append(True)
    t.start()


def wait(quiet=False) -> None:
    """Wait until every checkpoint that a ``background=True`` save of this process left to re-code is re-coded.
    Raises the first error one met (the checkpoint it was re-coding is intact, coded alone); ``quiet``: warns
    instead."""
    with _behind_lock:
        jobs = list(_behind.items())
        _behind.clear()
    first = None
    for path, (t, err) in jobs:
        t.join()
        if err and first is None:
            first = (path, err[0])
    if first is not None:
        path, e = first
        msg = (f"lmc.dcp: the background re-coding of {path} failed ({type(e).__name__}: {e}); it stays "
               "complete, coded alone")
        if not quiet:
            raise RuntimeError(msg) from e
        import warnings

        warnings.warn(msg + "; going on", RuntimeWarning, stacklevel=3)


def finish_left_behind(ref: CheckpointFolder, threads, prefer):
    """If ``ref`` was saved with background=True and the re-coding of its own reference never finished (a
    kill), do it now (in this thread): its reference is complete, coded alone, and gets re-coded against it. A
    failure here is a warning: that checkpoint stays as it is, complete."""
    behind = ref.doc.get("behind")
    if not isinstance(behind, dict) or not isinstance(behind.get("save_id"), str):
        return
    path = behind.get("abspath") if isinstance(behind.get("abspath"), str) else None
    for p in filter(None, (join(ref.path, behind["path"]) if isinstance(behind.get("path"), str) else None, path)):
        if _metadata_field(p, "save_id") == behind["save_id"]:
            if _metadata_field(p, "recoded_for") != ref.save_id:
                try:
                    _recode_against(CheckpointFolder(p, threads), ref, threads, prefer)
                except Exception as e:  # noqa: BLE001 - that checkpoint is intact: this save goes on
                    import warnings

                    warnings.warn(f"lmc.dcp: could not finish re-coding {p} against {ref.path} ({type(e).__name__}: "
                                  f"{e}); it stays complete, coded alone", RuntimeWarning, stacklevel=2)
            return
