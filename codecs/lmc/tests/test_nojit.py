import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SCRIPT = r"""
import numpy as np, ml_dtypes, lmc
rng = np.random.default_rng(0)
for dt in (np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.float64):
    x = (rng.standard_normal(300) * 0.02).astype(np.float32).astype(dt)
    r = x.copy(); r.view(np.uint8)[::3] ^= 1
    r2 = (x.astype(np.float32) * 1.001).astype(dt)   # temporal mode for the floats
    for ref in (None, r, r2):
        b = lmc.compress(x, chunk_size=128, reference=ref)
        y = lmc.decompress(b, reference=ref)
        assert y.tobytes() == x.tobytes()
xj = (rng.standard_normal(40000) * 0.02).astype(ml_dtypes.bfloat16)   # joint-symbol chunks, partial last blocks
bj = lmc.compress(xj, chunk_size=20000)
assert lmc.info(bj)["chunk_modes"].get("joint-symbol", 0) >= 1, lmc.info(bj)
assert lmc.decompress(bj).tobytes() == xj.tobytes()
sk = np.zeros(500, np.int8); sk[::29] = 2          # rANS stream
assert lmc.decompress(lmc.compress(sk)).tobytes() == sk.tobytes()
print("NOJIT OK")
"""


def test_pure_python_mode():
    """The kernels also run as plain Python (NUMBA_DISABLE_JIT=1)."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "NOJIT OK" in p.stdout
