"""Archive.verify: every checksum checked and every tensor decoded, each tensor's versions on a worker of the
pool in chain order; what is damaged, and what is lost through it."""
import collections
import functools

from ._add import canonical_path
from ._index import all_sections, file_tensors
from ._graph import _topo
from ._pipeline import Ordered, piece_threads, workers_for
from ._manifest import ArchiveError
from ._view import same_identity


class VerifyResult:
    """Outcome of Archive.verify(): steps checked, damaged steps (with the
    first problem found) and, for each damaged one, the steps lost through it: those
    coded against a tensor of it that is damaged (or lost in turn).  Damage to a step's
    bytes files, raw parts or skeleton loses that step alone."""

    def __init__(self, steps, damaged, dependents, notes=()):
        self.steps = steps
        self.damaged = damaged
        self.dependents = dependents
        self.notes = list(notes)  # lines repair says besides (a manifest it replaced, keyframe_every)

    @property
    def ok(self):
        return not self.damaged

    @property
    def unrestorable(self):
        return sorted(set(self.damaged) | {s for d in self.dependents.values() for s in d})

    def __repr__(self):
        return f"VerifyResult(steps={self.steps}, damaged={self.damaged}, dependents={self.dependents})"


class _Verifier:
    """Archive's verify (mixed into Archive)."""

    def verify(self):
        """Check every checksum and decode every tensor of every step (each
        tensor version once, walking each tensor's versions in dependency order).
        Returns a VerifyResult; raises ArchiveError only if the manifest itself
        is unreadable."""
        m = self._manifest()
        steps = [e["step"] for e in m["steps"]]
        deps = {e["step"]: e["depends_on"] for e in m["steps"]}
        damaged = {}
        ids = collections.OrderedDict()
        unreadable = set()  # steps without a readable index: nothing of them can be decoded
        lost = {}  # step -> the damaged steps a tensor it is coded against is lost through
        with self._view(m) as view:
            for s in _topo(m):
                try:
                    r = view.reader(s)
                except ArchiveError as e:
                    damaged[s] = str(e)
                    unreadable.add(s)
                    continue
                try:
                    for fe in r.index["files"]:
                        for what, sec, c in all_sections(fe):
                            if c is not None:  # (inflated; checked against its CRC-32 or xxh3-128)
                                view.chunk(s, c, f"{fe['path']}: {what}")
                            elif len(sec) == 3:  # (a version 1-2 tensor section: its CRC-32)
                                r.read(sec, f"{fe['path']}: {what}")
                        if fe["kind"] == "bytes":
                            self._write_plain(view, s, fe, None)
                        elif fe["kind"] == "torch":
                            self._skeleton(view, s, fe)
                except ArchiveError as e:  # its tensors are still decoded below: its dependents
                    damaged[s] = str(e)     # need only those (damage elsewhere loses this step alone)
                # one tensor's versions: the same file (step numbers of step-named folders
                # blanked: global_step<N>/ inside checkpoint-<N>/), kind and key
                canon = [canonical_path(fe["path"]) for fe in r.index["files"]]
                for fe, c in zip(r.index["files"], canon):
                    cid = c if canon.count(c) == 1 else fe["path"]
                    for t in file_tensors(fe):
                        ids.setdefault((cid, fe["kind"], t["key"]), []).append((s, fe["path"], t))
            # each tensor's versions in a worker of the pool (they decode one after another, each against the
            # one before); what each finds is merged on this thread in the order the tensors were listed
            with Ordered(workers_for(self.threads)) as pool:
                for seq in ids.values():
                    pool.submit(functools.partial(self._verify_versions, view, seq, deps, unreadable),
                                functools.partial(_merge_damage, damaged, lost))
        dependents = {d: [s for s in steps if s not in damaged and d in lost.get(s, ())] for d in damaged}
        return VerifyResult(steps, dict(sorted(damaged.items())), dependents)

    def _verify_versions(self, view, seq, deps, unreadable):
        """Decode one tensor's versions in chain order: ({step: why} damaged, {step: {damaged steps it is lost
        through}}) - a version is lost when the version it is coded against is damaged or lost."""
        damaged, lost = {}, {}
        workers = workers_for(self.threads)
        last_s = last_t = arr = None
        bad = {}  # step -> the damaged step this tensor's version there is lost through
        for s, path, t in seq:
            dep = deps[s]
            chained = t["ref"] and last_s == dep and arr is not None and same_identity(last_t, t)
            if t["ref"] and not chained and (dep in unreadable or dep in bad):
                bad[s] = bad.get(dep, dep)  # its reference is lost
                lost.setdefault(s, set()).add(bad[s])
                last_s = last_t = arr = None
                continue
            try:
                threads = piece_threads(workers, self.threads, t["n"])
                if t["ref"] and not chained:  # its reference is not the version just decoded
                    arr = view.decode(s, path, t, threads=threads)
                else:
                    arr = view.decode_one(s, path, t, ref=arr if t["ref"] else None, threads=threads)
                self._check_tensor(s, {"path": path}, t, arr)
            except ArchiveError as e:
                damaged.setdefault(s, str(e))
                bad[s] = s
                arr = None
            last_s, last_t = s, t
        return damaged, lost


def _merge_damage(damaged, lost, res):
    d, lo = res
    for k, v in d.items():
        damaged.setdefault(k, v)
    for k, v in lo.items():
        lost.setdefault(k, set()).update(v)
