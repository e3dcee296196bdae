"""lmc.dcp in one process (no process group): dcp.save / dcp.load / dcp.async_save round trips, bit-exact for
every dtype, reference checkpoints (smaller, chained, moved, missing, wrong), keyframes, interrupted saves, and
corrupt or hostile files each failing with a clear error."""
import json
import os
import re
import shutil
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402
from torch.utils._pytree import tree_map_only  # noqa: E402

import lmc  # noqa: E402
from helpers import assert_same  # noqa: E402
from lmc.dcp import METADATA_FILE, LMCStorageReader, LMCStorageWriter, is_lmc_checkpoint  # noqa: E402

ERRORS = (Exception, CheckpointException)  # DCP wraps a rank's error in a BaseException
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def train_state(seed=0, steps=2):
    """A model's and its AdamW optimizer's state (get_state_dict: FQN-keyed) after ``steps`` steps."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.LayerNorm(96), torch.nn.Linear(96, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(16, 64)

    def step():
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()

    for _ in range(steps):
        step()
    return m, opt, step


def snapshot(m, opt, extra=None):
    msd, osd = get_state_dict(m, opt)
    sd = {"model": msd, "optim": osd, **(extra or {})}
    return clone(sd)


def clone(obj):
    """obj with every tensor in it copied."""
    return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), obj)


def blank(obj):
    """The same structure with every tensor zeroed (and other leaves kept), to load into."""
    return tree_map_only(torch.Tensor, torch.zeros_like, obj)


def save(sd, path, **kw):
    """A save, and (the default, background=None, in one process: the reference re-coded behind it) the wait
    for its re-coding, so that both folders are what a foreground save leaves."""
    dcp.save(sd, storage_writer=LMCStorageWriter(path, **kw))
    lmc.dcp.wait()


def load(sd, path):
    out = blank(sd)
    dcp.load(out, storage_reader=LMCStorageReader(path))
    return out


def save_series(root, n, max_chain, after_save=None):
    """Checkpoints step-1..step-n of a training run, each saved with the one before as its reference."""
    m, opt, step = train_state()
    states = {}
    for i in range(1, n + 1):
        states[i] = snapshot(m, opt)
        save(states[i], root / f"step-{i}", reference=root / f"step-{i - 1}" if i > 1 else None, max_chain=max_chain)
        if after_save is not None:
            after_save(i, states)
        step()
    return states


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def data_files(path):
    """The LMC data files in a checkpoint folder (one per worker thread that wrote)."""
    return sorted(n for n in os.listdir(path) if re.fullmatch(r"__\d+_\d+\.lmc", n))


def listing(path):
    """A checkpoint folder's names with its data files as one ``DATA`` entry, after checking that the items
    name exactly those files."""
    files = data_files(path)
    assert files and {i["file"] for i in meta(path)["items"]} == set(files), (files, path)
    return sorted([n for n in os.listdir(path) if n not in files] + ["DATA"])


def meta(path):
    with open(os.path.join(path, METADATA_FILE)) as f:
        return json.load(f)


def every_dtype():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 50, generator=g)
    t = {
        "f32": base, "bf16": base.bfloat16(), "f16": base.half(), "f64": base.double(),
        "i64": torch.randint(-9, 9, (40,), generator=g), "i32": torch.randint(-9, 9, (5, 4), generator=g).int(),
        "i8": torch.randint(-9, 9, (33,), generator=g).to(torch.int8), "u8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.rand(17, generator=g) > 0.5, "c64": torch.randn(6, generator=g, dtype=torch.complex64),
        "c128": torch.randn(5, generator=g, dtype=torch.complex128),  # not an lmc dtype: stored raw/zlib
        "f8": base.to(torch.float8_e4m3fn), "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]).bfloat16(),
        "view": base.t()[::2],  # a non-contiguous view: only the view is stored
    }
    return {"t": t, "meta": {"step": 7, "name": "run42", "lrs": [0.1, 0.2]}}


def test_every_dtype_round_trip(tmp_path):
    sd = every_dtype()
    save(sd, tmp_path / "c")
    assert is_lmc_checkpoint(tmp_path / "c") and not is_lmc_checkpoint(tmp_path)
    assert listing(tmp_path / "c") == [".metadata", "DATA", METADATA_FILE]
    assert 1 <= len(data_files(tmp_path / "c")) <= (os.cpu_count() or 1)  # at most one per worker thread
    got = load(sd, tmp_path / "c")
    assert_same(sd, got)
    items = {i["fqn"]: i for i in meta(tmp_path / "c")["items"]}
    assert items["t.bf16"]["codec"] == "lmc" and items["t.bf16"]["dtype"] == "bfloat16"
    assert items["t.c128"]["codec"] in ("raw", "zlib")
    assert items["meta.name"]["dtype"] is None and items["meta.name"]["codec"] in ("raw", "zlib")


def test_training_state_and_reference(tmp_path):
    m, opt, step = train_state()
    s1 = snapshot(m, opt, {"bf16": m[0].weight.detach().bfloat16()})
    save(s1, tmp_path / "step-1")
    save(s1, tmp_path / "key-1")
    step()
    s2 = snapshot(m, opt, {"bf16": m[0].weight.detach().bfloat16()})
    save(s2, tmp_path / "step-2", reference=tmp_path / "step-1")
    assert "optim.state.0.weight.exp_avg" in meta(tmp_path / "step-2")["state_dict_metadata"]
    # the new checkpoint is coded alone (loading the latest costs a keyframe's decode); the previous one is
    # re-coded against it: smaller than the same state coded alone, same save id, same contents
    md2, md1 = meta(tmp_path / "step-2"), meta(tmp_path / "step-1")
    assert md2["reference"] is None and not any(i["ref"] for i in md2["items"]) and md2["group"] == 2
    assert md1["reference"]["path"] == "../step-2" and md1["reference"]["save_id"] == md2["save_id"]
    assert md1["save_id"] == meta(tmp_path / "step-1")["save_id"] and any(i["ref"] for i in md1["items"])
    assert folder_bytes(tmp_path / "step-1") < folder_bytes(tmp_path / "key-1")
    # its items now live in one new data file (the files it had when coded alone are gone)
    assert listing(tmp_path / "step-1") == [".metadata", "DATA", "lmc-metadata.json"]
    assert len(data_files(tmp_path / "step-1")) == 1
    assert_same(s2, load(s2, tmp_path / "step-2"))
    assert_same(s1, load(s1, tmp_path / "step-1"))
    # a chain: step 1 against step 2 against step 3, moved elsewhere as a whole (the relative path is used)
    step()
    s3 = snapshot(m, opt, {"bf16": m[0].weight.detach().bfloat16()})
    save(s3, tmp_path / "step-3", reference=tmp_path / "step-2")
    save(s3, tmp_path / "key-3")
    moved = tmp_path / "moved"
    moved.mkdir()
    for n in ("step-1", "step-2", "step-3"):
        shutil.move(str(tmp_path / n), str(moved / n))
    assert_same(s1, load(s1, moved / "step-1"))
    # a wrong reference in its place (another save of the same state): detected by save id
    shutil.rmtree(moved / "step-3")
    shutil.copytree(tmp_path / "key-3", moved / "step-3")
    with pytest.raises(ERRORS, match="wrong reference checkpoint"):
        load(s2, moved / "step-2")
    # the reference is missing: a clear error, not wrong data
    shutil.rmtree(moved / "step-3")
    with pytest.raises(ERRORS, match="reference checkpoint .* is missing"):
        load(s1, moved / "step-1")


def test_rm_rf_of_the_oldest_keeps_every_newer_checkpoint(tmp_path):
    """What keep_latest_k and save_total_limit do: delete the oldest folders with a plain rm -rf."""
    def after_save(i, states):
        if i > 2:
            shutil.rmtree(tmp_path / f"step-{i - 2}")  # keep the latest two
        for j in (i - 1, i):
            if j >= 1 and (tmp_path / f"step-{j}").exists():
                assert_same(states[j], load(states[j], tmp_path / f"step-{j}"))

    save_series(tmp_path, 7, max_chain=3, after_save=after_save)
    assert sorted(os.listdir(tmp_path)) == ["step-6", "step-7"]
    assert meta(tmp_path / "step-7")["reference"] is None


def test_overwriting_a_folder_another_checkpoint_depends_on_is_refused(tmp_path):
    m, opt, step = train_state()
    s1 = snapshot(m, opt)
    save(s1, tmp_path / "A")
    step()
    s2 = snapshot(m, opt)
    save(s2, tmp_path / "B", reference=tmp_path / "A")  # A now depends on B
    step()
    s3 = snapshot(m, opt)
    with pytest.raises(ERRORS, match="is the reference of .*A"):
        save(s3, tmp_path / "B", reference=tmp_path / "A")
    assert_same(s1, load(s1, tmp_path / "A"))
    assert_same(s2, load(s2, tmp_path / "B"))
    # ping-pong the other way round is fine: A depends on B, nothing on A
    save(s3, tmp_path / "A", reference=tmp_path / "B")
    assert_same(s3, load(s3, tmp_path / "A"))
    assert_same(s2, load(s2, tmp_path / "B"))


def test_save_over_a_plain_dcp_checkpoint_removes_its_metadata(tmp_path):
    m, opt, _ = train_state()
    s1 = snapshot(m, opt)
    dcp.save(s1, storage_writer=dcp.FileSystemWriter(str(tmp_path / "c")))
    assert (tmp_path / "c" / ".metadata").exists()
    save(s1, tmp_path / "c")
    assert listing(tmp_path / "c") == [".metadata", "DATA", "lmc-metadata.json"]
    assert (tmp_path / "c" / ".metadata").stat().st_size < 1000  # the signpost, not the old metadata


def test_a_plain_dcp_reader_is_told_which_reader_to_use(tmp_path):
    """dcp.load(checkpoint_id=...) picks FileSystemReader, which unpickles ".metadata": an LMC folder's says in one
    line to use LMCStorageReader (so does dcp_to_torch_save), and the folder still loads with it."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    m, opt, _ = train_state()
    s1 = snapshot(m, opt)
    save(s1, tmp_path / "c")
    for attempt in (lambda: dcp.load(blank(s1), checkpoint_id=str(tmp_path / "c")),
                    lambda: dcp_to_torch_save(str(tmp_path / "c"), str(tmp_path / "out.pt"))):
        with pytest.raises((ValueError, CheckpointException)) as e:
            attempt()
        assert re.search(r"LMC DCP checkpoint folder: load it with .*LMCStorageReader", str(e.value))
    assert not (tmp_path / "out.pt").exists()
    assert_same(s1, load(s1, tmp_path / "c"))


