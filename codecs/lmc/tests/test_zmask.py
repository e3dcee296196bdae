"""Format 10's zero mask (FORMAT.md, "Zero-mask blob"): where it is taken, what it decodes to, and what it refuses."""
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest

import fuzz_decoder as FZ
import lmc
import pyref
from fuzz_zmask import Masked, zmask_specs
from lmc import zmask


def _moment(dt, rows=256, cols=192, seed=0):
    """An embedding's Adam moment: rows the data never reached all zero (the rest positive, no zero among them)."""
    rng = np.random.default_rng(seed)
    x = (np.abs(rng.standard_normal((rows, cols))) * 1e-3 + 1e-6).astype(np.float32)
    x[rng.random(rows) < 0.6] = 0
    return x.astype(dt)


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16, np.float16, np.int32], ids=str)
def test_rows_of_zeros_take_the_mask(dt):
    x = _moment(dt) if np.dtype(dt).kind == "f" else (_moment(np.float32) * 1e6).astype(dt)
    before = x.copy()
    blob = lmc.compress(x)
    plain = lmc.compress(x, format_version=9)
    assert len(blob) < len(plain) - len(plain) // zmask.MARGIN
    inf = lmc.info(blob)
    assert inf["version"] == 10 and inf["shape"] == x.shape and inf["dtype"] == x.dtype
    keep = x.reshape(-1).view(np.uint8 if x.itemsize == 1 else f"u{x.itemsize}") != 0
    assert inf["zero_mask"]["nonzero"] == int(keep.sum()) < x.size
    assert lmc.info(plain)["zero_mask"] is None and lmc.info(plain)["version"] == 9
    for threads in (1, 2):
        y = lmc.decompress(blob, threads=threads)
        assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()
    out = np.full(x.size, 7, x.dtype)    # out= of another shape, same size: filled, returned in the blob's shape
    y = lmc.decompress(blob, out=out)
    assert y.shape == x.shape and np.shares_memory(y, out) and out.tobytes() == x.tobytes()
    assert x.tobytes() == before.tobytes()   # the caller's array untouched
    data, _, _ = pyref.decode(blob)      # the independent oracle
    assert data == x.tobytes()
    # the rows kept with their length: the kept elements' blob has the tensor's row length
    m = Masked(blob, FZ.Blob)
    assert list(m.inner[1].shape)[-1] == x.shape[-1]


