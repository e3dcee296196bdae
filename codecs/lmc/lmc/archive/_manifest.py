"""The manifest of an lmc archive (ARCHIVE.md): its constants, its schema check, reading it and replacing it
atomically (lmc.storage: a local folder or an fsspec URL), the writer lock, the clean-up of interrupted
writes; ArchiveError and the checksums (crc32, canonical JSON) every part of the archive uses.  The segment
files: ``_segments``."""
import functools
import json
import re
import zlib

from ..formats.fileio import strict_json
from ..storage import TMP_PREFIX, backend


class ArchiveError(Exception):
    """A damaged or unusable archive, or a request it cannot serve."""


MANIFEST = "lmc-archive.json"
LOCK = ".lock"
FORMAT = "lmc-archive"
VERSION = 3           # written; versions 1 and 2 (CRC-32 sections, SHA-256 checksums) are read too
VERSIONS = (1, 2, 3)
SEG_RE = re.compile(r"^seg-(\d{12})-([0-9a-f]{8})\.lmca$")
MAX_MANIFEST = 1 << 28


def crc32(data):
    return zlib.crc32(data) & 0xFFFFFFFF


def canon(obj):
    """Canonical JSON bytes (checksummed form)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def load_json(data, what):
    """Parse untrusted JSON (no NaN/Infinity, no duplicate keys)."""
    try:
        return strict_json(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ArchiveError(f"{what}: invalid JSON ({e})") from None


@functools.lru_cache(maxsize=64)
def store(root):
    """The backend of the archive at root (a folder or a URL)."""
    return backend(root, ArchiveError)


# ---------------------------------------------------------------- manifest

def _check_manifest(m):
    def need(cond, what):
        if not cond:
            raise ArchiveError(f"manifest: {what}")
    need(isinstance(m, dict), "not an object")
    need(m.get("format") == FORMAT, "not an lmc archive manifest")
    need(m.get("version") in VERSIONS, f"unsupported version {m.get('version')!r}")
    k = m.get("keyframe_every")
    need(type(k) is int and 1 <= k <= 1 << 20, "bad keyframe_every")
    steps = m.get("steps")
    need(isinstance(steps, list), "bad steps")
    last = -1
    seen = {}
    for e in steps:
        need(isinstance(e, dict), "bad step entry")
        s = e.get("step")
        need(type(s) is int and s > last, "steps not increasing")
        last = s
        need(isinstance(e.get("segment"), str) and SEG_RE.match(e["segment"]), "bad segment name")
        for f in ("size", "index_crc", "bytes_in", "depth"):
            need(type(e.get(f)) is int and e[f] >= 0, f"step {s}: bad {f}")
        need(type(e.get("keyframe")) is bool, f"step {s}: bad keyframe")
        need("opaque" not in e or (type(e["opaque"]) is int and e["opaque"] >= 0), f"step {s}: bad opaque")
        need("name" not in e or (isinstance(e["name"], str) and e["name"] not in ("", ".", "..")
                                 and "/" not in e["name"] and "\\" not in e["name"] and "\x00" not in e["name"]),
             f"step {s}: bad name")
        seen[s] = e
    for e in steps:  # dependencies may point back (forward coding) or ahead (a step coded against the next)
        s, dep, prev = e["step"], e.get("depends_on"), e.get("prev")
        need(dep is None or (type(dep) is int and dep in seen), f"step {s}: bad depends_on")
        need(prev is None or (type(prev) is int and prev in seen and prev != s), f"step {s}: bad prev")
        need(dep is None or dep == prev, f"step {s}: depends_on is not its prev")
        c, n = dep, 0
        while c is not None:
            need(c != s and n <= len(steps), f"step {s}: dependency cycle")
            c, n = seen[c].get("depends_on"), n + 1
        need("time" not in e or type(e["time"]) is int, f"step {s}: bad time")
        # version 3: a step coded alone that a background add is to re-code against a newer step
        need("recode" not in e or (type(e["recode"]) is int and e["recode"] in seen and e["recode"] > s
                                   and dep is None), f"step {s}: bad recode")
    return m


def read_manifest(root):
    """The manifest of the archive at root, or None if there is none."""
    data = store(root).read(MANIFEST, MAX_MANIFEST)
    if data is None:
        return None
    if len(data) > MAX_MANIFEST:
        raise ArchiveError("manifest: too large")
    doc = load_json(data, "manifest")
    if not isinstance(doc, dict) or set(doc) != {"manifest", "crc32"}:
        raise ArchiveError("manifest: damaged (unexpected layout)")
    body = doc["manifest"]
    try:
        ok = crc32(canon(body)) == doc["crc32"]
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ArchiveError("manifest: damaged (checksum mismatch)")
    return _check_manifest(body)


def write_manifest(root, body):
    _check_manifest(body)
    store(root).put(MANIFEST, canon({"manifest": body, "crc32": crc32(canon(body))}) + b"\n")


def new_manifest(keyframe_every):
    return {"format": FORMAT, "version": VERSION, "keyframe_every": int(keyframe_every),
            "steps": []}


class Lock:
    """Exclusive writer lock (local: flock on ROOT/.lock; URL: none, one writer at a time);
    readers do not lock."""

    def __init__(self, root):
        self.cm = store(root).lock()

    def __enter__(self):
        self.cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def cleanup(root, manifest):
    """Remove leftovers of interrupted writes (unreferenced segments and
    temporary files).  Call with the lock held."""
    b = store(root)
    used = {e["segment"] for e in manifest["steps"]}
    for name in b.listdir():
        if name.startswith(TMP_PREFIX) or (SEG_RE.match(name) and name not in used):
            b.remove(name)
