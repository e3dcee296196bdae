"""Forgeries of the chunk modes with rules of their own, for the decoder fuzzer (fuzz_decoder.py): the
predicted-exponent mode (chunk mode 4, format v3: ``_pred_mutation``), the mantissa-context mode (chunk mode
5, format v5: ``_mctx_mutation``), the delta mode (chunk mode 6, format v6: ``_delta_mutation``) and the
joint-symbol mode (chunk mode 7, format v9: ``_joint_mutation``), and the FormatError messages (MSG_*) the
forgeries FORMAT.md requires to be refused must carry.

A plain module (no tests): fuzz_decoder.py imports it as a sibling and re-exports its names.
"""
import struct

import numpy as np

import pyref
from lmc import api
from lmc.kernels.base import LAYOUT_PLANES as _LAYOUT_PLANES, ck_mode


# FormatError messages a forgery must get (FORMAT.md; kbase.ERROR_MESSAGES)
MSG_PRED = "predicted-exponent chunk"
MSG_TRUNC = "chunk data truncated"
MSG_VERSION = "newer than the blob's format version"
MSG_FLAGS = "invalid chunk flags byte"
MSG_MCTX = "mantissa-context chunk"
MSG_PAD = "non-zero padding bits"
MSG_LEN = "payload length inconsistent"
MSG_DELTA = "delta chunk"
MSG_JOINT = "joint-symbol chunk"
MSG_SMODE = "invalid stream mode"


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


def _draw_chunk(b, rng, mode):
    """(the chunks of mode byte ``mode``, the payloads as a list, one of those chunks drawn with rng, its
    payload as a bytearray, its element count), or None where the blob has no chunk of that mode."""
    cs = [c for c, p in enumerate(b.payloads) if p[:1] == bytes([mode])]
    if not cs:
        return None
    pl = list(b.payloads)
    c = cs[int(rng.integers(len(cs)))]
    return cs, pl, c, bytearray(pl[c]), b.n_of(c)


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
            return "pred:from_alone_int", "alone", b.pack(pl, version=max(3, b.version)), ref, ("error", MSG_FLAGS, None)
        if b.version < 3 and rng.random() < 0.3:
            return "pred:from_alone_v%d" % b.version, "alone", b.pack(pl), ref, ("error", MSG_VERSION, None)
        return "pred:from_alone", "alone", b.pack(pl, version=max(3, b.version)), ref, None
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


