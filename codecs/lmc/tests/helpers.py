import os

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


def tree_files(folder):
    """{path below folder, with "/" between its parts: the file's bytes} of every file under folder."""
    out = {}
    for d, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder).replace(os.sep, "/")] = f.read()
    return out


def assert_same(a, b, path="root"):
    """a and b are the same nested dicts, lists and tuples, of the same types and in the same order: tensors
    of the same dtype and shape, bit for bit; a float NaN where the other has one; other leaves equal."""
    import torch
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.contiguous().reshape(-1).view(torch.uint8).equal(b.contiguous().reshape(-1).view(torch.uint8)), \
            f"{path}: bits differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, path
