"""lmc.dcp: LMCStorageWriter(background=True): the save returns with the new checkpoint complete, coded alone;
the reference is re-coded against it behind the call, to the same sizes as a foreground save; a kill or a
failure there loses nothing, and the next save finishes what was left."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import lmc.dcp  # noqa: E402
from lmc.dcp import _recode  # noqa: E402
from test_dcp import LMCStorageWriter, assert_same, every_dtype, load, meta, snapshot, train_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _states(n=3):
    m, opt, step = train_state()
    out = {}
    for i in range(1, n + 1):
        out[i] = snapshot(m, opt, every_dtype())
        step()
    return out


def save(sd, path, **kw):
    """A save that does not wait for what it leaves behind (test_dcp.save does)."""
    dcp.save(sd, storage_writer=LMCStorageWriter(path, **kw))


def _data_bytes(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(".distcp"))


def test_background_save_matches_foreground(tmp_path):
    """A background save's checkpoints load bit-exact, right away (a load waits for the re-coding of its
    folder) and after lmc.dcp.wait(); the re-coded reference names the new save and takes the same bytes as a
    foreground save's; the new checkpoint's metadata says what it left behind."""
    st = _states(3)
    for mode in ("fg", "bg"):
        save(st[1], tmp_path / mode / "step-1")
        save(st[2], tmp_path / mode / "step-2", reference=tmp_path / mode / "step-1", background=mode == "bg")
        assert_same(st[1], load(st[1], tmp_path / mode / "step-1"))
    lmc.dcp.wait()
    fg1, bg1, bg2 = meta(tmp_path / "fg" / "step-1"), meta(tmp_path / "bg" / "step-1"), meta(tmp_path / "bg" / "step-2")
    assert bg1["reference"]["save_id"] == bg2["save_id"] and bg1["recoded_for"] == bg2["save_id"]
    assert bg2["behind"]["save_id"] == bg1["save_id"] and bg2["behind"]["path"] == "../step-1"
    assert "group" not in bg1 and bg2["group"] == meta(tmp_path / "fg" / "step-2")["group"] == 2
    assert [i["ref"] is None for i in fg1["items"]] == [i["ref"] is None for i in bg1["items"]]
    assert _data_bytes(tmp_path / "bg" / "step-1") == _data_bytes(tmp_path / "fg" / "step-1")
    for s in (1, 2):
        assert_same(st[s], load(st[s], tmp_path / "bg" / f"step-{s}"))
    # a chain of background saves: each save waits for the one before; every checkpoint loads
    save(st[3], tmp_path / "bg" / "step-3", reference=tmp_path / "bg" / "step-2", background=True)
    lmc.dcp.wait()
    assert meta(tmp_path / "bg" / "step-2")["reference"]["save_id"] == meta(tmp_path / "bg" / "step-3")["save_id"]
    for s in (1, 2, 3):
        assert_same(st[s], load(st[s], tmp_path / "bg" / f"step-{s}"))


def test_failed_background_recode_loses_nothing(tmp_path, monkeypatch):
    """A re-coding that fails behind the save: wait() raises one error naming the folder; the reference is
    intact, coded alone; a later save warns (when nobody called wait) and goes on."""
    st = _states(3)
    save(st[1], tmp_path / "step-1")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(_recode, "_recode_against", boom)
    save(st[2], tmp_path / "step-2", reference=tmp_path / "step-1", background=True)
    with pytest.raises(RuntimeError, match="step-1.*disk full.*coded alone"):
        lmc.dcp.wait()
    assert meta(tmp_path / "step-1")["reference"] is None
    with pytest.warns(RuntimeWarning, match="could not finish re-coding .*step-1.*disk full"):
        # finishing what step-2's save left fails (a warning: step-1 is intact), then fails behind again
        save(st[3], tmp_path / "step-3", reference=tmp_path / "step-2", background=True)
    monkeypatch.undo()
    with pytest.warns(RuntimeWarning, match="background re-coding of .*step-2 failed"):
        save(st[3], tmp_path / "step-3b", reference=tmp_path / "step-2")
    for s in (1, 2):
        assert_same(st[s], load(st[s], tmp_path / f"step-{s}"))


def test_killed_background_recode_is_finished_by_the_next_save(tmp_path):
    """A process that exits right after a background save (os._exit: its re-coding thread dies with it): both
    checkpoints load; the next save against the new one re-codes the old one first and removes the killed
    writer's leftovers."""
    st = _states(3)
    for i in (1, 2):
        torch.save(st[i], tmp_path / f"s{i}.pt")
    save(st[1], tmp_path / "step-1")
    code = textwrap.dedent(f"""
        import os, torch, torch.distributed.checkpoint as dcp, warnings
        warnings.simplefilter("ignore")
        from lmc.dcp import _recode
        from lmc.dcp import LMCStorageWriter
        real = _recode._recode_against
        def slow(ck, target, *a, **k):
            open(os.path.join(ck.path, ".tmp-killed-writer"), "wb").write(b"x" * 100)
            os._exit(0)  # killed mid re-coding
        _recode._recode_against = slow
        sd = torch.load({str(tmp_path / 's2.pt')!r}, weights_only=True)
        dcp.save(sd, storage_writer=LMCStorageWriter({str(tmp_path / 'step-2')!r},
                 reference={str(tmp_path / 'step-1')!r}, background=True))
        import time; time.sleep(30)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    m1, m2 = meta(tmp_path / "step-1"), meta(tmp_path / "step-2")
    assert m1["reference"] is None and "recoded_for" not in m1 and m2["behind"]["save_id"] == m1["save_id"]
    assert any(n.startswith(".tmp") for n in os.listdir(tmp_path / "step-1"))
    for s in (1, 2):
        assert_same(st[s], load(st[s], tmp_path / f"step-{s}"))
    save(st[3], tmp_path / "step-3", reference=tmp_path / "step-2")
    m1 = meta(tmp_path / "step-1")
    assert m1["recoded_for"] == m2["save_id"] and m1["reference"]["save_id"] == m2["save_id"]
    assert not any(n.startswith(".tmp") for n in os.listdir(tmp_path / "step-1"))
    for s in (1, 2, 3):
        assert_same(st[s], load(st[s], tmp_path / f"step-{s}"))


def test_default_is_behind_in_one_process(tmp_path):
    """background=None (the default): behind the save where one process saves; False: within it; anything but
    None, True or False is refused when the writer is made."""
    st = _states(3)
    save(st[1], tmp_path / "step-1")
    save(st[2], tmp_path / "step-2", reference=tmp_path / "step-1")
    assert meta(tmp_path / "step-2")["behind"]["save_id"] == meta(tmp_path / "step-1")["save_id"]
    lmc.dcp.wait()
    assert meta(tmp_path / "step-1")["recoded_for"] == meta(tmp_path / "step-2")["save_id"]
    save(st[3], tmp_path / "step-3", reference=tmp_path / "step-2", background=False)
    m2 = meta(tmp_path / "step-2")
    m3 = meta(tmp_path / "step-3")
    assert "behind" not in m3 and m2["reference"]["save_id"] == m3["save_id"]
    for bad in ("yes", 1, 0):
        with pytest.raises(ValueError, match="background must be True, False or None"):
            LMCStorageWriter(tmp_path / "step-4", background=bad)
    for s in (1, 2, 3):
        assert_same(st[s], load(st[s], tmp_path / f"step-{s}"))


def test_fork_waits_for_the_recoding(tmp_path):
    """A fork while the reference is re-coded behind the save (a DataLoader starting its workers) waits until
    the re-coding is done, so the child inherits no lock that thread held: here a fork right after the save
    returns finds the reference re-coded, and a pool of forked workers started then runs and ends (in a child
    process with a time limit, so a hang fails the test instead of stopping the suite)."""
    st = _states(2)
    for i in (1, 2):
        torch.save(st[i], tmp_path / f"s{i}.pt")
    code = textwrap.dedent(f"""
        import json, multiprocessing as mp, os, torch, torch.distributed.checkpoint as dcp, warnings
        warnings.simplefilter("ignore")
        from lmc.dcp import LMCStorageWriter
        root = {str(tmp_path)!r}
        def recoded():
            with open(os.path.join(root, "step-1", "lmc-metadata.json")) as f:
                return "recoded_for" in json.load(f)
        dcp.save(torch.load(os.path.join(root, "s1.pt"), weights_only=True),
                 storage_writer=LMCStorageWriter(os.path.join(root, "step-1")))
        dcp.save(torch.load(os.path.join(root, "s2.pt"), weights_only=True),
                 storage_writer=LMCStorageWriter(os.path.join(root, "step-2"),
                                                 reference=os.path.join(root, "step-1")))
        before = recoded()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        after = recoded()
        with mp.get_context("fork").Pool(2) as pool:
            squares = pool.map(abs, [-1, -2, -3])
        print(json.dumps([before, after, squares]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    before, after, squares = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert after is True and squares == [1, 2, 3], (before, after)
    for s in (1, 2):
        assert_same(st[s], load(st[s], tmp_path / f"step-{s}"))
