"""Seed blobs and blob parser of the lmc decoder fuzzer (fuzz_decoder.py).

The corpus the fuzzer damages: real blobs of every chunk mode (alone, XOR,
stored, temporal, predicted exponent, mantissa context, delta, joint symbol)
and stream mode (raw, constant, Huffman, rANS) -- weights of a small torch
model and one Adam step of it, an XOR-coded reference, sparse int8 data,
random bits, predicted-exponent chunks of bf16/fp32/fp16 tensors, delta chunks
(prefer="fast") of bf16/fp16/fp32 steps against their reference, joint-symbol
chunks of bf16 tensors with k = 1, 2 and 3 (build_corpus, pred_specs,
mctx_specs, delta_specs, joint_specs; save_corpus / load_corpus write / read
them as .npz) -- and ``Blob``, which parses a blob down to its fields
(FORMAT.md: header, chunk table, chunk modes, stream records, Huffman tables
and jump tables, rANS frequency tables, states and words, temporal context
masks, R and raw bits, the row length of a predicted-exponent chunk, the cut,
field width and escape count of a delta chunk, k, base and raw fields of a
joint-symbol chunk) and packs it back with the chunk table and header CRC-32
recomputed (``Blob.pack``); coverage() counts the modes of a corpus.

A plain module (no tests): fuzz_decoder.py imports it as a sibling, the same
way as make_vectors, and re-exports its names.
"""
import collections
import json
import os
import struct
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import lmc  # noqa: E402
from lmc import api  # noqa: E402
from lmc.kernels.rans import rans_states_for  # noqa: E402
from fuzz_zmask import Masked, is_masked, zmask_specs  # noqa: E402

CHUNK_NAMES = {0: "alone", 1: "xor", 2: "stored", 3: "temporal", 4: "pred", 5: "mctx", 6: "delta", 7: "joint"}
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


def _skewed(n, seed):
    """Values whose largest binade has its mantissa bunched near 1.0 (top 3 bits zero) and the binades
    below uniform: the mantissa-context mode (chunk mode 5, format v5, bf16) wins even on ~1000-element
    chunks, where on real weights it needs larger ones."""
    g = np.random.default_rng(seed)
    e = np.minimum(g.geometric(0.5, n), 8)
    m = np.where(e == 1, g.random(n) / 16, g.random(n))
    return (np.where(g.random(n) < 0.5, -1, 1) * 2.0 ** (-3 - e) * (1 + m)).astype(np.float32)


def mctx_specs():
    """Seeds with mantissa-context chunks (prefer="size"): alone, the last chunk of odd length; and with a
    reference that codes worse than alone (mode 5 is then the alone option of a blob with a reference)."""
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    x = _skewed(2101, 21).astype(bf)
    far = _skewed(2101, 22).astype(bf)
    return [("bf16_mctx", x, None, 1051), ("bf16_mctx_ref", x, far, 1051)]


def tied(n, seed=0, exps=(120, 121, 122, 123), kb=1, p=1.0):
    """bf16 units whose exponent is drawn from exps and whose top kb mantissa bits are a function of it (for
    a share p of the elements; the rest random): exps[i] has the top bits (5 i + 1) mod 2^kb, so that with
    2^kb exponents (or a multiple) the sign/mantissa byte plane stays uniform and mode 0 stores it raw, while
    the joint symbol (chunk mode 7, format v9) codes the tied bits for nothing: the encoder takes that mode
    on every chunk of 1024 elements or more (kb = 1), however many of the last block's fields are padding;
    with kb = 2, prefer="size" takes k = 2 (p = 1) or 3 (p = 0.9)."""
    import ml_dtypes
    g = np.random.default_rng(seed)
    i = g.integers(0, len(exps), n)
    e = np.asarray(exps, np.int64)[i]
    top = np.where(g.random(n) < p, (i * 5 + 1) % (1 << kb), g.integers(0, 1 << kb, n))
    u = g.integers(0, 2, n) << 15 | e << 7 | top << (7 - kb) | g.integers(0, 1 << (7 - kb), n)
    return u.astype(np.uint16).view(ml_dtypes.bfloat16)


