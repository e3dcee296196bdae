"""Sources over checkpoint folders and files built here: HF Trainer layouts, sharded and .bin weights, bf16,
globs of files, tensor-major order, selection, casting, and every error path as one clear line."""

from __future__ import annotations

import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from lmc.formats import safetensors as st_format
from lmc.formats import torchfile
from lmcbench.errors import ConfigError, SourceError
from lmcbench.sources import TensorRecord, get_source

from lmcbench_testlib import BF16, PARAM_NAMES, PARAM_SHAPES, assert_one_line_error, make_trainer_folder, to_np


def hf(path, **kw):
    return get_source({"type": "hf_trainer", "path": str(path), **kw})


def files(path, **kw):
    return get_source({"type": "files", "path": str(path), **kw})


@pytest.fixture(scope="module")
def named_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf") / "out"
    return root, make_trainer_folder(root, steps=(10, 20), named=True)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfplain") / "out"
    return root, make_trainer_folder(root, steps=(10, 20), named=False)


def check_tensor_major(entries):
    keys = [e.key for e in entries]
    groups = []
    for k in keys:
        if not groups or groups[-1] != k:
            groups.append(k)
    assert len(groups) == len(set(keys)), "the entries of a tensor are not contiguous"
    for k in set(keys):
        steps = [e.step for e in entries if e.key == k]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)


# ------------------------------------------------------------------------------------------------------------
# Hugging Face Trainer folders
# ------------------------------------------------------------------------------------------------------------

def test_hf_named_optimizer(named_run):
    root, truth = named_run
    src = hf(root)
    es = src.entries()
    assert {e.step for e in es} == {10, 20}
    assert {e.kind for e in es} == {"weight", "exp_avg", "exp_avg_sq"}
    for kind in ("weight", "exp_avg", "exp_avg_sq"):
        assert sorted(e.name for e in es if e.kind == kind and e.step == 10) == sorted(PARAM_NAMES)
    for e in es:
        assert e.dtype == np.float32 and tuple(e.shape) == PARAM_SHAPES[e.name]
        assert e.nbytes == int(np.prod(e.shape)) * 4
    check_tensor_major(es)
    # the loaded arrays equal the torch tensors
    for e in es:
        rec = src.load(e)
        assert isinstance(rec, TensorRecord) and rec.cast == ""
        if e.kind == "weight":
            t = truth[e.step]["weights"][e.name]
        else:
            slot = PARAM_NAMES.index(e.name)
            t = truth[e.step]["opt"][slot][e.kind]
        assert np.array_equal(rec.array, to_np(t)) and rec.array.dtype == np.float32
        assert rec.shape == tuple(t.shape) and rec.step == e.step and rec.kind == e.kind
    # the moments changed between steps (so each step is a real one)
    a = [src.load(e).array for e in es if e.name == "fc1.weight" and e.kind == "exp_avg"]
    assert len(a) == 2 and not np.array_equal(a[0], a[1])


def test_hf_plain_optimizer_slots_by_unique_shape(plain_run):
    root, truth = plain_run
    es = hf(root, steps=[20]).entries()
    assert "param_names" not in truth[20]["param_groups"][0]
    names = {e.name for e in es if e.kind == "exp_avg"}
    # unique shapes are named after their parameter; the three (16,) slots stay anonymous
    assert names == {"fc1.weight", "fc2.weight", "fc2.bias", "slot1", "slot2", "slot3"}
    src = hf(root, steps=[20])
    for e in es:
        if e.kind != "weight":
            slot = int(e.name[4:]) if e.name.startswith("slot") else PARAM_NAMES.index(e.name)
            assert np.array_equal(src.load(e).array, to_np(truth[20]["opt"][slot][e.kind]))


def test_hf_skips_other_files_and_never_unpickles(named_run, tmp_path, monkeypatch):
    root, _ = named_run
    marker = tmp_path / "UNPICKLED"
    run = tmp_path / "out"
    make_trainer_folder(run, steps=(10,), marker=marker)
    opened = []
    real = torchfile.torch_load  # every PyTorch file any reader opens goes through it
    monkeypatch.setattr(torchfile, "torch_load", lambda p: (opened.append(Path(p).name), real(p))[1])
    src = hf(run)
    for e in src.entries():
        src.load(e)
    assert not marker.exists(), "training_args.bin was unpickled"
    assert set(opened) == {"optimizer.pt"}
    # the pickle is real: unpickling it would have run code
    with open(run / "checkpoint-10" / "training_args.bin", "rb") as f:
        pickle.load(f)
    assert marker.exists()


