"""The fuzzer's zero-mask blobs (format 10, FORMAT.md "Zero-mask blob"): their seeds, their parse and their
forgeries. A zero-mask blob is a header of its own around two whole blobs (the bitmap, the kept elements), so
it is damaged in three ways: its own fields forged with the header CRC recomputed (the refusals it must get are
required); either inner blob damaged by the fuzzer's own mutations of a plain blob and wrapped again (an inner
refusal it requires stays required); and the whole blob cut or flipped."""

import ml_dtypes
import numpy as np

import lmc
from lmc import api, zmask


def zmask_specs(small=False):
    """(name, x, ref, chunk): tensors lmc codes with the mask: an embedding's moment with rows of zeros (fp32
    and bf16: the rows kept with their length) and a pruned fp16 weight, half its elements zero (kept flat)."""
    rng = np.random.default_rng(31)
    rows, cols = (64, 96) if small else (96, 128)
    e = (np.abs(rng.standard_normal((rows, cols))) * 1e-3).astype(np.float32)
    e[::3] = 0
    e[1::5] = 0
    pr = (rng.standard_normal(rows * cols + 5) * 0.02).astype(np.float16)   # (a length not a multiple of 8)
    pr[rng.random(pr.size) < 0.5] = 0
    return [("f32_zmask_rows", e, None, 2048), ("bf16_zmask_rows", e.astype(ml_dtypes.bfloat16), None, 1024),
            ("f16_zmask_pruned", pr, None, 1500)]


def is_masked(blob):
    return len(blob) > 7 and blob[6] == zmask.FLAG_ZERO


class Masked:
    """A zero-mask blob: its header fields and its two inner blobs (parsed by ``blob_class``)."""

    def __init__(self, blob, blob_class):
        h = api._parse_header(np.frombuffer(blob, np.uint8))
        self.h, self.blob = h, blob
        self.shape, self.k = list(h["shape"]), h["k"]
        self.bits = blob[h["bits"][0]:h["bits"][1]]
        self.values = blob[h["values"][0]:]
        self.inner = (blob_class(self.bits), blob_class(self.values))
        self.hl = h["bits"][0]

    def wrap(self, bits=None, values=None, k=None, nbits=None, shape=None, version=10, flags=zmask.FLAG_ZERO):
        bits = self.bits if bits is None else bits
        values = self.values if values is None else values
        shape = self.shape if shape is None else shape
        return zmask.header(api.MAGIC, self.h["code"], shape, self.k if k is None else k,
                            len(bits) if nbits is None else nbits, version, flags) + bits + values


MSG_ZM = "zero mask"
MSG_FLAGS = "header flags"


def zmask_mutation(m, rng, ref, inner_mutation):
    """One forgery of zero-mask blob ``m``: (kind, owner, blob, reference, expected) as the fuzzer's
    ``mutations`` gives them; ``inner_mutation(blob_object, rng, ref)``: the fuzzer's mutation of a plain
    blob."""
    kinds = ["zm:k", "zm:nbits", "zm:shape", "zm:flags", "zm:swap", "zm:bitflip", "zm:pad", "zm:nested",
             "zm:inner_bits", "zm:inner_values", "zm:cut", "zm:flip"]
    probs = [.08, .08, .06, .06, .04, .08, .04, .04, .2, .2, .06, .06]
    kind = str(rng.choice(kinds, p=probs))
    total = int(np.prod(m.shape))
    if kind == "zm:k":
        k = int(rng.choice([0, 1, m.k - 1, m.k + 1, total, total + 1, 2 ** 64 - 1]))
        if k == m.k:
            k += 1
        return kind, "zmask", m.wrap(k=k % 2 ** 64), None, ("error", MSG_ZM, None)
    if kind == "zm:nbits":
        nb = len(m.bits) + int(rng.choice([-9, -1, 1, 8, 1 << 20]))
        return kind, "zmask", m.wrap(nbits=max(nb, 0)), None, ("error", "", None)
    if kind == "zm:shape":
        if rng.random() < 0.5 and len(m.shape) == 2:   # the same elements in another shape: decodes, reshaped
            return kind, "zmask", m.wrap(shape=[total]), None, ("reshape", (total,), None)
        # (8 or 16 elements more or fewer: the bitmap's length no longer fits; one fewer could still fit it
        # and decode as a shorter tensor, a blob consistent in itself)
        return kind, "zmask", m.wrap(shape=[total + int(rng.choice([-16, -8, 8, 16]))]), None, ("error", "", None)
    if kind == "zm:flags":
        version, flags = [(9, 2), (10, 0), (10, 1), (10, 3), (10, 6), (11, 2)][int(rng.integers(6))]
        msg = "version" if version == 11 else MSG_FLAGS
        return kind, "zmask", m.wrap(version=version, flags=flags), None, ("error", msg, None)
    if kind == "zm:swap":
        return kind, "zmask", m.wrap(bits=m.values, values=m.bits), None, ("error", MSG_ZM, None)
    keep = np.unpackbits(lmc.decompress(m.bits))
    if kind == "zm:pad" and total % 8 == 0:
        kind = "zm:bitflip"
    if kind in ("zm:bitflip", "zm:pad"):
        i = int(rng.integers(total, keep.size)) if kind == "zm:pad" else int(rng.integers(total))
        keep[i] ^= 1
        bits = lmc.compress(np.packbits(keep), format_version=9)
        return kind, "zmask", m.wrap(bits=bits), None, ("error", MSG_ZM, None)
    if kind == "zm:nested":   # the values blob itself a zero-mask blob (or a blob against a reference)
        x = lmc.decompress(m.values)
        inner = m.blob if rng.random() < 0.5 else lmc.compress(x, reference=x, format_version=9)
        return kind, "zmask", m.wrap(values=inner), None, ("error", MSG_ZM, None)
    if kind in ("zm:inner_bits", "zm:inner_values"):
        j = 0 if kind == "zm:inner_bits" else 1
        ik, owner, blob, _, spec = inner_mutation(m.inner[j], rng, None)
        part = dict(bits=blob) if j == 0 else dict(values=blob)
        # a plain blob's legitimate reshape or retype: the mask's checks ignore or refuse it; a refusal the plain
        # blob must get stays required (its message may be the mask's own: its checks can come first)
        spec = None if spec is None or spec[0] != "error" else ("error", "", None)
        return f"{kind}:{ik}", owner, m.wrap(**part), None, spec
    b = bytearray(m.blob)
    if kind == "zm:cut":
        return kind, "zmask", bytes(b[:int(rng.integers(len(b)))]), None, None
    for _ in range(int(rng.integers(1, 4))):
        b[int(rng.integers(len(b)))] ^= 1 << int(rng.integers(8))
    return kind, "zmask", bytes(b), None, None
