"""lmc.dcp format 3: a frozen format 2 chain still loads and re-codes; items on worker threads."""
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from lmc.dcp import LMCStorageReader  # noqa: E402
from test_dcp import assert_same, blank, every_dtype, load, meta, save, snapshot, train_state  # noqa: E402

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
    """Saves and loads spread items over worker threads (threads=3: more items in flight than workers); the
    files are the same as a one-thread save's, and a load decodes straight into whole contiguous targets and
    copies into the others (a transposed view, another dtype)."""
    m, opt, step = train_state()
    s1 = snapshot(m, opt, every_dtype())
    step()
    s2 = snapshot(m, opt, every_dtype())
    for th in (1, 3):
        save(s1, tmp_path / f"a{th}", threads=th)
        save(s2, tmp_path / f"b{th}", reference=tmp_path / f"a{th}", threads=th)
    for name in ("a", "b"):
        m1, m3 = meta(tmp_path / f"{name}1"), meta(tmp_path / f"{name}3")
        strip = lambda md: [{k: v for k, v in i.items() if k != "ref"} for i in md["items"]]  # noqa: E731
        assert strip(m1) == strip(m3)
        files = sorted({i["file"] for i in m1["items"]})
        for f in files:  # the same blobs (after the header, which holds the save id)
            assert (tmp_path / f"{name}1" / f).read_bytes()[44:] == (tmp_path / f"{name}3" / f).read_bytes()[44:]
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