def test_hf_selection(named_run):
    root, _ = named_run
    es = hf(root, steps=[20]).entries()
    assert {e.step for e in es} == {20}
    es = hf(root, include=r"^fc2\.").entries()
    assert {e.name for e in es} == {"fc2.weight", "fc2.bias"} and len(es) == 2 * 2 * 3
    es = hf(root, exclude="fc").entries()
    assert {e.name for e in es} == {"norm.weight", "norm.bias"}
    es = hf(root, kinds=["weight"]).entries()
    assert {e.kind for e in es} == {"weight"} and len(es) == 2 * len(PARAM_NAMES)
    es = hf(root, kinds=["exp_avg_sq"], steps=[10]).entries()
    assert {e.kind for e in es} == {"exp_avg_sq"} and len(es) == len(PARAM_NAMES)
    with pytest.raises(SourceError) as ei:
        hf(root, include="nothing-matches-this").entries()
    assert_one_line_error(ei, "matches no tensor")


def test_hf_single_checkpoint_folder(named_run):
    root, _ = named_run
    es = hf(root / "checkpoint-20").entries()
    assert {e.step for e in es} == {20} and len(es) == 3 * len(PARAM_NAMES)


def test_hf_cast_bf16(named_run):
    root, truth = named_run
    src = hf(root, cast="bf16", kinds=["weight"], steps=[10])
    e = next(e for e in src.entries() if e.name == "fc1.weight")
    rec = src.load(e)
    assert rec.dtype == BF16 and rec.array.dtype == BF16
    assert rec.cast == "float32->bfloat16"
    assert np.array_equal(rec.array, to_np(truth[10]["weights"]["fc1.weight"]).astype(BF16))
    src = hf(root, cast="float32->float16", kinds=["weight"], steps=[10])
    rec = src.load(src.entries()[0])
    assert rec.array.dtype == np.float16 and rec.cast == "float32->float16"


def test_cast_list_gives_one_series_per_dtype(named_run):
    root, truth = named_run
    src = hf(root, cast=[None, "bf16"], kinds=["weight"], include=r"^fc1\.weight$")
    es = src.entries()
    # tensor-major per variant: the fp32 series, then its bf16 cast, each over both steps
    assert [(e.step, e.cast is None) for e in es] == [(10, True), (20, True), (10, False), (20, False)]
    recs = [src.load(e) for e in es]
    assert [r.array.dtype for r in recs] == [np.float32, np.float32, BF16, BF16]
    assert [r.cast for r in recs] == ["", "", "float32->bfloat16", "float32->bfloat16"]
    assert np.array_equal(recs[3].array, to_np(truth[20]["weights"]["fc1.weight"]).astype(BF16))
    assert len({e.key for e in es}) == 2


@pytest.mark.parametrize("casts", [[None, "bf16"], ["bf16"], ["bf16", "fp16"]])
def test_cast_kinds_cast_only_the_named_kinds(named_run, casts):
    root, _ = named_run
    src = hf(root, cast=casts, cast_kinds=["weight"], include=r"^fc1\.weight$", steps=[10])
    got = sorted((e.kind, "" if e.cast is None else str(e.cast[1])) for e in src.entries())
    want_w = [("weight", "" if c is None else str(hf(root, cast=c).casts[0][1])) for c in casts]
    # the moments once, as they are; the weights once per entry of the cast list
    assert got == sorted(want_w + [("exp_avg", ""), ("exp_avg_sq", "")])
    with pytest.raises(ConfigError, match="cast_kinds"):
        hf(root, cast="bf16", cast_kinds=["weights"])


def test_bad_selection_options(named_run):
    root, _ = named_run
    with pytest.raises(ConfigError, match="weights"):
        hf(root, kinds=["weights"])
    with pytest.raises(ConfigError, match="include"):
        hf(root, include="(")
    with pytest.raises(ConfigError, match="bogus"):
        hf(root, bogus=1)
    with pytest.raises(ConfigError, match="bf17"):
        hf(root, cast="bf17")
    with pytest.raises(ConfigError, match="nope"):
        get_source({"type": "nope"})


