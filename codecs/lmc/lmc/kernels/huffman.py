"""lmc kernels: the Huffman coder - canonical codes (length-limited, package-merge) from the counts per
sub-stream (``kernels.histo``), the decoder (multi-symbol tables, 4 sub-streams) with its stream reader
(``decode_huff_stream``), and the structural check of a Huffman stream record (``check_huff_stream``).
The 4-way interleaved encoder and the payload writer are ``kernels.huffenc``."""

import numpy as np
from numba import njit

from .intrinsics import clz64, ld, load_u32, load_u64, store_u32
from .intrinsics import st as put
from .base import (ERR_KRAFT, ERR_PAD, ERR_STREAM, ERR_TABLE, ERR_TRUNC, MAXLEN, OK, TABSIZE, _B57, _CM, _M11,
                   _M32, _M57, _M63, _S8, _U0, _i4, _slow_load)
from .hfixed import fixed_decode4
from .hmulti import multi8


# ---------------------------------------------------------------------------
# Huffman code construction
# ---------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def _package_merge(w, m, depth):
    """Optimal length-limited (<= MAXLEN) code lengths by package-merge
    (Larmore-Hirschberg).  w: the m >= 2 (m <= 2^MAXLEN) weights sorted
    ascending; writes depth[i] = code length of leaf i (non-increasing in
    i, Kraft sum exactly 1).

    List l (l = MAXLEN-1 .. 0, list MAXLEN-1 = the leaves) merges the leaves
    with the pairs ("packages") of consecutive items of list l+1; no list
    needs more than 2m-2 items.  nl[l, k] = leaves among the first k items
    of list l.  Selecting the first 2m-2 items of list 0 and following the
    packages down, leaf i's length is the number of lists in which it is
    selected (selected leaves are always a prefix of the sorted leaves)."""
    cap = 2 * m - 2
    wt = np.empty((MAXLEN, cap), np.int64)
    nl = np.empty((MAXLEN, cap + 1), np.int64)
    cnt = np.empty(MAXLEN, np.int64)
    last = MAXLEN - 1
    nl[last, 0] = 0
    for i in range(m):
        wt[last, i] = w[i]
        nl[last, i + 1] = i + 1
    cnt[last] = m
    for lev in range(last - 1, -1, -1):
        npk = cnt[lev + 1] >> 1
        i = 0
        j = 0
        k = 0
        nl[lev, 0] = 0
        while k < cap and (i < m or j < npk):
            if j < npk:
                pw = wt[lev + 1, 2 * j] + wt[lev + 1, 2 * j + 1]
                if i < m and w[i] <= pw:
                    wt[lev, k] = w[i]
                    i += 1
                else:
                    wt[lev, k] = pw
                    j += 1
            else:
                wt[lev, k] = w[i]
                i += 1
            k += 1
            nl[lev, k] = i
        cnt[lev] = k
    for i in range(m):
        depth[i] = 0
    k = cap
    for lev in range(MAXLEN):
        c = nl[lev, k]
        for i in range(c):
            depth[i] += 1
        k = 2 * (k - c)


@njit(nogil=True, cache=True)
def _take_lightest(w, iw, i, j, k, m, par_leaf, par_int):
    """One step of the two-queue Huffman construction: the lighter of the
    next leaf w[i] and the next internal node iw[j] (j < k) becomes a child
    of internal node k.  Returns (its weight, i, j) advanced."""
    if i < m and (j >= k or w[i] <= iw[j]):
        par_leaf[i] = k
        return w[i], i + 1, j
    par_int[j] = k
    return iw[j], i, j + 1