_PLAIN_LOAD_CHILD = """
import sys, torch, torch.distributed.checkpoint as dcp
dcp.load({"w": torch.zeros(3, 4)}, checkpoint_id=sys.argv[1])
"""


def test_plain_dcp_load_shows_the_hint_first(tmp_path):
    """A plain dcp.load of an LMC folder, uncaught, in a fresh process: the hint is the first thing it prints
    (after torch's own one-process warning), with no logged tracebacks of DCP's metadata fallbacks, and the
    exception's last line is the hint too."""
    import subprocess
    import sys

    save({"w": torch.randn(3, 4)}, tmp_path / "c")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(lmc.__file__))),
                                         env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _PLAIN_LOAD_CHILD, str(tmp_path / "c")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "torch.distributed is disabled" not in ln
             and ln.strip() != "return func(*args, **kwargs)"]  # torch's own warning and its source line
    hint = "lmc.dcp: this is an LMC DCP checkpoint folder: load it with"
    assert lines and lines[0].startswith(hint), r.stderr
    assert lines[-1].startswith("lmc.dcp.PlainDCPLoadError: " + hint), r.stderr
    assert "metadata is not found" not in r.stderr and "__0.metadata" not in r.stderr, r.stderr
    assert r.stderr.count("Traceback (most recent call last)") == 2, r.stderr  # the uncaught one, and rank 0's
    assert len(lines) < 40, r.stderr


