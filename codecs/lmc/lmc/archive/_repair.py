"""What `repair` needs besides rebuilding a manifest from segments: whether a readable manifest agrees
with the segments it names (a manifest with a valid checksum can still be wrong), keeping a manifest it
replaces, and the keyframe_every to give a rebuilt manifest."""
import collections

from ._index import check_index, file_tensors
from ._graph import _roots
from ._manifest import MANIFEST, MAX_MANIFEST, SEG_RE, ArchiveError, store
from ._segments import SegmentReader, probe_segment

DAMAGED_MANIFEST = "damaged-" + MANIFEST


def manifest_disagreements(root, m):
    """Lines, one per manifest entry that its segment contradicts: the segment's name is another step's,
    the segment is missing while another segment of the step is there, its footer (intact) gives another
    size or index checksum, or its index (intact) another step, keyframe or dependency.  Damage to a
    segment itself (an unreadable footer or index) is no disagreement: verify reports it."""
    b = store(root)
    names = set(b.listdir())
    out = []
    steps = {e["step"] for e in m["steps"]}
    for e in m["steps"]:
        s, name = e["step"], e["segment"]
        seg_step = int(SEG_RE.match(name).group(1))
        if seg_step != s:
            out.append(f"step {s}: its segment {name} is step {seg_step}'s")
            continue
        if name not in names:
            if any(SEG_RE.match(n) and int(SEG_RE.match(n).group(1)) == s for n in names):
                out.append(f"step {s}: its segment {name} is missing, another segment of step {s} is there")
            continue
        try:
            p = probe_segment(root, name)
        except (ArchiveError, OSError):
            continue
        if (p["size"], p["index_crc"]) != (e["size"], e["index_crc"]):
            out.append(f"step {s}: the manifest's size or index checksum is not its segment {name}'s")
            continue
        try:
            r = SegmentReader(root, e)
            try:
                idx = check_index(r.index, s)
            finally:
                r.close()
        except (ArchiveError, OSError, ValueError):
            continue
        uses = any(t["ref"] for fe in idx["files"] for t in file_tensors(fe))
        dep = idx["prev"] if uses else None
        if dep not in steps and e.get("depends_on") is None:
            dep = None  # (its reference step is lost: a rebuilt manifest says so, and verify reports it)
        # (prune leaves a step's prev in its index once that step is gone; the manifest's prev is then null)
        if idx["keyframe"] != e["keyframe"] or e.get("depends_on") != dep or e.get("prev") not in (None, idx["prev"]):
            out.append(f"step {s}: the manifest's keyframe or dependency is not its segment {name}'s")
    return out


def keep_manifest(root):
    """Copy the manifest about to be replaced to damaged-lmc-archive.json (or -2, -3...: never over an
    earlier one); the name, or None when there is none to keep."""
    b = store(root)
    data = b.read(MANIFEST, MAX_MANIFEST)
    if data is None:
        return None
    names = set(b.listdir())
    name, n = DAMAGED_MANIFEST, 1
    while name in names:
        n += 1
        name = f"damaged-lmc-archive-{n}.json"
    b.put(name, data)
    return name


def rebuilt_keyframe_every(m, recorded, default):
    """(keyframe_every, note or None) for a manifest `m` rebuilt from segments: the value the newest
    segment that records it holds (`recorded`: {step: its index's keyframe_every or None}); where none
    does (segments of lmc before it was recorded), the largest group of steps sharing a keyframe when
    there are several groups (a group is closed at K steps), else the larger of that group and the
    default."""
    steps = sorted(recorded, reverse=True)
    for s in steps:
        if recorded[s] is not None:
            if s == steps[0]:
                return recorded[s], None
            return recorded[s], (f"keyframe_every {recorded[s]}: from step {s}'s segment (newer segments "
                                 "do not record it)")
    groups = collections.Counter(_roots(m).values())
    if not groups:
        return default, None
    big = max(groups.values())
    k = big if len(groups) > 1 else max(big, default)
    return k, (f"keyframe_every {k}: inferred from the archive's chains (its segments do not record it; "
               "pass --keyframe-every to choose)")