@njit(nogil=True, cache=True)
def huffman_lengths(freq, lens):
    """Length-limited (<= 11) Huffman code lengths for 256 symbol
    frequencies.  Writes lens (uint8[256], 0 = absent) and returns the number
    of present symbols.  With >= 2 symbols the code is complete (Kraft sum
    exactly 1).  A plain Huffman code (two-queue construction) is used when
    its depth fits; otherwise the optimal length-limited code is computed
    by package-merge (an encoder choice only: any complete code with
    lengths <= 11 is valid)."""
    m = 0
    for s in range(256):
        lens[s] = 0
        if freq[s] > 0:
            m += 1
    if m <= 1:
        return m
    keys = np.empty(m, np.int64)
    w = np.empty(m, np.int64)
    sym = np.empty(m, np.int64)
    iw = np.empty(m, np.int64)
    par_leaf = np.empty(m, np.int64)
    par_int = np.empty(m, np.int64)
    dep_int = np.empty(m, np.int64)
    j = 0
    for s in range(256):
        if freq[s] > 0:
            keys[j] = np.int64(freq[s]) * 256 + s
            j += 1
    keys.sort()
    for i in range(m):
        w[i] = keys[i] >> 8
        sym[i] = keys[i] & 255
    i = 0
    j = 0
    for k in range(m - 1):
        a, i, j = _take_lightest(w, iw, i, j, k, m, par_leaf, par_int)
        b, i, j = _take_lightest(w, iw, i, j, k, m, par_leaf, par_int)
        iw[k] = a + b
    dep_int[m - 2] = 0
    for k in range(m - 3, -1, -1):
        dep_int[k] = dep_int[par_int[k]] + 1
    maxd = 0
    for i in range(m):
        d = dep_int[par_leaf[i]] + 1
        if d > maxd:
            maxd = d
    if maxd <= MAXLEN:
        for i in range(m):
            lens[sym[i]] = dep_int[par_leaf[i]] + 1
        return m
    _package_merge(w, m, dep_int)
    for i in range(m):
        lens[sym[i]] = dep_int[i]
    return m


@njit(nogil=True, cache=True)
def canonical_codes(lens, codes):
    """Canonical (deflate-style) codes, returned bit-reversed (LSB-first) in
    codes (uint64[256])."""
    bl = np.zeros(MAXLEN + 2, np.int64)
    for s in range(256):
        if lens[s] > 0:
            bl[lens[s]] += 1
    nxt = np.zeros(MAXLEN + 2, np.int64)
    code = 0
    for b in range(1, MAXLEN + 1):
        code = (code + bl[b - 1]) << 1
        nxt[b] = code
    for s in range(256):
        L = np.int64(lens[s])
        if L > 0:
            c = nxt[L]
            nxt[L] += 1
            r = 0
            for t in range(L):
                r = (r << 1) | ((c >> t) & 1)
            codes[s] = np.uint64(r)
        else:
            codes[s] = _U0


@njit(nogil=True, cache=True)
def build_decode_table(lens, dec):
    """Fill dec (uint16[2048], entry = symbol | length << 8).  Returns False
    if a length exceeds 11 or the Kraft sum is not exactly 1."""
    kraft = 0
    for s in range(256):
        L = np.int64(lens[s])
        if L > MAXLEN:
            return False
        if L > 0:
            kraft += 1 << (MAXLEN - L)
    if kraft != TABSIZE:
        return False
    codes = np.empty(256, np.uint64)
    canonical_codes(lens, codes)
    for s in range(256):
        L = np.int64(lens[s])
        if L > 0:
            e = np.uint16(s | (L << 8))
            for idx in range(np.int64(codes[s]), TABSIZE, 1 << L):
                dec[idx] = e
    return True


# ---------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def build_multi_table(dec, dec3):
    """From the single-symbol table build dec3 (uint64[2048]): up to 4
    symbols whose codes fit entirely in the 11 peeked bits (one 4-byte store
    writes them all).  Entry: total_bits | sym1 << 8 | sym2 << 16 |
    sym3 << 24 | sym4 << 32 | count << 40 (bits 4-7 are zero, so ``x & 63``
    is the shift count, and ``x & _CM`` adds the bit and symbol counts to a
    reader's ``bits | symbols << 40``)."""
    for idx in range(TABSIZE):
        e = np.int64(dec[idx])
        tot = e >> 8
        syms = e & 255
        cnt = 1
        rest = idx >> tot
        while cnt < 4:
            e2 = np.int64(dec[rest])
            l2 = e2 >> 8
            if tot + l2 > MAXLEN:
                break
            syms |= (e2 & 255) << (8 * cnt)
            tot += l2
            cnt += 1
            rest >>= l2
        dec3[idx] = np.uint64(tot | (syms << 8) | (cnt << 40))


