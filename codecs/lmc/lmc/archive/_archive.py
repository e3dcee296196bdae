"""lmc.archive.Archive: a folder holding a series of checkpoints, each
tensor coded with lmc against the same tensor of the previous step."""
import collections
import copy
import hashlib
import os
import re
import secrets
import shutil

import numpy as np

from .. import compress
from . import _torchio
from ._add import StepEncoder
from ._formats import NP_DTYPES, file_tensors, all_sections
from ._store import (SEG_RE, VERSION, ArchiveError, Lock, SegmentWriter, cleanup, load_json, new_manifest,
                     read_manifest, write_manifest)
from ._view import View, inflate, same_identity, sha128

DEFAULT_KEYFRAME_EVERY = 10
# the step folders training tools write: the Trainer and Accelerate (checkpoint-<N>), DeepSpeed's engine
# (global_step<N>), torchtitan (step-<N>), others (step<N>)
STEP_RE = re.compile(r"^(checkpoint-|global_step|step-|step)(\d+)$")


def step_of(folder):
    m = STEP_RE.match(os.path.basename(os.path.normpath(folder)))
    return int(m.group(2)) if m else None


def step_folders(run_dir):
    """[(step, name)] of the step folders directly under run_dir, ascending.  Two folders
    for one step (checkpoint-4 and step-4) are an error: which one is the step is not clear."""
    found = {}
    for n in sorted(os.listdir(run_dir)):
        m = STEP_RE.match(n)
        if m and os.path.isdir(os.path.join(run_dir, n)):
            s = int(m.group(2))
            if s in found:
                raise ArchiveError(f"{run_dir}: two folders for step {s}: {found[s]}, {n}")
            found[s] = n
    return sorted(found.items())


def opaque_bytes(files):
    """Bytes of a step's files that went in as plain bytes: files lmc did not understand, the
    verbatim regions (headers, zip directories, pickles) of those it did, tensors it cannot code."""
    n = 0
    for fe in files:
        if fe["kind"] == "bytes":
            n += fe["size"]
            continue
        n += sum(c["n"] for p in fe.get("parts", []) if p["t"] == "raw" for c in p["chunks"])
        n += sum(c["n"] for c in fe.get("skeleton", []))
        n += sum(t["n"] for t in file_tensors(fe) if t["enc"] != "lmc")
    return n


def _folder_name(folder, step):
    """The name a step is restored under: its folder's own name where that is a step folder
    name of this step, else checkpoint-<step>."""
    base = os.path.basename(os.path.normpath(folder))
    return base if step_of(base) == step else f"checkpoint-{step}"


class VerifyResult:
    """Outcome of Archive.verify(): steps checked, damaged steps (with the
    first problem found) and the steps depending on each damaged one."""

    def __init__(self, steps, damaged, dependents):
        self.steps = steps
        self.damaged = damaged
        self.dependents = dependents

    @property
    def ok(self):
        return not self.damaged

    @property
    def unrestorable(self):
        return sorted(set(self.damaged) | {s for d in self.dependents.values() for s in d})

    def __repr__(self):
        return f"VerifyResult(steps={self.steps}, damaged={self.damaged}, dependents={self.dependents})"


