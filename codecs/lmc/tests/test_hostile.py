"""Hostile input (issue 21, item 4): the structure-aware fuzzer (fuzz_decoder.py) in
the normal build and in two checked builds (pure Python with every load/store and
index checked; JIT with NUMBA_BOUNDSCHECK=1 and checked helpers), memory touched
before a forged blob is refused (peak RSS of child processes), and the output-size
limit of lmc.decompress and the numcodecs codec."""
import json
import os
import struct
import subprocess
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

import lmc
import fuzz_decoder as FZ

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ["chunk:alone", "chunk:xor", "chunk:stored", "chunk:temporal", "chunk:pred",
         "alone/huffman", "alone/rans", "alone/raw", "alone/const", "xor/huffman", "xor/rans", "xor/const",
         "pred/huffman", "pred/raw", "pred/const", "chunk:mctx", "mctx/huffman", "chunk:delta", "delta/raw",
         "delta/const", "temporal32", "alone/rans32", "mctx32", "xor/rans32",   # *32: format 7's 32-state streams
         "chunk:joint", "joint/huffman",
         "alone/huffman-fixed", "pred/huffman-fixed"]   # Huffman streams of one length k over 2^k symbols
# the predicted-exponent forgeries of fuzz_decoder._pred_mutation (chunk mode 4, format v3)
PRED_KINDS = ("pred:w", "pred:w_zero", "pred:residual_raw", "pred:residual_const", "pred:residual_rans1",
              "pred:all_const", "pred:head_cut", "pred:in_v1", "pred:in_v2", "pred:as_alone",
              "pred:from_alone", "pred:from_alone_int", "field:pred_w")


def _kinds(by_kind, prefix):
    """Cases of mutation kinds starting with prefix (stacked ones included)."""
    return sum(v for k, v in by_kind.items() if k.startswith(prefix))


@pytest.fixture(scope="module")
def corpus():
    return [c for c in FZ.build_corpus(0) if not FZ.is_masked(c["blob"])]   # (the mask: test_zmask.py)


def _check_summary(d, min_cases):
    assert d["failures"] == 0, d
    assert d["cases"] >= min_cases
    assert set(d["outcome"]) == {"FormatError", "exact"}, d["outcome"]
    assert d["outcome"]["FormatError"] > d["cases"] // 2
    for owner in ("alone/huffman", "alone/rans", "xor/rans", "temporal", "stored", "xor/huffman",
                  "pred", "pred/huffman"):
        assert d["by_owner"].get(owner, 0) >= 5, (owner, d["by_owner"])
    # mode 4 (predicted exponent) was in the corpus and was forged in this build
    assert d["coverage"].get("chunk:pred", 0) >= 8, d["coverage"]
    assert _kinds(d["by_kind"], "pred:") >= 10, d["by_kind"]
    assert _kinds(d["by_kind"], "field:pred_w") >= 3, d["by_kind"]
    # mode 5 (mantissa context) likewise
    assert d["coverage"].get("chunk:mctx", 0) >= 4, d["coverage"]
    assert d["by_owner"].get("mctx", 0) >= 5, d["by_owner"]
    # mode 6 (delta) likewise
    assert d["coverage"].get("chunk:delta", 0) >= 8, d["coverage"]
    assert d["by_owner"].get("delta", 0) >= 5 and d["by_owner"].get("delta/raw", 0) >= 5, d["by_owner"]
    # mode 7 (joint symbol) likewise
    assert d["coverage"].get("chunk:joint", 0) >= 4, d["coverage"]
    assert d["by_owner"].get("joint", 0) >= 5, d["by_owner"]
    # format 7's 32-state rANS streams likewise (the pure-Python build's small corpus: one temporal seed)
    assert d["coverage"].get("temporal32", 0) >= 1, d["coverage"]
    if d["build"]["jit"]:
        assert d["by_owner"].get("temporal32", 0) >= 5 and d["by_owner"].get("alone/rans32", 0) >= 5, d["by_owner"]


