"""Archive.add(..., background=True): the previous step re-coded against the new one behind the call, on a
thread of the process, and a re-code left undone by a kill finished by the next writer (ARCHIVE.md, "add in
the background")."""
import functools
import time

import numpy as np

from ._add import RawSource
from ._index import file_tensors
from ._graph import _may_join, _set_depths
from ..worker import Phases
from ._pipeline import Ordered, piece_threads, workers_for
from ._recoder import _NextRecoder
from ._manifest import ArchiveError, Lock, cleanup, write_manifest
from ._segments import SegmentWriter


class _RecodeBehind:
    """Archive's methods for re-coding a step behind (mixed into Archive)."""

    def wait(self):
        """Wait for a background re-code (add(background=True)) to finish; raise what it raised."""
        bg = getattr(self, "_bg", None)
        if bg is not None:
            bg.join()
            self._bg = None
            err, self._bg_error = self._bg_error, None
            if err is not None:
                raise err

    def _background_recode(self, last_folder, new_folder):
        try:
            with Lock(self.path):
                m = self._manifest()
                self._recode_pending(m, {"last": last_folder, "new": new_folder}, raise_errors=True)
        except BaseException as e:  # (handed to wait(); the archive is as the add left it)
            self._bg_error = e

    def _recode_pending(self, m, folders=None, raise_errors=False):
        """Re-code each step marked "recode": N in the manifest ``m`` against step N and commit the manifest
        (called with the lock held). A step whose re-code cannot be done stays coded alone (its mark is
        dropped); with ``raise_errors`` the error is raised instead, the archive unchanged."""
        folders = folders or {}
        dropped = False
        for e in [e for e in m["steps"] if "recode" in e]:
            target = e["recode"]
            ph = Phases()
            t0 = time.perf_counter()
            try:
                wl = None
                with self._view(m) as view:
                    if target not in view.entries or not _may_join(m, e["step"], target):
                        raise ArchiveError(f"step {e['step']}: cannot be re-coded against step {target}")
                    wl = SegmentWriter(self.path, e["step"], crc=view.index(e["step"]).get("version") != 3)
                    try:
                        tfiles = view.index(target)["files"]
                        rec = _NextRecoder(view, e["step"], wl, folders.get("last"), self.threads,
                                           [fe["path"] for fe in tfiles], prefer=self.prefer)
                        self._feed_recoder(view, target, tfiles, rec, folders.get("new"), ph)
                        idx = rec.finish(target)
                        with ph.time("fsync"):
                            lname = wl.commit(idx)
                    except BaseException:
                        wl.abort()
                        raise
            except (ArchiveError, OSError) as ex:
                if raise_errors:
                    raise
                import warnings
                warnings.warn(f"lmc.archive: {ex}; step {e['step']} stays coded alone", stacklevel=3)
                del e["recode"]
                dropped = True
                continue
            del e["recode"]
            e.update(segment=lname, size=wl.size, index_crc=wl.index_crc, keyframe=idx["keyframe"],
                     prev=idx["prev"], depends_on=idx["prev"])
            _set_depths(m)
            write_manifest(self.path, m)
            cleanup(self.path, m)
            self.last_recode_phases = dict(ph.as_dict(), wall=round(time.perf_counter() - t0, 6))
        if dropped:
            write_manifest(self.path, m)

    def _feed_recoder(self, view, step, files, rec, raw_folder, ph):
        """Hand each tensor of ``step`` (read back from its raw folder where it hashes to the archived checksum,
        else decoded) to the recoder, on the pool."""
        raw = RawSource(raw_folder, slot="read")  # (the recoder reads the older step's into "ref")
        workers = workers_for(self.threads)
        with Ordered(workers) as pool:
            for fe in files:
                for t in file_tensors(fe):
                    if t["enc"] != "lmc":
                        continue
                    pool.submit(functools.partial(self._recoder_job, view, step, fe, t, rec, raw, workers, ph),
                                lambda res: res is not None and rec.put(res), cost=t["n"])

    def _recoder_job(self, view, step, fe, t, rec, raw, workers, ph):
        with ph.time("read"):
            u8 = raw.get(fe["path"], fe["kind"], t["key"], t)
        if u8 is None:
            with ph.time("decode"):
                u8 = view.decode(step, fe["path"], t, threads=piece_threads(workers, self.threads, t["n"]))
                u8 = u8.reshape(-1).view(np.uint8)
        threads = piece_threads(workers, self.threads, u8.nbytes)
        return rec.code(fe["path"], fe["kind"], t, u8, threads, ph)
