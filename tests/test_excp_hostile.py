"""ExCP decoding of hostile input: header checks, truncations, byte flips, fuzzed and forged tables of
contents, the centroid scale, and the archive and payload bounds."""

from __future__ import annotations

import contextlib
import json
import lzma
import struct
import warnings
import zlib

import numpy as np
import pytest
from excp_testlib import (
    ARCHIVERS,
    assert_same_tree,
    expect_format_error,
    payload_of,
    raw_container,
    repack,
)

from lmcbench.lossy import (
    ExCPConfig,
    ExCPError,
    ExCPFormatError,
    decode_checkpoint,
    encode_checkpoint,
    excp,
    pack_bits,
)


# ------------------------------------------------------------------------------------ hostile blobs
def test_header_checks(chain2):
    blob = chain2["blob2"]
    assert "magic" in expect_format_error(b"XXXX" + blob[4:])
    assert "version" in expect_format_error(blob[:4] + b"\x02" + blob[5:])
    assert "archiver" in expect_format_error(blob[:5] + b"\x09" + blob[6:])
    assert "reserved" in expect_format_error(blob[:6] + b"\x01\x00" + blob[8:])
    assert "trailing" in expect_format_error(blob + b"\0")
    expect_format_error(b"")
    expect_format_error(bytearray(blob[:20]))
    expect_format_error("not bytes")
    big = bytearray(blob)
    big[8:16] = struct.pack("<Q", 1 << 62)  # forged payload size
    assert "limit" in expect_format_error(bytes(big))
    big[8:16] = struct.pack("<Q", len(blob))  # wrong but plausible: detected after un-archiving
    expect_format_error(bytes(big))
    assert_same_tree(decode_checkpoint(memoryview(blob), chain2["ref"]), chain2["rec2"])


@pytest.mark.parametrize("archiver", ARCHIVERS)
def test_truncations(chain2, archiver):
    blob, _, _ = encode_checkpoint(chain2["t2"], chain2["ref"],
                                   ExCPConfig(archiver=archiver, archiver_level={"lzma": 1, "zstd": 3}.get(archiver)))
    lengths = sorted(set(range(0, 80)) | set(np.linspace(0, len(blob) - 1, 120).astype(int).tolist()))
    for n in lengths:
        expect_format_error(blob[:n], chain2["ref"])


@pytest.mark.parametrize("archiver", ["none", "lzma", "lmc"])
def test_random_byte_flips(chain2, archiver):
    blob, _, _ = encode_checkpoint(chain2["t2"], chain2["ref"],
                                   ExCPConfig(archiver=archiver, archiver_level={"lzma": 1}.get(archiver)))
    for seed in range(300 if archiver == "none" else 100):
        rng = np.random.default_rng(seed)
        b = bytearray(blob)
        for pos in rng.integers(0, len(b), size=rng.integers(1, 5)):
            b[pos] ^= int(rng.integers(1, 256))
        expect_format_error(bytes(b), chain2["ref"])


def test_payload_fuzz_with_valid_checksums(chain2):
    """Mutations behind valid checksums reach the parser: it must answer with data or ExCPFormatError."""
    blob = chain2["blob2"]
    payload, _ = excp.container._unpack_container(blob)
    (toc_len,) = struct.unpack("<I", payload[:4])
    ok = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        b = bytearray(payload)
        hi = 4 + toc_len if seed % 2 else len(b)  # half the mutations aim at the table of contents
        for pos in rng.integers(0, hi, size=rng.integers(1, 4)):
            b[pos] = int(rng.integers(0, 256))
        try:
            out = decode_checkpoint(excp.container._pack_container(bytes(b), "none", None), chain2["ref"])
            assert isinstance(out, dict)
            ok += 1
        except ExCPFormatError as e:
            assert "\n" not in str(e)
    assert ok < 300


def test_toc_integer_fuzz(chain2):
    """Every integer in the TOC replaced by hostile values."""
    toc, data = payload_of(chain2["blob2"])
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + [i])
        elif type(node) is int and "config" not in path:
            paths.append(path)

    walk(toc, [])
    assert len(paths) > 40
    for path in paths:
        for val in (-1, 0, 3, 2**31, 2**64, 10**30, 1.5, None, "7", [1]):
            t = json.loads(json.dumps(toc))
            node = t
            for p in path[:-1]:
                node = node[p]
            if node[path[-1]] == val:
                continue
            node[path[-1]] = val
            try:
                decode_checkpoint(repack(t, data), chain2["ref"])
            except ExCPFormatError as e:
                assert "\n" not in str(e)


