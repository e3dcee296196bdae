"""A new bytes object whose buffer lmc.api fills in place: the chunk payloads are gathered straight into the blob
that compress returns (saves a full copy of the output)."""
import numpy as np


def _bytes_api():
    try:
        import ctypes
        api = ctypes.pythonapi
        new = api.PyBytes_FromStringAndSize
        new.restype = ctypes.py_object
        new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
        addr = api.PyBytes_AsString
        addr.restype = ctypes.c_void_p
        addr.argtypes = (ctypes.py_object,)
        return ctypes, new, addr
    except Exception:  # pragma: no cover - no CPython C API (e.g. PyPy)
        return None


_BYTES_API = _bytes_api()


def new_bytes(n):
    """A new, not yet shared bytes object of length n and a writable uint8
    view of its buffer, so that the chunk payloads are gathered straight into
    the returned blob (saves a full copy of the output).  This is the C-API
    idiom PyBytes_FromStringAndSize(NULL, n) + fill before first use.
    Falls back to (None, array) without the C API."""
    if _BYTES_API is None or n == 0:  # pragma: no cover
        return None, np.empty(n, np.uint8)
    ctypes, new, addr = _BYTES_API
    b = new(None, n)
    arr = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr(b)))
    return b, arr