def test_corpus_uses_every_mode(corpus):
    cov = FZ.coverage(corpus)
    for m in MODES:
        assert cov[m] > 0, (m, cov)
    assert any(c["ref"] is not None for c in corpus) and any(c["ref"] is None for c in corpus)
    for c in corpus:   # the corpus itself decodes
        assert lmc.decompress(c["blob"], reference=c["ref"]).tobytes() == c["x"].tobytes()
    # mode-4 chunks in bf16, fp32 and fp16 blobs, with row lengths w = 1, inside a chunk
    # and larger than a chunk (read from the chunks themselves)
    dts, ws = set(), set()
    for c in corpus:
        b = FZ.Blob(c["blob"])
        for c4, p in enumerate(b.payloads):
            if p[0] == 4:
                assert b.version >= 3 and c["ref"] is None
                (w,) = struct.unpack_from("<I", p, 1)
                dts.add(str(c["x"].dtype))
                ws.add("1" if w == 1 else "<chunk" if w < b.n_of(c4) else ">chunk")
    assert dts == {"bfloat16", "float32", "float16"}, dts
    # both checksums: format 4's over words (the default) and versions 1-3's over units
    assert {FZ.Blob(c["blob"]).version >= 4 for c in corpus} == {True, False}
    assert ws == {"1", "<chunk", ">chunk"}, ws


def test_fuzz_normal_build(corpus):
    # (some forgery kinds of PRED_KINDS are drawn only 2 or 3 times in 4000 cases, so a seed may miss one:
    # 4000 cases and seed 1, then seed 5 with the delta seeds, now 8000 and seed 6 with the format-7 seeds)
    stats, failures = FZ.run(corpus, 8000, seed=6, stack=0.2)
    assert not failures, failures[:3]
    assert sum(v for k, v in stats["by_kind"].items() if k.endswith("+flips")) > 400
    by_owner = stats["by_owner"]
    assert stats["outcome"]["exact"] > 0 and stats["outcome"]["FormatError"] > 3000
    for owner in ("alone/huffman", "alone/rans", "alone/raw", "alone/const", "xor/huffman",
                  "xor/rans", "xor/const", "temporal", "stored"):
        assert by_owner[owner] >= 20, (owner, by_owner)
    for kind in ("table:huff_swap", "table:freq_move", "table:huff_jump_shift", "truncate",
                 "ref:forged_hash", "hdr:dtype", "hdr:shape"):
        assert stats["by_kind"][kind] > 0, kind
    # mode 4: every forgery of it ran, its chunks were damaged by the generic mutations
    # too, and the refusals it must get were seen
    for owner in ("pred", "pred/huffman", "pred/raw", "pred/const"):
        assert by_owner[owner] >= 20, (owner, by_owner)
    for kind in PRED_KINDS:
        assert _kinds(stats["by_kind"], kind) > 0, (kind, stats["by_kind"])
    assert _kinds(stats["by_kind"], "pred:") >= 80, stats["by_kind"]
    assert stats["exact_by_owner"]["pred"] > 0    # a forged row length that changes nothing
    errs = stats["errors"]
    assert errs["predicted-exponent chunk: row length 0, or every stream constant"] > 0, errs


# the mantissa-context forgeries of fuzz_decoder._mctx_mutation (chunk mode 5, format v5)
MCTX_KINDS = ("mctx:E", "mctx:K_bad", "mctx:mask_bad", "mctx:K_mask", "mctx:exp_raw", "mctx:head_cut",
              "mctx:in_v2", "mctx:in_v4", "mctx:as_f16", "mctx:nibble_pad", "mctx:nibble_len")


def test_fuzz_mantissa_context(corpus):
    """Mode-5 seeds (bf16, prefer="size"; alone and in a blob with a reference): every forgery of the mode
    and the generic mutations, with the refusals FORMAT.md requires."""
    mc = [c for c in corpus if any(p[:1] == b"\x05" for p in FZ.Blob(c["blob"]).payloads)]
    assert {c["ref"] is None for c in mc} == {True, False}
    stats, failures = FZ.run(mc, 3000, seed=1, stack=0.2)
    assert not failures, failures[:3]
    for kind in MCTX_KINDS:
        assert _kinds(stats["by_kind"], kind) > 0, (kind, stats["by_kind"])
    assert stats["by_owner"]["mctx"] >= 500 and stats["by_owner"]["mctx/huffman"] >= 200, stats["by_owner"]
    assert stats["exact_by_owner"]["mctx"] > 0     # e.g. another valid base E that gives the same contexts
    errs = stats["errors"]
    for msg in ("mantissa-context chunk: context count outside 1..8", "context mask does not match",
                "unused final nibble", "newer than the blob's format version"):
        assert any(msg in e for e in errs), (msg, errs)


