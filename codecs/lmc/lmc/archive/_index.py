"""The index of a step (ARCHIVE.md): its schema check (``check_index``), the tensors and sections it lists,
the dtype tables in the forms it records, and the strict safetensors header parse the add needs."""
import re

from ..formats.dtypes import CODE_DTYPES, DTYPES, code_name
from ..formats.errors import SourceError
from ..formats.safetensors import parse_header
from ._manifest import ArchiveError

# the one dtype table (lmc.formats.dtypes), in the forms the archive index uses:
# numpy dtypes lmc codes, by name (a tensor entry's "np")
NP_DTYPES = dict(CODE_DTYPES)
# safetensors dtype -> (item size, numpy coding dtype name); BOOL is coded as bytes
ST_DTYPES = {d.safetensors: (d.itemsize, code_name(d.code)) for d in DTYPES if d.safetensors != "C64"}
# torch dtype name -> numpy coding dtype name (others are stored as bytes)
TORCH_NP = {d.name: code_name(d.code) for d in DTYPES}


def parse_safetensors(f, size):
    """lmc.formats.safetensors.parse_header, or None when the file is not a well-formed safetensors file (the
    archive then keeps it as plain bytes)."""
    try:
        return parse_header(f, size)
    except SourceError:
        return None


def layout(size, header_len, tensors):
    """Cover [0, size) with ("raw", a, b) and ("tensor", t) regions in file order."""
    regions = [("raw", 0, header_len)]
    pos = header_len
    for t in tensors:
        b, e = t[3], t[4]
        if b > pos:
            regions.append(("raw", pos, b))
        if e > b:
            if t[1] in ST_DTYPES:
                regions.append(("tensor", t))
            else:
                regions.append(("raw", b, e))
        pos = max(pos, e)
    if size > pos:
        regions.append(("raw", pos, size))
    return regions


# ---------------------------------------------------------------- index schema

_SAFE_PATH = re.compile(r"^[^/\x00]+(/[^/\x00]+)*$")
_HEX = re.compile(r"^[0-9a-f]+$")


def safe_relpath(p):
    """True for a relative path without '.'/'..' components (never escapes)."""
    if not isinstance(p, str) or not _SAFE_PATH.match(p) or "\\" in p:
        return False
    return all(c not in (".", "..") for c in p.split("/"))


def _is_sec(s, v3):
    """[offset, length] (version 3) or [offset, length, crc32] (versions 1-2)."""
    return (isinstance(s, list) and len(s) == (2 if v3 else 3) and all(type(x) is int and x >= 0 for x in s)
            and (v3 or s[2] <= 0xFFFFFFFF))


def _is_digest(x, n):
    return isinstance(x, str) and len(x) == n and bool(_HEX.match(x))


def _is_int(x, lo=0):
    return type(x) is int and x >= lo


