import ml_dtypes
import numpy as np

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.uint8,
          np.int16, np.int32]


def make(dtype, n, seed=0, kind="weights"):
    """Test data: 'weights' (Gaussian-like), 'random' (random bit patterns)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if kind == "random" or dt.kind in "iub":
        raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
        if kind != "random" and dt.kind in "iu":
            return rng.integers(-20, 20, n).astype(dt)
        return raw.view(dt)
    return (rng.standard_normal(n) * 0.02).astype(np.float32).astype(dt)


def same_bits(a, b):
    a = np.asarray(a)
    b = np.asarray(b)
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == b.tobytes())
