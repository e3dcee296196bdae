"""torch's zip files, read as regions of bytes: where each tensor storage lies and what dtype it holds.

``torch.save`` writes a zip archive (stored, not deflated; storages 64-byte aligned) holding ``<prefix>/data.pkl``
(the pickled structure), one member ``<prefix>/data/<key>`` per storage with its raw bytes, and a few small
members. A DCP ``.distcp`` shard written by ``FileSystemWriter`` is several such archives end to end, one per
write item (tensors and pickled bytes items alike). DeepSpeed's ``*_model_states.pt`` / ``*_optim_states.pt``,
the Trainer's ``optimizer.pt`` and ``pytorch_model.bin`` are single archives.

:func:`scan` finds the archives from the end of the file backwards (each one's end-of-central-directory record
says where its directory, and so its start, lies; torch writes sizes only in the directory, the local headers
carry data descriptors), and for each storage member the dtype and element count its pickle gives it. The pickle
is never unpickled: :func:`pickle_storages` walks its opcodes with :mod:`pickletools` and reads the persistent
ids ``("storage", <torch.XStorage global>, key, location, numel)`` that torch writes for every storage. So a file
whose pickle names classes nobody should load (DeepSpeed's, an ``argparse.Namespace``, anything) still has its
tensors found, and nothing in it ever runs.

Everything found is checked against everything else (offsets inside the file and inside their archive, members
not overlapping, the storage's byte size equal to numel x item size); whatever does not fit stays plain bytes.
A wrong guess can therefore cost ratio but never bytes: a caller stores the regions between tensors verbatim and
the tensors' bytes exactly, and restores the same file.
"""
from __future__ import annotations

import pickletools
import struct
from dataclasses import dataclass

from .dtypes import BY_STORAGE, DType

MAX_PICKLE = 256 << 20      # a data.pkl larger than this is not walked (its storages stay bytes)
MAX_MEMBERS = 1 << 22       # members per archive
MAX_ARCHIVES = 1 << 22      # archives per file

_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_LOC64 = b"PK\x06\x07"
_CEN = b"PK\x01\x02"
_LOC = b"PK\x03\x04"


@dataclass(frozen=True)
class Storage:
    """One tensor storage inside a file: ``key`` is ``<archive ordinal>/<member name>`` (stable from one save of
    the same structure to the next), bytes ``[begin, end)`` of the file."""
    key: str
    dtype: DType
    numel: int
    begin: int
    end: int


@dataclass
class Scan:
    """What :func:`scan` found: the storages (sorted by offset), the number of archives, and ``start``, where
    the first archive begins (bytes before it were not understood; 0 when the whole file was)."""
    storages: list
    archives: int
    start: int
    note: str = ""


class _Reader:
    def __init__(self, f, size):
        self.f, self.size = f, size

    def at(self, off, n):
        if off < 0 or n < 0 or off + n > self.size:
            raise ValueError("out of range")
        self.f.seek(off)
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("short read")
        return b


def _zip64_extra(extra, need):
    """The zip64 extended-information values (in order) that ``need`` names, from a member's extra field."""
    pos = 0
    while pos + 4 <= len(extra):
        hid, ln = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + ln]
        if hid == 1:
            vals, o = [], 0
            for _ in range(need):
                if o + 8 > len(body):
                    raise ValueError("short zip64 extra")
                vals.append(struct.unpack_from("<Q", body, o)[0])
                o += 8
            return vals
        pos += 4 + ln
    raise ValueError("missing zip64 extra")


def _one_archive(r, end):
    """Parse the zip archive that ends at ``end``. Returns (start, [(name, begin, size, method)])."""
    if end < 22:
        raise ValueError("too short")
    eocd = end - 22
    rec = r.at(eocd, 22)
    if rec[:4] != _EOCD:
        raise ValueError("no end record")
    _, disk, cdisk, n_here, n_all, cd_size, cd_off, clen = struct.unpack("<IHHHHIIH", rec)
    if clen != 0 or disk not in (0, 0xFFFF) or cdisk not in (0, 0xFFFF) or n_here != n_all:
        raise ValueError("not a single-disk archive")
    tail = eocd
    wide = 0xFFFFFFFF in (cd_size, cd_off) or n_all == 0xFFFF
    loc = r.at(eocd - 20, 20) if eocd >= 20 + 56 else b""
    if loc[:4] == _LOC64:  # torch writes the zip64 records whether or not it needs them
        tail = eocd - 20 - 56
        rec64 = r.at(tail, 56)
        if rec64[:4] != _EOCD64 or struct.unpack_from("<Q", rec64, 4)[0] != 44:
            raise ValueError("bad zip64 end record")
        n64, = struct.unpack_from("<Q", rec64, 32)
        s64, o64 = struct.unpack_from("<QQ", rec64, 40)
        if not wide and (n64, s64, o64) != (n_all, cd_size, cd_off):
            raise ValueError("zip64 end record disagrees")
        n_all, cd_size, cd_off = n64, s64, o64
    elif wide:
        raise ValueError("no zip64 locator")
    if n_all > MAX_MEMBERS:
        raise ValueError("too many members")
    cd_pos = tail - cd_size
    start = cd_pos - cd_off
    if cd_pos < 0 or start < 0:
        raise ValueError("directory out of range")
    cd = r.at(cd_pos, cd_size)
    members, p = [], 0
    for _ in range(n_all):
        if cd[p:p + 4] != _CEN or p + 46 > len(cd):
            raise ValueError("bad directory entry")
        (method, csize, usize, nlen, elen, klen) = (struct.unpack_from("<H", cd, p + 10)[0],
                                                   *struct.unpack_from("<II", cd, p + 20),
                                                   *struct.unpack_from("<HHH", cd, p + 28))
        lho, = struct.unpack_from("<I", cd, p + 42)
        name = cd[p + 46:p + 46 + nlen]
        extra = cd[p + 46 + nlen:p + 46 + nlen + elen]
        if len(name) != nlen or len(extra) != elen:
            raise ValueError("bad directory entry")
        wide = [v == 0xFFFFFFFF for v in (usize, csize, lho)]
        if any(wide):
            vals = iter(_zip64_extra(extra, sum(wide)))
            usize = next(vals) if wide[0] else usize
            csize = next(vals) if wide[1] else csize
            lho = next(vals) if wide[2] else lho
        p += 46 + nlen + elen + klen
        loc = r.at(start + lho, 30)
        if loc[:4] != _LOC:
            raise ValueError("bad local header")
        lnlen, lelen = struct.unpack_from("<HH", loc, 26)
        begin = start + lho + 30 + lnlen + lelen
        if begin + csize > cd_pos or (method == 0 and csize != usize):
            raise ValueError("member out of range")
        members.append((name.decode("utf-8", "replace"), begin, csize, method))
    if p != len(cd):
        raise ValueError("directory size mismatch")
    return start, members