def test_hf_sharded_safetensors(tmp_path):
    truth = make_trainer_folder(tmp_path / "out", steps=(10,), weights="sharded")
    d = tmp_path / "out" / "checkpoint-10"
    assert (d / "model-00001-of-00002.safetensors").exists() and not (d / "model.safetensors").exists()
    src = hf(tmp_path / "out")
    ws = [e for e in src.entries() if e.kind == "weight"]
    assert sorted(e.name for e in ws) == sorted(PARAM_NAMES)
    assert {Path(e.file).name for e in ws} == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    for e in ws:
        assert np.array_equal(src.load(e).array, to_np(truth[10]["weights"][e.name]))
    assert {e.name for e in src.entries() if e.kind == "exp_avg"} == set(PARAM_NAMES)


def test_hf_pytorch_model_bin(tmp_path):
    truth = make_trainer_folder(tmp_path / "out", steps=(10, 20), weights="bin", named=False)
    src = hf(tmp_path / "out")
    es = src.entries()
    # a single param group: the registration order of the .bin names every slot
    assert {e.name for e in es if e.kind == "exp_avg"} == set(PARAM_NAMES)
    for e in es:
        t = truth[e.step]["weights"][e.name] if e.kind == "weight" else truth[e.step]["opt"][PARAM_NAMES.index(e.name)][e.kind]
        assert np.array_equal(src.load(e).array, to_np(t))
    check_tensor_major(es)


def test_hf_bf16_checkpoint(tmp_path):
    truth = make_trainer_folder(tmp_path / "out", steps=(10,), bf16=True)
    src = hf(tmp_path / "out", kinds=["weight"])
    es = src.entries()
    assert es and all(e.dtype == BF16 for e in es)
    for e in es:
        a = src.load(e).array
        t = truth[10]["weights"][e.name]
        assert a.dtype == BF16
        assert np.array_equal(a.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))


def test_hf_bf16_with_nan_payloads_bits_preserved(tmp_path):
    from safetensors.torch import save_file

    bits = np.array([0x7FC1, 0xFF81, 0x7F80, 0x0001, 0x8000, 0x3F80], np.uint16)
    d = tmp_path / "out" / "checkpoint-5"
    d.mkdir(parents=True)
    save_file({"w": torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)}, str(d / "model.safetensors"))
    src = hf(tmp_path / "out")
    (e,) = src.entries()
    assert np.array_equal(src.load(e).array.view(np.uint16), bits)


# ------------------------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture()
def files_dir(tmp_path, named_run):
    from safetensors.torch import save_file

    _, truth = named_run
    d = tmp_path / "ck"
    d.mkdir()
    w10, w20 = truth[10]["weights"], truth[20]["weights"]
    save_file(w10, str(d / "run7_step100.safetensors"))
    torch.save(w20, d / "run7_step200.pt")
    save_file({k: v * 2 for k, v in w20.items()}, str(d / "run7_step300.safetensors"))
    return d, {100: {k: to_np(v) for k, v in w10.items()}, 200: {k: to_np(v) for k, v in w20.items()},
               300: {k: to_np(v) * 2 for k, v in w20.items()}}




def test_files_npz(tmp_path):
    arrs = {"fc1.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "layer.exp_avg": np.zeros(3, np.float16),
            "layer.exp_avg_sq": np.ones(3, np.float32), "emb": np.arange(5, dtype=np.int8)}
    np.savez(tmp_path / "ck_step300.npz", **arrs)
    np.savez(tmp_path / "ck_step400.npz", **{k: v + 1 for k, v in arrs.items()})
    src = files(tmp_path / "ck_step*.npz")
    es = src.entries()
    assert {e.step for e in es} == {300, 400}
    assert {e.name: e.kind for e in es} == {"fc1.weight": "weight", "layer.exp_avg": "exp_avg",
                                            "layer.exp_avg_sq": "exp_avg_sq", "emb": "weight"}
    for e in es:
        want = arrs[e.name] + (1 if e.step == 400 else 0)
        rec = src.load(e)
        assert rec.array.dtype == want.dtype and np.array_equal(rec.array, want.astype(want.dtype))