def _entry(toc, name, kind):
    p = next(p for p in toc["params"] if p["name"] == name)
    return next(e for e in p["arrays"] if e["kind"] == kind)


@pytest.mark.parametrize("forge", [
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [2**40, 2**40]),
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [2**62, 2**62, 2**62]),
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [0, 2**70]),
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [0, 2**40, 2**40]),
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [6, 4]),  # exceeds the section
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [-3, -4]),
    lambda t: _entry(t, "c", "weight").__setitem__("shape", "3x4"),
    lambda t: _entry(t, "c", "weight").__setitem__("shape", [1] * 40),
    lambda t: _entry(t, "c", "weight").__setitem__("dtype", "object"),
    lambda t: _entry(t, "c", "weight").__setitem__("dtype", "int32"),  # 4-byte items: length mismatch
    lambda t: _entry(t, "c", "weight").__setitem__("mode", "pickle"),
    # TOC values of the wrong JSON type, used as dict keys or compared before their type was checked
    lambda t: _entry(t, "c", "weight").__setitem__("mode", ["raw"]),
    lambda t: _entry(t, "c", "weight").__setitem__("mode", {"raw": 1}),
    lambda t: _entry(t, "a", "weight").__setitem__("mode", ["quant"]),
    lambda t: _entry(t, "a", "exp_avg").__setitem__("kind", ["exp_avg"]),
    lambda t: _entry(t, "a", "exp_avg").__setitem__("kind", {"exp_avg": 1}),
    lambda t: _entry(t, "c", "weight").__setitem__("dtype", ["int64"]),
    lambda t: _entry(t, "c", "weight").__setitem__("dtype", {"int64": 1}),
    lambda t: _entry(t, "b", "exp_avg").__setitem__("positions", ["mask"]),
    lambda t: _entry(t, "b", "exp_avg").__setitem__("positions", {"mask": 1}),
    lambda t: _entry(t, "a", "weight").__setitem__("exponent", [0]),
    lambda t: t.__setitem__("format", ["excp"]),
    lambda t: t.__setitem__("version", [1]),
    lambda t: t["params"][0].__setitem__("name", ["a"]),
    lambda t: _entry(t, "c", "weight").__setitem__("sections", [[0, 10**12]]),
    lambda t: _entry(t, "c", "weight").__setitem__("sections", []),
    lambda t: _entry(t, "a", "weight").__setitem__("bits", 9),
    lambda t: _entry(t, "a", "weight").__setitem__("bits", 3),
    lambda t: _entry(t, "a", "weight").__setitem__("n_centroids", 16),
    lambda t: _entry(t, "a", "weight").__setitem__("n_centroids", 7),
    lambda t: _entry(t, "a", "weight").__setitem__("exponent", 10**6),
    lambda t: _entry(t, "a", "weight").__setitem__("dtype", "float16"),
    lambda t: _entry(t, "a", "weight").__setitem__("extra", 1),
    lambda t: _entry(t, "a", "weight").pop("bits"),
    lambda t: _entry(t, "a", "exp_avg").__setitem__("shape", [3200]),
    lambda t: _entry(t, "a", "exp_avg").__setitem__("kind", "weight"),
    lambda t: _entry(t, "a", "exp_avg").__setitem__("kind", "step"),
    lambda t: t["params"][0]["arrays"].reverse(),
    lambda t: t["params"][0]["arrays"].append(dict(t["params"][0]["arrays"][0])),
    lambda t: t["params"].append(t["params"][0]),
    lambda t: t["params"][0].__setitem__("name", 7),
    lambda t: t.__setitem__("version", 2),
    lambda t: t.__setitem__("format", "zip"),
    lambda t: t.__setitem__("params", {}),
    lambda t: t.pop("config"),
    lambda t: t.__setitem__("params", t["params"][:-1]),  # its sections become unaccounted bytes
])
def test_forged_toc_fields(chain2, forge):
    toc, data = payload_of(chain2["blob2"])
    forge(toc)
    expect_format_error(repack(toc, data), chain2["ref"])


