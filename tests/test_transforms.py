"""Transforms and pipelines: bit-exact inverses over every dtype, never touching their inputs."""

from __future__ import annotations

import numpy as np
import pytest

from lmcbench.errors import ConfigError
from lmcbench.transforms import ByteGroup, Delta, ExpSplit, Pipeline, Stream, get_transform

from lmcbench_testlib import BF16, DTYPES, LENGTHS, pipeline_configs, random_bits, same_bits

PIPELINES = pipeline_configs()


def test_pipeline_configs_found():
    assert {"raw", "bytegroup", "expsplit", "delta", "delta_bytegroup", "delta_expsplit"} <= set(PIPELINES)


@pytest.mark.parametrize("pname", sorted(PIPELINES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("with_ref", [False, True], ids=["noref", "ref"])
def test_pipeline_roundtrip(pname, dtype, n, with_ref):
    pipe = Pipeline.from_config(pname, PIPELINES[pname])
    x = random_bits(n, dtype, seed=1)
    ref = random_bits(n, dtype, seed=2) if with_ref else None
    x0, r0 = x.copy(), None if ref is None else ref.copy()
    streams = pipe.encode(x, ref)
    for s in streams:
        assert isinstance(s, Stream)
        assert s.data.flags.c_contiguous
        assert s.data.dtype.kind == "u"
        assert s.data.ndim in (1, 2) and (s.data.ndim == 1 or s.data.dtype == np.uint8)
        assert s.as_bytes().dtype == np.uint8 and s.as_bytes().nbytes == s.nbytes
        if s.typed is not None:
            assert s.as_typed().dtype == s.typed
    # delta and byte-grouping keep the size; the exponent split packs fp16 into 1 + 2 bytes
    expected = 3 * n if ("expsplit" in pname and dtype == np.float16) else x.nbytes
    assert sum(s.nbytes for s in streams) == expected
    y = pipe.decode(streams, ref, dtype, x.shape)
    assert same_bits(y, x0)
    assert same_bits(x, x0), "encode/decode modified the tensor"
    if ref is not None:
        assert same_bits(ref, r0), "encode/decode modified the reference"


@pytest.mark.parametrize("pname", sorted(PIPELINES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pipeline_readonly_and_2d_inputs(pname, dtype):
    pipe = Pipeline.from_config(pname, PIPELINES[pname])
    x = random_bits(6 * 7, dtype, seed=3).reshape(6, 7)
    ref = random_bits(6 * 7, dtype, seed=4).reshape(6, 7)
    x0, r0 = x.copy(), ref.copy()
    x.flags.writeable = False
    ref.flags.writeable = False
    y = pipe.decode(pipe.encode(x, ref), ref, dtype, x.shape)
    assert same_bits(y, x0) and same_bits(x, x0) and same_bits(ref, r0)


@pytest.mark.parametrize("pname", sorted(PIPELINES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_ref", [False, True], ids=["noref", "ref"])
def test_every_transform_undoes_itself(pname, dtype, with_ref):
    """Each transform on its own: decode(encode(streams)) gives back the streams it was given, name, element
    type, shape and bits, with nothing else than the reference and the dtype (no record of the encoding)."""
    pipe = Pipeline.from_config(pname, PIPELINES[pname])
    x = random_bits(1001, dtype, seed=7)
    ref = random_bits(1001, dtype, seed=8) if with_ref else None
    streams = [Stream("raw", x.view(f"<u{x.itemsize}"), np.dtype(dtype))]
    for t in pipe.transforms:
        out = t.encode(streams, ref, dtype)
        back = t.decode([Stream(s.name, s.data.copy(), s.typed) for s in out], ref, dtype)
        assert [(s.name, s.data.dtype, s.data.shape) for s in back] == \
            [(s.name, s.data.dtype, s.data.shape) for s in streams], t.label
        assert all(np.array_equal(a.data, b.data) for a, b in zip(back, streams)), t.label
        streams = out


def test_temporal_is_one_property_of_the_pipeline():
    """A pipeline is temporal exactly when one of its transforms takes the reference, delta or reference, and
    its lag is that transform's."""
    for name, steps in PIPELINES.items():
        pipe = Pipeline.from_config(name, steps)
        ids = {s["id"] for s in steps or []}
        assert pipe.temporal == bool(ids & {"delta", "reference"}), name
        assert (pipe.temporal_transform is not None) == pipe.temporal and pipe.lag == (1 if pipe.temporal else 0)
    assert Pipeline.from_config("r", [{"id": "reference", "lag": 4}]).lag == 4
    assert Pipeline.from_config("d", [{"id": "delta", "mode": "sub", "lag": 2}, {"id": "bytegroup"}]).lag == 2
    assert Pipeline.from_config("r", [{"id": "reference"}]).temporal


def test_raw_pipeline_stream_holds_the_tensor_bits():
    x = random_bits(100, np.float32)
    (s,) = Pipeline("raw", []).encode(x)
    assert s.typed == np.float32 and s.name == "raw" and s.data.dtype == np.uint32
    assert same_bits(s.as_typed(), x) and s.nbytes == x.nbytes


def test_delta_without_reference_is_identity_and_with_reference_is_xor():
    x = random_bits(64, BF16, seed=5)
    r = random_bits(64, BF16, seed=6)
    pipe = Pipeline.from_config("d", [{"id": "delta", "mode": "xor"}])
    (s,) = pipe.encode(x, None)
    assert s.as_typed().tobytes() == x.tobytes()
    (s,) = pipe.encode(x, r)
    assert np.array_equal(s.data, x.view(np.uint16) ^ r.view(np.uint16))
    assert s.typed == BF16  # dtype-aware codecs still see bf16 after a delta
    pipe = Pipeline.from_config("ds", [{"id": "delta", "mode": "sub"}])
    (s,) = pipe.encode(x, r)
    assert np.array_equal(s.data, (x.view(np.uint16) - r.view(np.uint16)).astype(np.uint16))


def test_delta_reference_mismatch_is_an_error():
    pipe = Pipeline.from_config("d", [{"id": "delta"}])
    with pytest.raises(ValueError, match="reference"):
        pipe.encode(random_bits(8, np.float32), random_bits(9, np.float32))
    with pytest.raises(ValueError, match="reference"):
        pipe.encode(random_bits(8, np.float32), random_bits(8, np.float16))


@pytest.mark.parametrize("dtype,widths", [(np.float32, [1, 1, 1, 1]), (np.float16, [1, 1]), (BF16, [1, 1]),
                                          (np.int8, [1])], ids=str)
def test_bytegroup_planes(dtype, widths):
    x = random_bits(10, dtype)
    streams = Pipeline("bg", [ByteGroup()]).encode(x)
    assert len(streams) == len(widths)
    b = x.view(np.uint8).reshape(10, np.dtype(dtype).itemsize)
    for j, s in enumerate(streams):
        assert s.data.dtype == np.uint8 and s.typed is None
        assert np.array_equal(s.data, b[:, j])
    if len(widths) > 1:
        assert [s.name for s in streams] == [f"b{j}" for j in range(len(widths))]


@pytest.mark.parametrize("dtype,exp_bits,sizes", [(np.float32, 8, (1, 3)), (np.float16, 5, (1, 2)), (BF16, 8, (1, 1))],
                         ids=str)
def test_expsplit_streams(dtype, exp_bits, sizes):
    x = random_bits(33, dtype)
    streams = Pipeline("es", [ExpSplit()]).encode(x)
    assert [s.name for s in streams] == ["exp", "sm"]
    assert [s.nbytes // 33 for s in streams] == list(sizes)
    width = np.dtype(dtype).itemsize * 8
    u = x.view(f"<u{width // 8}").astype(np.uint64)
    mbits = width - 1 - exp_bits
    assert np.array_equal(streams[0].data.reshape(33, -1)[:, 0], ((u >> mbits) & ((1 << exp_bits) - 1)).astype(np.uint8))


def test_expsplit_on_int_is_bytegroup():
    x = random_bits(20, np.int8)
    a = Pipeline("es", [ExpSplit()]).encode(x)
    b = Pipeline("bg", [ByteGroup()]).encode(x)
    assert [s.data.tobytes() for s in a] == [s.data.tobytes() for s in b]


@pytest.mark.parametrize("steps", [
    [{"id": "bytegroup"}, {"id": "delta"}],
    [{"id": "expsplit"}, {"id": "delta"}],
    [{"id": "bytegroup"}, {"id": "expsplit"}],
    [{"id": "nope"}],
    [{"id": "delta", "mode": "add"}],
    [{"id": "delta", "bogus": 1}],
    [{"mode": "xor"}],
])
def test_invalid_pipelines(steps):
    with pytest.raises(ConfigError):
        Pipeline.from_config("bad", steps)


def test_transform_configs_roundtrip():
    for cfg in ({"id": "delta", "mode": "xor"}, {"id": "delta", "mode": "sub"}, {"id": "bytegroup"},
                {"id": "expsplit"}):
        t = get_transform(cfg)
        assert t.get_config() == cfg
        assert get_transform(t.get_config()).get_config() == cfg
    assert Delta("sub").label == "delta_sub" and Delta().label == "delta"
    for name, steps in PIPELINES.items():
        assert Pipeline.from_config(name, steps).get_config() == (steps or [])


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.binary(min_size=0, max_size=64), refdata=st.binary(min_size=64, max_size=64),
       dtype=st.sampled_from(DTYPES), pname=st.sampled_from(sorted(PIPELINES)))
def test_pipeline_roundtrip_property(data, refdata, dtype, pname):
    w = np.dtype(dtype).itemsize
    n = len(data) // w
    x = np.frombuffer(data[: n * w], np.uint8).view(dtype)
    ref = np.frombuffer(refdata[: n * w], np.uint8).view(dtype)
    pipe = Pipeline.from_config(pname, PIPELINES[pname])
    assert same_bits(pipe.decode(pipe.encode(x, ref), ref, dtype, x.shape), x)