def joint_specs(small=False):
    """Seeds with joint-symbol chunks (chunk mode 7, format v9, bf16, no reference), as (name, x, ref, chunk,
    prefer): k = 1 (prefer="speed") on tied data in chunks whose last block of raw fields is partly padding
    (1500 or 1100 elements, the last chunk 1100 or 1030), and on exponents 251..255 (inf and NaNs beside
    the largest finite values: base 251, so a forged base wraps past 255); k = 2 and k = 3 (prefer="size",
    a chunk of each); weights in chunks of 8192 (Huffman records of a bell-shaped distribution; not in the
    small corpus)."""
    n, c = (2 * 1100 + 1030, 1100) if small else (2 * 1500 + 1100, 1500)
    hi = tied(2100, 53, exps=(251, 252, 253, 254))
    u = hi.view(np.uint16)
    u[::150] = 0x7F80
    u[1::150] = 0xFFC1
    ks = np.concatenate([tied(4095, 54, kb=2), tied(3000, 55, kb=2, p=0.9)])
    specs = [("bf16_joint", tied(n, 51), None, c, "speed"), ("bf16_joint_hi", hi, None, 2100, "speed"),
             ("bf16_joint_size", ks, None, 4095, "size")]
    if not small:
        w = (np.random.default_rng(56).standard_normal(2 * 8192 + 3000) * 0.02).astype(np.float32)
        specs.append(("bf16_joint_weights", w.astype(hi.dtype), None, 8192, "speed"))
    return specs


_UINT = {2: np.uint16, 4: np.uint32}


def mono(u, W):
    """Sign-magnitude bits (W-bit units) -> the monotone integer of FORMAT.md's temporal and delta chunks."""
    u = np.asarray(u).astype(np.int64)
    sb = 1 << (W - 1)
    return np.where(u & sb, u ^ ((1 << W) - 1), u ^ sb)


def unmono(m, W):
    sb = 1 << (W - 1)
    return np.where(m & sb, m ^ sb, m ^ ((1 << W) - 1))


def stepped(r, d):
    """The array whose every unit is the reference's moved by d_i on the monotone integer scale (mod 2^W):
    the delta chunk's d_i = mono(x_i) - mono(r_i) exactly (float32 / float16 / bfloat16)."""
    u = r.dtype.itemsize
    W = 8 * u
    m = (mono(r.reshape(-1).view(_UINT[u]), W) + np.asarray(d, np.int64).reshape(-1)) & ((1 << W) - 1)
    return unmono(m, W).astype(_UINT[u]).view(r.dtype).reshape(r.shape)


def delta_pair(dt, n, seed, spread=1, far=0.0, far_span=30000, moved=1.0):
    """(x, ref): weight-like bf16 / fp16 / fp32 references and x moved by a uniform step in
    [-spread, spread] (on a `moved` share of the elements) plus, on a `far` share, a far one in
    [-far_span, far_span] (escapes of the delta chunk)."""
    g = np.random.default_rng(seed)
    r = (g.standard_normal(n) * 0.02).astype(np.float32).astype(dt)
    d = g.integers(-spread, spread + 1, n) * (g.random(n) < moved)
    d = d + (g.random(n) < far) * g.integers(-far_span, far_span + 1, n)
    return stepped(r, d), r


def delta_specs(small=False):
    """Seeds with delta chunks (chunk mode 6, format v6, prefer="fast"; a reference): bf16 cut at bit 4 (a
    nibble stream) with 4-bit fields and escapes, the last chunk of odd length; fp16 with 4-bit fields; fp32
    with 2-bit fields whose far moves need escapes of 4 bytes, and one cut at bit 4 or 8 with escapes of 4 or
    3 bytes."""
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    n, c = (700, 333) if small else (2101, 1001)
    x1, r1 = delta_pair(bf, n, 35, spread=60, far=0.01)
    x2, r2 = delta_pair(np.float16, n, 32, spread=6, far=0.01)
    x3, r3 = delta_pair(np.float32, n, 33, spread=1, far=0.01, far_span=1 << 22)
    x4, r4 = delta_pair(np.float32, n, 34, spread=300, far=0.01, far_span=1 << 22)
    return [("bf16_delta", x1, r1, c), ("f16_delta", x2, r2, c), ("f32_delta", x3, r3, c),
            ("f32_delta_cut", x4, r4, c)]