# the delta forgeries of fuzz_decoder._delta_mutation (chunk mode 6, format v6)
DELTA_KINDS = ("delta:c_bad", "delta:q_bad", "delta:m_big", "delta:m_off", "delta:pad_field", "delta:pad_nibble",
               "delta:esc_big", "delta:head_cut", "delta:in_v2", "delta:in_v4", "delta:in_v5", "delta:as_int",
               "delta:as_float", "delta:records_low", "delta:records_nibble", "delta:records_packed",
               "delta:records_escape")


def test_fuzz_delta(corpus):
    """Mode-6 seeds (bf16, fp16 and fp32 against a reference, prefer="fast": 2-, 4- and 8-bit fields, cuts at
    bits 0, 4 and 8, escapes of 2, 3 and 4 bytes): every forgery of the mode and the generic mutations, with
    the refusals FORMAT.md requires."""
    dc = [c for c in corpus if any(p[:1] == b"\x06" for p in FZ.Blob(c["blob"]).payloads)]
    assert all(c["ref"] is not None for c in dc)
    assert {str(c["x"].dtype) for c in dc} == {"bfloat16", "float16", "float32"}
    heads = set()
    for c in dc:
        b = FZ.Blob(c["blob"])
        for ch, p in enumerate(b.payloads):
            if p[0] == 6:
                heads.add((b.W, p[1], p[2], struct.unpack_from("<I", p, 3)[0] > 0, b.n_of(ch) % 2))
    assert {(W, cut, q) for W, cut, q, _, _ in heads} >= {(16, 4, 4), (16, 0, 4), (32, 0, 2), (32, 4, 8),
                                                          (32, 8, 2)}, heads
    assert {(W - cut + 7) // 8 for W, cut, _, esc, _ in heads if esc} >= {2, 4}, heads   # escape bytes
    assert any(cut % 8 and odd for _, cut, _, _, odd in heads), heads    # an unused final nibble
    assert any(odd and q < 8 for _, _, q, _, odd in heads), heads        # unused packed fields
    stats, failures = FZ.run(dc, 4000, seed=1, stack=0.2)
    assert not failures, failures[:3]
    for kind in DELTA_KINDS:
        assert _kinds(stats["by_kind"], kind) > 0, (kind, stats["by_kind"])
    assert stats["by_owner"]["delta"] >= 500 and stats["by_owner"]["delta/raw"] >= 200, stats["by_owner"]
    assert stats["exact_by_owner"]["delta"] > 0     # e.g. bf16 <-> fp16 relabelled: the same units
    errs = stats["errors"]
    for msg in ("delta chunk: ", "newer than the blob's format version", "invalid chunk flags byte",
                "chunk data truncated", "unused trailing bytes"):
        assert any(msg in e for e in errs), (msg, errs)


# the joint-symbol forgeries of fuzz_decoder._joint_mutation (chunk mode 7, format v9)
JOINT_KINDS = ("joint:k_bad", "joint:k_other", "joint:base", "joint:rec_mode", "joint:rec_len", "joint:rec_raw",
               "joint:rec_const", "joint:area_len", "joint:pad", "joint:field", "joint:head_cut", "joint:in_v2",
               "joint:in_v5", "joint:in_v8", "joint:as_f16", "joint:as_int16", "joint:as_alone")


def test_fuzz_joint(corpus):
    """Mode-7 seeds (bf16, no reference; k = 1, 2 and 3, last blocks of raw fields partly padding, a base of
    251 beside inf and NaN): every forgery of the mode and the generic mutations, with the refusals
    FORMAT.md requires."""
    jc = [c for c in corpus if any(p[:1] == b"\x07" for p in FZ.Blob(c["blob"]).payloads)]
    assert all(c["ref"] is None for c in jc)
    heads = set()
    for c in jc:
        b = FZ.Blob(c["blob"])
        for ch, p in enumerate(b.payloads):
            if p[0] == 7:
                heads.add((p[1], b.n_of(ch) % 128 != 0))
    assert heads >= {(1, True), (2, True), (3, True), (1, False)}, heads
    stats, failures = FZ.run(jc, 8000, seed=1, stack=0.2)
    assert not failures, failures[:3]
    for kind in JOINT_KINDS:
        assert _kinds(stats["by_kind"], kind) > 0, (kind, stats["by_kind"])
    assert stats["by_owner"]["joint"] >= 1000 and stats["by_owner"]["joint/huffman"] >= 1000, stats["by_owner"]
    assert stats["exact_by_owner"]["joint"] > 0     # e.g. k or b set to their own value, another shape
    errs = stats["errors"]
    for msg in ("joint-symbol chunk: ", "non-zero padding bits", "newer than the blob's format version",
                "invalid chunk flags byte", "chunk data truncated", "payload length inconsistent",
                "invalid stream mode", "chunk checksum mismatch"):
        assert any(msg in e for e in errs), (msg, errs)


def test_fuzzer_catches_a_wrong_output(corpus, monkeypatch):
    """The oracle is not blind: a decoder that returns damaged data is reported."""
    real = lmc.decompress

    def bad(blob, **kw):
        y = real(blob, **kw)
        y.reshape(-1).view(np.uint8)[0] ^= 1
        return y
    monkeypatch.setattr(lmc, "decompress", bad)
    stats, failures = FZ.run(corpus[:2], 40, seed=2)
    assert failures and failures[0]["error"] == "wrong output returned"


def test_fuzzer_catches_a_wrong_refusal(corpus, monkeypatch):
    """A mode-4 forgery that must be refused for a given reason (row length 0, every
    stream constant, a cut head, a version-1/2 blob) is a failure when the decoder
    returns an array or refuses it for another reason."""
    pred = [c for c in corpus if any(p[:1] == b"\x04" for p in FZ.Blob(c["blob"]).payloads)]
    assert len(pred) >= 5

    def other(blob, **kw):
        raise lmc.FormatError("lmc: some other refusal")
    monkeypatch.setattr(lmc, "decompress", other)
    stats, failures = FZ.run(pred, 600, seed=4, stop_after=1000)
    assert failures and all(f["error"].startswith("FormatError 'lmc: some other refusal', not ")
                            for f in failures), failures[:3]
    assert {f["kind"] for f in failures} >= {"pred:w_zero", "pred:all_const", "pred:head_cut"}, failures
    real = monkeypatch.undo() or lmc.decompress

    def lenient(blob, **kw):   # a decoder that lets mode-4 chunks with w = 0 or all constant through
        try:
            return real(blob, **kw)
        except lmc.FormatError as e:
            if "predicted-exponent" in str(e):
                return np.zeros(0)
            raise
    monkeypatch.setattr(lmc, "decompress", lenient)
    stats, failures = FZ.run(pred, 300, seed=4, stop_after=1000)
    assert failures and all(f["error"] == "decoded, not refused ('predicted-exponent chunk')"
                            for f in failures), failures[:3]


def _child(env, args, timeout):
    e = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-W", "ignore", os.path.join(HERE, "fuzz_decoder.py")] + args,
                          env=e, capture_output=True, text=True, timeout=timeout, cwd=HERE)