def test_chunks_must_cover_the_tensor(tmp_path):
    import json
    m, opt, _ = train_state()
    s1 = snapshot(m, opt)
    save(s1, tmp_path / "c")
    p = tmp_path / "c" / "lmc-metadata.json"
    doc = json.loads(p.read_text())
    fqn = next(k for k, v in doc["state_dict_metadata"].items() if v["type"] == "tensor")
    doc["state_dict_metadata"][fqn]["chunks"] = []
    doc["items"] = [i for i in doc["items"] if i["fqn"] != fqn]
    p.write_text(json.dumps(doc))
    with pytest.raises(ERRORS, match="do not cover the tensor"):
        load(s1, tmp_path / "c")


def test_async_save(tmp_path):
    m, opt, step = train_state()
    s1 = snapshot(m, opt)
    f = dcp.async_save(s1, storage_writer=LMCStorageWriter(tmp_path / "a1"))
    f.result()
    step()
    s2 = snapshot(m, opt)
    f = dcp.async_save(s2, storage_writer=LMCStorageWriter(tmp_path / "a2", reference=tmp_path / "a1"))
    f.result()
    lmc.dcp.wait()  # the re-coding of a1 behind the save (one process: background by default)
    assert meta(tmp_path / "a2")["reference"] is None and meta(tmp_path / "a1")["reference"] is not None
    assert_same(s1, load(s1, tmp_path / "a1"))
    assert_same(s2, load(s2, tmp_path / "a2"))