def _quant_payload(idx, centroids, shape, bits=4, n_centroids=None, exponent=0):
    cb = np.asarray(centroids, "<f2").tobytes()
    ib = pack_bits(np.asarray(idx), bits)
    entry = {"kind": "weight", "dtype": "float32", "shape": shape, "mode": "quant", "bits": bits,
             "n_centroids": len(centroids) if n_centroids is None else n_centroids, "exponent": exponent,
             "sections": [[0, len(cb)], [len(cb), len(ib)]]}
    toc = {"format": "excp", "version": 1, "config": {}, "params": [{"name": "w", "arrays": [entry]}]}
    return excp.container._pack_container(excp.payload._build_payload(toc, [cb, ib]), "none", None)


def _exact_payload(pos_kind, pos_bytes, values, count, shape):
    vb = np.asarray(values, "<f4").tobytes()
    entry = {"kind": "weight", "dtype": "float32", "shape": shape, "mode": "exact", "count": count,
             "positions": pos_kind, "sections": [[0, len(pos_bytes)], [len(pos_bytes), len(vb)]]}
    toc = {"format": "excp", "version": 1, "config": {}, "params": [{"name": "w", "arrays": [entry]}]}
    return excp.container._pack_container(excp.payload._build_payload(toc, [pos_bytes, vb]), "none", None)


def test_hand_built_sections():
    ref = {"w": np.ones(4, np.float32)}
    good = decode_checkpoint(_quant_payload([0, 1, 2, 1], [0.5, 2.0], [4]), ref)
    assert good["w"]["weight"].tolist() == [1.0, 1.5, 3.0, 1.5]
    assert "centroid" in expect_format_error(_quant_payload([0, 1, 2, 3], [0.5, 2.0], [4]), ref)
    assert "increasing" in expect_format_error(_quant_payload([0, 1, 2, 1], [2.0, 0.5], [4]), ref)
    assert "increasing" in expect_format_error(_quant_payload([0, 1, 2, 1], [0.5, 0.5], [4]), ref)
    expect_format_error(_quant_payload([0, 1, 2, 1], [0.5, np.inf], [4]), ref)
    expect_format_error(_quant_payload([0, 1, 2, 1], [0.5, 2.0], [4], n_centroids=3), ref)
    u32 = lambda p: np.asarray(p, "<u4").tobytes()  # noqa: E731
    good = decode_checkpoint(_exact_payload("u32", u32([0, 3]), [7, 8], 2, [4]), ref)
    assert good["w"]["weight"].tolist() == [7.0, 1.0, 1.0, 8.0]
    assert "increasing" in expect_format_error(_exact_payload("u32", u32([3, 0]), [7, 8], 2, [4]), ref)
    assert "increasing" in expect_format_error(_exact_payload("u32", u32([0, 4]), [7, 8], 2, [4]), ref)
    expect_format_error(_exact_payload("u32", u32([0, 0]), [7, 8], 2, [4]), ref)
    expect_format_error(_exact_payload("u32", u32([0, 1]), [7, 8], 3, [4]), ref)
    expect_format_error(_exact_payload("u16", u32([0, 1]), [7, 8], 2, [4]), ref)
    mask = np.packbits([1, 0, 0, 1]).tobytes()
    assert decode_checkpoint(_exact_payload("mask", mask, [7, 8], 2, [4]), ref)["w"]["weight"].tolist() == [7, 1, 1, 8]
    expect_format_error(_exact_payload("mask", mask, [7, 8], 1, [4]), ref)  # popcount != count
    expect_format_error(_exact_payload("mask", bytes([0b10010001]), [7, 8, 9], 3, [4]), ref)  # pad bits


