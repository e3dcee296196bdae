"""Structure-aware fuzzer of the lmc decoder (issue 21, item 4).

Real blobs (weights of a small torch model and one Adam step of it, an XOR-coded
reference, sparse int8 data, random bits, predicted-exponent chunks of bf16/fp32/fp16
tensors with several row lengths, mantissa-context chunks, delta chunks of bf16/fp16/fp32
steps against their reference, joint-symbol chunks of bf16 tensors with k = 1, 2, 3) are
parsed down to their fields (FORMAT.md: header, chunk table, chunk modes, stream records,
Huffman tables and jump tables, rANS frequency tables, states and words, temporal context
masks, R and raw bits, the row length of a predicted-exponent chunk, the cut, field width
and escape count of a delta chunk, k, base and raw fields of a joint-symbol chunk) and then
damaged where it hurts: fields set to boundary values, bytes flipped or replaced inside
chunk payloads, chunks truncated, extended, cut or spliced with the chunk table and the
header CRC-32 recomputed (so that the CRC shields nothing), chunk boundaries moved,
chunk checksums and header fields forged, and a wrong reference passed (also with its
hash forged into the header), and the predicted-exponent, mantissa-context, delta and
joint-symbol modes forged (_pred_mutation, _mctx_mutation, _delta_mutation, _joint_mutation).
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

The seed blobs (build_corpus, save_corpus, load_corpus), the blob parser (Blob) and
coverage() live in the sibling module fuzz_blobs.py, the forgeries of chunk modes 4, 5, 6 and 7
(_pred_mutation, _mctx_mutation, _delta_mutation, _joint_mutation) in fuzz_modes.py; both are re-exported
here. This module
holds the generic mutations and the driver (run, main).
"""
import argparse
import collections
import json
import os
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import lmc  # noqa: E402
from lmc import api  # noqa: E402
from lmc.kernels.base import ck_mode  # noqa: E402
from fuzz_blobs import (  # noqa: E402,F401  (the seed blobs and the blob parser; re-exported)
    CHUNK_NAMES, STREAM_NAMES, Blob, build_corpus, coverage, delta_specs, joint_specs, load_corpus, pred_specs,
    save_corpus)
from fuzz_modes import (  # noqa: E402,F401  (the mode-4, -5, -6 and -7 forgeries; re-exported)
    MSG_DELTA, MSG_FLAGS, MSG_JOINT, MSG_LEN, MSG_MCTX, MSG_PAD, MSG_PRED, MSG_SMODE, MSG_TRUNC, MSG_VERSION,
    _delta_mutation, _joint_mutation, _mctx_mutation, _pred_mutation)