def test_checkpoint_id_and_writer_reuse(tmp_path):
    sd = every_dtype()
    w = LMCStorageWriter(tmp_path / "unused")
    dcp.save(sd, storage_writer=w, checkpoint_id=tmp_path / "x")
    assert is_lmc_checkpoint(tmp_path / "x") and not (tmp_path / "unused").exists()
    got = blank(sd)
    dcp.load(got, storage_reader=LMCStorageReader(tmp_path / "nowhere"), checkpoint_id=tmp_path / "x")
    assert_same(sd, got)
    assert LMCStorageReader.validate_checkpoint_id(tmp_path / "x")
    assert not LMCStorageReader.validate_checkpoint_id(tmp_path)
    assert LMCStorageWriter.validate_checkpoint_id(tmp_path / "new")


def test_missing_reference_at_save(tmp_path):
    # a missing reference fails in one line, as a plain exception (not DCP's wrapped traceback), before anything
    # is created: no empty target folder is left behind
    with pytest.raises(FileNotFoundError, match="reference checkpoint .*nope: no such folder") as e:
        save(every_dtype(), tmp_path / "c", reference=tmp_path / "nope")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "c").exists()
    (tmp_path / "half").mkdir()  # an interrupted save: a folder without the metadata
    with pytest.raises(lmc.FormatError, match="reference checkpoint .*half: not a complete LMC DCP checkpoint"):
        save(every_dtype(), tmp_path / "c", reference=tmp_path / "half")
    assert not (tmp_path / "c").exists()
    w = LMCStorageWriter(tmp_path / "c")  # given the target later, as dcp.save(checkpoint_id=) does
    w.reference = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        dcp.save(every_dtype(), storage_writer=w, checkpoint_id=tmp_path / "c2")
    assert not (tmp_path / "c").exists() and not (tmp_path / "c2").exists()
    with pytest.raises(ERRORS, match="its own reference"):
        save(every_dtype(), tmp_path / "d")
        save(every_dtype(), tmp_path / "d", reference=tmp_path / "d")