def test_scattered_zeros_keep_negative_zero_and_denormals():
    """A pruned weight: half its elements +0.0 (masked), with -0.0, denormals and NaN payloads among the rest
    (values, not zeros: only all-bits-zero elements leave)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(50_001) * 0.02).astype(np.float32)
    x[rng.random(x.size) < 0.5] = 0.0
    u = x.view(np.uint32)
    u[1:200:7] = 0x80000000          # -0.0
    u[2:200:7] = 0x00000003          # a denormal
    u[3:200:7] = 0x7FC00123          # a NaN with a payload
    blob = lmc.compress(x)
    assert lmc.info(blob)["version"] == 10
    assert lmc.info(blob)["zero_mask"]["nonzero"] == int(np.count_nonzero(u))
    assert lmc.decompress(blob).tobytes() == x.tobytes()
    assert pyref.decode(blob)[0] == x.tobytes()


def test_where_the_mask_is_not_taken():
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((300, 200)) * 0.02).astype(np.float32)
    assert lmc.compress(w) == lmc.compress(w, format_version=9)          # no zeros: version 9's bytes
    small = _moment(np.float32, 8, 64)                                     # 2 KiB: the mask's own cost
    assert lmc.compress(small) == lmc.compress(small, format_version=9)
    few = w.copy()
    few.reshape(-1)[::100] = 0                                              # 1% zeros: not tried
    assert not zmask.worth_trying(few) and lmc.compress(few) == lmc.compress(few, format_version=9)
    zeros = np.zeros((512, 512), np.float32)                               # all zero: the plain blob is tiny
    assert lmc.info(lmc.compress(zeros))["version"] == 9
    x = _moment(np.float32)
    same = lmc.compress(x, reference=x)            # against itself: the reference codes it in a few bytes
    assert lmc.info(same)["version"] == 9 and lmc.info(same)["has_reference"]
    for fv in range(1, 10):
        assert lmc.info(lmc.compress(x, format_version=fv))["version"] <= 9


def test_a_reference_never_costs_more_than_the_mask():
    """With a reference the mask (which codes alone) is taken wherever it is smaller than the blob against the
    reference: that blob then needs no reference, and is never larger than the tensor coded alone."""
    x = _moment(np.float32)
    far = (np.random.default_rng(9).standard_normal(x.shape) * 1e-3).astype(np.float32)   # no help at all
    blob = lmc.compress(x, reference=far)
    alone = lmc.compress(x)
    assert lmc.info(blob)["version"] == 10 and not lmc.info(blob)["has_reference"] and len(blob) <= len(alone)
    assert lmc.decompress(blob, reference=far).tobytes() == x.tobytes() == lmc.decompress(blob).tobytes()
    near = x.copy()
    near[near != 0] *= np.float32(1.0001)          # the previous step: the zeros and the rows stay
    withref = lmc.compress(x, reference=near)
    assert len(withref) <= len(alone) + 8
    assert lmc.decompress(withref, reference=near).tobytes() == x.tobytes()


@pytest.mark.parametrize("block", [8, 64, 1 << 20])
def test_the_scatter_in_blocks(monkeypatch, block):
    """The decoder moves the kept elements from the head of the output to their places a block at a time, from
    the last block back: every block size gives the same array (blocks of 8 and 64: thousands of blocks, some
    with nothing kept, some with everything)."""
    monkeypatch.setattr(zmask, "BLOCK", block)
    rng = np.random.default_rng(4)
    for x in (_moment(np.float32), _moment(ml_dtypes.bfloat16, 300, 70)):
        assert lmc.decompress(lmc.compress(x)).tobytes() == x.tobytes()
    p = (rng.standard_normal(50_001) * 0.02).astype(np.float16)
    p[rng.random(p.size) < 0.7] = 0
    blob = lmc.compress(p)
    assert lmc.info(blob)["version"] == 10
    out = np.full(p.size, 3, np.float16)
    assert lmc.decompress(blob, out=out, threads=2) is out and out.tobytes() == p.tobytes()


def test_the_size_floor_and_prefer_fast(monkeypatch):
    """A plain blob under MIN_BYTES is kept though the mask is smaller (its second header and bitmap are most of
    it): a nearly all-zero tensor of 8 KiB; prefer="fast" takes the mask as "speed" does."""
    x = np.zeros(2048, np.float32)
    x[::97] = 1.5
    assert len(lmc.compress(x, format_version=9)) < zmask.MIN_BYTES
    assert lmc.info(lmc.compress(x))["version"] == 9
    monkeypatch.setattr(zmask, "MIN_BYTES", 0)
    assert lmc.info(lmc.compress(x))["version"] == 10
    monkeypatch.undo()
    y = _moment(np.float32)
    assert lmc.compress(y, prefer="fast") == lmc.compress(y)
    assert lmc.info(lmc.compress(y, prefer="fast"))["version"] == 10


def test_info_checks_both_blobs():
    """info() refuses what decompress refuses in the two blobs' headers (their dtype, count, reference)."""
    x = _moment(np.float32)
    m = Masked(lmc.compress(x), FZ.Blob)
    vals = x[x != 0]
    for forged in (m.wrap(values=lmc.compress(vals.view(np.int32), format_version=9)),
                   m.wrap(values=lmc.compress(vals, reference=vals * 0, format_version=9)),
                   m.wrap(values=lmc.compress(vals[:-1], format_version=9)),
                   m.wrap(bits=b"garbage!garbage!")):
        for f in (lmc.info, lmc.decompress):
            with pytest.raises(lmc.FormatError, match="zero mask"):
                f(forged)
    assert lmc.info(m.wrap())["dtype"] == x.dtype


def test_prefer_size_takes_any_saving(monkeypatch):
    x = _moment(np.float32)
    plain = lmc.compress(x, format_version=9)
    monkeypatch.setattr(zmask, "MARGIN", 1)        # a margin no saving clears: "speed" keeps the plain blob
    assert lmc.compress(x) == plain
    assert lmc.info(lmc.compress(x, prefer="size"))["version"] == 10


def _forge(blob, **kw):
    m = Masked(blob, FZ.Blob)
    return m.wrap(**kw)


