import sys, time, numpy as np, ml_dtypes
sys.path.insert(0, 'codecs/lmc')
import lmc
from bench_threads import unpack, tile
cur, ref, _ = unpack('.devdata/series_sample.npz')
N = 48 * 2**20
cur, ref = tile(cur, N), tile(ref, N)
CS = (65536, 131072)
def t1(f):
    s = time.perf_counter(); f(); return time.perf_counter() - s
for dt in (np.float32, ml_dtypes.bfloat16):
    x, r = cur.astype(dt), ref.astype(dt)
    gib = x.nbytes / 2**30
    for mode, rr in (("alone", None), ("ref", r)):
        for th in (1, 16):
            blobs = {c: lmc.compress(x, chunk_size=c, reference=rr) for c in CS}
            y = np.empty_like(x)
            tc = {c: 9e9 for c in CS}; td = dict(tc)
            for _ in range(7):
                for c in CS:
                    tc[c] = min(tc[c], t1(lambda: lmc.compress(x, chunk_size=c, reference=rr, threads=th)))
                    td[c] = min(td[c], t1(lambda: lmc.decompress(blobs[c], reference=rr, threads=th, out=y)))
            assert y.tobytes() == x.tobytes()
            print(np.dtype(dt).name, mode, th, "thr", " | ".join(
                f"chunk {c}: {len(blobs[c])} B c {gib/tc[c]:.3f} d {gib/td[c]:.3f} GiB/s" for c in CS),
                f"| size 64K/128K {len(blobs[65536])/len(blobs[131072]):.4f} speed c {tc[131072]/tc[65536]:.3f} d {td[131072]/td[65536]:.3f}",
                flush=True)
