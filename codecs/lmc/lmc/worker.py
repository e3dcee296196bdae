"""What the worker threads of the archive and of the DCP writer share, below both: per-phase timers (seconds of
a save, an add or a restore summed over the threads that ran them: ``Archive.last_phases``,
``LMCStorageWriter.last_phases``, so the next bottleneck is visible) and per-thread buffers (:func:`scratch`)."""
import collections
import threading
import time

import numpy as np


class Phases:
    """Seconds spent per phase (summed over threads: CPU-side time, not wall time). Thread-safe."""

    def __init__(self):
        self.s = collections.defaultdict(float)
        self._lock = threading.Lock()

    def add(self, name, dt):
        with self._lock:
            self.s[name] += dt

    def time(self, name):
        """``with phases.time("write"): ...`` adds the block's seconds to that phase."""
        return _Timer(self, name)

    def as_dict(self):
        with self._lock:
            return {k: round(v, 6) for k, v in sorted(self.s.items())}


class _Timer:
    __slots__ = ("p", "name", "t0")

    def __init__(self, p, name):
        self.p, self.name = p, name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.p.add(self.name, time.perf_counter() - self.t0)


SCRATCH_KEEP = 64 << 20  # the largest buffer a thread keeps per slot
_TLS = threading.local()


def scratch(slot, nbytes):
    """A uint8 buffer of nbytes that this thread reuses from one piece to the next (``slot``: one per use, so a
    piece can hold several). Writing into memory the process has touched before costs no page faults: a fresh
    buffer per tensor made the kernel zero and map every page of every tensor read or decoded, which measured
    as much as the decoding itself, and more with two threads faulting at once. Valid until this thread asks
    for the same slot again; a piece larger than SCRATCH_KEEP gets a buffer of its own."""
    bufs = getattr(_TLS, "bufs", None)
    if bufs is None:
        bufs = _TLS.bufs = {}
    b = bufs.get(slot)
    if b is None or b.size < nbytes:
        if nbytes > SCRATCH_KEEP:
            return np.empty(nbytes, np.uint8)
        b = bufs[slot] = np.empty(max(nbytes, 1 << 20), np.uint8)
    return b[:nbytes]


def drop_scratch():
    """Free this thread's buffers (the calling thread's, after work it ran inline)."""
    _TLS.bufs = None