_STR_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING", "BINSTRING",
            "STRING"}
_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
_MARK_CONSUMERS = {"LIST", "DICT", "SETITEMS", "APPENDS", "ADDITEMS", "FROZENSET", "OBJ", "INST", "POP_MARK"}
_OPAQUE = object()


class _Global(str):
    """A ``GLOBAL`` opcode's "module name" argument (a str subclass, to tell it from a pickled string)."""


def pickle_storages(data: bytes) -> dict:
    """``{storage key: (storage class name, numel)}`` for the persistent ids of a torch pickle, found by walking
    its opcodes (nothing is unpickled). A key given two different answers maps to None."""
    memo, frames, out = {}, [[]], {}
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        top = frames[-1]
        if name == "MARK":
            frames.append([])
        elif name == "GLOBAL":
            top.append(_Global(arg))
        elif name == "STACK_GLOBAL":
            if len(top) >= 2 and all(type(v) is str for v in top[-2:]):
                g = _Global(f"{top[-2]} {top[-1]}")
                del top[-2:]
                top.append(g)
            else:
                top.append(_OPAQUE)
        elif name in _STR_OPS or name in _INT_OPS:
            top.append(arg)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = top[-1] if top else _OPAQUE
        elif name == "MEMOIZE":
            memo[len(memo)] = top[-1] if top else _OPAQUE
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            top.append(memo.get(arg, _OPAQUE))
        elif name == "TUPLE":
            items = frames.pop() if len(frames) > 1 else []
            frames[-1].append(tuple(items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = tuple(top[-n:]) if len(top) >= n else (_OPAQUE,) * n
            del top[-n:]
            top.append(items)
        elif name == "BINPERSID":
            pid = top.pop() if top else None
            if (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                    and isinstance(pid[1], _Global) and type(pid[2]) is str and type(pid[4]) is int):
                mod, _, cls = pid[1].partition(" ")
                got = (cls, pid[4]) if mod == "torch" else None
                if out.get(pid[2], got) != got:
                    got = None
                out[pid[2]] = got
            top.append(_OPAQUE)
        elif name in _MARK_CONSUMERS:
            if len(frames) > 1:
                frames.pop()
            if name in ("LIST", "DICT", "FROZENSET", "OBJ", "INST"):
                frames[-1].append(_OPAQUE)
        elif name == "STOP":
            break
        else:  # any other opcode: what it leaves on top is nothing we read
            top.append(_OPAQUE)
        if len(top) > 64:  # only the last few values matter; keep the walk's memory flat
            del top[:-16]
    return out


def scan(f, size) -> Scan | None:
    """The tensor storages of a file made of torch zip archives end to end (one: a ``.pt``; several: a
    ``.distcp``), or None if its end is not such an archive. ``f``: a binary file object of ``size`` bytes."""
    r = _Reader(f, size)
    end, found = size, []
    note = ""
    while end > 0 and len(found) < MAX_ARCHIVES:
        try:
            start, members = _one_archive(r, end)
        except (ValueError, struct.error) as e:
            note = f"bytes before offset {end} are not a torch zip archive ({e})"
            break
        if start >= end:
            break
        found.append((start, members))
        end = start
    if not found:
        return None
    found.reverse()
    storages = []
    for ordinal, (_start, members) in enumerate(found):
        pkl = [m for m in members if m[0].endswith("/data.pkl") or m[0] == "data.pkl"]
        if len(pkl) != 1 or pkl[0][3] != 0 or pkl[0][2] > MAX_PICKLE:
            continue
        prefix = pkl[0][0][:-len("data.pkl")]
        try:
            info = pickle_storages(r.at(pkl[0][1], pkl[0][2]))
        except Exception:  # noqa: BLE001 - a pickle pickletools cannot walk: its storages stay bytes
            continue
        for name, begin, n, method in members:
            if method != 0 or not name.startswith(prefix + "data/"):
                continue
            got = info.get(name[len(prefix) + 5:])
            dt = BY_STORAGE.get(got[0]) if got else None
            if dt is None or got[1] * dt.itemsize != n or n == 0:
                continue
            storages.append(Storage(f"{ordinal}/{name}", dt, got[1], begin, begin + n))
    storages.sort(key=lambda s: s.begin)
    ok, pos = [], 0
    for s in storages:  # members never overlap in a well-formed file; if they do, keep the first
        if s.begin >= pos:
            ok.append(s)
            pos = s.end
    return Scan(ok, len(found), end, note)
