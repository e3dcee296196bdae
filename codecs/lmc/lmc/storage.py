"""lmc.storage: how lmc writes files, once for every writer (the archive, the DCP writer, the format writers).

One atomic write (:class:`AtomicFile`, :func:`atomic_file`, :func:`atomic_write`): the bytes go to a temporary
name in the target's folder, are flushed and fsynced, renamed onto the target, and the folder is fsynced, so
the target is the old file or the whole new one, also after a power loss; on an error the temporary file is
removed.  ``sync=False`` keeps the rename and drops both fsyncs (the DCP writer's ``sync_files=False``).

Where the files of an archive or of an LMC DCP checkpoint live: a local folder, or an fsspec URL (``s3://``,
``gs://``, ``memory://``, ``file://``...).

Both give the same few operations on the names inside one folder (an archive's manifest, segments and lock; a
DCP checkpoint's metadata and data files). What differs is how a write becomes visible, because object stores
have no rename:

- **local**: a segment is written to ``.tmp-<name>``, fsynced and renamed; the manifest is replaced by an
  fsynced temporary file and a rename, and the folder is fsynced; writers take an ``flock`` on ``.lock``.
- **URL**: a file is streamed to its final name (the archive's segments and the DCP writer's data files get
  names no committed state uses); an object store shows an object only once its upload completes (one PUT, or
  a multipart upload's completion), so a killed writer leaves no file, or a whole one that nothing names (the
  next writer deletes it). A manifest or DCP metadata file is replaced by one PUT of the whole object, which
  readers see entirely or not at all: that PUT is the commit point, as the rename is locally. There is no
  lock: one writer per archive or checkpoint folder at a time (readers are safe).
"""
import contextlib
import os
import posixpath
import re
import secrets
import shutil

URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
TMP_PREFIX = ".tmp-"


class StorageError(Exception):
    """A folder or URL that cannot be used (each user passes its own error class: the archive's ArchiveError)."""


def is_url(path):
    return bool(URL_RE.match(str(path)))


def fsync_dir(path):
    """Make a rename or a new file in the folder ``path`` durable (a no-op where folders cannot be fsynced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


class AtomicFile:
    """A binary file written under a temporary name beside ``path`` and renamed onto it at :meth:`commit`
    (flushed, fsynced, renamed, its folder fsynced; without the fsyncs for ``sync=False``); :meth:`abort`
    removes it.  ``tmp``: the temporary file's name in the folder (default ``.<name>.tmp-<random>``)."""

    def __init__(self, path, *, sync=True, tmp=None):
        self.folder, base = os.path.split(os.path.abspath(os.fspath(path)))
        self.path, self.sync = os.path.join(self.folder, base), sync
        self.tmp = os.path.join(self.folder, tmp if tmp is not None else f".{base}.tmp-{secrets.token_hex(6)}")
        self.f = open(self.tmp, "wb")

    def write(self, data):
        return self.f.write(data)

    def tell(self):
        return self.f.tell()

    def commit(self):
        try:
            self.f.flush()
            if self.sync:
                os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        if self.sync:  # the rename itself reaches the disk only with its folder
            fsync_dir(self.folder)

    def abort(self):
        with contextlib.suppress(OSError):
            self.f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


@contextlib.contextmanager
def atomic_file(path, *, sync=True, tmp=None):
    """:class:`AtomicFile` as a block: yields the open file; committed when the block ends without an error,
    aborted (the temporary file removed, the target untouched) when it raises."""
    w = AtomicFile(path, sync=sync, tmp=tmp)
    try:
        yield w.f
    except BaseException:
        w.abort()
        raise
    w.commit()


def atomic_write(path, data, *, sync=True):
    """``data`` (bytes) written to ``path`` atomically and durably (:class:`AtomicFile`)."""
    with atomic_file(path, sync=sync) as f:
        f.write(data)


def install_dir(tmp, final, *, sync=True):
    """Move a fully written folder ``tmp`` into place at ``final`` (an older one there is replaced only after
    the new one is complete).  ``sync``: every file and folder under ``tmp`` is fsynced before the rename and
    the parent folder after it, as :class:`AtomicFile` does for one file."""
    if sync:
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                p = os.path.join(root, name)
                if not os.path.islink(p):
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            fsync_dir(root)
    old = None
    if os.path.lexists(final):
        d, b = os.path.split(final)
        old = os.path.join(d, f".{b}.old-{secrets.token_hex(6)}")
        os.replace(final, old)
    os.replace(tmp, final)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(final)))
    if old:
        remove(old)


