"""Structure-aware fuzzer of the lmc decoder (issue 21, item 4).

Real blobs (weights of a small torch model and one Adam step of it, an XOR-coded
reference, sparse int8 data, random bits, predicted-exponent chunks of bf16/fp32/fp16
tensors with several row lengths) are parsed down to their fields (FORMAT.md:
header, chunk table, chunk modes, stream records, Huffman tables and jump tables, rANS
frequency tables, states and words, temporal context masks, R and raw bits, the row
length of a predicted-exponent chunk) and then
damaged where it hurts: fields set to boundary values, bytes flipped or replaced inside
chunk payloads, chunks truncated, extended, cut or spliced with the chunk table and the
header CRC-32 recomputed (so that the CRC shields nothing), chunk boundaries moved,
chunk checksums and header fields forged, and a wrong reference passed (also with its
hash forged into the header), and the predicted-exponent mode forged (_pred_mutation).
Every decode must return exactly the original array or raise ``lmc.FormatError``
(with the required message where a forgery must be refused for a given reason): any
other exception (an ``IndexError`` from the checked build is an out-of-bounds access
found), a crash, or a wrong array returned is a failure.

Run it under a checked build to see out-of-bounds accesses:

* no JIT, every load/store helper bounds-checked::

      LMC_CHECKED=1 NUMBA_DISABLE_JIT=1 python tests/fuzz_decoder.py --cases 20000

* JIT with Numba's bounds checks (and the checked helpers, cached apart)::

      NUMBA_BOUNDSCHECK=1 python tests/fuzz_decoder.py --cases 20000

``--save-corpus F`` / ``--corpus F`` write / read the blobs (a child then only
decodes: no encoder to compile).  The summary is printed as JSON; exit status 1 if
any case failed.
"""
import argparse
import collections
import json
import os
import struct
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import lmc  # noqa: E402
from lmc import _core  # noqa: E402
from lmc._kbase import LAYOUT_PLANES as _LAYOUT_PLANES  # noqa: E402

CHUNK_NAMES = {0: "alone", 1: "xor", 2: "stored", 3: "temporal", 4: "pred"}
STREAM_NAMES = {0: "raw", 1: "const", 2: "huffman", 3: "rans"}