def _mctx_mutation(b, rng, ref):
    """A forgery of the mantissa-context mode (chunk mode 5: byte 5, E, K in 1..8, a context mask inside
    the K contexts, the exponent's stream record, the context tables, u32 R, the rANS stream, ceil(n / 2)
    nibble bytes; format v5, bfloat16 only).  Refused: K = 0 or > 8, a mask empty or with a bit at or past
    K, a cut inside the 4-byte head, the blob's version set to 2 or 4, the dtype relabelled float16 (units
    of 2 bytes, no mode 5), a set unused final high nibble (odd n), a nibble byte cut or added.  Not
    refused by structure (they must decode exactly or fail on the context mask, the rANS stream or the
    checksum): another base E, another K or mask that stays valid, the exponent record replaced by a raw
    one of random bytes.  Returns (kind, owner, blob, reference, expected) as mutations() or None if the
    blob has no mode-5 chunk."""
    drawn = _draw_chunk(b, rng, 0x05)
    if drawn is None:
        return None
    mc, pl, c, p, n = drawn
    K = p[2]
    sub = rng.choice(["E", "K_bad", "mask_bad", "K_mask", "exp_raw", "head_cut", "version", "as_f16",
                      "nibble_pad", "nibble_len"],
                     p=[.14, .1, .1, .12, .12, .08, .08, .08, .08, .1])
    if sub == "E":
        p[1] = int(rng.choice([0, 255, p[1] - 1, p[1] + 1, int(rng.integers(256))])) & 0xFF
        pl[c] = bytes(p)
        return "mctx:E", "mctx", b.pack(pl), ref, None
    if sub == "K_bad":
        p[2] = int(rng.choice([0, 9, 16, 255]))
        pl[c] = bytes(p)
        return "mctx:K_bad", "mctx", b.pack(pl), ref, ("error", MSG_MCTX, None)
    if sub == "mask_bad":
        p[3] = 0 if rng.random() < 0.3 or K >= 8 else p[3] | (1 << int(rng.integers(K, 8)))
        pl[c] = bytes(p)
        return "mctx:mask_bad", "mctx", b.pack(pl), ref, ("error", MSG_MCTX, None)
    if sub == "K_mask":     # valid by structure, wrong for the exponents (or right by chance)
        k2 = int(rng.integers(1, 9))
        p[2] = k2
        p[3] = int(rng.integers(1, 1 << k2))
        pl[c] = bytes(p)
        return "mctx:K_mask", "mctx", b.pack(pl), ref, None
    if sub == "exp_raw":    # the exponent record replaced by a raw one of random bytes
        (plen,) = struct.unpack_from("<I", p, 5)
        rec = bytes([0]) + struct.pack("<I", n) + rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        pl[c] = bytes(p[:4]) + rec + bytes(p[9 + plen:])
        return "mctx:exp_raw", "mctx", b.pack(pl), ref, None
    if sub == "head_cut":   # 0..3 bytes: inside the mode byte, E, K and mask
        pl[c] = bytes(p[:int(rng.integers(4))])
        return "mctx:head_cut", "mctx", b.pack(pl), ref, ("error", MSG_TRUNC, None)
    if sub == "version":    # a mode-5 chunk in a version-2 or -4 blob (with a reference, its hash forged to
        # that version's: it is checked first, and each version has its own checksums)
        v = int(rng.choice([2, 4]))
        h = b.refhash
        if ref is not None:
            h = api._ref_hash(api._ro_bytes(ref), b.h["total"], b.chunk, b.h["unit"], 1, ck_mode(v))
        return f"mctx:in_v{v}", "mctx", b.pack(version=v, refhash=h), ref, ("error", MSG_VERSION, None)
    if sub == "as_f16":     # the same units read as float16: no mode 5 there (the message required where
        # chunk 0 is the mode-5 chunk: another chunk before it may fail first, as float16 streams)
        r = None if ref is None else ref.view(np.float16)
        return "mctx:as_f16", "mctx", b.pack(code=2), r, ("error", MSG_FLAGS, None) if mc[0] == 0 else None
    if sub == "nibble_pad" and n % 2:
        p[-1] |= 0x10 << int(rng.integers(4))
        pl[c] = bytes(p)
        return "mctx:nibble_pad", "mctx", b.pack(pl), ref, ("error", MSG_PAD, None)
    # nibble_len: one nibble byte less or more
    pl[c] = bytes(p[:-1]) if rng.random() < 0.5 else bytes(p) + bytes([int(rng.integers(256))])
    return "mctx:nibble_len", "mctx", b.pack(pl), ref, ("error", MSG_LEN, None)


def _raw_record(sym):
    """A raw stream record (mode 0) of the symbols sym."""
    return bytes([0]) + struct.pack("<I", len(sym)) + bytes(bytearray(sym))


