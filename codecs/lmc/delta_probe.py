"""Could a context-free delta coding keep the temporal mode's ratio at the alone mode's speed? (issue 21, target 2:
a measurement, not a codec mode)

lmc's temporal mode codes each float's difference from the reference (the previous checkpoint) symbol by symbol:
a bit-length class through one of 16 rANS tables chosen by the reference's exponent, then the raw bits below the
leading one. It decodes at ~0.25-0.35x of the alone mode's speed on weights. The obvious faster candidate is a
delta coded with the alone mode's own stream machinery: per element ``z = zigzag(d)``,
``d = mono(x) - mono(r)`` (mod 2^W, read as signed; ``mono`` the temporal mode's monotone map of the float bits),
and the W/8 bytes of ``z`` (least significant first) as byte streams, each coded raw / constant / Huffman / rANS
as lmc codes the streams of an alone chunk. Its decoder is the alone mode's stream decoders plus one vectorized
pass (un-zigzag, add ``mono(r)``, un-mono).

This probe measures that candidate without adding a format: ``lmc.compress(z)`` on the ``z`` array (uint16 for
bf16, uint32 for fp32) writes exactly those byte streams (lmc's byte-plane layout for integer units), and
``lmc.compress(z, format_version=1)`` the same with Huffman only (no rANS). Per (dtype, kind) of a checkpoint pair
(R, S) of a Hugging Face Trainer series (every tensor of at least 65,536 elements, fp32 and cast to bf16):

* ratio of lmc alone, lmc with the reference (the default, per chunk the smallest of alone / XOR / temporal),
  ``prefer="size"``, the ``z`` streams (rANS where it pays, as the default does), the ``z`` streams Huffman only,
  the ``z`` split (``t = min(z >> s, 255)`` one coded byte stream, the s low bits raw, escapes stored whole; per
  tensor the s of 0, 4, .. W - 4 that is smallest: leaves the noisy low bits raw, as the alone mode leaves the
  low mantissa raw) and z4ai 0.2 ``compress_delta``;
* one-thread decode speed (MiB/s of original data, best of ``--repeat``): lmc alone, lmc with the reference, and
  each ``z`` coding (lmc's stream decoders plus one reconstruction pass, timed together, every output new
  memory as ``lmc.decompress``'s is);
* which stream modes the ``z`` coding takes per byte plane, and each plane's share of its bytes.

Usage:  python codecs/lmc/delta_probe.py SERIES_DIR [--pairs 500:550,950:1000] [--repeat 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import struct
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
from numba import njit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmc  # noqa: E402
from bench_alone import load  # noqa: E402  (the same tensors as the alone benchmark)
from lmc._core import _parse_header  # noqa: E402
from lmc._kbase import checksum_units  # noqa: E402
from lmc._kchunk import stream_scratch  # noqa: E402
from lmc._kstreams import decode_planes  # noqa: E402
from lmc._intrinsics import load_u64  # noqa: E402
from lmc._ktemporal import _mono, _unmono  # noqa: E402  (the temporal mode's monotone map)

MODE_NAMES = {0: "raw", 1: "const", 2: "huffman", 3: "rans"}


def mono(u, W):
    """The temporal mode's monotone map of float bits (as unsigned W-bit integers)."""
    sb = np.array(1 << (W - 1), u.dtype)
    allm = np.array((1 << W) - 1, u.dtype)
    return np.where(u & sb, u ^ allm, u ^ sb)


def zigzag_delta(x, r, W):
    ui = np.uint16 if W == 16 else np.uint32
    si = np.int16 if W == 16 else np.int32
    d = (mono(x.view(ui), W) - mono(r.view(ui), W)).astype(ui).view(si).astype(np.int64)
    return ((d << 1) ^ (d >> (W - 1))).astype(ui)


@njit(nogil=True, cache=True)
def _recon(z, r, out, W):
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    for i in range(z.size):
        zv = np.int64(z[i])
        d = (zv >> 1) ^ -(zv & 1)
        rv = np.int64(r[i])
        m = (_mono(rv, sb, mask) + d) & mask
        out[i] = _unmono(m, sb, mask)