# ---------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------
def _model_weights(seed=0):
    """Flat fp32 weights of a small MLP and the same after one Adam step on a toy task
    (a deterministic numpy stand-in when torch is missing)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        rng = np.random.default_rng(seed)
        w = (rng.standard_normal(6000) * 0.05).astype(np.float32)
        w2 = w + (rng.standard_normal(6000) * 1e-3 * (rng.random(6000) < 0.5)).astype(np.float32)
        return w, w2.astype(np.float32)
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 40))
    w0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x = torch.randn(32, 48)
    loss = (m(x) - torch.roll(x[:, :40], 1, 1)).pow(2).mean()
    loss.backward()
    opt.step()
    w1 = torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()
    return w1, w0


def _walk(n, seed=13):
    """A log-normal random walk: its exponent follows the left neighbour."""
    return np.exp(np.cumsum(np.random.default_rng(seed).standard_normal(n)) * 0.3) * 1e-4


def _pow2_field(rows, cols, seed=4, mant=True):
    """2^(row term + column term) times a mantissa (random, or 1.5 for every
    element: a constant mantissa stream): exponents the median predictor of
    the predicted-exponent mode gets nearly right."""
    g = np.random.default_rng(seed)
    ri = np.cumsum(g.random(rows) < 0.5)
    ci = np.cumsum(g.random(cols) < 0.5)
    x = 2.0 ** np.clip(ri[:, None] + ci[None, :] - (rows + cols) // 4, -14, 15)   # (fp16's range)
    return (x * (1 + g.random((rows, cols))) if mant else x * 1.5).astype(np.float32)


def pred_specs(small=False):
    """Seeds whose chunks the encoder writes in the predicted-exponent mode
    (chunk mode 4, format v3; no reference): bf16, fp32 and fp16, row length
    w (the shape's last dimension) inside the chunk, larger than the chunk
    (1-D, or rows longer than a chunk) and w = 1 (a column)."""
    import ml_dtypes
    from make_vectors import second_moment
    bf = ml_dtypes.bfloat16
    n = 1400 if small else 2100
    specs = [
        ("f32_pred2d", _pow2_field(32, 64), None, 1024),                        # w = 64
        ("bf16_pred_const", _pow2_field(32, 64, 5, mant=False).astype(bf), None, 1024),  # stream 1 constant
        ("bf16_pred1d", _walk(n).astype(np.float32).astype(bf), None, 700),    # w = n > chunk
        ("f32_pred_col", _walk(n, 14).astype(np.float32).reshape(-1, 1), None, 700),   # w = 1
        ("f16_pred_wide", (_walk(1400) * 1e2).astype(np.float16).reshape(2, 700), None, 600),  # w > chunk
    ]
    if small:
        specs += [("bf16_pred2d", _pow2_field(32, 64, 6).astype(bf), None, 1024),
                  ("f16_pred2d", _pow2_field(32, 64, 7).astype(np.float16), None, 1024)]
    else:
        specs += [("bf16_pred2d", second_moment(bf, 60, 64, 10), None, 2048),
                  ("f16_pred2d", (second_moment(np.float32, 60, 64, 12, steps=40) * 1e5).astype(np.float16),
                   None, 2048)]
    return specs


def build_corpus(seed=0, small=False):
    """A list of cases {name, x, ref, blob}: every chunk mode (alone, XOR, stored,
    temporal, predicted exponent) and stream mode (raw, const, Huffman, rANS)
    occurs (see coverage()).  small: arrays and chunks about 5x smaller (for the
    pure-Python build; the predicted-exponent seeds only a little smaller: the
    encoder needs chunks of about 700 elements to choose that mode)."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    w1, w0 = _model_weights(seed)          # 5736 fp32 weights and their previous step
    n = w1.size
    bf, bf0 = w1.astype(ml_dtypes.bfloat16), w0.astype(ml_dtypes.bfloat16)
    f16, f160 = w1.astype(np.float16), w0.astype(np.float16)
    bfx = bf.copy()
    bfx.view(np.uint16)[::5] ^= 0x8000     # sign flips: a reference that XOR codes best
    sparse = np.zeros(4000, np.int8)
    sparse[::37] = 3                       # rANS streams (one symbol dominates)
    noise = rng.integers(0, 256, 1200, dtype=np.uint8).view(np.float32)   # stored chunks
    ints = rng.integers(-3000, 3000, 1500).astype(np.int32)
    intsr = ints.copy()
    intsr[::40] += 1
    mixed = w1.copy()
    mixed[: n // 3] = 0.0                  # a constant stretch
    specs = [
        ("bf16_alone", bf, None, 1024),
        ("bf16_temporal", bf, bf0, 1024),
        ("bf16_xor", bf, bfx, 1024),
        ("f32_temporal", w1, w0, 1500),
        ("f32_mixed", mixed, None, 700),
        ("f16_temporal", f16, f160, 2000),
        ("int8_rans", sparse, None, 1500),
        ("f32_stored", noise.reshape(20, 15), None, 128),
        ("int32_xor", ints, intsr, 512),
        ("bf16_2d", bf[:4096].reshape(64, 64), bf0[:4096].reshape(64, 64), 1000),
    ]
    if small:
        def cut(a, m):
            return None if a is None else a.reshape(-1)[:m]
        specs = [(nm, cut(x, max(x.size // 5, 256)), cut(r, max(x.size // 5, 256)), max(c // 5, 64))
                 if nm != "int32_xor" else (nm, x, r, c) for nm, x, r, c in specs]   # (its rANS needs n)
    specs += pred_specs(small)
    return [dict(name=nm, x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c))
            for nm, x, r, c in specs]


def selftest():
    """The checked build must turn an overrun into IndexError (else the fuzzer
    could not see one): a checked helper and a kernel's own indexing."""
    from lmc import _intrinsics as I
    from lmc import _kbase as K
    a = np.zeros(10, np.uint8)
    caught = []
    for name, fn in [("load_u64", lambda: I.load_u64(a, 3)), ("ld", lambda: I.ld(a, -1)),
                     ("store_u32", lambda: I.store_u32(a, 7, np.uint32(1)))]:
        try:
            fn()
        except IndexError:
            caught.append(name)
        except (NotImplementedError, ValueError):  # unchecked: intrinsics / truncating shim
            pass
    try:   # bytes 8..15 of a 10-byte array through a kernel's plain indexing
        K._slow_load(a, 8, 16, 0)
    except IndexError:
        caught.append("kernel_index")
    # a negative offset: Python and Numba wrap it around unless checked
    c = I.checked if hasattr(I, "checked") and I.CHECKED else (lambda v: v)
    try:
        K.copy_bytes(c(np.zeros(8, np.uint8)), -4, c(np.ones(8, np.uint8)), 0, 4)
    except IndexError:
        caught.append("kernel_negative")
    return caught


def save_corpus(corpus, path):
    arrs = {}
    for i, c in enumerate(corpus):
        arrs[f"x{i}"] = c["x"].view(np.uint8).reshape(-1)
        arrs[f"b{i}"] = np.frombuffer(c["blob"], np.uint8)
        if c["ref"] is not None:
            arrs[f"r{i}"] = c["ref"].view(np.uint8).reshape(-1)
    meta = [dict(name=c["name"], dtype=str(c["x"].dtype), shape=list(c["x"].shape)) for c in corpus]
    np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrs)


def load_corpus(path):
    z = np.load(path)
    meta = json.loads(z["meta"].tobytes().decode())
    out = []
    for i, m in enumerate(meta):
        dt = _core._as_dtype(m["dtype"])
        x = z[f"x{i}"].view(dt).reshape(m["shape"])
        ref = z[f"r{i}"].view(dt).reshape(m["shape"]) if f"r{i}" in z else None
        out.append(dict(name=m["name"], x=x, ref=ref, blob=z[f"b{i}"].tobytes()))
    return out


# ---------------------------------------------------------------------------
# parsing a blob into fields (FORMAT.md)
# ---------------------------------------------------------------------------
class Blob:
    """A parsed blob: header fields, chunk payloads and per chunk its fields
    (offset inside the payload, size, name, owner = "chunkmode/streammode")."""

    def __init__(self, blob):
        buf = np.frombuffer(blob, np.uint8)
        h = _core._parse_header(buf)
        self.h = h
        self.version, self.code, self.shape = h["version"], h["code"], list(h["shape"])
        self.chunk, self.refhash = h["chunk"], h["refhash"]
        self.chks = [int(c) for c in h["chks"]]
        self.payloads = [bytes(blob[o:o + s]) for o, s in zip(h["offsets"], h["sizes"])]
        self.ns = _core._nstreams(h["unit"], h["layout"])
        self.W = 32 if h["unit"] == 4 else 16
        self.fields = [self.chunk_fields(c) for c in range(h["nch"])]
        self.hl = len(blob) - int(h["sizes"].sum())   # header + chunk table + CRC

    def n_of(self, c):
        return min(self.chunk, self.h["total"] - c * self.chunk)

    def chunk_fields(self, c):
        p = self.payloads[c]
        n = self.n_of(c)
        cm = p[0]
        cname = CHUNK_NAMES.get(cm, "?")
        F = [(0, 1, "chunk_mode", cname)]
        if cm == 2:
            F.append((1, len(p) - 1, "stored_units", "stored"))
        elif cm in (0, 1, 4):
            pos = 1
            if cm == 4:   # the row length w (u32), then the records of an alone chunk
                F.append((1, 4, "pred_w", cname))
                pos = 5
            for _ in range(self.ns):
                sm = p[pos]
                (plen,) = struct.unpack_from("<I", p, pos + 1)
                own = f"{cname}/{STREAM_NAMES[sm]}"
                F += [(pos, 1, "stream_mode", own), (pos + 1, 4, "stream_len", own)]
                q, e = pos + 5, pos + 5 + plen
                if sm in (0, 1):
                    F.append((q, plen, "stream_bytes", own))
                elif sm == 2:
                    lo, hi = p[q], p[q + 1]
                    nbt = (hi - lo + 2) // 2
                    F += [(q, 1, "huff_lo", own), (q + 1, 1, "huff_hi", own),
                          (q + 2, nbt, "huff_lengths", own)]
                    j = q + 2 + nbt
                    ln = struct.unpack_from("<III", p, j)
                    F += [(j + 4 * k, 4, "huff_jump", own) for k in range(3)]
                    s = j + 12
                    for k in range(4):
                        L = ln[k] if k < 3 else e - s
                        F.append((s, L, "huff_substream", own))
                        s += L
                else:
                    t = self._freq_fields(p, q, 255, own, F)
                    F += [(t + 4 * k, 4, "rans_state", own) for k in range(4)]
                    F.append((t + 16, e - t - 16, "rans_words", own))
                pos = e
        elif cm == 3:
            own = "temporal"
            F += [(1, 1, "temporal_E", own), (2, 2, "temporal_cmask", own)]
            (mask,) = struct.unpack_from("<H", p, 2)
            q = 4
            for k in range(16):
                if mask >> k & 1:
                    q = self._freq_fields(p, q, 2 * self.W, own, F)
            (R,) = struct.unpack_from("<I", p, q)
            F += [(q, 4, "temporal_R", own)]
            F += [(q + 4 + 4 * k, 4, "rans_state", own) for k in range(4)]
            F += [(q + 20, R - 16, "rans_words", own), (q + 4 + R, len(p) - q - 4 - R, "raw_bits", own)]
        return [f for f in F if f[1] > 0]

    @staticmethod
    def _freq_fields(p, q, maxsym, own, F):
        lo, hi = p[q], p[q + 1]
        F += [(q, 1, "freq_lo", own), (q + 1, 1, "freq_hi", own)]
        t = q + 2
        for _ in range(lo, hi + 1):
            w = 2 if p[t] & 0x80 else 1
            F.append((t, w, "freq_value", own))
            t += w
        return t

    def pack(self, payloads=None, sizes=None, chks=None, **hdr):
        """The blob with these payloads (sizes from them unless given), chunk checksums
        and header fields, the header CRC-32 recomputed."""
        payloads = self.payloads if payloads is None else payloads
        sizes = [len(x) for x in payloads] if sizes is None else sizes
        chks = self.chks if chks is None else chks
        version = hdr.get("version", self.version)
        code = hdr.get("code", self.code)
        shape = hdr.get("shape", self.shape)
        chunk = hdr.get("chunk", self.chunk)
        refhash = hdr.get("refhash", self.refhash)
        nch = hdr.get("nch", len(sizes))
        head = bytearray(_core.MAGIC)
        head += struct.pack("<BBBB", version, code, 0 if refhash is None else 1, len(shape))
        head += struct.pack(f"<{len(shape)}Q", *shape)
        head += struct.pack("<II", chunk, nch)
        if refhash is not None:
            head += struct.pack("<Q", refhash)
        for s, c in zip(sizes, chks):
            head += struct.pack("<IQ", s & 0xFFFFFFFF, c & (2**64 - 1))
        head += struct.pack("<I", zlib.crc32(head))
        return bytes(head) + b"".join(payloads)


def coverage(corpus):
    """Counter of chunk modes and (chunk mode, stream mode) pairs in the corpus."""
    cnt = collections.Counter()
    for case in corpus:
        b = Blob(case["blob"])
        for F in b.fields:
            owners = {f[3] for f in F}
            for o in owners:
                cnt[o] += 1
            cnt["chunk:" + F[0][3]] += 1
    return cnt


# ---------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------
def _boundary_values(width, n, room):
    top = (1 << (8 * width)) - 1
    vals = {0, 1, 2, 3, 4, 7, 8, 15, 16, 127, 128, 255, top, top - 1, top >> 1, (top >> 1) + 1,
            n - 1, n, n + 1, 2 * n, room - 1, room, room + 1, room + 8, 4096, 4095, 4097, 65535, 65536}
    return sorted(v for v in vals if 0 <= v <= top)


def mutations(b, rng, ref):
    """Yield one mutation: (kind, owner, blob, reference, expected) where expected is
    ``None`` (the original array) or an array the blob legitimately decodes to."""
    nch = len(b.payloads)
    c = int(rng.integers(nch))
    p = bytearray(b.payloads[c])
    F = b.fields[c]
    kind = rng.choice(["field", "byte", "truncate", "extend", "cut", "splice", "boundary", "chk",
                       "header", "mode", "valid_table", "pred"],
                      p=[.32, .10, .08, .04, .06, .04, .04, .03, .06, .05, .12, .06])
    if kind == "pred":
        r = _pred_mutation(b, rng, ref)
        if r is not None:
            return r
        kind = "field"
    names = sorted({g[2] for g in F})      # a field kind first, then one field of it
    name = names[int(rng.integers(len(names)))]
    same = [g for g in F if g[2] == name]
    f = same[int(rng.integers(len(same)))]
    owner = f[3]
    pl = list(b.payloads)
    if kind == "field":
        off, w, name = f[0], f[1], f[2]
        if w <= 4:
            room = len(p) - off - w
            v = int(rng.choice(_boundary_values(w, b.n_of(c), room)))
            if rng.random() < 0.3:  # a small step from the true value
                v = (int.from_bytes(p[off:off + w], "little") + int(rng.integers(-3, 4))) % (1 << (8 * w))
            p[off:off + w] = v.to_bytes(w, "little")
        else:
            k = off + int(rng.integers(w))
            p[k] = int(rng.integers(256)) if rng.random() < 0.5 else p[k] ^ (1 << int(rng.integers(8)))
        pl[c] = bytes(p)
        return f"field:{name}", owner, b.pack(pl), ref, None
    if kind == "valid_table":
        r = _valid_table_mutation(b, c, p, F, rng)
        if r is not None:
            name, own, newp = r
            pl[c] = newp
            return f"table:{name}", own, b.pack(pl), ref, None
        kind = "byte"
    if kind == "byte":
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(len(p)))
            p[k] ^= 1 << int(rng.integers(8))
        pl[c] = bytes(p)
        return "byte", owner, b.pack(pl), ref, None
    if kind == "mode":
        modes = [g for g in F if g[2] in ("chunk_mode", "stream_mode")]
        g = modes[int(rng.integers(len(modes)))]
        p[g[0]] = int(rng.integers(6))     # 0..4 valid chunk modes (0..3 stream modes), 5 not
        pl[c] = bytes(p)
        return f"mode:{g[2]}", g[3], b.pack(pl), ref, None
    if kind == "truncate":   # cut inside a field, sizes and CRC fixed
        k = f[0] + int(rng.integers(f[1] + 1))
        pl[c] = bytes(p[:k])
        return "truncate", owner, b.pack(pl), ref, None
    if kind == "extend":
        pl[c] = bytes(p) + rng.integers(0, 256, int(rng.integers(1, 12)), dtype=np.uint8).tobytes()
        return "extend", owner, b.pack(pl), ref, None
    if kind == "cut":        # delete or insert bytes inside a field
        k = f[0] + int(rng.integers(f[1]))
        m = int(rng.integers(1, 5))
        if rng.random() < 0.5:
            pl[c] = bytes(p[:k] + p[k + m:])
        else:
            pl[c] = bytes(p[:k]) + rng.integers(0, 256, m, dtype=np.uint8).tobytes() + bytes(p[k:])
        return "cut", owner, b.pack(pl), ref, None
    if kind == "splice":     # another chunk's payload (another mode, n or reference)
        d = int(rng.integers(nch))
        pl[c] = b.payloads[d]
        return "splice", owner, b.pack(pl), ref, None
    if kind == "boundary":   # move the boundary between two chunks (total length kept)
        if nch < 2:
            return "boundary", owner, b.pack(pl, sizes=[len(x) + 1 for x in pl]), ref, None
        c = min(c, nch - 2)
        sizes = [len(x) for x in pl]
        dlt = int(rng.integers(-8, 9)) or 1
        sizes[c] += dlt
        sizes[c + 1] -= dlt
        return "boundary", b.fields[c][0][3], b.pack(pl, sizes=sizes), ref, None
    if kind == "chk":
        chks = list(b.chks)
        chks[c] ^= 1 << int(rng.integers(64))
        return "checksum", owner, b.pack(chks=chks), ref, None
    # header fields, CRC recomputed
    sub = int(rng.integers(7))
    if sub == 6:             # a shape numpy cannot allocate, with a zero dimension (so nch = 0 fits)
        big = [[0, 2**64 - 1], [0, 2**63], [2**62, 0, 4], [0] * 31 + [2**63 - 1], [3, 0, 2**61]]
        shp = big[int(rng.integers(len(big)))]
        # (numpy allows some with 1-byte units: then an empty array of that shape is right)
        return "hdr:huge_shape", owner, b.pack(shape=shp, payloads=[], nch=0), None, ("empty", shp, None)
    if sub == 0:             # another version (1, 2: the newer modes then invalid; 3; 4 unknown)
        v = int(rng.choice([v for v in (1, 2, 3, 4) if v != b.version]))
        return "hdr:version", owner, b.pack(version=v), ref, None
    if sub == 1:             # another chunk size with the same chunk count
        ch = b.chunk + int(rng.integers(-20, 21))
        total = b.h["total"]
        if ch >= 1 and -(-total // ch) == nch and ch != b.chunk:
            return "hdr:chunk", owner, b.pack(chunk=ch), ref, None
        return "hdr:chunk", owner, b.pack(chunk=max(1, b.chunk // 2)), ref, None
    if sub == 2:             # another shape, same element count: decodes to the reshaped array
        total = b.h["total"]
        shp = [total] if len(b.shape) != 1 else [1, total]
        return ("hdr:shape", owner, b.pack(shape=shp), None if ref is None else ref.reshape(shp),
                ("reshape", shp, None))
    if sub == 3:             # another dtype of the same unit size
        same = [k for k, (dt, u, _) in _core._DTYPES.items() if u == b.h["unit"] and k != b.code]
        code = int(rng.choice(same))
        r = None if ref is None else ref.view(_core._DTYPES[code][0])
        return "hdr:dtype", owner, b.pack(code=code), r, ("relabel", code, None)
    if sub == 4 and ref is not None:   # a wrong reference with its hash forged into the header
        bad = ref.copy()
        bu = bad.reshape(-1).view(np.uint8)
        k = int(rng.integers(bu.size))
        bu[k] ^= 1 << int(rng.integers(8))
        h = _core._ref_hash(_core._ro_bytes(bad), b.h["total"], b.chunk, b.h["unit"], 1)
        return "ref:forged_hash", owner, b.pack(refhash=h), bad, None
    if ref is not None:      # a wrong reference, hash left (must be refused)
        bad = ref.copy()
        bad.reshape(-1).view(np.uint8)[int(rng.integers(ref.nbytes))] ^= 1
        return "ref:wrong", owner, b.pack(), bad, None
    return "ref:missing_flag", owner, b.pack(refhash=0x1234), None, None


# FormatError messages a forgery must get (FORMAT.md; _kbase.ERROR_MESSAGES)
MSG_PRED = "predicted-exponent chunk"
MSG_TRUNC = "chunk data truncated"
MSG_VERSION = "not allowed in a format-version"
MSG_FLAGS = "invalid chunk flags byte"


def _records(p, pos, ns):
    """(start, end) of the ns stream records from p[pos:]."""
    out = []
    for _ in range(ns):
        (plen,) = struct.unpack_from("<I", p, pos + 1)
        out.append((pos, pos + 5 + plen))
        pos += 5 + plen
    return out


def _const_record(rng):
    """A record every decoder reads as one symbol: a constant stream, or a rANS
    stream of one symbol (frequency 4096, the four states 2^16)."""
    v = int(rng.integers(256))
    if rng.random() < 0.5:
        return bytes([1]) + struct.pack("<I", 1) + bytes([v])
    body = bytes([v, v, 0x90, 0x00]) + struct.pack("<4I", *[1 << 16] * 4)
    return bytes([3]) + struct.pack("<I", len(body)) + body


def _pred_mutation(b, rng, ref):
    """A forgery of the predicted-exponent mode (chunk mode 4: byte 4, u32 row
    length w >= 1, then the stream records of an alone chunk; format v3, float
    layouts, not every stream constant).  On a mode-4 chunk: the row length
    set to 0 (refused), 1, 2^32-1, w +- 1, n +- 1 or random; the residual
    stream replaced by a raw one of random bytes, a constant or a one-symbol
    rANS stream (valid structure: exp_restore runs on it, with a forged w
    too); every stream made constant (refused); a cut inside the 5-byte head
    (refused as truncated); the blob's version set to 1 or 2 (refused); the
    chunk turned into an alone chunk (w dropped).  On an alone chunk: turned
    into a mode-4 chunk (w inserted; version 3 forced: refused in an integer
    layout, else it decodes to wrong exponents).  Returns (kind, owner, blob,
    reference, expected) as mutations() or None if the blob has no chunk
    for it; expected ("error", text, None): the decode must raise a
    FormatError whose message contains text."""
    pred = [c for c, p in enumerate(b.payloads) if p[:1] == b"\x04"]
    alone = [c for c, p in enumerate(b.payloads) if p[:1] == b"\x00"]
    pl = list(b.payloads)
    if not pred or (alone and rng.random() < 0.15):
        if not alone:
            return None
        c = alone[int(rng.integers(len(alone)))]
        n = b.n_of(c)
        w = int(rng.choice([1, 2, n - 1, n, n + 1, max(1, b.shape[-1]), 0xFFFFFFFF]))
        w = max(w, 1)
        pl[c] = b"\x04" + struct.pack("<I", w) + pl[c][1:]
        if b.h["layout"] == _LAYOUT_PLANES:
            return "pred:from_alone_int", "alone", b.pack(pl, version=3), ref, ("error", MSG_FLAGS, None)
        if b.version < 3 and rng.random() < 0.3:
            return "pred:from_alone_v%d" % b.version, "alone", b.pack(pl), ref, ("error", MSG_VERSION, None)
        return "pred:from_alone", "alone", b.pack(pl, version=3), ref, None
    c = pred[int(rng.integers(len(pred)))]
    p = bytearray(pl[c])
    n = b.n_of(c)
    (w,) = struct.unpack_from("<I", p, 1)
    recs = _records(p, 5, b.ns)
    sub = rng.choice(["w", "w_zero", "residual", "all_const", "head_cut", "version", "as_alone"],
                     p=[.25, .05, .25, .15, .1, .05, .15])

    def forged_w():
        return int(rng.choice([1, 2, 0xFFFFFFFF, 0xFFFFFFFE, 0x80000000, w - 1, w + 1, n - 1, n, n + 1,
                               2 * w, int(rng.integers(1, 2 * n + 2))])) & 0xFFFFFFFF or 1

    if sub == "w":
        struct.pack_into("<I", p, 1, forged_w())
        pl[c] = bytes(p)
        return "pred:w", "pred", b.pack(pl), ref, None
    if sub == "w_zero":
        struct.pack_into("<I", p, 1, 0)
        pl[c] = bytes(p)
        return "pred:w_zero", "pred", b.pack(pl), ref, ("error", MSG_PRED, None)
    if sub == "residual":   # stream 0 replaced by a structurally valid record
        how = rng.choice(["raw", "const", "rans1"])
        if how == "raw":
            rec = bytes([0]) + struct.pack("<I", n) + rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        else:
            rec = _const_record(rng)
            while (rec[0] == 1) != (how == "const"):
                rec = _const_record(rng)
        if rng.random() < 0.5:
            struct.pack_into("<I", p, 1, forged_w())
        others_const = all(p[s0] in (1,) for s0, _ in recs[1:])
        pl[c] = bytes(p[:5]) + rec + bytes(p[recs[0][1]:])
        if how != "raw" and others_const:
            return f"pred:residual_{how}", "pred", b.pack(pl), ref, ("error", MSG_PRED, None)
        return f"pred:residual_{how}", "pred", b.pack(pl), ref, None
    if sub == "all_const":  # every stream constant (or one-symbol rANS): refused
        pl[c] = bytes(p[:5]) + b"".join(_const_record(rng) for _ in range(b.ns))
        return "pred:all_const", "pred", b.pack(pl), ref, ("error", MSG_PRED, None)
    if sub == "head_cut":   # 0..4 bytes: inside the mode byte + row length
        k = int(rng.integers(5))
        pl[c] = bytes(p[:k])
        return "pred:head_cut", "pred", b.pack(pl), ref, ("error", MSG_TRUNC, None)
    if sub == "version":    # a mode-4 chunk in a version-1 or -2 blob
        v = int(rng.choice([1, 2]))
        return f"pred:in_v{v}", "pred", b.pack(version=v), ref, ("error", MSG_VERSION, None)
    # as_alone: the w bytes dropped, mode 0 (the residuals then read as exponents)
    pl[c] = b"\x00" + bytes(p[5:])
    return "pred:as_alone", "pred", b.pack(pl), ref, None


def _freq_encode(vals):
    out = bytearray()
    for v in vals:
        out += bytes([v]) if v < 128 else bytes([0x80 | (v >> 8), v & 0xFF])
    return bytes(out)


def _valid_table_mutation(b, c, p, F, rng):
    """A change that keeps the tables valid (so the structural checks pass and
    the kernels run on it): two Huffman code lengths swapped (Kraft sum kept),
    a sub-stream boundary of the jump table moved, frequency moved between two
    symbols of a rANS table (sum kept; the table re-encoded, lengths fixed)."""
    opts = []
    for g in F:
        if g[2] == "huff_lengths":
            opts.append(("huff_swap", g))
        elif g[2] == "huff_jump":
            opts.append(("huff_jump_shift", g))
        elif g[2] == "freq_lo":
            opts.append(("freq_move", g))
    if not opts:
        return None
    name, g = opts[int(rng.integers(len(opts)))]
    p = bytearray(p)
    if name == "huff_swap":
        lo = p[g[0] - 2]
        hi = p[g[0] - 1]
        cnt = hi - lo + 1
        lens = [(p[g[0] + (j >> 1)] >> (4 * (j & 1))) & 15 for j in range(cnt)]
        nz = [j for j in range(cnt) if lens[j]]
        pairs = [(i, j) for i in nz for j in nz if lens[i] != lens[j]]
        if not pairs:
            return None
        i, j = pairs[int(rng.integers(len(pairs)))]
        lens[i], lens[j] = lens[j], lens[i]
        if lens[0] == 0 or lens[-1] == 0:
            return None
        for k in range(0, cnt, 2):
            p[g[0] + k // 2] = lens[k] | ((lens[k + 1] if k + 1 < cnt else 0) << 4)
        return name, g[3], bytes(p)
    if name == "huff_jump_shift":
        v = struct.unpack_from("<I", p, g[0])[0]
        d = int(rng.integers(-9, 10)) or 1
        if v + d < 0:
            return None
        struct.pack_into("<I", p, g[0], v + d)
        k = (g[0] - [h for h in F if h[2] == "huff_jump" and h[3] == g[3]][0][0]) // 4
        nxt = g[0] + 4
        if k < 2:           # the next sub-stream gives the bytes back (total kept)
            w = struct.unpack_from("<I", p, nxt)[0]
            if w - d < 0:
                return None
            struct.pack_into("<I", p, nxt, w - d)
        return name, g[3], bytes(p)
    # freq_move: re-encode the table with f[a] -= d, f[b] += d
    q = g[0]
    lo, hi = p[q], p[q + 1]
    t = q + 2
    vals = []
    for _ in range(lo, hi + 1):
        if p[t] & 0x80:
            vals.append(((p[t] & 0x7F) << 8) | p[t + 1])
            t += 2
        else:
            vals.append(p[t])
            t += 1
    if len(vals) < 2:
        return None
    a, bb = (int(v) for v in rng.choice(len(vals), 2, replace=False))
    if vals[a] < 2:
        return None
    d = int(rng.integers(1, max(2, vals[a] // 2)))
    vals[a] -= d
    vals[bb] += d
    if vals[0] == 0 or vals[-1] == 0:
        return None
    new = bytes([lo, hi]) + _freq_encode(vals)
    p = p[:q] + new + p[t:]
    delta = len(new) - (t - q)
    if g[3] != "temporal" and delta:   # a stream record: fix its length
        rec = max(h[0] for h in F if h[2] == "stream_len" and h[0] < q)
        v = struct.unpack_from("<I", p, rec)[0]
        struct.pack_into("<I", p, rec, v + delta)
    return name, g[3], bytes(p)


def _expected(x, spec):
    if spec is None:
        return x
    what, arg, _ = spec
    if what == "reshape":
        return x.reshape(arg)
    if what == "empty":
        return np.empty(arg, x.dtype)
    return x.view(_core._DTYPES[arg][0])


def run(corpus, cases, seed=0, stop_after=20, log=None, stack=0.0):
    """Decode `cases` mutated blobs; returns (stats, failures).  stack: the
    share of cases that get a few random bit flips on top of their mutation."""
    rng = np.random.default_rng(seed)
    parsed = [Blob(c["blob"]) for c in corpus]
    stats = {"cases": 0, "outcome": collections.Counter(), "by_owner": collections.Counter(),
             "by_kind": collections.Counter(), "exact_by_owner": collections.Counter(),
             "errors": collections.Counter()}
    failures = []
    for i in range(cases):
        j = i % len(corpus)
        case, b = corpus[j], parsed[j]
        kind, owner, blob, ref, spec = mutations(b, rng, case["ref"])
        must_fail = spec is not None and spec[0] == "error"   # a forgery with a required refusal
        if (stack and rng.random() < stack and len(blob) > b.hl and not kind.startswith("hdr")
                and not must_fail):
            # a second damage on top: 1-3 bytes flipped somewhere in the payloads
            bb = bytearray(blob)
            for _ in range(int(rng.integers(1, 4))):
                bb[int(rng.integers(b.hl, len(bb)))] ^= 1 << int(rng.integers(8))
            blob = bytes(bb)
            kind += "+flips"
        stats["cases"] += 1
        stats["by_owner"][owner] += 1
        stats["by_kind"][kind] += 1
        try:   # every 8th case on 2 threads (chunks decoded in parallel, stopped at the first bad one)
            y = lmc.decompress(blob, reference=ref, threads=2 if i % 8 == 7 else 1)
        except lmc.FormatError as e:
            stats["outcome"]["FormatError"] += 1
            msg = str(e)
            stats["errors"][msg.split(": ", 2)[-1] if ": chunk " in msg else msg.split(" (")[0]] += 1
            if not must_fail or spec[1] in msg:
                continue
            stats["outcome"]["WRONG_ERROR"] += 1
            failures.append(dict(case=i, corpus=case["name"], kind=kind, owner=owner,
                                 error=f"FormatError {msg!r}, not {spec[1]!r}", blob=blob.hex()))
        except Exception as e:  # an IndexError in the checked build: an out-of-bounds access
            stats["outcome"][type(e).__name__] += 1
            failures.append(dict(case=i, corpus=case["name"], kind=kind, owner=owner,
                                 error=f"{type(e).__name__}: {e}", blob=blob.hex()))
        else:
            if must_fail:    # (a wrong output or not, it had to be refused)
                stats["outcome"]["NOT_REFUSED"] += 1
                failures.append(dict(case=i, corpus=case["name"], kind=kind, owner=owner,
                                     error=f"decoded, not refused ({spec[1]!r})", blob=blob.hex()))
            else:
                exp = _expected(case["x"], spec)
                if y.dtype == exp.dtype and y.shape == exp.shape and y.tobytes() == exp.tobytes():
                    stats["outcome"]["exact"] += 1
                    stats["exact_by_owner"][owner] += 1
                    continue
                stats["outcome"]["WRONG_OUTPUT"] += 1
                failures.append(dict(case=i, corpus=case["name"], kind=kind, owner=owner,
                                     error="wrong output returned", blob=blob.hex()))
        if log:
            log(failures[-1])
        if len(failures) >= stop_after:
            break
    return stats, failures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", help="read the blobs from this .npz (made by --save-corpus)")
    ap.add_argument("--save-corpus", help="write the blobs to this .npz and exit")
    ap.add_argument("--json", help="write the summary here too")
    ap.add_argument("--small", action="store_true", help="a 5x smaller corpus (pure-Python build)")
    ap.add_argument("--stack", type=float, default=0.0,
                    help="share of cases with 1-3 bit flips on top of their mutation (default 0)")
    ap.add_argument("--selftest", action="store_true",
                    help="print which overruns the build catches (CAUGHT name ...) and exit")
    a = ap.parse_args(argv)
    if a.selftest:
        print("CAUGHT", " ".join(selftest()))
        return 0
    corpus = load_corpus(a.corpus) if a.corpus else build_corpus(a.seed, a.small)
    if a.save_corpus:
        save_corpus(corpus, a.save_corpus)
        return 0
    from lmc import _intrinsics
    import numba
    t = time.time()
    stats, failures = run(corpus, a.cases, a.seed, stack=a.stack,
                          log=lambda f: print("FAIL", {k: v for k, v in f.items() if k != "blob"},
                                              flush=True))
    summary = dict(cases=stats["cases"], seconds=round(time.time() - t, 1), seed=a.seed, stack=a.stack,
                   build=dict(jit=not numba.config.DISABLE_JIT, checked_helpers=_intrinsics.CHECKED,
                              numba_boundscheck=bool(numba.config.BOUNDSCHECK)),
                   coverage=dict(sorted(coverage(corpus).items())),
                   outcome=dict(stats["outcome"]), by_owner=dict(sorted(stats["by_owner"].items())),
                   exact_by_owner=dict(sorted(stats["exact_by_owner"].items())),
                   by_kind=dict(sorted(stats["by_kind"].items())),
                   errors=dict(stats["errors"].most_common()), failures=len(failures))
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(summary, failure_cases=failures[:20]), fh, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
