"""Frozen test vectors: decode forever, and compress reproduces them."""
import json
import os

import pytest

import lmc
import pyref
from fuzz_blobs import Blob
from make_vectors import OUT, load

with open(os.path.join(OUT, "manifest.json")) as f:
    MANIFEST = json.load(f)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_vector(name):
    e = MANIFEST[name]
    x = load(name, e)
    ref = load(name, e, ".ref.npy") if e["reference"] else None
    with open(os.path.join(OUT, name + ".lmc"), "rb") as f:
        blob = f.read()
    assert len(blob) == e["size"]
    y = lmc.decompress(blob, reference=ref)
    assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()
    version = lmc.info(blob)["version"]
    assert version in {3: (1, 2, 3), 4: (4,), 5: (5,), 6: (6,), 7: (7,), 8: (8,), 9: (9,), 10: (10,)}[e["format_version"]]
    prefer = e.get("prefer", "speed")
    assert lmc.compress(x, reference=ref, chunk_size=e["chunk_size"], format_version=e["format_version"],
                        prefer=prefer) == blob


def test_manifest_not_empty():
    assert len(MANIFEST) >= 10
    # every input frozen in both checksums: versions 1-3 (units) and 4 (words)
    inputs = {e["input"] for e in MANIFEST.values() if e["format_version"] < 7}
    for fv in (3, 4, 5, 6):
        assert {e["input"] for e in MANIFEST.values() if e["format_version"] == fv and e["prefer"] == "speed"} \
            == inputs
    # every bfloat16 input also with prefer="size"; some of them use the mantissa-context mode
    v5s = [n for n, e in MANIFEST.items() if e["prefer"] == "size" and e["format_version"] < 7]
    assert {MANIFEST[n]["input"] for n in v5s} == {e["input"] for e in MANIFEST.values()
                                                  if e["dtype"] == "bfloat16" and e["format_version"] < 7}
    assert any(lmc.info(open(os.path.join(OUT, n + ".lmc"), "rb").read())["chunk_modes"].get("mantissa-context")
               for n in v5s)
    # every float input with a reference also with prefer="fast": most chunks of those in the delta mode
    v6f = [n for n, e in MANIFEST.items() if e["prefer"] == "fast"]
    assert {MANIFEST[n]["input"] for n in v6f} == {
        e["input"] for e in MANIFEST.values()
        if e["reference"] and e["dtype"] in ("float32", "float16", "bfloat16") and e["format_version"] < 7}
    assert sum(lmc.info(open(os.path.join(OUT, n + ".lmc"), "rb").read())["chunk_modes"].get("delta", 0)
               for n in v6f) >= 20


def test_v7_vectors_have_32_state_streams():
    """Format 7's own inputs: each once with prefer="speed" and once with "size", and their chunks long enough
    for 32-state rANS streams (8192 elements or more), with and without a reference."""
    v7 = {n: e for n, e in MANIFEST.items() if e["format_version"] == 7}
    assert {e["prefer"] for e in v7.values()} == {"speed", "size"}
    assert any(e["reference"] for e in v7.values()) and any(not e["reference"] for e in v7.values())
    assert all(e["chunk_size"] >= 8192 for e in v7.values())
    modes = {}
    for n in v7:
        for k, v in lmc.info(open(os.path.join(OUT, n + ".lmc"), "rb").read())["chunk_modes"].items():
            modes[k] = modes.get(k, 0) + v
    assert {"temporal", "mantissa-context"} <= set(modes), modes


def test_v8_vectors_cover_every_input():
    """Format 8 (version 7's chunks, the halves' product checksum): every frozen input once more, bfloat16 ones
    with prefer="size" too; each blob's chunks are version 7's where that input has a version-7 blob."""
    v8 = {n: e for n, e in MANIFEST.items() if e["format_version"] == 8}
    older = [e for e in MANIFEST.values() if e["format_version"] < 9]    # format 9's own inputs came later
    assert {e["input"] for e in v8.values()} == {e["input"] for e in older}
    assert {e["input"] for e in v8.values() if e["prefer"] == "size"} == {
        e["input"] for e in older if e["dtype"] == "bfloat16"}
    for n, e in v8.items():
        old = f'{e["input"]}_v7' + ("s" if e["prefer"] == "size" else "")
        if old in MANIFEST:
            assert MANIFEST[old]["size"] == e["size"], n


