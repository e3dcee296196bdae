"""Blobs written by earlier encoders (same format version) must still decode.

tests/vectors/v1_legacy/ holds blobs whose bytes the current encoder no
longer reproduces (encoder-only choices changed, e.g. the Huffman code
lengths): format-v1 blobs of lmc 0.1, and NAME_v9_huff, format-9 blobs of
second-moment-like inputs written before a stream whose symbols lie in 2^k
< 256 values took the fixed-length k-bit code (hfixed.fixed_code), with
their inputs (an entry's "input", else its name).  They are decoded, never
re-encoded."""
import json
import os

import ml_dtypes
import numpy as np
import pytest

import lmc
from make_vectors import OUT

LEGACY = os.path.join(OUT, "v1_legacy")

with open(os.path.join(LEGACY, "manifest.json")) as f:
    MANIFEST = json.load(f)


def _load(name, entry, suffix):
    a = np.load(os.path.join(LEGACY, entry.get("input", name) + suffix))
    if entry["dtype"] == "bfloat16":
        a = a.view(ml_dtypes.bfloat16)
    return a


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_legacy_vector_decodes(name):
    e = MANIFEST[name]
    x = _load(name, e, ".npy")
    ref = _load(name, e, ".ref.npy") if e["reference"] else None
    with open(os.path.join(LEGACY, name + ".lmc"), "rb") as f:
        blob = f.read()
    assert len(blob) == e["size"]
    assert lmc.info(blob)["chunk_size"] == e["chunk_size"]
    y = lmc.decompress(blob, reference=ref)
    assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()
    # a re-encode gives a valid blob of the same data, never larger (or, where the entry names a margin, by
    # at most that fraction: the fixed-length code may cost up to 1/32 of a stream's Huffman bits)
    b2 = lmc.compress(x, reference=ref, chunk_size=e["chunk_size"])
    assert len(b2) <= len(blob) + (len(blob) // e["reencode_margin"] if "reencode_margin" in e else 0)
    assert lmc.decompress(b2, reference=ref).tobytes() == x.tobytes()


def test_legacy_manifest_not_empty():
    assert len(MANIFEST) >= 1