def test_bad_json_and_archiver_errors():
    for payload in (b"", b"\x05\x00", struct.pack("<I", 5) + b"{bad}", struct.pack("<I", 99) + b"{}",
                    struct.pack("<I", 2) + b"\xff\xfe", struct.pack("<I", 4) + b"[[[]",
                    struct.pack("<I", 20000) + b"[" * 20000, struct.pack("<I", 2) + b"[]"):
        expect_format_error(excp.container._pack_container(payload, "none", None))
    garbage = bytes(range(256)) * 4
    for arch_id in (1, 2, 3):  # lzma, zstd, lmc fed garbage behind a valid archive checksum
        assert "corrupt" in expect_format_error(raw_container(garbage, arch_id, 1000))
    payload = excp.payload._build_payload({"format": "excp", "version": 1, "config": {}, "params": []}, [])
    for arch in ("lzma", "zstd", "lmc"):
        good = excp.container._pack_container(payload, arch, {"lzma": 1, "zstd": 3}.get(arch))
        assert decode_checkpoint(good) == {}
        archived = good[excp.HEADER_SIZE:]
        # a valid archive whose declared size is wrong
        expect_format_error(raw_container(archived, excp.config._ARCHIVERS[arch], len(payload) + 1, zlib.crc32(payload)))
        # a valid archive behind a wrong payload checksum
        assert "checksum" in expect_format_error(raw_container(archived, excp.config._ARCHIVERS[arch], len(payload), 0))
    # an archive of the wrong kind
    lz = excp.container._pack_container(payload, "lzma", 1)[excp.HEADER_SIZE:]
    expect_format_error(raw_container(lz, excp.config._ARCHIVERS["zstd"], len(payload), zlib.crc32(payload)))


