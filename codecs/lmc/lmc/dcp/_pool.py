"""Worker threads for :mod:`lmc.dcp`: items (tensor chunks) are coded and decoded on a pool of threads, a bounded
number in flight, their results taken back in submission order by the calling thread (which alone talks to DCP's
planner). lmc's kernels and the checksum release the GIL, so the workers run in parallel. A save's data files
are :class:`_Lanes`: each worker appends the items it coded to a file of its own. A private module."""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from ..api import _nthreads
from ..worker import drop_scratch

# An item at least this large is coded with all of lmc's threads (its chunks spread over the cores: a large
# tensor would otherwise be the tail of a save); smaller ones with one thread each, the pool spreading the items
BIG_ITEM = 32 << 20
PER_WORKER = 2  # items in flight per worker thread: one being coded, one done or waiting to be written


def _item_threads(threads, nbytes) -> int:
    """lmc threads for coding or decoding one item of ``nbytes`` bytes on a worker thread."""
    return _nthreads(threads) if nbytes >= BIG_ITEM else 1


class _Window:
    """``submit(tag, fn, *args)`` runs ``fn(*args)`` on a worker thread and returns the ``(tag, result)`` pairs
    that had to be taken back to keep at most ``PER_WORKER`` items per worker in flight, oldest first; ``drain()``
    returns the rest. A worker's exception is raised by the call that takes its result back. ``threads``: as
    lmc's (None: all cores); with one, every call runs in the calling thread. ``close()`` (always call it)
    cancels what has not started and waits for what has."""

    def __init__(self, threads):
        n = _nthreads(threads)
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="lmc-dcp") if n > 1 else None
        self._limit = PER_WORKER * n
        self._pending = deque()

    def submit(self, tag, fn, *args) -> list:
        if self._pool is None:
            return [(tag, fn(*args))]
        self._pending.append((tag, self._pool.submit(fn, *args)))
        out = []
        while len(self._pending) >= self._limit:
            t, fut = self._pending.popleft()
            out.append((t, fut.result()))
        return out

    def drain(self) -> list:
        out = []
        while self._pending:
            t, fut = self._pending.popleft()
            out.append((t, fut.result()))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        else:
            drop_scratch()  # the calling thread's buffers, after work it ran inline (workers take theirs along)
        self._pending.clear()


class _Lanes:
    """A save's data files, one per worker thread that writes (a *lane*): ``write(blob)`` appends ``blob`` to the
    calling thread's file, opened on its first call as ``<prefix><k><suffix>`` (k = 0, 1, ... in order of first
    use) and starting with ``head``, and returns ``(file name, offset)``. ``commit()`` makes every file durable
    and visible at once, on as many threads as there are files; ``abort()`` removes what is not committed.

    Why files and not one: buffered writes to one file are serialised by the kernel (the file's inode lock), and
    one file is fsynced by one thread, so with one data file a many-core save waited on a single writer; with a
    file per worker the writes and the fsyncs run side by side, as DCP's ``FileSystemWriter`` does with its
    ``thread_count`` files. With one worker thread there is one file, ``<prefix>0<suffix>``, as before."""

    def __init__(self, fs, prefix: str, suffix: str, head: bytes, sync: bool, phases=None):
        self.fs, self.prefix, self.suffix, self.head, self.sync, self.ph = fs, prefix, suffix, head, sync, phases
        self._local = threading.local()
        self._lock = threading.Lock()
        self._files = []  # [name, writer, next offset], in order of first use

    def _lane(self):
        lane = getattr(self._local, "lane", None)
        if lane is None:
            with self._lock:
                name = f"{self.prefix}{len(self._files)}{self.suffix}"
                f = self.fs.open_write(name, sync=self.sync)
                lane = [name, f, 0]
                self._files.append(lane)
            f.write(self.head)
            lane[2] = len(self.head)
            self._local.lane = lane
        return lane

    def write(self, blob) -> tuple[str, int]:
        t0 = time.perf_counter()
        lane = self._lane()
        off = lane[2]
        lane[1].write(blob)
        lane[2] = off + len(blob)
        if self.ph is not None:
            self.ph.add("write", time.perf_counter() - t0)
        return lane[0], off

    def commit(self) -> None:
        """Every file flushed, fsynced and renamed into place (a save with no item still gets its first file)."""
        if not self._files:
            self._lane()
        files, self._files = self._files, []
        try:
            if len(files) == 1:
                files[0][1].commit()
            else:
                with ThreadPoolExecutor(max_workers=len(files), thread_name_prefix="lmc-dcp-commit") as ex:
                    for fut in [ex.submit(lane[1].commit) for lane in files]:
                        fut.result()
        except BaseException:
            for lane in files:  # committed ones are data files no metadata names: removed by the next save
                lane[1].abort()
            raise

    def abort(self) -> None:
        files, self._files = self._files, []
        for lane in files:
            lane[1].abort()
