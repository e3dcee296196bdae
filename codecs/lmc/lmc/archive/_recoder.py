"""_NextRecoder: re-codes the archive's last step against the step being added, tensor by
tensor as the new step is coded (used by Archive.add)."""
import copy

from .. import compress, info as blob_info
from ..api import shaped
from ._add import RawSource, reference_paths
from ._index import NP_DTYPES, all_sections, file_tensors
from ._view import same_identity


class _NextRecoder:
    """Re-codes step `step` of the archive against the step being added, one tensor at a time as
    the new step's tensors are coded (their bytes are in memory then: nothing is read twice).  A
    tensor of `step` with a same tensor in the new step (the same path, or the one path equal to it
    with step numbers blanked; same key, dtype, shape) is coded with it as the reference; its own
    bytes come from its raw folder when they hash to the archived checksum, else are decoded (the
    last step is coded alone: one decode).  finish() copies everything else and gives the index."""

    def __init__(self, view, step, w, raw_folder, threads, next_paths, prefer="speed"):
        self.view, self.step, self.w, self.threads = view, step, w, threads
        self.prefer = prefer  # lmc.compress's prefer
        self.r = view.reader(step)
        self.idx = copy.deepcopy(self.r.index)
        self.paths = reference_paths([fe["path"] for fe in self.idx["files"]], next_paths)
        self.by_next = {}  # path in the new step -> (file entry of `step`, {key: tensor entry})
        for fe in self.idx["files"]:
            if self.paths.get(fe["path"]) is not None:
                self.by_next[self.paths[fe["path"]]] = (fe, {x["key"]: x for x in file_tensors(fe)})
        self.done = {}
        self.raw = RawSource(raw_folder)

    def code(self, rel, kind, t, u8, threads, phases):
        """In a worker: the blob of `step`'s same tensor coded against the new step's bytes ``u8`` (entry ``t``),
        or None where `step` has no such tensor. Handed to put() on the writing thread."""
        got = self.by_next.get(rel)
        if got is None or got[0]["kind"] != kind:
            return None
        fe, ts = got
        lt = ts.get(t["key"])
        if lt is None or not same_identity(lt, t):
            return None
        dt = NP_DTYPES[lt["np"]]
        with phases.time("read reference"):
            cur = self.raw.get(fe["path"], kind, t["key"], lt)
        if cur is None:
            with phases.time("decode reference"):
                cur = self.view.decode(self.step, fe["path"], lt)
        with phases.time("code against"):
            blob = compress(shaped(cur.reshape(-1).view(dt), lt["shape"]),
                            reference=shaped(u8.view(dt), lt["shape"]), threads=threads, prefer=self.prefer)
        return fe["path"], t["key"], blob, bool(blob_info(blob)["has_reference"])

    def put(self, res):
        path, key, blob, ref = res
        self.done[(path, key)] = (self.w.add_section(blob), ref)

    def finish(self, next_step):
        used = False
        for fe, ofe in zip(self.idx["files"], self.r.index["files"]):
            fe.pop("ref_path", None)
            for (_, sec, c), _o in zip(all_sections(fe), all_sections(ofe)):
                if c is not None:
                    c["sec"] = self.w.add_section(self.r.read(sec, fe["path"]))
            file_used = False
            for t, ot in zip(file_tensors(fe), file_tensors(ofe)):
                new = self.done.get((fe["path"], t["key"]))
                if new is not None:
                    t["sec"], t["ref"] = new
                elif not ot["ref"]:
                    t["sec"] = self.w.add_section(self.r.read(ot["sec"], fe["path"]))
                else:  # it referred to an older step (version 1): now coded alone
                    arr = self.view.decode(self.step, fe["path"], ot)
                    t["sec"] = self.w.add_section(compress(shaped(arr, t["shape"]), threads=self.threads,
                                                           prefer=self.prefer))
                    t["ref"] = False
                    del arr
                file_used |= t["ref"]
            npath = self.paths.get(fe["path"])
            if file_used and npath != fe["path"]:
                fe["ref_path"] = npath
            used |= file_used
        self.idx["prev"] = next_step if used else None
        self.idx["keyframe"] = not used
        return self.idx
