"""The archive's parallel path: a bounded pool over tensors and chunks, per-thread buffers, and reads that
cannot fault (per-phase timers: :mod:`lmc.phases`).

Why a pool over pieces, not only lmc's threads inside a tensor: a step is a few hundred tensors of a few MiB,
each a handful of lmc chunks, so a codec call on its own keeps few cores busy, and everything around it
(reading, hashing, zlib, writing) ran serially on one thread. Every stage of a piece here releases the GIL
(os.preadv, xxhash, zlib, lmc's nogil kernels, file writes), so Python threads run them in parallel. Results
are handed back on the calling thread in submission order, so a segment's bytes are the same on every run
and for every thread count; at most ``depth`` pieces are in flight (two per worker), which bounds memory to
about two tensors (and their blobs) per worker."""
import collections
import os
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np

from ..worker import drop_scratch, scratch
from ._manifest import ArchiveError


def workers_for(threads):
    """Worker threads for ``threads`` (None: every core the process may use)."""
    if threads is None:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            return max(1, os.cpu_count() or 1)
    return max(1, int(threads))


BIG_TENSOR = 32 << 20  # a tensor this large is coded or decoded with lmc's threads inside it too


def piece_threads(workers, threads, nbytes):
    """lmc threads for coding or decoding one piece of ``nbytes`` on a pool of ``workers``: one where the pool
    already keeps the cores busy with other pieces (a small tensor split over threads only waits for the
    other workers' blocks), all of them for a tensor large enough to be most of a step."""
    return 1 if workers > 1 and nbytes < BIG_TENSOR else threads


BUDGET_PER_WORKER = 128 << 20  # bytes of pieces in flight per worker (a large tensor still runs, alone)


class Ordered:
    """Runs functions on ``workers`` threads and calls each one's ``done`` with its result on the submitting
    thread, in submission order. At most ``depth`` (two per worker) are in flight, and at most ``budget`` bytes
    of pieces (the ``cost`` each submit names; 128 MiB per worker): a piece is not started while that would
    exceed it, unless nothing else is in flight. So memory stays near two tensors per worker whatever their
    size. One worker: everything runs inline, in order. Used as a context manager: leaving it drains the
    queue; leaving on an error cancels what has not started and waits for what has (nothing runs on after the
    call returns).

    ``in_order=False`` (pieces that need no order: a restore's, each writing itself at its offset): a full
    window takes back whichever piece finished first, not the oldest. In order, a large tensor at the head of
    the window holds it full while the other workers, done with the small tensors behind it, wait; a model's
    tensors alternate between a few MiB (weights) and a few KiB (biases, norms), so that wait was most of a
    second worker's time."""

    def __init__(self, workers, depth=None, budget=None, in_order=True):
        self.workers = max(1, int(workers))
        self.in_order = in_order
        self.depth = depth or 2 * self.workers
        self.budget = budget or BUDGET_PER_WORKER * self.workers
        self.ex = ThreadPoolExecutor(self.workers, thread_name_prefix="lmc-archive") if self.workers > 1 else None
        self.q = collections.deque()
        self.inflight = 0

    def submit(self, fn, done=None, cost=0):
        if self.ex is None:
            r = fn()
            if done is not None:
                done(r)
            return
        while self.q and (len(self.q) >= self.depth or self.inflight + cost > self.budget):
            self._pop() if self.in_order else self._pop_first_done()
        self.q.append((self.ex.submit(fn), done, cost))
        self.inflight += cost

    def _pop(self, i=0):
        fut, done, cost = self.q[i]
        del self.q[i]
        self.inflight -= cost
        r = fut.result()
        if done is not None:
            done(r)

    def _pop_first_done(self):
        done_set, _ = wait([e[0] for e in self.q], return_when=FIRST_COMPLETED)
        self._pop(next(i for i, e in enumerate(self.q) if e[0] in done_set))

    def drain(self):
        while self.q:
            self._pop()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        try:
            if exc_type is None:
                self.drain()
        finally:
            if self.ex is None:
                drop_scratch()  # (the pool's threads take theirs with them)
            if self.ex is not None:
                for fut, _, _ in self.q:
                    fut.cancel()
                self.q.clear()
                self.ex.shutdown(wait=True)
        return False


def read_exact(fd, begin, end, what, slot=None):
    """Bytes [begin, end) of an open file as a uint8 array (a new one, or this thread's ``scratch(slot)``),
    read with pread (no file map: a file truncated under the reader is a short read and one line here, never
    a SIGBUS)."""
    n = end - begin
    buf = np.empty(n, np.uint8) if slot is None else scratch(slot, n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = os.preadv(fd, [mv[got:]], begin + got)
        except OSError as e:
            raise ArchiveError(f"{what}: cannot read ({e.strerror or e})") from None
        if k <= 0:
            raise ArchiveError(f"{what}: changed while being read (now shorter than {end} bytes)")
        got += k
    return buf