def remove(path):
    """Remove a file or folder if it is there; errors are ignored."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
    except OSError:
        pass


def join(root, rel):
    """``rel`` (a relative path, may go up with ``..``) resolved against the folder ``root`` (a path or URL)."""
    if is_url(root):
        scheme, rest = str(root).split("://", 1)
        return f"{scheme}://{posixpath.normpath(posixpath.join(rest.rstrip('/'), rel))}"
    return os.path.normpath(os.path.join(os.fspath(root), rel))


def relpath(path, start):
    """``path`` relative to the folder ``start`` (both paths, or both URLs of one scheme and bucket)."""
    if is_url(path):
        return posixpath.relpath(str(path).split("://", 1)[1], str(start).split("://", 1)[1])
    return os.path.relpath(os.path.abspath(path), os.path.abspath(start))


def canonical(path):
    """One name per folder, to compare two: the real path, or the URL without a trailing slash."""
    return str(path).rstrip("/") if is_url(path) else os.path.realpath(path)


def parent(path):
    if is_url(path):
        scheme, rest = str(path).rstrip("/").split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest)}"
    return os.path.dirname(os.path.abspath(path))


class Local:
    url = False

    def __init__(self, root, error=StorageError):
        self.root = os.fspath(root)
        self.error = error

    def where(self, name):
        return os.path.join(self.root, name)

    def is_dir(self):
        return os.path.isdir(self.root)

    def makedirs(self):
        os.makedirs(self.root, exist_ok=True)

    def listdir(self):
        return os.listdir(self.root)

    def isfile(self, name):
        return os.path.isfile(self.where(name))

    def read(self, name, limit):
        """The whole file, None if it does not exist; the error class beyond `limit` bytes."""
        path = self.where(name)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise self.error(f"{name}: too large")
                return f.read(size + 1)  # (read(n) allocates n bytes up front)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise self.error(f"cannot read {path}: a directory") from None
        except OSError as e:
            raise self.error(f"cannot read {path}: {e.strerror}") from None

    def put(self, name, data, sync=True):
        """Replace `name` with `data` atomically (and durably: `sync`)."""
        with atomic_file(self.where(name), tmp=TMP_PREFIX + secrets.token_hex(6), sync=sync) as f:
            f.write(data)

    def size(self, name):
        return os.path.getsize(self.where(name))

    def mtime(self, name):
        return os.path.getmtime(self.where(name))

    def remove(self, name):
        with contextlib.suppress(OSError):
            os.unlink(self.where(name))

    def rename(self, a, b):
        os.replace(self.where(a), self.where(b))

    def open_read(self, name):
        return open(self.where(name), "rb")

    def open_write(self, name, sync=True):
        """A writer whose file appears under `name`, whole, at ``commit()`` (``abort()``: never)."""
        return AtomicFile(self.where(name), sync=sync, tmp=TMP_PREFIX + name)

    def rmtree(self):
        shutil.rmtree(self.root)

    @contextlib.contextmanager
    def lock(self):
        fd = os.open(self.where(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                import fcntl
                fcntl.flock(fd, fcntl.LOCK_EX)
            except ImportError:  # pragma: no cover - non-POSIX
                pass
            yield
        finally:
            os.close(fd)


class Remote:
    """An archive under an fsspec URL.  Credentials and endpoints come from the environment as the
    filesystem reads them (for S3: AWS_* variables, AWS_ENDPOINT_URL for a non-AWS endpoint)."""
    url = True

    def __init__(self, url, error=StorageError):
        self.error = error
        try:
            import fsspec
        except ImportError:
            raise error(f"{url}: a URL needs fsspec (pip install \"lmc[remote]\", "
                               "and s3fs or gcsfs for s3:// or gs://)") from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(str(url), **_bounded_retries(fsspec, str(url)))
        except (ImportError, ValueError) as e:
            raise error(f"{url}: {e}") from None
        self.root = self.root.rstrip("/")
        self.url_root = str(url).rstrip("/")

    def where(self, name):
        return f"{self.root}/{name}"

    def is_dir(self):
        self._fresh(self.root)
        try:
            return self.fs.isdir(self.root)
        except OSError:
            return False

    def makedirs(self):
        with contextlib.suppress(FileExistsError):
            self.fs.makedirs(self.root, exist_ok=True)

    def _fresh(self, path):
        """Forget what the filesystem cached of path (another process may have replaced it)."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def listdir(self):
        self._fresh(self.root)
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []

    def isfile(self, name):
        self._fresh(self.where(name))
        try:
            return self.fs.isfile(self.where(name))
        except OSError:
            return False

    def read(self, name, limit):
        self._fresh(self.where(name))
        try:
            if self.fs.size(self.where(name)) > limit:
                raise self.error(f"{name}: too large")
            return self.fs.cat_file(self.where(name))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self.error(f"cannot read {self.url_root}/{name}: {e}") from None

    def put(self, name, data, sync=True):
        self.fs.pipe_file(self.where(name), bytes(data))

    def size(self, name):
        return self.fs.size(self.where(name))

    def mtime(self, name):
        try:
            return self.fs.modified(self.where(name)).timestamp()
        except (NotImplementedError, AttributeError, OSError):
            return 0.0

    def remove(self, name):
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.rm_file(self.where(name))

    def rename(self, a, b):
        self.fs.mv(self.where(a), self.where(b))

    def open_read(self, name):
        return self.fs.open(self.where(name), "rb")

    def open_write(self, name, sync=True):
        return _RemoteWriter(self, name)

    def rmtree(self):
        self._fresh(self.root)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.root, recursive=True)

    @contextlib.contextmanager
    def lock(self):
        yield  # object stores: one writer at a time (ARCHIVE.md)