def check_index(idx, step):
    """Validate a step index's structure (the data it points to is checked
    when read).  Raises ArchiveError."""
    def need(cond, what):
        if not cond:
            raise ArchiveError(f"step {step}: malformed index ({what})")

    need(isinstance(idx, dict), "top")
    # version 3: "version" in the index; sections [offset, length]; each chunk and tensor carries the xxh3-128
    # of its original bytes ("xxh"); files carry mode and mtime and no SHA-256
    v3 = idx.get("version") == 3
    need("version" not in idx or v3, "version")
    digest, fmeta = ("xxh", {"mode", "mtime"}) if v3 else ("sha", {"sha256"})

    def chunks(cs, what):
        need(isinstance(cs, list), what)
        for c in cs:
            need(isinstance(c, dict) and set(c) == ({"enc", "n", "sec", "xxh"} if v3 else {"enc", "n", "sec"}),
                 what)
            need(c["enc"] in ("raw", "zlib") and _is_int(c["n"]) and _is_sec(c["sec"], v3), what)
            need(c["enc"] != "raw" or c["n"] == c["sec"][1], what)
            need(not v3 or _is_digest(c["xxh"], 32), what)

    def tensor(t, kind):
        need(isinstance(t, dict) and set(t) == {"key", "dtype", "shape", "n", "np", "enc",
                                                "ref", "sec", digest}, "tensor")
        need(isinstance(t["key"], str) and isinstance(t["dtype"], str), "tensor key")
        need(isinstance(t["shape"], list) and len(t["shape"]) <= 64
             and all(_is_int(d) for d in t["shape"]), "tensor shape")
        need(_is_int(t["n"]) and _is_sec(t["sec"], v3) and type(t["ref"]) is bool, "tensor")
        need(_is_digest(t[digest], 32), digest)
        if t["enc"] == "lmc":
            need(t["np"] in NP_DTYPES and t["n"] % NP_DTYPES[t["np"]].itemsize == 0, "np")
        else:
            need(t["enc"] in ("raw", "zlib") and t["np"] is None and not t["ref"], "enc")
            need(t["enc"] != "raw" or t["n"] == t["sec"][1], "raw size")

    need(set(idx) - {"name", "time", "version", "keyframe_every"} == {"step", "prev", "keyframe", "files"}, "top")
    # version 2: the step folder's name and time, so `repair` can rebuild the manifest from segments
    need("name" not in idx or (isinstance(idx["name"], str) and safe_relpath(idx["name"])
                               and "/" not in idx["name"]), "name")
    need("time" not in idx or type(idx["time"]) is int, "time")
    # the archive's keyframe_every when the step was added (optional), so `repair` can restore it
    need("keyframe_every" not in idx or (type(idx["keyframe_every"]) is int
                                         and 1 <= idx["keyframe_every"] <= 1 << 20), "keyframe_every")
    need(idx["step"] == step, "step number")
    # prev: the step its tensors are coded against: older (version 1, and steps added forward), or
    # newer (version 2 codes a step against the next one once that is added)
    need(idx["prev"] is None or (type(idx["prev"]) is int and idx["prev"] != step and idx["prev"] >= 0),
         "prev")
    need(type(idx["keyframe"]) is bool and isinstance(idx["files"], list), "files")
    paths = set()
    for fe in idx["files"]:
        need(isinstance(fe, dict) and safe_relpath(fe.get("path")), "file path")
        need(fe["path"] not in paths, "duplicate file")
        paths.add(fe["path"])
        need(_is_int(fe.get("size")), "file size")
        # version 2: "ref_path" (the file of step prev its tensors refer to, where its path differs) and
        # "why" (a bytes file: why it was not understood) are optional
        fe = dict(fe)
        need("ref_path" not in fe or safe_relpath(fe.pop("ref_path")), "ref_path")
        kind = fe.get("kind")
        if kind == "bytes":
            need(isinstance(fe.pop("why", ""), str), "why")
            need(set(fe) == {"path", "kind", "size", "chunks"} | fmeta, "bytes file")
            chunks(fe["chunks"], "chunks")
        elif kind in ("safetensors", "torchzip"):
            need(set(fe) == {"path", "kind", "size", "parts"} | fmeta, f"{kind} file")
            need(isinstance(fe["parts"], list), "parts")
            keys = set()
            for p in fe["parts"]:
                need(isinstance(p, dict) and p.get("t") in ("raw", "tensor"), "part")
                if p["t"] == "raw":
                    need(set(p) == {"t", "chunks"}, "raw part")
                    chunks(p["chunks"], "raw part")
                else:
                    t = dict(p)
                    del t["t"]
                    tensor(t, kind)
                    need(t["key"] not in keys, "duplicate tensor")
                    keys.add(t["key"])
        elif kind == "torch":
            need(set(fe) == {"path", "kind", "size", "skeleton", "tensors"} | fmeta, "torch file")
            chunks(fe["skeleton"], "skeleton")
            need(isinstance(fe["tensors"], list), "tensors")
            keys = set()
            for t in fe["tensors"]:
                tensor(t, kind)
                need(t["key"] not in keys, "duplicate tensor")
                keys.add(t["key"])
        else:
            need(False, "file kind")
        if v3:
            need(_is_int(fe["mode"]) and fe["mode"] <= 0o7777 and type(fe["mtime"]) is int, "mode/mtime")
        else:
            sha = fe["sha256"]
            need(sha is None if kind == "torch" else _is_digest(sha, 64), "sha256")
        need(sum(c["n"] for _, _, c in all_sections(fe) if c is not None)
             + sum(t["n"] for t in file_tensors(fe)) == fe["size"] or kind == "torch", "file size")
    need(not idx["keyframe"] or not any(t["ref"] for t in iter_tensors(idx)), "keyframe with refs")
    need(idx["prev"] is not None or not any(t["ref"] for t in iter_tensors(idx)), "refs without prev")
    return idx


def file_tensors(fe):
    if fe["kind"] in ("safetensors", "torchzip"):
        return [p for p in fe["parts"] if p["t"] == "tensor"]
    if fe["kind"] == "torch":
        return fe["tensors"]
    return []


def iter_tensors(idx):
    for fe in idx["files"]:
        yield from file_tensors(fe)


def all_sections(fe):
    """(what, section, chunk-or-None) of every section of a file entry."""
    cs = []
    if fe["kind"] == "bytes":
        cs = fe["chunks"]
    elif fe["kind"] == "torch":
        cs = fe["skeleton"]
    for c in cs:
        yield "data", c["sec"], c
    for p in fe.get("parts", []):
        if p["t"] == "raw":
            for c in p["chunks"]:
                yield "header/padding", c["sec"], c
    for t in file_tensors(fe):
        yield f"tensor {t['key']}", t["sec"], None