from fuzz_zmask import Masked, is_masked, zmask_mutation  # noqa: E402  (format 10's zero-mask blobs)


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
    kinds = ["field", "byte", "truncate", "extend", "cut", "splice", "boundary", "chk", "header", "mode",
             "valid_table", "pred", "mctx"]
    probs = [.30, .10, .08, .04, .06, .04, .04, .03, .06, .05, .11, .05, .04]
    if any(x[:1] == b"\x06" for x in b.payloads):   # the delta forgeries where they apply (a blob
        kinds.append("delta")                        # without mode-6 chunks draws as before them)
        probs[0] -= .04
        probs.append(.04)
    if any(x[:1] == b"\x07" for x in b.payloads):   # the joint-symbol forgeries likewise
        kinds.append("joint")
        probs[0] -= .05
        probs.append(.05)
    kind = rng.choice(kinds, p=probs)
    if kind == "pred":
        r = _pred_mutation(b, rng, ref)
        if r is not None:
            return r
        kind = "field"
    if kind == "mctx":
        r = _mctx_mutation(b, rng, ref)
        if r is not None:
            return r
        kind = "field"
    if kind == "delta":
        r = _delta_mutation(b, rng, ref)
        if r is not None:
            return r
        kind = "field"
    if kind == "joint":
        r = _joint_mutation(b, rng, ref)
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
        p[g[0]] = int(rng.integers(9))     # 0..7 valid chunk modes (0..3 stream modes), 8 not
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
    if sub == 0:             # another version (1-8: newer modes invalid; 3, 4, 5-7, 8-9: another checksum)
        v = int(rng.choice([v for v in (1, 2, 3, 4, 5, 6, 7, 8, 9) if v != b.version]))
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
        same = [k for k, (dt, u, _) in api._DTYPES.items() if u == b.h["unit"] and k != b.code]
        code = int(rng.choice(same))
        r = None if ref is None else ref.view(api._DTYPES[code][0])
        return "hdr:dtype", owner, b.pack(code=code), r, ("relabel", code, None)
    if sub == 4 and ref is not None:   # a wrong reference with its hash forged into the header
        bad = ref.copy()
        bu = bad.reshape(-1).view(np.uint8)
        k = int(rng.integers(bu.size))
        bu[k] ^= 1 << int(rng.integers(8))
        h = api._ref_hash(api._ro_bytes(bad), b.h["total"], b.chunk, b.h["unit"], 1, ck_mode(b.version))
        return "ref:forged_hash", owner, b.pack(refhash=h), bad, None
    if ref is not None:      # a wrong reference, hash left (must be refused)
        bad = ref.copy()
        bad.reshape(-1).view(np.uint8)[int(rng.integers(ref.nbytes))] ^= 1
        return "ref:wrong", owner, b.pack(), bad, None
    return "ref:missing_flag", owner, b.pack(refhash=0x1234), None, None


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
    if g[3] not in ("temporal", "mctx", "temporal32", "mctx32") and delta:   # a stream record: fix its length
        rec = max(h[0] for h in F if h[2] == "stream_len" and h[0] < q)
        v = struct.unpack_from("<I", p, rec)[0]
        struct.pack_into("<I", p, rec, v + delta)
    return name, g[3], bytes(p)


# ---------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------
def selftest():
    """The checked build must turn an overrun into IndexError (else the fuzzer
    could not see one): a checked helper and a kernel's own indexing."""
    from lmc.kernels import intrinsics as I
    from lmc.kernels import base as K
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


def _expected(x, spec):
    if spec is None:
        return x
    what, arg, _ = spec
    if what == "reshape":
        return x.reshape(arg)
    if what == "empty":
        return np.empty(arg, x.dtype)
    return x.view(api._DTYPES[arg][0])


def run(corpus, cases, seed=0, stop_after=20, log=None, stack=0.0):
    """Decode `cases` mutated blobs; returns (stats, failures).  stack: the
    share of cases that get a few random bit flips on top of their mutation."""
    rng = np.random.default_rng(seed)
    parsed = [Masked(c["blob"], Blob) if is_masked(c["blob"]) else Blob(c["blob"]) for c in corpus]
    stats = {"cases": 0, "outcome": collections.Counter(), "by_owner": collections.Counter(),
             "by_kind": collections.Counter(), "exact_by_owner": collections.Counter(),
             "errors": collections.Counter()}
    failures = []
    for i in range(cases):
        j = i % len(corpus)
        case, b = corpus[j], parsed[j]
        if isinstance(b, Masked):
            kind, owner, blob, ref, spec = zmask_mutation(b, rng, case["ref"], mutations)
        else:
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
    from lmc.kernels import intrinsics
    import numba
    t = time.time()
    stats, failures = run(corpus, a.cases, a.seed, stack=a.stack,
                          log=lambda f: print("FAIL", {k: v for k, v in f.items() if k != "blob"},
                                              flush=True))
    summary = dict(cases=stats["cases"], seconds=round(time.time() - t, 1), seed=a.seed, stack=a.stack,
                   build=dict(jit=not numba.config.DISABLE_JIT, checked_helpers=intrinsics.CHECKED,
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