def build_corpus(seed=0, small=False):
    """A list of cases {name, x, ref, blob}: every chunk mode (alone, XOR, stored,
    temporal, predicted exponent, mantissa context, delta, joint symbol) and stream mode (raw,
    const, Huffman, rANS) occurs (see coverage()).  small: arrays and chunks
    about 5x smaller (for the pure-Python build; the predicted-exponent seeds
    only a little smaller: the encoder needs chunks of about 700 elements to
    choose that mode; the delta seeds about 3x smaller)."""
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
    # format 9 for all (the default's zero mask would take f32_mixed's third of zeros: the mask has seeds of its
    # own, zmask_specs, at the default); format 3's unit checksums for three (not in the small corpus of the slow
    # checked builds: their kernels are the same, the checksum aside)
    v3 = set() if small else {"bf16_temporal", "f32_mixed", "bf16_pred2d"}
    return ([dict(name=nm, x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c, format_version=9))
             for nm, x, r, c in specs]
            + [dict(name=nm, x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c, prefer="size",
                                                           format_version=9))
               for nm, x, r, c in mctx_specs()]
            + [dict(name=nm, x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c, prefer="fast"))
               for nm, x, r, c in delta_specs(small)]
            + [dict(name=nm + "_v3", x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c, format_version=3))
               for nm, x, r, c in specs if nm in v3]
            + [dict(name=nm, x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c, format_version=7,
                                                           prefer=p))
               for nm, x, r, c, p in v7_specs(small)]
            + [dict(name=nm, x=x, ref=r, blob=lmc.compress(x, reference=r, chunk_size=c, prefer=p, format_version=9))
               for nm, x, r, c, p in joint_specs(small)]
            + [dict(name=nm, x=x, ref=r, blob=_masked(lmc.compress(x, reference=r, chunk_size=c)))
               for nm, x, r, c in zmask_specs(small)])


def _masked(blob):
    assert blob[4] == 10 and blob[6] == 2, "a zero-mask seed was coded without the mask"
    return blob


