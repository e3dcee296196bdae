"""Independent pure-Python decoder of the lmc format (versions 1 to 9),
written from FORMAT.md, used as an oracle by the tests.  Slow; for small
blobs only.  decode(blob, ref_bytes) -> (unit bytes, chunk modes used,
stream modes used); raises ValueError on anything invalid."""
import struct
import zlib

UNIT = {1: 4, 2: 2, 3: 2, 4: 8, 5: 1, 6: 1, 7: 2, 8: 2, 9: 4, 10: 4, 11: 8, 12: 8, 13: 1,
        14: 8, 15: 1, 16: 1}
LAYOUT = {1: "f32", 2: "f16", 3: "bf16"}
NS = {"f32": 4, "f16": 3, "bf16": 2}
FLOAT = {"f32": (32, 23, 0xFF), "f16": (16, 10, 0x1F), "bf16": (16, 7, 0xFF)}
M64 = (1 << 64) - 1


def checksum(units, strong=False):
    """Versions 1-4; strong (version 5): x ^= x >> 32, x *= C2 before the last step."""
    C1, C2, C3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0xD6E8FEB86659FD93
    s1 = s2 = 0
    for i, v in enumerate(units):
        s1 = (s1 + v) & M64
        x = ((v ^ (i * C3 & M64)) * C1) & M64
        if strong:
            x = ((x ^ (x >> 32)) * C2) & M64
        s2 = (s2 + (x ^ (x >> 29))) & M64

    def fold(x):
        return (x ^ (x >> 32)) & 0xFFFFFFFF
    return fold(s1) | fold(s2) << 32


def halves_checksum(words):
    """Versions 8 and 9: s1 the words' sum; s2 the sum of lo * hi, the 32-bit halves of w_i ^ (i * C3); s2 goes through
    version 5's mix of index 0 before it is folded."""
    C3 = 0xD6E8FEB86659FD93
    s1 = sum(words) & M64
    s2 = 0
    for i, w in enumerate(words):
        x = w ^ (i * C3 & M64)
        s2 += (x & 0xFFFFFFFF) * (x >> 32)
    s2 = ((s2 & M64) * 0x9E3779B97F4A7C15) & M64
    s2 = ((s2 ^ (s2 >> 32)) * 0xBF58476D1CE4E5B9) & M64
    s2 ^= s2 >> 29

    def fold(x):
        return (x ^ (x >> 32)) & 0xFFFFFFFF
    return fold(s1) | fold(s2) << 32