def test_interrupted_save_is_not_complete(tmp_path, monkeypatch):
    sd = every_dtype()
    save(sd, tmp_path / "c")
    calls = []

    def boom(self, *a, **k):  # the second tensor fails: the save stops midway
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(self, *a, **k)

    real = LMCStorageWriter._code_tensor
    monkeypatch.setattr(LMCStorageWriter, "_code_tensor", boom)
    with pytest.raises(ERRORS, match="disk full"):
        save(sd, tmp_path / "c")  # over the complete one
    # the replaced checkpoint's files (its metadata first) are gone, and the failed save left no file
    assert os.listdir(tmp_path / "c") == []
    with pytest.raises(ERRORS, match="not a complete LMC DCP checkpoint"):
        load(sd, tmp_path / "c")
    monkeypatch.undo()
    monkeypatch.setattr(LMCStorageWriter, "finish", lambda self, *a, **k: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(ERRORS, match="crash"):
        save(sd, tmp_path / "e")
    with pytest.raises(ERRORS, match="not a complete LMC DCP checkpoint"):
        load(sd, tmp_path / "e")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    base = tmp_path_factory.mktemp("good")
    sd = every_dtype()
    save(sd, base / "c")
    return sd, base / "c"


def damaged(tmp_path, good, edit):
    sd, path = good
    dst = tmp_path / "bad"
    shutil.copytree(path, dst)
    edit(dst)
    return sd, dst


def flip_byte(pos, fqn=None):
    """Flip a byte of the data file ``__0_0.lmc`` at ``pos(size)``, or with ``fqn`` of the file holding that
    item at ``pos(length)`` within the item (which item ends a file depends on the workers' timing)."""
    def edit(d):
        name, base, n = "__0_0.lmc", 0, os.path.getsize(d / "__0_0.lmc")
        if fqn is not None:
            it = item(meta(d), fqn)
            name, base, n = it["file"], it["pos"], it["length"]
        with open(d / name, "r+b") as f:
            f.seek(base + pos(n))
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x5A]))
    return edit


def edit_meta(fn):
    def edit(d):
        md = meta(d)
        fn(md)
        (d / METADATA_FILE).write_text(json.dumps(md))
    return edit


def item(md, fqn):
    return next(i for i in md["items"] if i["fqn"] == fqn)