@pytest.mark.parametrize("build", ["nojit_checked", "jit_boundscheck"])
def test_fuzz_checked_build(build, tmp_path):
    """The fuzzer in a child under a checked build: an out-of-bounds read or write
    raises IndexError there (the self-test shows it does), and the fuzzer fails on
    any exception other than FormatError."""
    env = ({"LMC_CHECKED": "1", "NUMBA_DISABLE_JIT": "1"} if build == "nojit_checked"
           else {"NUMBA_BOUNDSCHECK": "1"})
    p = _child(env, ["--selftest"], 600)
    assert p.returncode == 0, p.stderr[-2000:]
    caught = p.stdout.split()
    assert {"load_u64", "ld", "store_u32", "kernel_index", "kernel_negative"} <= set(caught), p.stdout
    small = build == "nojit_checked"
    corpus_file = str(tmp_path / "corpus.npz")
    FZ.save_corpus(FZ.build_corpus(3, small=small), corpus_file)
    # (600: the joint-symbol seeds took a share of 500, leaving 2 pred_w fields; 900: the zero-mask seeds of 600)
    cases = 900 if small else 6000
    out = str(tmp_path / "summary.json")
    p = _child(env, ["--corpus", corpus_file, "--cases", str(cases), "--seed", "3", "--json", out], 900)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    with open(out) as f:
        d = json.load(f)
    assert d["build"]["checked_helpers"] and d["build"]["jit"] == (not small)
    assert d["build"]["numba_boundscheck"] == (not small)
    _check_summary(d, cases)