def word_checksum(data, version):
    """Versions 4 to 9: over the chunk bytes' 64-bit little-endian words, the last zero-padded: version 4's mix,
    5-7 the strong mix, 8 and 9 the halves' product."""
    data = bytes(data) + bytes(-len(data) % 8)
    words = [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
    return halves_checksum(words) if version >= 8 else checksum(words, version >= 5)


def split(v, lay, unit):
    if lay == "bf16":
        return [(v >> 7) & 0xFF, ((v >> 8) & 0x80) | (v & 0x7F)]
    if lay == "f16":
        return [(v >> 10) & 0x1F, ((v >> 13) & 4) | ((v >> 8) & 3), v & 0xFF]
    if lay == "f32":
        return [(v >> 23) & 0xFF, ((v >> 24) & 0x80) | ((v >> 16) & 0x7F), (v >> 8) & 0xFF, v & 0xFF]
    return [(v >> (8 * j)) & 0xFF for j in range(unit)]


def merge(bs, lay, unit):
    if lay == "bf16":
        return ((bs[1] & 0x80) << 8) | (bs[0] << 7) | (bs[1] & 0x7F)
    if lay == "f16":
        return ((bs[1] & 4) << 13) | ((bs[0] & 0x1F) << 10) | ((bs[1] & 3) << 8) | bs[2]
    if lay == "f32":
        return ((bs[1] & 0x80) << 24) | (bs[0] << 23) | ((bs[1] & 0x7F) << 16) | (bs[2] << 8) | bs[3]
    return sum(b << (8 * j) for j, b in enumerate(bs))


class Bits:
    """LSB-first bit reader over b[lo:hi]."""

    def __init__(self, b, lo, hi):
        self.b, self.lo, self.hi, self.pos = b, lo, hi, 0

    def read(self, k):
        v = 0
        for j in range(k):
            byte = self.lo + ((self.pos + j) >> 3)
            if byte >= self.hi:
                raise ValueError("bit stream overrun")
            v |= ((self.b[byte] >> ((self.pos + j) & 7)) & 1) << j
        self.pos += k
        return v

    def finish(self):
        if (self.pos + 7) // 8 != self.hi - self.lo:
            raise ValueError("bit stream length")
        if self.pos & 7 and self.b[self.hi - 1] >> (self.pos & 7):
            raise ValueError("padding")


def huffman(b, pos, end, n):
    lo, hi = b[pos], b[pos + 1]
    if hi < lo:
        raise ValueError("table")
    cnt = hi - lo + 1
    nbt = (cnt + 1) // 2
    lens = {}
    for j in range(cnt):
        L = (b[pos + 2 + j // 2] >> (4 * (j & 1))) & 15
        if L:
            lens[lo + j] = L
    if cnt & 1 and b[pos + 2 + nbt - 1] >> 4:
        raise ValueError("table pad")
    if lo not in lens or hi not in lens or max(lens.values()) > 11 \
            or sum(2 ** (11 - L) for L in lens.values()) != 2048:
        raise ValueError("kraft")
    code, nxt, codes = 0, {}, {}
    bl = [sum(1 for L in lens.values() if L == k) for k in range(13)]
    for k in range(1, 12):
        code = (code + bl[k - 1]) << 1
        nxt[k] = code
    for s in sorted(lens):
        codes[(lens[s], nxt[lens[s]])] = s
        nxt[lens[s]] += 1
    q = pos + 2 + nbt
    ln = list(struct.unpack_from("<III", b, q))
    q += 12
    if sum(ln) > end - q:
        raise ValueError("jump table")
    ln.append(end - q - sum(ln))
    out = [0] * n
    st = q
    for k in range(4):
        br = Bits(b, st, st + ln[k])
        for i in range(k, n, 4):
            c, L = 0, 0
            while True:
                c = (c << 1) | br.read(1)
                L += 1
                if (L, c) in codes:
                    out[i] = codes[(L, c)]
                    break
                if L > 11:
                    raise ValueError("code")
        br.finish()
        st += ln[k]
    return out


def freq_table(b, pos, end, maxsym):
    if pos + 2 > end:
        raise ValueError("freq trunc")
    lo, hi = b[pos], b[pos + 1]
    if hi < lo or hi > maxsym:
        raise ValueError("freq range")
    pos += 2
    f = {}
    for s in range(lo, hi + 1):
        if pos >= end:
            raise ValueError("freq trunc")
        if b[pos] & 0x80:
            if pos + 1 >= end:
                raise ValueError("freq trunc")
            v = ((b[pos] & 0x7F) << 8) | b[pos + 1]
            if not 128 <= v <= 4096:
                raise ValueError("freq value")
            pos += 2
        else:
            v = b[pos]
            pos += 1
        f[s] = v
    if sum(f.values()) != 4096 or not f[lo] or not f[hi]:
        raise ValueError("freq sum")
    slots = []
    for s in range(lo, hi + 1):
        slots += [s] * f[s]
    cum = {}
    t = 0
    for s in range(lo, hi + 1):
        cum[s] = t
        t += f[s]
    return (f, cum, slots), pos


def states(n, version):
    """The interleaved states of a rANS stream of n symbols (FORMAT.md, "rANS"): 32 from format 7 for
    n >= 8192, else 4."""
    return 32 if version >= 7 and n >= 8192 else 4


def rans(b, pos, end, tables, n, S=4):
    """tables[i] = (f, cum, slots) for symbol i; S interleaved states (symbol i with state i mod S)."""
    if end - pos < 4 * S:
        raise ValueError("rans trunc")
    x = list(struct.unpack_from(f"<{S}I", b, pos))
    if min(x) < 1 << 16:
        raise ValueError("rans state")
    p = pos + 4 * S
    out = []
    for i in range(n):
        f, cum, slots = tables[i]
        k = i % S
        slot = x[k] & 4095
        s = slots[slot]
        x[k] = f[s] * (x[k] >> 12) + slot - cum[s]
        if x[k] < 1 << 16:
            if p + 2 > end:
                raise ValueError("rans overrun")
            x[k] = (x[k] << 16) | b[p] | b[p + 1] << 8
            p += 2
        out.append(s)
    if p != end or x != [1 << 16] * S:
        raise ValueError("rans final")
    return out


def temporal(b, pos, end, n, lay, ref_units, version):
    W, mb, em = FLOAT[lay]
    sb, mask = 1 << (W - 1), (1 << W) - 1
    E = b[pos]
    cmask = b[pos + 1] | b[pos + 2] << 8
    pos += 3
    ctx = []
    for r in ref_units:
        e = (r >> mb) & em
        ctx.append(15 if e == em else min(max(E - e, 0), 14))
    if sum(1 << c for c in set(ctx)) != cmask:
        raise ValueError("context mask")
    tabs = {}
    for c in range(16):
        if cmask >> c & 1:
            tabs[c], pos = freq_table(b, pos, end, 2 * W)
    (R,) = struct.unpack_from("<I", b, pos)
    pos += 4
    if R > end - pos:
        raise ValueError("R")
    syms = rans(b, pos, pos + R, [tabs[c] for c in ctx], n, states(n, version))
    br = Bits(b, pos + R, end)
    out = []
    for s, r in zip(syms, ref_units):
        d = 0
        if s:
            k = (s + 1) // 2
            a = (1 << (k - 1)) | br.read(k - 1)
            d = a if s & 1 else -a
        mr = r ^ mask if r & sb else r ^ sb
        mv = (mr + d) & mask
        out.append(mv ^ sb if mv & sb else mv ^ mask)
    br.finish()
    return out


def stream_record(b, q, end, n, version, smodes):
    """One stream record at b[q:end]: (its n symbols, the position after it)."""
    if end - q < 5:
        raise ValueError("stream record truncated")
    sm = b[q]
    (L,) = struct.unpack_from("<I", b, q + 1)
    q += 5
    if L > end - q:
        raise ValueError("stream length")
    smodes.add(sm)
    if sm == 0 and L == n:
        plane = list(b[q:q + n])
    elif sm == 1 and L == 1:
        plane = [b[q]] * n
    elif sm == 2:
        plane = huffman(b, q, q + L, n)
    elif sm == 3 and version >= 2:
        t, r0 = freq_table(b, q, q + L, 255)
        plane = rans(b, r0, q + L, [t] * n, n, states(n, version))
    else:
        raise ValueError("stream mode")
    return plane, q + L


def mantissa_context(b, pos, end, n, version, smodes):
    """A mantissa-context chunk body (FORMAT.md, mode 5): E, K, the context mask, the exponent's stream
    record, one table per context in the mask, R, the rANS stream of sign << 3 | top 3 mantissa bits (context
    clamp(E - e, 0, K - 1)), then the low 4 mantissa bits, two per byte."""
    if end - pos < 3:
        raise ValueError("mctx header")
    E, K, cmask = b[pos], b[pos + 1], b[pos + 2]
    if not 1 <= K <= 8 or cmask == 0 or cmask >> K:
        raise ValueError("mctx header")
    exps, q = stream_record(b, pos + 3, end, n, version, smodes)
    ctx = [min(max(E - e, 0), K - 1) for e in exps]
    if sum(1 << c for c in set(ctx)) != cmask:
        raise ValueError("context mask")
    tabs = {}
    for c in range(8):
        if cmask >> c & 1:
            tabs[c], q = freq_table(b, q, end, 15)
    if end - q < 4:
        raise ValueError("R")
    (R,) = struct.unpack_from("<I", b, q)
    q += 4
    if R > end - q:
        raise ValueError("R")
    syms = rans(b, q, q + R, [tabs[c] for c in ctx], n, states(n, version))
    nib = b[q + R:end]
    if len(nib) != (n + 1) // 2 or (n % 2 and nib[-1] >> 4):
        raise ValueError("nibbles")
    return [(t >> 3) << 15 | e << 7 | (t & 7) << 4 | (nib[i // 2] >> (4 * (i % 2)) & 15)
            for i, (e, t) in enumerate(zip(exps, syms))]


def delta(b, pos, end, n, lay, ref_units, version, smodes):
    """A delta chunk body (FORMAT.md, mode 6): c, q, u32 m, then the c // 8 low byte streams (n symbols),
    where c % 8 = 4 the nibble stream (ceil(n / 2) symbols), the packed stream (ceil(n / (8 / q)) symbols)
    and, where m > 0, the ceil((W - c) / 8) escape streams (m symbols).  Element i: its q-bit field f_i
    (LSB first, g = 8 / q to a byte); h_i = f_i, or 2^q - 1 + the next escape value (little-endian over the
    escape streams) where f_i = 2^q - 1; z_i = h_i << c | its low part; d_i = unzigzag(z_i); the unit =
    unmono(mono(r_i) + d_i mod 2^W)."""
    W = FLOAT[lay][0]
    sb, mask = 1 << (W - 1), (1 << W) - 1
    if end - pos < 6:
        raise ValueError("delta header")
    cut, q = b[pos], b[pos + 1]
    (m,) = struct.unpack_from("<I", b, pos + 2)
    if cut % 4 or cut >= W or q not in (2, 4, 8) or m > n:
        raise ValueError("delta header")
    p = pos + 6
    low = []
    for _ in range(cut // 8):
        plane, p = stream_record(b, p, end, n, version, smodes)
        low.append(plane)
    nib = None
    if cut % 8:
        nib, p = stream_record(b, p, end, (n + 1) // 2, version, smodes)
        if n % 2 and nib[-1] >> 4:
            raise ValueError("unused nibble")
    g = 8 // q
    packed, p = stream_record(b, p, end, (n + g - 1) // g, version, smodes)
    esc = []
    if m:
        for _ in range((W - cut + 7) // 8):
            plane, p = stream_record(b, p, end, m, version, smodes)
            esc.append(plane)
    if p != end:
        raise ValueError("trailing")
    M = (1 << q) - 1
    if n % g and packed[-1] >> (q * (n % g)):
        raise ValueError("unused field")
    out = []
    j = 0
    for i in range(n):
        h = packed[i // g] >> (q * (i % g)) & M
        if h == M:
            if j >= m:
                raise ValueError("escapes")
            h += sum(e[j] << (8 * t) for t, e in enumerate(esc))
            j += 1
            if h >> (W - cut):
                raise ValueError("escape too large")
        lo = sum(low[t][i] << (8 * t) for t in range(cut // 8))
        if nib is not None:
            lo |= (nib[i // 2] >> (4 * (i % 2)) & 15) << (8 * (cut // 8))
        z = h << cut | lo
        d = (z >> 1) ^ -(z & 1)
        r = ref_units[i]
        mr = r ^ mask if r & sb else r ^ sb
        mv = (mr + d) & mask
        out.append(mv ^ sb if mv & sb else mv ^ mask)
    if j != m:
        raise ValueError("escapes")
    return out


def joint_fields(blk, w):
    """The 128 raw fields of one block of 16 * w bytes (FORMAT.md, joint-symbol chunk): bits 0-3 from the 4-bit
    plane (bytes 0..63: element j low nibble, j + 64 high), bits 4-5 from the 2-bit plane where w >= 6 (bytes
    64..95: elements j, j + 32, j + 64, j + 96 at bits 0-1, 2-3, 4-5, 6-7), bit w - 1 from the 1-bit plane where
    w is odd (the last 16 bytes: element j + 16 m at bit m)."""
    f = [0] * 128
    for j in range(64):
        f[j] |= blk[j] & 15
        f[j + 64] |= blk[j] >> 4
    if w >= 6:
        for j in range(32):
            for m in range(4):
                f[j + 32 * m] |= (blk[64 + j] >> (2 * m) & 3) << 4
    if w % 2:
        for j in range(16):
            for m in range(8):
                f[j + 16 * m] |= (blk[16 * (w - 1) + j] >> m & 1) << (w - 1)
    return f


def joint(b, pos, end, n, version, smodes):
    """A joint-symbol chunk body (FORMAT.md, mode 7): k (1..3), the base exponent b, the stream record of the
    n symbols t_i = ((e_i - b) mod 256) << k | top k mantissa bits, then the raw fields (sign and the other 7 - k
    mantissa bits, w = 8 - k bits each) in blocks of 128 elements, 16 * w bytes a block; fields past n must be 0
    and the blocks must end the chunk."""
    if end - pos < 2:
        raise ValueError("joint header")
    k, base = b[pos], b[pos + 1]
    if k not in (1, 2, 3):
        raise ValueError("joint k")
    syms, q = stream_record(b, pos + 2, end, n, version, smodes)
    w = 8 - k
    nblk = (n + 127) // 128
    if end - q != 16 * w * nblk:
        raise ValueError("joint raw fields length")
    fields = []
    for g in range(nblk):
        fields += joint_fields(b[q + 16 * w * g:q + 16 * w * (g + 1)], w)
    if any(fields[n:]):
        raise ValueError("joint field past n")
    lo = 7 - k
    return [(r >> lo) << 15 | ((base + (t >> k)) & 0xFF) << 7 | (t & ((1 << k) - 1)) << lo | (r & ((1 << lo) - 1))
            for t, r in zip(syms, fields)]


def smodes_chunk_all_const(b, q, ns):
    """Every stream record of the chunk at b[q:] is constant (mode 1, or rANS with one symbol)."""
    for _ in range(ns):
        sm = b[q]
        (L,) = struct.unpack_from("<I", b, q + 1)
        if sm == 3:
            (f, _cum, _slots), _r = freq_table(b, q + 5, q + 5 + L, 255)
            if max(f.values()) != 4096:
                return False
        elif sm != 1:
            return False
        q += 5 + L
    return True


def unpredict(r, w):
    """The exponents from their residuals (FORMAT.md, predicted-exponent chunk): 0 for the first 4; the
    exponent 4 to the left up to i = w + 3; then the median of a (4 to the left), b (the one above) and
    a + b - c (c: 4 to the left of the one above)."""
    e = []
    for i, ri in enumerate(r):
        if i < 4:
            pred = 0
        elif i < w + 4:
            pred = e[i - 4]
        else:
            a, bb, c = e[i - 4], e[i - w], e[i - w - 4]
            pred = sorted((a, bb, a + bb - c))[1]
        e.append((ri + pred) % 256)
    return e


def decode(blob, ref=None):
    b = bytes(blob)
    if b[:4] != b"LMC1":
        raise ValueError("magic")
    version, code, flags, ndim = b[4], b[5], b[6], b[7]
    if not 1 <= version <= 10 or code not in UNIT or flags not in ((2,) if version == 10 else (0, 1)) or ndim > 32:
        raise ValueError("header")
    shape = struct.unpack_from(f"<{ndim}Q", b, 8)
    pos = 8 + 8 * ndim
    if flags == 2:
        return zero_mask(b, pos, code, shape)
    chunk, nch = struct.unpack_from("<II", b, pos)
    pos += 8
    if flags & 1:
        pos += 8  # reference hash (checked by lmc itself)
    tab = [struct.unpack_from("<IQ", b, pos + 12 * c) for c in range(nch)]
    pos += 12 * nch
    if zlib.crc32(b[:pos]) != struct.unpack_from("<I", b, pos)[0]:
        raise ValueError("crc")
    pos += 4
    total = 1
    for s in shape:
        total *= s
    unit = UNIT[code]
    lay = LAYOUT.get(code, "planes")
    ns = NS.get(lay, unit)
    out = bytearray()
    cmodes, smodes = set(), set()
    for c, (size, chk) in enumerate(tab):
        n = min(chunk, total - c * chunk)
        end = pos + size
        mode = b[pos]
        cmodes.add(mode)
        refu = None
        if ref is not None:
            rb = ref[c * chunk * unit:(c * chunk + n) * unit]
            refu = [int.from_bytes(rb[i * unit:(i + 1) * unit], "little") for i in range(n)]
        if mode == 2:
            if size != 1 + n * unit:
                raise ValueError("stored size")
            units = [int.from_bytes(b[pos + 1 + i * unit:pos + 1 + (i + 1) * unit], "little")
                     for i in range(n)]
        elif mode == 3:
            if version < 2 or lay == "planes" or refu is None:
                raise ValueError("temporal not allowed")
            units = temporal(b, pos + 1, end, n, lay, refu, version)
        elif mode == 6:
            if version < 6 or lay == "planes" or refu is None:
                raise ValueError("delta not allowed")
            units = delta(b, pos + 1, end, n, lay, refu, version, smodes)
        elif mode == 5:
            if version < 5 or lay != "bf16":
                raise ValueError("mantissa context not allowed")
            units = mantissa_context(b, pos + 1, end, n, version, smodes)
        elif mode == 7:
            if version < 9 or lay != "bf16":
                raise ValueError("joint symbol not allowed")
            units = joint(b, pos + 1, end, n, version, smodes)
        elif mode in (0, 1, 4):
            if mode == 1 and refu is None:
                raise ValueError("no ref")
            q = pos + 1
            if mode == 4:
                if version < 3 or lay == "planes":
                    raise ValueError("predicted exponent not allowed")
                (w,) = struct.unpack_from("<I", b, q)
                if w == 0:
                    raise ValueError("row length 0")
                q += 4
            planes = []
            for s in range(ns):
                plane, q = stream_record(b, q, end, n, version, smodes)
                planes.append(plane)
            if q != end:
                raise ValueError("trailing")
            if mode == 4:
                if smodes_chunk_all_const(b, pos + 5, ns):
                    raise ValueError("every stream constant")
                planes[0] = unpredict(planes[0], w)
            units = [merge([planes[s][i] for s in range(ns)], lay, unit) for i in range(n)]
            if mode == 1:
                units = [u ^ r for u, r in zip(units, refu)]
        else:
            raise ValueError("chunk mode")
        chunk_bytes = b"".join(u.to_bytes(unit, "little") for u in units)
        if (word_checksum(chunk_bytes, version) if version >= 4 else checksum(units)) != chk:
            raise ValueError("checksum")
        out += chunk_bytes
        pos = end
    if pos != len(b):
        raise ValueError("length")
    return bytes(out), cmodes, smodes


def zero_mask(b, pos, code, shape):
    """A zero-mask blob (FORMAT.md, version 10): k, the bitmap blob's length, the header CRC; the bitmap (uint8,
    MSB first, 1 = a kept element) and the kept elements, each a blob of version 9 or older with no reference."""
    k, nbits = struct.unpack_from("<QQ", b, pos)
    pos += 16
    if zlib.crc32(b[:pos]) != struct.unpack_from("<I", b, pos)[0]:
        raise ValueError("crc")
    pos += 4
    if pos + nbits > len(b):
        raise ValueError("zero mask bitmap length")
    total = 1
    for s in shape:
        total *= s
    unit = UNIT[code]
    inner = []
    for part, want_code in ((b[pos:pos + nbits], 6), (b[pos + nbits:], code)):
        if len(part) < 8 or part[4] > 9 or part[5] != want_code or part[6] != 0:
            raise ValueError("zero mask part")
        data, cm, sm = decode(part)
        inner.append((data, cm, sm))
    (bits, cm, sm), (vals, cm2, sm2) = inner
    if len(bits) != (total + 7) // 8 or len(vals) != k * unit:
        raise ValueError("zero mask sizes")
    keep = [(bits[i >> 3] >> (7 - (i & 7))) & 1 for i in range(8 * len(bits))]
    if any(keep[total:]) or sum(keep) != k:
        raise ValueError("zero mask bits")
    out = bytearray(total * unit)
    j = 0
    for i in range(total):
        if keep[i]:
            out[i * unit:(i + 1) * unit] = vals[j * unit:(j + 1) * unit]
            j += 1
    return bytes(out), cm | cm2, sm | sm2
