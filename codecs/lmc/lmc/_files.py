"""Crash-safe file writing shared by the archive and the DCP writer."""

from __future__ import annotations

import contextlib
import os
import secrets


@contextlib.contextmanager
def atomic_file(path: str, *, sync: bool = True, prefix: str | None = None):
    """Yield a binary file open on a temporary name beside ``path``; when the block ends without an error the
    file is flushed, fsynced (``sync``) and renamed onto ``path``, and the folder is fsynced (``sync``), so
    ``path`` is either the old file or the whole new one, also after a power loss. On any error the temporary file is removed and the error propagates."""
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, (prefix if prefix is not None else f".{base}.tmp-") + secrets.token_hex(6))
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync:  # the rename itself reaches the disk only with its folder
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError:  # pragma: no cover - file systems that cannot fsync a folder
                pass
            finally:
                os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