@njit(nogil=True, cache=True)
def _delta_decode(blob, offsets, sizes, total, chunk, W, ref, out, out_u8, sink):
    """What a delta chunk mode's decoder would do, per chunk of the z blob (alone chunks of W/8 byte streams;
    stored chunks copied): lmc's own stream decoders into byte planes, then one pass that merges the planes,
    un-zigzags, adds mono(r) and un-monos; and the chunk checksum, as lmc verifies every chunk (the blob's own
    checksums: those of z, as the probe codes z, cost what the decoded floats' would). Returns 0, or the first
    failing status."""
    unit = W // 8
    planes, dec, dec3, dec1, lens, tmp, f, cm, dtab = stream_scratch(unit, chunk, total)
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    for c in range(offsets.size):
        start = c * chunk
        n = min(chunk, total - start)
        off = offsets[c]
        if blob[off] == 2:  # stored
            for j in range(unit):
                for i in range(n):
                    planes[j, i] = blob[off + 1 + i * unit + j]
        else:
            st = decode_planes(blob, off + 1, off + sizes[c], n, unit, planes, dec, dec3, dec1, lens, tmp, 4, f,
                               cm, dtab)
            if st != 0:
                return st
        if W == 16:
            p0 = planes[0]
            p1 = planes[1]
            for i in range(n):
                z = np.int64(p0[i]) | (np.int64(p1[i]) << 8)
                d = (z >> 1) ^ -(z & 1)
                rv = np.int64(ref[start + i])
                mm = _mono(rv, sb, mask) + d
                mm &= mask
                out[start + i] = _unmono(mm, sb, mask)
        else:
            p0 = planes[0]
            p1 = planes[1]
            p2 = planes[2]
            p3 = planes[3]
            for i in range(n):
                z = (np.int64(p0[i]) | (np.int64(p1[i]) << 8) | (np.int64(p2[i]) << 16)
                     | (np.int64(p3[i]) << 24))
                d = (z >> 1) ^ -(z & 1)
                rv = np.int64(ref[start + i])
                mm = _mono(rv, sb, mask) + d
                mm &= mask
                out[start + i] = _unmono(mm, sb, mask)
        sink[0] ^= checksum_units(out_u8, start, n, unit, 1)   # (format 4's: what the probe was measured with)
    return 0


def delta_decode(blob, r, W):
    """The float bits back from a z blob and the reference, as a delta chunk mode would decode them."""
    h = _parse_header(blob)
    ui = np.uint16 if W == 16 else np.uint32
    out = np.empty(h["total"], ui)
    b = np.frombuffer(blob, np.uint8)
    st = _delta_decode(b, h["offsets"].astype(np.int64), h["sizes"].astype(np.int64), h["total"], h["chunk"], W,
                       r.reshape(-1).view(ui), out, out.view(np.uint8), np.zeros(1, np.uint64))
    if st:
        raise SystemExit(f"delta_probe: stream decode failed (status {st})")
    return out


def split_encode(z, W):
    """The split coding of z: ``t = min(z >> s, 255)`` as one byte stream coded by lmc (raw / constant / Huffman /
    rANS per chunk), the s bits below it packed raw, and every z whose t is 255 (an escape) stored whole; s, a
    multiple of 4, the one of 0 .. W - 4 that makes the smallest total. Returns (size in bytes, parts)."""
    z = z.reshape(-1).astype(np.uint64)
    best_parts = None
    for sh in range(0, W - 3, 4):
        top = z >> np.uint64(sh)
        esc = top >= 255
        t8 = np.where(esc, 255, top).astype(np.uint8)
        tb = lmc.compress(t8, threads=1)
        low = pack_low(z, sh)
        exc = z[esc].astype(np.uint16 if W == 16 else np.uint32)
        size = len(tb) + low.size + exc.nbytes
        if best_parts is None or size < best_parts[0]:
            best_parts = (size, (sh, tb, low, exc))
    return best_parts