def test_forged_fields_are_refused():
    x = _moment(np.float32)
    blob = lmc.compress(x)
    m = Masked(blob, FZ.Blob)
    assert lmc.decompress(m.wrap()).tobytes() == x.tobytes()      # the wrapper itself gives the same blob
    assert m.wrap() == blob
    cases = {
        "k": m.wrap(k=m.k + 1), "k past total": m.wrap(k=x.size + 1), "nbits": m.wrap(nbits=len(m.bits) - 1),
        "nbits past the end": m.wrap(nbits=len(blob)), "swapped": m.wrap(bits=m.values, values=m.bits),
        "nested": m.wrap(values=blob), "values with a reference": m.wrap(
            values=lmc.compress(x[x != 0], reference=x[x != 0], format_version=9)),
        "other dtype": m.wrap(values=lmc.compress(x[x != 0].astype(np.float16), format_version=9)),
        "version 9": m.wrap(version=9), "no flag": m.wrap(flags=0), "flags 3": m.wrap(flags=3),
        "shape": m.wrap(shape=[x.shape[0] + 8, x.shape[1]]),
    }
    keep = np.unpackbits(lmc.decompress(m.bits))
    keep[5] ^= 1
    cases["a bit flipped"] = m.wrap(bits=lmc.compress(np.packbits(keep), format_version=9))
    head = bytearray(blob[:m.hl])
    head[-5] ^= 1                                                  # a field under the CRC
    cases["crc"] = bytes(head) + blob[m.hl:]
    for what, forged in cases.items():
        with pytest.raises(lmc.FormatError):
            lmc.decompress(forged)
        if what != "shape":
            out = np.full(x.shape, 5, x.dtype)
            with pytest.raises(lmc.FormatError):
                lmc.decompress(forged, out=out)
            assert (out == 5).all(), what           # nothing written before the blob was found bad
        with pytest.raises((ValueError, IndexError)):   # (the oracle refuses too; it reads cut streams unchecked)
            pyref.decode(forged)
    deep = blob
    for _ in range(3000):     # masks nested in masks: refused at the first, never a recursion
        deep = Masked(blob, FZ.Blob).wrap(values=deep)
    for f in (lmc.info, lmc.decompress):
        with pytest.raises(lmc.FormatError, match="zero mask"):
            f(deep)
    for cut in list(range(0, m.hl + 8)) + [len(blob) // 2, len(blob) - 1]:
        with pytest.raises(lmc.FormatError):
            lmc.decompress(blob[:cut])


def test_padding_bits_are_refused():
    x = (np.random.default_rng(3).standard_normal(20_003) * 0.02).astype(np.float32)
    x[::2] = 0
    blob = lmc.compress(x)
    m = Masked(blob, FZ.Blob)
    keep = np.unpackbits(lmc.decompress(m.bits))
    keep[-1] = 1                                   # past the last of the 20,003 elements
    with pytest.raises(lmc.FormatError, match="past the last element"):
        lmc.decompress(m.wrap(bits=lmc.compress(np.packbits(keep), format_version=9)))


def test_output_limit_before_any_allocation():
    blob = lmc.compress(_moment(np.float32))
    with pytest.raises(lmc.OutputLimitError):
        lmc.decompress(blob, max_output_bytes=1000)
    huge = _forge(blob, shape=[1 << 40, 1 << 20])
    with pytest.raises(lmc.FormatError):
        lmc.decompress(huge)


def test_torch_tensors_and_the_archive(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file
    from lmc.archive import Archive
    x = torch.from_numpy(_moment(np.float32)).to(torch.bfloat16)
    blob = lmc.compress(x)
    assert lmc.info(blob)["version"] == 10
    assert lmc.decompress(blob).tobytes() == x.view(torch.int16).numpy().tobytes()
    # a checkpoint folder whose embedding has rows of zeros, archived and restored byte for byte
    src = tmp_path / "checkpoint-1"
    src.mkdir()
    save_file({"embed.weight": _moment(np.float32), "w": np.ones((64, 64), np.float32)},
              str(src / "model.safetensors"))
    a = Archive(tmp_path / "a.lmca")
    a.add(src)
    a.restore(1, tmp_path / "r")
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert a.verify().ok


def test_fuzz_the_mask():
    """The fuzzer's zero-mask seeds and forgeries (fuzz_zmask.py): refused or decoded exactly, every refusal it
    requires seen; the seeds' inner blobs damaged by the plain blobs' mutations too."""
    corpus = [dict(name=n, x=x, ref=None, blob=lmc.compress(x, chunk_size=c)) for n, x, _, c in zmask_specs()]
    assert FZ.coverage(corpus)["zero-mask"] == 3
    stats, failures = FZ.run(corpus, 3000, seed=11, stack=0.2)
    assert not failures, failures[:3]
    kinds = stats["by_kind"]
    for k in ("zm:k", "zm:nbits", "zm:shape", "zm:flags", "zm:swap", "zm:bitflip", "zm:pad", "zm:nested",
              "zm:cut", "zm:flip"):
        assert sum(v for kk, v in kinds.items() if kk.startswith(k)) >= 20, (k, kinds)
    assert sum(v for kk, v in kinds.items() if kk.startswith("zm:inner_values:")) >= 300
    assert sum(v for kk, v in kinds.items() if kk.startswith("zm:inner_bits:")) >= 300
    assert stats["outcome"]["exact"] > 20 and stats["outcome"]["FormatError"] > 2000


def test_header_layout_as_documented():
    """FORMAT.md's bytes: magic, version 10, dtype code, flags 2, ndim, shape, k, the bitmap's length, CRC-32."""
    x = _moment(ml_dtypes.bfloat16)
    blob = lmc.compress(x)
    assert blob[:4] == b"LMC1" and blob[4:8] == bytes([10, 3, 2, 2])
    shape = struct.unpack_from("<2Q", blob, 8)
    k, nbits = struct.unpack_from("<QQ", blob, 24)
    (crc,) = struct.unpack_from("<I", blob, 40)
    assert shape == x.shape and crc == zlib.crc32(blob[:40])
    assert k == int(np.count_nonzero(x.view(np.uint16)))
    bits = lmc.decompress(blob[44:44 + nbits])
    assert bits.dtype == np.uint8 and bits.shape == (-(-x.size // 8),)
    assert np.array_equal(np.unpackbits(bits)[:x.size].astype(bool), x.reshape(-1).view(np.uint16) != 0)
    vals = lmc.decompress(blob[44 + nbits:])
    assert vals.tobytes() == x.reshape(-1)[x.reshape(-1).view(np.uint16) != 0].tobytes()