def test_files_default_and_custom_step_regex(files_dir):
    d, truth = files_dir
    src = files(d / "run7_step*")
    es = src.entries()
    assert {e.step for e in es} == {100, 200, 300}  # the last number in the name
    assert {e.kind for e in es} == {"weight"} and {e.name for e in es} == set(PARAM_NAMES)
    check_tensor_major(es)
    for e in es:
        rec = src.load(e)
        assert np.array_equal(rec.array, truth[e.step][e.name]) and rec.array.dtype == np.float32
    es = files(d / "*.safetensors", step_regex=r"step(\d+)", steps=[100], include="fc1").entries()
    assert {e.name for e in es} == {"fc1.weight", "fc1.bias"} and {e.step for e in es} == {100}
    shutil.copy(d / "run7_step100.safetensors", d / "run8_step100.safetensors")
    es = files(d / "run*_step100.safetensors", step_regex=r"run(\d+)_").entries()
    assert {e.step for e in es} == {7, 8}
    check_tensor_major(es)
    with pytest.raises(SourceError) as ei:  # two files for the same step
        files(d / "*.safetensors", step_regex=r"step(\d+)").entries()
    assert_one_line_error(ei, "appears twice")


def test_files_optimizer_and_moments(tmp_path, named_run):
    root, truth = named_run
    shutil.copy(root / "checkpoint-10" / "optimizer.pt", tmp_path / "optim_10.pt")
    shutil.copy(root / "checkpoint-20" / "optimizer.pt", tmp_path / "optim_20.pt")
    src = files(tmp_path / "optim_*.pt")
    es = src.entries()
    assert {e.kind for e in es} == {"exp_avg", "exp_avg_sq"}
    assert {e.name for e in es} == set(PARAM_NAMES)  # param_names in the groups
    for e in es:
        assert np.array_equal(src.load(e).array, to_np(truth[e.step]["opt"][PARAM_NAMES.index(e.name)][e.kind]))
    from safetensors.numpy import save_file

    save_file({"layer.exp_avg_sq": np.ones(3, np.float32), "layer.exp_avg": np.zeros(3),
               "layer.w": np.ones(2, np.int8)}, str(tmp_path / "m_5.safetensors"))
    kinds = {e.name: e.kind for e in files(tmp_path / "m_5.safetensors").entries()}
    assert kinds == {"layer.exp_avg_sq": "exp_avg_sq", "layer.exp_avg": "exp_avg", "layer.w": "weight"}


def test_files_errors(tmp_path):
    with pytest.raises(SourceError) as ei:
        files(tmp_path / "nothing*.safetensors").entries()
    assert_one_line_error(ei, "nothing", "no files match")
    (tmp_path / "weights.safetensors").write_bytes(b"x" * 16)
    with pytest.raises(SourceError) as ei:
        files(tmp_path / "weights.safetensors").entries()
    assert_one_line_error(ei, "weights.safetensors", "no step")
    (tmp_path / "s1.txt").write_text("hello")
    with pytest.raises(SourceError) as ei:
        files(tmp_path / "s1.txt").entries()
    assert_one_line_error(ei, "s1.txt", "unknown checkpoint format")
    with pytest.raises(ConfigError):
        files(tmp_path / "*", step_regex="(")


# ------------------------------------------------------------------------------------------------------------
# error paths: one line naming the file
# ------------------------------------------------------------------------------------------------------------

def one_step_folder(tmp_path, named_run):
    root, _ = named_run
    out = tmp_path / "out"
    shutil.copytree(root / "checkpoint-10", out / "checkpoint-10")
    return out, out / "checkpoint-10"


def test_missing_folder(tmp_path):
    with pytest.raises(SourceError) as ei:
        hf(tmp_path / "nope").entries()
    assert_one_line_error(ei, tmp_path / "nope", "no such folder")


def test_folder_without_checkpoints(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError) as ei:
        hf(tmp_path / "empty").entries()
    assert_one_line_error(ei, "empty", "checkpoint-")


def test_missing_file(tmp_path):
    with pytest.raises(SourceError) as ei:
        st_format.safetensors_index(str(tmp_path / "step1.safetensors"))
    assert_one_line_error(ei, "step1.safetensors", "no such file")
    with pytest.raises(SourceError) as ei:
        torchfile.torch_load(str(tmp_path / "step1.pt"))
    assert_one_line_error(ei, "step1.pt", "no such file")


def test_checkpoint_without_weights(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    (d / "model.safetensors").unlink()
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, d, "no model weights")


