"""Frozen ExCP vectors (tests/vectors/excp/, format in lmcbench/lossy/excp/FORMAT.md): every blob decodes
forever to the same arrays, bit for bit, and encoding the same inputs today gives the same bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os
import struct

import numpy as np
import pytest

from lmcbench.lossy.excp import ExCPConfig, decode_checkpoint, encode_checkpoint

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors", "excp")
_spec = importlib.util.spec_from_file_location("excp_make_vectors", os.path.join(HERE, "make_vectors.py"))
mv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mv)

MANIFEST = mv.load_manifest()
VECTORS = MANIFEST["vectors"]
HEADER = struct.Struct("<4sBBHQQII")


def blob_of(name: str) -> bytes:
    with open(os.path.join(HERE, name + ".excp"), "rb") as f:
        return f.read()


def inputs(ckpt: str) -> dict:
    return mv.load_tree(os.path.join(HERE, "inputs.npz"), MANIFEST, ckpt + "|")


def expected(name: str) -> dict:
    out = VECTORS[name]["out"]
    return inputs(out) if out in ("t0", "t1") else mv.load_tree(os.path.join(HERE, out + ".out.npz"), MANIFEST)


def reference(name: str) -> dict | None:
    ref = VECTORS[name]["reference"]
    return None if ref is None else {n: d["weight"] for n, d in expected(ref).items()}


def assert_bit_exact(got: dict, want: dict):
    assert list(got) == list(want)
    for n in want:
        assert set(got[n]) == set(mv.KINDS), n
        for k in mv.KINDS:
            x, y = got[n][k], want[n][k]
            if y is None:
                assert x is None, (n, k)
                continue
            assert x is not None and x.dtype == y.dtype and x.shape == y.shape, (n, k)
            assert x.tobytes() == y.tobytes(), (n, k)


def payload(blob: bytes, archiver: str) -> bytes:
    """The un-archived payload, by the archivers' own libraries (not by the code under test)."""
    archived = blob[HEADER.size:]
    if archiver == "none":
        return archived
    if archiver == "lzma":
        return lzma.decompress(archived, format=lzma.FORMAT_XZ)
    if archiver == "zstd":
        import zstandard
        return zstandard.ZstdDecompressor().decompress(archived)
    import lmc
    return lmc.decompress(archived).tobytes()


def rearchive(payload_bytes: bytes, archiver: str, level: int) -> bytes:
    if archiver == "lzma":
        return lzma.compress(payload_bytes, format=lzma.FORMAT_XZ, preset=level)
    import zstandard
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(payload_bytes)


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_vector_decodes(name):
    blob, e = blob_of(name), VECTORS[name]
    assert len(blob) == e["size"] and hashlib.sha256(blob).hexdigest() == e["sha256"]
    assert_bit_exact(decode_checkpoint(blob, reference(name)), expected(name))


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_vector_encodes_to_the_same_bytes(name):
    frozen, e = blob_of(name), VECTORS[name]
    cfg = ExCPConfig(**e["options"])
    assert cfg.level == e["level"]  # the archiver level in effect is part of what is frozen
    blob, recon, _ = encode_checkpoint(inputs(e["checkpoint"]), reference(name), cfg)
    assert_bit_exact(recon, expected(name))
    if blob == frozen:
        return
    # Only an archiver library that itself compresses differently today (another zstd or liblzma build) may
    # change the bytes: then the header (but the archived length and CRC) and the payload must still agree.
    archiver = cfg.archiver
    assert archiver in ("zstd", "lzma"), f"{name}: {archiver} blob differs from the frozen one"
    assert payload(blob, archiver) == payload(frozen, archiver)
    h, f = HEADER.unpack(blob[:HEADER.size]), HEADER.unpack(frozen[:HEADER.size])
    assert h[:5] + h[6:7] == f[:5] + f[6:7]  # all fields but archived_len and the archived bytes' CRC
    assert rearchive(payload(frozen, archiver), archiver, cfg.level) != frozen[HEADER.size:], \
        f"{name}: the {archiver} library reproduces the frozen archive, so the blob must be identical"