# ---------------------------------------------------------------------------
# memory before refusal
# ---------------------------------------------------------------------------
MEM_CHILD = r"""
import sys, struct, zlib, numpy as np, lmc
from lmc.memory import status
x = np.arange(4096, dtype=np.float32)
assert lmc.decompress(lmc.compress(x, chunk_size=1024), threads=2).tobytes() == x.tobytes()
kind = sys.argv[1]
res = "baseline"
if kind != "baseline":
    total, chunk = 1 << 31, 1 << 27          # bf16: 4 GiB claimed, 16 chunks
    nch = total // chunk
    rng = np.random.default_rng(0)
    pays = []
    for c in range(nch):
        if kind == "garbage":                 # mode byte fine, garbage after it
            p = bytes([c % 2]) + rng.integers(0, 256, 40, dtype=np.uint8).tobytes()
        elif kind == "const":                 # two constant streams: 2^27 units each, wrong checksum
            p = bytes([0]) + (bytes([1]) + struct.pack('<I', 1) + bytes([c])) * 2
        elif kind == "rans1":                 # one-symbol rANS streams (expand like constants)
            st = bytes([3]) + struct.pack('<I', 2 + 2 + 16) + bytes([7, 7, 0x90, 0x00]) + struct.pack('<4I', *[1 << 16] * 4)
            p = bytes([0]) + st * 2
        elif kind == "rans_skew":             # rANS tables 4095:1, states at the top, 2 words: valid structure
            body = bytes([0, 1, 0x8F, 0xFF, 1]) + struct.pack("<4I", *[0xFFFFFFFF] * 4) + bytes([0xFF]) * 4
            p = bytes([0]) + (bytes([3]) + struct.pack('<I', len(body)) + body) * 2
        elif kind == "last_bad":              # 15 valid chunks of zeros (checksums right), the last one broken
            p = bytes([0]) + (bytes([1]) + struct.pack('<I', 1) + bytes([0])) * 2
            if c == nch - 1:
                p = bytes([0, 2]) + rng.integers(0, 256, 30, dtype=np.uint8).tobytes()
        pays.append(p)
    zero_chk = int(sys.argv[2])               # (computed by the parent: no compiling here)
    head = bytearray(b'LMC1') + struct.pack('<BBBB', 2, 3, 0, 1) + struct.pack('<Q', total)
    head += struct.pack('<II', chunk, nch)
    for p in pays:
        head += struct.pack('<IQ', len(p), zero_chk if kind == "last_bad" else 12345)
    head += struct.pack('<I', zlib.crc32(head))
    blob = bytes(head) + b''.join(pays)
    assert len(blob) < 1200, len(blob)
    try:
        lmc.decompress(blob, threads=2)
        res = "decoded"
    except lmc.FormatError as e:
        res = "FormatError: " + str(e)
print(res)
print(status("VmHWM"))
"""