@njit(nogil=True, cache=True)
def huff_decode4(buf, st, ln, dec, dec3, dec1, single, out, n, tmp, inter=True):
    """Decode n symbols from 4 interleaved LSB-first sub-streams (symbol i in
    sub-stream i % 4); sub-stream k occupies buf[st[k] : st[k] + ln[k]].
    Sub-stream k is first decoded into tmp[k*r : k*r + (n+3-k)//4],
    r = (n+3)//4 + 16 (tmp needs 4*r bytes; the fast loop stores 4 bytes at
    a time, up to 3 past the last symbol), then interleaved into out[:n].
    single: every code is >= 6 bits long; then dec1 (uint16[2048], entry =
    length | symbol << 8) is used instead of dec3.  inter False: the symbols
    are left in tmp (out is not written)."""
    m = (n + 3) >> 2
    r = m + 16
    s0 = st[0]
    s1 = st[1]
    s2 = st[2]
    s3 = st[3]
    L0 = ln[0]
    L1 = ln[1]
    L2 = ln[2]
    L3 = ln[3]
    b0 = 0
    b1 = 0
    b2 = 0
    b3 = 0
    # symbol counts of the sub-streams minus 20 (5 lookups of <= 4 symbols)
    e0 = ((n + 3) >> 2) - 20
    e1 = ((n + 2) >> 2) - 20
    e2 = ((n + 1) >> 2) - 20
    e3 = (n >> 2) - 20
    if single:
        # every code is >= 6 bits: one symbol per lookup, all readers advance
        # in lockstep (5 symbols per refill).  A sentinel bit above the 57
        # loaded bits gives the bits consumed: clz(a) - 6.
        u0 = tmp[0:r]
        u1 = tmp[r:2 * r]
        u2 = tmp[2 * r:3 * r]
        u3 = tmp[3 * r:4 * r]
        o = 0
        e = (n >> 2) - 5
        while (o <= e and (b0 >> 3) + 8 <= L0 and (b1 >> 3) + 8 <= L1
               and (b2 >> 3) + 8 <= L2 and (b3 >> 3) + 8 <= L3):
            a0 = ((load_u64(buf, s0 + (b0 >> 3)) >> np.uint64(b0 & 7)) & _M57) | _B57
            a1 = ((load_u64(buf, s1 + (b1 >> 3)) >> np.uint64(b1 & 7)) & _M57) | _B57
            a2 = ((load_u64(buf, s2 + (b2 >> 3)) >> np.uint64(b2 & 7)) & _M57) | _B57
            a3 = ((load_u64(buf, s3 + (b3 >> 3)) >> np.uint64(b3 & 7)) & _M57) | _B57
            for t in range(5):
                x0 = np.uint64(ld(dec1, a0 & _M11))
                x1 = np.uint64(ld(dec1, a1 & _M11))
                x2 = np.uint64(ld(dec1, a2 & _M11))
                x3 = np.uint64(ld(dec1, a3 & _M11))
                put(u0, o + t, x0 >> _S8)
                put(u1, o + t, x1 >> _S8)
                put(u2, o + t, x2 >> _S8)
                put(u3, o + t, x3 >> _S8)
                a0 >>= x0 & _M63
                a1 >>= x1 & _M63
                a2 >>= x2 & _M63
                a3 >>= x3 & _M63
            b0 += clz64(a0) - 6
            b1 += clz64(a1) - 6
            b2 += clz64(a2) - 6
            b3 += clz64(a3) - 6
            o += 5
        o0 = o
        o1 = o
        o2 = o
        o3 = o
    else:
        # per reader: c = bits consumed | symbols decoded << 40 (the bit count
        # stays < 2^32: <= 11 bits per symbol, <= 2^25 symbols per sub-stream)
        c0 = 0
        c1 = 0
        c2 = 0
        c3 = 0
        t0 = tmp[0:r]
        t1 = tmp[r:2 * r]
        t2 = tmp[2 * r:3 * r]
        t3 = tmp[3 * r:4 * r]
        while True:
            b0 = c0 & 0xFFFFFFFF
            b1 = c1 & 0xFFFFFFFF
            b2 = c2 & 0xFFFFFFFF
            b3 = c3 & 0xFFFFFFFF
            if ((c0 >> 40) > e0 or (c1 >> 40) > e1 or (c2 >> 40) > e2 or (c3 >> 40) > e3
                    or (b0 >> 3) + 8 > L0 or (b1 >> 3) + 8 > L1
                    or (b2 >> 3) + 8 > L2 or (b3 >> 3) + 8 > L3):
                break
            # 8-byte loads lie inside each sub-stream; >= 57 valid bits each,
            # 5 lookups consume <= 55
            a0 = load_u64(buf, s0 + (b0 >> 3)) >> np.uint64(b0 & 7)
            a1 = load_u64(buf, s1 + (b1 >> 3)) >> np.uint64(b1 & 7)
            a2 = load_u64(buf, s2 + (b2 >> 3)) >> np.uint64(b2 & 7)
            a3 = load_u64(buf, s3 + (b3 >> 3)) >> np.uint64(b3 & 7)
            for t in range(5):
                x0 = ld(dec3, a0 & _M11)
                x1 = ld(dec3, a1 & _M11)
                x2 = ld(dec3, a2 & _M11)
                x3 = ld(dec3, a3 & _M11)
                store_u32(t0, c0 >> 40, np.uint32((x0 >> _S8) & _M32))
                store_u32(t1, c1 >> 40, np.uint32((x1 >> _S8) & _M32))
                store_u32(t2, c2 >> 40, np.uint32((x2 >> _S8) & _M32))
                store_u32(t3, c3 >> 40, np.uint32((x3 >> _S8) & _M32))
                a0 >>= x0 & _M63
                a1 >>= x1 & _M63
                a2 >>= x2 & _M63
                a3 >>= x3 & _M63
                c0 += np.int64(x0 & _CM)
                c1 += np.int64(x1 & _CM)
                c2 += np.int64(x2 & _CM)
                c3 += np.int64(x3 & _CM)
        b0 = c0 & 0xFFFFFFFF
        b1 = c1 & 0xFFFFFFFF
        b2 = c2 & 0xFFFFFFFF
        b3 = c3 & 0xFFFFFFFF
        o0 = c0 >> 40
        o1 = c1 >> 40
        o2 = c2 >> 40
        o3 = c3 >> 40
    bp = _i4(b0, b1, b2, b3)
    op = _i4(o0, o1, o2, o3)
    for k in range(4):
        b = bp[k]
        L = ln[k]
        sk = st[k]
        rk = k * r
        for i in range(op[k], (n + 3 - k) >> 2):
            if b > 8 * L:
                return ERR_STREAM
            if (b >> 3) + 8 <= L:
                acc = load_u64(buf, sk + (b >> 3)) >> np.uint64(b & 7)
            else:
                acc = _slow_load(buf, sk, L, b >> 3) >> np.uint64(b & 7)
            e = dec[acc & _M11]
            tmp[rk + i] = np.uint8(e & 0xFF)
            b += np.int64(e >> 8)
        if (b + 7) >> 3 != L:
            return ERR_STREAM
        if b & 7:
            if (buf[sk + L - 1] >> (b & 7)) != 0:
                return ERR_PAD
    if not inter:
        return OK
    # interleave: out[4i + k] = sub-stream k symbol i
    q = n >> 2
    t0 = tmp[0:q]
    t1 = tmp[r:r + q]
    t2 = tmp[2 * r:2 * r + q]
    t3 = tmp[3 * r:3 * r + q]
    for i in range(q):
        store_u32(out, 4 * i, np.uint32(t0[i]) | (np.uint32(t1[i]) << 8)
                  | (np.uint32(t2[i]) << 16) | (np.uint32(t3[i]) << 24))
    for k in range(n - 4 * q):
        out[4 * q + k] = tmp[k * r + q]
    return OK


