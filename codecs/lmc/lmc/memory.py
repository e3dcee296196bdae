"""This process's resident memory, for the memory figures of lmc's and lmcbench's tests and benchmarks.

Peak RSS (Linux ``/proc/self/status`` VmHWM) counts what tracemalloc misses: Numba's and the compressors' native
buffers and the pages of memory-mapped files. :func:`reset_peak` sets the high-water mark back to the current RSS
(``/proc/self/clear_refs`` "5", Linux 4.0+), so the peak of one call can be read as how far it rose above where the
process stood before it. Memory the allocator freed but kept is part of that starting point: a call that reuses
it raises nothing (large buffers, above glibc's mmap threshold, are returned to the system when freed)."""
from __future__ import annotations


def status(key: str) -> int | None:
    """``VmRSS``, ``VmHWM``... of this process in bytes; None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak() -> int | None:
    """Reset the peak RSS to the current RSS; returns the current RSS in bytes, None where it cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return status("VmRSS")


def peak_above(base: int | None) -> int | None:
    """Bytes the peak RSS rose above ``base`` (from :func:`reset_peak`) since; None when not measured."""
    hwm = status("VmHWM") if base is not None else None
    return None if hwm is None else max(0, hwm - base)
