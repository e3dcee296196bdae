"""lmc.archive.Archive: a folder holding a series of checkpoints, each
tensor coded with lmc against the same tensor of the previous step."""
import copy
import functools
import hashlib
import os
import secrets
import shutil
import threading
import time

import numpy as np

from .. import compress, info as blob_info
from ..chains import DEFAULT_KEYFRAME_EVERY
from ..api import check_prefer, shaped
from . import _torchio
from ._add import StepEncoder, list_files, reference_paths
from ._index import NP_DTYPES, all_sections, check_index, file_tensors
from ..formats.trainer_folder import STEP_FOLDER_RE as STEP_RE
from ..formats.trainer_folder import step_of
from ..storage import is_url
from ._manifest import (SEG_RE, VERSION, ArchiveError, Lock, cleanup, load_json, new_manifest, read_manifest, store,
                        write_manifest)
from ._segments import SegmentReader, SegmentWriter, check_step_number, probe_segment
from ._integrity import matches
from ..worker import Phases, scratch
from ._pipeline import Ordered, piece_threads, workers_for
from ._view import View, same_identity
from ._graph import _may_recode, _set_depths
from ._recoder import _NextRecoder
from ._behind import _RecodeBehind
from ._verify import VerifyResult, _Verifier  # noqa: F401  (VerifyResult re-exported)
from ._repair import keep_manifest, manifest_disagreements, rebuilt_keyframe_every
from ._steps import _folder_name, _folder_time, opaque_bytes, restore_bytes
from ._steps import step_folders  # noqa: F401  (re-exported: lmc.archive, _cli)


