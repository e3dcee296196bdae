"""The refusals FORMAT.md requires of a decoder of delta chunks (format 6, chunk mode 6): chunks of four cases
(the encoder's, and ones written here from FORMAT.md at the cuts 8 and 12) forged in one thing each, their stream
records re-encoded raw; lmc must raise FormatError with the message, and the Python oracle refuse them too (the
structure-aware fuzzer forges them at random: fuzz_modes._delta_mutation)."""
import numpy as np
import pytest

import lmc
import pyref
from delta_parts import BF, _esc_set, _modes, _one_chunk_blob, _parse, _parts, _payload, _top, _with
from fuzz_blobs import delta_pair


# ---------------------------------------------------------------------------
# forgeries FORMAT.md requires a decoder to refuse
# ---------------------------------------------------------------------------
CASES = {
    # bf16, steps up to +-60 and 1% far moves: the encoder's chunk (c = 4: a nibble stream, q = 4, escapes of 2
    # bytes); n = 1001 (an unused final nibble, unused packed fields)
    "bf16": (BF, dict(spread=60, far=0.01), None),
    # fp16, steps up to +-6: the encoder's chunk (c = 0, q = 4, escapes of 2 bytes; n odd)
    "f16": (np.float16, dict(spread=6, far=0.02), None),
    # fp32, steps up to +-300 and 1% far moves, written here: c = 8 (one low byte stream), q = 2, escapes of
    # 3 bytes; and c = 12 (a byte and a nibble), q = 4, escapes of 3 bytes of which h may use 20 bits only
    "f32": (np.float32, dict(spread=300, far=0.01, far_span=1 << 22), (8, 2)),
    "f32_nibble": (np.float32, dict(spread=3000, far=0.01, far_span=1 << 22), (12, 4)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    """(name, x, r, Blob of one chunk, the chunk's parts, every record raw): they decode to x, with escapes
    and unused fields in the last packed byte (the forgeries below change one thing)."""
    dt, kw, plan = CASES[request.param]
    x, r = delta_pair(dt, 1001, 21, **kw)
    b = _one_chunk_blob(x, r)
    p = b.payloads[0]
    if plan is None:
        assert p[0] == 6, _modes(b.pack())
        d = _parse(p, x.size, x.dtype.itemsize)
    else:
        d = _parts(x, r, *plan)
    assert d["m"] > 0 and x.size % (8 // d["q"]) != 0
    assert lmc.decompress(b.pack([_payload(d)]), reference=r).tobytes() == x.tobytes()
    return request.param, x, r, b, d


def test_forgery_cases_cover_the_cuts(case):
    """The forged chunks cut at bit 0, 4 (the encoder's: a nibble stream only), 8 (a low byte stream only)
    and 12 (both), with 2- and 4-bit fields."""
    name, x, r, b, d = case
    assert (d["c"] % 8 == 4) == (d["nib"] is not None) and len(d["low"]) == d["c"] // 8
    assert (d["c"], d["q"]) == {"bf16": (4, 4), "f16": (0, 4), "f32": (8, 2), "f32_nibble": (12, 4)}[name]





def _pad(d, n):
    """Bit 7 of the last packed byte set: in its last field, unused where n is not a multiple of 8 / q."""
    assert n % (8 // d["q"])
    pk = d["packed"].copy()
    pk[-1] |= 0x80
    return _payload(_with(d, packed=pk))


def _pad_nibble(d, n):
    """The unused final high nibble (n odd) set; None without a nibble stream."""
    if d["nib"] is None:
        return None
    assert n % 2
    nib = d["nib"].copy()
    nib[-1] |= 0x10
    return _payload(_with(d, nib=nib))


def _extra_escape(d):
    """A field that was 0 set to 2^q - 1, m unchanged: one escape more than m."""
    g, q = 8 // d["q"], d["q"]
    pk = d["packed"].copy()
    fields = [(int(pk[k]) >> (q * t)) & ((1 << q) - 1) for k in range(pk.size - 1) for t in range(g)]
    i = fields.index(0)
    pk[i // g] |= ((1 << q) - 1) << (q * (i % g))
    return _payload(_with(d, packed=pk))


def _one(b, payload, r):
    return None if payload is None else (b.pack([payload]), r)


FORGERIES = [
    # (name, forge(x, r, blob, parts) -> (blob, reference) or None where it does not apply, message)
    ("c_W", lambda x, r, b, d: _one(b, _payload(_with(d, c=8 * x.dtype.itemsize)), r), "delta chunk"),
    ("c_W_plus_4", lambda x, r, b, d: _one(b, _payload(_with(d, c=8 * x.dtype.itemsize + 4)), r), "delta chunk"),
    ("c_255", lambda x, r, b, d: _one(b, _payload(_with(d, c=255)), r), "delta chunk"),
    # a cut that is not a multiple of 4 (its records as they are)
    ("c_plus_1", lambda x, r, b, d: _one(b, _payload(_with(d, c=d["c"] + 1)), r), "delta chunk"),
    ("c_plus_2", lambda x, r, b, d: _one(b, _payload(_with(d, c=d["c"] + 2)), r), "delta chunk"),
    ("c_W_minus_1", lambda x, r, b, d: _one(b, _payload(_with(d, c=8 * x.dtype.itemsize - 1)), r), "delta chunk"),
    ("q_0", lambda x, r, b, d: _one(b, _payload(_with(d, q=0)), r), "delta chunk"),
    ("q_3", lambda x, r, b, d: _one(b, _payload(_with(d, q=3)), r), "delta chunk"),
    ("q_16", lambda x, r, b, d: _one(b, _payload(_with(d, q=16)), r), "delta chunk"),
    ("m_past_n", lambda x, r, b, d: _one(b, _payload(d, m=x.size + 1), r), "delta chunk"),
    ("m_max", lambda x, r, b, d: _one(b, _payload(d, m=(1 << 32) - 1), r), "delta chunk"),
    # m one less / one more than the escapes the fields give, the escape records holding m values
    ("m_one_less", lambda x, r, b, d: _one(b, _payload(_with(d, m=d["m"] - 1, esc=[s[:-1] for s in d["esc"]])), r),
     "delta chunk"),
    ("m_one_more", lambda x, r, b, d: _one(b, _payload(_with(d, m=d["m"] + 1,
                                                             esc=[np.append(s, 0) for s in d["esc"]])), r),
     "delta chunk"),
    ("m_zero", lambda x, r, b, d: _one(b, _payload(_with(d, m=0, esc=[])), r), "delta chunk"),
    ("field_escape_more", lambda x, r, b, d: _one(b, _extra_escape(d), r), "delta chunk"),
    # m changed alone: the escape records no longer hold m values (a raw record of another length)
    ("m_only", lambda x, r, b, d: _one(b, _payload(d, m=d["m"] + 1), r),
     "stream or chunk payload length inconsistent"),
    # m = 0 with its escape records left: bytes after the last record
    ("m_zero_records_left", lambda x, r, b, d: _one(b, _payload(d, m=0), r), "unused trailing bytes"),
    ("unused_field", lambda x, r, b, d: _one(b, _pad(d, x.size), r), "delta chunk"),
    ("unused_nibble", lambda x, r, b, d: _one(b, _pad_nibble(d, x.size), r), "delta chunk"),
    ("escape_too_large", lambda x, r, b, d: _one(b, _esc_set(d, _top(d, x) - (1 << d["q"]) + 1), r),
     "delta chunk"),
    ("escape_max", lambda x, r, b, d: _one(b, _esc_set(d, (1 << (8 * len(d["esc"]))) - 1), r), "delta chunk"),
    # the largest h that fits: not refused by the escape rule, but a wrong element (the checksum)
    ("escape_fits", lambda x, r, b, d: _one(b, _esc_set(d, _top(d, x) - (1 << d["q"])), r),
     "chunk checksum mismatch"),
    ("trailing_byte", lambda x, r, b, d: _one(b, _payload(d) + b"\x00", r), "unused trailing bytes"),
    ("record_cut", lambda x, r, b, d: _one(b, _payload(d)[:-1], r), "chunk data truncated"),
    ("no_reference_flag", lambda x, r, b, d: (b.pack([_payload(d)], refhash=None), None),
     "chunk is delta-coded but no reference is available"),
    ("as_int", lambda x, r, b, d: (b.pack([_payload(d)], code=7 if x.dtype.itemsize == 2 else 9),
                                   r.view(np.int16 if x.dtype.itemsize == 2 else np.int32)),
     "invalid chunk flags byte"),
] + [(f"head_cut_{k}", lambda x, r, b, d, k=k: _one(b, _payload(d)[:k], r), "chunk data truncated")
     for k in range(1, 7)]


@pytest.mark.parametrize("name, forge, message", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_forgeries_are_refused(case, name, forge, message):
    _, x, r, b, d = case
    forged = forge(x, r, b, d)
    if forged is None:
        pytest.skip("no nibble stream in this case")
    blob, ref = forged
    with pytest.raises(lmc.FormatError, match="chunk 0: " + message):
        lmc.decompress(blob, reference=ref)
    with pytest.raises(ValueError):
        pyref.decode(blob, None if ref is None else ref.tobytes())


def test_no_reference_at_decode_time():
    x, r = delta_pair(np.float32, 2000, 13)
    blob = lmc.compress(x, reference=r, chunk_size=1000, prefer="fast")
    assert _modes(blob) == [6, 6]
    with pytest.raises(lmc.FormatError, match="pass the same reference"):
        lmc.decompress(blob)
    bad = r.copy()
    bad[5] = -bad[5]
    with pytest.raises(lmc.FormatError, match="wrong reference"):
        lmc.decompress(blob, reference=bad)
    with pytest.raises(ValueError):
        pyref.decode(blob)