@njit(nogil=True, cache=True)
def read_huff_table(blob, pos, plen, lens):
    """The code lengths of the Huffman stream record blob[pos:pos+plen] (lo,
    hi, then 4 bits per symbol lo..hi) into lens; checks that the table and
    the 3 sub-stream sizes after it lie inside the record, the padding nibble
    and that lo and hi have codes.  Returns (status, lo, hi, position after
    the table)."""
    end = pos + plen
    if plen < 2:
        return ERR_TRUNC, 0, 0, 0
    lo = np.int64(blob[pos])
    hi = np.int64(blob[pos + 1])
    if hi < lo:
        return ERR_TABLE, 0, 0, 0
    cnt = hi - lo + 1
    nbt = (cnt + 1) // 2
    if pos + 2 + nbt + 12 > end:
        return ERR_TRUNC, 0, 0, 0
    for s in range(256):
        lens[s] = 0
    q = pos + 2
    for j in range(cnt):
        byte = blob[q + (j >> 1)]
        lens[lo + j] = (byte >> (4 * (j & 1))) & 15
    if cnt & 1:
        if (blob[q + nbt - 1] >> 4) != 0:
            return ERR_TABLE, 0, 0, 0
    if lens[lo] == 0 or lens[hi] == 0:
        return ERR_TABLE, 0, 0, 0
    return OK, lo, hi, q + nbt