class Archive(_Verifier, _RecodeBehind):
    """An lmc checkpoint archive at `path` (a directory; created by the first add).

    keyframe_every: every K-th step is coded alone, so restoring a step decodes
    at most K versions of each tensor (stored in the archive; a value given
    here replaces the stored one for later steps).  threads: lmc threads.  prefer: "speed" (default),
    "size" or "fast", lmc.compress's choice for the tensors this object codes (steps added, and those re-coded)."""

    def __init__(self, path, *, keyframe_every=None, threads=None, prefer="speed"):
        self.path = str(path) if is_url(path) else os.fspath(path)
        if keyframe_every is not None and int(keyframe_every) < 1:
            raise ValueError("keyframe_every must be >= 1")
        self.keyframe_every = keyframe_every
        self.threads = threads
        check_prefer(prefer, "lmc.archive")
        self.prefer = prefer

    # -- reading
    def _manifest(self):
        m = read_manifest(self.path)
        if m is None:
            if store(self.path).is_dir():
                raise ArchiveError(f"{self.path}: not an lmc archive (no manifest)")
            raise ArchiveError(f"{self.path}: no such archive")
        return m

    def stored_keyframe_every(self):
        """The keyframe_every the archive stores (None: no archive yet)."""
        m = read_manifest(self.path)
        return None if m is None else m["keyframe_every"]

    def exists(self):
        return read_manifest(self.path) is not None

    def steps(self):
        """Steps in the archive, ascending."""
        m = read_manifest(self.path)
        return [e["step"] for e in m["steps"]] if m else []

    def entries(self):
        """Per step: step, name (its folder's name), segment, size (bytes stored), bytes_in,
        opaque (bytes that went in as plain bytes; None for steps added by lmc 0.2),
        keyframe, depends_on, depth (reference chain length - 1)."""
        return [{"name": f"checkpoint-{e['step']}", "opaque": None, **e}
                for e in self._manifest()["steps"]]

    def opaque(self, step):
        """[(path, nbytes, reason)] of what a step stored as plain bytes, largest first."""
        out = []
        with self._view() as view:
            for fe in view.index(int(step))["files"]:
                n = opaque_bytes([fe])
                if not n:
                    continue
                if fe["kind"] == "bytes":
                    why = fe.get("why", "not a tensor file format lmc reads")
                elif fe["kind"] == "safetensors":
                    why = "header and padding (verbatim)"
                elif fe["kind"] == "torchzip":
                    why = "zip directory, pickle and small storages (verbatim)"
                else:
                    why = "skeleton"
                out.append((fe["path"], n, why))
        return sorted(out, key=lambda r: (-r[1], r[0]))

    def _view(self, m=None):
        return View(self.path, m or self._manifest(), self.threads)

    # -- add
    def add(self, folder, step=None, *, reference_folder="auto", background=False):
        """Append a checkpoint folder as `step` (default: from its name
        checkpoint-<step>).  Atomic: on any error the archive is unchanged.
        reference_folder: the previous step's raw folder, whose tensors are used
        as references where their checksum matches the archived ones ("auto":
        the sibling checkpoint-<prev> folder, if any; None: always decode).
        background: return once the new step is coded alone and committed (complete and durable); the
        archive's previous last step is re-coded against it by a thread of this process (wait() joins it;
        the next add, or the interpreter's exit, waits for it too). Until that re-code commits, the previous
        step stays coded alone, marked in the manifest ("recode"); a kill leaves it so, and the next add
        re-codes it first. Every moment leaves a loadable archive."""
        try:
            self.wait()
        except Exception as e:  # (the step it was re-coding is still marked: this add re-codes it first)
            import warnings
            warnings.warn(f"lmc.archive: the background re-code failed ({e}); retrying it now", stacklevel=2)
        folder = os.fspath(folder)
        if step is None:
            step = step_of(folder)
            if step is None:
                raise ArchiveError(f"{folder}: cannot tell the step (name it checkpoint-<step>, "
                                   "global_step<step>, step-<step> or pass step=)")
        step = check_step_number(step)
        if not os.path.isdir(folder):
            raise ArchiveError(f"{folder}: not a directory")
        rels = list_files(folder)  # a dangling or looping link: one line, before anything is made
        self._check_writable_path()
        b = store(self.path)
        if b.is_dir() and read_manifest(self.path) is None:
            self._check_new_archive_dir()  # before the lock file is made in it
        b.makedirs()
        with Lock(self.path):
            m = read_manifest(self.path)
            if m is None:
                self._check_new_archive_dir()
                m = new_manifest(self.keyframe_every or DEFAULT_KEYFRAME_EVERY)
            elif self.keyframe_every is not None:
                m["keyframe_every"] = int(self.keyframe_every)
            m["version"] = VERSION
            cleanup(self.path, m)
            self._recode_pending(m)  # (a re-code left by a background add that did not finish)
            steps = [e["step"] for e in m["steps"]]
            if step in steps:
                raise ArchiveError(f"step {step} is already in the archive")
            if steps and step < steps[-1]:
                raise ArchiveError(f"step {step} is older than the archive's last step {steps[-1]}")
            last = m["steps"][-1] if m["steps"] else None
            # The new step is coded alone, so the latest step restores at keyframe speed whatever
            # the chain; the step before it is re-coded against it (and its own dependents, older
            # steps, keep theirs), unless that would make a chain longer than keyframe_every.
            recode = last is not None and _may_recode(m, last["step"])
            if reference_folder == "auto":
                reference_folder = None
                base = os.path.basename(os.path.normpath(folder))
                if last is not None and step_of(folder) == step:
                    cand = os.path.join(os.path.dirname(os.path.normpath(folder)),
                                        STEP_RE.match(base).group(1) + str(last["step"]))
                    reference_folder = cand if os.path.isdir(cand) else None
            w = SegmentWriter(self.path, step)
            wl = None
            ph = Phases()
            t0 = time.perf_counter()
            try:
                with self._view(m) as view:
                    rec = None
                    if recode and not background:  # the last step's tensors re-coded as the new step's are coded
                        # (a step added by lmc 0.3 keeps its version-2 index, sections with CRC-32)
                        wl = SegmentWriter(self.path, last["step"],
                                           crc=view.index(last["step"]).get("version") != 3)
                        rec = _NextRecoder(view, last["step"], wl, reference_folder, self.threads,
                                           rels, prefer=self.prefer)
                    enc = StepEncoder(w, self.threads, prefer=self.prefer, recoder=rec, phases=ph)
                    files, nbytes = enc.folder(folder, rels)
                    fname, ftime = _folder_name(folder, step), _folder_time(folder)
                    with ph.time("fsync"):  # (the index, the flush, fsync and rename)
                        name = w.commit({"version": 3, "step": step, "prev": None, "keyframe": True,
                                         "files": files, "name": fname, "time": ftime,
                                         "keyframe_every": m["keyframe_every"]})
                    if recode and not background:
                        with ph.time("copy unchanged"):
                            idx = rec.finish(step)
                        with ph.time("fsync"):
                            lname = wl.commit(idx)
            except BaseException:
                w.abort()
                if wl is not None:
                    wl.abort()
                raise  # (a committed but unreferenced segment is removed by the next writer)
            if recode and not background:
                last.update(segment=lname, size=wl.size, index_crc=wl.index_crc,
                            keyframe=idx["keyframe"], prev=idx["prev"], depends_on=idx["prev"])
            elif recode:
                last["recode"] = step
            m["steps"].append({
                "step": step, "segment": name, "size": w.size, "index_crc": w.index_crc,
                "keyframe": True, "prev": None, "depends_on": None, "depth": 0, "bytes_in": nbytes,
                "name": fname, "opaque": opaque_bytes(files), "time": ftime})
            _set_depths(m)
            write_manifest(self.path, m)
            cleanup(self.path, m)  # the re-coded step's old segment
        self.last_phases = dict(ph.as_dict(), wall=round(time.perf_counter() - t0, 6))
        if recode and background:
            self._bg_error = None
            self._bg = threading.Thread(target=self._background_recode, args=(reference_folder, folder),
                                        name=f"lmc-archive-recode-{last['step']}", daemon=False)
            self._bg.start()
        return step

    def _check_writable_path(self):
        """One line, before anything is created, for an archive path that cannot be meant: a URL,
        a path whose parent folder does not exist (a typo would otherwise make a new archive in a
        surprising place), a file."""
        if is_url(self.path):
            store(self.path)  # (one line if fsspec or the protocol's filesystem is missing)
            return
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise ArchiveError(f"{self.path}: its parent folder {parent} does not exist")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ArchiveError(f"{self.path}: exists and is not an archive folder")

    def _check_new_archive_dir(self):
        """An existing folder without a manifest becomes an archive only if it is empty (or holds
        only what a failed first add leaves): a lost manifest next to segments must not let the
        next add delete the segments, and a checkpoint folder given as the archive (arguments
        swapped) must not become one."""
        names = [n for n in store(self.path).listdir() if n != ".lock" and not n.startswith(".tmp-")]
        segs = [n for n in names if SEG_RE.match(n)]
        if segs:
            raise ArchiveError(f"{self.path}: the manifest lmc-archive.json is missing but {len(segs)} "
                               "segment(s) are here; refusing to write (nothing was changed)")
        if names:
            raise ArchiveError(f"{self.path}: exists, is not empty and is not an lmc archive "
                               f"(it holds {names[0]!r}; were the arguments swapped?)")

    # -- restore
    def _pieces(self, view, step, fe):
        """The bytes of a bytes/safetensors file, in order."""
        if fe["kind"] == "bytes":
            yield from view.chunks(step, fe["chunks"], fe["path"])
            return
        for p in fe["parts"]:
            if p["t"] == "raw":
                yield from view.chunks(step, p["chunks"], fe["path"])
            else:
                arr = view.decode(step, fe["path"], p)
                if "xxh" in p:
                    self._check_tensor(step, fe, p, arr)
                yield arr.reshape(-1).view(np.uint8)
                del arr

    def _write_plain(self, view, step, fe, f):
        """Write (f: a file, or None to only check) a bytes/safetensors/torchzip file, checked end to end: each
        piece against its xxh3-128 (version 3), or the whole file against its SHA-256 (versions 1-2)."""
        if "sha256" not in fe:
            n = 0
            for piece in self._pieces(view, step, fe):
                if f is not None:
                    f.write(piece)
                n += len(piece)
            if n != fe["size"]:
                raise ArchiveError(f"step {step}: {fe['path']}: restored size differs from the recorded one")
            return
        h = hashlib.sha256()
        n = 0
        for piece in self._pieces(view, step, fe):
            if f is not None:
                f.write(piece)
            h.update(piece)
            n += len(piece)
        if n != fe["size"] or h.hexdigest() != fe["sha256"]:
            raise ArchiveError(f"step {step}: {fe['path']}: restored bytes do not match the "
                               "checksum recorded when it was added")

    def _skeleton(self, view, step, fe):
        data = b"".join(view.chunks(step, fe["skeleton"], fe["path"]))
        skel = load_json(data, f"step {step}: {fe['path']}: skeleton")
        _torchio.check(skel, len(fe["tensors"]))
        return skel

    def _check_tensor(self, step, fe, t, arr):
        if not matches(t, arr.reshape(-1).view(np.uint8)):
            raise ArchiveError(f"step {step}: {fe['path']}: tensor {t['key']}: decoded bytes "
                               "do not match the recorded checksum")

    def _write_torch(self, view, step, fe, target):
        import torch
        skel = self._skeleton(view, step, fe)
        offs, total = [], 0
        for t in fe["tensors"]:
            offs.append(total)
            total += -(-t["n"] // 64) * 64
        scratch = os.path.join(os.path.dirname(target), f".lmc-scratch-{secrets.token_hex(4)}")
        with open(scratch, "wb") as f:  # the blocks reserved now: a full disk is ENOSPC here,
            os.posix_fallocate(f.fileno(), 0, max(total, 1))  # never a SIGBUS in the map
        mm = np.memmap(scratch, np.uint8, mode="r+", shape=(max(total, 1),))
        try:
            ts = []
            for t, off in zip(fe["tensors"], offs):
                slot = mm[off:off + t["n"]]
                out = slot.view(NP_DTYPES[t["np"]]) if t["enc"] == "lmc" else slot
                view.decode(step, fe["path"], t, out=out)
                self._check_tensor(step, fe, t, slot)
                ts.append(_torchio.from_u8(slot, t["dtype"], t["shape"]))
            obj = _torchio.unflatten(skel, ts)
            torch.save(obj, target)
            del obj, ts, slot, out
        finally:
            del mm
            os.unlink(scratch)

    def check_step(self, step):
        """Decode every file of one step completely and compare with the
        checksums recorded at add time (raises ArchiveError)."""
        with self._view() as view:
            for fe in view.index(step)["files"]:
                if fe["kind"] == "torch":
                    self._skeleton(view, step, fe)
                    for t in fe["tensors"]:
                        self._check_tensor(step, fe, t, view.decode(step, fe["path"], t))
                else:
                    self._write_plain(view, step, fe, None)

    def restore(self, step, out_dir):
        """Write the files of `step` into out_dir (created; must not exist or be
        empty).  Written to a temporary folder first and renamed at the end, so
        a damaged archive leaves no output."""
        out_dir = os.path.abspath(os.fspath(out_dir))
        if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
            raise ArchiveError(f"{out_dir}: exists and is not an empty directory")
        parent = os.path.dirname(out_dir)
        os.makedirs(parent, exist_ok=True)
        with self._view() as view:
            need = restore_bytes(view.index(int(step))["files"])
        free = shutil.disk_usage(parent).free
        if need > free:
            raise ArchiveError(f"step {step}: restoring it needs {need:,} bytes free in {parent}, "
                               f"{free:,} are (nothing was written)")
        tmp = os.path.join(parent, f".lmc-restore-{secrets.token_hex(4)}")
        os.mkdir(tmp)
        ph = Phases()
        t0 = time.perf_counter()
        try:
            with self._view() as view, Ordered(workers_for(self.threads), in_order=False) as pool:
                fds, stamps = [], []
                try:
                    for fe in view.index(int(step))["files"]:
                        target = os.path.join(tmp, *fe["path"].split("/"))
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        if "mode" in fe:
                            stamps.append((target, fe))
                        if fe["kind"] == "torch":
                            pool.drain()
                            self._write_torch(view, step, fe, target)
                        elif "sha256" not in fe:  # version 3: pieces decoded and written by the pool
                            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                            fds.append(fd)
                            self._restore_pieces(pool, view, step, fe, fd, ph)
                        else:
                            with open(target, "wb") as f:
                                self._write_plain(view, step, fe, f)
                    pool.drain()
                finally:
                    for fd in fds:
                        os.close(fd)
            for target, fe in stamps:  # the mode and mtime the file had when it was added
                os.chmod(target, fe["mode"])
                os.utime(target, ns=(fe["mtime"], fe["mtime"]))
            if os.path.isdir(out_dir):
                os.rmdir(out_dir)
            os.rename(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.last_phases = dict(ph.as_dict(), wall=round(time.perf_counter() - t0, 6))
        return out_dir

    def _restore_pieces(self, pool, view, step, fe, fd, ph):
        """Submit a version 3 file's pieces to the pool: each decoded, checked against its xxh3-128 and written
        at its offset (pwrite) by a worker."""
        pieces = [("chunk", c) for c in fe["chunks"]] if fe["kind"] == "bytes" else []
        if fe["kind"] != "bytes":
            for p in fe["parts"]:
                pieces += [("chunk", c) for c in p["chunks"]] if p["t"] == "raw" else [("tensor", p)]
        off = 0
        for kind, e in pieces:
            th = piece_threads(pool.workers, self.threads, e["n"])
            pool.submit(functools.partial(self._restore_piece, view, step, fe, kind, e, fd, off, th, ph), cost=e["n"])
            off += e["n"]

    def _restore_piece(self, view, step, fe, kind, e, fd, off, th, ph):
        with ph.time("decode"):
            if kind == "chunk":
                data = view.chunk(step, e, fe["path"])
            else:  # decoded into this thread's buffer (no page faults), written, then reused
                buf = scratch("out", e["n"])
                out = buf.view(NP_DTYPES[e["np"]]) if e["enc"] == "lmc" else buf
                data = view.decode(step, fe["path"], e, out=out, threads=th).reshape(-1).view(np.uint8)
        if kind == "tensor":
            with ph.time("hash"):
                self._check_tensor(step, fe, e, data)
        with ph.time("write"):
            mv = memoryview(data).cast("B")
            while mv.nbytes:
                k = os.pwrite(fd, mv, off)
                mv, off = mv[k:], off + k

    # -- verify
    # -- repair
    def repair(self, keyframe_every=None):
        """Rebuild a missing or damaged manifest from the segments' own indexes.  Of several
        segments for one step (an add interrupted before its manifest), the one whose dependency
        is present is taken, the newest first.  Segments that cannot be read are renamed
        damaged-<name> (kept, never deleted).  Then every step is verified.  Returns
        (steps recovered, [(segment, why)] unreadable, VerifyResult; its notes say what else repair
        did).  A readable manifest that agrees with its segments is left as it is (repair then only
        verifies); one they contradict is rebuilt too.  A manifest replaced is kept as
        damaged-lmc-archive.json.  keyframe_every (default: the newest segment's record of it, else
        inferred from the chains) is the rebuilt manifest's."""
        b = store(self.path)
        if not b.is_dir():
            raise ArchiveError(f"{self.path}: no such archive folder")
        with Lock(self.path):
            try:
                m = read_manifest(self.path)
            except ArchiveError:
                m = None
            notes = []
            if m is not None:
                wrong = manifest_disagreements(self.path, m)
                if not wrong:
                    return [e["step"] for e in m["steps"]], [], self.verify()
                notes.append(f"manifest disagrees with its segments ({wrong[0]}"
                             + (f"; {len(wrong) - 1} more" if len(wrong) > 1 else "") + "): rebuilt from the segments")
            kept = keep_manifest(self.path)
            if kept is not None:
                notes.append(f"the replaced manifest is kept as {kept}")
            cands, bad = {}, []
            for name in sorted(b.listdir()):
                if not SEG_RE.match(name):
                    continue
                try:
                    e = probe_segment(self.path, name)
                    r = SegmentReader(self.path, e)
                    try:
                        idx = check_index(r.index, e["step"])
                    finally:
                        r.close()
                except (ArchiveError, OSError, ValueError) as ex:
                    bad.append((name, str(ex)))
                    continue
                files = idx["files"]
                uses = any(t["ref"] for fe in files for t in file_tensors(fe))
                e.update(keyframe=idx["keyframe"], prev=idx["prev"] if uses else None,
                         depends_on=idx["prev"] if uses else None, depth=0,
                         bytes_in=sum(fe["size"] for fe in files),
                         name=idx.get("name", f"checkpoint-{e['step']}"),
                         opaque=opaque_bytes(files))
                if "time" in idx:
                    e["time"] = idx["time"]
                e["_keyframe_every"] = idx.get("keyframe_every")
                cands.setdefault(e["step"], []).append(
                    (b.mtime(name), e))
            chosen = {}
            for step, cs in cands.items():
                cs.sort(key=lambda c: -c[0])
                ok = [e for _, e in cs if e["depends_on"] is None or e["depends_on"] in cands]
                chosen[step] = (ok or [cs[0][1]])[0]
            for e in chosen.values():  # a dependency on a lost step stays: verify reports it
                if e["depends_on"] is not None and e["depends_on"] not in chosen:
                    e["depends_on"] = e["prev"] = None
                    e["lost_reference"] = True
            lost_ref = [s for s, e in chosen.items() if e.pop("lost_reference", False)]
            recorded = {s: e.pop("_keyframe_every") for s, e in chosen.items()}
            m = new_manifest(keyframe_every or self.keyframe_every or DEFAULT_KEYFRAME_EVERY)
            m["steps"] = [chosen[s] for s in sorted(chosen)]
            _set_depths(m)
            if not (keyframe_every or self.keyframe_every):
                m["keyframe_every"], note = rebuilt_keyframe_every(m, recorded, DEFAULT_KEYFRAME_EVERY)
                if note:
                    notes.append(note)
            for name, _ in bad:
                b.rename(name, "damaged-" + name)
            write_manifest(self.path, m)
        res = self.verify()
        res.notes[:0] = notes
        for s in lost_ref:
            res.damaged.setdefault(s, f"step {s}: its reference step is not in any readable segment")
        return [e["step"] for e in m["steps"]], bad, res

    # -- prune
    def prune(self, keep_last=None, *, keep_every=None, keep_within=None):
        """Delete steps, keeping every step that any given policy keeps, and always the latest:
        keep_last K (the last K steps), keep_every N (steps that are multiples of N, as Orbax's
        keep_period), keep_within seconds, > 0 (steps written within that long before the latest
        one; steps added by lmc 0.2 carry no time and are kept).  A kept step coded against a
        deleted one is re-coded first (against the next kept step of its chain, else alone), then
        the new manifest replaces the old one atomically; no kept step is ever lost.  Returns the
        deleted steps."""
        if keep_last is None and keep_every is None and keep_within is None:
            raise ArchiveError("prune: give at least one of keep_last, keep_every, keep_within")
        for v, what in ((keep_last, "keep_last"), (keep_every, "keep_every")):
            if v is not None and int(v) < 1:
                raise ArchiveError(f"{what} must be >= 1")
        if keep_within is not None and not 0 < float(keep_within) < float("inf"):
            raise ArchiveError("keep_within must be > 0 (seconds)")
        with Lock(self.path):
            m = self._manifest()
            cleanup(self.path, m)
            es = m["steps"]
            keep = {es[-1]["step"]} if es else set()
            if keep_last is not None:
                keep |= {e["step"] for e in es[-int(keep_last):]}
            if keep_every is not None:
                keep |= {e["step"] for e in es if e["step"] % int(keep_every) == 0}
            if keep_within is not None and es:
                newest = max((e["time"] for e in es if "time" in e), default=None)
                keep |= {e["step"] for e in es if "time" not in e or newest is None
                         or e["time"] >= newest - float(keep_within)}
            drop = [e["step"] for e in es if e["step"] not in keep]
            if not drop:
                return []
            deps = {e["step"]: e["depends_on"] for e in es}
            new = []
            for e in es:
                if e["step"] not in keep:
                    continue
                e = dict(e)
                if e["depends_on"] is not None and e["depends_on"] not in keep:
                    target = e["depends_on"]
                    while target is not None and target not in keep:
                        target = deps[target]
                    w = None
                    try:
                        with self._view(m) as view:
                            # (a version-2 step re-coded keeps its index version: sections with CRC-32)
                            w = SegmentWriter(self.path, e["step"],
                                              crc=view.index(e["step"]).get("version") != 3)
                            idx = self._recode(view, e["step"], w, target)
                        e.update(segment=w.commit(idx), size=w.size, index_crc=w.index_crc,
                                 keyframe=idx["keyframe"], prev=idx["prev"], depends_on=idx["prev"])
                    except BaseException:
                        if w is not None:
                            w.abort()
                        raise
                elif e["prev"] is not None and e["prev"] not in keep:
                    e["prev"] = None  # (its index keeps the number; it depends on nothing)
                new.append(e)
            m["steps"] = new
            _set_depths(m)
            write_manifest(self.path, m)
            cleanup(self.path, m)
        return drop

    def _recode(self, view, step, w, target):
        """The index of `step` with every tensor that referred to another step decoded and coded
        again: against the same tensor of `target` where it has one, else alone."""
        r = view.reader(step)
        idx = copy.deepcopy(r.index)
        tfiles = {} if target is None else {fe["path"]: fe for fe in view.index(target)["files"]}
        paths = reference_paths([fe["path"] for fe in idx["files"]], list(tfiles))
        used = False
        for fe, ofe in zip(idx["files"], r.index["files"]):
            fe.pop("ref_path", None)
            for (_, sec, c), _o in zip(all_sections(fe), all_sections(ofe)):
                if c is not None:
                    c["sec"] = w.add_section(r.read(sec, fe["path"]))
            tpath = paths.get(fe["path"])
            tfe = tfiles.get(tpath) if tpath is not None else None
            tts = ({t["key"]: t for t in file_tensors(tfe)}
                   if tfe is not None and tfe["kind"] == fe["kind"] else {})
            file_used = False
            for t, ot in zip(file_tensors(fe), file_tensors(ofe)):
                if not t["ref"]:
                    t["sec"] = w.add_section(r.read(t["sec"], fe["path"]))
                    continue
                arr = view.decode(step, fe["path"], ot)
                self._check_tensor(step, fe, t, arr)
                tt = tts.get(t["key"])
                ref = view.decode(target, tpath, tt) if tt is not None and same_identity(tt, t) else None
                blob = compress(shaped(arr, t["shape"]), reference=shaped(ref, t["shape"]), threads=self.threads,
                                prefer=self.prefer)
                del arr, ref
                t["sec"] = w.add_section(blob)
                t["ref"] = bool(blob_info(blob)["has_reference"])
                file_used |= t["ref"]
            if file_used and tpath != fe["path"]:
                fe["ref_path"] = tpath
            used |= file_used
        idx["prev"] = target if used else None
        idx["keyframe"] = not used
        return idx