def v7_specs(small=False):
    """Format 7 seeds: rANS streams of 8192 symbols or more, which have 32 interleaved states (chunks of 8192
    elements and more; the rest of the corpus has 4-state streams only): the temporal mode on bf16 weights of
    three small models after an Adam step (17,208 elements, the last chunk shorter than 8192: 4 states) and on
    fp32 weights moved by about 1e-4 (prefer="size": temporal chunks; the default: the delta mode), an alone
    rANS byte stream (sparse int8), the mantissa-context mode (prefer="size") and an XOR coding with rANS
    (int32).  small: the temporal bf16 seed only (the pure-Python build decodes 32-state streams one symbol at
    a time)."""
    import ml_dtypes
    ws = [_model_weights(s) for s in (40, 41, 42)]
    w1 = np.concatenate([w for w, _ in ws])
    w0 = np.concatenate([w for _, w in ws])
    bf = ml_dtypes.bfloat16
    sparse = np.zeros(8192 * 2 + 100, np.int8)
    sparse[::29] = 5
    rng = np.random.default_rng(43)
    ints = rng.integers(-300, 300, 8192 + 8).astype(np.int32)
    intsr = ints.copy()
    intsr[::50] += 1
    # fp32: moved by an absolute step of about 1e-4 (as Adam moves weights), where the temporal mode beats the
    # delta mode in some chunks (the one-step weights above go to the delta mode at fp32)
    f32 = (w0 + rng.standard_normal(w0.size) * 1e-4).astype(np.float32)
    specs = [("bf16_temporal_v7", w1.astype(bf), w0.astype(bf), 8192, "speed")]
    if not small:
        specs += [("int8_rans_v7", sparse, None, 8192, "speed"),
                  ("f32_temporal_v7", f32, w0, 8192, "speed"),
                  ("f32_temporal_v7_size", f32, w0, 8192, "size"),
                  ("bf16_mctx_v7", _skewed(8192 + 4001, 44).astype(bf), None, 8192 + 4001, "size"),
                  ("int32_xor_v7", ints, intsr, 8192 + 8, "speed")]
    return specs


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
        dt = api._as_dtype(m["dtype"])
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
        h = api._parse_header(buf)
        self.h = h
        self.version, self.code, self.shape = h["version"], h["code"], list(h["shape"])
        self.chunk, self.refhash = h["chunk"], h["refhash"]
        self.chks = [int(c) for c in h["chks"]]
        self.payloads = [bytes(blob[o:o + s]) for o, s in zip(h["offsets"], h["sizes"])]
        self.ns = api._nstreams(h["unit"], h["layout"])
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
                pos = self._record_fields(p, pos, cname, F, n)
        elif cm == 5:
            own = "mctx"
            F += [(1, 1, "mctx_E", own), (2, 1, "mctx_K", own), (3, 1, "mctx_mask", own)]
            q = self._record_fields(p, 4, cname, F, n)   # the exponent's stream record
            for k in range(8):
                if p[3] >> k & 1:
                    q = self._freq_fields(p, q, 15, own, F)
            (R,) = struct.unpack_from("<I", p, q)
            S = self.states(n)
            own = "mctx32" if S == 32 else own
            F += [(q, 4, "mctx_R", own)]
            F += [(q + 4 + 4 * k, 4, "rans_state", own) for k in range(S)]
            F += [(q + 4 + 4 * S, R - 4 * S, "rans_words", own), (q + 4 + R, len(p) - q - 4 - R, "mctx_nibbles", own)]
        elif cm == 6:
            own = "delta"
            F += [(1, 1, "delta_c", own), (2, 1, "delta_q", own), (3, 4, "delta_m", own)]
            cut, (m,) = p[1], struct.unpack_from("<I", p, 3)
            q = 7
            for _ in range(cut // 8):                    # the low byte streams (n symbols each)
                q = self._record_fields(p, q, cname, F, n)
            if cut % 8:                                  # the nibble stream
                q = self._record_fields(p, q, cname, F, (n + 1) // 2)
            g = 8 // p[2] if p[2] in (2, 4, 8) else 1
            q = self._record_fields(p, q, cname, F, -(-n // g))   # the packed fields
            if m:                                        # the escape values' bytes
                for _ in range((self.W - cut + 7) // 8):
                    q = self._record_fields(p, q, cname, F, m)
        elif cm == 7:
            own = "joint"
            F += [(1, 1, "joint_k", own), (2, 1, "joint_b", own)]
            q = self._record_fields(p, 3, cname, F, n)   # the symbols' stream record
            F.append((q, len(p) - q, "joint_fields", own))
            blk = 16 * (8 - p[1])                        # the last block (padding fields past n)
            if n % 128 and len(p) - q >= blk:
                F.append((len(p) - blk, blk, "joint_last_block", own))
        elif cm == 3:
            own = "temporal"
            F += [(1, 1, "temporal_E", own), (2, 2, "temporal_cmask", own)]
            (mask,) = struct.unpack_from("<H", p, 2)
            q = 4
            for k in range(16):
                if mask >> k & 1:
                    q = self._freq_fields(p, q, 2 * self.W, own, F)
            (R,) = struct.unpack_from("<I", p, q)
            S = self.states(n)
            own = "temporal32" if S == 32 else own
            F += [(q, 4, "temporal_R", own)]
            F += [(q + 4 + 4 * k, 4, "rans_state", own) for k in range(S)]
            F += [(q + 4 + 4 * S, R - 4 * S, "rans_words", own), (q + 4 + R, len(p) - q - 4 - R, "raw_bits", own)]
        return [f for f in F if f[1] > 0]

    def states(self, nsym):
        """The interleaved states of a rANS stream of nsym symbols in this blob (format 7: 32 from 8192 on)."""
        return rans_states_for(nsym, self.version)

    def _record_fields(self, p, pos, cname, F, nsym):
        """The fields of the stream record of nsym symbols at p[pos:] into F; returns its end."""
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
            lens = {(p[q + 2 + j // 2] >> 4 * (j & 1)) & 15 for j in range(hi - lo + 1)}
            if len(lens) == 1 and hi - lo + 1 == 1 << min(lens):
                own += "-fixed"   # every length k over 2^k symbols: hfixed.fixed_decode4 reads it
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
            S = self.states(nsym)
            own = own + "32" if S == 32 else own
            t = self._freq_fields(p, q, 255, own, F)
            F += [(t + 4 * k, 4, "rans_state", own) for k in range(S)]
            F.append((t + 4 * S, e - t - 4 * S, "rans_words", own))
        return e

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
        head = bytearray(api.MAGIC)
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
        if is_masked(case["blob"]):   # format 10: the mask and the modes of its two blobs
            cnt["zero-mask"] += 1
            m = Masked(case["blob"], Blob)
            cnt.update(coverage([dict(blob=m.bits), dict(blob=m.values)]))
            continue
        b = Blob(case["blob"])
        for F in b.fields:
            owners = {f[3] for f in F}
            for o in owners:
                cnt[o] += 1
            cnt["chunk:" + F[0][3]] += 1
    return cnt