def pack_low(z, sh):
    """The sh low bits of every z (sh a multiple of 4), LSB-first, back to back."""
    n = z.size
    if sh == 0:
        return np.zeros(0, np.uint8)
    nib = sh // 4
    out = np.zeros((n * nib + 1) // 2 + 8, np.uint8)
    for k in range(nib):  # nibble k of element i -> nibble i * nib + k of the stream
        v = ((z >> np.uint64(4 * k)) & np.uint64(15)).astype(np.uint8)
        pos = np.arange(n, dtype=np.int64) * nib + k
        np.add.at(out, pos >> 1, (v << ((pos & 1) * 4).astype(np.uint8)).astype(np.uint8))
    return out


@njit(nogil=True, cache=True)
def _split_decode(t8, low, sh, exc, W, ref, out):
    sb = np.int64(1) << (W - 1)
    mask = (np.int64(1) << W) - 1
    lm = (np.int64(1) << sh) - 1
    j = 0
    for i in range(t8.size):
        t = np.int64(t8[i])
        b = i * sh
        lo = np.int64(load_u64(low, b >> 3) >> np.uint64(b & 7)) & lm if sh > 0 else np.int64(0)
        z = (t << sh) | lo
        if t == 255:
            if j >= exc.size:
                return -1
            z = np.int64(exc[j])
            j += 1
        d = (z >> 1) ^ -(z & 1)
        rv = np.int64(ref[i])
        mm = (_mono(rv, sb, mask) + d) & mask
        out[i] = _unmono(mm, sb, mask)
    return 0 if j == exc.size else -1


def split_decode(parts, r, W):
    sh, tb, low, exc = parts
    ui = np.uint16 if W == 16 else np.uint32
    t8 = lmc.decompress(tb, threads=1)
    out = np.empty(t8.size, ui)
    if _split_decode(t8, low, sh, exc, W, r.reshape(-1).view(ui), out) != 0:
        raise SystemExit("delta_probe: split decode failed")
    return out


def recon(z, r, W):
    """The delta mode's reconstruction pass: the original float bits from z and the reference."""
    ui = np.uint16 if W == 16 else np.uint32
    out = np.empty(z.size, ui)
    _recon(z.reshape(-1), r.reshape(-1).view(ui), out, W)
    return out


def plane_modes(blob, unit):
    """Per byte plane of an lmc blob of integer units: {mode: bytes} over its chunks (alone chunks only)."""
    h = _parse_header(blob)
    out = [dict() for _ in range(unit)]
    for off, size in zip(h["offsets"], h["sizes"]):
        if blob[off] != 0:  # stored chunk: every plane raw
            for j in range(unit):
                out[j]["stored"] = out[j].get("stored", 0) + (size - 1) // unit
            continue
        p = off + 1
        for j in range(unit):
            mode = blob[p]
            ln = struct.unpack_from("<I", blob, p + 1)[0]
            name = MODE_NAMES.get(mode, str(mode))
            out[j][name] = out[j].get(name, 0) + 5 + ln
            p += 5 + ln
    return out


def best(fn, repeat):
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("series")
    ap.add_argument("--pairs", default="500:550,950:1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import z4ai
    try:
        commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    lines = [f"series {a.series}; lmc {lmc.__version__}, z4ai {getattr(z4ai, '__version__', '?')}; git {commit}; "
             f"{platform.processor() or platform.machine()}; one thread; best of {a.repeat}", ""]
    hdr = ("| pair | dtype / kind | alone | with reference (default) | prefer=size | z streams "
           "| z streams, Huffman only | z split | z4ai delta "
           "| decode MiB/s: alone / with reference / z streams / z Huffman only / z split "
           "| z streams' plane modes (share of bytes) | z split: shifts, escapes |")
    lines += [hdr, "|" + "---|" * 13]
    print("\n".join(lines), flush=True)
    for pair in a.pairs.split(","):
        s0, s1 = (int(v) for v in pair.split(":"))
        A = load(os.path.join(a.series, f"checkpoint-{s0}"), 65536)
        B = load(os.path.join(a.series, f"checkpoint-{s1}"), 65536)
        for dt in ("bf16", "fp32"):
            W = 16 if dt == "bf16" else 32
            for kind in ("weight", "exp_avg", "exp_avg_sq"):
                xs, rs = B[kind], A[kind]
                if dt == "bf16":
                    xs = [v.astype(ml_dtypes.bfloat16) for v in xs]
                    rs = [v.astype(ml_dtypes.bfloat16) for v in rs]
                raw = sum(v.nbytes for v in xs)
                zs = [zigzag_delta(x, r, W) for x, r in zip(xs, rs)]
                b_alone = [lmc.compress(x, threads=1) for x in xs]
                b_ref = [lmc.compress(x, reference=r, threads=1) for x, r in zip(xs, rs)]
                b_size = [lmc.compress(x, reference=r, threads=1, prefer="size") for x, r in zip(xs, rs)]
                b_z = [lmc.compress(z, threads=1) for z in zs]
                b_zh = [lmc.compress(z, threads=1, format_version=1) for z in zs]
                sp = [split_encode(z, W) for z in zs]
                b_z4 = [z4ai.compress_delta(x.tobytes(), r.tobytes(), dtype=dt, threads=1) for x, r in zip(xs, rs)]
                ui = np.uint16 if W == 16 else np.uint32
                for x, r, bz, bzh in zip(xs, rs, b_z, b_zh):  # the probe's own round trip
                    for b in (bz, bzh):
                        for y in (recon(lmc.decompress(b, threads=1), r, W), delta_decode(b, r, W)):
                            if not np.array_equal(y, x.reshape(-1).view(ui)):
                                raise SystemExit(f"delta_probe: round trip failed ({dt} {kind})")
                for x, r, (_, parts) in zip(xs, rs, sp):
                    if not np.array_equal(split_decode(parts, r, W), x.reshape(-1).view(ui)):
                        raise SystemExit(f"delta_probe: split round trip failed ({dt} {kind})")
                ratio = lambda bl: raw / sum(len(b) for b in bl)  # noqa: E731
                t_alone = best(lambda: [lmc.decompress(b, threads=1) for b in b_alone], a.repeat)
                t_ref = best(lambda: [lmc.decompress(b, reference=r, threads=1) for b, r in zip(b_ref, rs)],
                             a.repeat)
                t_z = best(lambda: [delta_decode(b, r, W) for b, r in zip(b_z, rs)], a.repeat)
                t_zh = best(lambda: [delta_decode(b, r, W) for b, r in zip(b_zh, rs)], a.repeat)
                t_sp = best(lambda: [split_decode(parts, r, W) for (_, parts), r in zip(sp, rs)], a.repeat)
                r_sp = raw / sum(size for size, _ in sp)
                shifts = sorted({parts[0] for _, parts in sp})
                esc = sum(parts[3].size for _, parts in sp) / sum(z.size for z in zs)
                mib = lambda t: f"{raw / t / 2**20:.0f}"  # noqa: E731
                modes = [dict() for _ in range(W // 8)]
                for b in b_z:
                    for j, m in enumerate(plane_modes(b, W // 8)):
                        for k, v in m.items():
                            modes[j][k] = modes[j].get(k, 0) + v
                tot = sum(sum(m.values()) for m in modes)
                desc = "; ".join(f"byte {j}: " + ", ".join(f"{k} {v / tot:.0%}" for k, v in sorted(m.items(),
                                 key=lambda kv: -kv[1])) for j, m in enumerate(modes))
                row = (f"| {s0}→{s1} | {dt} {kind} | {ratio(b_alone):.4f} | {ratio(b_ref):.4f} | {ratio(b_size):.4f} "
                       f"| {ratio(b_z):.4f} | {ratio(b_zh):.4f} | {r_sp:.4f} | {ratio(b_z4):.4f} | {mib(t_alone)} / "
                       f"{mib(t_ref)} / {mib(t_z)} / {mib(t_zh)} / {mib(t_sp)} | {desc} | s {shifts}, escapes "
                       f"{esc:.3%} |")
                lines.append(row)
                print(row, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