class Archive:
    """An lmc checkpoint archive at `path` (a directory; created by the first add).

    keyframe_every: every K-th step is coded alone, so restoring a step decodes
    at most K versions of each tensor (stored in the archive; a value given
    here replaces the stored one for later steps).  threads: lmc threads."""

    def __init__(self, path, *, keyframe_every=None, threads=None):
        self.path = os.fspath(path)
        if keyframe_every is not None and int(keyframe_every) < 1:
            raise ValueError("keyframe_every must be >= 1")
        self.keyframe_every = keyframe_every
        self.threads = threads

    # -- reading
    def _manifest(self):
        m = read_manifest(self.path)
        if m is None:
            if os.path.isdir(self.path):
                raise ArchiveError(f"{self.path}: not an lmc archive (no manifest)")
            raise ArchiveError(f"{self.path}: no such archive")
        return m

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
    def add(self, folder, step=None, *, reference_folder="auto"):
        """Append a checkpoint folder as `step` (default: from its name
        checkpoint-<step>).  Atomic: on any error the archive is unchanged.
        reference_folder: the previous step's raw folder, whose tensors are used
        as references where their checksum matches the archived ones ("auto":
        the sibling checkpoint-<prev> folder, if any; None: always decode)."""
        folder = os.fspath(folder)
        if step is None:
            step = step_of(folder)
            if step is None:
                raise ArchiveError(f"{folder}: cannot tell the step (name it checkpoint-<step>, "
                                   "global_step<step>, step-<step> or pass step=)")
        step = int(step)
        if step < 0:
            raise ArchiveError("step must be >= 0")
        if not os.path.isdir(folder):
            raise ArchiveError(f"{folder}: not a directory")
        self._check_writable_path()
        if os.path.isdir(self.path) and read_manifest(self.path) is None:
            self._check_new_archive_dir()  # before the lock file is made in it
        os.makedirs(self.path, exist_ok=True)
        with Lock(self.path):
            m = read_manifest(self.path)
            if m is None:
                self._check_new_archive_dir()
                m = new_manifest(self.keyframe_every or DEFAULT_KEYFRAME_EVERY)
            elif self.keyframe_every is not None:
                m["keyframe_every"] = int(self.keyframe_every)
            m["version"] = VERSION
            cleanup(self.path, m)
            steps = [e["step"] for e in m["steps"]]
            if step in steps:
                raise ArchiveError(f"step {step} is already in the archive")
            if steps and step < steps[-1]:
                raise ArchiveError(f"step {step} is older than the archive's last step {steps[-1]}")
            last = m["steps"][-1] if m["steps"] else None
            keyframe = last is None or last["depth"] + 1 >= m["keyframe_every"]
            prev = None if last is None else last["step"]
            if reference_folder == "auto":
                reference_folder = None
                base = os.path.basename(os.path.normpath(folder))
                if prev is not None and step_of(folder) == step:
                    cand = os.path.join(os.path.dirname(os.path.normpath(folder)),
                                        STEP_RE.match(base).group(1) + str(prev))
                    reference_folder = cand if os.path.isdir(cand) else None
            w = SegmentWriter(self.path, step)
            try:
                with self._view(m) as view:
                    enc = StepEncoder(view, w, None if keyframe else prev, self.threads,
                                      reference_folder)
                    files, nbytes = enc.folder(folder)
                uses_ref = any(t["ref"] for fe in files for t in file_tensors(fe))
                name = w.commit({"step": step, "prev": prev, "keyframe": keyframe,
                                 "files": files})
            except BaseException:
                w.abort()
                raise
            m["steps"].append({
                "step": step, "segment": name, "size": w.size, "index_crc": w.index_crc,
                "keyframe": keyframe, "prev": prev, "depends_on": prev if uses_ref else None,
                "depth": last["depth"] + 1 if uses_ref else 0, "bytes_in": nbytes,
                "name": _folder_name(folder, step), "opaque": opaque_bytes(files)})
            write_manifest(self.path, m)
        return step

    def _check_writable_path(self):
        """One line, before anything is created, for an archive path that cannot be meant: a URL,
        a path whose parent folder does not exist (a typo would otherwise make a new archive in a
        surprising place), a file."""
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", self.path):
            raise ArchiveError(f"{self.path}: a URL; the archive takes local paths")
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
        names = [n for n in os.listdir(self.path) if n != ".lock" and not n.startswith(".tmp-")]
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
                yield arr.reshape(-1).view(np.uint8)
                del arr

    def _write_plain(self, view, step, fe, f):
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
        if sha128(arr.reshape(-1).view(np.uint8)) != t["sha"]:
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
        mm = np.memmap(scratch, np.uint8, mode="w+", shape=(max(total, 1),))
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
        tmp = os.path.join(parent, f".lmc-restore-{secrets.token_hex(4)}")
        os.mkdir(tmp)
        try:
            with self._view() as view:
                for fe in view.index(int(step))["files"]:
                    target = os.path.join(tmp, *fe["path"].split("/"))
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    if fe["kind"] == "torch":
                        self._write_torch(view, step, fe, target)
                    else:
                        with open(target, "wb") as f:
                            self._write_plain(view, step, fe, f)
            if os.path.isdir(out_dir):
                os.rmdir(out_dir)
            os.rename(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out_dir

    # -- verify
    def verify(self):
        """Check every checksum and decode every tensor of every step (each
        tensor version once, walking each tensor's chain in step order).
        Returns a VerifyResult; raises ArchiveError only if the manifest itself
        is unreadable."""
        m = self._manifest()
        steps = [e["step"] for e in m["steps"]]
        damaged = {}
        ids = collections.OrderedDict()
        chain_of = {}
        skipped = set()
        with self._view(m) as view:
            for s in steps:
                try:
                    r = view.reader(s)
                    for fe in r.index["files"]:
                        for what, sec, c in all_sections(fe):
                            data = r.read(sec, f"{fe['path']}: {what}")
                            if c is not None and c["enc"] == "zlib":
                                inflate(data, c["n"], f"step {s}: {fe['path']}")
                        if fe["kind"] == "bytes":
                            self._write_plain(view, s, fe, None)
                        elif fe["kind"] == "torch":
                            self._skeleton(view, s, fe)
                except ArchiveError as e:
                    damaged[s] = str(e)
                    continue
                # a file's tensors continue the chains of the file of the previous step
                # they refer to (ref_path: the same file under a step-numbered folder)
                prev_s = m["steps"][steps.index(s)]["prev"]
                for fe in r.index["files"]:
                    cid = chain_of.get((prev_s, fe.get("ref_path", fe["path"])), fe["path"])
                    chain_of[(s, fe["path"])] = cid
                    for t in file_tensors(fe):
                        ids.setdefault((cid, fe["kind"], t["key"]), []).append((s, fe["path"], t))
            for (_cid, kind, key), seq in ids.items():
                prev_s = prev_t = arr = None
                for s, path, t in seq:
                    if s in damaged:
                        prev_s = prev_t = arr = None
                        continue
                    ref = None
                    if t["ref"]:
                        dep = m["steps"][steps.index(s)]["depends_on"]
                        if prev_s != dep or arr is None or not same_identity(prev_t, t):
                            if dep in damaged or dep in skipped:
                                skipped.add(s)  # a dependent of a damaged step
                            else:
                                damaged[s] = (f"step {s}: {path}: tensor {key}: its reference "
                                              f"is missing from step {dep}")
                            prev_s = prev_t = arr = None
                            continue
                        ref = arr
                    try:
                        arr = view.decode_one(s, path, t, ref=ref)
                        self._check_tensor(s, {"path": path}, t, arr)
                    except ArchiveError as e:
                        damaged.setdefault(s, str(e))
                        arr = None
                    prev_s, prev_t = s, t
                    del ref
        deps = {e["step"]: e["depends_on"] for e in m["steps"]}
        dependents = {}
        for d in damaged:
            out = []
            for s in steps:
                c = deps[s]
                while c is not None and c != d:
                    c = deps[c]
                if c == d and s not in damaged:
                    out.append(s)
            dependents[d] = out
        return VerifyResult(steps, dict(sorted(damaged.items())), dependents)

    # -- prune
    def prune(self, keep_last):
        """Keep only the last `keep_last` steps.  If the oldest kept step was
        coded against a pruned one it is re-coded as a keyframe first; the new
        manifest replaces the old one atomically.  Returns the pruned steps."""
        keep_last = int(keep_last)
        if keep_last < 1:
            raise ArchiveError("keep_last must be >= 1")
        with Lock(self.path):
            m = self._manifest()
            cleanup(self.path, m)
            if len(m["steps"]) <= keep_last:
                return []
            drop = m["steps"][:-keep_last]
            keep = [dict(e) for e in m["steps"][-keep_last:]]
            first = keep[0]
            if first["depends_on"] is not None or first["prev"] is not None:
                w = SegmentWriter(self.path, first["step"])
                try:
                    with self._view(m) as view:
                        idx = self._recode_keyframe(view, first["step"], w)
                    first.update(segment=w.commit(idx), size=w.size, index_crc=w.index_crc,
                                 keyframe=True, prev=None, depends_on=None)
                except BaseException:
                    w.abort()
                    raise
            depth = {}
            for e in keep:
                e["depth"] = 0 if e["depends_on"] is None else depth[e["depends_on"]] + 1
                depth[e["step"]] = e["depth"]
            m["steps"] = keep
            write_manifest(self.path, m)
            cleanup(self.path, m)
        return [e["step"] for e in drop]

    def _recode_keyframe(self, view, step, w):
        r = view.reader(step)
        idx = copy.deepcopy(r.index)
        for fe, ofe in zip(idx["files"], r.index["files"]):
            for (_, sec, c), _o in zip(all_sections(fe), all_sections(ofe)):
                if c is not None:
                    c["sec"] = w.add_section(r.read(sec, fe["path"]))
            for t, ot in zip(file_tensors(fe), file_tensors(ofe)):
                if t["ref"]:
                    arr = view.decode(step, fe["path"], ot)
                    self._check_tensor(step, fe, t, arr)
                    t["sec"] = w.add_section(compress(arr, threads=self.threads))
                    t["ref"] = False
                    del arr
                else:
                    t["sec"] = w.add_section(r.read(t["sec"], fe["path"]))
        for fe in idx["files"]:
            fe.pop("ref_path", None)
        idx["prev"] = None
        idx["keyframe"] = True
        return idx