def _toc_nodes(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _toc_nodes(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _toc_nodes(v, path + (i,))


def test_toc_type_fuzz(chain2):
    """Every TOC node (objects and lists included) replaced by a value of another JSON type: the decoder checks
    types before it hashes, compares or indexes with a value, so the answer is data or ExCPFormatError."""
    toc, data = payload_of(chain2["blob2"])
    paths = [p for p in _toc_nodes(toc) if p and p[0] != "config"]
    assert len(paths) > 100
    for path in paths:
        for val in ([], {}, ["quant"], {"weight": 1}, None, True, 1.5, "x"):
            t = json.loads(json.dumps(toc))
            node = t
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = val
            try:
                decode_checkpoint(repack(t, data), chain2["ref"])
            except ExCPFormatError as e:
                assert "\n" not in str(e)


# ------------------------------------------------------------------------- centroid scale (exponent)
@contextlib.contextmanager
def fp_strict():
    """Floating-point exceptions and warnings are errors."""
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@fp_strict()
def test_exponent_range_and_scaled_table_are_checked():
    ref = {"w": np.ones(4, np.float32)}
    assert (excp.EXPONENT_MIN, excp.EXPONENT_MAX) == (-163, 113)
    for e in (114, 200, -164, -200):  # outside what the encoder emits
        assert "exponent" in expect_format_error(_quant_payload([0, 1, 2, 1], [0.5, 2.0], [4], exponent=e), ref)
    # in range, but 2**15 * 2**113 overflows float32
    assert "finite" in expect_format_error(_quant_payload([0, 1, 2, 1], [0.5, 32768.0], [4], exponent=113), ref)
    # in range, but both centroids underflow to 0: the scaled table is not strictly increasing
    assert "increasing" in expect_format_error(_quant_payload([0, 1, 2, 1], [1.0, 2.0], [4], exponent=-163), ref)
    # the extremes themselves decode, without a floating-point warning
    w = decode_checkpoint(_quant_payload([0, 1, 2, 1], [0.5, 32752.0], [4], exponent=113), ref)["w"]["weight"]
    assert np.all(np.isfinite(w)) and w[2] == np.float32(32752.0 * 2.0 ** 113)
    w = decode_checkpoint(_quant_payload([0, 1, 2, 1], [16384.0, 32768.0], [4], exponent=-163),
                          {"w": np.zeros(4, np.float32)})["w"]["weight"]
    assert w.tolist() == [0.0, 2.0 ** -149, 2.0 ** -148, 2.0 ** -149]


def test_forged_exponent_on_an_encoded_blob():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(64).astype(np.float32)
    w = ref + rng.standard_normal(64).astype(np.float32) * np.float32(1e-3)
    blob, _, _ = encode_checkpoint({"a": {"weight": w}}, {"a": ref}, ExCPConfig(archiver="none", prune_weights=False))
    toc, data = payload_of(blob)
    assert _entry(toc, "a", "weight")["mode"] == "quant"
    for e in (200, 114, -164):
        _entry(toc, "a", "weight")["exponent"] = e
        with fp_strict():
            assert "exponent" in expect_format_error(repack(toc, data), {"a": ref})


def test_extreme_magnitudes_encode_to_finite_tables():
    """Residuals near float32's largest value (exponent 113, where a float16 centroid of 2**15 would overflow)
    and subnormal ones (exponent near -163) round-trip without a floating-point warning."""
    rng = np.random.default_rng(0)
    fmax = np.finfo(np.float32).max
    big = (fmax * (1 - rng.random(200) * 2e-4)).astype(np.float32) * np.where(np.arange(200) % 2, 1, -1).astype(
        np.float32)
    tiny = (rng.standard_normal(200) * 1e-44).astype(np.float32)
    zero = np.zeros(200, np.float32)
    cfg = ExCPConfig(archiver="none", prune_weights=False)
    with fp_strict():
        blob, rec, stats = encode_checkpoint({"big": {"weight": big}, "tiny": {"weight": tiny}},
                                             {"big": zero, "tiny": zero}, cfg)
        dec = decode_checkpoint(blob, {"big": zero, "tiny": zero})
    assert [s["mode"] for s in stats] == ["quant", "quant"]
    toc, _ = payload_of(blob)
    assert _entry(toc, "big", "weight")["exponent"] == 113 and _entry(toc, "tiny", "weight")["exponent"] < -150
    assert_same_tree(dec, rec)
    assert np.all(np.isfinite(dec["big"]["weight"])) and stats[0]["rel_l2"] < 1e-3


# --------------------------------------------------------------------------- archive and payload bounds
def _padded_payload(n: int) -> bytes:
    """An n-byte payload whose table of contents is valid JSON made mostly of whitespace (rejected only
    after parsing: it lacks the expected top-level keys)."""
    toc = b"{" + b" " * (n - 4 - len(b'{"format":1}')) + b'"format":1}'
    return struct.pack("<I", len(toc)) + toc


# Decodes a blob in a fresh interpreter and prints how far its resident set rose above where it stood just
# before: peak RSS (VmHWM), which counts what tracemalloc misses (the compressors' native buffers, mapped pages).
# A blob of the same kind and a tenth of the size is decoded first, so that imports and the allocator's first
# arenas are in the starting point; then the high-water mark is reset to the current RSS (/proc/self/clear_refs
# "5", Linux 4.0+). The blobs are read before the reset: only decoding is measured.
_RSS_CHILD = r"""
import json, sys
from lmc.memory import reset_peak, status
from lmcbench.lossy import ExCPFormatError, decode_checkpoint


path, warm_path, limit = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kw = {} if limit is None else {"max_payload_bytes": limit}
blob, warm = open(path, "rb").read(), open(warm_path, "rb").read()
for b in (warm, warm):
    try:
        decode_checkpoint(b, **kw)
    except ExCPFormatError:
        pass
start = reset_peak()
assert start is not None, "cannot reset the peak RSS here"
try:
    decode_checkpoint(blob, **kw)
    error = ""
except ExCPFormatError as e:
    error = str(e)
print(json.dumps({"growth": status("VmHWM") - start, "error": error}))
"""


def _decode_rss(tmp_path, blob: bytes, warm: bytes, limit=None) -> tuple[int, str]:
    """Peak RSS growth of decode_checkpoint(blob) in a child process, and its ExCPFormatError ("" if none)."""
    import subprocess
    import sys

    (tmp_path / "blob").write_bytes(blob)
    (tmp_path / "warm").write_bytes(warm)
    p = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(tmp_path / "blob"), str(tmp_path / "warm"),
                        json.dumps(limit)], capture_output=True, text=True, check=True)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r["growth"], r["error"]