def _blob(name):
    with open(os.path.join(OUT, name + ".lmc"), "rb") as f:
        return Blob(f.read())


def test_v9_vectors_cover_every_input():
    """Format 9 (version 8's chunks and checksum, and the joint-symbol mode): every frozen input once more, the
    bfloat16 ones with prefer="size" too.  A blob without a mode-7 chunk has the payloads and checksums of its
    version-8 twin; a mode-7 chunk has k = 1 with prefer="speed", and "size" takes every k of 1..3."""
    v9 = {n: e for n, e in MANIFEST.items() if e["format_version"] == 9}
    older = {n: e for n, e in MANIFEST.items() if e["input"] not in V10_INPUTS}   # (format 10's: their own)
    assert {e["input"] for e in v9.values() if e["prefer"] == "speed"} == {e["input"] for e in older.values()}
    assert {e["input"] for e in v9.values() if e["prefer"] == "size"} == {
        e["input"] for e in older.values() if e["dtype"] == "bfloat16"}
    ks = {"speed": set(), "size": set()}
    for n, e in v9.items():
        b = _blob(n)
        joint = [p[1] for p in b.payloads if p[0] == 7]
        ks[e["prefer"]] |= set(joint)
        old = n.replace("_v9", "_v8")
        if not joint and old in MANIFEST:
            a = _blob(old)
            assert (a.payloads, a.chks, a.version, b.version) == (b.payloads, b.chks, 8, 9), n
    assert ks == {"speed": {1}, "size": {1, 2, 3}}


def test_v9_joint_vectors():
    """Format 9's own inputs (make_vectors.vectors_v9): the chunks that take mode 7 and those that cannot, the
    last chunk (odd, not a multiple of 128) in mode 7, mode 7 in a blob with a reference; and the widest span
    k = 1 fits: base 0, symbols to 255."""
    want = {"bf16_joint": ([7, 7, 7], [1, 1, 1], [2, 2, 2]),
            "bf16_joint_k": ([7, 7, 7, 7], [1, 1, 1, 1], [1, 2, 3, 2]),
            "bf16_joint_span": ([7, 0, 7, 0, 7], [1, 1, 1], [2, 1, 2]),
            "bf16_joint_far": ([7, 7, 7, 7], [1, 1, 1, 1], [1, 1, 2, 2])}
    for name, (modes, k_speed, k_size) in want.items():
        e = MANIFEST[name + "_v9"]
        n = e["chunk_size"]
        total = int(load(name, e).size)
        assert total % n % 2 == 1 and total % n % 128, name
        for suffix, ks in (("_v9", k_speed), ("_v9s", k_size)):
            b = _blob(name + suffix)
            assert (b.refhash is not None) == e["reference"] == (name == "bf16_joint_far")
            assert [p[0] for p in b.payloads] == modes, name + suffix
            assert [p[1] for p in b.payloads if p[0] == 7] == ks, name + suffix
            info = lmc.info(b.pack())["chunk_modes"]
            assert info == {"joint-symbol": modes.count(7), **({"alone": modes.count(0)} if 0 in modes else {})}
    p = _blob("bf16_joint_span_v9").payloads[2]
    syms, end = pyref.stream_record(p, 3, len(p), 4096, 9, set())
    assert (p[1], p[2], min(syms), max(syms), len(p) - end) == (1, 0, 0, 255, 16 * 7 * 32)


V10_INPUTS = {e["input"] for e in MANIFEST.values() if e["format_version"] == 10}


def test_v10_vectors_are_zero_mask_blobs():
    """Format 10's inputs (tensors whose zeros the mask takes): each a zero-mask blob whose two inner blobs are
    version 9, smaller than the input's version-9 blob, and decoded by the oracle too."""
    assert V10_INPUTS == {"f32_zmask", "bf16_zmask", "f16_pruned", "i32_zmask"}
    for name in V10_INPUTS:
        e = MANIFEST[name + "_v10"]
        blob = open(os.path.join(OUT, name + "_v10.lmc"), "rb").read()
        inf = lmc.info(blob)
        x = load(name + "_v10", e)
        assert inf["version"] == 10 and inf["zero_mask"]["nonzero"] < x.size
        assert len(blob) < len(lmc.compress(x, chunk_size=e["chunk_size"], format_version=9))
        assert pyref.decode(blob)[0] == x.tobytes()
