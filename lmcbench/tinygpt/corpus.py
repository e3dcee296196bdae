"""The training corpus: the Python standard library's own source files, a real text corpus present on every
machine, read in sorted path order so every machine gets the same bytes."""

from __future__ import annotations

import functools
import os
import sysconfig

from ..errors import SourceError


@functools.lru_cache(maxsize=2)
def corpus(nbytes: int) -> bytes:
    """The first ``nbytes`` of the standard library's ``.py`` files, in sorted path order (cached: it is
    read again by every :class:`Trainer` and :func:`evaluate`)."""
    root = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        if "site-packages" in dirpath or "test" in os.path.relpath(dirpath, root).split(os.sep)[0:1]:
            continue
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                try:
                    with open(os.path.join(dirpath, fn), "rb") as f:
                        b = f.read()
                except OSError:
                    continue
                parts.append(b)
                total += len(b)
                if total >= nbytes:
                    return b"".join(parts)[:nbytes]
    data = b"".join(parts)
    if len(data) < 100_000:
        raise SourceError(f"{root}: too little Python source for a training corpus ({len(data)} bytes)")
    return data