def _delta_mutation(b, rng, ref):
    """A forgery of the delta mode (chunk mode 6: byte 6, the cut c in bits (a multiple of 4 below W), the
    field width q in {2, 4, 8}, u32 m <= n escapes, c // 8 low byte stream records of n symbols, where
    c % 8 = 4 a nibble record of ceil(n / 2) symbols, the packed record of ceil(n / (8 / q)) symbols, and
    where m > 0 ceil((W - c) / 8) escape records of m symbols; format v6, float layouts, a reference).
    Refused: c not a multiple of 4 or not below W, another q, m > n, m one more or one less than the escapes
    the packed fields give (the escape records re-encoded raw with m +- 1 values), a non-zero unused field
    in the last packed byte (n not a multiple of 8 / q: the packed record re-encoded raw) or a non-zero
    unused final nibble (n odd: the nibble record re-encoded raw), an escape whose h = 2^q - 1 + e does not
    fit W - c bits (the escape records re-encoded raw), a cut inside the 7-byte head, the blob's version set
    to 2, 4 or 5, the dtype relabelled to an integer type of the same unit (no mode 6 there; the message
    required where chunk 0 is a delta chunk: another chunk before it may fail first).  Not refused by
    structure (they must decode exactly or fail with a FormatError: the escapes, the checksum): a record
    replaced by a raw one of random bytes of its length; a 16-bit float blob relabelled as the other 16-bit
    float (the delta chunk codes units, so its chunks decode to the same bits).  Returns (kind, owner, blob,
    reference, expected) as mutations() or None if the blob has no mode-6 chunk."""
    drawn = _draw_chunk(b, rng, 0x06)
    if drawn is None:
        return None
    dc, pl, c, p, n = drawn
    unit = b.h["unit"]
    W = 8 * unit
    cut, q = p[1], p[2]
    (m,) = struct.unpack_from("<I", p, 3)
    g = 8 // q
    ns = (n + g - 1) // g
    nb, nib = cut // 8, cut % 8 != 0          # low byte records, a nibble record
    ne = (W - cut + 7) // 8                   # escape records
    pk = nb + nib                             # the packed record's index
    recs = _records(p, 7, pk + 1 + (ne if m else 0))
    esc0 = recs[pk][1]     # the escape records' start (the end of the packed record)

    def symbols(k, count):  # record k decoded (the oracle's stream decoder)
        return pyref.stream_record(bytes(p), recs[k][0], recs[k][1], count, b.version, set())[0]

    sub = rng.choice(["c_bad", "q_bad", "m_big", "m_off", "pad_field", "esc_big", "head_cut", "version",
                      "as_int", "as_float", "records"],
                     p=[.09, .09, .08, .14, .12, .1, .08, .08, .07, .05, .1])
    if sub == "c_bad":      # not a multiple of 4, or not below W
        p[1] = int(rng.choice([1, 2, 3, 5, 6, 9, 14, W - 2, W - 1, W, W + 4, W + 8, 255]))
        pl[c] = bytes(p)
        return "delta:c_bad", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "q_bad":
        p[2] = int(rng.choice([0, 1, 3, 5, 6, 7, 9, 16, 32, 255]))
        pl[c] = bytes(p)
        return "delta:q_bad", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "m_big":
        struct.pack_into("<I", p, 3, int(rng.choice([n + 1, n + 2, 2 * n + 1, 1 << 31, (1 << 32) - 1])))
        pl[c] = bytes(p)
        return "delta:m_big", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "m_off":      # m +- 1 and escape records that hold m +- 1 values: not the escapes of the fields
        esc = [symbols(pk + 1 + t, m) for t in range(ne)] if m else [[] for _ in range(ne)]
        if m == 0 or rng.random() < 0.5:
            m2 = m + 1
            esc = [e + [int(rng.integers(256))] for e in esc]
        else:
            m2 = m - 1
            esc = [e[:-1] for e in esc]
        tail = b"".join(_raw_record(e) for e in esc) if m2 else b""
        pl[c] = bytes(p[:3]) + struct.pack("<I", m2) + bytes(p[7:esc0]) + tail
        return "delta:m_off", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "pad_field" and nib and n % 2 and rng.random() < 0.5:   # the unused final high nibble set
        nb_ = symbols(nb, (n + 1) // 2)
        nb_[-1] |= int(rng.integers(1, 16)) << 4
        pl[c] = bytes(p[:recs[nb][0]]) + _raw_record(nb_) + bytes(p[recs[nb][1]:])
        return "delta:pad_nibble", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "pad_field" and n % g:   # a set bit in an unused field of the last packed byte
        fields = symbols(pk, ns)
        used = q * (n % g)
        fields[-1] |= int(rng.integers(1, 1 << (8 - used))) << used
        pl[c] = bytes(p[:recs[pk][0]]) + _raw_record(fields) + bytes(p[esc0:])
        return "delta:pad_field", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "esc_big" and m:   # one escape with M + e >= 2^(W - c) (e below 2^(8 ne))
        esc = [symbols(pk + 1 + t, m) for t in range(ne)]
        lo = (1 << (W - cut)) - (1 << q) + 1
        top = 1 << (8 * ne)
        e = int(rng.choice([lo, top - 1, int(rng.integers(lo, top))]))
        j = int(rng.integers(m))
        for t in range(ne):
            esc[t][j] = (e >> (8 * t)) & 255
        pl[c] = bytes(p[:esc0]) + b"".join(_raw_record(x) for x in esc)
        return "delta:esc_big", "delta", b.pack(pl), ref, ("error", MSG_DELTA, None)
    if sub == "head_cut":   # 0..6 bytes: inside the mode byte, c, q and m
        pl[c] = bytes(p[:int(rng.integers(7))])
        return "delta:head_cut", "delta", b.pack(pl), ref, ("error", MSG_TRUNC, None)
    if sub == "version":    # a mode-6 chunk in a version-2, -4 or -5 blob, its reference hash forged to that
        # version's (as _mctx_mutation); a chunk before it may fail first unless the checksums stay (v5)
        v = int(rng.choice([2, 4, 5]))
        h = b.refhash
        if ref is not None:
            h = api._ref_hash(api._ro_bytes(ref), b.h["total"], b.chunk, b.h["unit"], 1, ck_mode(v))
        exp = ("error", MSG_VERSION, None) if dc[0] == 0 or v == 5 else None
        return f"delta:in_v{v}", "delta", b.pack(version=v, refhash=h), ref, exp
    if sub == "as_int":     # the same units as an integer dtype: no mode 6 there
        code = int(rng.choice([7, 8] if unit == 2 else [9, 10]))
        r = None if ref is None else ref.view(api._DTYPES[code][0])
        exp = ("error", MSG_FLAGS, None) if dc[0] == 0 else ("relabel", code, None)
        return "delta:as_int", "delta", b.pack(code=code), r, exp
    if sub == "as_float" and unit == 2:   # bf16 <-> fp16: a delta chunk decodes to the same units
        code = 2 if b.code == 3 else 3
        r = None if ref is None else ref.view(api._DTYPES[code][0])
        return "delta:as_float", "delta", b.pack(code=code), r, ("relabel", code, None)
    # records: one record replaced by a raw one of random bytes of its length (valid structure; a nibble
    # record's unused final nibble may be set: refused then)
    k = int(rng.integers(len(recs)))
    count = n if k < nb else ((n + 1) // 2 if k < pk else (ns if k == pk else m))
    rec = _raw_record(rng.integers(0, 256, count, dtype=np.uint8).tobytes())
    pl[c] = bytes(p[:recs[k][0]]) + rec + bytes(p[recs[k][1]:])
    what = "low" if k < nb else ("nibble" if k < pk else ("packed" if k == pk else "escape"))
    return f"delta:records_{what}", "delta", b.pack(pl), ref, None


def _joint_bit(w, j, bit):
    """(byte inside its block, bit of that byte) that holds bit `bit` of field j (0..127) of a block of w-bit
    raw fields (FORMAT.md, joint-symbol chunk): bits 0-3 in the 4-bit plane, bits 4-5 in the 2-bit plane
    (w >= 6), bit w - 1 in the 1-bit plane (w odd)."""
    if bit < 4:
        return j % 64, 4 * (j // 64) + bit
    if w >= 6 and bit < 6:
        return 64 + j % 32, 2 * (j // 32) + bit - 4
    return 16 * (w - 1) + j % 16, j // 16


def _joint_mutation(b, rng, ref):
    """A forgery of the joint-symbol mode (chunk mode 7: byte 7, k in 1..3, the base b, the stream record of
    the n symbols, then 16 (8 - k) ceil(n / 128) bytes of raw fields in blocks of 128, the fields past n zero;
    format v9, bfloat16 only).  Refused: k = 0 or > 3; another valid k (the raw fields are then of another
    length); the raw fields cut or extended by 1 byte up to a block; a set bit in a padding field of the last
    block (n not a multiple of 128: each bit of a field, so each plane); a stream mode byte above 3; a record
    length past the end of the chunk; a cut inside the 3-byte head or the record's 5-byte header; the blob's
    version set to 8, 5 or 2; the dtype relabelled float16 or int16 (units of 2 bytes, no mode 7; the message
    required where chunk 0 is the mode-7 chunk, or with version 8, whose checksums are version 9's: another
    chunk may fail first).  Not refused by structure (they must decode exactly or fail with a FormatError: the
    checksum, the Huffman tables): another base b (symbols that wrap past 255), another record length inside
    the chunk, the symbol record replaced by a raw one of random bytes, a constant or a one-symbol rANS one, a
    flipped bit of a field inside n, the chunk read as mode 0.  Returns (kind, owner, blob, reference,
    expected) as mutations() or None if the blob has no mode-7 chunk."""
    drawn = _draw_chunk(b, rng, 0x07)
    if drawn is None:
        return None
    jc, pl, c, p, n = drawn
    k = p[1]
    w = 8 - k
    (L,) = struct.unpack_from("<I", p, 4)
    q = 8 + L                    # the raw fields
    nblk = (n + 127) // 128
    sub = rng.choice(["k_bad", "k_other", "base", "rec_mode", "rec_len", "rec_swap", "area_len", "pad",
                      "field", "head_cut", "version", "relabel", "as_alone"],
                     p=[.07, .06, .1, .07, .1, .1, .1, .12, .08, .06, .05, .05, .04])
    if sub == "k_bad":
        p[1] = int(rng.choice([0, 4, 5, 7, 8, 128, 255]))
        pl[c] = bytes(p)
        return "joint:k_bad", "joint", b.pack(pl), ref, ("error", MSG_JOINT, None)
    if sub == "k_other":
        p[1] = int(rng.choice([v for v in (1, 2, 3) if v != k]))
        pl[c] = bytes(p)
        return "joint:k_other", "joint", b.pack(pl), ref, ("error", MSG_LEN, None)
    if sub == "base":
        p[2] = int(rng.choice([0, 255, p[2] - 1, p[2] + 1, p[2] ^ 128, int(rng.integers(256))])) & 0xFF
        pl[c] = bytes(p)
        return "joint:base", "joint", b.pack(pl), ref, None
    if sub == "rec_mode":        # an unknown stream mode (refused), or another known one
        p[3] = int(rng.choice([0, 1, 2, 3, 4, 5, 128, 255]))
        pl[c] = bytes(p)
        exp = ("error", MSG_SMODE, None) if p[3] > 3 else None
        return "joint:rec_mode", "joint", b.pack(pl), ref, exp
    if sub == "rec_len":         # past the end of the chunk (refused), or inside it
        past = rng.random() < 0.5
        if past:
            v = int(rng.choice([len(p) - 7, len(p), 1 << 31, (1 << 32) - 1, len(p) - 8 + int(rng.integers(1, 99))]))
        else:
            v = int(rng.choice([0, 1, L - 1, L + 1, n, len(p) - 8, int(rng.integers(len(p) - 7))]))
        struct.pack_into("<I", p, 4, v & 0xFFFFFFFF)
        pl[c] = bytes(p)
        exp = ("error", MSG_TRUNC, None) if v > len(p) - 8 else None
        return "joint:rec_len", "joint", b.pack(pl), ref, exp
    if sub == "rec_swap":        # a structurally valid record of other symbols
        how = rng.choice(["raw", "const"])
        if how == "raw":
            rec = _raw_record(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        else:
            rec = _const_record(rng)
        pl[c] = bytes(p[:3]) + rec + bytes(p[q:])
        return f"joint:rec_{how}", "joint", b.pack(pl), ref, None
    if sub == "area_len":        # 1 byte up to a block less or more
        d = int(rng.choice([1, 2, 15, 16 * w - 1, 16 * w]))
        if rng.random() < 0.5:
            pl[c] = bytes(p[:max(q, len(p) - d)])
        else:
            pl[c] = bytes(p) + rng.integers(0, 256, d, dtype=np.uint8).tobytes()
        return "joint:area_len", "joint", b.pack(pl), ref, ("error", MSG_LEN, None)
    if sub == "pad" and n % 128:  # a bit of a field past n set (each plane in turn)
        j = int(rng.integers(n % 128, 128))
        byte, bit = _joint_bit(w, j, int(rng.integers(w)))
        p[q + 16 * w * (nblk - 1) + byte] |= 1 << bit
        pl[c] = bytes(p)
        return "joint:pad", "joint", b.pack(pl), ref, ("error", MSG_PAD, None)
    if sub in ("field", "pad"):  # a bit of a field inside n flipped: other units (the checksum)
        i = int(rng.integers(n))
        byte, bit = _joint_bit(w, i % 128, int(rng.integers(w)))
        p[q + 16 * w * (i // 128) + byte] ^= 1 << bit
        pl[c] = bytes(p)
        return "joint:field", "joint", b.pack(pl), ref, None
    if sub == "head_cut":        # 0..7 bytes: the mode byte, k, b and the record's header
        pl[c] = bytes(p[:int(rng.integers(8))])
        return "joint:head_cut", "joint", b.pack(pl), ref, ("error", MSG_TRUNC, None)
    if sub == "version":         # (a reference hash forged to that version's, as _mctx_mutation)
        v = int(rng.choice([2, 5, 8]))
        h = b.refhash
        if ref is not None:
            h = api._ref_hash(api._ro_bytes(ref), b.h["total"], b.chunk, b.h["unit"], 1, ck_mode(v))
        exp = ("error", MSG_VERSION, None) if jc[0] == 0 or v == 8 else None
        return f"joint:in_v{v}", "joint", b.pack(version=v, refhash=h), ref, exp
    if sub == "relabel":         # float16 or int16: no mode 7 there
        code = int(rng.choice([2, 7]))
        r = None if ref is None else ref.view(api._DTYPES[code][0])
        exp = ("error", MSG_FLAGS, None) if jc[0] == 0 else ("relabel", code, None)
        return f"joint:as_{'f16' if code == 2 else 'int16'}", "joint", b.pack(code=code), r, exp
    # as_alone: mode byte 0, k, b and the rest read as mode 0's two stream records
    p[0] = 0
    pl[c] = bytes(p)
    return "joint:as_alone", "joint", b.pack(pl), ref, None
