"""LMCL blobs (LOSSY_FORMAT.md) under hostile input: truncations, a forged or corrupt header, bad checksums,
forged tables of contents with valid checksums; every refusal is one LossyFormatError line."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
from excp_testlib import make_checkpoint

from lmcbench.lossy.chain import Chain
from lmcbench.lossy.container import HEADER_SIZE, LossyFormatError, unpack
from lmcbench.lossy.method import make_method
from lmcbench.lossy.methods import missing_package

HEAD = struct.Struct("<4sBBHIQIII")


@pytest.fixture(scope="module", params=["efq", "adam8bit", "bitsnap", "sz3", "zfp"])
def chain2(request):
    if missing_package(request.param):
        pytest.skip(f"{missing_package(request.param)} is not installed")
    rng = np.random.default_rng(0)
    t1 = make_checkpoint(rng)
    t2 = make_checkpoint(rng, base=t1)
    m = make_method({"method": request.param})
    chain = Chain(m)
    chain.add(t1)
    prev = chain.prev
    blob, recon, *_ = chain.add(t2)
    return {"m": m, "blob": blob, "prev": prev, "recon": recon}


def fails(m, blob, prev) -> str:
    with pytest.raises(LossyFormatError) as e:
        m.decode(blob, prev)
    msg = str(e.value)
    assert msg and "\n" not in msg, msg
    return msg


def reheader(blob: bytes, **fields) -> bytes:
    """The blob with header fields replaced and the header checksum made right again (a forged header)."""
    names = ["magic", "version", "method", "reserved", "toc_len", "data_len", "toc_crc", "data_crc", "head_crc"]
    vals = dict(zip(names, HEAD.unpack(blob[:HEADER_SIZE])))
    vals.update(fields)
    head = HEAD.pack(*[vals[n] for n in names])
    return head[:-4] + struct.pack("<I", zlib.crc32(head[:-4])) + blob[HEADER_SIZE:]


def forge(blob: bytes, edit) -> bytes:
    """The blob with its TOC edited by ``edit(toc)`` (returns the new TOC) and every checksum right again."""
    _, _, _, _, toc_len, data_len, _, data_crc, _ = HEAD.unpack(blob[:HEADER_SIZE])
    toc = json.loads(blob[HEADER_SIZE:HEADER_SIZE + toc_len])
    new = json.dumps(edit(toc)).encode()
    data = blob[HEADER_SIZE + toc_len:]
    return reheader(HEAD.pack(b"LMCL", 1, 0, 0, 0, 0, 0, 0, 0) + new + data, version=blob[4], method=blob[5], toc_len=len(new),
                    data_len=len(data), toc_crc=zlib.crc32(new), data_crc=zlib.crc32(data))


def test_the_blob_decodes(chain2):
    dec = chain2["m"].decode(chain2["blob"], chain2["prev"])
    assert all(np.array_equal(dec[n]["weight"], chain2["recon"][n]["weight"]) for n in dec)
    # forge() with no edit gives the same blob back
    assert forge(chain2["blob"], lambda t: t) != b"" and chain2["m"].decode(forge(chain2["blob"], lambda t: t),
                                                                           chain2["prev"]).keys() == dec.keys()


def test_truncations(chain2):
    blob, m, prev = chain2["blob"], chain2["m"], chain2["prev"]
    for n in sorted(set(range(0, 60)) | set(np.linspace(0, len(blob) - 1, 80).astype(int).tolist())):
        fails(m, blob[:n], prev)
    assert "truncated" in fails(m, blob[:-1], prev)
    assert "trailing" in fails(m, blob + b"\0", prev)


def test_header(chain2):
    blob, m, prev = chain2["blob"], chain2["m"], chain2["prev"]
    assert "magic" in fails(m, b"XXXX" + blob[4:], prev)
    assert "header checksum" in fails(m, blob[:4] + bytes([blob[4] ^ 0x40]) + blob[5:], prev)  # a flipped header byte
    assert "version" in fails(m, reheader(blob, version=3), prev)  # a forged header, checksum made right
    assert "method" in fails(m, reheader(blob, method=99), prev)
    other = 1 if blob[5] != 1 else 2
    assert "not" in fails(m, reheader(blob, method=other), prev)  # another method's blob
    assert "reserved" in fails(m, reheader(blob, reserved=1), prev)
    assert "limit" in fails(m, reheader(blob, toc_len=1 << 31), prev)
    fails(m, reheader(blob, data_len=1 << 60), prev)
    fails(m, "not bytes", prev)


def test_checksums(chain2):
    blob, m, prev = chain2["blob"], chain2["m"], chain2["prev"]
    toc_len = HEAD.unpack(blob[:HEADER_SIZE])[4]
    b = bytearray(blob)
    b[HEADER_SIZE + 3] ^= 0x20
    assert "table of contents checksum" in fails(m, bytes(b), prev)
    for pos in (HEADER_SIZE + toc_len, len(blob) - 1, (HEADER_SIZE + toc_len + len(blob)) // 2):
        b = bytearray(blob)
        b[pos] ^= 0x01
        assert "data checksum" in fails(m, bytes(b), prev)


def _arrays(edit_entry, which=0):
    def edit(toc):
        e = [a for a in toc["arrays"] if a["mode"] not in ("raw",)][which]
        edit_entry(e)
        return toc
    return edit


@pytest.mark.parametrize("edit, msg", [
    (lambda t: {**t, "method": "other"}, "table of contents"),
    (lambda t: {**t, "extra": 1}, "table of contents"),
    (lambda t: {**t, "arrays": t["arrays"] + t["arrays"][:1]}, ""),
    (lambda t: {**t, "arrays": [a for a in t["arrays"] if a["kind"] != "weight"]}, ""),
    (_arrays(lambda e: e.update(mode="bogus")), "mode"),
    (_arrays(lambda e: e.update(shape=[3, 3, 3])), ""),
    (_arrays(lambda e: e.update(shape=[-1])), "shape"),
    (_arrays(lambda e: e.update(kind="grad")), "kind"),
    (_arrays(lambda e: e["args"].update(extra=1)), ""),
    (_arrays(lambda e: e.update(args={})), ""),
    (_arrays(lambda e: e["sections"][0].__setitem__(1, e["sections"][0][1] + 1)), ""),
    (_arrays(lambda e: e["sections"][0].__setitem__(0, "gzip")), "section"),
    (_arrays(lambda e: e["sections"][0].__setitem__(2, e["sections"][0][2] + 4)), ""),
    (_arrays(lambda e: e["sections"][0].__setitem__(3, "float64")), "section"),
    (_arrays(lambda e: e.update(dtype="float16")), ""),
    (_arrays(lambda e: e.update(sections=[])), ""),
    (_arrays(lambda e: e.pop("args")), "keys"),
])
def test_forged_tables_of_contents(chain2, edit, msg):
    assert msg in fails(chain2["m"], forge(chain2["blob"], edit), chain2["prev"])


def test_json_constants_and_garbage(chain2):
    blob, m, prev = chain2["blob"], chain2["m"], chain2["prev"]
    toc_len = HEAD.unpack(blob[:HEADER_SIZE])[4]
    data = blob[HEADER_SIZE + toc_len:]
    for toc in (b"{\"a\": NaN}", b"\xff\xfe", b"[" * 100000, b"null"):
        forged = reheader(blob[:HEADER_SIZE] + toc + data, toc_len=len(toc), toc_crc=zlib.crc32(toc))
        fails(m, forged, prev)


def test_reference_must_fit(chain2):
    blob, m, prev = chain2["blob"], chain2["m"], chain2["prev"]
    residual = {"efq", "bitsnap", "sz3", "zfp"}
    if m.name in residual:
        fails(m, blob, None)  # a residual blob without the previous reconstruction
        bad = {n: {k: (None if a is None else np.zeros((2, 2), np.float32)) for k, a in t.items()}
               for n, t in prev.items()}
        fails(m, blob, bad)


def test_index_past_the_table():
    """A cluster index past its centroid table and a bitmask that disagrees with its count are refused."""
    from lmcbench.lossy.arrays import decode_array

    e = {"name": "p", "kind": "exp_avg", "dtype": "float32", "shape": [4], "mode": "cluster", "args": {"bits": 2},
         "sections": []}
    assert decode_array(e, [np.float32([1, 2]), np.uint8([0, 1, 2, 1])], None).tolist() == [0, 1, 2, 1]
    with pytest.raises(LossyFormatError, match="past"):
        decode_array(e, [np.float32([1, 2]), np.uint8([0, 1, 3, 1])], None)
    rng = np.random.default_rng(3)
    t1 = make_checkpoint(rng)
    t2 = make_checkpoint(rng, base=t1)
    m = make_method({"method": "bitsnap", "keep": 0.5, "bits": 2})
    chain = Chain(m)
    chain.add(t1)
    prev = chain.prev
    blob, *_ = chain.add(t2)

    def miscount(toc):
        for e in toc["arrays"]:
            if e["mode"] == "bitmask":
                e["args"]["count"] += 1
        return toc

    assert "bitmask" in fails(m, forge(blob, miscount), prev)


@pytest.fixture(scope="module")
def ctxq_chain():
    rng = np.random.default_rng(5)
    t1 = make_checkpoint(rng)
    t2 = make_checkpoint(rng, base=t1)
    m = make_method({"method": "efq", "q": 1.0, "alloc": "rms"})
    chain = Chain(m)
    chain.add(t1)
    prev = chain.prev
    blob, recon, *_ = chain.add(t2)
    toc, _ = unpack(blob, "efq")
    assert blob[4] == 2 and any(e["mode"] == "ctxq" for e in toc["arrays"])
    return m, blob, prev


def _ctxq_edit(edit_entry):
    def edit(toc):
        edit_entry([a for a in toc["arrays"] if a["mode"] == "ctxq"][0])
        return toc
    return edit


def _section_bytes(blob, which, new):
    """The blob with the bytes of section ``which`` (counting all sections of the data region) replaced by
    ``new``, its descriptor and every checksum made right again."""
    toc_len = HEAD.unpack(blob[:HEADER_SIZE])[4]
    toc = json.loads(blob[HEADER_SIZE:HEADER_SIZE + toc_len])
    data = blob[HEADER_SIZE + toc_len:]
    out, pos, k = [], 0, 0
    for e in toc["arrays"]:
        for s in e["sections"]:
            b = data[pos:pos + s[1]]
            pos += s[1]
            if k == which:
                b = new(b)
                s[1] = s[2] = len(b)
            out.append(b)
            k += 1
    new_toc = json.dumps(toc).encode()
    data = b"".join(out)
    return reheader(HEAD.pack(b"LMCL", 1, 0, 0, 0, 0, 0, 0, 0) + new_toc + data, version=blob[4], method=blob[5],
                    toc_len=len(new_toc), data_len=len(data), toc_crc=zlib.crc32(new_toc), data_crc=zlib.crc32(data))


def _ctxq_sections(blob):
    toc_len = HEAD.unpack(blob[:HEADER_SIZE])[4]
    toc = json.loads(blob[HEADER_SIZE:HEADER_SIZE + toc_len])
    k, found = 0, []
    for e in toc["arrays"]:
        if e["mode"] == "ctxq":
            found.append((k, k + 1))
        k += len(e["sections"])
    return found[0]


def test_ctxq_needs_version_2(ctxq_chain):
    m, blob, prev = ctxq_chain
    assert "version 2" in fails(m, reheader(blob, version=1), prev)


@pytest.mark.parametrize("edit, msg", [
    (_ctxq_edit(lambda e: e["args"].update(rows=e["args"]["rows"] + 1)), "ctxq"),
    (_ctxq_edit(lambda e: e["args"].update(rows=True)), "ctxq"),
    (_ctxq_edit(lambda e: e["args"].update(step="x")), "ctxq"),
    (_ctxq_edit(lambda e: e.update(shape=[1 << 30, 1 << 9])), ""),
    (_ctxq_edit(lambda e: e["sections"][1].__setitem__(3, "int8")), "ctxq"),
])
def test_ctxq_forged_tables(ctxq_chain, edit, msg):
    m, blob, prev = ctxq_chain
    assert msg in fails(m, forge(blob, edit), prev)


def test_ctxq_forged_streams(ctxq_chain):
    """A stream cut short, grown, or with a byte changed (checksums made right) is refused in one line, and so
    are a centroid table too long or not finite."""
    m, blob, prev = ctxq_chain
    s_stream, s_table = _ctxq_sections(blob)
    assert "ctxq" in fails(m, _section_bytes(blob, s_stream, lambda b: b[:-1]), prev)
    assert "ctxq" in fails(m, _section_bytes(blob, s_stream, lambda b: b + b"\0"), prev)
    assert "ctxq" in fails(m, _section_bytes(blob, s_stream, lambda b: b"\1" + b[1:]), prev)
    assert "ctxq" in fails(m, _section_bytes(blob, s_stream, lambda b: b[:3]), prev)
    assert "ctxq" in fails(m, _section_bytes(blob, s_table, lambda b: np.full(17, 1, np.float32).tobytes()), prev)
    assert "ctxq" in fails(m, _section_bytes(blob, s_table, lambda b: np.float32([np.nan]).tobytes()), prev)
    for pos in range(1, 12):  # a changed byte: refused or decoded to other codes, never a crash
        def flip(b, pos=pos):
            b = bytearray(b)
            b[min(pos, len(b) - 1)] ^= 0x5A
            return bytes(b)
        try:
            m.decode(_section_bytes(blob, s_stream, flip), prev)
        except LossyFormatError as e:
            assert "\n" not in str(e)
