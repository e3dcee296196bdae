"""Frozen test vectors: decode forever, and compress reproduces them."""
import json
import os

import pytest

import lmc
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
    assert version in {3: (1, 2, 3), 4: (4,), 5: (5,), 6: (6,), 7: (7,), 8: (8,)}[e["format_version"]]
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
    assert {e["input"] for e in v8.values()} == {e["input"] for e in MANIFEST.values()}
    assert {e["input"] for e in v8.values() if e["prefer"] == "size"} == {
        e["input"] for e in MANIFEST.values() if e["dtype"] == "bfloat16"}
    for n, e in v8.items():
        old = f'{e["input"]}_v7' + ("s" if e["prefer"] == "size" else "")
        if old in MANIFEST:
            assert MANIFEST[old]["size"] == e["size"], n