def spec_decode(blob: bytes, refs: dict | None) -> dict:
    """A second reader, written from FORMAT.md alone (no lmcbench code), for well-formed blobs."""
    import zlib

    import ml_dtypes

    magic, version, arch_id, reserved, raw_len, archived_len, raw_crc, archived_crc = HEADER.unpack(blob[:32])
    assert (magic, version, reserved, archived_len) == (b"ExCP", 1, 0, len(blob) - 32)
    assert zlib.crc32(blob[32:]) == archived_crc
    p = payload(blob, ["none", "lzma", "zstd", "lmc"][arch_id])
    assert len(p) == raw_len and zlib.crc32(p) == raw_crc
    (toc_len,) = struct.unpack_from("<I", p, 0)
    toc = json.loads(p[4:4 + toc_len].decode("utf-8"))
    data = p[4 + toc_len:]
    assert (toc["format"], toc["version"]) == ("excp", 1)
    out = {}
    for param in toc["params"]:
        arrays = {k: None for k in mv.KINDS}
        for e in param["arrays"]:
            shape, numel = tuple(e["shape"]), int(np.prod(e["shape"], dtype=np.int64))
            secs = [data[o:o + n] for o, n in e["sections"]]
            if e["mode"] == "raw":
                dt = np.dtype(getattr(ml_dtypes, e["dtype"], None) or e["dtype"])
                a = np.frombuffer(secs[0], dt.newbyteorder("<") if dt.kind in "biufc" else dt).astype(dt)
                arrays[e["kind"]] = a.reshape(shape)
                continue
            base = refs[param["name"]].astype(np.float32).ravel().copy() if e["kind"] == "weight" else None
            a = base if base is not None else np.zeros(numel, np.float32)
            if e["mode"] == "exact":
                if e["positions"] == "mask":
                    pos = np.flatnonzero(np.unpackbits(np.frombuffer(secs[0], np.uint8))[:numel])
                else:
                    pos = np.frombuffer(secs[0], "<u4" if e["positions"] == "u32" else "<u8").astype(np.int64)
                a[pos] = np.frombuffer(secs[1], "<f4")
            elif e["mode"] == "quant":
                b = e["bits"]
                table = np.concatenate([[np.float32(0)], np.ldexp(np.frombuffer(secs[0], "<f2").astype(np.float32),
                                                                  e["exponent"])]).astype(np.float32)
                bitstream = np.unpackbits(np.frombuffer(secs[1], np.uint8))[:numel * b].reshape(numel, b)
                idx = bitstream.astype(np.int64) @ (1 << np.arange(b - 1, -1, -1))
                vals = table[idx]
                a = np.where(idx != 0, a + vals, a) if base is not None else vals
            arrays[e["kind"]] = a.astype(np.float32).reshape(shape)
        out[param["name"]] = arrays
    return out


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_format_md_reader_agrees(name):
    """FORMAT.md is enough to read every vector: an independent reader gives the same arrays."""
    assert_bit_exact(spec_decode(blob_of(name), reference(name)), expected(name))


def test_vectors_cover_the_format():
    """Every mode, position encoding, packing width, archiver and centroid scale appears in some vector."""
    seen = set()
    for name, e in VECTORS.items():
        blob = blob_of(name)
        archiver = e["options"]["archiver"]
        seen.add(("archiver", archiver))
        p = payload(blob, archiver)
        (toc_len,) = struct.unpack_from("<I", p, 0)
        toc = json.loads(p[4:4 + toc_len])
        seen.add(("residual", e["reference"] is not None))
        for param in toc["params"]:
            for a in param["arrays"]:
                seen.add(("mode", a["mode"]))
                seen.add(("dtype", a["dtype"]))
                if a["mode"] == "exact":
                    seen.add(("positions", a["positions"]))
                if a["mode"] == "quant":
                    seen.add(("bits", a["bits"]))
                    seen.add(("scaled", a["exponent"] != 0))
                    seen.add(("tiny", a["exponent"] < -40))  # exp_avg_sq-like magnitudes
    want = {("archiver", a) for a in ("none", "lzma", "zstd", "lmc")} | {("residual", False), ("residual", True)} \
        | {("mode", m) for m in ("raw", "zero", "exact", "quant")} | {("positions", "mask"), ("positions", "u32")} \
        | {("bits", b) for b in (3, 4, 8)} | {("scaled", True), ("scaled", False), ("tiny", True)} \
        | {("dtype", d) for d in ("float32", "int64", "bfloat16")}
    assert want <= seen, want - seen
