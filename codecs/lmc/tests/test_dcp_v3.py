"""lmc.dcp format 3: a frozen format 2 chain still loads and re-codes; items on worker threads."""
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from lmc.dcp import LMCStorageReader  # noqa: E402
from test_dcp import ERRORS, assert_same, blank, data_files, every_dtype, load, meta, save, snapshot, train_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _frozen_state():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_dcp_v2", os.path.join(os.path.dirname(__file__), "data", "make_dcp_v2.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.state


def test_frozen_format_2_folders_still_load_and_recode(tmp_path):
    """tests/data/dcp_v2: a chain written in format version 2 (CRC-32 checksums) by an older lmc: it loads
    bit-exact, and a new save against its newest checkpoint re-codes that one (its items keep their checksums)."""
    state = _frozen_state()
    frozen = os.path.join(os.path.dirname(__file__), "data", "dcp_v2")
    assert meta(os.path.join(frozen, "step-1"))["format_version"] == 2
    for s in (1, 2):
        assert_same(state(s), load(state(s), os.path.join(frozen, f"step-{s}")))
    shutil.copytree(frozen, tmp_path / "v2")
    save(state(3), tmp_path / "v2" / "step-3", reference=tmp_path / "v2" / "step-2")
    m2, m3 = meta(tmp_path / "v2" / "step-2"), meta(tmp_path / "v2" / "step-3")
    assert m2["reference"]["path"] == "../step-3" and m2["format_version"] == m3["format_version"] == 3
    # the re-coded items keep their CRC-32s and name their reference items' XXH3-128s
    assert all("crc32" in i and "xxh3" not in i for i in m2["items"])
    assert all("xxh3" in i and "crc32" not in i for i in m3["items"])
    assert any(i["ref"] and isinstance(i["ref"][1], str) for i in m2["items"])
    for s in (1, 2, 3):
        assert_same(state(s), load(state(s), tmp_path / "v2" / f"step-{s}"))


def test_items_on_worker_threads(tmp_path):
    """Saves and loads spread items over worker threads (threads=3: more items in flight than workers), each
    worker appending to a data file of its own; every item's blob is the same as a one-thread save's (which
    writes one file), and a load decodes straight into whole contiguous targets and copies into the others (a
    transposed view, another dtype)."""
    m, opt, step = train_state()
    s1 = snapshot(m, opt, every_dtype())
    step()
    s2 = snapshot(m, opt, every_dtype())
    for th in (1, 3):
        save(s1, tmp_path / f"a{th}", threads=th)
        save(s2, tmp_path / f"b{th}", reference=tmp_path / f"a{th}", threads=th)
    assert len(data_files(tmp_path / "b1")) == 1 and 1 <= len(data_files(tmp_path / "b3")) <= 3

    def blobs(path):
        out = {}
        for i in meta(path)["items"]:
            with open(path / i["file"], "rb") as f:
                f.seek(i["pos"])
                out[(i["fqn"], str(i["offset"]))] = f.read(i["length"])
        return out

    for name in ("a", "b"):
        m1, m3 = meta(tmp_path / f"{name}1"), meta(tmp_path / f"{name}3")
        strip = lambda md: sorted(  # noqa: E731
            ({k: v for k, v in i.items() if k not in ("ref", "file", "pos")} for i in md["items"]),
            key=lambda i: (i["fqn"], str(i["offset"])))
        assert strip(m1) == strip(m3)
        assert blobs(tmp_path / f"{name}1") == blobs(tmp_path / f"{name}3")
    for path, want in ((tmp_path / "a3", s1), (tmp_path / "b3", s2)):
        got = blank(want)
        got["model"]["0.weight"] = torch.zeros(96, 64).t().contiguous().t()  # a non-contiguous target
        got["t"]["f32"] = torch.zeros(3, 50, dtype=torch.float64)  # another dtype: copied, converted
        dcp.load(got, storage_reader=LMCStorageReader(path, threads=3))
        assert not got["model"]["0.weight"].is_contiguous()
        assert torch.equal(got["model"]["0.weight"], want["model"]["0.weight"])
        assert torch.equal(got["t"]["f32"], want["t"]["f32"].double())
        got["model"]["0.weight"] = got["model"]["0.weight"].contiguous()
        got["t"]["f32"] = got["t"]["f32"].float()
        assert_same(want, got)


def test_fewer_workers_later_leave_no_stale_data_files(tmp_path):
    """A save over a checkpoint written by more worker threads removes that one's data files (the new save may
    write fewer): the folder then holds exactly the files its metadata names."""
    sd = every_dtype()
    save(sd, tmp_path / "c", threads=3)
    save(sd, tmp_path / "c", threads=1)
    assert data_files(tmp_path / "c") == ["__0_0.lmc"]
    assert {i["file"] for i in meta(tmp_path / "c")["items"]} == {"__0_0.lmc"}
    assert_same(sd, load(sd, tmp_path / "c"))


def test_a_worker_that_cannot_write_leaves_nothing(tmp_path, monkeypatch):
    """A write that fails on one worker's data file (a full disk) fails the save with that error; no data file,
    temporary file or metadata is left, and the next save writes a complete checkpoint."""
    from lmc.dcp import _pool

    m, opt, _ = train_state()
    sd = snapshot(m, opt, every_dtype())
    real, calls = _pool._Lanes.write, []

    def full(self, blob):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return real(self, blob)

    monkeypatch.setattr(_pool._Lanes, "write", full)
    with pytest.raises(ERRORS, match="No space left"):
        save(sd, tmp_path / "c", threads=3)
    assert os.listdir(tmp_path / "c") == []
    monkeypatch.undo()
    save(sd, tmp_path / "c", threads=3)
    assert_same(sd, load(sd, tmp_path / "c"))
