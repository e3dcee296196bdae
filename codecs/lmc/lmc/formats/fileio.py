"""Plain file helpers shared by the format readers and writers: checks that name the file in one line, hashes,
JSON read strictly.  Atomic writes are lmc.storage's (re-exported here: ``atomic_write``, ``install_dir``,
``remove``)."""

from __future__ import annotations

import hashlib
import json
import os

from ..storage import atomic_write, install_dir, remove  # noqa: F401 - re-exported
from .errors import SourceError

__all__ = ["strict_json", "one_line", "check_file", "sha256_file", "read_json", "tmp_name", "atomic_write",
           "atomic_json", "install_dir", "remove", "inside"]


def strict_json(data: bytes):
    """Untrusted JSON parsed strictly: UTF-8, no duplicate keys, no NaN/Infinity (ValueError otherwise)."""
    return json.loads(data.decode("utf-8"), object_pairs_hook=_no_dupes, parse_constant=_bad_const)


def _no_dupes(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def _bad_const(name):
    raise ValueError(f"invalid JSON constant {name}")


def one_line(e: BaseException) -> str:
    """An exception's message on one line (its type name when it has none)."""
    return " ".join(str(e).split()) or type(e).__name__


def check_file(path: str) -> int:
    """The size of a regular, non-empty file; otherwise a one-line :class:`SourceError` naming it."""
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise SourceError(f"{path}: not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise SourceError(f"{path}: empty file")
    return size


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise SourceError(f"{path}: missing ({what})") from None
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: cannot read {what} ({one_line(e)})") from None


def tmp_name(path: str, tag: str = "tmp") -> str:
    d, b = os.path.split(path)
    return os.path.join(d, f".{b}.{tag}-{os.getpid()}")


def atomic_json(path: str, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=1) + "\n").encode("utf-8"))


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (symbolic links resolved)."""
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p == f or p.startswith(f.rstrip(os.sep) + os.sep)