class _RemoteWriter:
    def __init__(self, b, name):
        self.b, self.name = b, name
        self.f = b.fs.open(b.where(name), "wb")

    def write(self, data):
        self.f.write(data)

    def tell(self):
        return self.f.tell()

    def commit(self):
        self.f.close()  # the upload completes here: the object appears whole

    def abort(self):
        """Never raises (a caller aborts several writers in turn): with the endpoint gone, the removal of a
        partial object (there is none: an upload not completed shows nothing) fails too."""
        _discard(self.f)
        with contextlib.suppress(Exception):
            self.b.remove(self.name)


def _discard(f):
    """Throw away an unfinished fsspec write without committing it, now or later: an fsspec buffered file
    that is not closed commits what it holds when it is closed, and its ``__del__`` closes it (at interpreter
    exit too: with the endpoint gone, an upload retried from there never ends). So: abort its multipart
    upload where it has one (s3fs's ``discard``; a failure there, the endpoint being gone, is ignored), then
    mark it closed, which ``close`` and ``__del__`` then take as nothing left to do."""
    discard = getattr(f, "discard", None)
    if discard is not None:
        with contextlib.suppress(Exception):
            discard()
    try:
        import fsspec.spec
        buffered = isinstance(f, fsspec.spec.AbstractBufferedFile)
    except ImportError:  # pragma: no cover
        buffered = False
    if buffered:
        f.buffer = None
        f.closed = True  # (AbstractBufferedFile's close() and __del__ return at once when closed)
        return
    with contextlib.suppress(Exception):
        f.close()


# S3 client settings where the user set none (fsspec's config for "s3", AWS_MAX_ATTEMPTS / AWS_RETRY_MODE):
# botocore's attempts and timeouts bounded, so a dead endpoint fails a command in seconds, not never
S3_CONFIG = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 3, "mode": "standard"}}


def _bounded_retries(fsspec, url):
    """url_to_fs keyword arguments for ``url``: for s3:// the S3 client's config_kwargs with S3_CONFIG's
    entries the user did not set."""
    proto = url.split("://", 1)[0].lower()
    if proto not in ("s3", "s3a"):
        return {}
    user = {}
    for p in (proto, "s3"):
        user = dict((fsspec.config.conf.get(p) or {}).get("config_kwargs") or {})
        if user:
            break
    out = dict(user)
    for k, v in S3_CONFIG.items():
        if k == "retries" and (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
            continue
        out.setdefault(k, v)
    return {"config_kwargs": out}


def backend(root, error=StorageError):
    """The folder or URL ``root``; its failures raise ``error``."""
    return Remote(root, error) if is_url(root) else Local(root, error)
