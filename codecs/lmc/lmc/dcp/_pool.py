"""Worker threads for :mod:`lmc.dcp`: items (tensor chunks) are coded and decoded on a pool of threads, a bounded
number in flight, their results taken back in submission order by the calling thread (which alone writes the
files and talks to DCP's planner). lmc's kernels and the checksum release the GIL, so the workers run in
parallel. A private module."""
from __future__ import annotations

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