@pytest.mark.parametrize("which", ["model.safetensors", "optimizer.pt"])
def test_empty_file(tmp_path, named_run, which):
    out, d = one_step_folder(tmp_path, named_run)
    (d / which).write_bytes(b"")
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, d / which, "empty file")


def test_truncated_safetensors(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    p = d / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 100])
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, p, "truncated")
    p.write_bytes(data[:5])
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, p)
    p.write_bytes(data[:200])  # header cut
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, p, "not a safetensors file")


@pytest.mark.parametrize("header", [b"\xff\xfe garbage not json", b'["a list"]', b'{"w": {"dtype": "F32"}}',
                                    b'{"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}',
                                    b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}'])
def test_safetensors_garbage_header(tmp_path, header):
    p = tmp_path / "step3.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(SourceError) as ei:
        files(p).entries()
    assert_one_line_error(ei, p)


PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489") + b"\0" * 64


@pytest.mark.parametrize("content", [PNG, b"just some text, not a checkpoint\n" * 10], ids=["png", "text"])
@pytest.mark.parametrize("name", ["step4.safetensors", "step4.pt", "step4.npz"])
def test_foreign_files(tmp_path, content, name):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(SourceError) as ei:
        files(p).entries()
    assert_one_line_error(ei, p)


def test_foreign_file_as_optimizer(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    (d / "optimizer.pt").write_bytes(PNG)
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, d / "optimizer.pt")


def test_truncated_optimizer(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    p = d / "optimizer.pt"
    data = p.read_bytes()
    for cut in (len(data) // 2, len(data) - 30, 40):
        p.write_bytes(data[:cut])
        with pytest.raises(SourceError) as ei:
            hf(out).entries()
        assert_one_line_error(ei, p)


def test_optimizer_not_a_state_dict(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    torch.save({"foo": torch.zeros(2)}, d / "optimizer.pt")
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, d / "optimizer.pt", "optimizer")


class CustomThing:
    """A class defined in the test module: loading it needs arbitrary unpickling."""

    def __init__(self):
        self.t = torch.zeros(3)


class Exploding:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_arbitrary_unpickling_refused(tmp_path):
    marker = tmp_path / "RAN"
    cases = {}
    torch.save(CustomThing(), tmp_path / "s1.pt")
    torch.save({"w": torch.zeros(2), "obj": Exploding(str(marker))}, tmp_path / "s2.pt")
    with open(tmp_path / "s3.pt", "wb") as f:
        pickle.dump(Exploding(str(marker)), f)
    with open(tmp_path / "s4.pt", "wb") as f:
        pickle.dump(CustomThing(), f)
    for p in sorted(tmp_path.glob("s*.pt")):
        with pytest.raises(SourceError) as ei:
            files(p).entries()
        cases[p.name] = assert_one_line_error(ei, p)
        assert "arbitrary unpickling" in cases[p.name] and "refused" in cases[p.name], cases[p.name]
    assert not marker.exists(), "a pickle was executed"


def test_pt_that_is_not_a_dict(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "s5.pt")
    with pytest.raises(SourceError) as ei:
        files(tmp_path / "s5.pt").entries()
    assert_one_line_error(ei, "s5.pt", "state dict")


def test_bad_shard_index(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, "model.safetensors.index.json")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../../etc/x.safetensors"}}')
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, "outside")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(SourceError) as ei:
        hf(out).entries()
    assert_one_line_error(ei, "model-00001-of-00002.safetensors", "no such file")


def test_file_changed_after_indexing(tmp_path, named_run):
    out, d = one_step_folder(tmp_path, named_run)
    src = hf(out, kinds=["weight"])
    es = src.entries()
    (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(SourceError) as ei:
        src.load(es[0])
    assert_one_line_error(ei, d / "model.safetensors")


def test_steps_selection_that_does_not_exist(named_run):
    root, _ = named_run
    with pytest.raises(SourceError) as ei:
        hf(root, steps=[10, 99]).entries()
    assert_one_line_error(ei, "99", "not found")


@pytest.mark.parametrize("steps", [[99], [10, 99]])
def test_missing_step_message_lists_available_steps(named_run, steps):
    root, _ = named_run
    with pytest.raises(SourceError) as ei:
        hf(root, steps=steps).entries()
    assert_one_line_error(ei, "99", "not found", "available: [10, 20]")