@pytest.mark.parametrize("edit, message", [
    (lambda d: None, None),
    (flip_byte(lambda n: n - 3, "t.f32"), r"checksum mismatch|lmc: chunk|corrupt|FormatError"),
    (flip_byte(lambda n: n // 2, "t.bf16"), r"checksum mismatch|lmc: chunk|corrupt|FormatError"),
    (flip_byte(lambda n: 3), "not an LMC DCP data file"),
    (flip_byte(lambda n: 20), "another save"),
    (lambda d: os.truncate(d / "__0_0.lmc", os.path.getsize(d / "__0_0.lmc") - 10), "truncated"),
    (lambda d: os.remove(d / "__0_0.lmc"), "missing"),
    (lambda d: (d / METADATA_FILE).write_text("{not json"), "not JSON"),
    (lambda d: (d / METADATA_FILE).write_bytes(b"\x80\x04\x95"), "not JSON"),
    (edit_meta(lambda md: item(md, "t.f32").update(file="../../etc/passwd")), "file name"),
    (edit_meta(lambda md: item(md, "t.f32").update(pos=1 << 40)), "truncated"),
    (edit_meta(lambda md: item(md, "t.f32").update(length=-1)), "length"),
    (edit_meta(lambda md: item(md, "t.f32").update(shape=[1 << 40])), "not a chunk"),
    (edit_meta(lambda md: item(md, "t.f32").update(dtype="float16")), "not a chunk"),
    (edit_meta(lambda md: item(md, "t.f32").update(codec="pickle")), "codec"),
    (edit_meta(lambda md: item(md, "t.bf16").update(pos=item(md, "t.f32")["pos"])), r"item .t.bf16.: (lmc: |blob does not match)"),
    (edit_meta(lambda md: item(md, "t.f32").update(ref=["x" * 36, 1])), "reference"),
    (edit_meta(lambda md: md.update(format_version=99)), "format_version"),
    (edit_meta(lambda md: item(md, "t.f32").update(xxh3="0" * 32)), "checksum mismatch"),
    (edit_meta(lambda md: item(md, "t.f32").update(xxh3="X" * 32)), "checksum of"),
    (edit_meta(lambda md: item(md, "t.f32").update(crc32=5)), "checksum of"),  # two checksums
    (edit_meta(lambda md: item(md, "t.f32").pop("xxh3")), "checksum of"),
    (edit_meta(lambda md: md.update(format_version=2)), "checksum of"),  # format 2 knows only CRC-32
    (edit_meta(lambda md: md["state_dict_metadata"]["t.f32"].update(dtype="object")), "dtype"),
])
def test_corrupt_and_hostile_files(tmp_path, good, edit, message):
    sd, path = damaged(tmp_path, good, edit)
    if message is None:
        assert_same(sd, load(sd, path))
        return
    with pytest.raises(ERRORS) as ei:
        load(sd, path)
    assert __import__("re").search(message, str(ei.value)), str(ei.value)[-2000:]


def test_a_flipped_byte_in_any_item_fails_the_load(tmp_path, good):
    """Every stored item, tensor or bytes, is checked when it is read: one flipped byte in its middle or its
    last byte fails the load. The zero-element tensor is the exception that proves the rule: DCP never asks
    for it, so its damaged bytes cannot change what loads."""
    sd, path = good
    for fqn in [i["fqn"] for i in meta(path)["items"]]:
        for pos in (lambda n: n // 2, lambda n: n - 1):
            shutil.rmtree(tmp_path / "bad", ignore_errors=True)
            _, bad = damaged(tmp_path, good, flip_byte(pos, fqn))
            if fqn == "t.empty":
                assert_same(sd, load(sd, bad))
                continue
            with pytest.raises(ERRORS):
                load(sd, bad)


def test_reader_errors_are_format_errors(tmp_path, good):
    sd, path = damaged(tmp_path, good, flip_byte(lambda n: n - 3, "t.f32"))
    r = LMCStorageReader(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        md = r.read_metadata()
    r.set_up_storage_reader(md, True)
    ck = r._ckpt
    with pytest.raises(lmc.FormatError):
        for key in ck.items:
            ck.decode(key)


def test_max_chain_bounds_the_reference_chain(tmp_path):
    """Each save re-codes the one before against itself; with max_chain=3 a group holds at most three
    checkpoints (its newest coded alone), so loading any of them decodes at most three versions of a tensor,
    and every one loads bit-exact."""
    m, opt, step = train_state()
    states, prev = [], None
    for i in range(7):
        sd = snapshot(m, opt)
        states.append(sd)
        save(sd, tmp_path / f"step-{i}", reference=prev, max_chain=3)
        prev = tmp_path / f"step-{i}"
        step()
    keyframes = [meta(tmp_path / f"step-{i}")["reference"] is None for i in range(7)]
    assert keyframes == [False, False, True, False, False, True, True]
    assert [meta(tmp_path / f"step-{i}").get("group") for i in (2, 5, 6)] == [3, 3, 1]
    for i, sd in enumerate(states):
        assert_same(sd, load(sd, tmp_path / f"step-{i}"))
    # no limit: one chain
    save(states[-1], tmp_path / "free", reference=tmp_path / "step-5", max_chain=None)
    assert meta(tmp_path / "step-5")["reference"] is not None and meta(tmp_path / "free")["group"] == 4
    assert_same(states[3], load(states[3], tmp_path / "step-3"))
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_chain"):
            LMCStorageWriter(tmp_path / "x", max_chain=bad)


def test_lmc_to_torch_save_like_dcp_to_torch_save(tmp_path):
    """The LMC equivalent of torch's dcp_to_torch_save: the same file contents as a plain DCP folder converted
    by torch itself, for a checkpoint coded against the next one; the CLI too."""
    import subprocess
    import sys
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from lmc.dcp import lmc_to_torch_save

    m, opt, step = train_state()
    s1 = snapshot(m, opt, {"bf16": m[0].weight.detach().bfloat16()})
    save(s1, tmp_path / "step-1")
    dcp.save(s1, storage_writer=dcp.FileSystemWriter(str(tmp_path / "plain-1")))
    step()
    save(snapshot(m, opt), tmp_path / "step-2", reference=tmp_path / "step-1")  # step 1 now decodes through 2
    lmc_to_torch_save(tmp_path / "step-1", tmp_path / "lmc.pt")
    dcp_to_torch_save(str(tmp_path / "plain-1"), str(tmp_path / "plain.pt"))
    got = torch.load(tmp_path / "lmc.pt", weights_only=True)
    want = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert set(got) == set(want)

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    assert same(got, want)
    r = subprocess.run([sys.executable, "-m", "lmc.dcp", "to-torch", str(tmp_path / "step-2"), str(tmp_path / "2.pt")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and (tmp_path / "2.pt").exists(), r.stderr
    r = subprocess.run([sys.executable, "-m", "lmc.dcp", "to-torch", str(tmp_path / "nope"), str(tmp_path / "x.pt")],
                       capture_output=True, text=True)
    errors = [line for line in r.stderr.splitlines() if line.startswith("lmc.dcp: error:")]
    assert r.returncode == 2 and len(errors) == 1 and "no such checkpoint folder" in errors[0]
    assert not (tmp_path / "x.pt").exists()


def test_prune_keep_every_and_within_never_loses_a_kept_checkpoint(tmp_path):
    """keep_every / keep_within / keep_last: a kept checkpoint whose chain went through a deleted one is
    re-coded first; every kept one loads bit-exact; deleting only the oldest re-codes nothing."""
    from lmc.dcp import prune

    states = save_series(tmp_path, 9, max_chain=4)
    for i in range(1, 10):  # one checkpoint an hour (the save time the metadata records)
        p = tmp_path / f"step-{i}" / METADATA_FILE
        doc = json.loads(p.read_text())
        doc["time"] = 1_000_000 + 3600 * i
        p.write_text(json.dumps(doc))
    # groups: 1->2->3->4 | 5->6->7->8 | 9
    gone = prune(tmp_path, keep_every=3, keep_within=1.5 * 3600)
    assert sorted(os.path.basename(p) for p in gone) == ["step-1", "step-2", "step-4", "step-5", "step-7"]
    assert sorted(os.listdir(tmp_path)) == ["step-3", "step-6", "step-8", "step-9"]
    for i in (3, 6, 8, 9):
        assert_same(states[i], load(states[i], tmp_path / f"step-{i}"))
    assert meta(tmp_path / "step-6")["reference"]["path"] == "../step-8"  # was ../step-7
    before = {n: sorted(os.listdir(tmp_path / n)) for n in os.listdir(tmp_path)}
    assert [os.path.basename(p) for p in prune(tmp_path, keep_last=3)] == ["step-3"]
    assert {n: sorted(os.listdir(tmp_path / n)) for n in os.listdir(tmp_path)} == \
        {n: v for n, v in before.items() if n != "step-3"}  # the oldest went: nothing re-coded
    with pytest.raises(ValueError, match="at least one"):
        prune(tmp_path)


def test_tensors_are_coded_with_their_rows(tmp_path):
    """A 2-D tensor's blob has the tensor's shape, so lmc's predicted-exponent mode sees its rows (an Adam
    second moment: version 3, smaller than the flat coding); a restore is bit-exact, also of the next save,
    which re-codes the first against it."""
    import numpy as np
    from make_vectors import second_moment
    v = torch.from_numpy(second_moment(np.float32, 256, 192, 5, steps=40)).bfloat16()
    sd = {"opt.exp_avg_sq": v, "bias": torch.linspace(-1, 1, 999)}
    save(sd, tmp_path / "c1")
    items = {i["fqn"]: i for i in meta(tmp_path / "c1")["items"]}
    it = items["opt.exp_avg_sq"]
    with open(tmp_path / "c1" / it["file"], "rb") as f:
        f.seek(it["pos"])
        blob = f.read(it["length"])
    inf = lmc.info(blob)
    assert inf["shape"] == (256, 192) and inf["version"] == 9 and inf["chunk_modes"].get("predicted")
    import ml_dtypes
    flat = v.view(torch.int16).numpy().view(ml_dtypes.bfloat16).reshape(-1)
    assert len(blob) < len(lmc.compress(flat))
    assert_same(sd, load(sd, tmp_path / "c1"))
    sd2 = {"opt.exp_avg_sq": v * 1.01, "bias": torch.linspace(-1, 1, 999)}
    save(sd2, tmp_path / "c2", reference=tmp_path / "c1")
    assert_same(sd, load(sd, tmp_path / "c1"))
    assert_same(sd2, load(sd2, tmp_path / "c2"))