def test_max_payload_bytes_refuses_before_allocating(tmp_path):
    """A 4 KiB blob that inflates to 8 MiB, decoded with a 1 MiB limit: refused, and the decoding process's peak
    RSS rises by less than the limit (it never holds the payload: an 8 MiB buffer would raise it by 8 MiB)."""
    n = 8 << 20
    blob = excp.container._pack_container(_padded_payload(n), "zstd", 3)
    assert len(blob) < 4096
    growth, error = _decode_rss(tmp_path, blob, excp.container._pack_container(_padded_payload(n // 10), "zstd", 3),
                                limit=1 << 20)
    assert "limit" in error
    assert growth < 1 << 20, growth
    assert "top-level keys" in expect_format_error(blob)  # the default limit lets it through to the parser
    with pytest.raises(ExCPFormatError, match="top-level keys"):
        decode_checkpoint(blob, max_payload_bytes=n)
    for bad in (-1, 1.5, "big", True, None):
        with pytest.raises(ExCPError) as ei:
            decode_checkpoint(blob, max_payload_bytes=bad)
        assert not isinstance(ei.value, ExCPFormatError) and "max_payload_bytes" in str(ei.value)


@pytest.mark.parametrize("archiver", ARCHIVERS)
def test_decoding_keeps_one_copy_of_the_payload(archiver, tmp_path):
    """The payload is decompressed into one buffer (no parts + join) and the table of contents is decoded from
    it directly (no bytes copy before the str); without an archiver the blob itself is parsed in place. Peak
    RSS of the decoding process (a child), above where it stood before decoding."""
    n = 8 << 20
    pack = lambda m: excp.container._pack_container(_padded_payload(m), archiver, {"lzma": 1, "zstd": 3}.get(archiver))
    growth, error = _decode_rss(tmp_path, pack(n), pack(n // 10))
    assert "top-level keys" in error
    # the TOC as a str (n) plus, when archived, the payload (n)
    assert growth < (1.25 if archiver == "none" else 2.25) * n, growth / n


def _xz_with_dict_byte(data: bytes, dict_byte: int) -> bytes:
    """An xz stream of ``data`` whose LZMA2 dictionary size property is forged (block header CRC fixed)."""
    x = bytearray(lzma.compress(data, format=lzma.FORMAT_XZ, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 4096}]))
    hs = (x[12] + 1) * 4  # the block header follows the 12-byte stream header
    bh = x[12:12 + hs]
    assert bh[1] & 0xC0 == 0 and bh[2] == 0x21 and bh[3] == 1  # no size fields; one filter, LZMA2, 1 property byte
    bh[4] = dict_byte
    bh[-4:] = struct.pack("<I", zlib.crc32(bytes(bh[:-4])))
    x[12:12 + hs] = bh
    return bytes(x)


def test_lzma_decoder_memory_is_limited(chain2):
    payload, _ = excp.container._unpack_container(chain2["blob2"])
    payload = bytes(payload)
    ok = _xz_with_dict_byte(payload, 18)  # 4 KiB... 2 MiB dictionaries: a valid archive
    assert_same_tree(decode_checkpoint(raw_container(ok, 1, len(payload), zlib.crc32(payload)), chain2["ref"]),
                     chain2["rec2"])
    forged = _xz_with_dict_byte(payload, 34)  # a 512 MiB dictionary: over the decoder's 256 MiB limit
    msg = expect_format_error(raw_container(forged, 1, len(payload), zlib.crc32(payload)), chain2["ref"])
    assert "memory limit" in msg
    # preset 9 (64 MiB dictionary, the default level) fits the limit
    blob, rec, _ = encode_checkpoint(chain2["t2"], chain2["ref"], ExCPConfig(archiver="lzma", archiver_level=9))
    assert_same_tree(decode_checkpoint(blob, chain2["ref"]), rec)


def test_zstd_archive_is_exactly_one_frame(chain2):
    import zstandard

    payload, _ = excp.container._unpack_container(chain2["blob2"])
    payload = bytes(payload)
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)
    skippable = struct.pack("<II", 0x184D2A50, 5) + b"hello"

    def blob(archived):
        return raw_container(archived, 2, len(payload), zlib.crc32(payload))

    assert_same_tree(decode_checkpoint(blob(frame), chain2["ref"]), chain2["rec2"])
    for archived in (frame + skippable, skippable + frame, frame + b"junk",
                     frame + zstandard.ZstdCompressor().compress(b"a second frame"),
                     frame + zstandard.ZstdCompressor(write_content_size=True).compress(b"")):
        expect_format_error(blob(archived), chain2["ref"])
