"""torch zip files (torch.save, DeepSpeed states, DCP .distcp shards) in the archive: found by
lmc.formats.torchzip without unpickling, coded tensor by tensor against the previous step, restored
byte-identical; step folders of every naming; the opaque share."""
import io
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from helpers import tree_files as _files  # noqa: E402
from lmc.archive import Archive, ArchiveError  # noqa: E402
from lmc.archive import main as archive_main  # noqa: E402
from lmc.formats import torchzip  # noqa: E402

MARK = "/tmp/lmc-torchzip-test-pwned"


class Evil:
    """Pickles as a call to os.system: anything that unpickles a file holding it runs a command."""

    def __reduce__(self):
        return (os.system, (f"touch {MARK}",))


def _train(steps, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128))
    m.to(torch.bfloat16)
    master = [p.detach().float().clone().requires_grad_(True) for p in m.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    out = {}
    for step in range(1, max(steps) + 1):
        x = torch.randn(8, 128)
        for p, q in zip(m.parameters(), master):
            p.data.copy_(q.data)
        loss = ((m(x.bfloat16()).float() - x) ** 2).mean()
        grads = torch.autograd.grad(loss, list(m.parameters()))
        for q, g in zip(master, grads):
            q.grad = g.float()
        opt.step()
        opt.zero_grad()
        if step in steps:
            out[step] = ({k: v.detach().clone() for k, v in m.state_dict().items()},
                         {k: v for k, v in opt.state_dict().items()}, [q.detach().clone() for q in master])
    return out


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory):
    """A run folder in DeepSpeed's Trainer layout (checkpoint-<N>/global_step<N>/*.pt), whose optimizer
    pickles hold a class weights_only refuses (here one that would run a command)."""
    root = tmp_path_factory.mktemp("dsrun")
    for step, (sd, osd, master) in _train((2, 4, 6)).items():
        d = root / f"checkpoint-{step}" / f"global_step{step}"
        d.mkdir(parents=True)
        torch.save({"module": sd, "ds_version": "0.19.8", "client": Evil()}, d / "mp_rank_00_model_states.pt")
        flat = torch.cat([q.reshape(-1) for q in master])
        st = osd["state"]
        torch.save({"optimizer_state_dict": {
            "loss_scaler": Evil(), "single_partition_of_fp32_groups": [flat],
            "base_optimizer_state": {"state": {0: {"exp_avg": torch.cat([st[i]["exp_avg"].reshape(-1) for i in st]),
                                                   "exp_avg_sq": torch.cat([st[i]["exp_avg_sq"].reshape(-1)
                                                                            for i in st]),
                                                   "step": torch.tensor(float(step))}}}}},
                   d / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
        (root / f"checkpoint-{step}" / "latest").write_text(f"global_step{step}")
        (root / f"checkpoint-{step}" / "trainer_state.json").write_text('{"global_step": %d}' % step)
    return root


def test_scan_finds_storages_without_unpickling(ds_run):
    p = ds_run / "checkpoint-2" / "global_step2" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        sc = torchzip.scan(f, size)
    assert not os.path.exists(MARK)
    assert sc.archives == 1 and sc.start == 0
    kinds = sorted((s.dtype.name, s.numel) for s in sc.storages)
    n = sum(q.numel() for q in _train((2,))[2][2])
    assert kinds == [("float32", 1), ("float32", n), ("float32", n), ("float32", n)]
    raw = p.read_bytes()
    for s in sc.storages:  # the bytes of each storage are the tensor's
        assert s.end - s.begin == 4 * s.numel
    with pytest.raises(Exception):  # weights_only refuses the file: this is why we never load it
        torch.load(p, weights_only=True)
    assert len(raw) == size


def test_pickle_storages_reads_persistent_ids_only():
    b = io.BytesIO()
    t = torch.arange(10, dtype=torch.int16)
    torch.save({"a": t, "b": t[2:], "c": torch.zeros(3, dtype=torch.bfloat16), "e": Evil()}, b)
    import zipfile
    z = zipfile.ZipFile(io.BytesIO(b.getvalue()))
    pkl = z.read([n for n in z.namelist() if n.endswith("data.pkl")][0])
    got = torchzip.pickle_storages(pkl)
    assert sorted(got.values()) == [("BFloat16Storage", 3), ("ShortStorage", 10)]
    assert not os.path.exists(MARK)


def test_distcp_is_many_archives(tmp_path):
    import torch.distributed.checkpoint as dcp
    sd, osd, _ = _train((3,))[3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": sd, "optim": osd}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    p = tmp_path / "c" / "__0_0.distcp"
    with open(p, "rb") as f:
        sc = torchzip.scan(f, os.path.getsize(p))
    assert sc.start == 0 and sc.archives > len(sd)
    big = {(s.dtype.name, s.numel) for s in sc.storages if s.numel > 1}
    assert {("bfloat16", v.numel()) for v in sd.values()} <= big
    # garbage in front of the archives: found from the end, the front stays bytes
    q = tmp_path / "junk.distcp"
    q.write_bytes(b"\x00junk" * 100 + p.read_bytes())
    with open(q, "rb") as f:
        sc2 = torchzip.scan(f, os.path.getsize(q))
    assert sc2.start == 500 and "not a torch zip" in sc2.note
    assert [(s.key, s.begin + 500) for s in sc.storages] == [(s.key, s.begin) for s in sc2.storages]


@pytest.mark.parametrize("cut", [1, 22, 100, 5000])
def test_truncated_or_damaged_zip_is_bytes_or_fewer_storages(tmp_path, cut):
    sd = _train((1,))[1][0]
    b = io.BytesIO()
    torch.save(sd, b)
    data = b.getvalue()
    for bad in (data[:-cut], data[:cut] + b"\xff" * 8 + data[cut + 8:]):
        with io.BytesIO(bad) as f:
            sc = torchzip.scan(f, len(bad))
        if sc is not None:  # whatever is found lies inside the file and does not overlap
            pos = 0
            for s in sc.storages:
                assert pos <= s.begin < s.end <= len(bad)
                pos = s.end


def test_archive_codes_deepspeed_states_and_restores_byte_identical(ds_run, tmp_path):
    arc = tmp_path / "a"
    assert archive_main(["compress", str(ds_run), str(arc)]) == 0
    assert not os.path.exists(MARK)
    a = Archive(arc)
    es = a.entries()
    assert [e["name"] for e in es] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    for e in es:
        assert e["opaque"] < e["bytes_in"] / 100, e
    with a._view() as v:
        for s in (2, 4, 6):  # each step coded against the next; the latest alone
            files = {fe["path"]: fe for fe in v.index(s)["files"]}
            fe = files[f"global_step{s}/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"]
            assert fe["kind"] == "torchzip"
            ts = [p for p in fe["parts"] if p["t"] == "tensor"]
            assert len(ts) == 3 and all(t["enc"] == "lmc" for t in ts)
            if s < 6:
                assert fe["ref_path"] == f"global_step{s + 2}/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
                assert all(t["ref"] for t in ts)
            else:
                assert "ref_path" not in fe and not any(t["ref"] for t in ts)
    assert [e["depends_on"] for e in es] == [4, 6, None]
    out = tmp_path / "out"
    assert archive_main(["restore", str(arc), str(out)]) == 0
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _files(out) == _files(ds_run)
    assert a.verify().ok
    assert not os.path.exists(MARK)
    # step 2 decoded from the archive (no raw folder of it) to re-code it gives the same bytes
    arc2 = tmp_path / "b"
    b = Archive(arc2)
    b.add(ds_run / "checkpoint-2")
    b.add(ds_run / "checkpoint-4", reference_folder=None)
    with a._view() as va, b._view() as vb:
        assert va.index(2) == vb.index(2)
    # deleting the oldest step re-codes nothing: the newer steps never depended on it
    segs = {e["step"]: e["segment"] for e in a.entries()}
    assert a.prune(2) == [2]
    assert {e["step"]: e["segment"] for e in a.entries()} == {4: segs[4], 6: segs[6]}
    # deleting the middle one re-codes the step that depended on it (against the next kept one)
    assert a.prune(keep_every=100) == [4]
    assert a.steps() == [6]
    assert a.verify().ok
    a.restore(6, tmp_path / "six")
    assert _files(tmp_path / "six") == _files(ds_run / "checkpoint-6")


def test_ls_reports_opaque_files_and_why(ds_run, tmp_path, capsys):
    arc = tmp_path / "a"
    archive_main(["compress", str(ds_run), str(arc)])
    capsys.readouterr()
    assert archive_main(["ls", "--opaque", str(arc)]) == 0
    out = capsys.readouterr().out
    assert "opaque%" in out.splitlines()[0]
    assert "latest: not a tensor file format lmc reads" in out
    assert "zip directory, pickle and small storages" in out
    rows = Archive(arc).opaque(2)
    assert {r[0] for r in rows} >= {"latest", "trainer_state.json"}
    assert all(n > 0 and why for _, n, why in rows)


def test_step_folder_names(tmp_path):
    sd = _train((1,))[1][0]
    for name in ("step-10", "step-20", "global_step30"):
        (tmp_path / "run" / name).mkdir(parents=True)
        torch.save(sd, tmp_path / "run" / name / "model.pt")
    (tmp_path / "run" / "notastep").mkdir()
    (tmp_path / "run" / "step-x").mkdir()
    arc = tmp_path / "a"
    assert archive_main(["compress", str(tmp_path / "run"), str(arc)]) == 0
    a = Archive(arc)
    assert a.steps() == [10, 20, 30]
    assert [e["name"] for e in a.entries()] == ["step-10", "step-20", "global_step30"]
    with a._view() as v:  # one name to the next: the same file, so coded against it
        assert all(p["ref"] for fe in v.index(20)["files"] for p in fe["parts"] if p["t"] == "tensor")
        assert "ref_path" not in v.index(20)["files"][0] and v.index(20)["prev"] == 30
    (tmp_path / "run" / "checkpoint-10").mkdir()
    p = subprocess.run([sys.executable, "-m", "lmc.archive", "compress", str(tmp_path / "run"),
                        str(tmp_path / "b")], capture_output=True, text=True)
    assert p.returncode == 2 and "two folders for step 10" in p.stderr and len(p.stderr.splitlines()) == 1


def test_legacy_torch_format_keeps_the_skeleton_kind(tmp_path):
    sd = _train((1,))[1][0]
    d = tmp_path / "checkpoint-1"
    d.mkdir()
    torch.save({k: v.float() for k, v in sd.items()}, d / "legacy.pt", _use_new_zipfile_serialization=False)
    a = Archive(tmp_path / "a")
    a.add(d)
    with a._view() as v:
        assert v.index(1)["files"][0]["kind"] == "torch"
    a.restore(1, tmp_path / "r")
    got = torch.load(tmp_path / "r" / "legacy.pt", weights_only=True)
    for k, t in sd.items():
        assert torch.equal(got[k], t.float())


def test_version1_archive_still_reads(tmp_path):
    """An archive written by lmc 0.2 (manifest version 1, no name/opaque) restores; the next add
    writes the current version (3)."""
    import json
    from lmc.archive._manifest import canon, crc32
    sd = _train((1,))[1][0]
    for s in (1, 2):
        (tmp_path / f"checkpoint-{s}").mkdir()
        torch.save(sd, tmp_path / f"checkpoint-{s}" / "model.pt")
    a = Archive(tmp_path / "a")
    a.add(tmp_path / "checkpoint-1")
    mp = tmp_path / "a" / "lmc-archive.json"
    body = json.loads(mp.read_text())["manifest"]
    body["version"] = 1
    for e in body["steps"]:
        del e["name"], e["opaque"]
    mp.write_bytes(canon({"manifest": body, "crc32": crc32(canon(body))}) + b"\n")
    assert a.entries()[0]["opaque"] is None and a.entries()[0]["name"] == "checkpoint-1"
    a.restore(1, tmp_path / "r1")
    a.add(tmp_path / "checkpoint-2")
    assert json.loads(mp.read_text())["manifest"]["version"] == 3
    assert _files(tmp_path / "r1") == _files(tmp_path / "checkpoint-1")


def test_forged_ref_path_is_refused(ds_run, tmp_path):
    """ref_path is checked like any path: no '..', no absolute path."""
    from lmc.archive._index import check_index
    idx = {"step": 4, "prev": 2, "keyframe": False,
           "files": [{"path": "a", "kind": "bytes", "size": 0, "sha256": "0" * 64, "chunks": [],
                      "ref_path": "../etc/passwd"}]}
    with pytest.raises(ArchiveError, match="ref_path"):
        check_index(idx, 4)
    idx["files"][0]["ref_path"] = "b"
    idx["files"][0]["why"] = 3
    with pytest.raises(ArchiveError, match="why"):
        check_index(idx, 4)


def test_add_refuses_surprising_archive_paths(ds_run, tmp_path):
    ck = ds_run / "checkpoint-2"
    before = _files(ck)
    for bad, msg in ((tmp_path / "nope" / "a", "parent folder"), ("nosuchproto://bucket/run.lmca", "nosuchproto"),
                     (ck, "were the arguments swapped")):
        with pytest.raises(ArchiveError, match=msg):
            Archive(bad).add(ds_run / "checkpoint-4")
    assert not (tmp_path / "nope").exists() and not os.path.exists("nosuchproto:")
    assert _files(ck) == before and not (ck / ".lock").exists()
    # a lost manifest: the next add refuses and deletes nothing
    a = Archive(tmp_path / "a")
    a.add(ck)
    segs = sorted(os.listdir(tmp_path / "a"))
    os.unlink(tmp_path / "a" / "lmc-archive.json")
    segs.remove("lmc-archive.json")
    with pytest.raises(ArchiveError, match="manifest lmc-archive.json is missing but 1 segment"):
        a.add(ds_run / "checkpoint-4")
    assert sorted(os.listdir(tmp_path / "a")) == segs
    p = subprocess.run([sys.executable, "-m", "lmc.archive", "compress", str(ds_run), str(tmp_path / "a")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "missing" in p.stderr and sorted(os.listdir(tmp_path / "a")) == segs


def test_retention_policies_never_lose_a_kept_step(tmp_path):
    """keep_every / keep_within / keep_last together: the union is kept (and the latest), every
    kept step restores bit-exact after deleting the others, in any order of deletions."""
    trained = _train(tuple(range(1, 13)))
    folders = []
    for step, (sd, osd, _) in trained.items():
        d = tmp_path / "run" / f"step-{step}"
        d.mkdir(parents=True)
        torch.save({"model": sd, "optim": osd}, d / "state.pt")
        t = 1_000_000 + 3600 * step  # one checkpoint an hour
        os.utime(d / "state.pt", (t, t))
        os.utime(d, (t, t))
        folders.append(d)
    arc = tmp_path / "a"
    a = Archive(arc, keyframe_every=4)
    for d in folders:
        a.add(d)
    assert max(e["depth"] for e in a.entries()) == 3
    assert a.prune(keep_every=4, keep_within=2.5 * 3600) == [1, 2, 3, 5, 6, 7, 9]
    assert a.steps() == [4, 8, 10, 11, 12]
    assert a.verify().ok
    for s in a.steps():
        a.restore(s, tmp_path / "r" / str(s))
        assert _files(tmp_path / "r" / str(s)) == _files(tmp_path / "run" / f"step-{s}")
    assert max(e["depth"] for e in a.entries()) <= 3
    assert archive_main(["prune", str(arc), "--keep-last", "1"]) == 0
    assert a.steps() == [12]
    assert archive_main(["prune", str(arc)]) == 2
    with pytest.raises(ArchiveError, match="keep_every"):
        a.prune(keep_every=0)


def test_latest_restores_at_keyframe_cost_and_chains_stay_bounded(tmp_path):
    """Whatever the chain, the latest step is coded alone; restoring any step decodes at most
    keyframe_every versions of a tensor."""
    from lmc.archive._view import View
    trained = _train(tuple(range(1, 10)))
    a = Archive(tmp_path / "a", keyframe_every=3)
    for step, (sd, _, _) in trained.items():
        d = tmp_path / "run" / f"step-{step}"
        d.mkdir(parents=True)
        torch.save(sd, d / "model.pt")
        a.add(d)
        es = a.entries()
        assert es[-1]["keyframe"] and es[-1]["depends_on"] is None
        assert max(e["depth"] for e in es) <= 2
    calls = []
    orig = View.decode_one

    def counting(self, *args, **kw):
        calls.append(args[0])
        return orig(self, *args, **kw)

    View.decode_one = counting
    try:
        a.restore(9, tmp_path / "r9")
        n9 = len(calls)
        calls.clear()
        a.restore(1, tmp_path / "r1")
    finally:
        View.decode_one = orig
    assert set(calls) == {1, 2, 3} and len(calls) == 3 * n9


def _series(tmp_path, steps, k=3):
    trained = _train(tuple(steps))
    a = Archive(tmp_path / "a", keyframe_every=k)
    for step, (sd, osd, _) in trained.items():
        d = tmp_path / "run" / f"checkpoint-{step}"
        d.mkdir(parents=True)
        torch.save({"model": sd, "optim": osd}, d / "state.pt")
        (d / "trainer_state.json").write_text('{"step": %d}' % step)
        a.add(d)
    return a


@pytest.mark.parametrize("damage", ["missing", "garbled"])
def test_repair_rebuilds_a_lost_manifest(tmp_path, damage, capsys):
    a = _series(tmp_path, range(1, 8))
    before = a.entries()
    mp = tmp_path / "a" / "lmc-archive.json"
    if damage == "missing":
        mp.unlink()
    else:
        mp.write_bytes(mp.read_bytes()[:100])
    with pytest.raises(ArchiveError):
        a.restore(7, tmp_path / "x")
    capsys.readouterr()
    assert archive_main(["repair", str(tmp_path / "a"), "--keyframe-every", "3"]) == 0
    assert "7 step(s) restorable, 0 lost" in capsys.readouterr().out
    after = a.entries()
    assert [(e["step"], e["segment"], e["depends_on"], e["name"], e["time"]) for e in after] == \
        [(e["step"], e["segment"], e["depends_on"], e["name"], e["time"]) for e in before]
    for s in (1, 4, 7):
        a.restore(s, tmp_path / "r" / str(s))
        assert _files(tmp_path / "r" / str(s)) == _files(tmp_path / "run" / f"checkpoint-{s}")


def test_repair_after_an_interrupted_add_and_with_a_damaged_segment(tmp_path, monkeypatch, capsys):
    import lmc.archive._archive as arch
    a = _series(tmp_path, range(1, 6))
    d6 = tmp_path / "run" / "checkpoint-6"
    d6.mkdir()
    torch.save({"model": _train((6,))[6][0]}, d6 / "state.pt")
    monkeypatch.setattr(arch, "write_manifest", lambda *x: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        a.add(d6)  # two new segments (6, and 5 re-coded against 6), the manifest not replaced
    monkeypatch.undo()
    (tmp_path / "a" / "lmc-archive.json").unlink()
    segs = sorted(n for n in os.listdir(tmp_path / "a") if n.startswith("seg-"))
    assert len(segs) == 7
    steps, bad, res = a.repair()
    assert steps == [1, 2, 3, 4, 5, 6] and bad == [] and res.ok
    for s in (5, 6):
        a.restore(s, tmp_path / "r" / str(s))
    assert _files(tmp_path / "r" / "6") == _files(d6)
    # a damaged segment: renamed, never deleted; its dependents are named as lost
    (tmp_path / "a" / "lmc-archive.json").unlink()
    victim = sorted(n for n in os.listdir(tmp_path / "a") if n.startswith("seg-000000000003"))[0]
    p = tmp_path / "a" / victim
    p.write_bytes(p.read_bytes()[:-10])
    capsys.readouterr()
    assert archive_main(["repair", str(tmp_path / "a")]) == 1
    out = capsys.readouterr().out
    assert f"unreadable segment {victim}" in out and (tmp_path / "a" / f"damaged-{victim}").exists()
    assert "step 1: LOST" in out and "step 2: LOST" in out and "4 step(s) restorable, 2 lost" not in out
    assert "3 step(s) restorable, 2 lost" in out


def test_restore_checks_free_space_first(ds_run, tmp_path, monkeypatch, capsys):
    """Not enough room: one line saying how much is needed, and nothing written (no partial folder)."""
    import collections
    import shutil as sh
    a = Archive(tmp_path / "a")
    a.add(ds_run / "checkpoint-2")
    need = a.entries()[0]["bytes_in"]
    real = sh.disk_usage
    monkeypatch.setattr(sh, "disk_usage", lambda p: collections.namedtuple("u", "total used free")(
        real(p).total, real(p).used, need // 2))
    out = tmp_path / "out"
    assert archive_main(["restore", str(tmp_path / "a"), str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs" in err and "bytes free" in err and err.count("\n") == 1
    assert not out.exists() or not any(out.rglob("*"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lmc-restore-")]
    monkeypatch.setattr(sh, "disk_usage", real)
    assert archive_main(["restore", str(tmp_path / "a"), str(out)]) == 0