def _peak(kind):
    from lmc.kernels.base import checksum_fill
    zero_chk = int(checksum_fill(np.zeros(0, np.uint8), False, 0, 1 << 27, 2, np.uint64(0), False))  # (a version-2 blob)
    p = subprocess.run([sys.executable, "-c", MEM_CHILD, kind, str(zero_chk)], capture_output=True,
                       text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    res, peak = p.stdout.strip().splitlines()[-2:]
    return res, int(peak)


def test_forged_1kb_blob_refused_within_a_few_mib():
    """A ~1 KB blob whose valid-CRC header claims 2^31 bf16 elements (4 GiB) in
    chunks of 2^27 is refused with a peak RSS at most a few MiB above a child that
    only decodes a small valid blob (before: ~512 MiB per chunk decoded, and every
    chunk was decoded even after the first failed; "last_bad": 15 chunks that are
    valid, 3.75 GiB of zeros, were decoded before the broken 16th was seen)."""
    _, base = _peak("baseline")
    for kind in ("garbage", "const", "rans1", "rans_skew", "last_bad"):
        res, peak = _peak(kind)
        assert res.startswith("FormatError"), (kind, res)
        assert peak - base < 8 << 20, (kind, res, (peak - base) / 2**20)


def test_decoding_stops_at_the_first_bad_chunk():
    """A structurally valid chunk whose checksum fails stops the decoding: the
    chunks after it are not decoded (seen through out=)."""
    x = (np.random.default_rng(5).standard_normal(64 * 4096) * 0.02).astype(ml_dtypes.bfloat16)
    b = FZ.Blob(lmc.compress(x, chunk_size=4096))
    chks = list(b.chks)
    chks[0] ^= 1
    blob = b.pack(chks=chks)
    out = np.zeros_like(x)
    with pytest.raises(lmc.FormatError, match="chunk 0: chunk checksum"):
        lmc.decompress(blob, out=out, threads=1)
    assert out.view(np.uint16)[:4096].any()          # chunk 0 was decoded (and failed)
    assert not out.view(np.uint16)[4096:].any()      # none after it
    # (on 2 threads the other one stops too, but how far it got depends on the scheduler)
    with pytest.raises(lmc.FormatError, match="chunk 0: chunk checksum"):
        lmc.decompress(blob, out=out, threads=2)


# ---------------------------------------------------------------------------
# output-size limit
# ---------------------------------------------------------------------------
def test_max_output_bytes():
    x = (np.arange(10000) % 97).astype(np.float32)
    blob = lmc.compress(x, chunk_size=4096)
    assert lmc.decompress(blob, max_output_bytes=x.nbytes).tobytes() == x.tobytes()
    assert lmc.decompress(blob, max_output_bytes=None).tobytes() == x.tobytes()
    with pytest.raises(lmc.OutputLimitError, match="40000 bytes"):
        lmc.decompress(blob, max_output_bytes=x.nbytes - 1)
    assert issubclass(lmc.OutputLimitError, lmc.FormatError)
    with pytest.raises(ValueError):
        lmc.decompress(blob, max_output_bytes=-1)
    with pytest.raises(TypeError):
        lmc.decompress(blob, max_output_bytes=True)


def test_max_output_bytes_refuses_before_allocating():
    """A header claiming 2^40 float64 elements: refused by the limit at once (an
    attempt to allocate 8 TiB would raise MemoryError instead)."""
    total, chunk = 1 << 40, 1 << 27
    nch = total // chunk   # 8192 chunk entries: a ~100 KB table of 1-byte chunks
    head = bytearray(b"LMC1") + struct.pack("<BBBB", 1, 4, 0, 1) + struct.pack("<Q", total)
    head += struct.pack("<II", chunk, nch) + struct.pack("<IQ", 1, 0) * nch
    head += struct.pack("<I", zlib.crc32(head))
    blob = bytes(head) + bytes([9]) * nch
    with pytest.raises(lmc.OutputLimitError):
        lmc.decompress(blob, max_output_bytes=1 << 30)
    with pytest.raises(lmc.FormatError, match="flags"):   # without a limit: refused by the structure check
        lmc.decompress(blob)


def test_numcodecs_max_output_bytes():
    pytest.importorskip("numcodecs")
    from lmc.numcodecs_codec import LMC
    x = np.arange(5000, dtype=np.float32).astype(ml_dtypes.bfloat16)
    enc = LMC().encode(x)
    codec = LMC(max_output_bytes=x.nbytes)
    assert np.asarray(codec.decode(enc)).tobytes() == x.tobytes()
    assert codec.get_config()["max_output_bytes"] == x.nbytes
    assert LMC.from_config(codec.get_config()).max_output_bytes == x.nbytes
    assert eval(repr(codec), {"LMC": LMC}).max_output_bytes == x.nbytes
    with pytest.raises(lmc.OutputLimitError):
        LMC(max_output_bytes=x.nbytes - 2).decode(enc)
    # an out buffer bounds the output too: refused before decoding
    with pytest.raises(lmc.OutputLimitError):
        LMC().decode(enc, out=np.empty(100, ml_dtypes.bfloat16))
    with pytest.raises(ValueError):
        LMC(max_output_bytes=-5)