@njit(nogil=True, cache=True)
def decode_huff_stream(blob, pos, plen, p, n, lens, dec, dec3, dec1, tmp, inter=True):
    end = pos + plen
    status, lo, hi, q = read_huff_table(blob, pos, plen, lens)
    if status != OK:
        return status
    cnt = hi - lo + 1
    if not build_decode_table(lens, dec):
        return ERR_KRAFT
    st = np.empty(4, np.int64)
    ln = np.empty(4, np.int64)
    ln[0] = np.int64(load_u32(blob, q))
    ln[1] = np.int64(load_u32(blob, q + 4))
    ln[2] = np.int64(load_u32(blob, q + 8))
    q += 12
    rem = end - q
    acc = 0
    for k in range(3):
        if ln[k] > rem - acc:
            return ERR_TRUNC
        st[k] = q + acc
        acc += ln[k]
    st[3] = q + acc
    ln[3] = rem - acc
    k = np.int64(lens[lo])
    fixed = cnt == 1 << k
    for j in range(cnt):
        fixed = fixed and np.int64(lens[lo + j]) == k
    if fixed:   # every symbol of the range at length k: a fixed-length code
        return fixed_decode4(blob, st, ln, k, dec, p, n, tmp, inter)
    minlen = MAXLEN
    for j in range(cnt):
        L = np.int64(lens[lo + j])
        if L > 0 and L < minlen:
            minlen = L
    single = 2 * minlen > MAXLEN
    if single:
        for idx in range(TABSIZE):
            e = dec[idx]
            dec1[idx] = np.uint16((e >> 8) | ((e & 0xFF) << 8))
    elif not multi8(dec, dec3):   # (the vector build where the CPU has one: kernels.hmulti)
        build_multi_table(dec, dec3)
    return huff_decode4(blob, st, ln, dec, dec3, dec1, single, p, n, tmp, inter)


@njit(nogil=True, cache=True)
def check_huff_stream(blob, pos, plen, n, lens):
    """The Huffman stream record's table, jump table and sub-stream sizes
    (each sub-stream of c symbols must have between c * minlen and
    c * maxlen + 7 bits)."""
    end = pos + plen
    status, lo, hi, q = read_huff_table(blob, pos, plen, lens)
    if status != OK:
        return status
    kraft = 0
    mn = MAXLEN
    mx = 0
    for j in range(lo, hi + 1):
        L = np.int64(lens[j])
        if L > MAXLEN:
            return ERR_KRAFT
        if L > 0:
            kraft += 1 << (MAXLEN - L)
            mn = min(mn, L)
            mx = max(mx, L)
    if kraft != TABSIZE:
        return ERR_KRAFT
    rem = end - q - 12
    acc = 0
    for k in range(4):
        if k < 3:
            Lk = np.int64(load_u32(blob, q + 4 * k))
            if Lk > rem - acc:
                return ERR_TRUNC
        else:
            Lk = rem - acc
        acc += Lk
        c = (n + 3 - k) >> 2
        if c * mn > 8 * Lk or 8 * Lk > c * mx + 7:
            return ERR_STREAM
    return OK
